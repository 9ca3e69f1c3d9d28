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
from dataclasses import dataclass

import numpy as np

from hardware_db.errors import InfeasibleError, SpecError, UnknownNameError
from hardware_db.loader import Database
from perfmodel.machine import Machine, build_machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import QuantScheme
from perfmodel.queueing import pool_latencies
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving, kv_transfer_time

from .pareto import pareto_front
from .placement import imbalance_table

OBJECTIVES = ("cost", "energy", "devices")
MAX_INSTANCES = 1 << 20
MODES = ("colocated", "disaggregated")


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution given by its mean and two percentiles."""

    mean: float
    p50: float
    p90: float

    @staticmethod
    def of(mean: float, p50: float | None = None, p90: float | None = None) -> "Lengths":
        return Lengths(mean, p50 if p50 is not None else mean, p90 if p90 is not None else mean)


@dataclass(frozen=True)
class Demand:
    """Requests per second, their lengths, and the latency targets (seconds; None: no target)."""

    rate: float
    input_len: Lengths
    output_len: Lengths
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    tpot_p50: float | None = None
    tpot_p90: float | None = None


@dataclass(frozen=True)
class ServeSearchOptions:
    objective: str = "cost"
    modes: tuple[str, ...] = MODES
    weight_precisions: tuple[str, ...] = ("bf16", "fp8", "int8", "int4")
    activation_precisions: tuple[str, ...] = ("a16", "a8")
    kv_precisions: tuple[str, ...] = ("bf16", "fp8")
    kv_offload: bool = True
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    max_instance_devices: int = 512
    max_devices: int | None = None
    budget_usd_per_hour: float | None = None
    power_cap_w: float | None = None
    top: int = 5
    routing: object = None          # RoutingStats: EP imbalance from a placement, per EP degree


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

def _layouts(spec: TransformerSpec, machine: Machine, max_devices: int):
    """(tp, pp, dp_attention, ep) of instances up to ``max_devices`` devices on this system."""
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
                eps = [1] if not spec.moe else sorted({1, tp, tp * dpa} & {e for e in sizes if e <= spec.moe.num_experts})
                for ep in eps:
                    out.append((tp, pp, dpa, ep))
    return out


def _precision_combos(machine: Machine, options: ServeSearchOptions):
    """(weight, activation, KV) formats the options allow and the device can run (QuantScheme's rules)."""
    combos = []
    for wp, ap, kvp in itertools.product(options.weight_precisions, options.activation_precisions,
                                         options.kv_precisions):
        try:
            scheme = QuantScheme(wp, ap, kvp)
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
    layouts = _layouts(spec, machine, options.max_instance_devices)
    places = ["hbm"] + ([t.kind for t in machine.memory_tiers if t.kind in ("ddr", "cxl", "pooled")]
                        if options.kv_offload else [])
    rows: dict[str, list] = {k: [] for k in ("tp", "pp", "dpa", "ep", "batch", "wp", "ap", "kvp", "kv_place",
                                             "devices", "prefill_s50", "prefill_s90", "tpot50", "tpot90",
                                             "hbm", "power_w", "feasible_decode", "feasible_prefill",
                                             "ttft_error", "tpot_error")}
    if not layouts:
        return rows
    lay = np.array(layouts, dtype=float)
    imbalance = imbalance_table(options.routing if spec.moe else None, lay[:, 3])
    skew = np.vectorize(imbalance.get, otypes=[float])(lay[:, 3].astype(int))
    for wp, ap, kvp in _precision_combos(machine, options):
        for place in places:
            # Prefill: one prompt per attention rank, at the p50 and p90 prompt lengths.
            pre = {}
            for q, n_in in (("50", demand.input_len.p50), ("90", demand.input_len.p90)):
                plan = ServePlan(tp=lay[:, 0], pp=lay[:, 1], dp_attention=lay[:, 2], ep=lay[:, 3], batch=lay[:, 2],
                                 weight_precision=wp, activation_precision=ap, kv_precision=kvp, moe_imbalance=skew)
                pre[q] = estimate_serving(spec, machine, plan, ServeWorkload(n_in, 1))
            # Decode: every batch, at the p50 and p90 contexts (the step's mean context is
            # input + output / 2, so output = 2 x (context - input) reproduces it).
            grid_rows = [(i, b) for i, l in enumerate(layouts) for b in options.batches if b % l[2] == 0]
            pre_i = np.array([i for i, _ in grid_rows])
            grid = np.column_stack([lay[pre_i], [b for _, b in grid_rows]]).astype(float)
            dec = {}
            for q, ctx_in, ctx_out in (("50", demand.input_len.p50, demand.output_len.p50),
                                       ("90", demand.input_len.p90, demand.output_len.p90)):
                plan = ServePlan(tp=grid[:, 0], pp=grid[:, 1], dp_attention=grid[:, 2], ep=grid[:, 3],
                                 batch=grid[:, 4], weight_precision=wp, activation_precision=ap, kv_precision=kvp,
                                 kv_place=place, moe_imbalance=skew[pre_i])
                dec[q] = estimate_serving(spec, machine, plan, ServeWorkload(ctx_in, 2 * ctx_out))
            for name, values in (("tp", grid[:, 0]), ("pp", grid[:, 1]), ("dpa", grid[:, 2]), ("ep", grid[:, 3]),
                                 ("batch", grid[:, 4]), ("devices", grid[:, 0] * grid[:, 1] * grid[:, 2]),
                                 ("prefill_s50", pre["50"].ttft_s[pre_i]), ("prefill_s90", pre["90"].ttft_s[pre_i]),
                                 ("tpot50", dec["50"].tpot_s), ("tpot90", dec["90"].tpot_s),
                                 ("hbm", dec["90"].hbm_used_bytes), ("power_w", dec["50"].power_w),
                                 ("feasible_decode", dec["90"].feasible),
                                 ("feasible_prefill", pre["90"].feasible[pre_i]),
                                 # Relative half-widths of the prediction intervals (Machine.interval).
                                 ("ttft_error", _half_width(pre["90"].ttft_range_s, pre["90"].ttft_s)[pre_i]),
                                 ("tpot_error", _half_width(dec["90"].tpot_range_s, dec["90"].tpot_s))):
                rows[name].append(np.asarray(values))
            for name, value in (("wp", wp), ("ap", ap), ("kvp", kvp), ("kv_place", place)):
                rows[name].append(np.full(len(grid), value, dtype=object))
            for r in (dec["90"],):
                for b in r.binding[~r.feasible].tolist():
                    counter[f"instance: {b}"] = counter.get(f"instance: {b}", 0) + 1
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in rows.items()}


# --- pool sizing --------------------------------------------------------------------------------

def _fewest(ok, rows: int, upper: int) -> np.ndarray:
    """Smallest count in [1, upper] for which ``ok(count)`` holds, per row (monotone in the count,
    so bisection); 0 where even ``upper`` fails."""
    lo, hi = np.ones(rows, dtype=np.int64), np.full(rows, upper, dtype=np.int64)
    feasible = ok(hi)
    for _ in range(int(math.ceil(math.log2(max(upper, 2)))) + 1):
        mid = (lo + hi) // 2
        good = ok(mid)
        hi, lo = np.where(good, mid, hi), np.where(good, lo, mid + 1)
    return np.where(feasible, hi, 0)


def _sizes(cols, demand: Demand, role: str, slo: dict, max_instances: int):
    """Fewest instances per configuration meeting the SLOs in ``role``, with the pool's latencies."""
    lam, out_mean = demand.rate, demand.output_len.mean

    def latencies(n, quantiles=(0.5, 0.9)):
        return pool_latencies(role, n, lam, out_mean, cols["batch"], cols["dpa"], cols["prefill_s50"],
                              cols["prefill_s90"], cols["tpot50"], cols["tpot90"], quantiles)

    # The quantiles the targets ask for (p90 always: it also decides whether the queue is stable).
    asked = (0.9,) + ((0.5,) if slo["ttft_p50"] is not None else ())

    def ok(n):
        ttft, tpot50, tpot90, load, in_flight = latencies(n, asked)
        good = load < 1.0
        if role != "decode":
            good &= np.isfinite(ttft[0.9])
            if slo["ttft_p50"] is not None:
                good &= ttft[0.5] <= slo["ttft_p50"]
            if slo["ttft_p90"] is not None:
                good &= ttft[0.9] <= slo["ttft_p90"]
        if role != "prefill":
            good &= in_flight <= cols["batch"]      # a slot for every sequence in flight
            if slo["tpot_p50"] is not None:
                good &= tpot50 <= slo["tpot_p50"]
            if slo["tpot_p90"] is not None:
                good &= tpot90 <= slo["tpot_p90"]
        return good

    n = _fewest(ok, len(cols["batch"]), max_instances)
    ttft, tpot50, tpot90, _, _ = latencies(np.maximum(n, 1))
    return n, ttft[0.5], ttft[0.9], tpot50, tpot90


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
                 options: ServeSearchOptions) -> PoolOptions:
    """Evaluate every instance configuration of every system and size each role's pools."""
    slo = slo_of(demand)
    counter: dict[str, int] = {}
    options_list: list[dict] = []
    configurations = feasible_configs = 0
    machines = {}
    fastest: dict = {}
    max_devices = options.max_devices or 10_000_000
    for name in systems:
        base = db.system(name)
        # Size the system to what a fleet may use: the device limit, or a generous default.
        devices = min(max_devices, max(base.devices, options.max_instance_devices))
        machine = build_machine(db, name, devices - devices % base.devices_per_node or base.devices_per_node)
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
                   options: ServeSearchOptions = ServeSearchOptions()) -> ServeSearchResult:
    """The cheapest (or most frugal) deployment meeting the demand and SLOs, with evidence."""
    if options.objective not in OBJECTIVES:
        raise UnknownNameError("objective", options.objective, OBJECTIVES)
    for mode in options.modes:
        if mode not in MODES:
            raise UnknownNameError("mode", mode, MODES)
    if not demand.rate > 0:
        raise SpecError(f"the request rate needs to be positive, has {demand.rate:g}")
    started = time.perf_counter()
    slo = slo_of(demand)
    pools = pool_options(spec, db, systems, demand, options)
    options_list, machines, counter = pools.options, pools.machines, pools.counter
    configurations, feasible_configs = pools.configurations, pools.feasible
    singles, pairs_checked = _single_deployments(spec, demand, options_list, machines, slo, options)
    evidence = ServeEvidence(
        configurations=configurations, feasible_configurations=feasible_configs, pool_options=len(options_list),
        pairs_checked=pairs_checked, infeasible_by_constraint=dict(sorted(counter.items())),
        solver="vectorized evaluation of instance configurations; fewest instances by bisection on monotone "
               "SLOs; CP-SAT integer program over pools (colocated, or a prefill pool and a decode pool that "
               "may mix hardware kinds, with the KV transfer between them)",
        status="INFEASIBLE", gap=0.0, seconds=0.0)
    if not options_list:
        evidence.seconds = time.perf_counter() - started
        return ServeSearchResult(None, [], [], evidence, closest=_closest(counter, pools.fastest, demand))
    best, status, gap = _solve_fleet(spec, demand, options_list, machines, slo, options)
    evidence.status, evidence.gap = status, gap
    evidence.seconds = time.perf_counter() - started
    if best is None:
        return ServeSearchResult(None, [], [], evidence,
                                 closest=_closest(counter, pools.fastest, demand) if not singles
                                 else "the budget, power cap or device limit binds")
    objective = np.array([_objective_value(d, options.objective) for d in singles])
    order = np.argsort(objective, kind="stable")[: options.top]
    priced = [d for d in singles if d.usd_per_million_tokens is not None] or singles
    front = pareto_front(np.array([[d.usd_per_million_tokens or 0.0,
                                    d.ttft_p90_s + demand.output_len.mean * d.tpot_p90_s, d.joules_per_token]
                                   for d in priced])) if priced else []
    return ServeSearchResult(best=best, top=[singles[i] for i in order],
                             pareto=sorted([priced[i] for i in front], key=lambda d: d.usd_per_million_tokens or 0),
                             evidence=evidence)


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
    power = devices * sub["power_w"]
    value = {"cost": usd, "energy": power, "devices": devices + power * 1e-9}[options.objective]
    value = np.nan_to_num(value, nan=np.inf)
    kept = []
    group = np.char.add(np.char.add(sub["kvp"].astype(str), "|"), sub["devices"].astype(int).astype(str))
    for g in np.unique(group[fits]):
        members = np.flatnonzero(fits & (group == g))
        # A decode option trades its objective and devices (and power, when power is capped).
        measures = [value, t90] if role != "decode" else [value, devices * 1.0] + (
            [power] if options.power_cap_w is not None and options.objective != "energy" else [])
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
            "kvp": str(cols["kvp"][k]), "hbm": float(cols["hbm"][k]),
            "config": {"tp": int(cols["tp"][k]), "pp": int(cols["pp"][k]), "ep": int(cols["ep"][k]),
                       "dp_attention": int(cols["dpa"][k]), "batch": int(cols["batch"][k]),
                       "weight_precision": str(cols["wp"][k]), "activation_precision": str(cols["ap"][k]),
                       "kv_precision": str(cols["kvp"][k]), "kv_place": str(cols["kv_place"][k])}})
    return out, int(fits.sum()), int((~fits).sum())


def _deployment(mode, parts, demand: Demand, kv_s: float = 0.0, counts: list[int] | None = None) -> Deployment:
    """A deployment from pool options (with the instance count of each, default their own)."""
    pools = []
    for o, n in zip(parts, counts or [o["instances"] for o in parts]):
        scale = n / o["instances"]
        pools.append(Pool(role=o["role"], system=o["system"], accelerator=o["accelerator"], instances=int(n),
                          devices_per_instance=o["devices_per_instance"], config=o["config"],
                          ttft_p50_s=(o["ttft50"] + kv_s) if o["role"] != "decode" else None,
                          ttft_p90_s=(o["ttft90"] + kv_s) if o["role"] != "decode" else None,
                          tpot_p50_s=o["tpot50"] if o["role"] != "prefill" else None,
                          tpot_p90_s=o["tpot90"] if o["role"] != "prefill" else None,
                          requests_per_s=o["capacity"] * n, hbm_used_bytes=o["hbm"], power_w=o["power_w"] * scale,
                          usd_per_hour=None if o["usd_per_hour"] is None else o["usd_per_hour"] * scale,
                          ttft_error=o.get("ttft_error", 0.0), tpot_error=o.get("tpot_error", 0.0)))
    front = [p for p in pools if p.ttft_p90_s is not None]
    back = [p for p in pools if p.tpot_p90_s is not None]
    usd = None if any(p.usd_per_hour is None for p in pools) else sum(p.usd_per_hour for p in pools)
    tokens_per_hour = demand.rate * demand.output_len.mean * 3600.0
    power = sum(p.power_w for p in pools)
    return Deployment(mode=mode, pools=pools, ttft_p50_s=max(p.ttft_p50_s for p in front),
                      ttft_p90_s=max(p.ttft_p90_s for p in front), tpot_p50_s=max(p.tpot_p50_s for p in back),
                      tpot_p90_s=max(p.tpot_p90_s for p in back), devices=sum(p.devices for p in pools),
                      power_w=power, usd_per_hour=usd,
                      usd_per_million_tokens=None if usd is None else usd / tokens_per_hour * 1e6,
                      joules_per_token=power * 3600.0 / tokens_per_hour)


_KV_CACHE: dict = {}


def _kv_ok(spec, demand, p, d, machines, slo) -> tuple[bool, float]:
    """Whether prefill option ``p`` can hand its KV cache to decode option ``d`` within the TTFT SLOs."""
    if p["kvp"] != d["kvp"]:
        return False, np.inf  # the KV cache moves in the format decode reads
    key = (id(machines), spec.name, demand.input_len.p90, d["kvp"], p["system"], d["system"],
           p["devices_per_instance"], d["devices_per_instance"])
    if key not in _KV_CACHE:
        _KV_CACHE[key] = kv_transfer_time(spec, demand.input_len.p90, d["kvp"], machines[p["system"]],
                                          machines[d["system"]], p["system"] == d["system"],
                                          p["devices_per_instance"], d["devices_per_instance"])
    kv = _KV_CACHE[key]
    ok = (slo["ttft_p90"] is None or p["ttft90"] + kv <= slo["ttft_p90"]) and \
        (slo["ttft_p50"] is None or p["ttft50"] + kv <= slo["ttft_p50"])
    return ok, kv


def _single_deployments(spec, demand, options_list, machines, slo, options, keep: int = 2000):
    """Deployments of one configuration per pool (each colocated option, each compatible pair),
    within the limits: the candidates of the top list and the Pareto front. Scored as numbers
    first; only the ``keep`` best by each measure become Deployment objects."""
    scored = []   # (objective, usd/h or inf, latency, power, parts, kv)
    tokens_per_hour = demand.rate * demand.output_len.mean * 3600.0

    def score(parts, kv):
        usd = None if any(o["usd_per_hour"] is None for o in parts) else sum(o["usd_per_hour"] for o in parts)
        power = sum(o["power_w"] for o in parts)
        devices = sum(o["devices"] for o in parts)
        if devices > (options.max_devices or np.inf) or (options.power_cap_w is not None and power > options.power_cap_w):
            return
        if options.budget_usd_per_hour is not None and (usd is None or usd > options.budget_usd_per_hour):
            return
        ttft = max(o["ttft90"] for o in parts if o["role"] != "decode") + kv
        tpot = max(o["tpot90"] for o in parts if o["role"] != "prefill")
        objective = sum(_option_objective(o, options.objective) for o in parts)
        scored.append((objective, np.inf if usd is None else usd / tokens_per_hour * 1e6,
                       ttft + demand.output_len.mean * tpot, power * 3600.0 / tokens_per_hour, parts, kv))

    pairs = 0
    for o in options_list:
        if o["role"] == "colocated":
            score([o], 0.0)
    prefill = [o for o in options_list if o["role"] == "prefill"]
    decode = [o for o in options_list if o["role"] == "decode"]
    for p, d in itertools.product(prefill, decode):
        pairs += 1
        ok, kv = _kv_ok(spec, demand, p, d, machines, slo)
        if ok:
            score([p, d], kv)
    if not scored:
        return [], pairs
    values = np.array([row[:4] for row in scored])
    chosen = set(np.argsort(values[:, 0], kind="stable")[:keep].tolist())
    finite = np.isfinite(values[:, 1])
    idx = np.flatnonzero(finite) if finite.any() else np.arange(len(scored))
    chosen |= set(idx[pareto_front(values[idx][:, 1:4])].tolist())
    out = [_deployment("colocated" if len(scored[i][4]) == 1 else "disaggregated", scored[i][4], demand, scored[i][5])
           for i in sorted(chosen)]
    return out, pairs


def _objective_value(d: Deployment, objective: str) -> float:
    if objective == "cost":
        return np.inf if d.usd_per_hour is None else d.usd_per_hour
    if objective == "energy":
        return d.power_w
    return d.devices + d.power_w * 1e-9


def _option_objective(o: dict, objective: str) -> float:
    """Objective of one pool option at its own instance count (additive across pools)."""
    if objective == "cost":
        return np.inf if o["usd_per_hour"] is None else o["usd_per_hour"]
    if objective == "energy":
        return o["power_w"]
    return o["devices"] + o["power_w"] * 1e-9


def _solve_fleet(spec, demand, options_list, machines, slo, options):
    """The fleet as an integer program (CP-SAT).

    Either one colocated pool (x_c) or one prefill pool (y_p) with a decode pool of integer
    instance counts n_d over any decode options (hardware kinds may mix): sum n_d cap_d >= rate,
    where cap_d is what one instance carries within its SLOs. A decode option may serve only a
    prefill pool that can hand it the KV cache within the TTFT SLOs. Devices, power and budget
    are linear limits; the objective (cost, power, devices) is linear in the counts.
    """
    from ortools.sat.python import cp_model

    obj = [_option_objective(o, options.objective) for o in options_list]
    usable = [i for i, v in enumerate(obj) if np.isfinite(v)]
    if not usable:
        raise SpecError("no candidate system has a price in the database, so no cost can be minimized; add "
                        "price_usd or node_price_usd (or cloud_usd_per_hour) with --hardware-db, or use "
                        "--objective energy or devices")
    colo = [i for i in usable if options_list[i]["role"] == "colocated"]
    pre = [i for i in usable if options_list[i]["role"] == "prefill"]
    dec = [i for i in usable if options_list[i]["role"] == "decode"]
    model = cp_model.CpModel()
    x = {i: model.NewBoolVar(f"colo{i}") for i in colo}
    y = {i: model.NewBoolVar(f"pre{i}") for i in pre}
    n = {i: model.NewIntVar(0, options_list[i]["instances"], f"dec{i}") for i in dec}
    u = {i: model.NewBoolVar(f"use{i}") for i in dec}
    model.Add(sum(x.values()) + sum(y.values()) == 1)
    any_pre = sum(y.values())
    for i in dec:
        model.Add(n[i] >= 1).OnlyEnforceIf(u[i])
        model.Add(n[i] == 0).OnlyEnforceIf(u[i].Not())
        model.Add(u[i] <= any_pre)
    # Capacity in micro-requests per second (rounded down: conservative).
    need = int(math.ceil(demand.rate * 1e6))
    # (With no decode option at all, this forbids every prefill pool.)
    model.Add(sum(int(options_list[i]["capacity"] * 1e6) * n[i] for i in dec) >= need * any_pre)
    # KV hand-over compatibility depends on the decode option's group (system, instance size, KV
    # precision): one indicator per group that any of its options is used.
    groups: dict[tuple, list[int]] = {}
    for d in dec:
        o = options_list[d]
        groups.setdefault((o["system"], o["devices_per_instance"], o["kvp"]), []).append(d)
    kv_s = {}
    for g, members in groups.items():
        used = model.NewBoolVar(f"group{len(kv_s)}")
        for d in members:
            model.Add(u[d] <= used)
        for p in pre:
            ok, kv = _kv_ok(spec, demand, options_list[p], options_list[members[0]], machines, slo)
            for d in members:
                kv_s[p, d] = kv
            if not ok:
                model.Add(y[p] + used <= 1)
    per_instance = {i: options_list[i]["devices_per_instance"] for i in dec}

    def total(key_colo, key_dec):
        return (sum(key_colo(i) * x[i] for i in colo) + sum(key_colo(i) * y[i] for i in pre)
                + sum(key_dec(i) * n[i] for i in dec))

    if options.max_devices:
        model.Add(total(lambda i: options_list[i]["devices"], lambda i: per_instance[i]) <= options.max_devices)
    if options.power_cap_w is not None:
        model.Add(total(lambda i: int(options_list[i]["power_w"]),
                        lambda i: int(math.ceil(options_list[i]["power_w"] / options_list[i]["instances"])))
                  <= int(options.power_cap_w))
    if options.budget_usd_per_hour is not None and options.objective == "cost":
        model.Add(total(lambda i: int(math.ceil(obj[i] * 1e3)),
                        lambda i: int(math.ceil(obj[i] / options_list[i]["instances"] * 1e3)))
                  <= int(options.budget_usd_per_hour * 1e3))
    scale = 1e9 / max(max(obj[i] for i in usable), 1e-300)
    model.Minimize(total(lambda i: int(round(obj[i] * scale)),
                         lambda i: int(round(obj[i] / options_list[i]["instances"] * scale))))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = 20.0  # reproducible, unlike wall-clock limits
    status = solver.Solve(model)
    name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, 0.0
    gap = 0.0 if status == cp_model.OPTIMAL else abs(solver.ObjectiveValue() - solver.BestObjectiveBound()) / max(
        abs(solver.ObjectiveValue()), 1e-12)
    chosen = [i for i in colo if solver.Value(x[i])]
    if chosen:
        return _deployment("colocated", [options_list[chosen[0]]], demand), name, gap
    p = next(i for i in pre if solver.Value(y[i]))
    used = [i for i in dec if solver.Value(n[i]) > 0]
    kv = max(kv_s[p, d] for d in used)
    return _deployment("disaggregated", [options_list[p]] + [options_list[d] for d in used], demand, kv,
                       counts=[options_list[p]["instances"]] + [solver.Value(n[d]) for d in used]), name, gap


def _closest(counter: dict, fastest: dict, demand: Demand) -> str:
    """What the nearest configurations lack: the best latencies any instance that fits reaches."""
    parts = []
    if "tpot_p90" in fastest and demand.tpot_p90 is not None:
        parts.append(f"the fastest decode instance reaches TPOT p90 {fastest['tpot_p90'] * 1e3:,.3g} ms "
                     f"(target {demand.tpot_p90 * 1e3:,.3g} ms)")
    if "prefill_p90" in fastest and demand.ttft_p90 is not None:
        parts.append(f"the fastest prefill takes {fastest['prefill_p90'] * 1e3:,.3g} ms before any queueing "
                     f"(TTFT target {demand.ttft_p90 * 1e3:,.3g} ms)")
    if not fastest:
        parts.append("no instance configuration fits in memory on the candidate systems")
    if counter:
        worst = max(counter.items(), key=lambda kv: kv[1])
        parts.append(f"most configurations fail on {worst[0]} ({worst[1]:,})")
    return "; ".join(parts)


def raise_if_infeasible(result: ServeSearchResult) -> None:
    if result.best is None:
        raise InfeasibleError(f"no deployment meets the demand and SLOs among {result.evidence.configurations:,} "
                              f"instance configurations; {result.closest}")
