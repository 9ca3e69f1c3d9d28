"""The serving fleet program (search.fleet) on hand-made instances: totals recomputed by hand, the
checker on broken fleets, and both solvers against the checker, enumeration and brute force.

Options are sized per instance in whole watts and quarter dollars, so every limit the program
rounds to milliwatts and millidollars is exact and a limit met with equality stays feasible.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.search import fleet
from perfmodel.search.brute import brute_force_fleet
from perfmodel.search.fleet import FleetInstance, FleetSolution
from perfmodel.search.pool_option import InstanceConfig, PoolOption, QueueInputs

# What the fleet program does not read (latencies, queue, configuration): the same for every option.
UNREAD = PoolOption(role="colocated", system="s", accelerator="a", instances=1, devices_per_instance=1, power_w=0.0,
                    usd_per_hour=None, ttft_p50_s=0.0, ttft_p90_s=0.0, tpot_p50_s=0.0, tpot_p90_s=0.0,
                    ttft_error=0.0, tpot_error=0.0, prefill_p90_s=0.0, step_p90_s=0.0, hbm_used_bytes=0.0,
                    requests_per_s_per_instance=1.0, queue=QueueInputs(1.0, 1, 1, 0.0, 0.0, 0.0, 0.0),
                    config=InstanceConfig(1, 1, 1, 1, 1, "bf16", "a16", "bf16", "hbm", "hbm", 0))


def _opt(role, system, instances, devices_per_instance, watts_each, usd_each):
    """A pool option sized to carry the whole rate with ``instances`` instances, given per instance."""
    return replace(UNREAD, role=role, system=system, instances=instances, devices_per_instance=devices_per_instance,
                   power_w=float(watts_each * instances),
                   usd_per_hour=None if usd_each is None else usd_each * instances)


# Two colocated options, two prefill options and three decode options on two systems; prefill 3
# (a100) cannot hand its KV cache to the h100 decode option 4 within the TTFT targets.
OPTS = (_opt("colocated", "h100", 4, 8, 10000, 20.0),   # 0: 32 devices, 40 kW, $80
        _opt("colocated", "a100", 6, 8, 7500, 10.0),    # 1: 48 devices, 45 kW, $60
        _opt("prefill", "h100", 2, 4, 3000, 6.0),       # 2: 8 devices, 6 kW, $12
        _opt("prefill", "a100", 3, 4, 3000, 3.0),       # 3: 12 devices, 9 kW, $9
        _opt("decode", "h100", 3, 2, 1500, 3.0),        # 4: each 1/3 of the rate
        _opt("decode", "a100", 5, 2, 1200, 1.5),        # 5: each 1/5 of the rate
        _opt("decode", "h100", 2, 8, 4000, 8.0))        # 6: each 1/2 of the rate
HANDOVER = ((2, 4, 0.01), (2, 5, 0.02), (2, 6, 0.01), (3, 5, 0.03), (3, 6, 0.02))


def _instance(objective="devices", **limits) -> FleetInstance:
    return FleetInstance(options=OPTS, objective=objective, handover=HANDOVER, **limits)


# Side limits, each changing the best fleet on OPTS for some objective (each alone, then together).
LIMITS = [{}, {"max_devices": 20}, {"power_cap_w": 11000.0}, {"budget_usd_per_hour": 20.0},
          {"limits": (("h100", 10),)}, {"owned": (("a100", 12, 1.0),)},
          {"max_devices": 30, "power_cap_w": 15000.0, "budget_usd_per_hour": 30.0, "limits": (("a100", 20),),
           "owned": (("h100", 8, 0.5),)}]


def test_totals_are_the_sums_of_the_options_and_owned_devices_save_exactly_their_saving():
    """Devices, power and cost are the per-instance figures times the counts; owned devices lower
    the cost (and the cost objective, not the others) by min(owned, used) times their saving, per
    system, and an owned system the fleet does not run on saves nothing."""
    mixed = FleetSolution(2, ((4, 2), (5, 2)))   # h100 prefill, 2 h100 + 2 a100 decode: 2/3 + 2/5 of the rate
    plain = fleet.totals(_instance("cost"), mixed)
    assert plain.devices == 2 * 4 + 2 * 2 + 2 * 2
    assert plain.power_w == pytest.approx(2 * 3000 + 2 * 1500 + 2 * 1200)
    assert plain.usd_per_hour == pytest.approx(2 * 6.0 + 2 * 3.0 + 2 * 1.5)
    assert plain.objective == pytest.approx(plain.usd_per_hour)
    assert fleet.devices_by_system(_instance(), mixed) == {"h100": 12, "a100": 4}

    owned = (("a100", 3, 2.5), ("h100", 100, 1.0), ("tpu", 4, 9.0))
    assert fleet.owned_used(_instance(owned=owned), mixed) == {"a100": 3, "h100": 12, "tpu": 0}
    saving = 3 * 2.5 + 12 * 1.0
    cost = fleet.totals(_instance("cost", owned=owned), mixed)
    assert cost.usd_per_hour == pytest.approx(plain.usd_per_hour - saving)
    assert cost.objective == pytest.approx(plain.objective - saving)
    assert (cost.devices, cost.power_w) == (plain.devices, plain.power_w)
    for objective in ("energy", "devices"):
        assert fleet.totals(_instance(objective, owned=owned), mixed).objective == \
            fleet.totals(_instance(objective), mixed).objective
    assert fleet.totals(_instance("energy"), mixed).objective == pytest.approx(11400.0)
    assert fleet.totals(_instance("devices"), mixed).objective == pytest.approx(16 + 11400.0 * fleet.DEVICE_TIE_BREAK)

    colocated = fleet.totals(_instance("cost"), FleetSolution(0))   # the front pool at its own count
    assert (colocated.devices, colocated.power_w, colocated.usd_per_hour) == (32, 40000.0, 80.0)


@pytest.mark.parametrize("solution, limits, expected", [
    (FleetSolution(9), {}, "option 9 does not exist"),
    (FleetSolution(2, ((12, 1),)), {}, "option 12 does not exist"),          # a decode index too
    (FleetSolution(4), {}, "a decode pool cannot stand alone"),
    (FleetSolution(0, ((4, 3),)), {}, "a colocated pool takes no decode pool"),
    (FleetSolution(2, ((1, 6),)), {}, "option 1 is not a decode pool"),
    (FleetSolution(2, ((4, 4),)), {}, "decode option 4 has 4 instances, allowed 1 to 3"),
    (FleetSolution(2, ((4, 0), (6, 2))), {}, "decode option 4 has 0 instances"),
    (FleetSolution(3, ((4, 3),)), {}, "prefill option 3 cannot hand its KV cache to decode option 4"),
    (FleetSolution(2, ((4, 2),)), {}, "the decode pools carry 0.666667 of the rate"),
    (FleetSolution(2), {}, "the decode pools carry 0 of the rate"),
    (FleetSolution(1), {"max_devices": 47}, "48 devices, the limit is 47"),
    (FleetSolution(2, ((4, 2), (5, 2))), {"power_cap_w": 11399.0}, "11,400 W, the cap is 11,399 W"),
    (FleetSolution(2, ((4, 2), (5, 2))), {"budget_usd_per_hour": 20.75}, "$21 per hour, the budget is $20.75"),
    (FleetSolution(2, ((4, 2), (5, 2))), {"limits": (("h100", 11),)}, "12 devices of h100, the limit is 11"),
])
def test_the_checker_names_each_broken_rule(solution, limits, expected):
    """Each hand-broken fleet is reported (roles, counts, the exact rate, the KV hand-over, every
    limit) as a list of sentences, never a traceback."""
    problems = fleet.check(_instance(**limits), solution)
    assert any(expected in p for p in problems), problems


def test_the_checker_accepts_limits_met_with_equality_and_flags_missing_prices():
    """A fleet exactly at its device, power, budget and per-system limits passes; an option without
    a price fails a budget and the cost objective, but not the other objectives."""
    mixed = FleetSolution(2, ((4, 2), (5, 2)))   # 16 devices, 11400 W, $21, 12 on h100
    assert fleet.check(_instance("cost", max_devices=16, power_cap_w=11400.0, budget_usd_per_hour=21.0,
                                 limits=(("h100", 12), ("a100", 4))), mixed) == []
    unpriced = FleetInstance(options=OPTS[:4] + (_opt("decode", "h100", 3, 2, 1500, None),) + OPTS[5:],
                             objective="devices", handover=HANDOVER)
    assert fleet.check(unpriced, mixed) == []
    assert "no price" in fleet.check(replace(unpriced, budget_usd_per_hour=1e6), mixed)
    assert fleet.check(replace(unpriced, objective="cost"), mixed) == ["no cost value (a system without a price)"]
    assert fleet.totals(unpriced, mixed).usd_per_hour is None


@pytest.mark.parametrize("objective", ["cost", "energy", "devices"])
@pytest.mark.parametrize("limits", LIMITS, ids=range(len(LIMITS)))
def test_the_solved_fleet_passes_the_checker_and_beats_every_enumerated_fleet(objective, limits):
    """Under each objective and limit, the solved fleet passes the independent checker, equals the
    brute-force best over every decode count vector, and no single-pool fleet (each of which the
    checker accepts) has a lower objective."""
    instance = _instance(objective, **limits)
    best = fleet.solve(instance)
    assert best is not None and fleet.check(instance, best) == []
    assert best.status == "OPTIMAL"
    value = fleet.totals(instance, best).objective
    assert value == pytest.approx(brute_force_fleet(instance), rel=1e-7)
    singles = fleet.single_pool_solutions(instance)
    assert singles and all(fleet.check(instance, s) == [] for s in singles)
    assert all(value <= fleet.totals(instance, s).objective + 1e-9 * abs(value) for s in singles)


@pytest.mark.parametrize("objective", ["cost", "energy", "devices"])
def test_covering_and_program_agree_and_repeat_exactly(objective):
    """Without side limits both exact solvers reach the same optimum; ``solve`` takes the covering
    program then and the integer program once any limit or owned device is given; the same
    instance solved twice gives the identical fleet."""
    instance = _instance(objective)
    covering, program = fleet.solve_by_covering(instance), fleet.solve_program(instance)
    assert covering.method == fleet.COVERING and program.method == fleet.PROGRAM
    assert fleet.totals(instance, covering).objective == \
        pytest.approx(fleet.totals(instance, program).objective, rel=1e-7)
    assert fleet.solve(instance) == covering
    assert fleet.solve_by_covering(instance) == covering and fleet.solve_program(instance) == program
    for limits in LIMITS[1:]:
        limited = _instance(objective, **limits)
        solved = fleet.solve(limited)
        assert solved.method == fleet.PROGRAM and fleet.solve(limited) == solved


def test_per_system_limits_are_met_by_mixing_decode_hardware():
    """Two decode options each needing 8 devices of its system, with at most 4 of each: no single
    decode pool fits, but one instance of each carries half the rate twice, and the solver finds
    that fleet ahead of the dear colocated one."""
    opts = (_opt("colocated", "c", 1, 64, 50000, 200.0), _opt("prefill", "c", 1, 4, 2000, 8.0),
            _opt("decode", "a", 2, 4, 2000, 8.0), _opt("decode", "b", 2, 4, 2500, 9.0))
    instance = FleetInstance(options=opts, objective="devices", handover=((1, 2, 0.0), (1, 3, 0.0)),
                             limits=(("a", 4), ("b", 4)))
    assert fleet.single_pool_solutions(instance) == [FleetSolution(0)]
    best = fleet.solve(instance)
    assert (best.front, best.decode) == (1, ((2, 1), (3, 1)))
    assert fleet.check(instance, best) == [] and fleet.totals(instance, best).devices == 12
    assert fleet.solve(replace(instance, max_devices=11)) is None
    assert fleet.single_pool_solutions(replace(instance, max_devices=11)) == []


def test_a_power_cap_is_met_by_mixing_a_lean_and_a_frugal_decode_option():
    """Fewest devices under a power cap: the leanest decode pool draws too much, the most frugal one
    takes more devices, and one instance of each meets the cap exactly with fewer devices than any
    single-pool fleet the cap allows."""
    opts = (_opt("prefill", "c", 1, 1, 1000, 1.0), _opt("decode", "c", 2, 2, 5000, 2.0),
            _opt("decode", "c", 2, 4, 2000, 3.0))
    instance = FleetInstance(options=opts, objective="devices", handover=((0, 1, 0.0), (0, 2, 0.0)),
                             power_cap_w=8000.0)
    assert fleet.single_pool_solutions(instance) == [FleetSolution(0, ((2, 2),))]    # 9 devices, 5 kW
    best = fleet.solve(instance)
    assert (best.front, best.decode) == (0, ((1, 1), (2, 1)))
    t = fleet.totals(instance, best)
    assert (t.devices, t.power_w) == (7, 8000.0) and fleet.check(instance, best) == []
    assert t.objective == pytest.approx(brute_force_fleet(instance))
    assert fleet.solve(replace(instance, power_cap_w=None)).decode == ((1, 2),)       # 5 devices, 11 kW


def test_owned_devices_and_missing_prices_steer_the_cheapest_fleet():
    """Owned devices make the pool that runs on them the cheapest (the saving is counted on at most
    the devices owned), without changing the fewest-energy fleet; an option without a price is never
    the cheapest fleet, however cheap it would be in devices."""
    opts = (_opt("colocated", "new", 2, 8, 6000, 10.0),     # $20, 16 devices
            _opt("colocated", "old", 4, 8, 8000, 8.0),      # $32, 32 devices
            _opt("colocated", "free", 1, 4, 3000, None))    # no price, 4 devices
    instance = FleetInstance(options=opts, objective="cost")
    assert fleet.solve(instance) == fleet.solve_by_covering(instance) and fleet.solve(instance).front == 0
    owning = replace(instance, owned=(("old", 16, 1.0),))
    best = fleet.solve(owning)
    assert best.front == 1 and fleet.check(owning, best) == []
    assert fleet.owned_used(owning, best) == {"old": 16}
    assert fleet.totals(owning, best).usd_per_hour == pytest.approx(32.0 - 16 * 1.0)
    assert fleet.totals(owning, best).objective == pytest.approx(brute_force_fleet(owning))
    assert fleet.solve(replace(owning, owned=(("old", 8, 1.0),))).front == 0          # $32 - $8 > $20
    assert fleet.solve(replace(owning, options=opts[:2], objective="energy")).front == 0       # 12 kW < 32 kW
    assert fleet.solve(replace(instance, objective="devices")).front == 2
    only_free = FleetInstance(options=opts[2:], objective="cost")
    assert fleet.solve_by_covering(only_free) is None and fleet.solve_program(only_free) is None
    assert not np.isfinite(brute_force_fleet(only_free))


SYSTEMS = ("a", "b")
SHARES = (0.25, 0.5, 0.75, 1.0)


@st.composite
def tiny_instances(draw):
    """Up to one colocated, one or two prefill and one to three decode options (1 to 4 instances,
    decode 2 to 4 so that partial pools exist), some without a price, and a random set of
    KV-compatible pairs; half the time, owned devices and limits between the least any single-pool
    fleet needs and what the best one needs (so that they bind and mixed decode pools may win)."""
    roles = (["colocated"] * draw(st.integers(0, 1)) + ["prefill"] * draw(st.integers(1, 2))
             + ["decode"] * draw(st.integers(1, 3)))
    opts = []
    for role in roles:
        priced = draw(st.integers(0, 5)) > 0
        opts.append(_opt(role, draw(st.sampled_from(SYSTEMS)), draw(st.integers(1 + (role == "decode"), 4)),
                         draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(1, 40)) * 100,
                         0.25 * draw(st.integers(1, 40)) if priced else None))
    opts = tuple(opts)
    pairs = [(p, d) for p, o in enumerate(opts) if o.role == "prefill"
             for d, q in enumerate(opts) if q.role == "decode"]
    handover = tuple((p, d, 0.0) for p, d in pairs if draw(st.integers(0, 3)))
    instance = FleetInstance(options=opts, objective=draw(st.sampled_from(["cost", "energy", "devices"])),
                             handover=handover)
    singles = fleet.single_pool_solutions(instance)
    if not singles or draw(st.booleans()):
        return instance
    sums = [fleet.totals(instance, s) for s in singles]
    on = [fleet.devices_by_system(instance, s) for s in singles]
    first = int(np.argmin([t.objective for t in sums]))   # the best single-pool fleet, unlimited

    def between(needs):
        """None, or a limit between the least any single-pool fleet needs and what the best one
        needs: that fleet breaks it, a mix of decode pools may not."""
        if needs[first] is None or draw(st.booleans()):
            return None
        least = min(n for n in needs if n is not None)
        return least + (needs[first] - least) * draw(st.sampled_from(SHARES))

    devices = between([t.devices for t in sums])
    power = between([t.power_w for t in sums])
    budget = between([t.usd_per_hour for t in sums])
    limits = tuple((name, int(most)) for name in SYSTEMS
                   if (most := between([by.get(name, 0) for by in on])) is not None)
    owned = tuple((name, draw(st.integers(0, 16)), draw(st.sampled_from([0.0, 0.25, 0.5])))
                  for name in SYSTEMS if draw(st.booleans()))
    # Whole devices, whole hundreds of watts and quarter dollars: limits the program holds exactly.
    return replace(instance, max_devices=None if devices is None else int(devices),
                   power_cap_w=None if power is None else 100.0 * (power // 100),
                   budget_usd_per_hour=None if budget is None else 0.25 * (budget // 0.25),
                   limits=limits, owned=owned)


@settings(max_examples=150, deadline=None)
@given(instance=tiny_instances())
def test_solve_matches_brute_force_on_tiny_instances(instance):
    """On any tiny instance the solved fleet passes the checker and equals the brute-force best, or
    both find no fleet; the covering program agrees when there is no side limit, and no single-pool
    fleet beats the solver."""
    expected = brute_force_fleet(instance)
    free = not (instance.max_devices is not None or instance.power_cap_w is not None
                or instance.budget_usd_per_hour is not None or instance.limits or instance.owned)
    for solve in [fleet.solve, fleet.solve_program] + ([fleet.solve_by_covering] if free else []):
        best = solve(instance)
        if not np.isfinite(expected):
            assert best is None
            continue
        assert best is not None and fleet.check(instance, best) == []
        value = fleet.totals(instance, best).objective
        assert value == pytest.approx(expected, rel=1e-7, abs=1e-9)
        for s in fleet.single_pool_solutions(instance):
            assert value <= fleet.totals(instance, s).objective + 1e-7 * abs(value) + 1e-9
