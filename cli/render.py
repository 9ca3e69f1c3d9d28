"""Rendering of results: rich tables on stdout for people, one sorted JSON document for scripts."""

from __future__ import annotations

from dataclasses import replace

import math
import re
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table as _RichTable

from perfmodel.hardware_db.errors import UnknownNameError
from perfmodel.hardware_db.schema import ENTRY_KINDS, PRECISIONS

from . import units
from .deliver import delivered, emit_csv, emit_json, report_files
from .units import count, fleet, joules, rate, size, watts

console = Console(highlight=False, soft_wrap=False, emoji=False)
SQUEEZED: list[str] = []   # tables printed with a word cut (Table._calculate_column_widths)


class Table(_RichTable):
    """rich's table that cuts nothing: when it is wider than the terminal, the columns of numbers
    (right-justified, or added with ``whole=True``) keep the width of their widest value and the
    names and text around them wrap; a word wider than its column folds onto the next line, so no
    cell ever ends in an ellipsis."""

    def add_column(self, *args, whole: bool | None = None, **kwargs) -> None:
        super().add_column(*args, **kwargs)
        column = self.columns[-1]
        column.whole = column.justify == "right" if whole is None else whole

    def _surely_fits(self, max_width: int) -> bool:
        """Whether the raw text of every column (markup included, so an upper bound) fits: then the
        table needs no second measurement."""
        edges = 1 + len(self.columns) * (1 + 2 * (self.padding[1] if hasattr(self, "padding") else 1))
        widest = sum(max([cell_len(str(column.header))] + [cell_len(str(c)) for c in column.cells])
                     for column in self.columns)
        return widest + edges <= max_width

    def _calculate_column_widths(self, console, options) -> list[int]:
        """rich's widths, unless they cut a word where the terminal has room for every column's
        longest word: then each column gets its longest word and the rest of the width is shared in
        proportion to what each column still wants. Tables that cannot keep their words whole on the
        terminal are named in SQUEEZED (the 80-column readability test reads it)."""
        widths = super()._calculate_column_widths(console, options)
        floors = [self._longest_word(console, column) + self._get_padding_width(column._index)
                  for column in self.columns]
        if all(w >= f for w, f in zip(widths, floors)):
            return widths
        if sum(floors) > options.max_width:
            SQUEEZED.append(str(self.title or [str(c.header) for c in self.columns]))
            return widths
        wants = [max(self._measure_column(console, options, c).maximum - f, 0) for c, f in zip(self.columns, floors)]
        spare = options.max_width - sum(floors)
        return [f + min(spare * want // max(sum(wants), 1), want) for f, want in zip(floors, wants)]

    @staticmethod
    def _longest_word(console, column) -> int:
        """The widest word of a column (of a line, in a column of numbers kept whole)."""
        lines = [line for cell in column.cells for line in console.render_str(str(cell)).plain.split("\n")]
        words = [w for text in lines for w in ([text] if getattr(column, "whole", False) else text.split())]
        return max([cell_len(w) for w in words + str(column.header).split()] or [1])

    def __rich_console__(self, console, options):
        for column in self.columns:
            column.overflow = "fold"
        if not self._surely_fits(options.max_width) and \
                self.__rich_measure__(console, options).maximum > options.max_width:
            for column in self.columns:
                if getattr(column, "whole", False) and column.width is None:
                    lines = [line for cell in column.cells for line in console.render_str(str(cell)).plain.split("\n")]
                    words = str(column.header).split() if self.show_header else []
                    column.width = max([cell_len(t) for t in lines + words] or [1])
        yield from super().__rich_console__(console, options)


def fmt(value: float | None, scale: float = 1.0, digits: int = 4) -> str:
    """A number in a table: ``-`` when absent (or not finite), else ``digits`` significant figures
    with separators. Money, energy, power, bytes and durations go through ``units`` instead."""
    if value is None or not math.isfinite(value):
        return "-"
    v = value / scale
    if v != 0 and (abs(v) >= 1e7 or abs(v) < 1e-3):
        return f"{v:.{digits - 1}e}"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:,.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"


# --- hardware --------------------------------------------------------------------------------

def _entry_summary(entry) -> str:
    kind = entry.__class__.__name__
    if kind == "Accelerator":
        return (f"{fmt(entry.peak_flops.get('bf16'), 1e12)} TFLOP/s bf16, {fmt(entry.hbm_bytes, 2 ** 30)} GiB at "
                f"{rate(entry.hbm_bytes_per_s)}, {watts(entry.tdp_w)}")
    if kind == "Cpu":
        return f"{entry.cores} cores, {rate(entry.memory_bytes_per_s)} memory, {watts(entry.tdp_w)}"
    if kind == "Memory":
        return (f"{entry.kind}, {size(entry.capacity_bytes)}, {rate(entry.read_bytes_per_s)} read, "
                f"{units.seconds(entry.latency_s)}")
    if kind == "Link":
        return f"{entry.kind}, {rate(entry.bytes_per_s)} per direction, {units.seconds(entry.latency_s)}"
    if kind == "Calibration":
        fractions = ", ".join(f"{p} {v:.2f}" for p, v in entry.matmul_fraction.items())
        return f"{entry.device or 'all others'}: matmul {fractions or '-'}; hbm {fmt(entry.hbm_fraction)}"
    if kind == "Constant":
        if entry.unit.startswith("USD "):
            return f"{units.usd(entry.value)} {entry.unit[4:]}"
        return f"{fmt(entry.value)} {entry.unit}"
    return (f"{entry.nodes} x {entry.devices_per_node} {entry.accelerator}, "
            f"tiers {' > '.join(t.name for t in entry.tiers)}")


# What a planner picks from: the kinds ``hardware list`` prints without --kind.
PLANNED_KINDS = ("accelerators", "systems")


def hardware_list(db, kind: str | None, json_out: bool, csv_out: bool = False) -> None:
    kinds = list(ENTRY_KINDS)
    if kind is not None and kind not in kinds + ["all"]:
        raise UnknownNameError("kind", kind, kinds + ["all"])
    machine_readable = json_out or csv_out
    kinds = [kind] if kind not in (None, "all") else kinds if kind == "all" or machine_readable else list(PLANNED_KINDS)
    if json_out:
        emit_json({k: sorted(getattr(db, k)) for k in kinds})
        return
    if csv_out:
        emit_csv([{"kind": k, "name": name, "display_name": getattr(db, k)[name].display_name,
                   "summary": _entry_summary(getattr(db, k)[name])} for k in kinds for name in sorted(getattr(db, k))])
        return
    for k in kinds:
        table = Table(title=k, title_justify="left")
        table.add_column("name", style="bold", whole=True)
        table.add_column("display name")
        table.add_column("summary")
        for name in sorted(getattr(db, k)):
            e = getattr(db, k)[name]
            table.add_row(name, e.display_name, _entry_summary(e))
        console.print(table)
    if kind is None:
        rest = ", ".join(f"{len(getattr(db, k)):,} {k}" for k in ENTRY_KINDS if k not in PLANNED_KINDS)
        console.print(f"also in the database: {rest}; --kind KIND (or all) lists them", markup=False, style="dim")


def _entry_json(db, entry, nodes) -> dict[str, Any]:
    data = entry.model_dump(mode="json", by_alias=False)
    if entry.__class__.__name__ == "Memory":
        data["kind"] = f"memory/{entry.kind}"
    if entry.__class__.__name__ == "Link":
        data["bytes_per_s"] = entry.bytes_per_s
    if entry.__class__.__name__ == "System":
        system = entry.scaled(nodes) if nodes else entry
        data["nodes"] = system.nodes
        data["devices"] = system.devices
        data["levels"] = [vars(level) for level in db.levels(system)]
        data["memory_per_device"] = [vars(t) for t in db.memory_tiers(system)]
        from perfmodel.comparison import device_hour_prices

        data.update(device_hour_prices(db, system.name))
    return data


def hardware_show(db, name: str, nodes: int | None, json_out: bool) -> None:
    entry = db.entry(name)
    if nodes is not None and entry.__class__.__name__ != "System":
        from perfmodel.hardware_db.errors import SpecError

        raise SpecError(f"--nodes applies to systems; '{entry.name}' is not one")
    if nodes is not None:
        entry.scaled(nodes)  # validates the count
    data = _entry_json(db, entry, nodes)
    if json_out:
        emit_json(data)
        return
    table = Table(title=f"{entry.display_name} ({entry.name})", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in data.items():
        if key in ("sources", "levels", "memory_per_device", "tiers", "memory_tiers", "hosts", "display_name"):
            continue
        if key == "peak_flops":
            for p in PRECISIONS:
                if p in value:
                    table.add_row(f"{p} dense peak", f"{fmt(value[p], 1e12)} TFLOP/s")
            continue
        # HBM capacity is binary (hardware_db.schema): the datasheet's "80 GB" is 80 GiB.
        text = f"{fmt(value, 2 ** 30)} GiB ({_pretty_si(key, value)})" if key == "hbm_bytes" else _pretty_si(key, value)
        table.add_row(key, text)
    console.print(table)
    if "levels" in data:
        levels = Table(title="topology levels (per device, one direction)", title_justify="left")
        for col in ("level", "link", "group size", "bandwidth", "latency"):
            levels.add_column(col, justify="left" if col in ("level", "link") else "right")
        for lv in data["levels"]:
            levels.add_row(lv["name"], lv["link"], f"{lv['group_size']:,}", rate(lv["bytes_per_s"]),
                           units.seconds(lv["latency_s"]))
        console.print(levels)
        if data["memory_per_device"]:
            mem = Table(title="memory below HBM (one device's share)", title_justify="left")
            for col in ("tier", "kind", "size", "read", "write", "latency"):
                mem.add_column(col, justify="left" if col in ("tier", "kind") else "right")
            for t in data["memory_per_device"]:
                mem.add_row(t["name"], t["kind"], size(t["bytes_per_device"]), rate(t["read_bytes_per_s"]),
                            rate(t["write_bytes_per_s"]), units.seconds(t["latency_s"]))
            console.print(mem)
    console.print("sources:")
    for s in data["sources"]:
        console.print(f"  - {s}", markup=False)


_SI_SUFFIX = (("_bytes_per_s", rate), ("_bytes", size), ("latency_s", units.seconds), ("_w", watts),
              ("_usd", units.usd), ("_usd_per_hour", lambda v: f"{units.usd(v)} per hour"),
              ("_usd_per_device_hour", lambda v: f"{units.usd(v)} per device-hour"))


def _pretty_si(key: str, value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for suffix, human in _SI_SUFFIX:
            if key.endswith(suffix):
                return human(value)
        return fmt(value)
    return "-" if value is None else str(value)


# --- models ----------------------------------------------------------------------------------

def models_list(json_out: bool) -> None:
    from perfmodel.catalog import builtin_models

    models = builtin_models()
    rows = [{"name": m.name, "display_name": m.display_name, "family": m.family, "attention": m.attention_kind,
             "moe": m.is_moe, "total_params": m.total_params, "active_params": m.active_params}
            for m in models.values()]
    if json_out:
        emit_json(rows)
        return
    table = Table(title="built-in models", title_justify="left")
    for col in ("name", "display name", "attention", "MoE", "params", "active"):
        table.add_column(col, justify="right" if col in ("params", "active") else "left", whole=col == "name")
    for r in rows:
        table.add_row(r["name"], r["display_name"], r["attention"], "yes" if r["moe"] else "no",
                      count(r["total_params"]), count(r["active_params"]))
    console.print(table)


def _derived(key: str, value) -> str:
    """A derived quantity of a model in its unit: bytes, FLOPs, parameter counts, relative errors."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if key.endswith("_error"):
        return f"{value:+.2%}"
    for part, human in (("bytes", size), ("flops", units.flop), ("params", count), ("seq_len", count)):
        if part in key:
            return human(value)
    return fmt(value)


def models_show(ref: str, seq_len: int, json_out: bool) -> None:
    from perfmodel.catalog import load_model
    from perfmodel.model import model_summary

    summary = model_summary(load_model(ref), seq_len)
    if json_out:
        emit_json(summary)
        return
    table = Table(title=f"{summary['display_name']} ({summary['name']})", title_justify="left", show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value")
    for key, value in summary["derived"].items():
        if isinstance(value, dict):
            for sub, v in value.items():
                table.add_row(f"{key} {sub}", _derived(key, v))
        else:
            table.add_row(key, _derived(key, value))
    console.print(table)
    spec = Table(title="spec", title_justify="left", show_header=False)
    spec.add_column("field", style="bold")
    spec.add_column("value")
    for key, value in summary["spec"].items():
        if key not in ("sources", "published", "display_name", "name", "aliases") and value not in (None, False, ()):
            spec.add_row(key, str(value))
    console.print(spec)


# --- compare ---------------------------------------------------------------------------------

def compare(db, names: list[str], output) -> None:
    from perfmodel.comparison import best_index, compare as profiles, metrics

    rows = profiles(names, db)
    doc = {"entries": rows, "metrics": [vars(m) for m in metrics()]}
    if delivered(doc, output, lambda: rows, {"compare": lambda: doc}, "compare"):
        return
    lines = []
    for m in metrics():
        values = [r[m.key] for r in rows]
        if all(v is None for v in values):
            continue
        if any(isinstance(v, str) for v in values):      # a description, not a figure
            lines.append((m.label, m.unit, [str(v) for v in values]))
            continue
        best = best_index(values, m.higher_is_better)
        cells = [units.usd(v) if m.unit == "USD" else fmt(v, m.scale) for v in values]
        if best is not None:
            cells[best] = f"[bold green]{cells[best]}[/]"
        lines.append((m.label, "" if m.unit == "USD" else m.unit, cells))
    # Entries side by side, as many as fit the terminal beside the metric's name (wrapped to 18
    # cells) and unit; the rest in further tables with the same rows.
    unit_width = max(cell_len(unit) for _, unit, _ in lines)
    widths = [max([cell_len(str(r["name"]))] + [cell_len(console.render_str(c[i]).plain) for _, _, c in lines])
              for i, r in enumerate(rows)]
    groups, group, used = [], [], 1 + 21 + unit_width + 3
    for i, w in enumerate(widths):
        if group and used + w + 3 > console.width:
            groups.append(group)
            group, used = [], 1 + 21 + unit_width + 3
        group.append(i)
        used += w + 3
    groups.append(group)
    for k, group in enumerate(groups):
        title = "hardware comparison (dense peaks; best of each row in bold green)" if k == 0 else \
            "hardware comparison, continued"
        table = Table(title=title, title_justify="left")
        table.add_column("metric", style="bold")
        table.add_column("unit")
        for i in group:   # figures are single words; descriptions wrap
            table.add_column(str(rows[i]["name"]), justify="right", whole=False)
        for label, unit, cells in lines:
            table.add_row(label, unit, *(cells[i] for i in group))
        console.print(table)
    report_files(doc)


# --- estimate --------------------------------------------------------------------------------

_seconds = units.seconds


def _usd(x: float | None) -> str:
    return "no price" if x is None else units.usd(x)


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right", whole=False)
    for k, v in rows:
        table.add_row(k, v)
    return table


def _times_table(title: str, components: dict, total: float | None, links: dict | None = None) -> Table:
    """Time on the critical path by component, its share, and (with ``links``) each transfer's time
    on its link before overlap, as Calculon prints them side by side."""
    table = Table(title=title, title_justify="left")
    columns = [("component", "left"), ("exposed" if links else "time", "right"), ("share", "right")]
    for col, justify in columns + ([("on its link", "right")] if links else []):
        table.add_column(col, justify=justify)
    for name, value in components.items():
        link = (links or {}).get(name)
        if value or link:
            row = [name, _seconds(value or 0.0), f"{(value or 0.0) / total:.1%}" if total else "-"]
            table.add_row(*row, *([_seconds(link) if link else "-"] if links else []))
    return table


def _ops_table(title: str, ops: dict) -> Table:
    table = Table(title=title, title_justify="left")
    for col, justify in (("operator", "left"), ("time", "right"), ("bound", "left")):
        table.add_column(col, justify=justify)
    for name, v in ops.items():
        table.add_row(name, _seconds(v["seconds"]), v["bound"])
    return table


def _memory_table(memory: dict, tiers: dict) -> list[Table]:
    parts = Table(title="memory per device", title_justify="left")
    parts.add_column("part")
    parts.add_column("size", justify="right")
    for k, v in memory.items():
        parts.add_row(k, size(v))
    tier_table = Table(title="memory tiers per device", title_justify="left")
    for col in ("tier", "used", "capacity", "use"):
        tier_table.add_column(col, justify="left" if col == "tier" else "right")
    for name, t in tiers.items():
        cap = t["capacity_bytes"]
        tier_table.add_row(name, size(t["used_bytes"]), size(cap),
                           f"{t['used_bytes'] / cap:.0%}" if cap else "-")
    return [parts, tier_table]


def _fleet(devices: int, system, accelerator, db=None) -> str:
    """``units.fleet`` with the database's entry of ``system`` (a Machine holds the entry resized
    to its devices); without ``db``, the count reads as nodes of the system, right for any entry."""
    if db is None:
        return fleet(devices, system, accelerator, named_node=False)
    return fleet(devices, db.system(system.name), accelerator)


def _kwh_joules(kwh: float | None) -> float | None:
    """Joules of an energy the report gives in kWh (its JSON field's unit)."""
    return None if kwh is None else kwh * 3.6e6


def _header(spec, machine, db=None) -> str:
    return (f"{spec.display_name or spec.name} on {_fleet(machine.devices, machine.system, machine.accelerator, db)}"
            f", {machine.accelerator.name}")


def train_doc(spec, machine, plan, work, report) -> dict:
    """The JSON document of one training estimate (``estimate train --json``; charts read it)."""
    return {"model": spec.name, "system": machine.system.name, "devices": machine.devices,
            "plan": {k: (v.item() if hasattr(v, "item") else v) for k, v in vars(plan).items()},
            "workload": vars(work), "result": report}


def _components_csv(report) -> list[dict]:
    return [{"component": k, "seconds": v} for k, v in report["time_components_s"].items()]


def estimate_train(spec, machine, plan, work, output=None, model_ref: str | None = None, db=None) -> None:
    from perfmodel.report import check_feasible, interleave_hint, train_report
    from perfmodel.training import estimate_training

    from .options import EstimateOutput

    output = output or EstimateOutput()
    result = estimate_training(spec, machine, plan, work)
    check_feasible(result, machine)
    report = train_report(result, machine, spec)
    hint = interleave_hint(spec, machine, plan, work, result)
    if hint:
        report["hint"] = hint
    doc = train_doc(spec, machine, plan, work, report)
    from perfmodel.report import host_placements

    placements = host_placements(spec, machine, plan, work)
    if placements:
        doc["host_placements_step_s"] = placements
    export = _train_export(spec, machine, plan, work, model_ref or spec.name)
    if delivered(doc, output, lambda: _components_csv(report), dict.fromkeys(("breakdown", "roofline", "memory"),
                 lambda: doc), "breakdown", export):
        return
    _estimate_train_tables(spec, machine, plan, work, report, db)
    if placements:
        names = {"ddr": "all in DDR", "cxl": "all in CXL (naive)", "ddr+cxl": "DDR + CXL by bandwidth (CXL-aware)"}
        console.print("the host-memory states placed each way: " + "; ".join(
            f"{names[k]} {_seconds(v) if v != float('inf') else 'does not fit'}" for k, v in placements.items()),
            markup=False)
    report_files(doc)


def _train_export(spec, machine, plan, work, model_ref: str):
    def files(framework: str) -> dict[str, str]:
        from perfmodel.exports import training_files

        return training_files(framework, spec, machine, plan, work, model_ref)
    return files


def _estimate_train_tables(spec, machine, plan, work, report, db=None) -> None:
    console.print(_header(spec, machine, db), style="bold")
    console.print(f"plan: tp {plan.tp}, pp {plan.pp} (interleave {plan.interleave}"
                  f"{', embedding and loss as layers' if plan.ends_as_layers else ''}"
                  f"{', DualPipe' if str(plan.schedule) == 'dualpipe' else ''}), dp {plan.dp}, cp {plan.cp}"
                  f"{f' ({plan.cp_comm})' if plan.cp > 1 and str(plan.cp_comm) != 'p2p' else ''}, "
                  f"ep {plan.ep}, micro-batch {plan.micro_batch}, zero {plan.zero}{_sharding_text(vars(plan))}, "
                  f"recompute {plan.recompute}, sp {'on' if plan.sp else 'off'}"
                  f"{', TP overlap' if plan.tp_overlap and plan.sp else ''}"
                  f"{', EP exchange overlapped' if plan.ep_overlap and plan.ep > 1 else ''}, {plan.precision}"
                  f"{', DeepSeek low-precision storage' if str(plan.storage) == 'deepseek' else ''}",
                  markup=False)
    run = report["run"]
    low, high = report["step_time_range_s"]
    rows = [("step time", f"{_seconds(report['step_time_s'])} (range {_span(low, high)})"),
            ("constants", _constants(report)),
            ("tokens/s", fmt(report["tokens_per_s"])),
            ("MFU", f"{report['mfu']:.1%}"), ("HFU", f"{report['hfu']:.1%}"),
            ("microbatches per step", fmt(report["microbatches"])),
            ("power per device (with node share)", watts(report["power_per_device_w"])),
            ("energy per token (with PUE)", joules(report["energy_per_token_j"])),
            ("cost per hour", _usd(report["cost_per_hour_usd"])),
            ("cost per million tokens", _usd(report["cost_per_million_tokens_usd"]))]
    if work.tokens:
        rows += [("run time", _seconds(run["time_s"])), ("run energy", units.energy(_kwh_joules(run["energy_kwh"]))),
                 ("run cost", _usd(run["cost_usd"]))]
    console.print(_kv_table("summary", rows))
    _print_remarks([report["constants_from"].get("caveat"), report.get("hint")])
    console.print(_times_table("step time by component", report["time_components_s"], report["step_time_s"],
                               report["time_on_link_s"]))
    console.print(_ops_table("operators (all microbatches, forward + backward, one stage)", report["operators_s"]))
    for t in _memory_table(report["memory_per_device_bytes"], report["memory_tiers"]):
        console.print(t)
    console.print(f"cost basis: {report['cost_basis']}", markup=False)


def estimate_serve(spec, machine, plan, work, output=None, model_ref: str | None = None, db=None) -> None:
    from perfmodel.report import check_feasible, serve_report
    from perfmodel.serving import estimate_serving

    from .options import EstimateOutput

    output = output or EstimateOutput()
    result = estimate_serving(spec, machine, plan, work)
    check_feasible(result, machine)
    report = serve_report(result, machine, spec)
    doc = {"model": spec.name, "system": machine.system.name, "devices": machine.devices,
           "plan": vars(plan), "workload": vars(work), "result": report}

    def export(framework: str) -> dict[str, str]:
        from perfmodel.exports import instance_pool, serving_files

        return serving_files(framework, spec, [instance_pool(machine, plan, work)], model_ref or spec.name)
    rows = lambda: [{"phase": phase, "component": k, "seconds": v}  # noqa: E731
                    for phase in ("prefill", "decode") for k, v in report[f"{phase}_components_s"].items()]
    if delivered(doc, output, rows, dict.fromkeys(("breakdown", "roofline", "memory"), lambda: doc), "breakdown",
                 export):
        return
    _estimate_serve_tables(spec, machine, plan, work, report, db)
    report_files(doc)


def _estimate_serve_tables(spec, machine, plan, work, report, db=None) -> None:
    console.print(_header(spec, machine, db), style="bold")
    console.print(f"instance: tp {plan.tp}, pp {plan.pp}, ep {plan.ep}, dp-attention {plan.dp_attention}, "
                  f"batch {plan.batch}; weights {plan.weight_precision}, activations {plan.activation_precision}, "
                  f"kv {plan.kv_precision}", markup=False)
    (tl, th), (pl, ph) = report["ttft_range_s"], report["tpot_range_s"]
    rows = [("time to first token", f"{_seconds(report['ttft_s'])} (range {_span(tl, th)})"),
            ("time per output token", f"{_seconds(report['tpot_s'])} (range {_span(pl, ph)})"),
            ("constants", _constants(report)),
            ("devices per instance", fmt(report["devices_per_instance"])),
            ("largest batch the KV cache allows", fmt(report["max_batch"])),
            ("prefill tokens/s per device", fmt(report["prefill_tokens_per_s_per_device"])),
            ("decode tokens/s per device", fmt(report["decode_tokens_per_s_per_device"])),
            *([(f"prefill / decode tokens/s per package ({report['dies_per_package']} dies)",
                f"{fmt(report['prefill_tokens_per_s_per_package'])} / {fmt(report['decode_tokens_per_s_per_package'])}")]
              if "dies_per_package" in report else []),
            ("power per device, prefill / decode (with node share)",
             f"{watts(report['prefill_power_per_device_w'])} / {watts(report['power_per_device_w'])}"),
            ("energy per output token (with PUE)", joules(report["energy_per_token_j"])),
            ("cost per million output tokens", _usd(report["cost_per_million_tokens_usd"]))]
    if plan.power_cap_w is not None:
        from perfmodel.report import oversubscription

        clock = report["clock_share"]
        rows.insert(-3, (f"power cap {watts(plan.power_cap_w)} per {machine.accelerator.name}",
                         f"clock {clock['prefill']:.0%} in prefill, {clock['decode']:.0%} in decode; a facility "
                         f"provisioned at the cap holds {oversubscription(machine, plan.power_cap_w):.2f}x the "
                         "devices provisioned at TDP"))
    if spec.moe and "expert_imbalance" in report:
        skew = report["expert_imbalance"]
        how = ("given by --moe-imbalance or --routing" if float(plan.moe_imbalance) > 0 else
               {"eplb": "EPLB over the default power-law routing", "none": "power-law routing, contiguous experts",
                "balanced": "assumed balanced"}[str(plan.expert_balance)])
        rows.insert(2, ("expert load, busiest / mean EP device",
                        ", ".join(f"{v:.2f} {k}" for k, v in skew.items()) + f" ({how})"))
    if spec.moe:
        rows.insert(2, ("EP all-to-all per output token", f"{_seconds(report['ep_per_token_s'])} ("
                        + ("exposed: all of it" if not plan.overlap_comm else "exposed under two-batch overlap; "
                           "--overlap none gives all of it") + ")"))
    console.print(_kv_table("summary", rows))
    _print_remarks([report["constants_from"].get("caveat")])
    console.print(_times_table("prefill (time to first token)", report["prefill_components_s"], report["ttft_s"]))
    # A decode step emits 1 + accepted draft tokens per sequence, so shares are of the step, not of TPOT.
    console.print(_times_table("decode step", report["decode_components_s"],
                               sum(v for v in report["decode_components_s"].values() if v)))
    console.print(_ops_table("operators", report["operators_s"]))
    for t in _memory_table(report["memory_per_device_bytes"], report["memory_tiers"]):
        console.print(t)
    console.print(f"cost basis: {report['cost_basis']}", markup=False)


# --- validate --------------------------------------------------------------------------------

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


def _validation_table(cells: list[tuple[str, ...]]) -> Table | None:
    """Cases with their system, metric, published and predicted values and error, as a table; None
    on a terminal too narrow for it (``_print_validation_list`` then prints the cases as lines)."""
    table = Table(title="validation: predicted vs published (*: calibration case)", title_justify="left")
    for col, justify in (("case", "left"), ("system", "left"), ("metric", "left"), ("published", "right"),
                         ("predicted", "right"), ("error", "right")):
        table.add_column(col, justify=justify, whole=col in ("system", "published", "predicted"))
    for name, calibration, system, *rest in cells:
        table.add_row(name + (" *" if calibration else ""), system, *rest)
    return table if _fits(table) else None


def _print_validation_list(cells: list[tuple[str, ...]]) -> None:
    """The validation cases for a narrow terminal: each case's name whole on one line, then its
    metric, published and predicted values and error."""
    console.print("validation: predicted vs published", style="bold")
    for name, calibration, system, metric, published, predicted, error in cells:
        console.print(f"{name} on {system}{', calibration case' if calibration else ''}", markup=False)
        console.print(f"    {metric}: published {published}, predicted {predicted}, {error}", markup=False,
                      style="dim")


def _fits(table: Table) -> bool:
    """Whether ``table`` fits the terminal without wrapping any cell."""
    return console.measure(table, options=console.options.update_width(100_000)).maximum <= console.width


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
        emit_json({"cases": rows, "summary": summary, **({"calibration_fit": fitted} if fitted else {})})
        return
    if csv_out:
        emit_csv(rows)
        return
    skipped: dict[str, int] = {}
    cells = []
    for r in rows:
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        if r["infeasible_in_model"]:
            err += f" (model: {r['infeasible_in_model']} binds)"
        if r["status"].startswith("skipped: "):
            reason = r["status"].removeprefix("skipped: ")
            skipped[reason] = skipped.get(reason, 0) + 1
            err = "skipped"
        elif r["status"] != "ok":
            err = r["status"]
        cells.append((r["id"], r["calibration"], r["system"], _metric_label(r["metric"]), _metric_value(r["metric"], r["published"]),
                      _metric_value(r["metric"], r["predicted"]), err))
    table = _validation_table(cells)
    if table is None:
        _print_validation_list(cells)
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


# --- plan ------------------------------------------------------------------------------------

class Progress:
    """A transient progress bar on stderr for a step that may take a while, shared by the commands.

    ``progress = Progress(total, what, enabled=not json_out)``; then ``progress(done)`` (or
    ``progress(done, total)`` when the total is learnt on the way, as the searches report it) or
    ``progress.advance()``; ``progress.close()`` at the end, or use it as a context manager. The bar
    appears only once the step has run for ``delay`` seconds and is silent when not ``enabled``
    (``--json`` / ``--csv``: the output is for a script) or when stderr is not a terminal.
    """

    def __init__(self, total: int | None, what: str, enabled: bool = True, delay: float = 1.0,
                 stderr: Console | None = None):
        import time

        self.stderr = stderr or Console(stderr=True)
        self.total, self.what, self.done, self.delay = total, what, 0, delay
        self.enabled = enabled and self.stderr.is_terminal
        self.started = time.perf_counter()
        self.bar = None

    def __call__(self, done: int, total: int | None = None) -> None:
        import time

        self.done = done
        if total is not None:
            self.total = total
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.started < self.delay or (self.total is not None and done >= self.total):
                return
            from rich.progress import Progress as Bar

            self.bar = Bar(console=self.stderr, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total, completed=done)
        else:
            self.bar.update(self.task, completed=done, total=self.total)

    def advance(self, steps: int = 1) -> None:
        self(self.done + steps)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sharding_text(q: dict) -> str:
    """The sharding beyond flat ZeRO in a few tokens (empty when flat): ``hsdp8`` (every sharded state
    over 8 ranks, replicated across), ``w2/g8/o384`` (weights, gradients, optimizer states each over
    its own group), ``hpz8``, ``qwz``, ``qgz``."""
    from perfmodel.sharding import Sharding

    zero, replicas = int(q["zero"]), int(q["dp"]) * int(q.get("cp") or 1)
    s = Sharding.of(zero, replicas, *(q.get(k) or 0 for k in ("shard", "shard_grads", "shard_weights", "hpz")),
                    bool(q.get("qwz")), bool(q.get("qgz")))
    groups = [(name, int(size)) for name, size, on in (("w", s.weights, zero >= 3), ("g", s.grads, zero >= 2),
                                                        ("o", s.optimizer, zero >= 1)) if on]
    parts = []
    if any(size != replicas for _, size in groups):
        sizes = {size for _, size in groups}
        parts.append(f"hsdp{sizes.pop()}" if len(sizes) == 1 else "/".join(f"{n}{size}" for n, size in groups))
    if int(s.secondary) < int(s.weights):
        parts.append(f"hpz{int(s.secondary)}")
    parts += [key for key in ("qwz", "qgz") if q.get(key)]
    return "".join(" " + p for p in parts)


def _plan_text(q: dict) -> str:
    """A plan in one line: tp, pp x interleave, dp, cp, ep, micro-batch, zero and its sharding, recompute, sp,
    precision, offload."""
    expert_tp = f" etp{q['etp']}" if q.get("etp") else ""
    ends = "+ends" if q.get("ends_as_layers") else ""
    sp = ("sp+overlap " if q.get("tp_overlap") else "sp ") if q["sp"] else ""
    expert_tp += "+overlap" if q.get("ep_overlap") else ""
    cp = f"cp{q['cp']}" + (f" {q['cp_comm']}" if q.get("cp_comm", "p2p") != "p2p" else "")
    text = (f"tp{q['tp']} pp{q['pp']}x{q['interleave']}{ends} dp{q['dp']} {cp} ep{q['ep']}{expert_tp} "
            f"mb{q['micro_batch']} zero{q['zero']}{_sharding_text(q)} {q['recompute']} {sp}{q['precision']}")
    places = [f"{name}:{q[key]}" for key, name in (("optimizer_place", "opt"), ("grad_place", "grad"),
                                                    ("param_place", "param")) if q[key] != "hbm"]
    return text + (" offload " + ", ".join(places) if places else "")


def _span(low: float | None, high: float | None) -> str:
    """A range of durations, the unit said once when both ends share it: ``49.2-64.8 s``."""
    a, b = _seconds(low), _seconds(high)
    number, _, unit = a.rpartition(" ")
    return f"{number}-{b}" if unit and b.endswith(" " + unit) else f"{a} to {b}"


def _fleet_named(db, system: str, devices: int) -> str:
    """``units.fleet`` of ``devices`` of the database's system ``system``."""
    entry = db.system(system)
    return fleet(devices, entry, db.accelerator(entry.accelerator))


def _plans_table(title: str, plans: list[dict], cost_label: str, db=None) -> Table:
    """Listed plans: where, plan, step with its range, MFU, the run's cost and time (or the cost per
    million tokens without --tokens), energy per token."""
    table = Table(title=title, title_justify="left")
    for col in ("#", "where", "plan", "step", "MFU", cost_label, "energy"):
        table.add_column(col, justify="left" if col in ("where", "plan") else "right")
    for i, p in enumerate(plans, start=1):
        cost = _usd(p["run_cost_usd"]) + "\n" + _days(p["run_time_s"]) if p["run_cost_usd"] else \
            _usd(p["cost_per_million_tokens_usd"])
        where = _two_lines(_fleet_named(db, p["system"], p["devices"])) if db else f"{p['devices']:,} x {p['system']}"
        table.add_row(str(i), where, _plan_text(p["plan"]),
                      f"{_seconds(p['step_time_s'])}\n{_span(p['step_time_low_s'], p['step_time_high_s'])}",
                      f"{p['mfu']:.1%}", cost, joules(p["energy_per_token_j"]))
    return table


def _evidence_json(evidence, timing: bool) -> dict:
    data = dict(vars(evidence))
    data["rules"] = list(data["rules"])
    if not timing:
        data.pop("seconds")  # keeps --json byte-reproducible; --timing adds it
    return data


def _train_command(model_ref: str, row: dict, work, options) -> str:
    """The ``perfmodel estimate train`` command that reproduces a searched plan's numbers."""
    from perfmodel.requests import TrainRequest, command

    request = TrainRequest.of_plan(model_ref, row["system"], row["devices"], row["plan"], work)
    return command(replace(request, pricing=options.pricing, price=_price_flags(options)))


def _serve_command(model_ref: str, pool, demand, options) -> str:
    """The ``perfmodel estimate serve`` command that prints a pool's unloaded numbers: a prefill
    pool's prefill of one p90 prompt per attention rank; a decode or colocated pool's decode step
    at full batch and the p90 context (input p90 + output p90, as --output-len 2 x output p90)."""
    from perfmodel.requests import ServeRequest, command

    c = pool.config
    prefill = pool.role == "prefill"
    request = ServeRequest(
        model=model_ref, system=pool.system, devices=pool.devices_per_instance, tp=c["tp"], pp=c["pp"], ep=c["ep"],
        dp_attention=c["dp_attention"], batch=c["dp_attention"] if prefill else c["batch"],
        input_len=int(round(demand.input_len.p90)), output_len=1 if prefill else int(round(2 * demand.output_len.p90)),
        cached_len=int(round(demand.cached_share * demand.input_len.p90)) if pool.role != "decode" else 0,
        weight_precision=c["weight_precision"], activation_precision=c["activation_precision"],
        kv_precision=c["kv_precision"], kv_place="hbm" if prefill else c["kv_place"],
        weight_place=c.get("weight_place", "hbm"), mtp_draft_tokens=options.mtp_draft_tokens,
        mtp_acceptance=options.mtp_acceptance, pricing=options.pricing,
        price=_price_flags(options), expert_balance=options.expert_balance)
    return command(request)


def _price_flags(options) -> tuple[str, ...]:
    """The search's --price flags, as SYSTEM=USD strings."""
    return tuple(f"{k}={v:g}" for k, v in sorted((options.prices or {}).items()))


def _cost_bases(machines) -> dict[str, str]:
    """One cost-basis line per system (machines of one system at several sizes give one line)."""
    from perfmodel.power import cost_basis

    return {m.system.name: cost_basis(m) for m in machines}


def _plan_row_csv(rows: list[dict]) -> list[dict]:
    return [{"rank": i, "system": r["system"], "devices": r["devices"], **r["plan"],
             **{k: r.get(k) for k in ("step_time_s", "step_time_low_s", "step_time_high_s", "mfu", "run_cost_usd",
                                      "cost_per_million_tokens_usd", "energy_per_token_j")},
             "reproduce": r.get("reproduce")} for i, r in enumerate(rows, start=1)]


def _train_baseline(name: str, found, best: dict) -> dict:
    """The named heuristic's best plan and what the optimum gains over it (time, cost, energy ratios)."""
    from perfmodel.search.baselines import TRAIN_BASELINES

    out = {"name": name, "description": TRAIN_BASELINES[name], "status": found.evidence.status}
    if found.best is None:
        return {**out, "best": None, "reason": "no plan of the heuristic fits or is valid on "
                f"{best['devices']:,} x {best['system']}"}
    b = found.best
    ratio = lambda key: (b[key] / best[key]) if b.get(key) and best.get(key) else None  # noqa: E731
    return {**out, "best": b, "speedup": ratio("step_time_s"), "cost_ratio": ratio("run_cost_usd"),
            "energy_ratio": ratio("energy_per_token_j")}


def _serve_baseline(name: str, found, best) -> dict:
    from perfmodel.search.baselines import SERVE_BASELINES

    out = {"name": name, "description": SERVE_BASELINES[name], "status": found.evidence.status}
    if found.best is None:
        return {**out, "best": None, "reason": found.closest}
    b = found.best
    ratio = lambda x, y: x / y if x and y else None  # noqa: E731
    return {**out, "best": _deployment_json(b), "devices_ratio": ratio(b.devices, best.devices),
            "latency_ratio": ratio(b.latency_s, best.latency_s),
            "cost_ratio": ratio(b.usd_per_hour, best.usd_per_hour),
            "energy_ratio": ratio(b.joules_per_token, best.joules_per_token)}


def _times(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _print_remarks(remarks) -> None:
    """Each distinct remark, once, in yellow: what a device's constants rest on
    (perfmodel.report.unmeasured_caveat) or a change to the plan worth trying (interleave_hint)."""
    for remark in dict.fromkeys(r for r in remarks if r):
        console.print(remark, markup=False, style="yellow")


def _print_runs_on(runs_on: dict[str, str | None]) -> None:
    """Which frameworks run the plan as written, or, when none does, what stops each."""
    yes = [name for name, why in runs_on.items() if why is None]
    if yes:
        console.print(f"runs as written on: {', '.join(yes)} (--export FRAMEWORK writes its launch files)",
                      markup=False)
        return
    console.print("no framework perfmodel exports runs this plan as written; --framework FRAMEWORK finds the best "
                  "one it runs:", markup=False, style="yellow")
    for name, why in runs_on.items():
        # Each framework's pointer to another ("use --export X") leads nowhere here: none runs it.
        console.print(f"  {name}: {re.sub(r'; use --export [^;]*?(, or |$)', '; ', why).rstrip('; ')}", markup=False)


def _print_power_cap(p: dict) -> None:
    """What a per-device power cap costs and gains: the devices the demand needs capped and uncapped,
    the uncapped optimum's tail latencies once capped, and how many more devices (and how much more
    demand) a facility's budget holds when each device is provisioned at the cap."""
    console.print(f"power cap {watts(p['cap_w'])} per accelerator", markup=False, style="bold")
    if p["devices_uncapped"] is not None:
        console.print(f"  the demand needs {p['devices_capped']:,} devices capped, {p['devices_uncapped']:,} uncapped",
                      markup=False)
    laid = p.get("uncapped_optimum_under_cap")
    if laid is not None:
        capped, free = laid["capped"], laid["uncapped"]
        ttft = ("unbounded (its prefill queue is unstable: requests arrive faster than the capped servers "
                "prefill them)" if capped.get("queue_unstable") else
                f"{_ms(capped['ttft_p99_s'])} against {_ms(free['ttft_p99_s'])} ({_times(laid['ttft_p99_slowdown'])})")
        console.print(f"  the uncapped optimum, capped: TTFT p99 {ttft}, TPOT p90 "
                      f"{_ms(capped['tpot_p90_s'])} against {_ms(free['tpot_p90_s'])} "
                      f"({_times(laid['tpot_p90_slowdown'])})", markup=False)
    for name, ratio in p["devices_per_budget_vs_tdp"].items():
        console.print(f"  a facility provisioned at the cap holds {ratio:.2f}x the {name} devices it holds at TDP "
                      "(each with its node share)", markup=False)
    if p["demand_per_budget_vs_tdp"] is not None:
        console.print(f"  and carries {p['demand_per_budget_vs_tdp']:.2f}x the demand (at these targets)",
                      markup=False)


def _print_baseline(b: dict) -> None:
    console.print(f"baseline {b['name']}: {b['description']}", markup=False, style="bold")
    if b["best"] is None:
        console.print(f"  the heuristic has no feasible plan: {b['reason']}", markup=False)
        return
    if "speedup" in b:
        console.print(f"  its best plan: {_plan_text(b['best']['plan'])}, step {_seconds(b['best']['step_time_s'])}; "
                      f"it takes {_times(b['speedup'])} the optimum's step time, {_times(b['cost_ratio'])} its cost and "
                      f"{_times(b['energy_ratio'])} its energy per token", markup=False)
    elif b.get("objective") == "latency":
        console.print(f"  its fastest deployment: {b['best']['devices']:,} devices, latency "
                      f"{_ms(b['best']['latency_s'])}; the optimum is {_times(b['latency_ratio'])} faster and uses "
                      f"{_times(1 / b['energy_ratio'] if b['energy_ratio'] else None)} its energy per token",
                      markup=False)
    else:
        console.print(f"  its best deployment: {b['best']['devices']:,} devices, {_usd(b['best']['usd_per_hour'])} "
                      f"per hour; it needs {_times(b['devices_ratio'])} the devices, {_times(b['cost_ratio'])} the "
                      f"cost and {_times(b['energy_ratio'])} the energy per token of the optimum", markup=False)


def _searched(db, request, output, kind: str, search, what: str):
    """(request, planning): ``--export`` checked before the search, which then keeps to what that
    framework runs; the search run under a progress bar (silent for --json and --csv). --plot
    without matplotlib fails before the search."""
    if output.plot:
        from .chart_kit import check_available

        check_available()
    if output.export:
        from perfmodel.exports import check_framework

        check_framework(output.export, kind)
        request = replace(request, framework=request.framework or output.export)
    progress = Progress(None, what, enabled=not (output.json_out or output.csv_out))
    try:
        return request, search(request, db=db, progress=progress)
    finally:
        progress.close()


def plan_train(db, request, output) -> None:
    from perfmodel.report import train_report, unmeasured_caveat, winner_caveats
    from perfmodel.search.api import plan_train as search
    from perfmodel.search.train import RECOMMENDATION
    from perfmodel.training import TrainPlan

    request, planning = _searched(db, request, output, "training", search, f"planning {request.model}")
    spec, pairs, work, options, result = (planning.spec, planning.candidates, planning.work, planning.options,
                                          planning.result)
    pareto, timing = output.pareto, output.timing
    answer = planning.recommended
    listed = [result.best, answer] + result.ties + result.top + result.pareto
    for row in listed:
        row["reproduce"] = _train_command(request.model, row, work, options)
    bases = _cost_bases(result.machines.values())
    machine = planning.machine_of(answer)
    answer_plan = TrainPlan(**answer["plan"])
    breakdown = train_report(planning.estimate(answer), machine, spec)
    warnings = _run_warnings(answer, options)
    doc = {"model": spec.name, "objective": options.objective, "candidates": [list(p) for p in pairs],
           "workload": vars(work), "pricing": options.pricing, "cost_basis": bases,
           "recommended": {**answer, "breakdown": breakdown},
           "recommendation": RECOMMENDATION if result.recommended else "the optimum (--any-plan)",
           "best": result.best, "near_count": result.near_count, "ties": result.ties, "tie_count": result.tie_count,
           "per_system": result.per_system,
           "memory_headroom": options.memory_headroom, "warnings": warnings,
           "top": result.top, **({"pareto": result.pareto} if pareto else {}),
           "evidence": _evidence_json(result.evidence, timing)}
    if planning.baseline is not None:
        doc["baseline"] = _train_baseline(request.baseline, planning.baseline, result.best)
    from perfmodel.exports import training_frameworks

    doc["runs_on"] = training_frameworks(spec, machine, answer_plan, work, request.model)
    estimate = lambda: train_doc(spec, machine, answer_plan, work, breakdown)  # noqa: E731
    charts = {"pareto": lambda: {**doc, "pareto": result.pareto}, "breakdown": estimate, "roofline": estimate,
              "memory": estimate}
    if delivered(doc, output, lambda: _plan_row_csv(result.pareto if pareto else [answer] + result.top),
                 charts, "pareto" if pareto else "breakdown",
                 _train_export(spec, machine, answer_plan, work, request.model)):
        return
    console.print(f"{spec.display_name or spec.name}: {work.global_batch:,} sequences x {work.seq_len:,} tokens per "
                  f"step" + (f", {count(work.tokens)} tokens" if work.tokens else "") + f"; objective: {options.objective}",
                  style="bold", markup=False)
    same = answer["plan"] == result.best["plan"] and answer["system"] == result.best["system"] and \
        answer["devices"] == result.best["devices"]
    rows = [("recommended" if result.recommended else "optimum", answer)] + ([] if same else [("fastest", result.best)]
                                                                           if options.objective == "time" else
                                                                           [("optimum", result.best)])
    console.print(_answer_table(rows, work, db))
    for label, row in rows:
        _print_command(f"  {label}:", row["reproduce"])
    _print_runs_on(doc["runs_on"])
    if len(result.per_system) > 1:
        console.print(_per_system_table(result.per_system, result.machines, db))
    if result.recommended:
        console.print(f"why this plan: {RECOMMENDATION} ({result.near_count:,} plans lie within the range, "
                      f"{result.tie_count:,} overlap it); --any-plan recommends the optimum", markup=False, style="dim")
    _print_remarks([unmeasured_caveat(m) for m in result.machines.values()] + warnings
                   + winner_caveats(answer["system"], list(result.machines.values()), options.objective))
    if output.verbose:
        _print_plan_lists(result, work, db, pareto)
    if "baseline" in doc:
        _print_baseline(doc["baseline"])
    _print_quantization([answer["plan"]["precision"]], "bf16")
    _print_bases(bases, options.pricing)
    e = result.evidence
    console.print(f"search: {e.status}{'' if e.gap == 0 else ' (gap ' + _gap(e.gap) + ')'}, {e.evaluated:,} plans "
                  f"evaluated, {e.feasible:,} fit in HBM with {options.memory_headroom:.0%} headroom"
                  f"{f', {e.feasible_with_offload:,} more with offload' if e.feasible_with_offload else ''}"
                  f"{'' if e.check else '; every listed plan re-checked on its own'}"
                  f"{'' if output.verbose else '; --verbose lists the ties, the top plans and the evidence'}",
                  markup=False, style="dim")
    if output.verbose:
        _print_evidence(e)
        console.print()
        _estimate_train_tables(spec, machine, answer_plan, work, breakdown, db)
    else:
        console.print(_times_table("recommended plan: step time by component", breakdown["time_components_s"],
                                   breakdown["step_time_s"], breakdown["time_on_link_s"]))
    report_files(doc)


def _run_warnings(row: dict, options) -> list[str]:
    """What makes a plan's run absurd for the request: longer than a year without a deadline."""
    days = (row.get("run_time_s") or 0.0) / 86400.0
    if days > 365 and options.deadline_s is None:
        return [f"the run takes {days:,.0f} days ({days / 365.25:,.1f} years) on {row['devices']:,} devices; "
                "--deadline DAYS keeps to plans that finish in time"]
    return []


def _answer_table(rows: list[tuple[str, dict]], work, db) -> Table:
    """The answer (and the fastest plan beside it): where, plan, step with its range, MFU, HBM fill,
    the run's time and cost."""
    table = Table(title="step: prediction and low-high range; HBM: share of device memory used", title_justify="left")
    for col in ("", "plan", "step", "MFU", "HBM", "run", "cost"):
        table.add_column(col, justify="left" if col in ("", "plan") else "right")
    for label, p in rows:
        cost = p["run_cost_usd"] if p["run_cost_usd"] else p["cost_per_million_tokens_usd"]
        table.add_row(f"{label}\n{_two_lines(_fleet_named(db, p['system'], p['devices']))}", _plan_text(p["plan"]),
                      f"{_seconds(p['step_time_s'])}\n{_span(p['step_time_low_s'], p['step_time_high_s'])}",
                      f"{p['mfu']:.0%}", f"{p['hbm_fill']:.0%}" if "hbm_fill" in p else "-",
                      _days(p["run_time_s"]) if work.tokens else "-",
                      _usd(cost) + ("" if work.tokens else "\nper M tok"))
    return table


def _per_system_table(rows: list[dict], machines: dict, db) -> Table:
    """Each candidate system's best plan, best first: its step, the price per device-hour it pays and
    whether its kernels are measured (what its number rests on)."""
    from perfmodel.power import run_cost

    table = Table(title="best plan per system", title_justify="left")
    for col in ("system", "plan", "step", "$/device-h", "cost", "kernels"):
        table.add_column(col, justify="left" if col in ("system", "plan", "kernels") else "right")
    for p in rows:
        machine = machines[(p["system"], p["devices"])]
        hourly = float(run_cost(machine, p["power_w"]))           # what the plan pays per device-hour
        hourly = hourly if hourly == hourly else None             # unpriced: NaN
        measured = machine.kernels_measured
        table.add_row(_fleet_named(db, p["system"], p["devices"]), _plan_text(p["plan"]), _seconds(p["step_time_s"]),
                      _usd(hourly), _usd(p["run_cost_usd"] or p["cost_per_million_tokens_usd"]),
                      "fitted" if measured else "unmeasured")
    return table


def _days(seconds: float | None) -> str:
    """A run's length: ``19 h``, ``149 d``, ``52 y``."""
    if not seconds:
        return "-"
    hours = seconds / 3600.0
    return f"{hours:.0f} h" if hours < 48 else f"{hours / 24:,.0f} d" if hours < 24 * 730 else f"{hours / 8766:,.0f} y"


def _print_plan_lists(result, work, db, pareto: bool) -> None:
    """--verbose: the ties, the top plans and (with --pareto) the Pareto front, with reproduce commands."""
    cost_label = "run cost, time" if work.tokens else "$/M tokens"
    if result.tie_count:
        shown = f", the first {len(result.ties)}" if result.tie_count > len(result.ties) else ""
        console.print(_plans_table(f"ties: {result.tie_count:,} plans whose predicted range overlaps the optimal "
                                   f"plan's{shown}", result.ties, cost_label, db))
        _print_commands(result.ties)
    else:
        console.print("no other plan's predicted range overlaps the optimal plan's")
    console.print(_plans_table(f"top {len(result.top)} plans", result.top, cost_label, db))
    _print_commands(result.top)
    if pareto:
        console.print(_plans_table("Pareto front (step time, cost per token, energy per token)", result.pareto,
                                   cost_label, db))
        _print_commands(result.pareto)


def _print_evidence(e) -> None:
    """--verbose: the search's evidence table, its validity rules and what its space leaves out."""
    rows = [("declared space (before the validity rules)", f"{e.declared_space:,}"),
            ("lattice plans evaluated", f"{e.evaluated:,}"), ("feasible in HBM", f"{e.feasible:,}"),
            ("feasible with offload (branch and bound)", f"{e.feasible_with_offload:,}"),
            ("CP-SAT models solved", f"{e.cpsat_models:,}")]
    rows += [(f"infeasible: {k}", f"{v:,}") for k, v in e.infeasible_by_constraint.items()]
    rows += [("solver", e.solver), ("status", e.status), ("optimality gap", _gap(e.gap)),
             ("seconds", f"{e.seconds:.2f}")]
    rows += [("check found", problem) for problem in e.check]
    console.print(_kv_table("evidence", rows))
    console.print("validity rules: " + "; ".join(e.rules), markup=False, style="dim")
    console.print("not in the declared space: " + "; ".join(e.left_out), markup=False, style="dim")


def _gap(gap) -> str:
    """An optimality gap: 'unknown' when no bound proves one (never NaN)."""
    if gap is None or gap != gap:
        return "unknown (not proven)"
    return "0%" if gap == 0 else f"{gap:.1e} of the objective" if gap < 1e-3 else f"{gap:.1%}"


def _command_lines(prefix: str, command: str, width: int) -> list[str]:
    """``prefix`` and a shell ``command`` in lines of at most ``width`` cells, cut between flags and
    ended by `` \\``, so that they paste into a shell as the one command (a flag keeps its value)."""
    import shlex

    groups: list[str] = []
    for word in shlex.split(command):
        if groups and not word.startswith("-") and groups[-1].startswith("--") and " " not in groups[-1]:
            groups[-1] += " " + shlex.quote(word)
        else:
            groups.append(shlex.quote(word))
    lines, line = [], prefix.rstrip()
    for group in groups:
        if line.strip() and cell_len(line) + 1 + cell_len(group) + 2 > width and line != prefix.rstrip():
            lines.append(line + " \\")
            line = "     "
        line += ("" if line.endswith(" ") else " ") + group
    return lines + [line]


def _print_command(prefix: str, command: str) -> None:
    for line in _command_lines(prefix, command, console.width):
        console.print(line, markup=False, style="dim", soft_wrap=True)


def _print_commands(rows: list[dict]) -> None:
    for i, row in enumerate(rows, start=1):
        _print_command(f"  #{i} reproduce:", row["reproduce"])


def _quantization_remark(formats, native: str) -> str | None:
    """The accuracy remark every quantized plan carries: the formats below the model's own."""
    # An fp8 (or int8) model computes in 8 bits as published (DeepSeek-V3's W8A8 fp8 recipe).
    own = (native, "bf16", "fp16", "a16") + (("a8",) if native in ("fp8", "int8") else ())
    lower = sorted({f for f in formats if f not in own})
    if not lower:
        return None
    return (f"quantized: {', '.join(lower)} (the model is published in {native}); check the model's accuracy in "
            "these formats before deploying")


def _print_quantization(formats, native: str) -> None:
    remark = _quantization_remark(formats, native)
    if remark:
        console.print(remark, markup=False, style="yellow")


def _print_bases(bases: dict[str, str], pricing: str) -> None:
    console.print(f"cost basis ({pricing}; --pricing cloud|owned):", markup=False)
    for line in bases.values():
        console.print(f"  {line}", markup=False)


def _ms(x: float | None) -> str:
    return _seconds(x)


def _pools_fleet(db, pools, two_lines: bool = False) -> str:
    """The devices of ``pools`` by system, as ``units.fleet`` counts them (joined by ``+``)."""
    by_system: dict[str, int] = {}
    for p in pools:
        by_system[p.system] = by_system.get(p.system, 0) + p.devices
    parts = [_fleet_named(db, name, n) for name, n in by_system.items()]
    return ("\n+ " if two_lines else " + ").join(_two_lines(p) if two_lines else p for p in parts)


def _two_lines(fleet_text: str) -> str:
    """A ``units.fleet`` text for a narrow cell: the count, then the nodes (``64 GPUs`` / ``(8 x dgx-h100)``)."""
    return fleet_text.replace(" of ", "\nof ", 1).replace(" (", "\n(", 1)


def _config_text(c: dict) -> str:
    text = (f"tp{c['tp']} pp{c['pp']} ep{c['ep']}"
            + (f" dpa{c['dp_attention']}" if c["dp_attention"] > 1 else "")
            + f" batch {c['batch']} W:{c['weight_precision']} A:{c['activation_precision']} KV:{c['kv_precision']}")
    return text + (f" (KV in {c['kv_place']})" if c["kv_place"] != "hbm" else "") + (
        f" (weights streamed from {c['weight_place']})" if c.get("weight_place", "hbm") != "hbm" else "")


def _deployment_json(d) -> dict:
    data = {k: v for k, v in vars(d).items() if k != "pools"}
    data["pools"] = [{**vars(p), "devices": p.devices} for p in d.pools]
    return data


def _deployments_table(title: str, deployments: list, ties: list[bool] | None = None, db=None) -> Table:
    """Deployments: each pool as instances x devices per instance (``decode 2x8``), the fleet, p90 latencies, cost
    per million output tokens and energy per output token."""
    table = Table(title=title, title_justify="left", pad_edge=False)   # two cells more for mixed pools
    for col in ("#", "pools", "fleet", "TTFT p90", "TPOT p90", "latency", "$/M tok", "energy"):
        table.add_column(col, justify="left" if col in ("pools", "fleet") else "right",
                         whole=False if col == "#" else None)   # "12 ≈" may wrap its mark
    for i, d in enumerate(deployments, start=1):
        mixed = len({p.system for p in d.pools}) > 1
        pools = "\n".join(f"{p.role} {p.instances:,}x{p.devices_per_instance}" + (f" {p.system}" if mixed else "")
                          for p in d.pools)
        where = _pools_fleet(db, d.pools, two_lines=True) if db else f"{d.devices:,}"
        mark = " ≈" if ties and ties[i - 1] else ""
        table.add_row(f"{i}{mark}", pools, where, _ms(d.ttft_p90_s), _ms(d.tpot_p90_s), _ms(d.latency_s),
                      _usd(d.usd_per_million_tokens), joules(d.joules_per_token))
    return table


def _range(value, error) -> str:
    """' (p90 range low-high)' of a predicted latency and its relative error, or '' without one."""
    if value is None or not error:
        return ""
    return f" (p90 range {_span(value * (1 - error), value * (1 + error))})"


def _deployments_csv(deployments: list) -> list[dict]:
    return [{"rank": i, "mode": d.mode, "pools": len(d.pools), **{k: v for k, v in _deployment_json(d).items()
                                                                 if not isinstance(v, (list, dict))}}
            for i, d in enumerate(deployments, start=1)]


def plan_serve(db, request, output) -> None:
    from perfmodel.report import unmeasured_caveat, winner_caveats
    from perfmodel.search.api import SERVE_RECOMMENDATION, plan_serve as search
    from perfmodel.search.serve import deployment_error, serving_ties

    request, planning = _searched(db, request, output, "serving", search, f"planning {request.model} serving")
    spec, systems, demand, options, result = (planning.spec, planning.systems, planning.demand, planning.options,
                                              planning.result)
    pareto, timing = output.pareto, output.timing
    bases = _cost_bases(planning.machines.values())
    answer = planning.recommended
    for d in [answer, result.best] + result.top + result.pareto:
        for pool in d.pools:
            pool.reproduce = _serve_command(request.model, pool, demand, options)
    evidence = dict(vars(result.evidence))
    if not timing:
        evidence.pop("seconds")
    formats = {f for p in answer.pools for f in (p.config["weight_precision"], p.config["activation_precision"],
                                                      p.config["kv_precision"])}
    remark = _quantization_remark(formats, spec.native_precision)
    doc = {"model": spec.name, "systems": systems, "objective": options.objective,
           "demand": {"rate": demand.rate, "input_len": vars(demand.input_len), "output_len": vars(demand.output_len),
                      "slo_s": {k: getattr(demand, k) for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")}},
           "recommended": _deployment_json(answer),
           "recommendation": SERVE_RECOMMENDATION if not request.any_plan else "the optimum (--any-plan)",
           "best": _deployment_json(result.best), "top": [_deployment_json(d) for d in result.top],
           "top_ties": [i for i, t in enumerate(serving_ties(result.best, result.top, options.objective)) if t],
           **({"pareto": [_deployment_json(d) for d in result.pareto]} if pareto else {}),
           "pricing": options.pricing, "cost_basis": bases, "quantization": remark, "evidence": evidence}
    if planning.baseline is not None:
        doc["baseline"] = {**_serve_baseline(request.baseline, planning.baseline, result.best),
                           "objective": options.objective}
    if planning.power_cap is not None:
        doc["power_cap"] = planning.power_cap
    doc["runs_on"] = planning.runs_on
    export = planning.export
    charts = {"pareto": lambda: {**doc, "pareto": [_deployment_json(d) for d in result.pareto]}}
    if delivered(doc, output, lambda: _deployments_csv(result.pareto if pareto else [result.best] + result.top),
                 charts, "pareto", export):
        return
    slo = ", ".join(f"{k.replace('_', ' ')} {_ms(getattr(demand, k))}" for k in ("ttft_p50", "ttft_p90", "tpot_p50",
                                                                              "tpot_p90") if getattr(demand, k))
    console.print(f"{spec.display_name or spec.name}: {demand.rate:,.3g} requests/s, prompts {demand.input_len.mean:,.0f} "
                  f"tokens (p90 {demand.input_len.p90:,.0f}), outputs {demand.output_len.mean:,.0f} (p90 "
                  f"{demand.output_len.p90:,.0f}); targets: {slo}; objective: {options.objective}",
                  style="bold", markup=False)
    best = answer
    console.print(f"recommended deployment: {best.mode}" + ("" if answer is result.best else
                  f" (the optimum, {_deployment_line(result.best, options.objective)}, runs on no framework as "
                  "written)"), style="bold")
    for p in best.pools:
        console.print(_kv_table(
            f"{p.role} pool: {_pools_fleet(db, [p])} as {p.instances:,} instance{'s' if p.instances > 1 else ''} "
            f"of {p.devices_per_instance}",
            [("instance", _config_text(p.config)),
             ("TTFT p50 / p90", f"{_ms(p.ttft_p50_s)} / {_ms(p.ttft_p90_s)}" + _range(p.ttft_p90_s, p.ttft_error)),
             ("TPOT p50 / p90", f"{_ms(p.tpot_p50_s)} / {_ms(p.tpot_p90_s)}" + _range(p.tpot_p90_s, p.tpot_error)),
             ("requests/s it carries", fmt(p.requests_per_s)), ("HBM per device", size(p.hbm_used_bytes)),
             ("power", watts(p.power_w)), ("cost", _usd(p.usd_per_hour) + (" per hour" if p.usd_per_hour else "")),
             (("prefill p90, unloaded" if p.role == "prefill" else "decode step p90, full batch, unloaded"),
              _ms(p.prefill_p90_s if p.role == "prefill" else p.step_p90_s))]))
        _print_command("  reproduce (unloaded):", p.reproduce)
    console.print(_kv_table("fleet", [("devices", _pools_fleet(db, best.pools)),
                                      ("request latency (TTFT p90 + mean output x TPOT p90)",
                                       _ms(best.latency_s)),
                                      ("power (IT, with node share)", watts(best.power_w)),
                                      ("cost per hour", _usd(best.usd_per_hour) + (
                                          " (owned " + ", ".join(f"{n:,} x {k}" for k, n in best.owned_used.items())
                                          + f": {_usd(best.owned_saving_usd_per_hour)} below their market price)"
                                          if best.owned_used else "")),
                                      ("cost per million output tokens", _usd(best.usd_per_million_tokens)),
                                      ("energy per output token (with PUE)", joules(best.joules_per_token))]))
    _print_runs_on(doc["runs_on"])
    _print_remarks([unmeasured_caveat(planning.machines[p.system], serving=True) for p in best.pools]
                   + [c for p in best.pools for c in winner_caveats(p.system, list(planning.machines.values()),
                                                                    options.objective)])
    ties = serving_ties(result.best, result.top, options.objective)
    if output.verbose:
        console.print(_deployments_table(f"top {len(result.top)} single-configuration deployments", result.top,
                                         ties, db))
        for i, d in enumerate(result.top, start=1):
            for pool in d.pools:
                _print_command(f"  #{i} {pool.role}:", pool.reproduce)
    if any(ties):
        console.print(f"{sum(ties)} of the top {len(result.top)} deployments tie with the optimum (their "
                      f"{options.objective} within its prediction error, +-{deployment_error(result.best):.0%})"
                      + ("; marked ≈" if output.verbose else "; --verbose lists them"), style="dim")
    if pareto:
        console.print(_deployments_table("Pareto front (cost per token, latency, energy per token)", result.pareto,
                                         db=db))
    e = result.evidence
    rows = [("instance configurations evaluated", f"{e.configurations:,}"),
            ("meeting the SLOs at some instance count", f"{e.feasible_configurations:,}"),
            ("pool options kept (non-dominated)", f"{e.pool_options:,}"),
            ("prefill x decode pairs checked", f"{e.pairs_checked:,}")]
    rows += [(f"infeasible: {k}", f"{v:,}") for k, v in e.infeasible_by_constraint.items()]
    rows += [("queueing", e.queueing), ("solver", e.solver), ("status", e.status), ("optimality gap", _gap(e.gap)),
             ("seconds", f"{e.seconds:.2f}")]
    if output.verbose:
        console.print(_kv_table("evidence", rows))
    else:
        console.print(f"search: {e.status}, {e.configurations:,} instance configurations evaluated; --verbose "
                      "lists the top deployments and the evidence", markup=False, style="dim")
    if remark:
        console.print(remark, markup=False, style="yellow")
    if "baseline" in doc:
        _print_baseline(doc["baseline"])
    if "power_cap" in doc:
        _print_power_cap(doc["power_cap"])
    _print_bases(bases, options.pricing)
    report_files(doc)


def _deployment_line(d, objective: str) -> str:
    """A deployment's objective in a few words: ``$31.9 per hour``, ``22.3 s latency``."""
    return {"cost": lambda: f"{_usd(d.usd_per_hour)} per hour", "energy": lambda: f"{watts(d.power_w)}",
            "devices": lambda: f"{d.devices:,} devices", "latency": lambda: f"{_ms(d.latency_s)} latency"}[objective]()


def place_experts(db, request, output) -> None:
    from perfmodel.search.api import place_experts as search
    from perfmodel.search.placement import DECOMPOSITION, SPLIT_ASSUMPTION

    progress = Progress(None, f"placing experts three ways (time limit {request.time_limit:g} s)",
                        enabled=not (output.json_out or output.csv_out))
    try:
        placed = search(request, db=db, progress=progress)
    finally:
        progress.close()
    spec, machine, problem, time_limit = placed.spec, placed.machine, placed.problem, request.time_limit
    rows = {}
    for name, p in placed.placements.items():
        rows[name] = {"imbalance": p.imbalance, "max_load_tokens": float(p.max_load.mean()),
                      "cross_device_tokens": p.cross_device_tokens, "cross_node_tokens": p.cross_node_tokens,
                      "predicted_moe_time_s": placed.predicted_moe_time_s(name), "gap_to_bound": p.gap}
    best = placed.best
    improvement = {f"{tokens}_vs_{base.replace('-', '_')}": placed.reduction(base, f"{tokens}_tokens")
                   for tokens in ("cross_device", "cross_node") for base in ("round-robin", "greedy")}
    over_bound = best.over_bound
    evidence = {"status": best.status, "gap": best.gap, "bound_tokens_per_layer": [float(b) for b in best.bound],
                "objective": best.objective, "load_tolerance": best.load_tolerance,
                "busiest_over_bound": over_bound, "decomposition": DECOMPOSITION,
                "peak_proven_layers": int(best.peak_proven.sum()),
                "traffic_assumption": SPLIT_ASSUMPTION,
                "tokens_between_layers": best.traffic.between_layers if best.traffic else None,
                "devices": problem.devices, "devices_per_node": problem.devices_per_node,
                "slots": problem.slots, "replicas": problem.replicas, "layers": problem.stats.layers,
                "experts": problem.stats.experts, "time_limit_s": time_limit, "note": best.note,
                "deterministic_seconds": best.work_s}
    if output.csv_out and not output.json_out:
        emit_csv([{"method": name, **r} for name, r in rows.items()])
        return
    if output.json_out:
        emit_json({"model": spec.name, "system": machine.system.name, "placement": best.as_map(),
                   "methods": rows, "improvement": improvement, "evidence": evidence})
        return
    console.print(f"{spec.display_name or spec.name}: {problem.stats.layers} MoE layers x {problem.stats.experts} "
                  f"experts on {_fleet(problem.devices, machine.system, machine.accelerator, db)}, "
                  f"{machine.accelerator.name}, {problem.slots} slots per device, {problem.replicas} replicas per layer",
                  style="bold", markup=False)
    table = Table(title="placements compared (tokens per layer pair summed over layers)", title_justify="left")
    for col in ("method", "load max / mean", "busiest device tokens", "tokens crossing devices",
                "tokens crossing nodes", "predicted MoE time", "gap to bound"):
        table.add_column(col, justify="left" if col == "method" else "right", whole=col == "method" or None)
    for name, r in rows.items():
        table.add_row(name, f"{r['imbalance']:.3f}", count(r["max_load_tokens"]), count(r["cross_device_tokens"]),
                      count(r["cross_node_tokens"]), _seconds(r["predicted_moe_time_s"]), f"{r['gap_to_bound']:.2%}")
    console.print(table)
    base, cp, greedy = rows["round-robin"], rows["affinity"], rows["greedy"]

    def fewer(tokens: str) -> str:
        pair = improvement[f"{tokens}_vs_round_robin"], improvement[f"{tokens}_vs_greedy"]
        return "n/a (no transition counts)" if pair[0] is None else f"{pair[0]:.1%} / {pair[1]:.1%}"

    console.print(_kv_table("improvement of affinity", [
        ("cross-device tokens below round-robin / greedy", fewer("cross_device")),
        ("cross-node tokens below round-robin / greedy", fewer("cross_node")),
        ("imbalance vs round-robin / greedy", f"{1 - cp['imbalance'] / base['imbalance']:.1%} / "
                                              f"{1 - cp['imbalance'] / greedy['imbalance']:.1%}"),
        ("MoE time vs round-robin / greedy", f"{1 - cp['predicted_moe_time_s'] / base['predicted_moe_time_s']:.1%} / "
                                             f"{1 - cp['predicted_moe_time_s'] / greedy['predicted_moe_time_s']:.1%}")]))
    proven = evidence["peak_proven_layers"]
    status = evidence["status"] + ("" if evidence["status"] == "OPTIMAL" else
                                   " (crossing tokens: layer by layer, no bound" +
                                   (f"; load-first busiest device proven minimal on {proven} of "
                                    f"{problem.stats.layers} layers)" if proven else ")"))
    rows_ = [("status", status), ("gap to bound (worst layer)", f"{evidence['gap']:.2%}"),
             ("busiest device over its bound (worst layer)",
              f"{over_bound:.2%} (tolerance {best.load_tolerance:.2%}, or the load-first peak if higher)"),
             ("objective", best.objective), ("traffic assumption", SPLIT_ASSUMPTION),
             ("decomposition", DECOMPOSITION),
             ("seconds", f"{best.work_s:.1f} deterministic, {best.seconds:.1f} by this machine's clock (limit "
                         f"{time_limit:g} deterministic)")]
    if best.note:
        rows_.append(("note", best.note))
    console.print(_kv_table("evidence", rows_))
    console.print("--json writes the placement map: layer -> expert -> devices", style="dim")


def _constants(report) -> str:
    """Where an estimate's constants came from, for its summary line."""
    c = report["constants_from"]
    exchange = f", MoE exchange {c['expert_exchange']}" if "expert_exchange" in c else ""
    experts = f", MoE expert GEMMs {c['expert_gemm']}" if "expert_gemm" in c else ""
    return f"GEMM {c['gemm']}, attention {c['attention']}, collectives {c['collectives']}{exchange}{experts}"
