"""What the hardware database and the model catalog hold: ``hardware list/show``, ``models list/show`` and
``compare`` as tables, JSON and CSV."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len

from perfmodel.hardware_db.errors import UnknownNameError
from perfmodel.hardware_db.schema import ENTRY_KINDS, PRECISIONS

from . import units
from .columns import column, csv_of, csv_only, table_of
from .deliver import delivered, emit_csv, emit_json, report_files
from .render import Table, console, fmt
from .units import count, rate, size, watts


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


# ``hardware list``'s columns over (kind, name, entry): the CSV names the kind, the table is one per kind.
_ENTRY_COLUMNS = [csv_only("kind", value=lambda r, key: r[0]),
                  column("name", "name", value=lambda r: r[1], justify="left", whole=True, style="bold"),
                  column("display name", "display_name", value=lambda r: r[2].display_name, justify="left"),
                  column("summary", "summary", value=lambda r: _entry_summary(r[2]), justify="left")]


def hardware_list(db, kind: str | None, json_out: bool, csv_out: bool = False) -> None:
    kinds = list(ENTRY_KINDS)
    if kind is not None and kind not in kinds + ["all"]:
        raise UnknownNameError("kind", kind, kinds + ["all"])
    machine_readable = json_out or csv_out
    kinds = [kind] if kind not in (None, "all") else kinds if kind == "all" or machine_readable else list(PLANNED_KINDS)
    if json_out:
        emit_json({k: sorted(getattr(db, k)) for k in kinds})
        return
    records = {k: [(k, name, getattr(db, k)[name]) for name in sorted(getattr(db, k))] for k in kinds}
    if csv_out:
        emit_csv(csv_of(_ENTRY_COLUMNS, [r for k in kinds for r in records[k]]))
        return
    for k in kinds:
        console.print(table_of(_ENTRY_COLUMNS, records[k], Table(title=k, title_justify="left")))
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
              ("usd_text", units.usd), ("_usd_per_hour", lambda v: f"{units.usd(v)} per hour"),
              ("_usd_per_device_hour", lambda v: f"{units.usd(v)} per device-hour"))


def _pretty_si(key: str, value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for suffix, human in _SI_SUFFIX:
            if key.endswith(suffix):
                return human(value)
        return fmt(value)
    return "-" if value is None else str(value)


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
