"""``perfmodel sweep SPEC.yaml`` and ``perfmodel sweep report DIR``: run a design-space sweep, and
read what moves each metric (perfmodel.search.sweep)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from perfmodel.hardware_db.errors import SpecError

from .render import console, fmt, kv_table

ENGINES = ("process", "ray")
DEFAULT_METRIC = "tokens_per_usd"


class SweepProgress:
    """Points done, points per second and the time left, on stderr (silent when not a terminal)."""

    def __init__(self, what: str, enabled: bool):
        from rich.console import Console

        self.stderr = Console(stderr=True)
        self.enabled = enabled and self.stderr.is_terminal
        self.what, self.bar, self.started, self.first = what, None, time.perf_counter(), None

    def __call__(self, done: int, total: int) -> None:
        if self.first is None:
            self.first = done      # resumed points: not part of the rate
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        if self.bar is None:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=self.stderr,
                                transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=total, completed=done, rate="")
        seconds = time.perf_counter() - self.started
        rate = (done - self.first) / seconds if seconds > 0 else 0.0
        self.bar.update(self.task, completed=done, total=total, rate=f"{rate:,.1f} points/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run(spec_path: str, out: str, engine: str, workers: int | None, address: str | None, dirs: list[str],
        json_out: bool, metric: str = "tokens_per_usd", heatmap: str | None = None, plot: str | None = None,
        workload: str | None = None, pareto: bool = False) -> None:
    from perfmodel.search.sweep import parse_spec, run_sweep

    from .sweep_table import append_rows, read_table, write_table

    if engine not in ENGINES:
        raise SpecError(f"--engine needs one of {', '.join(ENGINES)}, has {engine!r}")
    if workers is not None and not 1 <= workers <= 4096:
        raise SpecError(f"--workers needs 1 to 4,096, has {workers}")
    path = Path(spec_path)
    if not path.is_file():
        raise SpecError(f"no sweep spec at {spec_path}")
    from perfmodel.hardware_db.files import read_text
    from perfmodel.hardware_db.limits import MAX_YAML_BYTES

    text = read_text(path, MAX_YAML_BYTES, "sweep spec")
    spec = parse_spec(text, str(path))
    meta, done = read_table(out)
    if meta and meta.get("digest") != spec.digest():
        raise SpecError(f"{out} holds the points of another spec ({meta.get('name')}); give a new --out or remove it")
    progress = SweepProgress(f"sweep {spec.name}", enabled=not json_out)
    try:
        result = run_sweep(text, tuple(dirs), engine, workers, address, done, progress,
                           on_rows=lambda rows: append_rows(out, spec, rows))
    finally:
        progress.close()
    files = write_table(out, spec, result.rows)
    rate = result.evaluated / result.seconds if result.seconds > 0 else 0.0
    summary = {"name": spec.name, "points": len({r["point"] for r in result.rows}), "rows": len(result.rows),
               "evaluated": result.evaluated, "resumed": len({r["point"] for r in result.rows}) - result.evaluated,
               "engine": result.engine, "workers": result.workers, "seconds": result.seconds,
               "points_per_s": rate, "files": files,
               "status": {s: sum(r.get("status") == s for r in result.rows)
                          for s in sorted({str(r.get("status")) for r in result.rows})}}
    summary["report"] = report_doc(out, metric, heatmap, plot, workload, pareto)
    if json_out:
        print(json.dumps(summary, indent=1, default=str))
        return
    console.print(kv_table(f"sweep {spec.name} over {spec.base_system}", [
        ("points", f"{summary['points']:,} ({summary['evaluated']:,} evaluated, {summary['resumed']:,} resumed)"),
        ("rows (points x workloads)", f"{summary['rows']:,}"),
        ("status", ", ".join(f"{k} {v:,}" for k, v in summary["status"].items())),
        ("engine", f"{result.engine}, {result.workers} worker{'s' if result.workers > 1 else ''}"),
        ("time", f"{result.seconds:,.1f} s ({rate:,.1f} points/s)"),
        ("written", "\n".join(files))]))
    print_report(summary["report"])
    console.print(f"read it again: perfmodel sweep report {out} (--metric, --heatmap X,Y --plot FILE)", markup=False)


def report_doc(out: str, metric: str, heatmap: str | None, plot: str | None, workload: str | None,
               pareto: bool = False) -> dict:
    """What moves each metric in a sweep's table: elasticities per workload, the heat map asked, and
    the Pareto front over the points (time against cost)."""
    from perfmodel.search.sweep import METRICS, grid_of, pareto_points, sensitivity

    from .sweep_table import read_table

    meta, rows = read_table(out)
    if not meta:
        raise SpecError(f"no sweep table in {out} (run perfmodel sweep SPEC.yaml --out {out} first)")
    if metric not in METRICS:
        raise SpecError(f"--metric needs one of {', '.join(METRICS)}, has {metric!r}")
    if workload is not None and workload not in meta["workloads"]:
        raise SpecError(f"--workload needs one of {', '.join(meta['workloads'])}, has {workload!r}")
    found = [s for s in sensitivity(meta, rows) if workload is None or s.workload == workload]
    doc = {"name": meta["name"], "metric": metric, "parameters": meta["parameters"],
           "points": len({r["point"] for r in rows}),
           # Without a swept price every point pays the base system's: cost follows throughput alone.
           "price_held": "price_usd_per_hour" not in meta["parameters"],
           "sensitivity": [{"workload": s.workload, "parameters": list(s.parameters), "elasticities": s.elasticities,
                            "r2": s.r2, "points": s.points, "strongest": {m: s.strongest(m) for m in s.elasticities}}
                           for s in found]}
    if heatmap:
        axes = [a.strip() for a in heatmap.split(",")]
        if len(axes) != 2 or any(a not in meta["parameters"] for a in axes):
            raise SpecError(f"--heatmap needs two of the sweep's parameters X,Y ({', '.join(meta['parameters'])}), "
                            f"has {heatmap!r}")
        name = workload or meta["workloads"][0]
        xs, ys, grid = grid_of(rows, name, axes[0], axes[1], metric)
        doc["heatmap"] = {"workload": name, "x": axes[0], "y": axes[1], "metric": metric, "x_values": xs,
                          "y_values": ys, "values": [[None if v != v else float(v) for v in line] for line in grid]}
        if plot:
            doc["files"] = [_heatmap_figure(doc["heatmap"], plot)]
    if pareto:
        name = workload or meta["workloads"][0]
        time_key, cost_key, front = pareto_points(rows, name)
        doc["pareto"] = {"workload": name, "time": time_key, "cost": cost_key,
                         "points": [{k: r.get(k) for k in ("point", *meta["parameters"], time_key, cost_key)}
                                    for r in front]}
        if plot and not heatmap:
            doc["files"] = [_pareto_figure(rows, doc["pareto"], plot)]
    if plot and not (heatmap or pareto):
        raise SpecError("--plot needs --heatmap X,Y (the two parameters of the map) or --pareto")
    return doc


def report(out: str, metric: str, heatmap: str | None, plot: str | None, workload: str | None,
           json_out: bool, pareto: bool = False) -> None:
    doc = report_doc(out, metric, heatmap, plot, workload, pareto)
    if json_out:
        print(json.dumps(doc, indent=1, default=str))
        return
    print_report(doc)


def print_report(doc: dict) -> None:
    from .render import Table

    metric = doc["metric"]
    if doc.get("price_held"):
        console.print("price held: every point pays the base system's price per device-hour, so cost and tokens "
                      "per dollar move with throughput alone (sweep price_usd_per_hour to move it)", markup=False,
                      style="dim")
    for s in doc["sensitivity"]:
        table = Table(title=f"{s['workload']}: elasticity d ln(metric) / d ln(parameter), {doc['points']:,} points",
                      title_justify="left")
        table.add_column("metric")
        for p in s["parameters"]:
            table.add_column(p, justify="right")
        table.add_column("R²", justify="right")
        for m, e in s["elasticities"].items():
            table.add_row(m, *[f"{e[p]:+.3f}" for p in s["parameters"]], f"{s['r2'][m]:.2f}")
        console.print(table)
        top = s["strongest"].get(metric)
        if top:
            console.print(f"{metric} moves most with {top[0]}: {top[1]:+.3f}% per 1% "
                          f"({'up' if top[1] > 0 else 'down'} with it)", markup=False)
        elif s["elasticities"]:
            console.print(f"{metric} does not move over this design", markup=False)
    if "pareto" in doc:
        p = doc["pareto"]
        table = Table(title=f"Pareto front of {p['workload']}: {p['time']} against {p['cost']}, "
                            f"{len(p['points'])} of {doc['points']:,} points", title_justify="left")
        short = {p["time"]: "time s" if p["time"] == "step_time_s" else "latency s", p["cost"]: "$/M tok"}
        for col in p["points"][0] if p["points"] else ():
            table.add_column(short.get(col, col), justify="right")
        for r in p["points"]:
            table.add_row(*[fmt(v) if isinstance(v, (int, float)) else str(v) for v in r.values()])
        console.print(table)
    if "heatmap" in doc:
        h = doc["heatmap"]
        console.print(f"{h['metric']} over {h['x']} x {h['y']} ({h['workload']}): "
                      f"{len(h['x_values'])} x {len(h['y_values'])} cells"
                      + (f", drawn in {doc['files'][0]}" if doc.get("files") else ""), markup=False)


def _pareto_figure(rows: list[dict], p: dict, path: str) -> str:
    """Every point's time against its cost, the front marked (PNG, SVG, or HTML with the front's table)."""
    from .chart_kit import ChartTable, drawing, save, target

    file, kind = target(path)
    mine = [r for r in rows if r.get("workload") == p["workload"] and isinstance(r.get(p["time"]), (int, float))
            and isinstance(r.get(p["cost"]), (int, float))]
    with drawing() as fig:
        ax = fig.add_subplot()
        ax.scatter([r[p["time"]] for r in mine], [r[p["cost"]] for r in mine], s=8, color="#9ab", label="points")
        front = p["points"]
        ax.plot([r[p["time"]] for r in front], [r[p["cost"]] for r in front], "o-", color="#c33", label="Pareto front")
        ax.set_xlabel(p["time"])
        ax.set_ylabel(p["cost"])
        ax.set_title(f"{p['workload']}: {len(front)} non-dominated of {len(mine)} points")
        ax.legend()
        cols = tuple(front[0]) if front else ("point",)
        table = ChartTable(cols, tuple(tuple(fmt(v) if isinstance(v, (int, float)) else str(v) for v in r.values())
                                  for r in front))
        return str(save(fig, file, kind, f"Pareto front of {p['workload']}", table))


def _heatmap_figure(h: dict, path: str) -> str:
    """The metric over two parameters as a colour map (PNG, SVG, or HTML with the table)."""
    import numpy as np

    from .chart_kit import ChartTable, drawing, save, target

    file, kind = target(path)
    values = np.array([[np.nan if v is None else v for v in line] for line in h["values"]])
    with drawing() as fig:
        ax = fig.add_subplot()
        image = ax.imshow(values, origin="lower", aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(h["x_values"])), [fmt(v) for v in h["x_values"]], rotation=45)
        ax.set_yticks(range(len(h["y_values"])), [fmt(v) for v in h["y_values"]])
        ax.set_xlabel(h["x"])
        ax.set_ylabel(h["y"])
        ax.set_title(f"{h['metric']} ({h['workload']})")
        fig.colorbar(image, ax=ax, label=h["metric"])
        if values.size <= 144:                      # each cell labelled with its value (12 x 12 at most)
            middle = np.nanmean(values) if np.isfinite(values).any() else 0.0
            for (j, i), v in np.ndenumerate(values):
                if v == v:
                    ax.text(i, j, fmt(v), ha="center", va="center", fontsize=7,
                            color="black" if v > middle else "white")
        rows = tuple((fmt(y), *("-" if v != v else fmt(v) for v in line)) for y, line in zip(h["y_values"], values))
        table = ChartTable((f"{h['y']} / {h['x']}", *(fmt(x) for x in h["x_values"])), rows)
        return str(save(fig, file, kind, f"{h['metric']} over {h['x']} x {h['y']}", table))
