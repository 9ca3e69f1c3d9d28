"""The table kit every view draws with: the console, a rich table that cuts no word, number and plan texts,
the progress bar, and the pieces the plan views share (commands, evidence, remarks, the estimate tables).

Each command family has its view (``view_catalog``, ``view_estimate``, ``view_validate``, ``view_train``,
``view_serve``, ``calibration``, ``sweep``); ``deliver`` writes JSON, CSV, charts and launch files."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table as _RichTable

from . import units
from .columns import Column, column as value_column, table_of
from .units import fleet, joules, size, watts

console = Console(highlight=False, soft_wrap=False, emoji=False)
# Tables printed with a word cut are logged here at DEBUG (the 80-column readability test reads it).
SQUEEZED = logging.getLogger(__name__ + ".squeezed")


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
        terminal are logged to SQUEEZED (the 80-column readability test reads it)."""
        widths = super()._calculate_column_widths(console, options)
        floors = [self._longest_word(console, column) + self._get_padding_width(column._index)
                  for column in self.columns]
        if all(w >= f for w, f in zip(widths, floors)):
            return widths
        if sum(floors) > options.max_width:
            SQUEEZED.debug("%s", self.title or [str(c.header) for c in self.columns])
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


seconds_text = units.seconds


def usd_text(x: float | None) -> str:
    return "no price" if x is None else units.usd(x)


def kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right", whole=False)
    for k, v in rows:
        table.add_row(k, v)
    return table


def time_records(components: dict, links: dict | None = None, **fields) -> list[dict]:
    """A time breakdown's records: each component's name, seconds and (from ``links``) its time on its
    link, with ``fields`` (a phase, say) on each."""
    return [{**fields, "component": name, "seconds": value, "link": (links or {}).get(name)}
            for name, value in components.items()]


def time_columns(total: float | None = None, links: bool = False) -> list[Column]:
    """A time breakdown's columns: the component, its time on the critical path (``exposed`` beside
    the links), its share of ``total`` and (with ``links``) each transfer's time on its link before
    overlap, as Calculon prints them side by side; the CSV has the component and its seconds."""
    return [value_column("component", "component", justify="left"),
            value_column("exposed" if links else "time", "seconds", lambda v: seconds_text(v or 0.0)),
            Column("share", lambda r: f"{(r['seconds'] or 0.0) / total:.1%}" if total else "-"),
            *([Column("on its link", lambda r: seconds_text(r["link"]) if r["link"] else "-")] if links else [])]


def times_table(title: str, components: dict, total: float | None, links: dict | None = None) -> Table:
    """Time on the critical path by component (those with a time, or one on their link): ``time_columns``."""
    shown = [r for r in time_records(components, links) if r["seconds"] or r["link"]]
    return table_of(time_columns(total, bool(links)), shown, Table(title=title, title_justify="left"))


def ops_table(title: str, ops: dict) -> Table:
    table = Table(title=title, title_justify="left")
    for col, justify in (("operator", "left"), ("time", "right"), ("bound", "left")):
        table.add_column(col, justify=justify)
    for name, v in ops.items():
        table.add_row(name, seconds_text(v["seconds"]), v["bound"])
    return table


def memory_table(memory: dict, tiers: dict) -> list[Table]:
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


def fleet_of(devices: int, system, accelerator, db=None) -> str:
    """``units.fleet`` with the database's entry of ``system`` (a Machine holds the entry resized
    to its devices); without ``db``, the count reads as nodes of the system, right for any entry."""
    if db is None:
        return fleet(devices, system, accelerator, named_node=False)
    return fleet(devices, db.system(system.name), accelerator)


def kwh_joules(kwh: float | None) -> float | None:
    """Joules of an energy the report gives in kWh (its JSON field's unit)."""
    return None if kwh is None else kwh * 3.6e6


def header_line(spec, machine, db=None) -> str:
    return (f"{spec.display_name or spec.name} on {fleet_of(machine.devices, machine.system, machine.accelerator, db)}"
            f", {machine.accelerator.name}")


def train_doc(spec, machine, plan, work, report) -> dict:
    """The JSON document of one training estimate (``estimate train --json``; charts read it)."""
    return {"model": spec.name, "system": machine.system.name, "devices": machine.devices,
            "plan": {k: (v.item() if hasattr(v, "item") else v) for k, v in vars(plan).items()
                     if k != "activation_offload" or v},    # listed only when on
            "workload": vars(work), "result": report}


def train_export(spec, machine, plan, work, model_ref: str):
    def files(framework: str) -> dict[str, str]:
        from perfmodel.exports import training_files

        return training_files(framework, spec, machine, plan, work, model_ref)
    return files


def estimate_train_tables(spec, machine, plan, work, report, db=None) -> None:
    console.print(header_line(spec, machine, db), style="bold")
    console.print(f"plan: tp {plan.tp}, pp {plan.pp} (interleave {plan.interleave}"
                  f"{', embedding and loss as layers' if plan.ends_as_layers else ''}"
                  f"{', DualPipe' if str(plan.schedule) == 'dualpipe' else ''}), dp {plan.dp}, cp {plan.cp}"
                  f"{f' ({plan.cp_comm})' if plan.cp > 1 and str(plan.cp_comm) != 'p2p' else ''}, "
                  f"ep {plan.ep}, micro-batch {plan.micro_batch}, zero {plan.zero}{sharding_text(vars(plan))}, "
                  f"recompute {plan.recompute}, sp {'on' if plan.sp else 'off'}"
                  f"{', TP overlap' if plan.tp_overlap and plan.sp else ''}"
                  f"{', EP exchange overlapped' if plan.ep_overlap and plan.ep > 1 else ''}"
                  f"{f', {plan.dispatcher} dispatcher' if str(plan.dispatcher) != 'alltoall' and plan.ep > 1 else ''}"
                  f", {plan.precision}"
                  f"{', DeepSeek low-precision storage' if str(plan.storage) == 'deepseek' else ''}"
                  f"{f', activations swapped to host {float(plan.activation_offload):g}' if plan.activation_offload else ''}",
                  markup=False)
    run = report["run"]
    low, high = report["step_time_range_s"]
    rows = [("step time", f"{seconds_text(report['step_time_s'])} (range {span_text(low, high)})"),
            ("constants", constants_text(report)),
            ("tokens/s", fmt(report["tokens_per_s"])),
            ("MFU", f"{report['mfu']:.1%}"), ("HFU", f"{report['hfu']:.1%}"),
            ("microbatches per step", fmt(report["microbatches"])),
            ("power per device (with node share)", watts(report["power_per_device_w"])),
            ("energy per token (with PUE)", joules(report["energy_per_token_j"])),
            ("cost per hour", usd_text(report["cost_per_hour_usd"])),
            ("cost per million tokens", usd_text(report["cost_per_million_tokens_usd"]))]
    if work.tokens:
        rows += [("run time", seconds_text(run["time_s"])), ("run energy", units.energy(kwh_joules(run["energy_kwh"]))),
                 ("run cost", usd_text(run["cost_usd"]))]
    console.print(kv_table("summary", rows))
    print_remarks([report["constants_from"].get("caveat"), report.get("hint")])
    console.print(times_table("step time by component", report["time_components_s"], report["step_time_s"],
                               report["time_on_link_s"]))
    console.print(ops_table("operators (all microbatches, forward + backward, one stage)", report["operators_s"]))
    for t in memory_table(report["memory_per_device_bytes"], report["memory_tiers"]):
        console.print(t)
    console.print(f"cost basis: {report['cost_basis']}", markup=False)


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


def sharding_text(q: dict) -> str:
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


def plan_text(q: dict) -> str:
    """A plan in one line: tp, pp x interleave, dp, cp, ep, micro-batch, zero and its sharding, recompute, sp,
    precision, offload."""
    expert_tp = f" etp{q['etp']}" if q.get("etp") else ""
    ends = "+ends" if q.get("ends_as_layers") else ""
    sp = ("sp+overlap " if q.get("tp_overlap") else "sp ") if q["sp"] else ""
    expert_tp += "+overlap" if q.get("ep_overlap") else ""
    expert_tp += f" {q['dispatcher']}" if q.get("dispatcher", "alltoall") != "alltoall" else ""
    cp = f"cp{q['cp']}" + (f" {q['cp_comm']}" if q.get("cp_comm", "p2p") != "p2p" else "")
    text = (f"tp{q['tp']} pp{q['pp']}x{q['interleave']}{ends} dp{q['dp']} {cp} ep{q['ep']}{expert_tp} "
            f"mb{q['micro_batch']} zero{q['zero']}{sharding_text(q)} {q['recompute']} {sp}{q['precision']}")
    places = [f"{name}:{q[key]}" for key, name in (("optimizer_place", "opt"), ("grad_place", "grad"),
                                                    ("param_place", "param")) if q[key] != "hbm"]
    if q.get("activation_offload"):
        places.append(f"act:{q['activation_offload']:g}")
    return text + (" offload " + ", ".join(places) if places else "")


def span_text(low: float | None, high: float | None) -> str:
    """A range of durations, the unit said once when both ends share it: ``49.2-64.8 s``."""
    a, b = seconds_text(low), seconds_text(high)
    number, _, unit = a.rpartition(" ")
    return f"{number}-{b}" if unit and b.endswith(" " + unit) else f"{a} to {b}"


def fleet_named(db, system: str, devices: int) -> str:
    """``units.fleet`` of ``devices`` of the database's system ``system``."""
    entry = db.system(system)
    return fleet(devices, entry, db.accelerator(entry.accelerator))


def price_flags(options) -> tuple[str, ...]:
    """The search's --price flags, as SYSTEM=USD strings."""
    return tuple(f"{k}={v:g}" for k, v in sorted((options.prices or {}).items()))


def cost_bases(machines) -> dict[str, str]:
    """One cost-basis line per system (machines of one system at several sizes give one line)."""
    from perfmodel.economics import cost_basis

    return {m.system.name: cost_basis(m) for m in machines}


def times_text(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_remarks(remarks) -> None:
    """Each distinct remark, once, in yellow: what a device's constants rest on
    (perfmodel.report.unmeasured_caveat) or a change to the plan worth trying (interleave_hint)."""
    for remark in dict.fromkeys(r for r in remarks if r):
        console.print(remark, markup=False, style="yellow")


def print_runs_on(runs_on: dict[str, str | None]) -> None:
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


def print_baseline(b: dict) -> None:
    console.print(f"baseline {b['name']}: {b['description']}", markup=False, style="bold")
    if b["best"] is None:
        console.print(f"  the heuristic has no feasible plan: {b['reason']}", markup=False)
        return
    if "speedup" in b:
        console.print(f"  its best plan: {plan_text(b['best']['plan'])}, step {seconds_text(b['best']['step_time_s'])}; "
                      f"it takes {times_text(b['speedup'])} the optimum's step time, {times_text(b['cost_ratio'])} its cost and "
                      f"{times_text(b['energy_ratio'])} its energy per token", markup=False)
    elif b.get("objective") == "latency":
        console.print(f"  its fastest deployment: {b['best']['devices']:,} devices, latency "
                      f"{ms_text(b['best']['latency_s'])}; the optimum is {times_text(b['latency_ratio'])} faster and uses "
                      f"{times_text(1 / b['energy_ratio'] if b['energy_ratio'] else None)} its energy per token",
                      markup=False)
    else:
        console.print(f"  its best deployment: {b['best']['devices']:,} devices, {usd_text(b['best']['usd_per_hour'])} "
                      f"per hour; it needs {times_text(b['devices_ratio'])} the devices, {times_text(b['cost_ratio'])} the "
                      f"cost and {times_text(b['energy_ratio'])} the energy per token of the optimum", markup=False)


def run_search(db, request, output, kind: str, search, what: str):
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


def gap_text(gap) -> str:
    """An optimality gap: 'unknown' when no bound proves one (never NaN)."""
    if gap is None or gap != gap:
        return "unknown (not proven)"
    return "0%" if gap == 0 else f"{gap:.1e} of the objective" if gap < 1e-3 else f"{gap:.1%}"


def wrapped_command(prefix: str, command: str, width: int) -> list[str]:
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


def print_command(prefix: str, command: str) -> None:
    for line in wrapped_command(prefix, command, console.width):
        console.print(line, markup=False, style="dim", soft_wrap=True)


def print_bases(bases: dict[str, str], pricing: str) -> None:
    console.print(f"cost basis ({pricing}; --pricing cloud|owned):", markup=False)
    for line in bases.values():
        console.print(f"  {line}", markup=False)


def ms_text(x: float | None) -> str:
    return seconds_text(x)


def two_lines_text(fleet_text: str) -> str:
    """A ``units.fleet`` text for a narrow cell: the count, then the nodes (``64 GPUs`` / ``(8 x dgx-h100)``)."""
    return fleet_text.replace(" of ", "\nof ", 1).replace(" (", "\n(", 1)


def constants_text(report) -> str:
    """Where an estimate's constants came from, for its summary line."""
    c = report["constants_from"]
    exchange = f", MoE exchange {c['expert_exchange']}" if "expert_exchange" in c else ""
    engines = c.get("kernel_tables", {})
    own = {f: f" ({e} kernels)" if e != "TensorRT-LLM" else "" for f, e in engines.items()}
    experts = f", MoE expert GEMMs {c['expert_gemm']}{own.get('grouped_gemm', '')}" if "expert_gemm" in c else ""
    tables = f" ({c['gemm_tables']})" if "gemm_tables" in c else ""
    return (f"GEMM {c['gemm']}{tables}, attention {c['attention']}{own.get('attention', '')}, "
            f"collectives {c['collectives']}{exchange}{experts}")
