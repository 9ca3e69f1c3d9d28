"""The fastest deployment on a given fleet (``plan serve --objective latency``): instance, solver,
solution and an independent checker.

Latency is the request's: TTFT p90 + mean output tokens x TPOT p90 (APEX's end-to-end latency
objective for a given cluster; Lin, Kwon, Pineda and Paravecino 2024, arXiv 2411.17651). On a fixed fleet every
added instance can only shorten the queues (perfmodel.queueing: the Erlang C wait falls with the
servers; a colocated instance's time-sharing stretch falls with its share of the rate), so:

- a colocated pool takes the most instances the fleet's devices, power cap and budget allow;
- a disaggregated fleet gives its decode pool the fewest instances that carry the rate within the
  TPOT targets (a decode instance's step time does not depend on how many there are: its batch is
  part of its configuration) and every remaining device to the prefill pool.

The search enumerates every colocated option and every KV-compatible prefill / decode pair at those
counts, so it is exact over the pool options it is given; ``serve_pools._pool_options`` prunes only
options another beats in every parameter the latencies rise with (exact dominance). A fleet of one
prefill and one decode configuration is searched: a second decode configuration cannot lower the
slowest pool's TPOT, only free devices for prefill, and that is not searched (stated in the evidence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.queueing import pool_latencies

from .pool_option import PoolOption

SOLVER = ("exhaustive enumeration of the non-dominated pool options at the counts the fleet allows (colocated: "
          "the most instances; disaggregated: the fewest decode instances, every other device to prefill); one "
          "configuration per pool")
LATENCY = "TTFT p90 + mean output tokens x TPOT p90"


@dataclass(frozen=True)
class FastestInstance:
    """Pool options (each with its ``queue``: unloaded prefill and step times, batch and attention
    ranks), the demand's rate, output length and targets, the fleet's limits, and the KV
    hand-over seconds of every prefill / decode pair in the same KV format."""

    options: tuple[PoolOption, ...]
    rate: float
    output_mean: float
    slo: dict
    max_devices: int
    power_cap_w: float | None = None
    budget_usd_per_hour: float | None = None
    handover: tuple[tuple[int, int, float], ...] = ()


@dataclass(frozen=True)
class FastestSolution:
    """A front pool (colocated or prefill) at ``front_count`` instances and, after a prefill pool,
    one decode option at ``decode_count``; ``latency_s`` as the solver computed it."""

    front: int
    front_count: int
    decode: int | None = None
    decode_count: int = 0
    kv_s: float = 0.0
    latency_s: float = math.inf


def latencies(option: PoolOption, count, rate: float):
    """(TTFT p50, TTFT p90, TPOT p50, TPOT p90, in flight per instance) of ``count`` instances of a
    pool option carrying ``rate`` (perfmodel.queueing.pool_latencies); vectorized over counts."""
    q = option.queue
    ttft, t50, t90, load, in_flight = pool_latencies(option.role, np.asarray(count, dtype=float), rate,
                                                     q.output_tokens_mean, q.batch, q.dp_attention, q.prefill_p50_s,
                                                     q.prefill_p90_s, q.tpot_p50_s, q.tpot_p90_s,
                                                     mixed50=q.mixed_step_p50_s, mixed90=q.mixed_step_p90_s)
    ttft50, ttft90 = (np.where(load < 1.0, ttft[k], np.inf) for k in (0.5, 0.9))
    return ttft50, ttft90, t50, t90, in_flight


def _per_instance(pool_value: float | None, option: PoolOption) -> float:
    """One instance's share of a pool total of ``option`` (its power or price; no price counts 0)."""
    return (pool_value or 0.0) / option.instances


def _largest(option: PoolOption, devices: float, power_w: float, usd: float) -> int:
    """The most instances of ``option`` that ``devices``, ``power_w`` and ``usd`` per hour leave room for."""
    n = devices // option.devices_per_instance
    if math.isfinite(power_w):
        n = min(n, math.floor(power_w / _per_instance(option.power_w, option) * (1 + 1e-12)))
    if math.isfinite(usd):
        n = min(n, math.floor(usd / max(_per_instance(option.usd_per_hour, option), 1e-300) * (1 + 1e-12)))
    return int(max(n, 0))


def _meets(slo: dict, ttft50, ttft90, tpot50=None, tpot90=None):
    ok = np.isfinite(ttft90)
    for value, key in ((ttft50, "ttft_p50"), (ttft90, "ttft_p90"), (tpot50, "tpot_p50"), (tpot90, "tpot_p90")):
        if value is not None and slo[key] is not None:
            ok = ok & (value <= slo[key] * (1 + 1e-12))
    return ok


def solve(instance: FastestInstance) -> list[FastestSolution]:
    """Every feasible fleet the enumeration reaches (one per colocated option, the best split per
    prefill / decode pair), fastest first."""
    opts = instance.options
    power = instance.power_cap_w if instance.power_cap_w is not None else math.inf
    usd = instance.budget_usd_per_hour if instance.budget_usd_per_hour is not None else math.inf
    found = []
    for i, o in enumerate(opts):
        if o.role != "colocated" or (math.isfinite(usd) and o.usd_per_hour is None):
            continue
        n = _largest(o, instance.max_devices, power, usd)
        if n < o.instances:
            continue
        t50, t90, p50, p90, _ = latencies(o, n, instance.rate)
        found.append(FastestSolution(i, n, latency_s=float(t90 + instance.output_mean * p90)))
    pairs: dict[int, list[tuple[int, float]]] = {}
    for p, d, kv in instance.handover:
        pairs.setdefault(p, []).append((d, kv))
    for p, decodes in pairs.items():
        o = opts[p]
        if math.isfinite(usd) and o.usd_per_hour is None:
            continue
        counts, kept = [], []
        for d, kv in decodes:
            od = opts[d]
            if math.isfinite(usd) and od.usd_per_hour is None:
                continue
            n = _largest(o, instance.max_devices - od.devices, power - od.power_w, usd - (od.usd_per_hour or 0))
            if n >= o.instances:
                counts.append(n)
                kept.append((d, kv))
        if not kept:
            continue
        t50, t90, _, _, _ = latencies(o, np.array(counts), instance.rate)
        kv = np.array([k for _, k in kept])
        ok = _meets(instance.slo, t50 + kv, t90 + kv)
        total = t90 + kv + instance.output_mean * np.array([opts[d].tpot_p90_s for d, _ in kept])
        for j in np.flatnonzero(ok):
            d = kept[j][0]
            found.append(FastestSolution(p, counts[j], d, opts[d].instances, float(kv[j]), float(total[j])))
    return sorted(found, key=lambda s: (s.latency_s, s.front, s.decode or -1))


def check(instance: FastestInstance, solution: FastestSolution) -> list[str]:
    """What is wrong with ``solution`` (empty: nothing), re-derived from the instance alone: roles,
    counts within the fleet's limits, decode slots for every sequence in flight, every latency target
    at the solution's counts, and the latency the solver reported."""
    opts, problems = instance.options, []
    front = opts[solution.front]
    parts = [(front, solution.front_count)]
    if front.role == "colocated" and solution.decode is not None:
        problems.append("a colocated pool takes no decode pool")
    if front.role == "prefill":
        if solution.decode is None or opts[solution.decode].role != "decode":
            return problems + ["a prefill pool needs a decode pool"]
        kv = dict(((p, d), s) for p, d, s in instance.handover).get((solution.front, solution.decode))
        if kv is None or kv != solution.kv_s:
            problems.append("the KV hand-over of this pair is not the instance's")
        parts.append((opts[solution.decode], solution.decode_count))
    if front.role == "decode":
        problems.append("a decode pool cannot stand alone")
    devices = sum(o.devices_per_instance * n for o, n in parts)
    power_w = sum(_per_instance(o.power_w, o) * n for o, n in parts)
    if devices > instance.max_devices:
        problems.append(f"{devices:,} devices, the fleet has {instance.max_devices:,}")
    if instance.power_cap_w is not None and power_w > instance.power_cap_w * (1 + 1e-9):
        problems.append(f"{power_w:,.0f} W, the cap is {instance.power_cap_w:,.0f} W")
    if instance.budget_usd_per_hour is not None:
        if any(o.usd_per_hour is None for o, _ in parts):
            problems.append("no price")
        elif sum(_per_instance(o.usd_per_hour, o) * n for o, n in parts) > instance.budget_usd_per_hour * (1 + 1e-9):
            problems.append("over the budget")
    ttft50 = ttft90 = tpot50 = tpot90 = 0.0
    for o, n in parts:
        t50, t90, p50, p90, in_flight = (float(x) for x in latencies(o, n, instance.rate))
        if o.role != "prefill" and in_flight > o.queue.batch * (1 + 1e-12):
            problems.append(f"{in_flight:,.1f} sequences in flight per {o.role} instance, {o.queue.batch} slots")
        if o.role != "decode":
            ttft50, ttft90 = t50 + solution.kv_s, t90 + solution.kv_s
        if o.role != "prefill":
            tpot50, tpot90 = p50, p90
    if not _meets(instance.slo, ttft50, ttft90, tpot50, tpot90):
        problems.append(f"a latency target is missed (TTFT p90 {ttft90:.4g} s, TPOT p90 {tpot90:.4g} s)")
    latency = ttft90 + instance.output_mean * tpot90
    if not math.isclose(latency, solution.latency_s, rel_tol=1e-9):
        problems.append(f"latency {latency:.6g} s, the solver reported {solution.latency_s:.6g} s")
    return problems


def sized(instance: FastestInstance, solution: FastestSolution) -> tuple[tuple[PoolOption, ...], tuple]:
    """The solution's pools as options sized to its counts (the form ``serve._deployment`` reads):
    (options, handover)."""
    out = []
    for i, n in ((solution.front, solution.front_count), (solution.decode, solution.decode_count)):
        if i is None:
            continue
        o = instance.options[i]
        t50, t90, p50, p90, _ = (float(x) for x in latencies(o, n, instance.rate))
        scale = n / o.instances
        # requests_per_s_per_instance stays the option's: the rate over its fewest instances.
        out.append(replace(o, instances=n, power_w=o.power_w * scale,
                           usd_per_hour=None if o.usd_per_hour is None else o.usd_per_hour * scale,
                           ttft_p50_s=t50, ttft_p90_s=t90, tpot_p50_s=p50, tpot_p90_s=p90))
    handover = ((0, 1, solution.kv_s),) if len(out) == 2 else ()
    return tuple(out), handover
