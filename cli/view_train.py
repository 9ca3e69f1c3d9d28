"""``perfmodel plan train``: the recommended and the fastest plan, the lists, the evidence and the baselines."""

from __future__ import annotations

from dataclasses import replace

from .columns import Column, Listed, csv_of, csv_only, each_once, listed, rank_column, table_of
from .deliver import delivered, report_files
from .render import (Table, console, cost_bases, estimate_train_tables, fleet_named, gap_text, kv_table, plan_text,
                     price_flags, print_baseline, print_bases, print_command, print_remarks, print_runs_on,
                     run_search, seconds_text, span_text, times_table, train_doc, train_export,
                     two_lines_text, usd_text)
from .units import count, joules


def _plan_columns(cost_label: str = "$/M tokens", db=None, commands: dict | None = None) -> list[Column]:
    """A list of plans' columns: rank (the CSV adds the role), where, plan, step with its range, MFU, the
    run's cost and time (or the cost per million tokens without --tokens), energy per token; the CSV
    adds the command that reproduces the plan (``commands``: TrainRow -> command)."""
    def where(p) -> str:
        return two_lines_text(fleet_named(db, p.system, p.devices)) if db else f"{p.devices:,} x {p.system}"

    def cost(p) -> str:
        return usd_text(p.run_cost_usd) + "\n" + _days(p.run_time_s) if p.run_cost_usd else \
            usd_text(p.cost_per_million_tokens_usd)
    metrics = lambda *keys: lambda item: {k: getattr(item.row, k) for k in keys}  # noqa: E731
    return [rank_column(),
            Column("where", lambda item: where(item.row),
                   lambda item: {"system": item.row.system, "devices": item.row.devices}, justify="left"),
            Column("plan", lambda item: plan_text(item.row.plan_dict()), lambda item: item.row.plan_dict(),
                   justify="left"),
            Column("step", lambda item: f"{seconds_text(item.row.step_time_s)}\n"
                                        f"{span_text(item.row.step_time_low_s, item.row.step_time_high_s)}",
                   metrics("step_time_s", "step_time_low_s", "step_time_high_s")),
            Column("MFU", lambda item: f"{item.row.mfu:.1%}", metrics("mfu")),
            Column(cost_label, lambda item: cost(item.row), metrics("run_cost_usd", "cost_per_million_tokens_usd")),
            Column("energy", lambda item: joules(item.row.energy_per_token_j), metrics("energy_per_token_j")),
            csv_only("reproduce", value=lambda item, key: (commands or {}).get(item.row))]


def _plans_table(title: str, plans: list, cost_label: str, db=None) -> Table:
    """Listed plans (TrainRow), ranked in their list (``_plan_columns``)."""
    return table_of(_plan_columns(cost_label, db), listed(plans, "top"),
                    Table(title=title, title_justify="left"))


def _evidence_json(evidence, timing: bool) -> dict:
    data = dict(vars(evidence))
    data["rules"] = list(data["rules"])
    if not timing:
        data.pop("seconds")  # keeps --json byte-reproducible; --timing adds it
    return data


def _train_command(model_ref: str, row, work, options) -> str:
    """The ``perfmodel estimate train`` command that reproduces a searched plan's numbers."""
    from perfmodel.requests import TrainRequest, command

    request = TrainRequest.of_plan(model_ref, row.system, row.devices, row.plan, work)
    return command(replace(request, pricing=options.pricing, price=price_flags(options)))


def _same_plan(a, b) -> bool:
    return (a.system, a.devices, a.plan) == (b.system, b.devices, b.plan)


def _plans_csv(result, answer, objective: str, pareto: bool, commands: dict) -> list[dict]:
    """``--csv``: the Pareto front (role ``pareto``, ranked along it), or each plan once: the answer
    (``recommended``, or ``optimum`` under --any-plan), the optimum if another plan (``fastest`` for
    --objective time), then the top plans (``top``); ranks are places in the top list; each row with
    the command that reproduces it (``commands``: TrainRow -> command)."""
    columns = _plan_columns(commands=commands)
    if pareto:
        return csv_of(columns, listed(result.pareto, "pareto"))
    first = [Listed(None, "recommended" if result.recommended else "optimum", answer),
             Listed(None, "fastest" if objective == "time" else "optimum", result.best)]
    return csv_of(columns, each_once(first + listed(result.top, "top"), _same_plan))


def document(request, planning, commands: dict, breakdown: dict, pareto: bool, timing: bool) -> dict:
    """``plan train --json``: the searched plans (each with the command that reproduces it, from
    ``commands``), the recommendation with its step ``breakdown``, the evidence (its seconds only with
    ``timing``), the Pareto front with ``pareto``, the baseline comparison and the frameworks that run
    the recommendation."""
    from perfmodel.exports import training_frameworks
    from perfmodel.search.baselines import train_comparison
    from perfmodel.search.train import RECOMMENDATION

    spec, work, options, result, answer = (planning.spec, planning.work, planning.options, planning.result,
                                           planning.recommended)
    shown = lambda rows: [{**row.as_dict(), "reproduce": commands[row]} for row in rows]  # noqa: E731
    doc = {"model": spec.name, "objective": options.objective, "candidates": [list(p) for p in planning.candidates],
           "workload": vars(work), "pricing": options.pricing, "cost_basis": cost_bases(result.machines.values()),
           "recommended": {**shown([answer])[0], "breakdown": breakdown},
           "recommendation": RECOMMENDATION if result.recommended else "the optimum (--any-plan)",
           "best": shown([result.best])[0], "near_count": result.near_count, "ties": shown(result.ties),
           "tie_count": result.tie_count, "per_system": [row.as_dict() for row in result.per_system],
           "memory_headroom": options.memory_headroom, "warnings": _run_warnings(answer, options),
           "top": shown(result.top), **({"pareto": shown(result.pareto)} if pareto else {}),
           "evidence": _evidence_json(result.evidence, timing)}
    if planning.baseline is not None:
        doc["baseline"] = train_comparison(request.baseline, planning.baseline, result.best)
    doc["runs_on"] = training_frameworks(spec, planning.machine_of(answer), answer.plan, work, request.model)
    return doc


def plan_train(db, request, output) -> None:
    from perfmodel.report import train_report, unmeasured_caveat, winner_caveats
    from perfmodel.search.api import plan_train as search

    request, planning = run_search(db, request, output, "training", search, f"planning {request.model}")
    spec, work, options, result = planning.spec, planning.work, planning.options, planning.result
    pareto, timing = output.pareto, output.timing
    answer = planning.recommended
    commands = {row: _train_command(request.model, row, work, options)
                for row in [result.best, answer] + result.ties + result.top + result.pareto}
    shown = lambda rows: [{**row.as_dict(), "reproduce": commands[row]} for row in rows]  # noqa: E731
    bases = cost_bases(result.machines.values())
    machine = planning.machine_of(answer)
    answer_plan = answer.plan
    breakdown = train_report(planning.estimate(answer), machine, spec, answer.plan.dispatcher)
    doc = document(request, planning, commands, breakdown, pareto, timing)
    estimate = lambda: train_doc(spec, machine, answer_plan, work, breakdown)  # noqa: E731
    charts = {"pareto": lambda: {**doc, "pareto": shown(result.pareto)}, "breakdown": estimate, "roofline": estimate,
              "memory": estimate}
    if delivered(doc, output, lambda: _plans_csv(result, answer, options.objective, pareto, commands),
                 charts, "pareto" if pareto else "breakdown",
                 train_export(spec, machine, answer_plan, work, request.model)):
        return
    console.print(f"{spec.display_name or spec.name}: {work.global_batch:,} sequences x {work.seq_len:,} tokens per "
                  f"step" + (f", {count(work.tokens)} tokens" if work.tokens else "") + f"; objective: {options.objective}",
                  style="bold", markup=False)
    same = (answer.plan, answer.system, answer.devices) == (result.best.plan, result.best.system, result.best.devices)
    rows = [("recommended" if result.recommended else "optimum", answer)] + ([] if same else [("fastest", result.best)]
                                                                           if options.objective == "time" else
                                                                           [("optimum", result.best)])
    console.print(_answer_table(rows, work, db))
    for label, row in rows:
        print_command(f"  {label}:", commands[row])
    print_runs_on(doc["runs_on"])
    if len(result.per_system) > 1:
        console.print(_per_system_table(result.per_system, result.machines, db))
    if result.recommended:
        console.print(f"why this plan: {doc['recommendation']} ({result.near_count:,} plans lie within the range, "
                      f"{result.tie_count:,} overlap it); --any-plan recommends the optimum", markup=False, style="dim")
    print_remarks([unmeasured_caveat(m) for m in result.machines.values()] + doc["warnings"]
                   + winner_caveats(answer.system, list(result.machines.values()), options.objective))
    if output.verbose:
        _print_plan_lists(result, commands, work, db, pareto)
    if "baseline" in doc:
        print_baseline(doc["baseline"])
    _print_quantization([answer.plan.precision], "bf16")
    print_bases(bases, options.pricing)
    e = result.evidence
    console.print(f"search: {e.status}{'' if e.gap == 0 else ' (gap ' + gap_text(e.gap) + ')'}, {e.evaluated:,} plans "
                  f"evaluated, {e.feasible:,} fit in HBM with {options.memory_headroom:.0%} headroom"
                  f"{f', {e.feasible_with_offload:,} more with offload' if e.feasible_with_offload else ''}"
                  f"{'' if e.check else '; every listed plan re-checked on its own'}"
                  f"{'' if output.verbose else '; --verbose lists the ties, the top plans and the evidence'}",
                  markup=False, style="dim")
    if output.verbose:
        _print_evidence(e)
        console.print()
        estimate_train_tables(spec, machine, answer_plan, work, breakdown, db)
    else:
        console.print(times_table("recommended plan: step time by component", breakdown["time_components_s"],
                                   breakdown["step_time_s"], breakdown["time_on_link_s"]))
    report_files(doc)


def _run_warnings(row, options) -> list[str]:
    """What makes a plan's run absurd for the request: longer than a year without a deadline."""
    days = (row.run_time_s or 0.0) / 86400.0
    if days > 365 and options.deadline_s is None:
        return [f"the run takes {days:,.0f} days ({days / 365.25:,.1f} years) on {row.devices:,} devices; "
                "--deadline DAYS keeps to plans that finish in time"]
    return []


def _answer_table(rows: list[tuple], work, db) -> Table:
    """The answer (and the fastest plan beside it): where, plan, step with its range, MFU, HBM fill,
    the run's time and cost."""
    table = Table(title="step: prediction and low-high range; HBM: share of device memory used", title_justify="left")
    for col in ("", "plan", "step", "MFU", "HBM", "run", "cost"):
        table.add_column(col, justify="left" if col in ("", "plan") else "right")
    for label, p in rows:
        cost = p.run_cost_usd if p.run_cost_usd else p.cost_per_million_tokens_usd
        table.add_row(f"{label}\n{two_lines_text(fleet_named(db, p.system, p.devices))}", plan_text(p.plan_dict()),
                      f"{seconds_text(p.step_time_s)}\n{span_text(p.step_time_low_s, p.step_time_high_s)}",
                      f"{p.mfu:.0%}", f"{p.hbm_fill:.0%}", _days(p.run_time_s) if work.tokens else "-",
                      usd_text(cost) + ("" if work.tokens else "\nper M tok"))
    return table


def _per_system_table(rows: list, machines: dict, db) -> Table:
    """Each candidate system's best plan, best first: its step, the price per device-hour it pays and
    whether its kernels are measured (what its number rests on)."""
    from perfmodel.economics import run_cost

    table = Table(title="best plan per system", title_justify="left")
    for col in ("system", "plan", "step", "$/device-h", "cost", "kernels"):
        table.add_column(col, justify="left" if col in ("system", "plan", "kernels") else "right")
    for p in rows:
        machine = machines[(p.system, p.devices)]
        hourly = float(run_cost(machine, p.power_w))           # what the plan pays per device-hour
        hourly = hourly if hourly == hourly else None             # unpriced: NaN
        measured = machine.kernels_measured
        table.add_row(fleet_named(db, p.system, p.devices), plan_text(p.plan_dict()), seconds_text(p.step_time_s),
                      usd_text(hourly), usd_text(p.run_cost_usd or p.cost_per_million_tokens_usd),
                      "fitted" if measured else "unmeasured")
    return table


def _days(seconds: float | None) -> str:
    """A run's length: ``19 h``, ``149 d``, ``52 y``."""
    if not seconds:
        return "-"
    hours = seconds / 3600.0
    return f"{hours:.0f} h" if hours < 48 else f"{hours / 24:,.0f} d" if hours < 24 * 730 else f"{hours / 8766:,.0f} y"


def _print_plan_lists(result, commands: dict, work, db, pareto: bool) -> None:
    """--verbose: the ties, the top plans and (with --pareto) the Pareto front, with reproduce commands."""
    cost_label = "run cost, time" if work.tokens else "$/M tokens"
    if result.tie_count:
        shown = f", the first {len(result.ties)}" if result.tie_count > len(result.ties) else ""
        console.print(_plans_table(f"ties: {result.tie_count:,} plans whose predicted range overlaps the optimal "
                                   f"plan's{shown}", result.ties, cost_label, db))
        _print_commands(result.ties, commands)
    else:
        console.print("no other plan's predicted range overlaps the optimal plan's")
    console.print(_plans_table(f"top {len(result.top)} plans", result.top, cost_label, db))
    _print_commands(result.top, commands)
    if pareto:
        console.print(_plans_table("Pareto front (step time, cost per token, energy per token)", result.pareto,
                                   cost_label, db))
        _print_commands(result.pareto, commands)


def _print_evidence(e) -> None:
    """--verbose: the search's evidence table, its validity rules and what its space leaves out."""
    rows = [("declared space (before the validity rules)", f"{e.declared_space:,}"),
            ("lattice plans evaluated", f"{e.evaluated:,}"), ("feasible in HBM", f"{e.feasible:,}"),
            ("feasible with offload (branch and bound)", f"{e.feasible_with_offload:,}"),
            ("CP-SAT models solved", f"{e.cpsat_models:,}")]
    rows += [(f"infeasible: {k}", f"{v:,}") for k, v in e.infeasible_by_constraint.items()]
    rows += [("solver", e.solver), ("status", e.status), ("optimality gap", gap_text(e.gap)),
             ("seconds", f"{e.seconds:.2f}")]
    rows += [("check found", problem) for problem in e.check]
    console.print(kv_table("evidence", rows))
    console.print("validity rules: " + "; ".join(e.rules), markup=False, style="dim")
    console.print("not in the declared space: " + "; ".join(e.left_out), markup=False, style="dim")


def _print_commands(rows: list, commands: dict) -> None:
    for i, row in enumerate(rows, start=1):
        print_command(f"  #{i} reproduce:", commands[row])


def _print_quantization(formats, native: str) -> None:
    from perfmodel.report import quantization_remark

    remark = quantization_remark(formats, native)
    if remark:
        console.print(remark, markup=False, style="yellow")
