"""Export golden files shared by the export tests: run an export as a user types it and compare its files
with the stored ones (``UPDATE_GOLDEN=1`` rewrites them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from perfmodel.cli.app import main

GOLDEN = Path(__file__).parents[1] / "data" / "exports"


def export(argv: list[str], framework: str, out: Path, capsys) -> list[Path]:
    """The files ``argv --export framework`` writes to ``out`` (each non-empty)."""
    code = main(argv + ["--export", framework, "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    files = [Path(p) for p in json.loads(captured.out)["exports"]["files"]]
    assert files and all(p.is_file() and p.stat().st_size for p in files)
    return files


def assert_golden(files: list[Path], name: str) -> None:
    """``files`` are exactly the golden folder ``name``'s, byte for byte (rewritten under UPDATE_GOLDEN)."""
    golden = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        golden.mkdir(parents=True, exist_ok=True)
        for old in golden.iterdir():
            old.unlink()
        for f in files:
            (golden / f.name).write_text(f.read_text())
    assert sorted(f.name for f in files) == sorted(p.name for p in golden.iterdir())
    for f in files:
        assert f.read_text() == (golden / f.name).read_text(), f"{f.name} differs from its golden file"
