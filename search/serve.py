"""Serving deployments under latency SLOs: colocated or disaggregated prefill and decode pools,
instance configurations, instance counts and hardware per pool, at minimum cost (or energy, or
devices).

1. Instance configurations (TP, PP, EP, attention DP, batch, weight / activation / KV precision,
   KV cache in HBM or host memory) are evaluated per system in vectorized calls of the cost model:
   prefill at one prompt per attention rank, decode at each batch.
2. Queueing (perfmodel.queueing, the stated approximation): an M/M/c queue per prefill server
   pool (Erlang C), Little's law for decode slots, time sharing when colocated.
3. The fewest instances meeting every SLO are found per configuration (the SLOs are monotone in
   the count); the deployment is an integer program (CP-SAT) choosing one colocated pool, or one
   prefill and one decode pool (possibly on different hardware, with the KV transfer between them
   over the real link), under budget, power and device limits.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.hardware_db.errors import InfeasibleError, SpecError, UnknownNameError
from perfmodel.hardware_db.loader import Database
from perfmodel.machine import Machine, build_machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import QuantScheme
from perfmodel.queueing import pool_latencies, pool_shares
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving, estimate_serving_placed, kv_transfer_time

from . import fleet
from .fleet import FleetInstance, FleetSolution, single_pool_solutions
from .options import Demand, ServeSearchOptions
from .pareto import pareto_front
from .placement import imbalance_table
from .vocabulary import SERVE_MODES as MODES
from .vocabulary import SERVE_OBJECTIVES as OBJECTIVES

MAX_INSTANCES = 1 << 20
# Weights stream from a memory tier each step only where it reads at least this share of HBM's
# bandwidth (a pooled tier such as FengHuang's); over a PCIe path (DDR, CXL: 1-3% of HBM) every
# decode step would take 30-100x its HBM time. A declared bound of the searched space.
STREAMING_TIER = 0.25


@dataclass
class Pool:
    """One pool of identical instances."""

    role: str                 # "colocated", "prefill" or "decode"
    system: str
    accelerator: str
    instances: int
    devices_per_instance: int
    config: dict
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    requests_per_s: float     # what the pool can carry at its SLOs
    hbm_used_bytes: float
    power_w: float            # all devices of the pool, with their node share
    usd_per_hour: float | None
    ttft_error: float = 0.0   # relative half-width of the TTFT and TPOT prediction intervals
    tpot_error: float = 0.0
    prefill_p90_s: float = 0.0   # unloaded: one p90 prompt per attention rank (no queueing, no KV hand-over)
    step_p90_s: float = 0.0      # unloaded: the decode step at full batch and the p90 context
    reproduce: str = ""          # the ``perfmodel estimate serve`` command of its unloaded numbers (CLI)

    @property
    def devices(self) -> int:
        return self.instances * self.devices_per_instance


@dataclass
class Deployment:
    mode: str
    pools: list[Pool]
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    devices: int
    power_w: float
    usd_per_hour: float | None
    usd_per_million_tokens: float | None
    joules_per_token: float
    latency_s: float = 0.0        # TTFT p90 + mean output tokens x TPOT p90 (search.fastest.LATENCY)
    owned_used: dict = field(default_factory=dict)   # system -> owned devices the fleet runs on
    owned_saving_usd_per_hour: float = 0.0           # what they save against the market price (in usd_per_hour)


@dataclass
class ServeEvidence:
    configurations: int
    feasible_configurations: int
    pool_options: int
    pairs_checked: int
    infeasible_by_constraint: dict[str, int]
    solver: str
    status: str
    gap: float
    seconds: float
    queueing: str = ("M/M/c (Erlang C) per prefill server; Little's law for decode slots; "
                     "chunked-prefill time sharing when colocated")


@dataclass
class ServeSearchResult:
    best: Deployment | None
    top: list[Deployment]
    pareto: list[Deployment]
    evidence: ServeEvidence
    closest: str = ""


# --- queueing -----------------------------------------------------------------------------------

# --- instance configurations --------------------------------------------------------------------

def _layouts(spec: TransformerSpec, machine: Machine, max_devices: int, framework: str | None = None,
             baseline: str | None = None):
    """(tp, pp, dp_attention, ep) of instances up to ``max_devices`` devices on this system (that
    ``framework`` runs, and that the heuristic ``baseline`` holds, when named)."""
    if baseline is not None:
        from .baselines import serve_layout_ok

        per_node = machine.system.devices_per_node
        return [lay for lay in _layouts(spec, machine, max_devices, framework)
                if serve_layout_ok(baseline, per_node, *lay)]
    if framework is not None:
        from perfmodel.exports.serving import layout_problem

        return [lay for lay in _layouts(spec, machine, max_devices) if layout_problem(framework, *lay) is None]
    out = []
    sizes = [2 ** k for k in range(0, 20) if 2 ** k <= min(max_devices, machine.devices)]
    for d in sizes:
        for tp in [t for t in sizes if t <= min(d, machine.scale_up_domain) and spec.num_heads % t == 0]:
            for pp in (1, 2, 4):
                if d % (tp * pp) or pp > spec.num_layers:
                    continue
                dpa = d // (tp * pp)
                if dpa > 1 and not spec.mla:      # attention data parallelism: MLA deployments
                    continue
                # Experts fold over the stage's tp x dp_attention devices: all of them TP-split
                # (ep 1), expert-parallel across the TP group, or across every device.
                # Above the routed experts, EP holds redundant copies of hot experts (one slot per device).
                eps = [1] if not spec.moe else sorted({1, tp * dpa} | ({tp} if tp <= spec.moe.num_experts else set()))
                for ep in eps:
                    out.append((tp, pp, dpa, ep))
    return out


def _precision_combos(machine: Machine, options: ServeSearchOptions, native: str = "bf16"):
    """(weight, activation, KV) formats the options allow, the device can run (QuantScheme's rules)
    and the framework, when one is named, serves."""
    if options.framework is not None:
        from perfmodel.exports.serving import format_problem

        return [c for c in _precision_combos(machine, replace(options, framework=None))
                if format_problem(options.framework, *c, native) is None]
    combos = []
    for wp, ap, kvp in itertools.product(options.weight_precisions, options.activation_precisions,
                                         options.kv_precisions):
        try:
            scheme = QuantScheme(wp, ap, kvp, machine.math16)
        except SpecError:
            continue      # a pairing no kernel runs (e.g. W:bf16 with A:a8)
        if scheme.runs_on(machine.supports):
            combos.append((wp, ap, kvp))
    return combos


def _half_width(interval, value) -> np.ndarray:
    """(high - low) / 2 over the value: a prediction interval's relative half-width."""
    low, high = (np.asarray(x, dtype=float) for x in interval)
    return np.where(np.asarray(value) > 0, (high - low) / 2.0 / np.maximum(value, 1e-30), 0.0)


def _evaluate_system(spec, machine: Machine, demand: Demand, options: ServeSearchOptions, counter: dict):
    layouts = _layouts(spec, machine, options.max_instance_devices, options.framework, options.baseline)
    places = ["hbm"] + ([t.kind for t in machine.memory_tiers if t.kind in ("ddr", "cxl", "pooled")]
                        if options.kv_offload else [])
    weight_places = ["hbm"] + ([t.kind for t in machine.memory_tiers if t.kind in ("ddr", "cxl", "pooled")
                                and t.read_bytes_per_s >= STREAMING_TIER * machine.hbm_bytes_per_s]
                               if options.weight_offload else [])
    rows: dict[str, list] = {k: [] for k in ("tp", "pp", "dpa", "ep", "batch", "wp", "ap", "kvp", "kv_place", "w_place",
                                             "devices", "prefill_s50", "prefill_s90", "tpot50", "tpot90",
                                             "hbm", "power_w", "prefill_power_w", "feasible_decode",
                                             "feasible_prefill",
                                             "ttft_error", "tpot_error")}
    if not layouts:
        return rows
    lay = np.array(layouts, dtype=float)
    skew = _skew(spec, machine, options, lay[:, 3])
    native = "bf16" if spec.native_precision == "fp16" else spec.native_precision
    # Decode: every batch of every layout. The step's mean context is input + output / 2, so
    # output = 2 x (context - input) reproduces it.
    grid_rows = [(i, b) for i, l in enumerate(layouts) for b in options.batches if b % l[2] == 0]
    pre_i = np.array([i for i, _ in grid_rows])
    grid = np.column_stack([lay[pre_i], [b for _, b in grid_rows]]).astype(float)
    n_lay, n_grid = len(lay), len(grid)

    def stacked(values, n):
        """The p50 rows, then the p90 rows: both quantiles in one vectorized estimate."""
        return np.repeat(np.asarray(values, dtype=float), n)

    p50, p90 = pre_i, n_lay + pre_i
    for wp, ap, kvp in _precision_combos(machine, options, native):
        # Prefill: one prompt per attention rank, at the p50 and p90 prompt lengths (the KV's place
        # does not change it; the weights' does).
        n_in = stacked((demand.input_len.p50, demand.input_len.p90), n_lay)
        both = np.tile(lay, (2, 1))
        # The phases' times do not depend on where the KV cache and weights live: one evaluation
        # per phase for every place (estimate_serving_placed).
        prefill = dict(zip(weight_places, estimate_serving_placed(spec, machine, ServePlan(
            tp=both[:, 0], pp=both[:, 1], dp_attention=both[:, 2], ep=both[:, 3], batch=both[:, 2], weight_precision=wp,
            activation_precision=ap, kv_precision=kvp, moe_imbalance=np.tile(skew, 2),
            expert_balance=options.expert_balance,
            mtp_draft_tokens=options.mtp_draft_tokens, mtp_acceptance=options.mtp_acceptance,
            power_cap_w=options.device_power_cap_w), ServeWorkload(n_in, 1, demand.cached_share * n_in),
            [("hbm", w_place) for w_place in weight_places], phases=("prefill",))))
        both = np.tile(grid, (2, 1))
        plan = ServePlan(tp=both[:, 0], pp=both[:, 1], dp_attention=both[:, 2], ep=both[:, 3],
                         batch=both[:, 4], weight_precision=wp, activation_precision=ap, kv_precision=kvp,
                         moe_imbalance=np.tile(skew[pre_i], 2), power_cap_w=options.device_power_cap_w,
                         expert_balance=options.expert_balance,
                         mtp_draft_tokens=options.mtp_draft_tokens, mtp_acceptance=options.mtp_acceptance)
        placed = list(itertools.product(places, weight_places))
        decodes = estimate_serving_placed(spec, machine, plan, ServeWorkload(
            stacked((demand.input_len.p50, demand.input_len.p90), n_grid),
            stacked((2 * demand.output_len.p50, 2 * demand.output_len.p90), n_grid)), placed, phases=("decode",))
        for (place, w_place), dec in zip(placed, decodes):
            pre = prefill[w_place]
            d50, d90 = np.arange(n_grid), n_grid + np.arange(n_grid)
            for name, values in (("tp", grid[:, 0]), ("pp", grid[:, 1]), ("dpa", grid[:, 2]), ("ep", grid[:, 3]),
                                 ("batch", grid[:, 4]), ("devices", grid[:, 0] * grid[:, 1] * grid[:, 2]),
                                 ("prefill_s50", pre.ttft_s[p50]), ("prefill_s90", pre.ttft_s[p90]),
                                 ("tpot50", dec.tpot_s[d50]), ("tpot90", dec.tpot_s[d90]),
                                 ("hbm", dec.hbm_used_bytes[d90]), ("power_w", dec.power_w[d50]),
                                 ("prefill_power_w", pre.prefill_power_w[p50]),
                                 ("feasible_decode", dec.feasible[d90]),
                                 ("feasible_prefill", pre.feasible[p90]),
                                 # Relative half-widths of the prediction intervals (Machine.interval).
                                 ("ttft_error", _half_width(pre.ttft_range_s, pre.ttft_s)[p90]),
                                 ("tpot_error", _half_width(dec.tpot_range_s, dec.tpot_s)[d90])):
                rows[name].append(np.asarray(values))
            for name, value in (("wp", wp), ("ap", ap), ("kvp", kvp), ("kv_place", place), ("w_place", w_place)):
                rows[name].append(np.full(n_grid, value, dtype=object))
            for b in dec.binding[d90][~dec.feasible[d90]].tolist():
                counter[f"instance: {b}"] = counter.get(f"instance: {b}", 0) + 1
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in rows.items()}


# --- pool sizing --------------------------------------------------------------------------------

def _fewest(ok, rows: int, upper: int, lower=None) -> np.ndarray:
    """Smallest count in [1, upper] for which ``ok(count, rows)`` holds, per row; 0 where even
    ``upper`` fails. ``ok(n, idx)`` says, for the rows ``idx``, whether ``n[i]`` instances meet the
    targets.

    Assumes ``ok`` is monotone in the count (more instances never break a target: the load K / n
    falls, and the M/M/c wait falls with the servers); the answer is then the same as bisecting
    [1, upper]. ``lower`` (optional, per row) is a count below which ``ok`` is known to fail (the
    stability bound), where the search starts: it gallops upward from there, probing lower,
    lower + 1, lower + 3, lower + 7, ... (exponential search; Bentley and Yao, "An almost optimal
    algorithm for unbounded searching", Inf. Proc. Lett. 5(3), 1976) until a probe holds, then
    bisects inside the bracket, each step only on the rows still open. Rows near their bound
    settle in a few probes instead of log2(upper) full passes."""
    all_rows = np.arange(rows)
    feasible = ok(np.full(rows, upper, dtype=np.int64), all_rows)
    lo = np.ones(rows, dtype=np.int64) if lower is None else \
        np.clip(np.asarray(lower, dtype=np.int64), 1, upper)
    hi = np.full(rows, upper, dtype=np.int64)      # ok(hi) holds wherever feasible
    # Galloping: ok fails below lo; probe lo + step - 1 with the step doubling.
    open_ = all_rows[feasible & (lo < hi)]
    step = 1
    while len(open_):
        probe = np.minimum(lo[open_] + (step - 1), hi[open_])
        good = ok(probe, open_)
        hi[open_[good]] = probe[good]
        lo[open_[~good]] = probe[~good] + 1
        open_ = open_[~good & (lo[open_] < hi[open_])]
        step *= 2
    # Bisection inside [lo, hi]: ok fails below lo and holds at hi.
    open_ = all_rows[feasible & (lo < hi)]
    while len(open_):
        mid = (lo[open_] + hi[open_]) // 2
        good = ok(mid, open_)
        hi[open_[good]] = mid[good]
        lo[open_[~good]] = mid[~good] + 1
        open_ = open_[lo[open_] < hi[open_]]
    return np.where(feasible, hi, 0)


def _sizes(cols, demand: Demand, role: str, slo: dict, max_instances: int):
    """Fewest instances per configuration meeting the SLOs in ``role``, with the pool's latencies."""
    lam, out_mean = demand.rate, demand.output_len.mean
    keys = ("batch", "dpa", "prefill_s50", "prefill_s90", "tpot50", "tpot90")

    def latencies(n, quantiles=(0.5, 0.9), rows=slice(None)):
        return pool_latencies(role, n, lam, out_mean, *(cols[k][rows] for k in keys), quantiles)

    # The quantiles the targets ask for (p90 always: it also decides whether the queue is stable).
    asked = (0.9,) + ((0.5,) if slo["ttft_p50"] is not None else ())

    def ok(n, rows):
        ttft, tpot50, tpot90, load, in_flight = latencies(n, asked, rows)
        good = load < 1.0
        if role != "decode":
            good &= np.isfinite(ttft[0.9])
            if slo["ttft_p50"] is not None:
                good &= ttft[0.5] <= slo["ttft_p50"]
            if slo["ttft_p90"] is not None:
                good &= ttft[0.9] <= slo["ttft_p90"]
        if role != "prefill":
            good &= in_flight <= cols["batch"][rows]      # a slot for every sequence in flight
            if slo["tpot_p50"] is not None:
                good &= tpot50 <= slo["tpot_p50"]
            if slo["tpot_p90"] is not None:
                good &= tpot90 <= slo["tpot_p90"]
        return good

    n = _fewest(ok, len(cols["batch"]), max_instances, _stability_bound(cols, lam, out_mean, role))
    ttft, tpot50, tpot90, _, _ = latencies(np.maximum(n, 1))
    return n, ttft[0.5], ttft[0.9], tpot50, tpot90


def _stability_bound(cols, rate: float, output_mean: float, role: str) -> np.ndarray:
    """A count below which no pool is stable: a pool of n instances runs at load K / n
    (perfmodel.queueing.pool_shares) and needs load < 1, so n > K. Rounded down with a relative
    margin of 1e-9 so that float rounding of the load never puts the bound above the true smallest
    count (``_fewest`` only starts its search there)."""
    with np.errstate(all="ignore"):
        k = np.add(*pool_shares(role, 1.0, rate, output_mean, cols["batch"], cols["dpa"], cols["prefill_s50"],
                                cols["tpot50"])) * np.ones(len(cols["batch"]))
        k = np.where(np.isfinite(k), k * (1.0 - 1e-9), 1.0)
    return np.floor(np.clip(k, 1.0, float(MAX_INSTANCES))).astype(np.int64)


# --- the deployment -----------------------------------------------------------------------------

def slo_of(demand: Demand) -> dict:
    return {"ttft_p50": demand.ttft_p50, "ttft_p90": demand.ttft_p90, "tpot_p50": demand.tpot_p50,
            "tpot_p90": demand.tpot_p90}


@dataclass
class PoolOptions:
    """Every non-dominated pool option of every candidate system, sized to its SLOs."""

    options: list[dict]
    machines: dict[str, Machine]
    counter: dict[str, int]
    configurations: int
    feasible: int
    fastest: dict = None          # the best TPOT p90 and prefill p90 any instance that fits reaches


def pool_options(spec: TransformerSpec, db: Database, systems: list[str], demand: Demand,
                 options: ServeSearchOptions, progress=None) -> PoolOptions:
    """Evaluate every instance configuration of every system and size each role's pools;
    ``progress`` is called with the number of systems evaluated."""
    slo = slo_of(demand)
    counter: dict[str, int] = {}
    options_list: list[dict] = []
    configurations = feasible_configs = 0
    machines = {}
    fastest: dict = {}
    limits = dict(options.limits)
    for k, name in enumerate(systems):
        max_devices = min(options.max_devices or 10_000_000, limits.get(name, 10_000_000))
        if progress is not None and k:
            progress(k)
        base = db.system(name)
        # Size the system to what a fleet may use: the device limit, or a generous default.
        devices = min(max_devices, max(base.devices, options.max_instance_devices))
        machine = build_machine(db, name, devices - devices % base.devices_per_node or base.devices_per_node,
                                options.pricing, options.prices)
        machines[name] = machine
        cols = _evaluate_system(spec, machine, demand, options, counter)
        if not len(cols.get("tp", [])):
            continue
        configurations += len(cols["tp"])
        for key, ok, value in (("tpot_p90", cols["feasible_decode"], cols["tpot90"]),
                               ("prefill_p90", cols["feasible_prefill"], cols["prefill_s90"])):
            if ok.any():
                fastest[key] = min(fastest.get(key, np.inf), float(value[ok].min()))
        price = _device_hour_usd(machine, cols["power_w"])
        for role in (("colocated",) if "colocated" in options.modes else ()) + \
                (("prefill", "decode") if "disaggregated" in options.modes else ()):
            added, n_fit, n_unfit = _pool_options(role, name, cols, price, demand, slo, options, max_devices)
            options_list += added
            feasible_configs += n_fit
            if n_unfit:
                key = f"{role}: SLO or rate not met by any instance count"
                counter[key] = counter.get(key, 0) + n_unfit
    for o in options_list:
        o["accelerator"] = machines[o["system"]].accelerator.name
        o["capacity"] = demand.rate / o["instances"]   # requests/s one instance carries within its SLOs
    return PoolOptions(options_list, machines, counter, configurations, feasible_configs, fastest)


def search_serving(spec: TransformerSpec, db: Database, systems: list[str], demand: Demand,
                   options: ServeSearchOptions = ServeSearchOptions(), progress=None) -> ServeSearchResult:
    """The cheapest (or most frugal) deployment meeting the demand and SLOs, with evidence.
    ``progress`` is called with the steps done of len(systems) + 1 (each system, then the fleet)."""
    if options.objective not in OBJECTIVES:
        raise UnknownNameError("objective", options.objective, OBJECTIVES)
    for mode in options.modes:
        if mode not in MODES:
            raise UnknownNameError("mode", mode, MODES)
    if not demand.rate > 0:
        raise SpecError(f"the request rate needs to be positive, has {demand.rate:g}")
    started = time.perf_counter()
    slo = slo_of(demand)
    pools = pool_options(spec, db, systems, demand, options, progress)
    if progress is not None:
        progress(len(systems))
    options_list, machines, counter = pools.options, pools.machines, pools.counter
    configurations, feasible_configs = pools.configurations, pools.feasible
    if options.objective == "latency":
        return _fastest(spec, demand, pools, options, started)
    instance, pairs_checked = fleet_instance(spec, demand, options_list, machines, slo, options)
    evidence = ServeEvidence(
        configurations=configurations, feasible_configurations=feasible_configs, pool_options=len(options_list),
        pairs_checked=pairs_checked, infeasible_by_constraint=dict(sorted(counter.items())),
        solver=_solver_text(fleet.PROGRAM),
        status="INFEASIBLE", gap=0.0, seconds=0.0)
    if not options_list:
        evidence.seconds = time.perf_counter() - started
        return ServeSearchResult(None, [], [], evidence,
                                 closest=_closest(counter, pools.fastest, demand, options.max_devices))
    if not any(np.isfinite(instance.per_instance(i)) for i in range(len(options_list))):
        from perfmodel.power import cost_basis

        raise SpecError("no candidate system has a price on this basis, so no cost can be minimized ("
                        + "; ".join(cost_basis(m) for m in machines.values())
                        + "); or use --pricing owned, or --objective energy or devices")
    singles = single_pool_solutions(instance)
    best = fleet.solve(instance)
    if best is not None:
        evidence.solver = _solver_text(best.method)
    best, evidence.status, evidence.gap = _checked_best(instance, best, singles)
    evidence.seconds = time.perf_counter() - started
    if best is None:
        return ServeSearchResult(None, [], [], evidence, closest=_binding_limits(instance) or
                                 _closest(counter, pools.fastest, demand, options.max_devices))
    listed = _listed(instance, singles, demand, options.top)
    to_deployment = lambda s: _deployment(instance, s, demand)  # noqa: E731
    return ServeSearchResult(best=to_deployment(best), top=[to_deployment(s) for s in listed["top"]],
                             pareto=[to_deployment(s) for s in listed["pareto"]], evidence=evidence)


def _fastest(spec, demand: Demand, pools: PoolOptions, options: ServeSearchOptions, started: float
             ) -> ServeSearchResult:
    """``--objective latency``: the fastest deployment on the fleet of ``options.max_devices``
    (search.fastest), every listed one checked independently."""
    from . import fastest

    opts, slo = pools.options, slo_of(demand)
    prefill = [i for i, o in enumerate(opts) if o["role"] == "prefill"]
    decode = [i for i, o in enumerate(opts) if o["role"] == "decode"]
    handover, times = [], {}
    for p, d in itertools.product(prefill, decode):
        if opts[p]["kvp"] == opts[d]["kvp"]:
            handover.append((p, d, _kv_ok(spec, demand, opts[p], opts[d], pools.machines, slo, times)[1]))
    instance = fastest.FastestInstance(tuple(opts), demand.rate, demand.output_len.mean, slo, options.max_devices,
                                       options.power_cap_w, options.budget_usd_per_hour, tuple(handover))
    found = fastest.solve(instance)
    evidence = ServeEvidence(configurations=pools.configurations, feasible_configurations=pools.feasible,
                             pool_options=len(opts), pairs_checked=len(handover),
                             infeasible_by_constraint=dict(sorted(pools.counter.items())),
                             solver=fastest.SOLVER, status="INFEASIBLE", gap=0.0, seconds=0.0)

    def deployment(solution) -> Deployment | None:
        sized, kv = fastest.sized(instance, solution)
        fi = FleetInstance(options=sized, objective="devices", max_devices=options.max_devices,
                           power_cap_w=options.power_cap_w, budget_usd_per_hour=options.budget_usd_per_hour,
                           handover=kv)
        fs = FleetSolution(0, ((1, sized[1]["instances"]),) if len(sized) == 2 else ())
        if fastest.check(instance, solution) or fleet.check(fi, fs):
            return None
        return _deployment(fi, fs, demand)

    best = deployment(found[0]) if found else None
    evidence.status = "OPTIMAL" if best is not None else "FEASIBLE"
    if best is None:   # the fastest failed its check: the fastest checked one, merely FEASIBLE
        best = next((d for d in map(deployment, found[1:50]) if d is not None), None)
    evidence.seconds = time.perf_counter() - started
    if best is None:
        closest = (f"no deployment meets the targets on {options.max_devices:,} devices"
                   + (" within the power cap and budget" if options.power_cap_w or options.budget_usd_per_hour else "")
                   + "; " + _closest(pools.counter, pools.fastest, demand, options.max_devices)) if opts else \
            _closest(pools.counter, pools.fastest, demand, options.max_devices)
        evidence.status = "INFEASIBLE"
        return ServeSearchResult(None, [], [], evidence, closest=closest)
    top = [d for d in map(deployment, found[:options.top]) if d is not None]
    tokens_per_hour = demand.rate * demand.output_len.mean * 3600.0
    keys = []
    for s in found:
        parts = [(opts[s.front], s.front_count)] + ([(opts[s.decode], s.decode_count)] if s.decode is not None else [])
        usd = [None if o["usd_per_hour"] is None else o["usd_per_hour"] / o["instances"] * n for o, n in parts]
        power = sum(o["power_w"] / o["instances"] * n for o, n in parts)
        keys.append([np.inf if None in usd else sum(usd) / tokens_per_hour * 1e6, s.latency_s,
                     power * 3600.0 / tokens_per_hour])
    front = pareto_front(np.array(keys)) if keys else np.zeros(0, dtype=int)
    pareto = [d for d in (deployment(found[i]) for i in sorted(front, key=lambda i: keys[i][1])) if d is not None]
    return ServeSearchResult(best=best, top=top, pareto=pareto, evidence=evidence)


def fleet_instance(spec, demand: Demand, options_list: list[dict], machines, slo, options: ServeSearchOptions
                   ) -> tuple[FleetInstance, int]:
    """The fleet program's instance (and the prefill / decode pairs examined for the KV hand-over)."""
    prefill = [i for i, o in enumerate(options_list) if o["role"] == "prefill"]
    decode = [i for i, o in enumerate(options_list) if o["role"] == "decode"]
    handover, times = [], {}
    for p, d in itertools.product(prefill, decode):
        ok, kv = _kv_ok(spec, demand, options_list[p], options_list[d], machines, slo, times)
        if ok:
            handover.append((p, d, kv))
    return FleetInstance(options=tuple(options_list), objective=options.objective, max_devices=options.max_devices,
                         power_cap_w=options.power_cap_w, budget_usd_per_hour=options.budget_usd_per_hour,
                         handover=tuple(handover), owned=owned_savings(machines, options),
                         limits=options.limits), len(prefill) * len(decode)


def owned_savings(machines: dict, options: ServeSearchOptions) -> tuple[tuple[str, int, float], ...]:
    """(system, count, USD per device-hour saved) of each owned system: its price on the search's
    basis (cloud rent, or a new device's cost of ownership) less what owning one still costs
    (perfmodel.power.owned_device_usd_per_hour), both at its provisioned power (TDP and node share)."""
    from perfmodel.power import owned_device_usd_per_hour, run_cost

    out = []
    for name, count, value in options.owned:
        machine = machines[name]
        power = machine.tdp_w + machine.overhead_w_per_device
        market = float(run_cost(machine, power))
        if not np.isfinite(market):
            raise SpecError(f"--owned {name}: the system has no price on the {machine.pricing} basis to weigh owned "
                            f"devices against; give --price {name}=USD_PER_DEVICE_HOUR")
        out.append((name, count, max(market - float(owned_device_usd_per_hour(machine, power, value)), 0.0)))
    return tuple(out)


def _solver_text(method: str) -> str:
    return ("vectorized evaluation of instance configurations; fewest instances by bisection on monotone SLOs; "
            f"{method} over pools (colocated, or a prefill pool and a decode pool that may mix hardware kinds, "
            "with the KV transfer between them); every returned and listed fleet re-checked from the instance alone")


def _checked_best(instance: FleetInstance, best: FleetSolution | None, listed: list[FleetSolution]):
    """(best, status, gap) after the independent check: the solver's fleet must pass ``check`` and
    no listed fleet may beat it; otherwise the best checked fleet is returned as merely FEASIBLE."""
    value = lambda s: fleet.totals(instance, s).objective  # noqa: E731
    if best is not None and fleet.check(instance, best):
        best = None
    challenger = min(listed, key=value, default=None)
    if best is None:
        return (challenger, "FEASIBLE", None) if challenger is not None else (None, "INFEASIBLE", 0.0)
    if challenger is not None and value(challenger) < value(best) * (1 - 1e-12):
        return challenger, "FEASIBLE", None
    return best, best.status, best.gap


def _listed(instance: FleetInstance, singles: list[FleetSolution], demand: Demand, top: int) -> dict:
    """The single-configuration fleets a user sees: the best ``top`` by the objective and the
    Pareto front over cost per million tokens, end-to-end latency and energy per token."""
    if not singles:
        return {"top": [], "pareto": []}
    opts = instance.options
    sums = [fleet.totals(instance, s) for s in singles]
    objective = np.array([t.objective for t in sums])
    order = np.argsort(objective, kind="stable")[:top]
    tokens_per_hour = demand.rate * demand.output_len.mean * 3600.0
    kv = instance.kv_seconds

    def latency(s):
        ttft = opts[s.front]["ttft90"] + (kv[s.front, s.decode[0][0]] if s.decode else 0.0)
        tpot = opts[s.decode[0][0]]["tpot90"] if s.decode else opts[s.front]["tpot90"]
        return ttft + demand.output_len.mean * tpot

    keys = np.array([[np.inf if t.usd_per_hour is None else t.usd_per_hour / tokens_per_hour * 1e6, latency(s),
                      t.power_w * 3600.0 / tokens_per_hour] for s, t in zip(singles, sums)])
    priced = np.flatnonzero(np.isfinite(keys[:, 0]))
    idx = priced if len(priced) else np.arange(len(singles))
    front = idx[pareto_front(keys[idx])]
    front = front[np.argsort(np.nan_to_num(keys[front, 0], posinf=0.0), kind="stable")]
    return {"top": [singles[i] for i in order], "pareto": [singles[i] for i in front]}


def _device_hour_usd(machine: Machine, power_w):
    from perfmodel.power import run_cost

    cost = run_cost(machine, power_w)
    return None if np.all(np.isnan(cost)) else cost


def _pool_options(role, system, cols, price, demand, slo, options, max_devices):
    """Pool options of one role on one system: every configuration sized to its fewest instances,
    then pruned to those no option of the same group (instance size, KV precision) beats on what
    matters: objective and TTFT for prefill and colocated pools (the TTFT leaves the KV hand-over
    its slack), objective and devices for decode pools (and power under a power cap: what the fleet
    program trades)."""
    feasible = cols["feasible_prefill"] if role == "prefill" else cols["feasible_decode"]
    if role == "prefill":
        # A prefill pool's decode batch plays no part: one row per layout and precision (one
        # prompt per attention rank), KV in HBM.
        feasible = feasible & (cols["batch"] == cols["dpa"]) & (cols["kv_place"] == "hbm")
    idx = np.flatnonzero(feasible)
    if not len(idx):
        return [], 0, 0
    sub = {k: v[idx] for k, v in cols.items()}
    n, t50, t90, p50, p90 = _sizes(sub, demand, role, slo, MAX_INSTANCES)
    devices = n * sub["devices"]
    fits = (n > 0) & (devices <= max_devices)
    usd = devices * price[idx] if price is not None else np.full(len(idx), np.inf)
    power = devices * sub["prefill_power_w" if role == "prefill" else "power_w"]
    if options.objective == "latency":
        measures = _latency_measures(role, sub, n, price[idx] if price is not None else None, options)
    else:
        value = {"cost": usd, "energy": power, "devices": devices + power * 1e-9}[options.objective]
        value = np.nan_to_num(value, nan=np.inf)
        # A decode option trades its objective and devices (and power, when power is capped).
        measures = [value, t90] if role != "decode" else [value, devices * 1.0] + (
            [power] if options.power_cap_w is not None and options.objective != "energy" else [])
        if options.owned and role != "decode":
            measures.append(devices * 1.0)   # owned devices discount the larger option more
    kept = []
    group = np.char.add(np.char.add(sub["kvp"].astype(str), "|"), sub["devices"].astype(int).astype(str))
    for g in sorted(set(group[fits].tolist())):     # not np.unique: it imports numpy.ma (10-30 ms)
        members = np.flatnonzero(fits & (group == g))
        kept += members[pareto_front(np.stack([m[members] for m in measures], axis=1))].tolist()
    out = []
    for j in kept:
        k = idx[j]
        out.append({
            "role": role, "system": system, "instances": int(n[j]), "devices": int(devices[j]),
            "devices_per_instance": int(sub["devices"][j]),
            "usd_per_hour": float(usd[j]) if np.isfinite(usd[j]) else None, "power_w": float(power[j]),
            "ttft50": float(t50[j]), "ttft90": float(t90[j]), "tpot50": float(p50[j]), "tpot90": float(p90[j]),
            "ttft_error": float(cols["ttft_error"][k]), "tpot_error": float(cols["tpot_error"][k]),
            # What ``perfmodel estimate serve`` prints for this configuration: the prefill of one p90
            # prompt per attention rank, and the decode step at full batch and the p90 context.
            "service90": float(sub["prefill_s90"][j]), "step90": float(sub["tpot90"][j]),
            "kvp": str(cols["kvp"][k]), "hbm": float(cols["hbm"][k]),
            # The unloaded times the queueing model starts from (search.fastest re-sizes pools with them).
            "queue": {"output": demand.output_len.mean, "batch": int(sub["batch"][j]), "dpa": int(sub["dpa"][j]),
                      **{key: float(sub[key][j]) for key in ("prefill_s50", "prefill_s90", "tpot50", "tpot90")}},
            "config": {"tp": int(cols["tp"][k]), "pp": int(cols["pp"][k]), "ep": int(cols["ep"][k]),
                       "dp_attention": int(cols["dpa"][k]), "batch": int(cols["batch"][k]),
                       "weight_precision": str(cols["wp"][k]), "activation_precision": str(cols["ap"][k]),
                       "kv_precision": str(cols["kvp"][k]), "kv_place": str(cols["kv_place"][k]),
                       "weight_place": str(cols["w_place"][k])}})
    return out, int(fits.sum()), int((~fits).sum())


def _latency_measures(role: str, sub: dict, n, price, options: ServeSearchOptions) -> list:
    """What a pool option's latency on a fixed fleet rises with (``--objective latency``), so that
    pruning an option another beats in every one of them is exact (search.fastest): the unloaded
    prefill times (the M/M/c wait grows with the service time), fewer attention ranks per instance
    (fewer servers), the unloaded step times, a smaller batch (a larger share of a colocated
    instance's time), the fewest instances meeting the targets, and an instance's power and price
    when they are limited."""
    power = sub["prefill_power_w" if role == "prefill" else "power_w"]
    per_instance = [sub["devices"] * power] if options.power_cap_w is not None else []
    if options.budget_usd_per_hour is not None:
        per_instance.append(np.nan_to_num(sub["devices"] * price, nan=np.inf) if price is not None
                            else np.full(len(n), np.inf))
    prefill = [sub["prefill_s50"], sub["prefill_s90"], -sub["dpa"]]
    decode = [sub["tpot90"], n * 1.0]
    if role == "decode":
        return decode + per_instance
    if role == "prefill":
        return prefill + [n * 1.0] + per_instance
    return prefill + [sub["tpot50"], sub["tpot90"], -sub["batch"], n * 1.0] + per_instance


def _deployment(instance: FleetInstance, solution: FleetSolution, demand: Demand) -> Deployment:
    """The deployment a checked fleet describes: its pools at their counts, with their latencies."""
    opts = instance.options
    kv = max((instance.kv_seconds[solution.front, d] for d, _ in solution.decode), default=0.0)
    pools = []
    for i, n in solution.counts(instance):
        o = opts[i]
        scale = n / o["instances"]
        pools.append(Pool(role=o["role"], system=o["system"], accelerator=o["accelerator"], instances=int(n),
                          devices_per_instance=o["devices_per_instance"], config=o["config"],
                          ttft_p50_s=(o["ttft50"] + kv) if o["role"] != "decode" else None,
                          ttft_p90_s=(o["ttft90"] + kv) if o["role"] != "decode" else None,
                          tpot_p50_s=o["tpot50"] if o["role"] != "prefill" else None,
                          tpot_p90_s=o["tpot90"] if o["role"] != "prefill" else None,
                          requests_per_s=o["capacity"] * n, hbm_used_bytes=o["hbm"], power_w=o["power_w"] * scale,
                          usd_per_hour=None if o["usd_per_hour"] is None else o["usd_per_hour"] * scale,
                          ttft_error=o.get("ttft_error", 0.0), tpot_error=o.get("tpot_error", 0.0),
                          prefill_p90_s=o.get("service90", 0.0), step_p90_s=o.get("step90", 0.0)))
    front = [p for p in pools if p.ttft_p90_s is not None]
    back = [p for p in pools if p.tpot_p90_s is not None]
    t = fleet.totals(instance, solution)
    tokens_per_hour = demand.rate * demand.output_len.mean * 3600.0
    return Deployment(mode="colocated" if opts[solution.front]["role"] == "colocated" else "disaggregated",
                      pools=pools, ttft_p50_s=max(p.ttft_p50_s for p in front),
                      ttft_p90_s=max(p.ttft_p90_s for p in front), tpot_p50_s=max(p.tpot_p50_s for p in back),
                      tpot_p90_s=max(p.tpot_p90_s for p in back), devices=t.devices, power_w=t.power_w,
                      usd_per_hour=t.usd_per_hour,
                      usd_per_million_tokens=None if t.usd_per_hour is None else t.usd_per_hour / tokens_per_hour * 1e6,
                      joules_per_token=t.power_w * 3600.0 / tokens_per_hour,
                      latency_s=max(p.ttft_p90_s for p in front) + demand.output_len.mean * max(p.tpot_p90_s for p in back),
                      owned_used={k: v for k, v in fleet.owned_used(instance, solution).items() if v},
                      owned_saving_usd_per_hour=sum(fleet.owned_used(instance, solution)[name] * saving
                                                    for name, _, saving in instance.owned))


def _kv_ok(spec, demand, p, d, machines, slo, times: dict) -> tuple[bool, float]:
    """Whether prefill option ``p`` can hand its KV cache to decode option ``d`` within the TTFT SLOs.
    ``times`` memoizes the transfer times of one search (the pairs share few system and instance sizes)."""
    if p["kvp"] != d["kvp"]:
        return False, np.inf  # the KV cache moves in the format decode reads
    key = (d["kvp"], p["system"], d["system"], p["devices_per_instance"], d["devices_per_instance"])
    if key not in times:
        times[key] = kv_transfer_time(spec, demand.input_len.p90, d["kvp"], machines[p["system"]],
                                      machines[d["system"]], p["system"] == d["system"],
                                      p["devices_per_instance"], d["devices_per_instance"])
    kv = times[key]
    ok = (slo["ttft_p90"] is None or p["ttft90"] + kv <= slo["ttft_p90"]) and \
        (slo["ttft_p50"] is None or p["ttft50"] + kv <= slo["ttft_p50"])
    return ok, kv


def _binding_limits(instance: FleetInstance) -> str:
    """Which limit excludes every fleet that meets the SLOs, by how much, and what would relax it:
    each given limit against the best any fleet reaches on that measure with no limits at all."""
    free = replace(instance, max_devices=None, power_cap_w=None, budget_usd_per_hour=None)
    parts = []
    if instance.max_devices is not None:
        fewest = fleet.solve(replace(free, objective="devices"))
        if fewest is not None and fleet.totals(free, fewest).devices > instance.max_devices:
            n = fleet.totals(free, fewest).devices
            parts.append(f"the device limit binds: the smallest fleet meeting the targets needs at least {n:,} "
                         f"devices, --max-devices allows {instance.max_devices:,}; raise it to {n:,}")
    if instance.power_cap_w is not None:
        frugal = fleet.solve(replace(free, objective="energy"))
        if frugal is not None and fleet.totals(free, frugal).power_w > instance.power_cap_w:
            kw = fleet.totals(free, frugal).power_w / 1e3
            parts.append(f"the power cap binds: the lowest-power fleet meeting the targets draws {kw:,.1f} kW, the "
                         f"cap is {instance.power_cap_w / 1e3:,.1f} kW; raise --power-cap-kw to {kw:,.1f}")
    if instance.budget_usd_per_hour is not None:
        cheapest = fleet.solve(replace(free, objective="cost"))
        if cheapest is None:
            parts.append("the budget binds: no candidate system has a price on this basis (give --price "
                         "SYSTEM=USD_PER_DEVICE_HOUR or --pricing owned)")
        elif fleet.totals(free, cheapest).usd_per_hour > instance.budget_usd_per_hour:
            usd = fleet.totals(free, cheapest).usd_per_hour
            parts.append(f"the budget binds: the cheapest fleet meeting the targets costs ${usd:,.2f} per hour, "
                         f"the budget is ${instance.budget_usd_per_hour:,.2f}; raise --budget-usd-per-hour to "
                         f"{math.ceil(usd * 100) / 100:,.2f}")
    if not parts and any(x is not None for x in (instance.max_devices, instance.power_cap_w,
                                                 instance.budget_usd_per_hour)):
        parts.append("the device limit, power cap and budget together bind (each alone is met by some fleet)")
    return "; ".join(parts)


def _closest(counter: dict, fastest: dict, demand: Demand, max_devices: int | None = None) -> str:
    """What binds when no deployment is feasible: a latency target no instance that fits reaches
    (by how much), else the request rate no instance count within the limits carries."""
    parts = []
    for key, target, what in (("tpot_p90", demand.tpot_p90, "the fastest decode instance reaches TPOT p90"),
                              ("prefill_p90", demand.ttft_p90, "the fastest prefill takes, before any queueing,")):
        if key in fastest and target is not None and fastest[key] > target:
            parts.append(f"{what} {fastest[key] * 1e3:,.3g} ms, over the {target * 1e3:,.3g} ms target by "
                         f"{fastest[key] / target - 1:.0%}")
    if not fastest:
        parts.append("no instance configuration fits in memory on the candidate systems")
    elif not parts:
        unloaded = ", ".join(f"{name} {fastest[key] * 1e3:,.3g} ms" for key, name in
                             (("tpot_p90", "decode TPOT p90"), ("prefill_p90", "prefill")) if key in fastest)
        parts.append(f"the request rate binds: some instance meets every latency target unloaded ({unloaded}), "
                     "but no instance count " + (f"within --max-devices {max_devices:,} " if max_devices else "")
                     + f"carries {demand.rate:,.4g} requests/s within them")
    if counter:
        worst = max(counter.items(), key=lambda kv: kv[1])
        parts.append(f"most configurations fail on {worst[0]} ({worst[1]:,})")
    return "; ".join(parts)


def _skew(spec, machine, options, eps) -> np.ndarray:
    """Per EP degree: the busiest over mean EP device load of the ``--routing`` statistics placed
    by EPLB (search.placement.imbalance_table), or 0 without statistics: the serving estimate then
    computes it from the default routing of each pass's tokens (perfmodel.serving._skew)."""
    eps = np.asarray(eps, dtype=float)
    if options.routing is None or not spec.moe:
        return np.zeros(len(eps))
    table = imbalance_table(options.routing, eps, machine.constants.get("moe-redundant-expert-share", 0.125),
                            options.expert_balance)
    return np.vectorize(table.get, otypes=[float])(eps.astype(int))


def capped_p99(spec, machines: dict, deployment: Deployment, demand: Demand, options: ServeSearchOptions) -> dict:
    """The deployment's tail latencies under its power cap and, for the same pools at the same
    counts, without it: TTFT p99 (the wait at p99 over the p90 prompt's service: the lengths are
    known to p90 only) and TPOT p90, each capped / uncapped, and their ratios (the slowdown)."""
    out = {}
    for cap_name, cap in (("capped", options.device_power_cap_w), ("uncapped", None)):
        ttft99, tpot90 = 0.0, 0.0
        for pool in deployment.pools:
            c, machine = pool.config, machines[pool.system]
            imbalance = float(_skew(spec, machine, options, [c["ep"]])[0])
            common = dict(tp=c["tp"], pp=c["pp"], ep=c["ep"], dp_attention=c["dp_attention"],
                          weight_precision=c["weight_precision"], activation_precision=c["activation_precision"],
                          kv_precision=c["kv_precision"], weight_place=c.get("weight_place", "hbm"),
                          mtp_draft_tokens=options.mtp_draft_tokens, mtp_acceptance=options.mtp_acceptance,
                          moe_imbalance=imbalance, expert_balance=options.expert_balance, power_cap_w=cap)
            pre = {q: estimate_serving(spec, machine, ServePlan(batch=c["dp_attention"], **common),
                                       ServeWorkload(n, 1, demand.cached_share * n))
                   for q, n in (("50", demand.input_len.p50), ("90", demand.input_len.p90))}
            dec = {q: estimate_serving(spec, machine, ServePlan(batch=c["batch"], kv_place=c["kv_place"], **common),
                                       ServeWorkload(i, 2 * o))
                   for q, i, o in (("50", demand.input_len.p50, demand.output_len.p50),
                                   ("90", demand.input_len.p90, demand.output_len.p90))}
            ttft, _, t90, _, _ = pool_latencies(pool.role, pool.instances, demand.rate, demand.output_len.mean,
                                                c["batch"], c["dp_attention"], float(pre["50"].ttft_s),
                                                float(pre["90"].ttft_s), float(dec["50"].tpot_s),
                                                float(dec["90"].tpot_s), (0.99,))
            if pool.role != "decode":
                ttft99 = max(ttft99, float(ttft[0.99]))
            if pool.role != "prefill":
                tpot90 = max(tpot90, float(t90))
        # An unstable queue (arrivals beyond what the capped servers carry) has no finite tail: None.
        out[cap_name] = {k: (v if math.isfinite(v) else None) for k, v in (("ttft_p99_s", ttft99),
                                                                           ("tpot_p90_s", tpot90))}
        out[cap_name]["queue_unstable"] = not math.isfinite(ttft99)
    ratio = lambda k: (out["capped"][k] / out["uncapped"][k]  # noqa: E731
                       if out["uncapped"][k] and out["capped"][k] is not None else None)
    return {**out, "ttft_p99_slowdown": ratio("ttft_p99_s"), "tpot_p90_slowdown": ratio("tpot_p90_s")}


def deployment_error(d) -> float:
    """Relative half-width of a deployment's prediction: its least certain pool latency's."""
    return max(max(p.ttft_error, p.tpot_error) for p in d.pools)


def serving_ties(best, deployments: list, objective: str) -> list[bool]:
    """Whether each deployment's objective range (+- its prediction error) overlaps the best's."""
    def value(d):
        v = {"cost": d.usd_per_hour, "energy": d.power_w, "devices": d.devices, "latency": d.latency_s}[objective]
        return float("inf") if v is None else float(v)
    high = value(best) * (1.0 + deployment_error(best))
    return [d != best and value(d) * (1.0 - deployment_error(d)) <= high for d in deployments]


def raise_if_infeasible(result: ServeSearchResult) -> None:
    if result.best is None:
        what = "within the limits" if "binds" in result.closest else "meets the demand and SLOs"
        raise InfeasibleError(f"no deployment {what} among {result.evidence.configurations:,} "
                              f"instance configurations; {result.closest}")
