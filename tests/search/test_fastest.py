"""The fastest deployment on a given fleet (search.fastest, ``plan serve --objective latency``) on
hand-made instances: latencies worked out by hand, the solver against a brute force that tries every
option at every count and every split of the fleet, the checker on broken solutions, the sized pools,
monotonicity in the fleet's limits, and determinism.

The brute force shares nothing with the solver but the queueing model (perfmodel.queueing): it
re-derives every target, slot and limit itself. Pool options are sized as search.serve_pools sizes
them, to the fewest instances that carry the rate within the targets alone; powers are whole watts
per instance, so sums of them are exact.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.queueing import pool_latencies
from perfmodel.search import fastest, fleet
from perfmodel.search.fastest import FastestInstance, FastestSolution
from perfmodel.search.pool_option import InstanceConfig, PoolOption, QueueInputs

# What neither the solver nor the checker reads (errors, memory, configuration): the same for every option.
NEUTRAL = PoolOption(role="colocated", system="s", accelerator="a", instances=1, devices_per_instance=1, power_w=0.0,
                     usd_per_hour=None, ttft_p50_s=0.0, ttft_p90_s=0.0, tpot_p50_s=0.0, tpot_p90_s=0.0,
                     ttft_error=0.0, tpot_error=0.0, prefill_p90_s=0.0, step_p90_s=0.0, hbm_used_bytes=0.0,
                     requests_per_s_per_instance=1.0, queue=QueueInputs(1.0, 1, 1, 0.0, 0.0, 0.0, 0.0),
                     config=InstanceConfig(1, 1, 1, 1, 1, "bf16", "a16", "bf16", "hbm", "hbm", 0))
NO_TARGETS = {"ttft_p50": None, "ttft_p90": None, "tpot_p50": None, "tpot_p90": None}
MOST_INSTANCES = 64   # the sizing below looks this far for an option's fewest instances


# --- the model alone, re-derived (no search.fastest) ----------------------------------------------

def _alone(option: PoolOption, counts, rate: float) -> dict[str, np.ndarray]:
    """The queueing model's figures for ``counts`` instances of ``option`` carrying ``rate``."""
    q = option.queue
    ttft, tpot50, tpot90, load, in_flight = pool_latencies(
        option.role, np.asarray(counts, dtype=float), rate, q.output_tokens_mean, q.batch, q.dp_attention,
        q.prefill_p50_s, q.prefill_p90_s, q.tpot_p50_s, q.tpot_p90_s, mixed50=q.mixed_step_p50_s,
        mixed90=q.mixed_step_p90_s)
    shape = np.shape(counts)   # a decode pool's TPOT does not depend on its count: a scalar, broadcast
    return {name: np.broadcast_to(np.asarray(value, dtype=float), shape).copy() for name, value in
            (("ttft50", ttft[0.5]), ("ttft90", ttft[0.9]), ("tpot50", tpot50), ("tpot90", tpot90), ("load", load),
             ("in_flight", in_flight))}


def _meets_alone(option: PoolOption, figures: dict, slo: dict, kv_s: float = 0.0) -> np.ndarray:
    """Where the pool meets its own targets (a prefill pool: TTFT after ``kv_s`` of hand-over; a decode
    pool: TPOT and a slot for every sequence in flight; a colocated pool: both), on a stable queue."""
    good = figures["load"] < 1.0
    if option.role != "decode":
        good &= np.isfinite(figures["ttft90"])
        for key, value in (("ttft_p50", figures["ttft50"]), ("ttft_p90", figures["ttft90"])):
            if slo[key] is not None:
                good &= value + kv_s <= slo[key]
    if option.role != "prefill":
        good &= figures["in_flight"] <= option.queue.batch
        for key, value in (("tpot_p50", figures["tpot50"]), ("tpot_p90", figures["tpot90"])):
            if slo[key] is not None:
                good &= value <= slo[key]
    return good


def _option(role: str, queue: QueueInputs, rate: float, slo: dict, devices_per_instance: int = 1,
            watts_each: int = 1000, usd_each: float | None = 1.0, kv_precision: str = "bf16") -> PoolOption | None:
    """An option sized as search.serve_pools sizes it: the fewest instances meeting the targets alone,
    its totals and latencies at that count; None when no count up to MOST_INSTANCES does."""
    config = replace(NEUTRAL.config, kv_precision=kv_precision)
    base = replace(NEUTRAL, role=role, devices_per_instance=devices_per_instance, queue=queue, config=config)
    counts = np.arange(1, MOST_INSTANCES + 1)
    ok = np.flatnonzero(_meets_alone(base, _alone(base, counts, rate), slo))
    if not len(ok):
        return None
    n = int(counts[ok[0]])
    at = _alone(base, n, rate)
    return replace(base, instances=n, power_w=float(watts_each * n),
                   usd_per_hour=None if usd_each is None else usd_each * n,
                   ttft_p50_s=float(at["ttft50"]), ttft_p90_s=float(at["ttft90"]), tpot_p50_s=float(at["tpot50"]),
                   tpot_p90_s=float(at["tpot90"]), requests_per_s_per_instance=rate / n)


def _brute_fastest(instance: FastestInstance) -> float:
    """The lowest latency of every fleet within the limits: every colocated option at every count from 1,
    every prefill / decode pair of the hand-over at every count of each from 1 (no sizing, no
    monotonicity assumed); inf when none meets the targets."""
    opts, rate, slo = instance.options, instance.rate, instance.slo
    top = instance.max_devices
    counts = np.arange(1, top + 1)
    figures = [_alone(o, counts, rate) for o in opts]
    power = math.inf if instance.power_cap_w is None else instance.power_cap_w * (1 + 1e-9)
    budget = math.inf if instance.budget_usd_per_hour is None else instance.budget_usd_per_hour * (1 + 1e-9)

    def within(parts) -> bool:
        devices = sum(o.devices_per_instance * n for o, n in parts)
        watts = sum(o.power_w / o.instances * n for o, n in parts)
        if math.isfinite(budget) and any(o.usd_per_hour is None for o, _ in parts):
            return False
        usd = sum((o.usd_per_hour or 0.0) / o.instances * n for o, n in parts)
        return devices <= top and watts <= power and usd <= budget

    best = math.inf
    for i, o in enumerate(opts):
        if o.role != "colocated":
            continue
        ok = _meets_alone(o, figures[i], slo)
        for k, n in enumerate(counts):
            if ok[k] and within([(o, n)]):
                best = min(best, float(figures[i]["ttft90"][k] + instance.output_mean * figures[i]["tpot90"][k]))
    for p, d, kv in instance.handover:
        ok_p, ok_d = _meets_alone(opts[p], figures[p], slo, kv), _meets_alone(opts[d], figures[d], slo)
        for kp, n_p in enumerate(counts):
            for kd, n_d in enumerate(counts):
                if ok_p[kp] and ok_d[kd] and within([(opts[p], n_p), (opts[d], n_d)]):
                    best = min(best, float(figures[p]["ttft90"][kp] + kv
                                           + instance.output_mean * figures[d]["tpot90"][kd]))
    return best


# --- a hand-made instance -------------------------------------------------------------------------
#
# One request per second of 100 output tokens. Every queue here waits 0 at p50 and p90 (Erlang C below
# 0.1: C(1, a) = a for one server, and a <= 0.0101), so the latencies follow by hand:
# - colocated C, 2 devices, 1000 W, $2/h per instance: at n instances its decode share is
#   1 x 100 x 0.01 / 100 / n = 0.01 / n and its prefill share 1 x 0.01 / n = 0.01 / n, so
#   TTFT p90 = 0.02 / (1 - 0.01 / n), TPOT p90 = 0.01 / (1 - 0.01 / n): latency 1.02 / (1 - 0.01 / n);
# - prefill P, 1 device, 300 W, $0.5/h: TTFT p90 = 0.1 (its p90 prompt);
# - decode D, 1 device, 300 W, $0.5/h: TPOT p90 = 0.015, 1 sequence in flight (1 x 100 x 0.01);
# - decode E, 1 device, 200 W, $0.25/h: TPOT p90 = 0.05, 5 in flight per instance over 4 slots: 2 instances;
# - decode F (fp8 KV): no prefill option reads its KV format, so it is never paired.
# P -> D hands over in 5 ms, P -> E in 1 ms: P + D takes 0.1 + 0.005 + 1.5 = 1.605 s, P + E 5.101 s.

RATE, OUTPUT = 1.0, 100.0
TARGETS = {"ttft_p50": None, "ttft_p90": 1.0, "tpot_p50": None, "tpot_p90": 0.06}


def _hand_options() -> tuple[PoolOption, ...]:
    specs = [("colocated", QueueInputs(OUTPUT, 100, 1, 0.01, 0.02, 0.01, 0.01), 2, 1000, 2.0, "bf16"),
             ("prefill", QueueInputs(OUTPUT, 1, 1, 0.05, 0.1, 0.0, 0.0), 1, 300, 0.5, "bf16"),
             ("decode", QueueInputs(OUTPUT, 64, 1, 0.0, 0.0, 0.01, 0.015), 1, 300, 0.5, "bf16"),
             ("decode", QueueInputs(OUTPUT, 4, 1, 0.0, 0.0, 0.05, 0.05), 1, 200, 0.25, "bf16"),
             ("decode", QueueInputs(OUTPUT, 64, 1, 0.0, 0.0, 0.005, 0.005), 1, 100, 0.25, "fp8")]
    return tuple(_option(role, q, RATE, TARGETS, dpi, watts, usd, kvp) for role, q, dpi, watts, usd, kvp in specs)


C, P, D, E, F = range(5)
HAND_HANDOVER = ((P, D, 0.005), (P, E, 0.001))


def _hand(**limits) -> FastestInstance:
    return FastestInstance(_hand_options(), RATE, OUTPUT, TARGETS, **{"max_devices": 4, **limits},
                           handover=HAND_HANDOVER)


def _colocated_latency(n: int) -> float:
    return 1.02 / (1 - 0.01 / n)


def test_the_hand_made_options_are_sized_as_worked_out():
    opts = _hand_options()
    assert [o.instances for o in opts] == [1, 1, 1, 2, 1]
    assert opts[C].ttft_p90_s == pytest.approx(0.02 / 0.99, rel=1e-12)
    assert opts[C].tpot_p90_s == pytest.approx(0.01 / 0.99, rel=1e-12)
    assert opts[P].ttft_p90_s == pytest.approx(0.1, rel=1e-12)
    assert (opts[D].tpot_p90_s, opts[E].tpot_p90_s) == (0.015, 0.05)
    # latencies() is the same model, vectorized over counts: (TTFT p50, p90, TPOT p50, p90, in flight).
    t50, t90, p50, p90, in_flight = fastest.latencies(opts[C], [1, 2, 4], RATE)
    assert t90 == pytest.approx([0.02 / (1 - 0.01 / n) for n in (1, 2, 4)], rel=1e-12)
    assert t50 == pytest.approx([0.01 / (1 - 0.01 / n) for n in (1, 2, 4)], rel=1e-12)
    assert p90 == pytest.approx([0.01 / (1 - 0.01 / n) for n in (1, 2, 4)], rel=1e-12)
    assert in_flight == pytest.approx([100 * 0.01 / (1 - 0.01 / n) / n for n in (1, 2, 4)], rel=1e-12)
    assert fastest.latencies(opts[E], 1, RATE)[4] == pytest.approx(5.0)


@pytest.mark.parametrize("limits, expected", [
    # four devices: two colocated instances beat every split
    ({}, [FastestSolution(C, 2, latency_s=_colocated_latency(2)),
          FastestSolution(P, 3, D, 1, 0.005, 1.605), FastestSolution(P, 2, E, 2, 0.001, 5.101)]),
    # 1500 W: one colocated instance; P + E leaves 1100 W for three prefill instances, but only one device
    ({"power_cap_w": 1500.0}, [FastestSolution(C, 1, latency_s=_colocated_latency(1)),
                               FastestSolution(P, 3, D, 1, 0.005, 1.605), FastestSolution(P, 2, E, 2, 0.001, 5.101)]),
    # 900 W: no colocated instance; P + D at 300 + 2 x 300 W
    ({"power_cap_w": 900.0}, [FastestSolution(P, 2, D, 1, 0.005, 1.605), FastestSolution(P, 1, E, 2, 0.001, 5.101)]),
    # $1.75/h: no colocated instance ($2); P + D at $0.5 + 2 x $0.5 (a third would be $2)
    ({"budget_usd_per_hour": 1.75}, [FastestSolution(P, 2, D, 1, 0.005, 1.605),
                                     FastestSolution(P, 2, E, 2, 0.001, 5.101)]),
    # three devices: one colocated instance (2 devices), or P + D splits 2 + 1
    ({"max_devices": 3}, [FastestSolution(C, 1, latency_s=_colocated_latency(1)),
                          FastestSolution(P, 2, D, 1, 0.005, 1.605), FastestSolution(P, 1, E, 2, 0.001, 5.101)]),
    # one device: nothing fits
    ({"max_devices": 1}, []),
])
def test_solve_lists_every_fleet_the_enumeration_reaches_fastest_first(limits, expected):
    """One solution per colocated option at the most instances the limits allow and per prefill /
    decode pair at the fewest decode instances and every other device to prefill, sorted by
    latency; each equals the hand-worked fleet and passes the checker."""
    instance = _hand(**limits)
    found = fastest.solve(instance)
    assert [(s.front, s.front_count, s.decode, s.decode_count, s.kv_s) for s in found] == \
        [(s.front, s.front_count, s.decode, s.decode_count, s.kv_s) for s in expected]
    assert [s.latency_s for s in found] == pytest.approx([s.latency_s for s in expected], rel=1e-12)
    assert all(fastest.check(instance, s) == [] for s in found)
    assert (found[0].latency_s if found else math.inf) == pytest.approx(_brute_fastest(instance), rel=1e-12)


def test_the_kv_hand_over_counts_toward_the_ttft_target():
    """With a TTFT p90 target of 0.104 s, P's 0.1 s plus D's 5 ms hand-over misses it and P's 1 ms to E
    meets it: only P + E is listed, however much faster P + D would be."""
    instance = replace(_hand(power_cap_w=900.0), slo={**TARGETS, "ttft_p90": 0.104})
    found = fastest.solve(instance)
    assert [(s.front, s.decode) for s in found] == [(P, E)]
    assert _brute_fastest(instance) == pytest.approx(found[0].latency_s, rel=1e-12)


def test_a_decode_configuration_with_a_kv_format_no_prefill_writes_is_never_paired():
    assert all(s.decode != F for s in fastest.solve(_hand(max_devices=64)))


def _valid_pair() -> FastestSolution:
    return FastestSolution(P, 3, D, 1, 0.005, 1.605)


@pytest.mark.parametrize("instance_limits, solution, expected", [
    ({}, FastestSolution(C, 3, latency_s=_colocated_latency(3)), "6 devices, the fleet has 4"),
    ({}, FastestSolution(P, 4, D, 1, 0.005, 1.605), "5 devices, the fleet has 4"),
    ({"power_cap_w": 1500.0}, FastestSolution(C, 2, latency_s=_colocated_latency(2)), "2,000 W, the cap is 1,500 W"),
    ({"power_cap_w": 1000.0}, _valid_pair(), "1,200 W, the cap is 1,000 W"),
    ({"budget_usd_per_hour": 3.5}, FastestSolution(C, 2, latency_s=_colocated_latency(2)), "over the budget"),
    ({"budget_usd_per_hour": 1.5}, _valid_pair(), "over the budget"),
    ({"slo": {**TARGETS, "tpot_p90": 0.014}}, _valid_pair(), "a latency target is missed"),
    ({"slo": {**TARGETS, "ttft_p90": 0.104}}, _valid_pair(), "a latency target is missed"),   # 0.1 + 5 ms
    ({"slo": {**TARGETS, "ttft_p50": 0.01}}, FastestSolution(C, 2, latency_s=_colocated_latency(2)),
     "a latency target is missed"),
    ({}, FastestSolution(P, 2, E, 1, 0.001, 0.1 + 0.001 + 5.0), "5.0 sequences in flight per decode instance, 4 slots"),
    ({}, replace(_valid_pair(), latency_s=1.6), "latency 1.605 s, the solver reported 1.6 s"),
    ({}, replace(_valid_pair(), kv_s=0.004, latency_s=1.604), "the KV hand-over of this pair is not the instance's"),
    ({}, FastestSolution(P, 1, F, 1, 0.0, 0.1 + 0.5), "the KV hand-over of this pair is not the instance's"),
    ({}, FastestSolution(P, 1, latency_s=0.1), "a prefill pool needs a decode pool"),
    ({}, FastestSolution(P, 1, C, 1, 0.005, 1.0), "a prefill pool needs a decode pool"),
    ({}, FastestSolution(D, 1, latency_s=1.5), "a decode pool cannot stand alone"),
    ({}, FastestSolution(C, 1, D, 1, latency_s=_colocated_latency(1)), "a colocated pool takes no decode pool"),
])
def test_the_checker_names_what_a_broken_solution_breaks(instance_limits, solution, expected):
    """Each solution breaks one rule on an instance where the rest holds; the checker says which, in
    words, re-derived from the instance (never the solver's figures)."""
    limits = {k: v for k, v in instance_limits.items() if k != "slo"}
    instance = replace(_hand(**limits), slo=instance_limits.get("slo", TARGETS))
    problems = fastest.check(instance, solution)
    assert any(expected in p for p in problems), problems


def test_the_checker_accepts_limits_met_with_equality_and_refuses_a_missing_price():
    """P + D at 3 devices, 900 W and $1.5/h passes limits of exactly that; an unpriced pool fails any budget."""
    pair = FastestSolution(P, 2, D, 1, 0.005, 1.605)
    assert fastest.check(_hand(max_devices=3, power_cap_w=900.0, budget_usd_per_hour=1.5), pair) == []
    assert fastest.check(_hand(), _valid_pair()) == []
    unpriced = _hand(budget_usd_per_hour=100.0)
    unpriced = replace(unpriced, options=tuple(replace(o, usd_per_hour=None) if i == D else o
                                               for i, o in enumerate(unpriced.options)))
    assert any("no price" in p for p in fastest.check(unpriced, pair))
    assert all(s.decode != D for s in fastest.solve(unpriced))   # the solver leaves it out too


def test_sized_pools_carry_the_rate_at_the_solutions_counts():
    """The sized pools are the options at the solution's counts: totals scaled, latencies the model's
    there, the whole rate carried; the fleet checker accepts them as serve._fastest builds them, and
    their latencies add up to the solution's."""
    for limits in ({}, {"power_cap_w": 900.0}, {"max_devices": 3}):
        instance = _hand(**limits)
        for solution in fastest.solve(instance):
            pools, handover = fastest.sized(instance, solution)
            parts = [(solution.front, solution.front_count)] + \
                ([(solution.decode, solution.decode_count)] if solution.decode is not None else [])
            assert len(pools) == len(parts)
            for pool, (i, n) in zip(pools, parts):
                option = instance.options[i]
                assert (pool.role, pool.instances, pool.queue, pool.config) == (option.role, n, option.queue,
                                                                                option.config)
                assert pool.power_w == pytest.approx(option.power_w / option.instances * n, rel=1e-12)
                assert pool.usd_per_hour == pytest.approx(option.usd_per_hour / option.instances * n, rel=1e-12)
                assert pool.instances * pool.requests_per_s_per_instance >= RATE * (1 - 1e-12)
                at = _alone(option, n, RATE)
                assert (pool.ttft_p50_s, pool.ttft_p90_s, pool.tpot_p50_s, pool.tpot_p90_s) == pytest.approx(
                    (float(at["ttft50"]), float(at["ttft90"]), float(at["tpot50"]), float(at["tpot90"])), rel=1e-12)
            front, decode = pools[0], pools[-1]
            kv = handover[0][2] if handover else 0.0
            assert handover == (((0, 1, solution.kv_s),) if solution.decode is not None else ())
            assert front.ttft_p90_s + kv + OUTPUT * decode.tpot_p90_s == pytest.approx(solution.latency_s, rel=1e-12)
            fi = fleet.FleetInstance(options=pools, objective="devices", max_devices=instance.max_devices,
                                     power_cap_w=instance.power_cap_w,
                                     budget_usd_per_hour=instance.budget_usd_per_hour, handover=handover)
            decodes = ((1, pools[1].instances),) if len(pools) == 2 else ()
            assert fleet.check(fi, fleet.FleetSolution(0, decodes)) == []


def test_more_devices_are_never_slower_on_the_hand_made_instance():
    latencies = [(fastest.solve(_hand(max_devices=k)) or [FastestSolution(0, 0)])[0].latency_s for k in range(1, 17)]
    assert latencies[0] == math.inf and all(b <= a for a, b in zip(latencies, latencies[1:]))
    assert latencies[-1] == pytest.approx(_colocated_latency(8), rel=1e-12)


def test_the_same_instance_gives_the_same_solutions():
    """Solving is a pure function of the instance: twice, or on an equal instance built anew."""
    first = fastest.solve(_hand(power_cap_w=1500.0))
    assert fastest.solve(_hand(power_cap_w=1500.0)) == first == fastest.solve(_hand(power_cap_w=1500.0))
    assert [fastest.sized(_hand(power_cap_w=1500.0), s) for s in first] == \
        [fastest.sized(_hand(power_cap_w=1500.0), s) for s in first]


def test_the_solver_text_names_the_objective():
    assert "exhaustive enumeration" in fastest.SOLVER and "one configuration per pool" in fastest.SOLVER
    assert fastest.LATENCY == "TTFT p90 + mean output tokens x TPOT p90"


# --- random small instances against brute force ----------------------------------------------------

@st.composite
def _instances(draw) -> FastestInstance:
    """One or two prefill and decode options and up to two colocated ones over two KV formats, each
    sized to its fewest instances alone, with a device limit and sometimes a power cap and a budget."""
    rate = draw(st.sampled_from([0.5, 2.0, 6.0]))
    output = draw(st.sampled_from([32.0, 128.0]))
    slo = {"ttft_p50": draw(st.sampled_from([None, 0.6])), "ttft_p90": draw(st.sampled_from([None, 0.8, 2.0])),
           "tpot_p50": draw(st.sampled_from([None, 0.03])), "tpot_p90": draw(st.sampled_from([None, 0.04, 0.1]))}
    options = []
    roles = [role for role, least in (("colocated", 0), ("prefill", 1), ("decode", 1))
             for _ in range(draw(st.integers(least, 2)))]
    for role in roles:
        prefill50 = draw(st.floats(0.02, 0.3))
        tpot50 = draw(st.floats(0.004, 0.04))
        mixed = draw(st.sampled_from([0.0, 1.5, 3.0])) if role == "colocated" else 0.0
        queue = QueueInputs(output, draw(st.sampled_from([4, 16, 64])), draw(st.sampled_from([1, 2])), prefill50,
                            prefill50 * draw(st.floats(1.0, 2.5)), tpot50, tpot50 * draw(st.floats(1.0, 1.6)),
                            tpot50 * mixed, tpot50 * mixed * 1.2)
        option = _option(role, queue, rate, slo, draw(st.sampled_from([1, 2, 4])), draw(st.integers(100, 1000)),
                         draw(st.sampled_from([None, 0.5, 1.0, 2.5])), draw(st.sampled_from(["bf16", "bf16", "fp8"])))
        if option is not None:
            options.append(option)
    handover = tuple((p, d, draw(st.sampled_from([0.0, 0.01, 0.05, 0.3])))
                     for p, op in enumerate(options) for d, od in enumerate(options)
                     if op.role == "prefill" and od.role == "decode" and op.kv_precision == od.kv_precision)
    return FastestInstance(tuple(options), rate, output, slo, draw(st.integers(1, 32)),
                           draw(st.sampled_from([None, 3000.0, 10000.0])), draw(st.sampled_from([None, 6.0, 20.0])),
                           handover)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=_instances())
def test_the_fastest_solution_is_brute_forces_and_every_listed_one_checks(instance):
    """On random small instances the first solution's latency is the lowest of every fleet brute
    force tries (none found: no solution), the list is sorted, every listed solution passes the
    checker, and solving again gives the same list."""
    found = fastest.solve(instance)
    assert (found[0].latency_s if found else math.inf) == pytest.approx(_brute_fastest(instance), rel=1e-9)
    assert [s.latency_s for s in found] == sorted(s.latency_s for s in found)
    for solution in found:
        assert fastest.check(instance, solution) == [], solution
    assert fastest.solve(instance) == found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=_instances())
def test_a_larger_fleet_is_never_slower(instance):
    """Raising the device limit, the power cap or the budget never makes the fastest answer slower
    (a fleet within the lower limit is within the higher one)."""
    def best(i: FastestInstance) -> float:
        found = fastest.solve(i)
        return found[0].latency_s if found else math.inf

    by_devices = [best(replace(instance, max_devices=k)) for k in range(1, 25)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(by_devices, by_devices[1:])), by_devices
    for field, values in (("power_cap_w", [400.0, 3000.0, 10000.0, None]),
                          ("budget_usd_per_hour", [1.0, 6.0, 20.0, None])):
        by_limit = [best(replace(instance, **{field: v})) for v in values]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(by_limit, by_limit[1:])), (field, by_limit)
