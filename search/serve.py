"""Serving deployments under latency SLOs: colocated or disaggregated prefill and decode pools,
instance configurations, instance counts and hardware per pool, at minimum cost (or energy, or
devices).

1. Instance configurations (TP, PP, EP, attention DP, batch, weight / activation / KV precision,
   KV cache in HBM or host memory) are evaluated per system in vectorized calls of the cost model
   (search.serve_pools): prefill at one prompt per attention rank, decode at each batch.
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

from perfmodel.economics import energy_per_token_j, usd_per_million_tokens
from perfmodel.hardware_db.errors import InfeasibleError, SpecError, UnknownNameError
from perfmodel.hardware_db.loader import Database
from perfmodel.model import TransformerSpec
from perfmodel.machine import Machine
from perfmodel.queueing import pool_latencies, pool_shares
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving, kv_transfer_time, serving_backend

from . import fleet
from .fleet import FleetInstance, FleetSolution
from .options import Demand, ServeSearchOptions
from .pareto import pareto_front
from .pool_option import PoolOption
from .serve_pools import PoolOptions, expert_skew, pool_options, slo_of
from .vocabulary import SERVE_MODES as MODES
from .vocabulary import SERVE_OBJECTIVES as OBJECTIVES


@dataclass(frozen=True)
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

    @property
    def devices(self) -> int:
        return self.instances * self.devices_per_instance

    def as_dict(self) -> dict:
        """The pool as data (its fields and its device count), as JSON documents carry it."""
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__}, "devices": self.devices}


@dataclass(frozen=True)
class Deployment:
    mode: str
    pools: tuple[Pool, ...]
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

    def as_dict(self) -> dict:
        """The deployment as data, each pool by ``Pool.as_dict``."""
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__ if f != "pools"},
                "pools": [p.as_dict() for p in self.pools]}


@dataclass(frozen=True)
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
                     "colocated: prompts in batches of their own sharing the instance's time, or as chunks "
                     "in mixed decode steps (Sarathi-Serve)")


@dataclass(frozen=True)
class ServeSearchResult:
    best: Deployment | None
    top: list[Deployment]
    pareto: list[Deployment]
    evidence: ServeEvidence
    closest: str = ""
    # --objective throughput: (requests/s the fleet carries, requests/s it does not), best at the first
    capacity: tuple[float, float] | None = None


# --- queueing -----------------------------------------------------------------------------------

# --- instance configurations --------------------------------------------------------------------


# --- pool sizing --------------------------------------------------------------------------------


# --- the deployment -----------------------------------------------------------------------------


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
    if options.objective == "throughput":
        return _capacity(spec, db, systems, demand, options, progress)
    started = time.perf_counter()
    slo = slo_of(demand)
    pools = pool_options(spec, db, systems, demand, options, progress)
    if progress is not None:
        progress(len(systems))
    options_list, machines, counter = pools.options, pools.machines, pools.counter
    configurations, feasible_configs = pools.configurations, pools.feasible
    if options.objective == "latency":
        fastest = _fastest(spec, demand, pools, options, started)
        if progress is not None:
            progress(len(systems) + 1)
        return fastest
    instance, pairs_checked = fleet_instance(spec, demand, options_list, machines, slo, options)
    evidence = ServeEvidence(
        configurations=configurations, feasible_configurations=feasible_configs, pool_options=len(options_list),
        pairs_checked=pairs_checked, infeasible_by_constraint=dict(sorted(counter.items())),
        solver=_solver_text(fleet.PROGRAM),
        status="INFEASIBLE", gap=0.0, seconds=0.0)
    if not options_list:
        evidence = replace(evidence, seconds=time.perf_counter() - started)
        return ServeSearchResult(None, [], [], evidence,
                                 closest=_closest(counter, pools.fastest, demand, options.max_devices))
    if not any(np.isfinite(instance.per_instance(i)) for i in range(len(options_list))):
        from perfmodel.economics import cost_basis

        raise SpecError("no candidate system has a price on this basis, so no cost can be minimized ("
                        + "; ".join(cost_basis(m) for m in machines.values())
                        + "); or use --pricing owned, or --objective energy or devices")
    summed = fleet.single_pools_summed(instance)
    singles, sums = [s for s, _ in summed], [t for _, t in summed]
    best = fleet.solve(instance)
    solver = evidence.solver if best is None else _solver_text(best.method)
    best, status, gap = _checked_best(instance, best, singles, sums)
    evidence = replace(evidence, solver=solver, status=status, gap=gap, seconds=time.perf_counter() - started)
    if progress is not None:
        progress(len(systems) + 1)
    if best is None:
        return ServeSearchResult(None, [], [], evidence, closest=_binding_limits(instance) or
                                 _closest(counter, pools.fastest, demand, options.max_devices))
    pue = _pue(machines)
    listed = _listed(instance, singles, sums, demand, options.top, pue)
    to_deployment = lambda s: _deployment(instance, s, demand, pue)  # noqa: E731
    return ServeSearchResult(best=to_deployment(best), top=[to_deployment(s) for s in listed["top"]],
                             pareto=[to_deployment(s) for s in listed["pareto"]], evidence=evidence)


# --objective throughput: the bracket's relative width, the smallest rate tried, the most searches run.
CAPACITY_TOLERANCE, CAPACITY_FLOOR, CAPACITY_SEARCHES = 0.01, 1e-4, 60


def _capacity(spec, db: Database, systems: list[str], demand: Demand, options: ServeSearchOptions,
              progress=None) -> ServeSearchResult:
    """``--objective throughput``: the most requests per second a fleet within the limits
    (``options.max_devices``, budget, power) carries within the latency targets. A deployment that
    carries a rate carries every lower one (an M/M/c queue's wait, a colocated instance's time
    sharing and the decode slots Little's law asks for all grow with the load), so the rates
    carried form an interval from 0. Its end is bracketed from ``demand.rate`` (doubling or
    halving) and then bisected geometrically to CAPACITY_TOLERANCE, each rate decided by the
    serving search itself (objective devices: its checked optimum, or none); the result is that
    search's at the bracket's carried end, with ``capacity`` = (carried, not carried)."""
    searches = 0

    def carried(rate: float) -> ServeSearchResult:
        nonlocal searches
        searches += 1
        return search_serving(spec, db, systems, replace(demand, rate=rate), replace(options, objective="devices"),
                              progress if searches == 1 else None)

    low, high, found = 0.0, math.inf, None
    result = carried(demand.rate)
    if result.best is not None:
        low, found = demand.rate, result
        while math.isinf(high) and searches < CAPACITY_SEARCHES:
            result = carried(2.0 * low)
            if result.best is not None:
                low, found = 2.0 * low, result
            else:
                high = 2.0 * low
    else:
        high, last = demand.rate, result
        while found is None and high / 2.0 >= CAPACITY_FLOOR and searches < CAPACITY_SEARCHES:
            result = carried(high / 2.0)
            if result.best is not None:
                low, found = high / 2.0, result
            else:
                high, last = high / 2.0, result
        if found is None:   # not even the smallest rate tried: what binds there
            return replace(last, closest=f"not even {high:.3g} requests/s is carried; {last.closest}")
    while high / low - 1.0 > CAPACITY_TOLERANCE and searches < CAPACITY_SEARCHES:
        middle = math.sqrt(low * high)
        result = carried(middle)
        if result.best is not None:
            low, found = middle, result
        else:
            high = middle
    solver = (f"bisection over the request rate ({searches} serving searches): {low:.4g} requests/s carried, "
              f"{high:.4g} not; at the carried rate, {found.evidence.solver}")
    return replace(found, evidence=replace(found.evidence, solver=solver), capacity=(low, high))


def _fastest(spec, demand: Demand, pools: PoolOptions, options: ServeSearchOptions, started: float
             ) -> ServeSearchResult:
    """``--objective latency``: the fastest deployment on the fleet of ``options.max_devices``
    (search.fastest), every listed one checked independently."""
    from . import fastest

    opts, slo, pue = pools.options, slo_of(demand), _pue(pools.machines)
    prefill = [i for i, o in enumerate(opts) if o.role == "prefill"]
    decode = [i for i, o in enumerate(opts) if o.role == "decode"]
    handover, times = [], {}
    for p, d in itertools.product(prefill, decode):
        if opts[p].kv_precision == opts[d].kv_precision:
            handover.append((p, d, _kv_ok(spec, demand, opts[p], opts[d], pools.machines, slo, times)[1]))
    instance = fastest.FastestInstance(opts, demand.rate, demand.output_len.mean, slo, options.max_devices,
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
        fs = FleetSolution(0, ((1, sized[1].instances),) if len(sized) == 2 else ())
        if fastest.check(instance, solution) or fleet.check(fi, fs):
            return None
        return _deployment(fi, fs, demand, pue)

    best = deployment(found[0]) if found else None
    status = "OPTIMAL" if best is not None else "FEASIBLE"
    if best is None:   # the fastest failed its check: the fastest checked one, merely FEASIBLE
        best = next((d for d in map(deployment, found[1:50]) if d is not None), None)
    evidence = replace(evidence, status=status if best is not None else "INFEASIBLE",
                       seconds=time.perf_counter() - started)
    if best is None:
        closest = (f"no deployment meets the targets on {options.max_devices:,} devices"
                   + (" within the power cap and budget" if options.power_cap_w or options.budget_usd_per_hour else "")
                   + "; " + _closest(pools.counter, pools.fastest, demand, options.max_devices)) if opts else \
            _closest(pools.counter, pools.fastest, demand, options.max_devices)
        return ServeSearchResult(None, [], [], evidence, closest=closest)
    top = [d for d in map(deployment, found[:options.top]) if d is not None]
    hourly, power = [], []
    for s in found:
        parts = [(opts[s.front], s.front_count)] + ([(opts[s.decode], s.decode_count)] if s.decode is not None else [])
        usd = [None if o.usd_per_hour is None else o.usd_per_hour / o.instances * n for o, n in parts]
        hourly.append(None if None in usd else sum(usd))
        power.append(sum(o.power_w / o.instances * n for o, n in parts))
    usd, joules = _per_token_columns(hourly, power, demand, pue)
    keys = np.column_stack([usd, [s.latency_s for s in found], joules]) if found else np.zeros((0, 3))
    front = pareto_front(keys) if len(keys) else np.zeros(0, dtype=int)
    pareto = [d for d in (deployment(found[i]) for i in sorted(front, key=lambda i: keys[i][1])) if d is not None]
    return ServeSearchResult(best=best, top=top, pareto=pareto, evidence=evidence)


def fleet_instance(spec, demand: Demand, options_list: tuple[PoolOption, ...], machines, slo,
                   options: ServeSearchOptions
                   ) -> tuple[FleetInstance, int]:
    """The fleet program's instance (and the prefill / decode pairs examined for the KV hand-over)."""
    prefill = [i for i, o in enumerate(options_list) if o.role == "prefill"]
    decode = [i for i, o in enumerate(options_list) if o.role == "decode"]
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
    from perfmodel.economics import owned_device_usd_per_hour, run_cost

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


def _checked_best(instance: FleetInstance, best: FleetSolution | None, listed: list[FleetSolution],
                  sums: list[fleet.FleetTotals]):
    """(best, status, gap) after the independent check: the solver's fleet must pass ``check`` and
    no listed fleet (``sums``: their totals) may beat it; otherwise the best checked fleet is returned
    as merely FEASIBLE."""
    if best is not None and fleet.check(instance, best):
        best = None
    challenger = min(range(len(listed)), key=lambda i: sums[i].objective, default=None)
    if best is None:
        return (listed[challenger], "FEASIBLE", None) if challenger is not None else (None, "INFEASIBLE", 0.0)
    if challenger is not None and sums[challenger].objective < fleet.totals(instance, best).objective * (1 - 1e-12):
        return listed[challenger], "FEASIBLE", None
    return best, best.status, best.gap


def _listed(instance: FleetInstance, singles: list[FleetSolution], sums: list[fleet.FleetTotals], demand: Demand,
            top: int, pue: float) -> dict:
    """The single-configuration fleets a user sees (``sums``: their totals): the best ``top`` by the
    objective and the Pareto front over cost per million tokens, end-to-end latency and energy per token."""
    if not singles:
        return {"top": [], "pareto": []}
    opts = instance.options
    objective = np.array([t.objective for t in sums])
    order = np.argsort(objective, kind="stable")[:top]
    kv = instance.kv_seconds

    def latency(s):
        ttft = opts[s.front].ttft_p90_s + (kv[s.front, s.decode[0][0]] if s.decode else 0.0)
        tpot = opts[s.decode[0][0]].tpot_p90_s if s.decode else opts[s.front].tpot_p90_s
        return ttft + demand.output_len.mean * tpot

    usd, joules = _per_token_columns([t.usd_per_hour for t in sums], [t.power_w for t in sums], demand, pue)
    keys = np.column_stack([usd, [latency(s) for s in singles], joules])
    priced = np.flatnonzero(np.isfinite(keys[:, 0]))
    idx = priced if len(priced) else np.arange(len(singles))
    front = idx[pareto_front(keys[idx])]
    front = front[np.argsort(np.nan_to_num(keys[front, 0], posinf=0.0), kind="stable")]
    return {"top": [singles[i] for i in order], "pareto": [singles[i] for i in front]}


def _pue(machines: dict[str, Machine]) -> float:
    """The facility's PUE (one database constant, the same for every candidate system)."""
    return next(iter(machines.values())).constants.pue


def _per_token(usd_per_hour: float | None, power_w: float, demand: Demand, pue: float) -> tuple[float | None, float]:
    """(US dollars per million output tokens, joules per output token at the facility) of a fleet
    costing ``usd_per_hour`` and drawing ``power_w`` (IT) while it serves ``demand``'s output tokens
    (perfmodel.economics, as every estimate reports them; None where unpriced)."""
    tokens_per_s = demand.rate * demand.output_len.mean
    usd = None if usd_per_hour is None else float(usd_per_million_tokens(usd_per_hour, tokens_per_s))
    return usd, float(energy_per_token_j(power_w, tokens_per_s, pue))


def _per_token_columns(usd_per_hour: list, power_w: list, demand: Demand, pue: float) -> tuple:
    """``_per_token`` of many fleets at once, as the Pareto keys take them: (dollars per million output
    tokens, inf where unpriced; joules per output token)."""
    tokens_per_s = demand.rate * demand.output_len.mean
    hourly = np.array([np.nan if u is None else u for u in usd_per_hour], dtype=float)
    usd = usd_per_million_tokens(hourly, tokens_per_s)
    return np.where(np.isnan(usd), np.inf, usd), energy_per_token_j(np.asarray(power_w, dtype=float), tokens_per_s, pue)


def _deployment(instance: FleetInstance, solution: FleetSolution, demand: Demand, pue: float) -> Deployment:
    """The deployment a checked fleet describes: its pools at their counts, with their latencies."""
    opts = instance.options
    kv = max((instance.kv_seconds[solution.front, d] for d, _ in solution.decode), default=0.0)
    pools = []
    for i, n in solution.counts(instance):
        o = opts[i]
        scale = n / o.instances
        pools.append(Pool(role=o.role, system=o.system, accelerator=o.accelerator, instances=int(n),
                          devices_per_instance=o.devices_per_instance, config=o.config.as_dict(),
                          ttft_p50_s=(o.ttft_p50_s + kv) if o.role != "decode" else None,
                          ttft_p90_s=(o.ttft_p90_s + kv) if o.role != "decode" else None,
                          tpot_p50_s=o.tpot_p50_s if o.role != "prefill" else None,
                          tpot_p90_s=o.tpot_p90_s if o.role != "prefill" else None,
                          requests_per_s=o.requests_per_s_per_instance * n, hbm_used_bytes=o.hbm_used_bytes,
                          power_w=o.power_w * scale,
                          usd_per_hour=None if o.usd_per_hour is None else o.usd_per_hour * scale,
                          ttft_error=o.ttft_error, tpot_error=o.tpot_error,
                          prefill_p90_s=o.prefill_p90_s, step_p90_s=o.step_p90_s))
    front = [p for p in pools if p.ttft_p90_s is not None]
    back = [p for p in pools if p.tpot_p90_s is not None]
    t = fleet.totals(instance, solution)
    usd_per_million, joules = _per_token(t.usd_per_hour, t.power_w, demand, pue)
    return Deployment(mode="colocated" if opts[solution.front].role == "colocated" else "disaggregated",
                      pools=tuple(pools), ttft_p50_s=max(p.ttft_p50_s for p in front),
                      ttft_p90_s=max(p.ttft_p90_s for p in front), tpot_p50_s=max(p.tpot_p50_s for p in back),
                      tpot_p90_s=max(p.tpot_p90_s for p in back), devices=t.devices, power_w=t.power_w,
                      usd_per_hour=t.usd_per_hour,
                      usd_per_million_tokens=usd_per_million, joules_per_token=joules,
                      latency_s=max(p.ttft_p90_s for p in front) + demand.output_len.mean * max(p.tpot_p90_s for p in back),
                      owned_used={k: v for k, v in fleet.owned_used(instance, solution).items() if v},
                      owned_saving_usd_per_hour=sum(fleet.owned_used(instance, solution)[name] * saving
                                                    for name, _, saving in instance.owned))


def _kv_ok(spec, demand, p: PoolOption, d: PoolOption, machines, slo, times: dict) -> tuple[bool, float]:
    """Whether prefill option ``p`` can hand its KV cache to decode option ``d`` within the TTFT SLOs.
    ``times`` memoizes the transfer times of one search (the pairs share few system and instance sizes)."""
    if p.kv_precision != d.kv_precision:
        return False, np.inf  # the KV cache moves in the format decode reads
    key = (d.kv_precision, p.system, d.system, p.devices_per_instance, d.devices_per_instance)
    if key not in times:
        times[key] = kv_transfer_time(spec, demand.input_len.p90, d.kv_precision, machines[p.system],
                                      machines[d.system], p.system == d.system,
                                      p.devices_per_instance, d.devices_per_instance)
    kv = times[key]
    ok = (slo["ttft_p90"] is None or p.ttft_p90_s + kv <= slo["ttft_p90"]) and \
        (slo["ttft_p50"] is None or p.ttft_p50_s + kv <= slo["ttft_p50"])
    return ok, kv


def _binding_limits(instance: FleetInstance) -> str:
    """Which limit excludes every fleet that meets the SLOs, by how much, and what would relax it:
    each given limit against the best any fleet reaches on that measure with no limits at all."""
    free = replace(instance, max_devices=None, power_cap_w=None, budget_usd_per_hour=None)
    fewest = fleet.solve(replace(free, objective="devices"))
    if fewest is None:    # no fleet meets the targets with no limit at all: the targets bind, not a limit
        return ""
    parts = []
    if instance.max_devices is not None:
        if fleet.totals(free, fewest).devices > instance.max_devices:
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


def _pool_phases(spec, machine: Machine, pool, demand: Demand, options: ServeSearchOptions, cap) -> tuple:
    """A pool's instance re-estimated at the p50 and p90 lengths under a per-device ``cap`` (None: none):
    (prefill estimates, decode estimates, a prompt's service by quantile: its prefill, or its chunks
    in mixed steps; perfmodel.queueing)."""
    c = pool.config
    imbalance = float(expert_skew(spec, machine, options, [c["ep"]])[0])
    common = dict(tp=c["tp"], pp=c["pp"], ep=c["ep"], dp_attention=c["dp_attention"],
                  weight_precision=c["weight_precision"], activation_precision=c["activation_precision"],
                  kv_precision=c["kv_precision"], weight_place=c.get("weight_place", "hbm"),
                  mtp_draft_tokens=options.mtp_draft_tokens, mtp_acceptance=options.mtp_acceptance,
                  moe_imbalance=imbalance, expert_balance=options.expert_balance, power_cap_w=cap,
                  backend=serving_backend(options.framework))
    pre = {q: estimate_serving(spec, machine, ServePlan(batch=c["dp_attention"], **common),
                               ServeWorkload(n, 1, demand.cached_share * n))
           for q, n in (("50", demand.input_len.p50), ("90", demand.input_len.p90))}
    chunk = c.get("chunk_tokens", 0)
    dec = {q: estimate_serving(spec, machine, ServePlan(batch=c["batch"], kv_place=c["kv_place"],
                                                        chunk_tokens=chunk, **common),
                               ServeWorkload(i, 2 * o, demand.cached_share * i),
                               ("decode", "mixed") if chunk else ("decode",))
           for q, i, o in (("50", demand.input_len.p50, demand.output_len.p50),
                           ("90", demand.input_len.p90, demand.output_len.p90))}
    service = {q: float(pre[q].ttft_s) for q in pre}
    if chunk:       # a prompt's chunks in mixed steps (perfmodel.queueing)
        service = {q: (1.0 - demand.cached_share) * n / float(dec[q].chunk_prompt_tokens)
                   * float(dec[q].mixed_step_s) for q, n in (("50", demand.input_len.p50),
                                                             ("90", demand.input_len.p90))}
    return pre, dec, service


def capped_p99(spec, machines: dict, deployment: Deployment, demand: Demand, options: ServeSearchOptions) -> dict:
    """The deployment's tail latencies under its power cap and, for the same pools at the same
    counts, without it: TTFT p99 (the wait at p99 over the p90 prompt's service: the lengths are
    known to p90 only) and TPOT p90, each capped / uncapped, and their ratios (the slowdown)."""
    out = {}
    for cap_name, cap in (("capped", options.device_power_cap_w), ("uncapped", None)):
        ttft99, tpot90 = 0.0, 0.0
        for pool in deployment.pools:
            c = pool.config
            _, dec, service = _pool_phases(spec, machines[pool.system], pool, demand, options, cap)
            ttft, _, t90, _, _ = pool_latencies(pool.role, pool.instances, demand.rate, demand.output_len.mean,
                                                c["batch"], c["dp_attention"], service["50"], service["90"],
                                                float(dec["50"].tpot_s), float(dec["90"].tpot_s), (0.99,),
                                                float(dec["50"].mixed_step_s), float(dec["90"].mixed_step_s))
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


def deployment_power(spec, machines: dict, deployment: Deployment, demand: Demand,
                     options: ServeSearchOptions) -> list:
    """(InstancePower, instances) of each pool of an uncapped deployment: an instance's draw (its
    devices with their node share) while it prefills, decodes or idles, and the shares of its time
    the queueing model gives each (pool_shares, at the p50 lengths; what a phase does not fill is
    idle). A colocated instance that mixes prompt chunks into its decode steps draws, in a step
    carrying a chunk, the higher of its prefill and decode power."""
    from perfmodel.oversubscription import InstancePower

    out = []
    for pool in deployment.pools:
        c, machine = pool.config, machines[pool.system]
        pre, dec, service = _pool_phases(spec, machine, pool, demand, options, None)
        tpot, mixed = float(dec["50"].tpot_s), float(dec["50"].mixed_step_s)
        decode, prefill = (float(x) for x in pool_shares(pool.role, pool.instances, demand.rate, demand.output_len.mean,
                                                         c["batch"], c["dp_attention"], service["50"], tpot, mixed))
        per_device = {"prefill": float(pre["50"].prefill_power_w), "decode": float(dec["50"].power_w),
                      "idle": machine.idle_w + machine.overhead_w_per_device}
        if mixed > 0:          # decode steps run beside the prompt lane: decode's own share, linearized
            per_device["prefill"] = max(per_device["prefill"], per_device["decode"])
            decode = float(pool_shares("decode", pool.instances, demand.rate, demand.output_len.mean, c["batch"],
                                       c["dp_attention"], service["50"], tpot)[0])
        busy = {"prefill": min(prefill, 1.0), "decode": min(decode, max(1.0 - prefill, 0.0))}
        shares = (busy["prefill"], busy["decode"], max(1.0 - busy["prefill"] - busy["decode"], 0.0))
        watts = tuple(per_device[s] * pool.devices_per_instance for s in ("prefill", "decode", "idle"))
        out.append((InstancePower(watts, tuple(x / sum(shares) for x in shares)), pool.instances))
    return out


def deployment_error(d) -> float:
    """Relative half-width of a deployment's prediction: its least certain pool latency's."""
    return max(max(p.ttft_error, p.tpot_error) for p in d.pools)


def serving_ties(best, deployments: list, objective: str) -> list[bool]:
    """Whether each deployment's objective range (+- its prediction error) overlaps the best's."""
    def value(d):
        # At the rate a fleet carries (--objective throughput) deployments compete on their devices.
        v = {"cost": d.usd_per_hour, "energy": d.power_w, "devices": d.devices, "latency": d.latency_s,
             "throughput": d.devices}[objective]
        return float("inf") if v is None else float(v)
    high = value(best) * (1.0 + deployment_error(best))
    return [d != best and value(d) * (1.0 - deployment_error(d)) <= high for d in deployments]


def raise_if_infeasible(result: ServeSearchResult) -> None:
    if result.best is None:
        what = "within the limits" if "binds" in result.closest else "meets the demand and SLOs"
        raise InfeasibleError(f"no deployment {what} among {result.evidence.configurations:,} "
                              f"instance configurations; {result.closest}")
