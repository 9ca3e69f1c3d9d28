"""The shared progress bar: drawn on a terminal's stderr after its delay, silent otherwise."""

from __future__ import annotations

import io

from rich.console import Console

from perfmodel.cli.render import Progress


def _stderr(terminal: bool) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=80)


def test_draws_on_a_terminal():
    stderr = _stderr(True)
    with Progress(4, "predicting", delay=0.0, stderr=stderr) as progress:
        progress.advance()
        progress(2)
        assert progress.bar is not None and progress.done == 2
        progress.advance(2)
    assert progress.bar is None  # closed (transient: the bar leaves no line behind)
    assert "predicting" in stderr.file.getvalue()


def test_silent_when_disabled_or_not_a_terminal():
    for progress in (Progress(4, "x", enabled=False, delay=0.0, stderr=_stderr(True)),
                     Progress(4, "x", delay=0.0, stderr=_stderr(False))):
        with progress:
            progress(1)
            progress.advance()
        assert progress.bar is None and progress.stderr.file.getvalue() == ""
        assert progress.done == 2


def test_waits_for_its_delay_and_learns_the_total():
    stderr = _stderr(True)
    progress = Progress(None, "searching", delay=60.0, stderr=stderr)
    progress(1, 10)
    assert progress.bar is None and progress.total == 10
    progress.close()
    assert stderr.file.getvalue() == ""


def test_validate_json_is_silent_on_stderr(capsys):
    from perfmodel.cli.app import main

    assert main(["validate", "--json"]) == 0
    assert capsys.readouterr().err == ""
