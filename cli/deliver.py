"""What a command writes besides its tables: JSON or CSV on stdout, a chart, a framework's launch files.

Every command builds one JSON document of its result; charts and CSV are drawn from that document,
so they show exactly what ``--json`` prints. Messages about written files go to stderr.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from perfmodel.hardware_db.errors import SpecError


def emit_json(obj: Any) -> None:
    """Print ``obj`` as one JSON document: sorted keys, no NaN, byte-reproducible."""
    print(json.dumps(_finite(obj), sort_keys=True, indent=2, allow_nan=False))


def _finite(obj: Any) -> Any:
    """The same structure with every float finite (a NaN or inf here is a bug, so fail loudly)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"non-finite value in output: {obj}")
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def emit_csv(rows: list[dict[str, Any]]) -> None:
    """Rows as CSV on stdout: one header of every key in first-seen order; None as empty."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else _cell(v)) for k, v in row.items()})


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_files(out: str | None, files: dict[str, str]) -> list[str]:
    """``files`` (name -> text) written into the directory ``out`` (created); the paths written."""
    if not out:
        raise SpecError("--export needs --out DIR, the directory to write the launch files to")
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in files.items():
            path = folder / name
            path.write_text(text)
            if name.endswith(".sh"):
                path.chmod(0o755)
            written.append(str(path))
    except OSError as exc:
        raise SpecError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    return written


def note(text: str) -> None:
    """One line on stderr (stdout is for results)."""
    print(text, file=sys.stderr)


def delivered(doc: dict, output, csv_rows: Callable[[], list[dict]], charts: dict[str, Callable[[], dict]],
              default_chart: str, export: Callable[[str], dict[str, str]] | None = None) -> bool:
    """Write the launch files and chart ``output`` asks for (listing them in ``doc``), then print
    JSON or CSV if asked. True when stdout got JSON or CSV, so the caller prints no tables.

    ``charts`` maps a chart name to a function giving the document it is drawn from."""
    if getattr(output, "export", None):
        if export is None:
            raise SpecError("--export applies to plan train, plan serve and estimate")
        doc["exports"] = {"framework": output.export,
                          "files": write_files(output.out, export(output.export))}
    elif getattr(output, "out", None):
        raise SpecError("--out names the directory of --export files; give --export FRAMEWORK too")
    if getattr(output, "plot", None):
        chart = getattr(output, "chart", None) or default_chart
        if chart not in charts:
            raise SpecError(f"--chart {chart} is not drawn by this command; it draws {', '.join(charts)}")
        from . import plots

        try:
            Path(output.plot).parent.mkdir(parents=True, exist_ok=True)
            written = getattr(plots, chart)(charts[chart](), output.plot)
        except OSError as exc:
            raise SpecError(f"--plot {output.plot}: cannot write ({exc.strerror or exc})") from None
        doc["plot"] = {"chart": chart, "file": str(written)}
    if output.json_out:
        emit_json(doc)
        return True
    if getattr(output, "csv_out", False):
        emit_csv(csv_rows())
        return True
    return False


def report_files(doc: dict) -> None:
    """After the tables: where the launch files and the chart went."""
    for path in doc.get("exports", {}).get("files", []):
        note(f"wrote {path}")
    if "plot" in doc:
        note(f"wrote {doc['plot']['file']} ({doc['plot']['chart']} chart)")
