"""Charts of the documents the commands print with ``--json``: PNG, SVG or a self-contained HTML page.

Each public function takes one such document (a plain dict) and an output path whose suffix picks
the format (``.png``, ``.svg`` or ``.html``: the figure as inline SVG and a table of the numbers
drawn), and returns the path written. Every number drawn is read from the document, or is
arithmetic on its numbers; nothing about the hardware is known here. Matplotlib is imported inside
the functions that draw (``perfmodel --help`` stays quick) and used through ``Figure`` objects only,
without pyplot's global state. Outputs carry no dates, so the same document gives the same bytes.

=============  ==================================================================================
``pareto``     ``plan train --pareto --json``, ``plan serve --pareto --json``
``breakdown``  ``estimate train --json``, ``estimate serve --json``
``roofline``   ``estimate train --json``, ``estimate serve --json`` (with per-operator FLOPs/bytes)
``memory``     ``estimate train --json``, ``estimate serve --json``
``compare``    ``compare --json``
=============  ==================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.hardware_db.errors import SpecError

from .chart_kit import (FIGSIZE_IN, ChartTable, drawing, identity, log_gap, number, require, save, serve_plan_text,
                        si, si_axis, spread, system_text, target, time_axis, time_unit, train_plan_text)
from .units import usd

# Precisions whose ceilings `compare` draws, and the line style of each (when an entry lists it).
COMPARE_PRECISIONS = {"bf16": "-", "fp8": "--", "fp4": ":"}
# Which plan field places each training state that can leave HBM (all other components stay in
# HBM, except one named "<component> in <tier>", as serving names its KV cache off HBM).
PLACED_BY = {"weights": "param_place", "gradients": "grad_place", "optimizer states": "optimizer_place"}


# --- 1. Pareto front ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Panel:
    key: str                 # the row field on x (seconds)
    label: str
    slo_s: float | None      # the demand's limit on it, when there is one


@dataclass(frozen=True)
class _ParetoData:
    title: str
    panels: tuple[_Panel, ...]
    cost_key: str
    cost_label: str
    energy_key: str
    energy_label: str
    front: tuple[dict, ...]
    others: tuple[dict, ...]
    best: dict | None
    texts: tuple[str, ...]   # short plan text of each front row
    objective: str


def _pareto_data(doc: dict, kind: str) -> _ParetoData:
    """What the Pareto chart draws, read from a ``plan train|serve --pareto --json`` document."""
    front = [r for r in doc.get("pareto") or [] if isinstance(r, dict)]
    if not front:
        raise SpecError("the pareto plot needs at least one plan in the document's 'pareto' list; it is empty")
    best = doc.get("best") if isinstance(doc.get("best"), dict) else None
    on_front = {identity(r) for r in front}
    others = [r for r in doc.get("top") or [] if isinstance(r, dict) and identity(r) not in on_front]
    rows = front + others + ([best] if best else [])
    if kind == "plan-train-pareto":
        panels = (_Panel("step_time_s", "step time", None),)
        costs = [("run_cost_usd", "cost of the run (USD)"),
                 ("cost_per_million_tokens_usd", "cost per million tokens (USD)")]
        energy = ("energy_per_token_j", "energy per token (J)")
        systems = sorted({f"{r.get('system')} x {r.get('devices')}" for r in front})
        texts = [(f"{r.get('devices')} x {r.get('system')}: " if len(systems) > 1 else "")
                 + train_plan_text(r.get("plan") or {}) for r in front]
        title = f"Pareto front of {doc.get('model', '?')} training on {', '.join(systems)}"
    else:
        pct = "p90" if all(number(r, "ttft_p90_s") for r in front) else "p50"
        slo = doc.get("demand", {}).get("slo_s") or {}
        panels = tuple(_Panel(f"{m}_{pct}_s", f"{m.upper()} {pct}", number(slo, f"{m}_{pct}") and slo[f"{m}_{pct}"])
                       for m in ("ttft", "tpot"))
        costs = [("usd_per_hour", "cost per hour (USD)"), ("usd_per_million_tokens", "cost per million tokens (USD)")]
        energy = ("joules_per_token", "energy per token (J)")
        mixed = len(doc.get("systems") or []) > 1
        where = lambda r: (" " + "+".join(dict.fromkeys(str(p.get("system")) for p in r.get("pools") or []))  # noqa: E731
                           if mixed else "")
        texts = [f"{r.get('devices', '?')} dev{where(r)}: " + serve_plan_text(r) for r in front]
        rate = number(doc.get("demand") or {}, "rate")
        title = (f"Pareto front of {doc.get('model', '?')} serving on {', '.join(map(str, doc.get('systems') or []))}"
                 + (f" at {rate[1]:g} requests/s" if rate else ""))
    cost = next(((k, label) for k, label in costs if all(number(r, k) for r in rows)), None)
    if cost is None:
        raise SpecError(f"the pareto plot needs a cost ({' or '.join(k for k, _ in costs)}) in every plan; "
                        "some have none (a price missing for --pricing owned?)")
    for p in panels:
        if not all(number(r, p.key) for r in rows):
            raise SpecError(f"the pareto plot needs '{p.key}' in every plan of the document; some have none")
    order = range(len(front))     # numbered as the command's Pareto table lists them
    return _ParetoData(title, panels, cost[0], cost[1], energy[0], energy[1], tuple(front[i] for i in order),
                       tuple(others), best, tuple(texts[i] for i in order), str(doc.get("objective", "?")))


_KEY_NOTES = {
    "plan-train-pareto": "    (/v interleave, z ZeRO stage, mb micro-batch, rc recompute, opt|grad|param>tier offload)",
    "plan-serve-pareto": "    (P prefill, D decode, C colocated pool: instances x parallelism, weight/activation "
                         "formats, kv cache format, b batch)",
}


def _grouped_labels(points: list[tuple[float, float]]) -> dict[tuple[float, float], str]:
    """Numbers (1-based) of the points at each distinct position, joined: ``{(x, y): "1,3"}``."""
    groups: dict[tuple[float, float], list[str]] = {}
    for i, p in enumerate(points):
        groups.setdefault(p, []).append(str(i + 1))
    return {p: ",".join(n) for p, n in groups.items()}


def pareto(doc: dict, path) -> Path:
    """Scatter of a plan search's Pareto front: time (s) on x, cost (USD) on y, energy per token (J)
    as colour; the optimum starred, the top plans off the front in grey, each front plan numbered
    and named in a key. Takes ``plan train --pareto --json`` or ``plan serve --pareto --json``
    (TTFT and TPOT panels, with the demand's SLO as dashed lines)."""
    path, fmt = target(path)
    kind = require(doc, "pareto", ("plan-train-pareto", "plan-serve-pareto"))
    data = _pareto_data(doc, kind)
    lines = [f"{i + 1:>2}  {t}" for i, t in enumerate(data.texts)] + [_KEY_NOTES[kind]]
    key_in = 0.12 * len(lines) + 0.2
    with drawing((FIGSIZE_IN[0], max(FIGSIZE_IN[1], 3.6 + key_in))) as fig:
        from matplotlib.colors import Normalize
        from matplotlib.lines import Line2D

        n = len(data.panels)
        grid = fig.add_gridspec(2, n, height_ratios=(fig.get_figheight() - key_in, key_in))
        axes = [fig.add_subplot(grid[0, i]) for i in range(n)]
        key_ax = fig.add_subplot(grid[1, :])
        energies = [r[data.energy_key] for r in data.front if number(r, data.energy_key)]
        norm = Normalize(min(energies), max(energies)) if energies else None
        for i, (ax, panel) in enumerate(zip(axes, data.panels)):
            xs = [r[panel.key] for r in data.front]
            ys = [r[data.cost_key] for r in data.front]
            if data.others:
                ax.scatter([r[panel.key] for r in data.others], [r[data.cost_key] for r in data.others], s=22,
                           facecolors="none", edgecolors="0.55", linewidths=0.8, zorder=2)
            colours = [r[data.energy_key] if number(r, data.energy_key) else float("nan") for r in data.front]
            sc = ax.scatter(xs, ys, c=colours, cmap="viridis", norm=norm, s=30, edgecolors="k", linewidths=0.4,
                            zorder=3)
            for (x, y), text in _grouped_labels(list(zip(xs, ys))).items():
                ax.annotate(text, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=6.5, zorder=4)
            if data.best:
                ax.scatter([data.best[panel.key]], [data.best[data.cost_key]], marker="*", s=170, facecolors="none",
                           edgecolors="crimson", linewidths=1.2, zorder=5)
            if panel.slo_s is not None:
                ax.axvline(panel.slo_s, color="crimson", linestyle="--", linewidth=0.8)
                ax.annotate(f"SLO {si(panel.slo_s, 's')}", (panel.slo_s, 0.0), xycoords=("data", "axes fraction"),
                            xytext=(-3, 3), textcoords="offset points", ha="right", va="bottom", fontsize=6.5,
                            color="crimson")
            high = max([*xs, *(r[panel.key] for r in data.others), panel.slo_s or 0.0])
            ax.set_xlabel(f"{panel.label} ({time_axis(ax.xaxis, high)})")
            if i == 0:
                ax.set_ylabel(data.cost_label)
            si_axis(ax.yaxis)
            ax.margins(0.12)
            ax.grid(True, linewidth=0.3, alpha=0.5)
        handles = [Line2D([], [], linestyle="", marker="o", markerfacecolor="tab:green", markeredgecolor="k",
                          markeredgewidth=0.4, label="Pareto front (numbered, see key)")]
        if data.others:
            handles.append(Line2D([], [], linestyle="", marker="o", markerfacecolor="none", markeredgecolor="0.55",
                                  label="top plans off the front"))
        if data.best:
            handles.append(Line2D([], [], linestyle="", marker="*", markersize=10, markerfacecolor="none",
                                  markeredgecolor="crimson", label=f"optimum (objective: {data.objective})"))
        axes[0].legend(handles=handles, loc="best", frameon=False)
        if norm is not None:
            fig.colorbar(sc, ax=axes, label=data.energy_label, pad=0.01, fraction=0.04)
        key_ax.axis("off")
        key_ax.text(0.0, 1.0, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=6.5,
                    linespacing=1.25, transform=key_ax.transAxes)
        fig.suptitle(data.title)
        panels_cols = tuple(p.label for p in data.panels)
        rows = [(str(i + 1), "front", t, *(si(r[p.key], digits=4) for p in data.panels), usd(r[data.cost_key]),
                 si(r.get(data.energy_key), digits=4)) for i, (r, t) in enumerate(zip(data.front, data.texts))]
        rows += [("-", "top, off the front", train_plan_text(r.get("plan") or {}) if kind == "plan-train-pareto"
                  else serve_plan_text(r), *(si(r[p.key], digits=4) for p in data.panels), usd(r[data.cost_key]),
                  si(r.get(data.energy_key), digits=4)) for r in data.others]
        table = ChartTable(("#", "set", "plan", *panels_cols, data.cost_label, data.energy_label), tuple(rows))
        return save(fig, path, fmt, data.title, table)


# --- 2. time breakdown -------------------------------------------------------------------------

def _positive(mapping: dict | None) -> dict[str, float]:
    """The entries of ``mapping`` that are positive finite numbers, in order."""
    return {k: float(v) for k, v in (mapping or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}


def _colours(names) -> dict[str, Any]:
    """One colour per name, stable for a given order (tab10, then tab20)."""
    from matplotlib import colormaps

    names = list(dict.fromkeys(names))
    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(names)}


def _stacked_bar(ax, y: float, parts: dict[str, float], colours: dict, factor: float, label_s: float,
                 hidden: dict[str, float] | None = None) -> float:
    """Draw ``parts`` (seconds, times ``factor``) as one horizontal stacked bar at ``y``, segments of
    ``label_s`` seconds or more labelled; each ``hidden`` part (seconds) follows its namesake
    hatched and paler. Returns the bar's end."""
    left = 0.0
    for name in dict.fromkeys([*parts, *(hidden or {})]):
        width = parts.get(name, 0.0) * factor
        if width > 0:
            ax.barh(y, width, left=left, color=colours[name], edgecolor="white", linewidth=0.5, height=0.6)
            if parts[name] >= label_s:
                ax.text(left + width / 2, y, si(parts[name], "s"), ha="center", va="center", fontsize=6.5,
                        color="white")
            left += width
        more = (hidden or {}).get(name, 0.0) * factor
        if more > 0:
            ax.barh(y, more, left=left, color=colours[name], alpha=0.35, hatch="////", edgecolor="white",
                    linewidth=0.0, height=0.6)
            left += more
    return left


def breakdown(doc: dict, path) -> Path:
    """Horizontal stacked bars of where the time goes (seconds, or ms and µs when shorter).
    ``estimate train --json``: the step's exposed components, with the prediction interval as a
    whisker, then each communication's time on its link, exposed solid and hidden behind compute
    hatched. ``estimate serve --json``: TTFT and TPOT by component, each in its own unit."""
    path, fmt = target(path)
    kind = require(doc, "breakdown", ("estimate-train", "estimate-serve"))
    result = doc["result"]
    if kind == "estimate-train":
        bars = [("step", "time_components_s", "step_time_s", "step_time_range_s")]
        what = "Step time"
    else:
        bars = [("TTFT", "prefill_components_s", "ttft_s", "ttft_range_s"),
                ("TPOT", "decode_components_s", "tpot_s", "tpot_range_s")]
        what = "Time to first token (TTFT) and per output token (TPOT)"
    for _, key, _, _ in bars:
        if not _positive(result.get(key)):
            raise SpecError(f"the breakdown plot needs positive times in result.{key}; the document has none")
    title = f"{what} of {doc.get('model', '?')} on {system_text(doc)}"
    links = _positive(result.get("time_on_link_s")) if kind == "estimate-train" else {}
    rows = []
    with drawing() as fig:
        from matplotlib.patches import Patch

        axes = fig.subplots(len(bars), 1, squeeze=False)[:, 0]
        colours = _colours([n for _, key, _, _ in bars for n in _positive(result[key])] + list(links))
        for ax, (label, key, total_key, range_key) in zip(axes, bars):
            parts = _positive(result[key])
            total = number(result, total_key)
            total_s = total[1] if total else sum(parts.values())
            span = [v for v in result.get(range_key) or [] if isinstance(v, (int, float)) and math.isfinite(v)]
            high = max([total_s, *span, *links.values()])
            factor, unit = time_unit(high)
            _stacked_bar(ax, 0.0, parts, colours, factor, 0.08 * high)
            rows += [(label, name, si(s, "s", 4), f"{s / total_s:.1%}") for name, s in parts.items()]
            heading = f"{label} {si(total_s, 's')}"
            if len(span) == 2:
                ax.errorbar([total_s * factor], [0.42], xerr=[[(total_s - span[0]) * factor], [(span[1] - total_s) * factor]],
                            fmt="none", ecolor="0.25", capsize=2.5, linewidth=0.8)
                heading += f" (whisker: prediction interval {si(span[0], 's')} to {si(span[1], 's')})"
                rows.append((label, "prediction interval", f"{si(span[0], 's', 4)} to {si(span[1], 's', 4)}", ""))
            ticks = [f"{label} (exposed)" if links else label]
            for j, (name, on_link) in enumerate(links.items()):
                exposed = min(parts.get(name, 0.0), on_link)
                _stacked_bar(ax, -(j + 1), {name: exposed}, colours, factor, 0.08 * high, {name: on_link - exposed})
                ax.text(on_link * factor, -(j + 1), f"  {si(exposed, 's')} exposed of {si(on_link, 's')}",
                        va="center", fontsize=6.5)
                ticks.append(f"{name} (on link)")
                rows.append((f"{name} on its link", "exposed, hidden", si(exposed, "s", 4), si(on_link - exposed, "s", 4)))
            ax.set_yticks([-i for i in range(len(ticks))], ticks)
            ax.set_ylim(-len(ticks) + 0.3, 0.75)
            ax.set_title(heading, loc="left", fontsize=8)
            ax.set_xlabel(f"{label} time ({unit})")
            ax.set_xlim(0, high * factor * 1.08)
            ax.grid(True, axis="x", linewidth=0.3, alpha=0.5)
            handles = [Patch(facecolor=colours[n], label=f"{n}: {si(s, 's')}") for n, s in parts.items()]
            handles += [Patch(facecolor=colours[n], label=f"{n} (on link only)") for n in links if n not in parts]
            if links:
                handles.append(Patch(facecolor="0.8", hatch="////", edgecolor="white", label="hidden behind compute"))
            ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        fig.suptitle(title)
        table = ChartTable(("bar", "component", "seconds", "share"), tuple(rows))
        return save(fig, path, fmt, title, table)


def _patch(colour):
    from matplotlib.patches import Patch

    return Patch(facecolor=colour)


# --- 3. operator roofline ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Roofs:
    peaks: dict[str, float]          # FLOP/s by precision
    bytes_per_s: float               # memory bandwidth
    source: str                      # where they came from


def _precisions(plan: dict, kind: str) -> list[str]:
    """The precisions an estimate's operators run at: training's GEMM precision (and bf16, which
    attention and elementwise operators use under fp8); serving's GEMM precision by its
    quantization scheme, bf16 and, with an fp8 KV cache, fp8 attention."""
    if kind == "estimate-train":
        first = str(plan.get("precision", "bf16"))
        return list(dict.fromkeys([first, "bf16" if first == "fp8" else first]))
    from perfmodel.plan import QuantScheme

    quant = QuantScheme(str(plan.get("weight_precision", "bf16")), str(plan.get("activation_precision", "a16")),
                        str(plan.get("kv_precision", "bf16")))
    return list(dict.fromkeys([quant.gemm_precision, "bf16", *(["fp8"] if quant.kv == "fp8" else [])]))


def _roofs_from_doc(doc: dict, kind: str) -> _Roofs:
    """The device's peak FLOP/s per precision and HBM bandwidth: from ``result.device`` when the
    document has it, else from the hardware database entry of the document's ``system``."""
    device = doc["result"].get("device")
    if isinstance(device, dict) and number(device, "hbm_bytes_per_s"):
        wanted = _precisions(doc.get("plan") or {}, kind)
        peaks = {p: v for p, v in (_positive(device.get("peak_flops_per_s")) or {}).items() if p in wanted}
        if peaks:
            return _Roofs(peaks, float(device["hbm_bytes_per_s"]), f"datasheet peaks of {device.get('name', '?')}")
    from perfmodel.comparison import profile
    from perfmodel.hardware_db.loader import load_database, user_dirs_from_env

    system = doc.get("system")
    if not system:
        raise SpecError("the roofline plot needs the document's 'system' (or result.machine) for the device peaks")
    entry = profile(str(system), load_database(user_dirs_from_env()))
    wanted = _precisions(doc.get("plan") or {}, kind)
    peaks = {p: entry[f"peak_{p}_flops"] for p in dict.fromkeys(wanted) if p and entry.get(f"peak_{p}_flops")}
    if not peaks or not entry.get("hbm_bytes_per_s"):
        raise SpecError(f"the roofline plot found no peak FLOP/s for {', '.join(map(str, wanted))} or no HBM "
                        f"bandwidth in the hardware database entry of {system}")
    return _Roofs(peaks, float(entry["hbm_bytes_per_s"]),
                  f"datasheet peaks from the hardware database entry of {system}")


def _operator_points(result: dict) -> list[tuple[str, float, float, str, float]]:
    """(name, FLOP/byte, achieved FLOP/s, bound, seconds) of each operator with FLOPs, bytes and
    time, by intensity."""
    ops = result.get("operators_s") or {}
    missing = sorted(n for n, o in ops.items() if not (isinstance(o, dict) and number(o, "flops") and number(o, "bytes")))
    if not ops or missing:
        raise SpecError("the roofline plot needs each operator's FLOPs and bytes (result.operators_s.<operator>"
                        ".flops and .bytes, per step on the busiest device); this document's operators have "
                        f"only {', '.join(sorted({k for o in ops.values() if isinstance(o, dict) for k in o})) or 'nothing'}")
    points = []
    for name, op in ops.items():
        flops, moved, seconds = op["flops"], op["bytes"], number(op, "seconds")
        if flops > 0 and moved > 0 and seconds and seconds[1] > 0:
            points.append((name, flops / moved, flops / seconds[1], str(op.get("bound", "?")), seconds[1]))
    if not points:
        raise SpecError("the roofline plot found no operator with positive FLOPs, bytes and seconds")
    return sorted(points, key=lambda p: (p[1], p[2], p[0]))


def roofline(doc: dict, path) -> Path:
    """Log-log roofline of the estimate's operators: the memory slope (bandwidth x FLOP/byte) and a
    compute ceiling per precision, each operator a numbered point at (FLOP/byte, achieved FLOP/s =
    FLOPs / seconds), coloured by the bound the model reports and named in a key. Takes ``estimate train|serve --json`` whose
    operators carry ``flops`` and ``bytes``; the peaks come from ``result.device``
    (``peak_flops_per_s`` by precision, ``hbm_bytes_per_s``) or the system's database entry."""
    path, fmt = target(path)
    kind = require(doc, "roofline", ("estimate-train", "estimate-serve"))
    points = _operator_points(doc["result"])
    roofs = _roofs_from_doc(doc, kind)
    title = f"Operator roofline of {doc.get('model', '?')} on {system_text(doc)}"
    ridges = {p: peak / roofs.bytes_per_s for p, peak in roofs.peaks.items()}
    xs = [p[1] for p in points] + list(ridges.values())
    lo = 10 ** math.floor(math.log10(min(xs)) - 0.3)
    hi = 10 ** math.ceil(math.log10(max(xs)) + 0.3)
    with drawing() as fig:
        ax = fig.add_subplot()
        top = max(roofs.peaks.values())
        ax.plot([lo, top / roofs.bytes_per_s], [roofs.bytes_per_s * lo, top], color="0.25", linewidth=1.2)
        ax.text(lo * 1.5, roofs.bytes_per_s * lo * 1.5 * 3.0, f"memory {si(roofs.bytes_per_s, 'B/s')}",
                fontsize=7, color="0.25", va="bottom")
        for (p, peak), style in zip(sorted(roofs.peaks.items(), key=lambda kv: kv[1]), ("-", "--", ":", "-.")):
            ax.plot([ridges[p], hi], [peak, peak], color="0.25", linestyle=style, linewidth=1.2)
            ax.text(hi, peak * 1.08, f"{p} peak {si(peak, 'FLOP/s')}", ha="right", va="bottom", fontsize=7, color="0.25")
        colour = {"compute": "tab:blue", "memory": "tab:orange"}
        for bound in sorted({p[3] for p in points}):
            sel = [p for p in points if p[3] == bound]
            ax.scatter([p[1] for p in sel], [p[2] for p in sel], s=26, color=colour.get(bound, "tab:gray"),
                       edgecolors="k", linewidths=0.4, zorder=3, label=f"{bound} bound")
        ax.set_xscale("log")
        ax.set_yscale("log")
        bottom = min(min(p[2] for p in points), roofs.bytes_per_s * lo) / 2
        for k, ((x, y), text) in enumerate(_grouped_labels([(p[1], p[2]) for p in points]).items()):
            ax.annotate(text, (x, y), xytext=(3, 4 if k % 2 == 0 else -10), textcoords="offset points", fontsize=6.5,
                        zorder=4)  # neighbours (by intensity) alternate above and below
        key = [f"{i + 1:>2} {p[0]}" for i, p in enumerate(points)]
        ax.text(1.02, 1.0, "operators\n" + "\n".join(key), transform=ax.transAxes, va="top", ha="left",
                family="monospace", fontsize=6.5, linespacing=1.3)
        ax.set_xlim(lo, hi)
        ax.set_ylim(bottom, top * 3)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved (FLOP/s)")
        si_axis(ax.xaxis)
        si_axis(ax.yaxis)
        ax.grid(True, which="major", linewidth=0.3, alpha=0.5)
        ax.legend(loc="lower right", frameon=False, title=f"roofs: {roofs.source}", title_fontsize=6.5)
        fig.suptitle(title)
        rows = [(f"{k + 1} {n}", si(i, "FLOP/B", 4), si(f, "FLOP/s", 4), b, si(s, "s", 4))
                for k, (n, i, f, b, s) in enumerate(points)]
        rows += [(f"{p} ceiling", si(ridges[p], "FLOP/B", 4) + " (ridge)", si(peak, "FLOP/s", 4), "", "")
                 for p, peak in roofs.peaks.items()]
        rows.append(("memory slope", "", si(roofs.bytes_per_s, "B/s", 4), "", ""))
        table = ChartTable(("operator", "intensity", "achieved", "bound", "seconds"), tuple(rows))
        return save(fig, path, fmt, title, table)


# --- 4. memory per tier ------------------------------------------------------------------------

def _tier_of(component: str, plan: dict, tiers) -> str:
    """The memory tier a component of ``memory_per_device_bytes`` lives in (see ``PLACED_BY``)."""
    head, _, tail = component.rpartition(" in ")
    if head and tail in tiers:
        return tail
    return str(plan.get(PLACED_BY.get(component, "")) or "hbm")


def tier_parts(result: dict, plan: dict) -> dict[str, dict[str, float]]:
    """Bytes per device of each component in each memory tier, tiers in the order hbm, ddr, cxl,
    pooled, nvme. A tier whose components do not add up to its ``used_bytes`` (to 1 ppm) is
    shown as one ``used`` part instead of a guess."""
    from perfmodel.plan import PLACES

    parts = _positive(result.get("memory_per_device_bytes"))
    tiers = result.get("memory_tiers") or {}
    known = (*PLACES, *tiers)
    out: dict[str, dict[str, float]] = {}
    for name, value in parts.items():
        out.setdefault(_tier_of(name, plan, known), {})[name] = value
    for tier, info in tiers.items():
        used = number(info or {}, "used_bytes")
        mine = out.get(tier, {})
        if used and abs(sum(mine.values()) - used[1]) > 1e-6 * max(used[1], 1.0):
            out[tier] = {"used (not split by component)": used[1]}
        out.setdefault(tier, {})
    order = {t: i for i, t in enumerate(PLACES)}
    return {t: out[t] for t in sorted(out, key=lambda t: (order.get(t, len(order)), t))}


def memory(doc: dict, path) -> Path:
    """Memory per device in each tier (HBM, DDR, CXL, NVMe...), a stacked bar of its components
    (bytes) per tier with the tier's capacity as a red line. Takes ``estimate train|serve --json``."""
    path, fmt = target(path)
    require(doc, "memory", ("estimate-train", "estimate-serve"))
    result = doc["result"]
    tiers = tier_parts(result, doc.get("plan") or {})
    if not any(tiers.values()):
        raise SpecError("the memory plot needs result.memory_per_device_bytes; the document has no positive entry")
    info = result.get("memory_tiers") or {}
    title = f"Memory per device of {doc.get('model', '?')} on {system_text(doc)}"
    rows = []
    with drawing((FIGSIZE_IN[0], min(FIGSIZE_IN[1], 1.6 + 1.0 * len(tiers)))) as fig:
        axes = fig.subplots(len(tiers), 1, squeeze=False)[:, 0]
        colours = _colours(sorted({c for parts in tiers.values() for c in parts}))
        for ax, (tier, parts) in zip(axes, tiers.items()):
            capacity = number(info.get(tier) or {}, "capacity_bytes")
            high = max(sum(parts.values()), capacity[1] if capacity else 0.0) or 1.0
            left = 0.0
            for name, value in parts.items():
                ax.barh(0, value, left=left, color=colours[name], edgecolor="white", linewidth=0.5, height=0.6,
                        label=name)
                if value >= 0.09 * high:
                    ax.text(left + value / 2, 0, si(value, "B"), ha="center", va="center", fontsize=6.5, color="white")
                left += value
                rows.append((tier, name, si(value, "B", 4)))
            if capacity:
                ax.axvline(capacity[1], color="crimson", linewidth=1.2)
                rows.append((tier, "capacity", si(capacity[1], "B", 4)))
            share = f" ({left / capacity[1]:.0%} of {si(capacity[1], 'B')})" if capacity and capacity[1] else \
                " (capacity: not in the document)"
            ax.text(0.0, 0.62, f"{si(left, 'B')} used{share}", transform=ax.get_yaxis_transform(), fontsize=7,
                    va="bottom")
            named = (info.get(tier) or {}).get("name")
            ax.set_yticks([0], [tier.upper() + (f"\n{named}" if named else "")])
            ax.set_ylim(-0.5, 1.0)
            ax.set_xlim(0, high * 1.04)
            si_axis(ax.xaxis, "B")
            ax.grid(True, axis="x", linewidth=0.3, alpha=0.5)
        axes[-1].set_xlabel("bytes per device" + (" (each tier on its own scale)" if len(tiers) > 1 else "")
                            + "; red line: the tier's capacity")
        handles = [_patch(colours[n]) for n in colours]
        fig.legend(handles, list(colours), loc="outside lower center", ncol=min(len(colours), 6), frameon=False)
        fig.suptitle(title)
        table = ChartTable(("tier", "component", "bytes per device"), tuple(rows))
        return save(fig, path, fmt, title, table)


# --- 5. device comparison ----------------------------------------------------------------------

def compare_roofs(doc: dict) -> list[tuple[str, float, dict[str, float]]]:
    """(name, HBM bytes/s, {precision: peak FLOP/s}) of each entry of ``compare --json`` that has a
    bandwidth and at least one of ``COMPARE_PRECISIONS``."""
    out = []
    for e in doc.get("entries") or []:
        bw = number(e, "hbm_bytes_per_s")
        peaks = {p: float(e[f"peak_{p}_flops"]) for p in COMPARE_PRECISIONS if number(e, f"peak_{p}_flops")}
        if bw and peaks:
            out.append((str(e.get("name", "?")), bw[1], peaks))
    return out


def compare(doc: dict, path) -> Path:
    """Log-log rooflines of the compared devices: each device's memory slope (HBM bytes/s x FLOP/byte)
    and its compute ceilings (bf16 solid, fp8 dashed, fp4 dotted, where listed), labelled with the
    peak; x is arithmetic intensity (FLOP/byte), y attainable FLOP/s. Takes ``compare --json``."""
    path, fmt = target(path)
    require(doc, "compare", ("compare",))
    devices = compare_roofs(doc)
    if not devices:
        raise SpecError("the compare plot needs entries with hbm_bytes_per_s and a peak "
                        f"({', '.join(COMPARE_PRECISIONS)}); this document has none")
    names = [d[0] for d in devices]
    title = f"Rooflines of {', '.join(names)} (datasheet dense peaks, HBM bandwidth)"
    ridges = [peak / bw for _, bw, peaks in devices for peak in peaks.values()]
    lo = 10 ** math.floor(math.log10(min(ridges)) - 2)
    hi = 10 ** math.ceil(math.log10(max(ridges)) + 0.5)
    rows = []
    with drawing() as fig:
        from matplotlib.lines import Line2D

        ax = fig.add_subplot()
        colours = _colours(names)
        labels = []
        for name, bw, peaks in devices:
            c = colours[name]
            top = max(peaks.values())
            ax.plot([lo, top / bw], [bw * lo, top], color=c, linewidth=1.3)
            for p, peak in peaks.items():
                ax.plot([peak / bw, hi], [peak, peak], color=c, linestyle=COMPARE_PRECISIONS[p], linewidth=1.3)
                ax.plot([peak / bw], [peak], marker="o", markersize=3, color=c)
                labels.append((f"{name} {p} {si(peak, 'FLOP/s')}", peak, c))
                rows.append((name, p, si(peak, "FLOP/s", 4), si(bw, "B/s", 4), si(peak / bw, "FLOP/B", 4)))
        bottom, top = min(bw for _, bw, _ in devices) * lo / 2, max(v for _, v, _ in labels) * 2.5
        logy = spread([math.log10(v) for _, v, _ in labels], log_gap(fig, bottom, top))
        for (text, _v, c), ly in zip(labels, logy):
            ax.text(hi * 1.05, 10 ** ly, text, fontsize=6.5, color=c, va="center", ha="left", clip_on=False)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(bottom, top)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("attainable (FLOP/s)")
        si_axis(ax.xaxis)
        si_axis(ax.yaxis)
        ax.grid(True, which="major", linewidth=0.3, alpha=0.5)
        handles = [Line2D([], [], color=colours[n], linewidth=1.3) for n in names]
        texts = [f"{n}: HBM {si(bw, 'B/s')}" for n, bw, _ in devices]
        shown = [p for p in COMPARE_PRECISIONS if any(p in peaks for _, _, peaks in devices)]
        handles += [Line2D([], [], color="0.3", linestyle=COMPARE_PRECISIONS[p]) for p in shown]
        texts += [f"{p} ceiling" for p in shown]
        ax.legend(handles, texts, loc="upper left", frameon=False)
        fig.suptitle(title)
        table = ChartTable(("device", "precision", "peak", "HBM bandwidth", "ridge point"), tuple(rows))
        return save(fig, path, fmt, title, table)
