"""The README is the contract: its commands and its Python example run as written."""

from __future__ import annotations

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


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command, monkeypatch, capsys):
    monkeypatch.chdir(Path(__file__).parent.parent)
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err


def test_readme_python_example_runs(monkeypatch):
    code = next(body for lang, body in BLOCKS if lang == "python")
    exec(compile(code, "README.md", "exec"), {})


def test_readme_yaml_example_loads(tmp_path):
    from perfmodel.hardware_db.loader import load_database

    yaml_text = next(body for lang, body in BLOCKS if lang == "yaml")
    (tmp_path / "gpus.yaml").write_text(yaml_text)
    db = load_database([tmp_path])
    assert db.system("my-cluster").devices == 256 * 8
    assert db.accelerator("h100-sxm-700w-capped").hbm_bytes == 80e9
