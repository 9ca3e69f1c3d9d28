"""Expert placement: homes and slots respected, exact on tiny instances, the load tolerance held on every
layer, locality that still moves experts under skew, and the traffic it reports."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perfmodel.hardware_db.errors import SpecError
from perfmodel.routing import RoutingStats, zipf_routing
from perfmodel.search.placement import (LOAD_TOLERANCE, PlacementProblem, check, imbalance_for_ep, place, traffic,
                                        water_fill)


def check_valid(problem: PlacementProblem, placement) -> None:
    """The solver-independent checker, plus the invariants spelled out here on their own."""
    check(problem, placement)
    loads = np.asarray(problem.stats.loads, dtype=float)
    for l, layer in enumerate(placement.layers):
        assert all(len(devs) >= 1 for devs in layer.devices)             # every expert has a home
        assert len(layer.devices) == problem.stats.experts
        assert all(len(set(devs)) == len(devs) for devs in layer.devices)  # copies on distinct devices
        held = np.zeros(problem.devices, dtype=int)
        for devs in layer.devices:
            for d in devs:
                held[d] += 1
        assert held.max() <= problem.slots                              # no device over its slots
        assert sum(len(devs) for devs in layer.devices) <= problem.stats.experts + problem.replicas
        assert layer.device_load.sum() == pytest.approx(loads[l].sum(), rel=1e-12)   # conservation
    if placement.traffic is not None:
        t = placement.traffic
        assert 0 <= t.cross_node <= t.cross_device + 1e-6 * t.between_layers   # a node crossing crosses a device
        assert t.cross_device <= t.between_layers * (1 + 1e-12)


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
    result = place(problem, "affinity", time_limit=5)
    check_valid(problem, result)
    copies = water_fill(np.array(loads, dtype=float), replicas, devices)
    assert result.max_load[0] == pytest.approx(brute_force_max_load(loads, copies, devices, slots))
    assert result.max_load[0] >= result.bound[0] - 1e-9
    assert result.status == "OPTIMAL"          # one layer, no traffic: the busiest device is all there is


def test_water_fill_splits_the_hottest():
    assert water_fill(np.array([100.0, 10.0, 10.0]), 2, 8).tolist() == [3, 1, 1]
    assert water_fill(np.array([100.0, 10.0]), 5, 2).tolist() == [2, 2]   # at most one copy per device


def water_fill_one_copy_at_a_time(load, extra, max_copies):
    """The rule as stated: each extra copy to the expert with the most tokens per copy (lowest index on ties)."""
    copies = np.ones(len(load), dtype=int)
    for _ in range(extra):
        per_copy = np.where(copies < max_copies, load / copies, -1.0)
        if per_copy.max() < 0:
            break
        copies[int(np.argmax(per_copy))] += 1
    return copies


@settings(max_examples=60, deadline=None)
@given(load=st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 6.0, 7.5, 100.0]) | st.floats(0, 1e6), min_size=1,
                     max_size=12),
       extra=st.integers(0, 40), max_copies=st.integers(1, 6))
@example(load=[6.0, 3.0, 2.0], extra=4, max_copies=8)          # ties: 6/2 = 3/1, 6/3 = 2/1
def test_water_fill_matches_the_rule_step_by_step(load, extra, max_copies):
    load = np.array(load)
    expected = water_fill_one_copy_at_a_time(load, extra, max_copies)
    assert water_fill(load, extra, max_copies).tolist() == expected.tolist()


def test_placement_beats_the_baselines_and_respects_slots():
    stats = zipf_routing(6, 32, 4, 8192, zipf=1.2, affinity=0.7, seed=3)
    problem = PlacementProblem(stats=stats, devices=8, devices_per_node=4, slots=5, replicas=8)
    methods = {m: place(problem, m, time_limit=5) for m in ("round-robin", "greedy", "affinity")}
    for p in methods.values():
        check_valid(problem, p)
    best, greedy, rr = methods["affinity"], methods["greedy"], methods["round-robin"]
    assert best.imbalance < rr.imbalance
    assert np.all(best.max_load <= greedy.max_load * (1 + LOAD_TOLERANCE) + 1e-9)
    assert best.cross_device_tokens < greedy.cross_device_tokens and best.cross_device_tokens < rr.cross_device_tokens
    assert best.cross_node_tokens < greedy.cross_node_tokens
    assert best.gap <= LOAD_TOLERANCE / (1 + LOAD_TOLERANCE) + 1e-9
    assert best.status == "FEASIBLE" and "tokens crossing devices" in best.objective
    mapping = best.as_map()
    assert set(mapping) == {str(l) for l in range(6)} and set(mapping["0"]) == {str(e) for e in range(32)}
    json.dumps(mapping)


# Skewed popularity and strong affinity, several nodes: (devices, devices per node, slots, replicas).
SHAPES = [(16, 4, 3, 8), (8, 2, 5, 8), (40, 8, 1, 8)]


@pytest.mark.parametrize("tolerance", [0.0, 0.01, 0.05])
@pytest.mark.parametrize("devices, per_node, slots, replicas", SHAPES)
def test_tolerance_holds_on_every_layer(tolerance, devices, per_node, slots, replicas):
    stats = zipf_routing(8, 32, 4, 20000, zipf=1.2, affinity=0.9, seed=5)
    problem = PlacementProblem(stats, devices, per_node, slots, replicas, load_tolerance=tolerance)
    best, greedy = place(problem, "affinity"), place(problem, "greedy")
    check_valid(problem, best)
    # Busiest device: within the tolerance of the bound, or no worse than the load-first peak ...
    assert np.all(best.max_load <= np.maximum((1 + tolerance) * best.bound, best.allowed_peak) * (1 + 1e-12))
    assert np.all(best.allowed_peak <= np.maximum((1 + tolerance) * best.bound, greedy.max_load) * (1 + 1e-12))
    # ... hence never more than the tolerance above the load-only placement, on any layer.
    assert np.all(best.max_load <= (1 + tolerance) * greedy.max_load * (1 + 1e-12))


@pytest.mark.parametrize("devices, per_node, slots, replicas", SHAPES)
def test_locality_moves_experts_under_skew(devices, per_node, slots, replicas):
    # Zipf 1.2: a per-node tolerance froze this (nothing moved); held on the busiest device, experts move.
    stats = zipf_routing(8, 32, 4, 20000, zipf=1.2, affinity=0.9, seed=5)
    problem = PlacementProblem(stats, devices, per_node, slots, replicas)
    best, greedy = place(problem, "affinity"), place(problem, "greedy")
    moved = sum(a.devices != b.devices for a, b in zip(best.layers[1:], greedy.layers[1:]))
    assert moved == stats.layers - 1
    assert best.cross_device_tokens < 0.8 * greedy.cross_device_tokens
    assert best.cross_node_tokens < greedy.cross_node_tokens
    assert np.all(best.max_load <= (1 + LOAD_TOLERANCE) * greedy.max_load * (1 + 1e-12))


def test_no_affinity_to_use_keeps_the_load_first_placement():
    stats = zipf_routing(4, 16, 2, 5000, zipf=1.0, affinity=0.5, seed=2)
    without = RoutingStats(loads=stats.loads)               # loads only: nothing prices locality
    problem = PlacementProblem(without, 8, 4, 3, 4)
    best, greedy = place(problem, "affinity"), place(problem, "greedy")
    assert best.traffic is None and best.cross_device_tokens is None
    assert [l.devices for l in best.layers] == [l.devices for l in greedy.layers]


def test_traffic_counts_by_hand():
    # Layer 0: expert 0 on device 0, expert 1 on device 1 (nodes of one device each... two per node here).
    # Layer 1: expert 0 twice (devices 0 and 2), expert 1 on device 1. 10 tokens 0 -> 0, 6 tokens 1 -> 0.
    loads = np.array([[10.0, 6.0], [16.0, 0.0]])
    transitions = np.array([[[10.0, 0.0], [6.0, 0.0]]])
    stats = RoutingStats(loads=loads, transitions=transitions)
    problem = PlacementProblem(stats, 4, 2, 1, 1)
    from perfmodel.search.placement import LayerPlacement

    first = LayerPlacement(np.array([0, 1]), np.array([0, 1]), np.array([10.0, 6.0, 0.0, 0.0]))
    second = LayerPlacement(np.array([0, 0, 1]), np.array([0, 2, 1]), np.array([8.0, 0.0, 8.0, 0.0]))
    t = traffic(stats, [first, second], problem)
    # Tokens split evenly over expert 0's two copies: 10 from device 0 -> half stay (5 cross); 6 from
    # device 1 -> none stay on device 1 (6 cross). Nodes {0, 1} and {2, 3}: device 2 is the other node.
    assert (t.between_layers, t.cross_device, t.cross_node) == pytest.approx((16.0, 11.0, 8.0))


@st.composite
def problems(draw):
    per_node = draw(st.sampled_from([1, 2, 4]))
    devices = per_node * draw(st.integers(1, 4))
    experts = draw(st.integers(2, 12))
    replicas = draw(st.integers(0, min(6, experts * (devices - 1))))
    slots = -(-(experts + replicas) // devices) + draw(st.integers(0, 2))
    stats = zipf_routing(draw(st.integers(1, 4)), experts, draw(st.integers(1, min(3, experts))), 1000,
                         zipf=draw(st.sampled_from([0.0, 1.0, 1.5])), affinity=draw(st.sampled_from([0.0, 0.5, 1.0])),
                         seed=draw(st.integers(0, 3)))
    tolerance = draw(st.sampled_from([0.0, 0.01, 0.2]))
    return PlacementProblem(stats, devices, per_node, slots, replicas, load_tolerance=tolerance)


@settings(max_examples=40, deadline=None)
@given(problem=problems())
@example(problem=PlacementProblem(zipf_routing(3, 8, 2, 1000, 1.0, 1.0, seed=0), 8, 2, 1, 0))   # one slot each
def test_every_method_gives_a_valid_placement(problem):
    results = {m: place(problem, m, time_limit=5) for m in ("round-robin", "greedy", "lpt", "affinity")}
    for p in results.values():
        check_valid(problem, p)
    best, greedy = results["affinity"], results["greedy"]
    assert np.all(best.max_load <= (1 + problem.load_tolerance) * greedy.max_load * (1 + 1e-12))
    assert best.status in ("OPTIMAL", "FEASIBLE")


def test_same_input_same_placement():
    stats = zipf_routing(5, 24, 4, 5000, zipf=1.2, affinity=0.7, seed=1)
    problem = PlacementProblem(stats, 12, 4, 3, 8)
    assert place(problem).as_map() == place(problem).as_map()


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
    (dict(devices=2, devices_per_node=1, slots=4, replicas=0, load_tolerance=1.5), "--load-tolerance needs a share"),
    (dict(devices=2, devices_per_node=1, slots=4, replicas=0, load_tolerance=float("nan")), "--load-tolerance"),
])
def test_bad_problems_are_errors(kwargs, message):
    with pytest.raises(SpecError, match=message):
        PlacementProblem(stats=RoutingStats(loads=np.ones((1, 4))), **kwargs)


def run_cli(capsys, *argv):
    from perfmodel.cli.app import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_readme_style_cli_call_reports_both_crossings(capsys):
    code, out, err = run_cli(capsys, "place-experts", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--devices",
                             "16", "--zipf", "1.2", "--affinity", "0.9", "--replicas", "8", "--load-tolerance", "0.02",
                             "--json")
    assert code == 0, err
    data = json.loads(out)
    methods, evidence = data["methods"], data["evidence"]
    for row in methods.values():
        assert row["cross_device_tokens"] >= row["cross_node_tokens"] >= 0
    assert methods["affinity"]["cross_device_tokens"] < methods["round-robin"]["cross_device_tokens"]
    assert data["improvement"]["cross_device_vs_round_robin"] > 0
    assert evidence["load_tolerance"] == 0.02 and evidence["busiest_over_bound"] <= 0.02 + 1e-9
    assert "2.00%" in evidence["objective"] and evidence["traffic_assumption"]
    assert len(data["placement"]) == 32


def test_cli_rejects_a_bad_tolerance_in_one_line(capsys):
    code, _, err = run_cli(capsys, "place-experts", "--model", "mixtral-8x7b", "--devices", "8",
                           "--load-tolerance", "2")
    assert code == 2 and "--load-tolerance needs a share from 0 to 1, has 2" in err and err.count("\n") == 1


def test_plan_search_uses_the_skew(db):
    from perfmodel.catalog import find_model
    from perfmodel.training import TrainWorkload
    from perfmodel.search.train import SearchOptions, search_training

    spec = find_model("mixtral-8x7b")
    work = TrainWorkload(64, 4096)
    balanced = search_training(spec, db, [("dgx-h100", 16)], work, SearchOptions(offload=False))
    stats = zipf_routing(spec.moe_layers, 8, 2, 65536, 2.0, 0.0, seed=0)
    skewed = search_training(spec, db, [("dgx-h100", 16)], work, SearchOptions(offload=False, routing=stats))
    assert skewed.best.step_time_s >= balanced.best.step_time_s
    assert skewed.best.plan.moe_imbalance >= 1.0
