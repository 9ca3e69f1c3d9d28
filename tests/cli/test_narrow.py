"""On an 80-column terminal every command's output fits, and no cell is cut ('…')."""

from __future__ import annotations

import shlex

import pytest
from rich.cells import cell_len
from rich.console import Console

from perfmodel.cli import render
from perfmodel.cli.app import main

WIDTH = 80

COMMANDS = [
    "validate",
    "hardware list",
    "hardware show h100-sxm",
    "hardware show dgx-h100 --nodes 4",
    "hardware show cloudmatrix384",
    "hardware show pue",
    "models list",
    "models show llama-3.1-70b",
    "models show deepseek-v3",
    "compare",
    "compare dgx-h100 gb200-nvl72 cloudmatrix384 frontier mi300x-8x",
    "estimate train",
    "estimate serve",
    "estimate serve --model deepseek-v3 --system cloudmatrix384 --devices 16 --tp 1 --ep 16 --dp-attention 16 "
    "--weight-precision int8 --activation-precision a8",
    "plan",
    "plan serve --model llama-3.1-70b --system dgx-h100 --system mi300x-8x --rate 20 --pareto",
    "place-experts --devices 16 --replicas 8 --time-limit 1",
    "calibrate gemm --table tests/data/gemm_h100_sample.csv",
    "calibrate attention --table tests/data/attention_h100_sample.csv",
    "calibrate collectives --table tests/data/nccl_h100_sample.csv",
    "calibrate dispatch --table tests/data/deepep_ll_h100_sample.csv",
]


@pytest.fixture
def narrow(monkeypatch, request):
    """The renderer's console at 80 columns (as COLUMNS=80 makes it), run from the repository root."""
    monkeypatch.chdir(request.config.rootpath)
    monkeypatch.setattr(render, "console", Console(width=WIDTH, highlight=False, soft_wrap=False))


@pytest.mark.parametrize("command", COMMANDS)
def test_output_fits_80_columns_uncut(command, narrow, capsys):
    code = main(shlex.split(command))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip()
    too_wide = [line for line in out.splitlines() if cell_len(line) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    assert "…" not in out, "\n".join(line for line in out.splitlines() if "…" in line)
    assert "nan" not in out.lower().split()


def test_validate_keeps_every_case_name(narrow, capsys):
    """The case names are what a reader looks up: each one is in the table, whole or wrapped."""
    from perfmodel.validation import load_cases

    assert main(["validate"]) == 0
    words = set(capsys.readouterr().out.split())
    assert all(case.id in words for case in load_cases())


def test_fleets_are_counted_in_devices_and_nodes(narrow, capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "64 GPUs" in out and "(8 x dgx-h100)" in out and "64 x dgx-h100" not in out


def test_reproduce_commands_paste_as_one_command(narrow, capsys):
    """A reproduce command cut into lines ending in a backslash is the same command to a shell."""
    assert main(["plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if "recommended: perfmodel" in line)
    block = [lines[start]]
    while block[-1].endswith(" \\"):
        block.append(lines[start + len(block)])
    assert len(block) > 1
    command = " ".join(line.rstrip("\\").strip() for line in block).split("recommended: ", 1)[1]
    argv = shlex.split(command)
    assert argv[:3] == ["perfmodel", "estimate", "train"]
    assert main(argv[1:]) == 0


def test_command_lines_round_trip():
    command = ("perfmodel estimate serve --model 'my model.yaml' --system dgx-h100 --devices 8 --tp 8 --batch 128 "
               "--output-len 1024 --weight-precision fp8 --activation-precision a8 --kv-precision fp8")
    lines = render.wrapped_command("  #1 decode:", command, 60)
    assert all(cell_len(line) <= 60 for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    joined = " ".join(line.rstrip("\\") for line in lines).split("decode:", 1)[1]
    assert shlex.split(joined) == shlex.split(command)
    # A flag stays with its value.
    assert not any(line.rstrip(" \\").endswith(("--model", "--system", "--tp")) for line in lines)


def test_numbers_are_never_cut():
    """A table too wide for the terminal wraps and folds its names and text, never its numbers."""
    import io

    console = Console(width=40, file=io.StringIO(), highlight=False)
    table = render.Table(title="t")
    table.add_column("name")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("cost", justify="right")
    table.add_row("a-very-long-identifier-of-a-case", "some words that wrap", "123,456,789", "$13.5 M")
    console.print(table)
    out = console.file.getvalue()
    assert "123,456,789" in out and "$13.5 M" in out and "…" not in out
    assert max(cell_len(line) for line in out.splitlines()) <= 40
