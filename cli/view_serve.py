"""``perfmodel plan serve`` and ``perfmodel place-experts``: the deployment, its pools and evidence; the expert
placement and its loads."""

from __future__ import annotations

from .columns import Column, Listed, column, csv_of, csv_only, each_once, listed, rank_column, table_of
from .deliver import delivered, emit_csv, emit_json, report_files
from .render import (Progress, Table, console, cost_bases, fleet_named, fleet_of, fmt, gap_text, kv_table, ms_text,
                     price_flags, print_baseline, print_bases, print_command, print_remarks, print_runs_on,
                     run_search, seconds_text, span_text, times_text, two_lines_text, usd_text)
from .units import count, joules, size, watts


def _serve_command(model_ref: str, pool, demand, options) -> str:
    """The ``perfmodel estimate serve`` command that prints a pool's unloaded numbers: a prefill
    pool's prefill of one p90 prompt per attention rank; a decode or colocated pool's decode step
    at full batch and the p90 context (input p90 + output p90, as --output-len 2 x output p90),
    on the search's framework (its engine's GEMM fits) when it had one."""
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
        price=price_flags(options), expert_balance=options.expert_balance,
        chunk_tokens=c.get("chunk_tokens", 0) if pool.role == "colocated" else 0, framework=options.framework)
    return command(request)


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
                f"{ms_text(capped['ttft_p99_s'])} against {ms_text(free['ttft_p99_s'])} ({times_text(laid['ttft_p99_slowdown'])})")
        console.print(f"  the uncapped optimum, capped: TTFT p99 {ttft}, TPOT p90 "
                      f"{ms_text(capped['tpot_p90_s'])} against {ms_text(free['tpot_p90_s'])} "
                      f"({times_text(laid['tpot_p90_slowdown'])})", markup=False)
    for name, ratio in p["devices_per_budget_vs_tdp"].items():
        console.print(f"  a facility provisioned at the cap holds {ratio:.2f}x the {name} devices it holds at TDP "
                      "(each with its node share)", markup=False)
    if p["demand_per_budget_vs_tdp"] is not None:
        console.print(f"  and carries {p['demand_per_budget_vs_tdp']:.2f}x the demand (at these targets)",
                      markup=False)
    f = p.get("facility")
    if f is not None:
        console.print(f"  capping only when the total exceeds the budget: a facility provisioned for "
                      f"{f['devices_provisioned']:,} devices at TDP ({watts(f['tdp_w_per_device'])} each with its node "
                      f"share) holds {f['devices_held']:,} running the uncapped optimum "
                      f"({f['devices_held_vs_provisioned']:.2f}x; {f['deployment_copies']:,} copies), capping "
                      f"{f['capping_probability']:.2%} of the time (at most {f['capping_risk']:.0%}, "
                      f"--capping-risk): they draw {watts(f['mean_w_per_device'])} each on average", markup=False)


def _pools_fleet(db, pools, two_lines: bool = False) -> str:
    """The devices of ``pools`` by system, as ``units.fleet`` counts them (joined by ``+``)."""
    by_system: dict[str, int] = {}
    for p in pools:
        by_system[p.system] = by_system.get(p.system, 0) + p.devices
    parts = [fleet_named(db, name, n) for name, n in by_system.items()]
    return ("\n+ " if two_lines else " + ").join(two_lines_text(p) if two_lines else p for p in parts)


def _config_text(c: dict) -> str:
    text = (f"tp{c['tp']} pp{c['pp']} ep{c['ep']}"
            + (f" dpa{c['dp_attention']}" if c["dp_attention"] > 1 else "")
            + f" batch {c['batch']} W:{c['weight_precision']} A:{c['activation_precision']} KV:{c['kv_precision']}")
    return text + (f" (KV in {c['kv_place']})" if c["kv_place"] != "hbm" else "") + (
        f" (weights streamed from {c['weight_place']})" if c.get("weight_place", "hbm") != "hbm" else "") + (
        f", prompts in chunks: {c['chunk_tokens']:,} tokens per step" if c.get("chunk_tokens") else "")


def _deployment_json(d, commands: dict | None = None) -> dict:
    """A deployment's JSON: its data, each pool with the ``estimate serve`` command of its unloaded
    numbers where ``commands`` (id of the pool -> command) holds them."""
    data = d.as_dict()
    if commands:
        data["pools"] = [{**p, "reproduce": commands[id(pool)]} for p, pool in zip(data["pools"], d.pools)]
    return data


_DEPLOYMENTS_ORDER = ("#", "pools", "fleet", "TTFT p90", "TPOT p90", "latency", "$/M tok", "energy")


def _deployment_columns(db=None) -> list[Column]:
    """A list of deployments' columns in the CSV's order: rank (the CSV adds the role), mode, each
    pool as instances x devices per instance (``decode 2x8``; the CSV counts the pools), p50 and p90
    latencies, the fleet, power, cost per hour and per million output tokens, energy per output token,
    request latency and what owned devices save; the table shows them in ``_DEPLOYMENTS_ORDER``."""
    def pools(d) -> str:
        mixed = len({p.system for p in d.pools}) > 1
        return "\n".join(f"{p.role} {p.instances:,}x{p.devices_per_instance}" + (f" {p.system}" if mixed else "")
                         for p in d.pools)

    def field(header: str, key: str, text) -> Column:
        return column(header, key, text, value=lambda item: getattr(item.row, key))
    scalars = lambda *keys: csv_only(*keys, value=lambda item, key: getattr(item.row, key))  # noqa: E731
    return [rank_column(whole=False),   # "12 ≈" may wrap its mark
            scalars("mode"),
            Column("pools", lambda item: pools(item.row), lambda item: {"pools": len(item.row.pools)}, justify="left"),
            scalars("ttft_p50_s"), field("TTFT p90", "ttft_p90_s", ms_text),
            scalars("tpot_p50_s"), field("TPOT p90", "tpot_p90_s", ms_text),
            Column("fleet", lambda item: _pools_fleet(db, item.row.pools, two_lines=True) if db else
                   f"{item.row.devices:,}", lambda item: {"devices": item.row.devices}, justify="left"),
            scalars("power_w", "usd_per_hour"), field("$/M tok", "usd_per_million_tokens", usd_text),
            field("energy", "joules_per_token", joules), field("latency", "latency_s", ms_text),
            scalars("owned_saving_usd_per_hour")]


def _deployments_table(title: str, deployments: list, ties: list[bool] | None = None, db=None) -> Table:
    """Deployments, ranked in their list, ties with the optimum marked ≈ (``_deployment_columns``)."""
    return table_of(_deployment_columns(db), listed(deployments, "top", ties),
                    Table(title=title, title_justify="left", pad_edge=False),   # two cells more for mixed pools
                    order=_DEPLOYMENTS_ORDER)


def _capacity(result, demand) -> dict | None:
    """--objective throughput: the rate the fleet carries (and the one it does not) with the tokens per
    second per device of the deployment that carries it; None for the other objectives."""
    if result.capacity is None:
        return None
    carried, not_carried = result.capacity
    devices = result.best.devices
    out = {"requests_per_s": carried, "requests_per_s_not_carried": not_carried,
           "output_tokens_per_s_per_device": carried * demand.output_len.mean / devices,
           "prompt_tokens_per_s_per_device": carried * demand.input_len.mean / devices}
    pools = {p.role: p.devices for p in result.best.pools}
    if "decode" in pools:   # disaggregated: each pool's own rate, as CloudMatrix and SGLang report theirs
        out.update({"prefilled_tokens_per_s_per_prefill_device":
                    carried * demand.input_len.mean * (1.0 - demand.cached_share) / pools["prefill"],
                    "output_tokens_per_s_per_decode_device": carried * demand.output_len.mean / pools["decode"]})
    return out


def _range(value, error) -> str:
    """' (p90 range low-high)' of a predicted latency and its relative error, or '' without one."""
    if value is None or not error:
        return ""
    return f" (p90 range {span_text(value * (1 - error), value * (1 + error))})"


def _same_deployment(a, b) -> bool:
    return a is b or _deployment_json(a) == _deployment_json(b)


def _deployments_csv(result, answer, any_plan: bool, pareto: bool) -> list[dict]:
    """``--csv``: the Pareto front (role ``pareto``, ranked along it), or each deployment once: the answer
    (``recommended``, or ``optimum`` under --any-plan), the optimum if another deployment (``optimum``),
    then the top deployments (``top``); ranks are places in the top list."""
    if pareto:
        return csv_of(_deployment_columns(), listed(result.pareto, "pareto"))
    first = [Listed(None, "optimum" if any_plan else "recommended", answer), Listed(None, "optimum", result.best)]
    return csv_of(_deployment_columns(), each_once(first + listed(result.top, "top"), _same_deployment))


def document(request, planning, commands: dict, pareto: bool, timing: bool) -> dict:
    """``plan serve --json``: the demand, the recommended deployment, the optimum and the top list
    (each pool with the command of its unloaded numbers, from ``commands``), the ties, the Pareto front
    with ``pareto``, the evidence (its seconds only with ``timing``), the quantization remark, and
    where asked the capacity, the baseline comparison and the facility's power; the frameworks that
    run the recommendation."""
    from perfmodel.report import quantization_remark
    from perfmodel.search.api import SERVE_RECOMMENDATION
    from perfmodel.search.baselines import serve_comparison
    from perfmodel.search.serve import serving_ties

    spec, systems, demand, options, result = (planning.spec, planning.systems, planning.demand, planning.options,
                                              planning.result)
    answer, bases = planning.recommended, cost_bases(planning.machines.values())
    evidence = dict(vars(result.evidence))
    if not timing:
        evidence.pop("seconds")
    formats = {f for p in answer.pools for f in (p.config["weight_precision"], p.config["activation_precision"],
                                                      p.config["kv_precision"])}
    remark = quantization_remark(formats, spec.native_precision)
    doc = {"model": spec.name, "systems": systems, "objective": options.objective,
           "demand": {"rate": demand.rate, "input_len": vars(demand.input_len), "output_len": vars(demand.output_len),
                      "slo_s": {k: getattr(demand, k) for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")}},
           "recommended": _deployment_json(answer, commands),
           "recommendation": SERVE_RECOMMENDATION if not request.any_plan else "the optimum (--any-plan)",
           "best": _deployment_json(result.best, commands), "top": [_deployment_json(d, commands) for d in result.top],
           "top_ties": [i for i, t in enumerate(serving_ties(result.best, result.top, options.objective)) if t],
           **({"pareto": [_deployment_json(d, commands) for d in result.pareto]} if pareto else {}),
           "pricing": options.pricing, "cost_basis": bases, "quantization": remark, "evidence": evidence}
    capacity = _capacity(result, demand)
    if capacity:
        doc["capacity"] = capacity
    if planning.baseline is not None:
        doc["baseline"] = {**serve_comparison(request.baseline, planning.baseline, result.best),
                           "objective": options.objective}
    if planning.power_cap is not None:
        doc["power_cap"] = planning.power_cap
    doc["runs_on"] = planning.runs_on
    return doc


def plan_serve(db, request, output) -> None:
    from perfmodel.report import unmeasured_caveat, winner_caveats
    from perfmodel.search.api import plan_serve as search
    from perfmodel.search.serve import deployment_error, serving_ties

    request, planning = run_search(db, request, output, "serving", search, f"planning {request.model} serving")
    spec, demand, options, result = planning.spec, planning.demand, planning.options, planning.result
    pareto, timing = output.pareto, output.timing
    bases = cost_bases(planning.machines.values())
    answer = planning.recommended
    commands = {id(pool): _serve_command(request.model, pool, demand, options)
                for d in [answer, result.best] + result.top + result.pareto for pool in d.pools}
    doc = document(request, planning, commands, pareto, timing)
    capacity = doc.get("capacity")
    export = planning.export
    charts = {"pareto": lambda: {**doc, "pareto": [_deployment_json(d, commands) for d in result.pareto]}}
    if delivered(doc, output, lambda: _deployments_csv(result, answer, request.any_plan, pareto),
                 charts, "pareto", export):
        return
    slo = ", ".join(f"{k.replace('_', ' ')} {ms_text(getattr(demand, k))}" for k in ("ttft_p50", "ttft_p90", "tpot_p50",
                                                                              "tpot_p90") if getattr(demand, k))
    rate = "the most requests/s" if capacity else f"{demand.rate:,.3g} requests/s"
    console.print(f"{spec.display_name or spec.name}: {rate}, prompts {demand.input_len.mean:,.0f} "
                  f"tokens (p90 {demand.input_len.p90:,.0f}), outputs {demand.output_len.mean:,.0f} (p90 "
                  f"{demand.output_len.p90:,.0f}); targets: {slo}; objective: {options.objective}",
                  style="bold", markup=False)
    if capacity:
        console.print(f"capacity: {capacity['requests_per_s']:,.4g} requests/s on at most {options.max_devices:,} "
                      f"devices within the targets ({capacity['requests_per_s_not_carried']:,.4g} are not carried): "
                      f"{capacity['output_tokens_per_s_per_device']:,.0f} output and "
                      f"{capacity['prompt_tokens_per_s_per_device']:,.0f} prompt tokens/s per device of the "
                      f"{result.best.devices:,} it uses" + (
                          f"; {capacity['prefilled_tokens_per_s_per_prefill_device']:,.0f} prefilled per prefill "
                          f"device, {capacity['output_tokens_per_s_per_decode_device']:,.0f} output per decode device"
                          if "output_tokens_per_s_per_decode_device" in capacity else ""), style="bold", markup=False)
    best = answer
    console.print(f"recommended deployment: {best.mode}" + ("" if answer is result.best else
                  f", {_deployment_line(answer, options.objective)} (the optimum, "
                  f"{_deployment_line(result.best, options.objective)}, runs on no framework as written)"), style="bold")
    for p in best.pools:
        console.print(kv_table(
            f"{p.role} pool: {_pools_fleet(db, [p])} as {p.instances:,} instance{'s' if p.instances > 1 else ''} "
            f"of {p.devices_per_instance}",
            [("instance", _config_text(p.config)),
             ("TTFT p50 / p90", f"{ms_text(p.ttft_p50_s)} / {ms_text(p.ttft_p90_s)}" + _range(p.ttft_p90_s, p.ttft_error)),
             ("TPOT p50 / p90", f"{ms_text(p.tpot_p50_s)} / {ms_text(p.tpot_p90_s)}" + _range(p.tpot_p90_s, p.tpot_error)),
             ("requests/s it carries", fmt(p.requests_per_s)), ("HBM per device", size(p.hbm_used_bytes)),
             ("power", watts(p.power_w)), ("cost", usd_text(p.usd_per_hour) + (" per hour" if p.usd_per_hour else "")),
             (("prefill p90, unloaded" if p.role == "prefill" else "decode step p90, full batch, unloaded"),
              ms_text(p.prefill_p90_s if p.role == "prefill" else p.step_p90_s))]))
        print_command("  reproduce (unloaded):", commands[id(p)])
    console.print(kv_table("fleet", [("devices", _pools_fleet(db, best.pools)),
                                      ("request latency (TTFT p90 + mean output x TPOT p90)",
                                       ms_text(best.latency_s)),
                                      ("power (IT, with node share)", watts(best.power_w)),
                                      ("cost per hour", usd_text(best.usd_per_hour) + (
                                          " (owned " + ", ".join(f"{n:,} x {k}" for k, n in best.owned_used.items())
                                          + f": {usd_text(best.owned_saving_usd_per_hour)} below their market price)"
                                          if best.owned_used else "")),
                                      ("cost per million output tokens", usd_text(best.usd_per_million_tokens)),
                                      ("energy per output token (with PUE)", joules(best.joules_per_token))]))
    print_runs_on(doc["runs_on"])
    print_remarks([unmeasured_caveat(planning.machines[p.system], serving=True) for p in best.pools]
                   + [c for p in best.pools for c in winner_caveats(p.system, list(planning.machines.values()),
                                                                    options.objective)])
    ties = serving_ties(result.best, result.top, options.objective)
    if output.verbose:
        console.print(_deployments_table(f"top {len(result.top)} single-configuration deployments", result.top,
                                         ties, db))
        for i, d in enumerate(result.top, start=1):
            for pool in d.pools:
                print_command(f"  #{i} {pool.role}:", commands[id(pool)])
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
    rows += [("queueing", e.queueing), ("solver", e.solver), ("status", e.status), ("optimality gap", gap_text(e.gap)),
             ("seconds", f"{e.seconds:.2f}")]
    if output.verbose:
        console.print(kv_table("evidence", rows))
    else:
        console.print(f"search: {e.status}, {e.configurations:,} instance configurations evaluated; --verbose "
                      "lists the top deployments and the evidence", markup=False, style="dim")
    if doc["quantization"]:
        console.print(doc["quantization"], markup=False, style="yellow")
    if "baseline" in doc:
        print_baseline(doc["baseline"])
    if "power_cap" in doc:
        _print_power_cap(doc["power_cap"])
    print_bases(bases, options.pricing)
    report_files(doc)


def _deployment_line(d, objective: str) -> str:
    """A deployment's objective in a few words: ``$31.9 per hour``, ``22.3 s latency``."""
    return {"cost": lambda: f"{usd_text(d.usd_per_hour)} per hour", "energy": lambda: f"{watts(d.power_w)}",
            "devices": lambda: f"{d.devices:,} devices", "latency": lambda: f"{ms_text(d.latency_s)} latency",
            "throughput": lambda: f"{d.devices:,} devices"}[objective]()


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
    coactivation = placed.coactivation.as_dict() if placed.coactivation is not None else None
    rerouting = _rerouting_doc(placed, rows)
    if output.csv_out and not output.json_out:
        emit_csv([{"method": name, **r} for name, r in rows.items()])
        return
    if output.json_out:
        doc = {"model": spec.name, "system": machine.system.name, "placement": best.as_map(),
               "methods": rows, "improvement": improvement, "evidence": evidence, "coactivation": coactivation}
        emit_json({**doc, "rerouting": rerouting} if rerouting is not None else doc)
        return
    console.print(f"{spec.display_name or spec.name}: {problem.stats.layers} MoE layers x {problem.stats.experts} "
                  f"experts on {fleet_of(problem.devices, machine.system, machine.accelerator, db)}, "
                  f"{machine.accelerator.name}, {problem.slots} slots per device, {problem.replicas} replicas per layer",
                  style="bold", markup=False)
    table = Table(title="placements compared (tokens per layer pair summed over layers)", title_justify="left")
    for col in ("method", "load max / mean", "busiest device tokens", "tokens crossing devices",
                "tokens crossing nodes", "predicted MoE time", "gap to bound"):
        table.add_column(col, justify="left" if col == "method" else "right", whole=col == "method" or None)
    for name, r in rows.items():
        table.add_row(name, f"{r['imbalance']:.3f}", count(r["max_load_tokens"]), count(r["cross_device_tokens"]),
                      count(r["cross_node_tokens"]), seconds_text(r["predicted_moe_time_s"]), f"{r['gap_to_bound']:.2%}")
    console.print(table)
    base, cp, greedy = rows["round-robin"], rows["affinity"], rows["greedy"]

    def fewer(tokens: str) -> str:
        pair = improvement[f"{tokens}_vs_round_robin"], improvement[f"{tokens}_vs_greedy"]
        return "n/a (no transition counts)" if pair[0] is None else f"{pair[0]:.1%} / {pair[1]:.1%}"

    console.print(kv_table("improvement of affinity", [
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
    console.print(kv_table("evidence", rows_))
    _print_coactivation(coactivation, request.routing)
    _print_rerouting(rerouting)
    console.print("--json writes the placement map: layer -> expert -> devices", style="dim")


def _rerouting_doc(placed, rows) -> dict | None:
    """LLEP over contiguous experts against the static placements (None without --reroute)."""
    r = placed.rerouting
    if r is None:
        return None
    llep_s = placed.predicted_moe_time_s("least-loaded")
    memory = placed.expert_memory()
    rule = r.rule
    return {"rule": {"capacity": rule.capacity, "min_tokens": rule.min_tokens, "threshold": rule.threshold},
            "imbalance": r.imbalance, "max_load_tokens": float(r.max_load.mean()),
            "predicted_moe_time_s": llep_s, "layers_rerouted": r.layers_rerouted, "moved_tokens": r.moved_tokens,
            "foreign_experts_max": r.foreign_max,
            "speedup_vs_round_robin": rows["round-robin"]["predicted_moe_time_s"] / llep_s,
            "speedup_vs_affinity": rows["affinity"]["predicted_moe_time_s"] / llep_s,
            "memory": memory.as_dict(),
            "memory_vs_round_robin": memory.least_loaded / memory.standard_ep if memory.standard_ep else None}


def _print_coactivation(c: dict | None, routing: str | None) -> None:
    if c is None:
        console.print("co-activation: n/a (no transition counts)", style="dim")
        return
    where = f"measured from {routing}" if routing else "measured from the synthetic statistics"
    console.print(kv_table(f"co-activation between layers ({where})", [
        ("tokens to their expert's most likely successor", f"{c['affinity']:.1%} (independent layers: "
                                                           f"{c['independent']:.1%}, {c['lift']:.2f}x)"),
        (f"to one of its {c['slots']} most likely (a device's slots)",
         f"{c['reach']:.1%} (independent layers: {c['reach_independent']:.1%})")]))


def _print_rerouting(r: dict | None) -> None:
    if r is None:
        return
    mib = 2.0 ** 20
    memory = r["memory"]
    console.print(kv_table("least-loaded rerouting (LLEP) over round-robin", [
        ("rule", f"alpha {r['rule']['capacity']:g}, m {r['rule']['min_tokens']:,.0f} tokens, "
                 f"lambda {r['rule']['threshold']:g}"),
        ("layers rerouted", f"{r['layers_rerouted']}; {count(r['moved_tokens'])} tokens moved, at most "
                            f"{r['foreign_experts_max']} foreign experts on a device"),
        ("load max / mean", f"{r['imbalance']:.3f}"),
        ("predicted MoE time", f"{seconds_text(r['predicted_moe_time_s'])}: speedup {r['speedup_vs_round_robin']:.2f}x "
                               f"over round-robin, {r['speedup_vs_affinity']:.2f}x over affinity"),
        ("peak memory per device beyond own experts",
         f"{memory['least_loaded_bytes'] / mib:,.0f} MiB (round-robin {memory['standard_ep_bytes'] / mib:,.0f}, "
         f"affinity with replicas {memory['replicas_bytes'] / mib:,.0f})")]))
