"""Expert placement: homes and slots respected, exact on tiny instances, better than the baselines."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.hardware_db.errors import SpecError
from perfmodel.routing import RoutingStats, zipf_routing
from perfmodel.search.placement import PlacementProblem, imbalance_for_ep, place, water_fill


def check_valid(problem: PlacementProblem, placement) -> None:
    for layer in placement.layers:
        assert all(len(devs) >= 1 for devs in layer.devices)             # every expert has a home
        assert all(len(set(devs)) == len(devs) for devs in layer.devices)  # copies on distinct devices
        held = np.zeros(problem.devices, dtype=int)
        for devs in layer.devices:
            for d in devs:
                held[d] += 1
        assert held.max() <= problem.slots                              # no device over its slots
        assert sum(len(devs) for devs in layer.devices) <= problem.stats.experts + problem.replicas


def brute_force_max_load(load, copies, devices, slots) -> float:
    """Smallest busiest-device load over every assignment of the copies (distinct devices per expert)."""
    items = [(load[e] / copies[e], e) for e in range(len(load)) for _ in range(copies[e])]
    best = np.inf
    for assignment in itertools.product(range(devices), repeat=len(items)):
        held = np.zeros(devices, dtype=int)
        seen = set()
        dev_load = np.zeros(devices)
        ok = True
        for (size, e), d in zip(items, assignment):
            if (e, d) in seen:
                ok = False
                break
            seen.add((e, d))
            held[d] += 1
            dev_load[d] += size
        if ok and held.max() <= slots:
            best = min(best, dev_load.max())
    return best


@settings(max_examples=25, deadline=None)
@given(loads=st.lists(st.integers(1, 100), min_size=3, max_size=5), devices=st.integers(2, 3),
       replicas=st.integers(0, 1))
def test_tiny_instances_match_brute_force(loads, devices, replicas):
    stats = RoutingStats(loads=np.array([loads], dtype=float))
    slots = -(-(len(loads) + replicas) // devices)
    problem = PlacementProblem(stats=stats, devices=devices, devices_per_node=1, slots=slots, replicas=replicas)
    result = place(problem, "cp-sat", time_limit=5)
    check_valid(problem, result)
    copies = water_fill(np.array(loads, dtype=float), replicas, devices)
    assert result.max_load[0] == pytest.approx(brute_force_max_load(loads, copies, devices, slots))
    assert result.max_load[0] >= result.bound[0] - 1e-9


def test_water_fill_splits_the_hottest():
    assert water_fill(np.array([100.0, 10.0, 10.0]), 2, 8).tolist() == [3, 1, 1]
    assert water_fill(np.array([100.0, 10.0]), 5, 2).tolist() == [2, 2]   # at most one copy per device


def test_placement_beats_the_baselines_and_respects_slots():
    stats = zipf_routing(6, 32, 4, 8192, zipf=1.2, affinity=0.7, seed=3)
    problem = PlacementProblem(stats=stats, devices=8, devices_per_node=4, slots=5, replicas=8)
    methods = {m: place(problem, m, time_limit=5) for m in ("round-robin", "greedy", "cp-sat")}
    for p in methods.values():
        check_valid(problem, p)
    assert methods["cp-sat"].imbalance < methods["round-robin"].imbalance
    assert methods["cp-sat"].max_load.max() <= methods["greedy"].max_load.max() * 1.005 + 1e-9
    assert methods["cp-sat"].cross_tokens <= methods["greedy"].cross_tokens + 1e-6
    assert methods["cp-sat"].gap < 0.05
    mapping = methods["cp-sat"].as_map()
    assert set(mapping) == {str(l) for l in range(6)} and set(mapping["0"]) == {str(e) for e in range(32)}
    json.dumps(mapping)


def test_synthetic_routing_is_seeded_and_consistent():
    a = zipf_routing(4, 16, 2, 1000, 1.0, 0.5, seed=7)
    b = zipf_routing(4, 16, 2, 1000, 1.0, 0.5, seed=7)
    np.testing.assert_array_equal(a.loads, b.loads)
    np.testing.assert_allclose(a.loads.sum(axis=1), 2000)
    np.testing.assert_allclose(a.transitions.sum(axis=2), a.loads[:-1])
    assert not np.array_equal(a.loads, zipf_routing(4, 16, 2, 1000, 1.0, 0.5, seed=8).loads)


def test_skew_raises_the_imbalance_of_larger_ep():
    flat = zipf_routing(4, 64, 4, 10000, 0.0, 0.0, seed=1)
    skewed = zipf_routing(4, 64, 4, 10000, 1.2, 0.0, seed=1)
    assert imbalance_for_ep(flat, 16) == pytest.approx(1.0, abs=1e-9)
    assert imbalance_for_ep(skewed, 32) > imbalance_for_ep(skewed, 4) > 1.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(devices=3, devices_per_node=2, slots=4, replicas=0), "divisible"),
    (dict(devices=2, devices_per_node=1, slots=1, replicas=0), "slots per layer"),
    (dict(devices=2, devices_per_node=1, slots=4, replicas=-1), "replicas >= 0"),
])
def test_bad_problems_are_errors(kwargs, message):
    with pytest.raises(SpecError, match=message):
        PlacementProblem(stats=RoutingStats(loads=np.ones((1, 4))), **kwargs)


def test_plan_search_uses_the_skew(db):
    from perfmodel.catalog import find_model
    from perfmodel.training import TrainWorkload
    from perfmodel.search.train import SearchOptions, search_training

    spec = find_model("mixtral-8x7b")
    work = TrainWorkload(64, 4096)
    balanced = search_training(spec, db, [("dgx-h100", 16)], work, SearchOptions(offload=False))
    stats = zipf_routing(spec.moe_layers, 8, 2, 65536, 2.0, 0.0, seed=0)
    skewed = search_training(spec, db, [("dgx-h100", 16)], work, SearchOptions(offload=False, routing=stats))
    assert skewed.best["step_time_s"] >= balanced.best["step_time_s"]
    assert skewed.best["plan"]["moe_imbalance"] >= 1.0
