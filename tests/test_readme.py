"""The README is the contract: its commands and its Python example run as written."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import pytest

from perfmodel.cli.app import main

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
COMMANDS = [line.split(" #")[0].strip() for lang, body in BLOCKS if lang == "bash"
            for line in body.splitlines() if line.startswith("perfmodel ")]


def test_quick_start_has_exactly_two_commands():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quick, flags=re.S)
    assert len(commands) == 2
    assert "perfmodel " in commands[0] and "pytest" in commands[1]
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert commands[1].split("&& ", 3)[-1].strip() in ci.replace("--quiet ", "")


def _checkout_view(tmp_path: Path) -> Path:
    """A folder that shows the repository's files (tests/data/... as the README names them) and takes
    what the commands write (--out, --plot), so that nothing lands in the checkout."""
    root = Path(__file__).parent.parent
    for entry in root.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


WIDTH = 80


def _machine_readable(command: str) -> bool:
    """Output meant for programs (JSON, CSV, the YAML schema), not read at a terminal."""
    return any(flag in command.split() for flag in ("--json", "--csv")) or command.startswith("perfmodel hardware schema")


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs_and_reads_at_80_columns(command, monkeypatch, capsys, caplog, tmp_path):
    """Each README command runs as written; on an 80-column terminal its output fits, and no table
    column is narrower than its longest word (render.SQUEEZED logs any table that had to cut one)."""
    from rich.cells import cell_len
    from rich.console import Console

    from perfmodel.cli import render

    monkeypatch.chdir(_checkout_view(tmp_path))
    monkeypatch.setattr(render, "console", Console(width=WIDTH, highlight=False, soft_wrap=False, emoji=False))
    caplog.set_level(logging.DEBUG, logger=render.SQUEEZED.name)
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    if _machine_readable(command):
        return
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if cell_len(line) > WIDTH]
    squeezed = [r.getMessage() for r in caplog.records if r.name == render.SQUEEZED.name]
    assert not squeezed, f"tables that cut a word at {WIDTH} columns: {squeezed}"


@pytest.mark.parametrize("index", range(sum(lang == "python" for lang, _ in BLOCKS)))
def test_readme_python_example_runs(index, monkeypatch, tmp_path):
    monkeypatch.chdir(_checkout_view(tmp_path))
    code = [body for lang, body in BLOCKS if lang == "python"][index]
    exec(compile(code, "README.md", "exec"), {})


def test_readme_yaml_example_loads(tmp_path):
    from perfmodel.hardware_db.loader import load_database

    yaml_text = next(body for lang, body in BLOCKS if lang == "yaml")
    (tmp_path / "gpus.yaml").write_text(yaml_text)
    db = load_database([tmp_path])
    assert db.system("my-cluster").devices == 256 * 8
    assert db.accelerator("h100-sxm-700w-capped").hbm_bytes == 80 * 2**30
