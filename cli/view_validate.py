"""``perfmodel validate``: each published case, the prediction and its error, and the summary per family."""

from __future__ import annotations

from . import units
from .columns import Column, column, csv_of, csv_only, table_of, texts
from .deliver import emit_csv, emit_json
from .render import (Progress, Table, console, fmt)
from .units import size


def _metric_label(metric: str) -> str:
    """A validation metric's name for people; its value carries the unit (``step_time_s`` -> ``step time``)."""
    label = metric.replace("_per_s", "/s").replace("_bytes", "").replace("tflops", "TFLOP/s")
    label = label[:-2] if label.endswith("_s") else label
    return {"mfu": "MFU", "tpot": "TPOT", "ttft": "TTFT"}.get(label, label.replace("_", " "))


def _metric_value(metric: str, value: float | None) -> str:
    """A validation metric's value in its unit: bytes, seconds, a fraction as a percentage, else the number."""
    if value is None:
        return "-"
    if "bytes" in metric:
        return size(value)
    if metric.endswith("_s") and not metric.endswith("_per_s"):
        return units.seconds(value)
    return f"{value:.1%}" if metric == "mfu" else fmt(value)


def _error_text(r: dict) -> str:
    """A case's error for people: signed percentage (with the constraint the model finds binding), or
    why it has none (skipped, or its status)."""
    if r["status"].startswith("skipped: "):
        return "skipped"
    if r["status"] != "ok":
        return r["status"]
    err = "-" if r["error"] is None else f"{r['error']:+.1%}"
    return err + (f" (model: {r['infeasible_in_model']} binds)" if r["infeasible_in_model"] else "")


def _measured(key: str) -> Column:
    """The published or predicted value: the raw number in the CSV, in the metric's unit in the table."""
    return Column(key, lambda r: _metric_value(r["metric"], r[key]), lambda r: {key: r[key]}, whole=True)


# The cases' columns: the CSV has every field of a case, the table its name (* for a calibration
# case), system, metric, published and predicted values and error.
_CASE_COLUMNS = [Column("case", lambda r: r["id"] + (" *" if r["calibration"] else ""), lambda r: {"id": r["id"]},
                        justify="left", whole=False),
                 csv_only("kind", "calibration"),
                 column("system", "system", justify="left", whole=True),
                 column("metric", "metric", _metric_label, justify="left", whole=False),
                 _measured("published"), _measured("predicted"),
                 Column("error", _error_text, lambda r: {"error": r["error"]}, whole=False),
                 csv_only("status", "source", "command", "infeasible_in_model")]


def _validation_table(rows: list[dict]) -> Table | None:
    """Cases with their system, metric, published and predicted values and error, as a table; None
    on a terminal too narrow for it (``_print_validation_list`` then prints the cases as lines)."""
    table = table_of(_CASE_COLUMNS, rows, Table(title="validation: predicted vs published (*: calibration case)",
                                                 title_justify="left"))
    return table if _fits(table) else None


def _print_validation_list(rows: list[dict]) -> None:
    """The validation cases for a narrow terminal: each case's name whole on one line, then its
    metric, published and predicted values and error (the table's texts)."""
    console.print("validation: predicted vs published", style="bold")
    for r in rows:
        cell = texts(_CASE_COLUMNS, r)
        console.print(f"{r['id']} on {r['system']}{', calibration case' if r['calibration'] else ''}", markup=False)
        console.print(f"    {cell['metric']}: published {cell['published']}, predicted {cell['predicted']}, "
                      f"{cell['error']}", markup=False, style="dim")


def _fits(table: Table) -> bool:
    """Whether ``table`` fits the terminal without wrapping any cell."""
    return console.measure(table, options=console.options.update_width(100_000)).maximum <= console.width


def document(rows: list[dict], summary: dict, fitted: dict | None) -> dict:
    """The JSON document of ``validate``: the cases (as the CSV has them), the summary per family and,
    with --calibrate, the refit."""
    return {"cases": rows, "summary": summary, **({"calibration_fit": fitted} if fitted else {})}


def validate(db, calibrate: bool, json_out: bool, csv_out: bool = False) -> None:
    from perfmodel.validation import calibrate as fit, command, load_cases, predict, summarize

    cases = load_cases()
    with Progress(len(cases), "predicting the validation cases", enabled=not json_out) as progress:
        outcomes = []
        for case in cases:
            outcomes.append(predict(case, db))
            progress.advance()
    summary = summarize(outcomes)
    rows = [{"id": o.case.id, "kind": o.case.kind, "calibration": o.case.calibration, "system": o.case.system,
             "metric": o.case.measured.metric, "published": o.case.measured.value, "predicted": o.predicted,
             "error": o.error, "status": o.status, "source": o.case.source, "command": command(o.case),
             "infeasible_in_model": o.binding or None}
            for o in outcomes]
    fitted = fit(db) if calibrate else None
    if json_out:
        emit_json(document(rows, summary, fitted))
        return
    if csv_out:
        emit_csv(csv_of(_CASE_COLUMNS, rows))
        return
    skipped: dict[str, int] = {}
    for r in rows:
        if r["status"].startswith("skipped: "):
            reason = r["status"].removeprefix("skipped: ")
            skipped[reason] = skipped.get(reason, 0) + 1
    table = _validation_table(rows)
    if table is None:
        _print_validation_list(rows)
    else:
        console.print(table)
    for group in ("calibration", "held_out", "exact"):
        s = summary[group]
        if s["cases"]:
            console.print(f"{group.replace('_', '-')}: {s['cases']} cases, mean absolute error {s['mape']:.1%}, "
                          f"worst {s['max_abs_error']:.1%}")
    for kind, s in summary["held_out_by_kind"].items():
        if s["cases"]:
            console.print(f"  held-out {kind}: {s['cases']} cases, mean absolute error {s['mape']:.1%}")
    if summary["skipped"]:
        console.print(f"skipped: {summary['skipped']} cases whose source lacks a plan detail (listed above): "
                      + "; ".join(f"{reason} ({n})" for reason, n in skipped.items()))
    if fitted:
        console.print(f"refit of framework-gemm-efficiency on {fitted['cases']} calibration cases: "
                      f"{fitted['value']:.3f} (MAPE {fitted['mape_before']:.1%} at 1.0 -> {fitted['mape_after']:.1%})")
