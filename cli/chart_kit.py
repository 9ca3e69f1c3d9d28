"""The drawing kit of perfmodel's charts: one style, SI and money labels, plan texts, the output formats.

``plots`` (the charts of the commands' documents) and ``sweep`` (the sweep's charts) draw with it.
Matplotlib is imported inside the functions that draw, so importing this module costs nothing.
"""

from __future__ import annotations

import html
import io
import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.hardware_db.errors import SpecError

SUFFIXES = (".png", ".svg", ".html")
FIGSIZE_IN = (8.0, 5.0)
PNG_DPI = 150

# The matplotlib settings every chart is drawn with (no hash salt varies between runs: same bytes).
STYLE = {"svg.fonttype": "none", "svg.hashsalt": "perfmodel", "font.size": 8, "axes.titlesize": 9,
         "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7, "legend.fontsize": 7,
         "figure.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False}

# What each kind of document is, as a user would name the command that prints it.
COMMANDS = {
    "plan-train-pareto": "`perfmodel plan train --pareto --json`",
    "plan-serve-pareto": "`perfmodel plan serve --pareto --json`",
    "plan-train": "`perfmodel plan train --json` (without --pareto)",
    "plan-serve": "`perfmodel plan serve --json` (without --pareto)",
    "estimate-train": "`perfmodel estimate train --json`",
    "estimate-serve": "`perfmodel estimate serve --json`",
    "compare": "`perfmodel compare --json`",
}


@dataclass(frozen=True)
class ChartTable:
    """The numbers a chart draws, as text: column headers (with units) and rows."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


# --- small pure helpers ------------------------------------------------------------------------

PREFIXES = {-12: "p", -9: "n", -6: "µ", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def si(value: float | None, unit: str = "", digits: int = 3, sep: str = " ") -> str:
    """``value`` with an SI prefix and ``digits`` significant digits: ``si(3.35e12, "B/s")`` is
    ``"3.35 TB/s"``; None is ``"-"``."""
    if value is None or not math.isfinite(value):
        return "-"
    if value == 0:
        return f"0{sep}{unit}".rstrip()
    rounded = float(f"{value:.{digits}g}")
    exp3 = max(-12, min(18, math.floor(math.log10(abs(rounded)) / 3) * 3))
    return f"{rounded / 10 ** exp3:.{digits}g}{sep}{PREFIXES[exp3]}{unit}".rstrip()


def time_unit(seconds: float) -> tuple[float, str]:
    """(factor, unit) that prints ``seconds`` as s, ms or µs: multiply seconds by the factor."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def spread(values: list[float], gap: float) -> list[float]:
    """Positions near ``values`` (same order) at least ``gap`` apart: labels that do not overlap.

    Sorted, each position is pushed up to ``gap`` above the one below, then the whole group is
    shifted back down by half of what it gained, so labels stay centred on their points.
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    placed: list[float] = []
    for i in order:
        placed.append(values[i] if not placed else max(values[i], placed[-1] + gap))
    shift = (sum(placed) - sum(values[i] for i in order)) / (2 * len(values)) if values else 0.0
    out = [0.0] * len(values)
    for rank, i in enumerate(order):
        out[i] = placed[rank] - shift
    return out


def train_plan_text(plan: dict) -> str:
    """A training plan in a few tokens: ``tp1 pp4/v2 cp8 dp2 z2 bf16 opt>ddr``."""
    g = plan.get
    parts = [f"tp{g('tp', 1)}", f"pp{g('pp', 1)}" + (f"/v{g('interleave')}" if (g("interleave") or 1) > 1 else "")
             + ("/e" if g("ends_as_layers") else "")]
    parts += [f"{k}{g(k)}" for k in ("cp", "ep") if (g(k) or 1) > 1]
    parts.append(f"dp{g('dp', 1)}")
    if (g("micro_batch") or 1) > 1:
        parts.append(f"mb{g('micro_batch')}")
    parts.append(f"z{g('zero', 0)}")
    sharding = (("shard", "s"), ("shard_weights", "w/"), ("shard_grads", "g/"), ("hpz", "hpz"))
    parts += [f"{short}{int(g(key))}" for key, short in sharding if int(g(key) or 0) > (1 if key == "hpz" else 0)]
    parts += [key for key in ("qwz", "qgz") if g(key)]
    if g("recompute") not in (None, "none"):
        parts.append(f"rc:{str(g('recompute'))[:4]}")
    if g("precision"):
        parts.append(str(g("precision")))
    for key, short in (("optimizer_place", "opt"), ("grad_place", "grad"), ("param_place", "param")):
        if g(key) not in (None, "hbm"):
            parts.append(f"{short}>{g(key)}")
    return " ".join(parts)


def serve_pool_text(pool: dict) -> str:
    """One serving pool in a few tokens: ``P 4x tp1 fp8/a8`` (role, instances, parallelism, formats)."""
    c = pool.get("config") or {}
    text = f"{str(pool.get('role', '?'))[:1].upper()} {pool.get('instances', '?')}x tp{c.get('tp', 1)}"
    text += "".join(f" {k}{c[k]}" for k in ("pp", "ep") if (c.get(k) or 1) > 1)
    text += f" {c.get('weight_precision', '?')}/{c.get('activation_precision', '?')}"
    if c.get("kv_precision") and c.get("kv_precision") != c.get("weight_precision"):
        text += f" kv:{c['kv_precision']}"
    if (c.get("batch") or 1) > 1:
        text += f" b{c['batch']}"
    return text


def serve_plan_text(row: dict) -> str:
    """A serving deployment: its pools joined, colocated or disaggregated (``P ... | D ...``)."""
    return " | ".join(serve_pool_text(p) for p in row.get("pools") or [])


def doc_kind(doc: Any) -> str:
    """Which command printed ``doc`` (a key of the command table), or a description of what it is."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    if "entries" in doc and "metrics" in doc:
        return "compare"
    result = doc.get("result")
    if isinstance(result, dict):
        if "time_components_s" in result:
            return "estimate-train"
        if "prefill_components_s" in result:
            return "estimate-serve"
    best = doc.get("best")
    if "evidence" in doc and ("objective" in doc or isinstance(best, dict)):
        serve = "demand" in doc or (isinstance(best, dict) and "pools" in best)
        return f"plan-{'serve' if serve else 'train'}" + ("-pareto" if "pareto" in doc else "")
    return "the JSON of no command these plots read (keys: " + ", ".join(sorted(doc)[:6]) + ")"


def require(doc: Any, plot: str, kinds: tuple[str, ...]) -> str:
    """The kind of ``doc``, or a one-line SpecError naming the commands ``plot`` takes."""
    kind = doc_kind(doc)
    if kind not in kinds:
        wanted = " or ".join(COMMANDS[k] for k in kinds)
        found = COMMANDS.get(kind, kind)
        raise SpecError(f"the {plot} plot needs the JSON of {wanted}; this document is {found}")
    return kind


def number(row: dict, *keys: str) -> tuple[str, float] | None:
    """(key, value) of the first of ``keys`` whose value in ``row`` is a finite number."""
    for key in keys:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return key, float(value)
    return None


def identity(row: dict) -> str:
    """What names one plan of a search (its plan or pools, system, devices, mode)."""
    return json.dumps({k: row.get(k) for k in ("plan", "pools", "system", "devices", "mode")}, sort_keys=True)


def target(path) -> tuple[Path, str]:
    """(path, format) from the suffix, or a one-line SpecError listing the allowed suffixes."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise SpecError(f"plot file {path.name}: unknown suffix '{path.suffix}'; use one of {', '.join(SUFFIXES)}")
    return path, suffix[1:]


def system_text(doc: dict) -> str:
    return f"{doc.get('system', '?')} x {doc.get('devices', '?')}"


# --- output ------------------------------------------------------------------------------------

def check_available() -> None:
    """Before a long search: a SpecError when matplotlib is not installed, so that --plot fails
    before the work, not after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecError("plotting needs matplotlib: pip install 'perfmodel[plot]'") from None


@contextmanager
def drawing(size=FIGSIZE_IN):
    """A new matplotlib Figure (constrained layout) inside perfmodel's style, or a SpecError
    saying how to install matplotlib."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise SpecError("plotting needs matplotlib: pip install 'perfmodel[plot]'") from None
    with matplotlib.rc_context(STYLE):
        yield Figure(figsize=size, layout="constrained")


def html_page(title: str, svg: str, table: ChartTable) -> str:
    """A self-contained HTML page: ``title``, the inline ``svg`` figure and ``table``."""
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns)
    body = "\n".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in table.rows)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc(title)}</title>\n<style>\n"
            "body{font-family:sans-serif;margin:1.5em;color:#222}\n"
            "figure{margin:0}svg{max-width:100%;height:auto}\n"
            "table{border-collapse:collapse;font-size:13px;margin-top:1em}\n"
            "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}\n"
            "td:first-child,th:first-child{text-align:left}\n</style>\n</head>\n<body>\n"
            f"<h1 style=\"font-size:16px\">{esc(title)}</h1>\n<figure>\n{svg}\n</figure>\n"
            f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>\n</body>\n</html>\n")


def save(fig, path: Path, fmt: str, title: str, table: ChartTable) -> Path:
    """Write ``fig`` as PNG or SVG, or as an HTML page with its SVG and ``table``; no dates inside."""
    if fmt == "png":
        fig.savefig(path, format="png", dpi=PNG_DPI, metadata={"Software": None})
    elif fmt == "svg":
        fig.savefig(path, format="svg", metadata={"Date": None})
    else:
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
        svg = buffer.getvalue()
        path.write_text(html_page(title, svg[svg.index("<svg"):], table), encoding="utf-8")
    fig.clear()
    return path


def time_axis(axis, high_s: float) -> str:
    """Tick labels of a time axis (data in seconds) in the unit that suits ``high_s``; returns it."""
    from matplotlib.ticker import FuncFormatter

    factor, unit = time_unit(high_s)
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v * factor:.6g}"))
    return unit


def log_gap(fig, low: float, high: float, points: float = 8.5) -> float:
    """The log10 distance that ``points`` (text height) spans on a log axis from ``low`` to
    ``high`` filling most of ``fig``'s height: the spacing of labels that must not overlap."""
    return math.log10(high / low) * points / 72.0 / (0.8 * fig.get_figheight())


def si_axis(axis, unit: str = "") -> None:
    """SI-prefixed tick labels on a matplotlib axis (``10k``, ``3.4T``); no minor labels."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: si(v, unit, digits=4, sep="")))
    axis.set_minor_formatter(NullFormatter())
