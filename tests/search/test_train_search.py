"""The search agrees with brute force on small problems, and its Pareto front is non-dominated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.hardware_db.errors import InfeasibleError
from perfmodel.machine import build_machine
from perfmodel.model import TransformerSpec
from perfmodel.training import TrainWorkload
from perfmodel.search.brute import brute_force_training
from perfmodel.search.pareto import dominates, pareto_front
from perfmodel.search.space import SpaceOptions
from perfmodel.search.train import SearchOptions, raise_if_infeasible, search_training

SMALL_SPACE = SpaceOptions(micro_batches=(1, 2), interleaves=(1, 2), zero_stages=(0, 1, 2, 3),
                           recomputes=("none", "full"), precisions=("bf16",), max_cp=2)


def tiny_model(layers: int, hidden: int, heads: int) -> TransformerSpec:
    return TransformerSpec(name="tiny", hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads,
                           ffn_hidden_size=4 * hidden, vocab_size=32000)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.sampled_from([4, 8, 12]), hidden=st.sampled_from([2048, 4096, 8192]),
       devices=st.sampled_from([1, 2, 4, 8]), global_batch=st.sampled_from([8, 16, 32]),
       seq=st.sampled_from([2048, 4096]), system=st.sampled_from(["dgx-h100", "hgx-h200", "mi300x-8x"]))
def test_search_matches_brute_force(db, layers, hidden, devices, global_batch, seq, system):
    spec = tiny_model(layers, hidden, 32)
    work = TrainWorkload(global_batch, seq)
    machine = build_machine(db, system, devices)
    expected, _ = brute_force_training(spec, machine, work, SMALL_SPACE)
    result = search_training(spec, db, [(system, devices)], work, SearchOptions(space=SMALL_SPACE))
    if not np.isfinite(expected):
        assert result.best is None
        return
    assert result.best is not None
    assert result.best.step_time_s == pytest.approx(expected, rel=1e-6)
    assert result.evidence.status == "OPTIMAL"


@settings(max_examples=9, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objective=st.sampled_from(["cost", "energy", "devices"]), hidden=st.sampled_from([2048, 4096]),
       seq=st.sampled_from([2048, 4096]), pricing=st.sampled_from(["cloud", "owned"]))
def test_every_objective_matches_brute_force(db, objective, hidden, seq, pricing):
    """Cost, energy and fewest devices, over candidates of several sizes and kinds, against every
    plan of every candidate evaluated by brute force; the checker finds nothing."""
    from perfmodel.search.train import check_plans

    spec, work = tiny_model(8, hidden, 32), TrainWorkload(16, seq)
    candidates = [("dgx-h100", 2), ("dgx-h100", 4), ("mi300x-8x", 2)]
    options = SearchOptions(objective=objective, space=SMALL_SPACE, pricing=pricing)
    result = search_training(spec, db, candidates, work, options)
    assert result.evidence.status == "OPTIMAL" and check_plans(spec, result, work, options) == []
    if objective == "devices":
        fewest = min(n for s, n in candidates if np.isfinite(
            brute_force_training(spec, build_machine(db, s, n), work, SMALL_SPACE)[0]))
        fastest = min(brute_force_training(spec, build_machine(db, s, n), work, SMALL_SPACE)[0]
                      for s, n in candidates if n == fewest)
        assert (result.best.devices, result.best.step_time_s) == (fewest, pytest.approx(fastest, rel=1e-6))
        return
    expected = min(brute_force_training(spec, build_machine(db, s, n, pricing), work, SMALL_SPACE, objective)[0]
                   for s, n in candidates)
    key = {"cost": "cost_per_million_tokens_usd", "energy": "energy_per_token_j"}[objective]
    assert getattr(result.best, key) == pytest.approx(expected, rel=1e-6)


def test_offload_is_found_when_only_it_fits(db):
    # 70B on one 8-GPU node: nothing fits in HBM at this batch; offloading to host memory does.
    from perfmodel.catalog import find_model

    spec = find_model("llama-3.1-70b")
    work = TrainWorkload(16, 4096)
    space = SpaceOptions(micro_batches=(1,), interleaves=(1,), recomputes=("full",), precisions=("bf16",), max_cp=1)
    machine = build_machine(db, "hgx-h200", 4)
    expected, _ = brute_force_training(spec, machine, work, space)
    result = search_training(spec, db, [("hgx-h200", 4)], work, SearchOptions(space=space))
    assert result.best is not None and result.evidence.feasible == 0 and result.evidence.feasible_with_offload > 0
    assert result.best.step_time_s == pytest.approx(expected, rel=1e-6)
    assert result.best.plan.optimizer_place != "hbm"


def test_llama_405b_on_16k_h100_needs_no_offload(db):
    # Meta trained it in HBM alone (Dubey et al. 2024, Table 4); the optimum keeps every state in HBM.
    from perfmodel.catalog import find_model

    result = search_training(find_model("llama-3.1-405b"), db, [("dgx-h100", 16384)], TrainWorkload(2048, 8192))
    plan = result.best.plan
    assert (plan.optimizer_place, plan.grad_place, plan.param_place) == ("hbm", "hbm", "hbm")
    assert result.evidence.feasible > 1000


def test_nothing_feasible_names_the_closest_plan(db):
    from perfmodel.catalog import find_model

    result = search_training(find_model("llama-3.1-405b"), db, [("dgx-h100", 8)], TrainWorkload(8, 4096),
                             SearchOptions(offload=False))
    assert result.best is None and result.closest is not None
    with pytest.raises(InfeasibleError, match="closest: tp .*needs .* GB of HBM per device, has 85.9 GB"):
        raise_if_infeasible(result)


def test_choice_among_candidates_is_the_global_optimum(db):
    from perfmodel.catalog import find_model

    spec = find_model("llama-3.1-8b")
    work = TrainWorkload(64, 4096, 1e9)
    candidates = [("dgx-h100", 8), ("dgx-a100", 8), ("mi300x-8x", 8), ("dgx-h100", 16)]
    together = search_training(spec, db, candidates, work, SearchOptions(offload=False))
    alone = [search_training(spec, db, [c], work, SearchOptions(offload=False)).best.step_time_s for c in candidates]
    assert together.best.step_time_s == pytest.approx(min(alone))
    devices = search_training(spec, db, candidates, work, SearchOptions(objective="devices", offload=False))
    assert devices.best.devices == 8


def test_pareto_front_is_non_dominated_and_holds_each_optimum(db):
    from perfmodel.catalog import find_model

    spec = find_model("llama-3.1-8b")
    work = TrainWorkload(64, 4096, 1e10)
    candidates = [("dgx-h100", 8), ("dgx-a100", 8), ("dgx-h100", 16), ("dgx-b200", 8)]
    result = search_training(spec, db, candidates, work, SearchOptions(offload=False, top=1000))
    keys = ("step_time_s", "cost_per_million_tokens_usd", "energy_per_token_j")
    value = lambda p, k: np.inf if getattr(p, k) is None else getattr(p, k)  # noqa: E731  (no price: worst cost)
    front = np.array([[value(p, k) for k in keys] for p in result.pareto])
    for i, a in enumerate(front):
        for j, b in enumerate(front):
            assert i == j or not dominates(b, a)
    # Each objective's optimum (its own search) is on the front.
    for k, (key, objective) in enumerate(zip(keys, ("time", "cost", "energy"))):
        own = search_training(spec, db, candidates, work, SearchOptions(offload=False, objective=objective))
        assert front[:, k].min() == pytest.approx(value(own.best, key))
    again = front[pareto_front(front)]
    assert len(again) == len(front)


@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=60))
def test_pareto_filter_properties(points):
    pts = np.array(points)
    front = pareto_front(pts)
    for i in range(len(pts)):
        dominated = any(dominates(pts[j], pts[i]) for j in range(len(pts)))
        if i in set(front.tolist()):
            assert not dominated
        elif not dominated:  # not on the front yet undominated: a duplicate of a front row
            assert any(np.array_equal(pts[i], pts[j]) for j in front)
    assert len(pareto_front(pts[front])) == len(front)


def test_ties_are_the_plans_whose_range_overlaps_the_best(db):
    from perfmodel.catalog import find_model

    spec = find_model("llama-3.1-8b")
    result = search_training(spec, db, [("dgx-h100", 8)], TrainWorkload(64, 4096, 1e10), SearchOptions(offload=False))
    best = result.best
    assert best.step_time_low_s <= best.step_time_s <= best.step_time_high_s
    assert best.step_time_high_s > best.step_time_s          # a range, not a point
    assert result.tie_count >= len(result.ties)
    for p in result.ties:
        assert p.step_time_low_s <= best.step_time_high_s * (1 + 1e-9)
    if result.tie_count == len(result.ties):            # every tie is listed: the other top plans are not ties
        for p in result.top:
            if p != best and p not in result.ties:
                assert p.step_time_low_s > best.step_time_high_s


@pytest.mark.parametrize("model,system,devices,batch", [("deepseek-v3", "dgx-h100", 256, 1024),
                                                        ("llama-3.1-70b", "mi300x-8x", 64, 512)])
def test_screen_and_floor_agree_with_the_full_estimate(db, model, system, devices, batch):
    """The search's first pass decides feasibility and memory exactly as the full estimate, and its
    compute floor never exceeds a plan's step time: over a real lattice, with DualPipe and offloaded
    rows mixed in, and the floor's shared compute shapes evaluated once or row by row alike."""
    from perfmodel.catalog import find_model
    from perfmodel.plan import PLACES, SCHEDULES
    from perfmodel.search.space import build_space
    from perfmodel.training import TrainPlan, estimate_training, screen_training, step_time_floor

    spec, work = find_model(model), TrainWorkload(batch, 4096)
    machine = build_machine(db, system, devices)
    cols, _ = build_space(spec, machine, work)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(len(cols["tp"]), 6000, replace=False))
    cols = {k: np.asarray(v)[rows] for k, v in cols.items()}
    cols["schedule"] = np.where(rng.random(len(rows)) < 0.2, SCHEDULES.index("dualpipe"), 0)
    offloaded = rng.random(len(rows)) < 0.2
    cols["optimizer_place"] = np.where(offloaded, PLACES.index("ddr"), 0)
    plan = TrainPlan(**cols)
    full, screen = estimate_training(spec, machine, plan, work, detail=False), screen_training(spec, machine, plan, work)
    assert screen.constraint_names == full.constraint_names
    np.testing.assert_array_equal(screen.binding_code, full.binding_code)
    np.testing.assert_array_equal(screen.shortfall, full.shortfall)
    np.testing.assert_array_equal(screen.hbm_used_bytes, full.hbm_used_bytes)
    floor = step_time_floor(spec, machine, plan, work)
    assert np.all(floor <= full.step_time_s) and np.all(floor > 0)
    chunks = [TrainPlan(**{k: v[i:i + 500] for k, v in cols.items()}) for i in range(0, len(rows), 500)]
    np.testing.assert_array_equal(floor, np.concatenate([step_time_floor(spec, machine, c, work) for c in chunks]))
    np.testing.assert_array_equal(screen.hbm_used_bytes, np.concatenate(
        [screen_training(spec, machine, c, work).hbm_used_bytes for c in chunks]))


def test_flex_dispatchers_are_searched_when_named_on_nvidia_gpus(db):
    """Megatron-Core's alltoall alone by default; --dispatchers adds DeepEP / HybridEP to every plan
    with experts over ranks (none without), on NVIDIA GPUs only, and a framework keeps those it runs;
    the search's answer is checked independently and names its dispatcher."""
    from perfmodel.catalog import find_model
    from perfmodel.plan import DISPATCHERS
    from perfmodel.search.api import plan_train
    from perfmodel.search.requests import PlanTrainRequest
    from perfmodel.search.space import build_space

    spec, work = find_model("mixtral-8x7b"), TrainWorkload(256, 4096)
    machine = build_machine(db, "dgx-h100", 64)
    plain, _ = build_space(spec, machine, work)
    both, declared = build_space(spec, machine, work, SpaceOptions(dispatchers=("alltoall", "deepep")))
    assert set(plain["dispatcher"]) == {0} and declared["dispatcher"] == 2
    assert np.all(both["ep"][both["dispatcher"] > 0] > 1)
    assert int((both["dispatcher"] > 0).sum()) == int((plain["ep"] > 1).sum())
    amd, _ = build_space(spec, build_machine(db, "mi300x-8x", 64), work, SpaceOptions(dispatchers=DISPATCHERS))
    assert set(amd["dispatcher"]) == {0}
    assert PlanTrainRequest(model="mixtral-8x7b", dispatchers="alltoall,hybridep",
                            framework="torchtitan").resolve(db)[3].space.dispatchers == ("alltoall",)
    planning = plan_train(model="mixtral-8x7b", system="dgx-h100", devices=64, global_batch=256, seq_len=4096,
                          dispatchers="alltoall,deepep", db=db)
    assert planning.result.evidence.status == "OPTIMAL" and not planning.result.evidence.check
    assert planning.best.plan.dispatcher in DISPATCHERS


def test_context_parallel_exchanges_are_searched_when_named(db):
    """The ring alone by default; --cp-comms adds the all-gather and Ulysses (where a TP rank's KV
    heads divide by cp), and a framework keeps only the exchanges it runs."""
    from perfmodel.catalog import find_model
    from perfmodel.plan import CP_COMMS
    from perfmodel.search.requests import PlanTrainRequest
    from perfmodel.search.space import build_space

    spec, machine, work = find_model("llama-3.1-8b"), build_machine(db, "dgx-h100", 8), TrainWorkload(64, 32768)
    ring, _ = build_space(spec, machine, work)
    every, _ = build_space(spec, machine, work, SpaceOptions(cp_comms=CP_COMMS))
    assert set(ring["cp_comm"]) == {0}
    assert {CP_COMMS[c] for c in every["cp_comm"]} == set(CP_COMMS)
    assert np.all(every["cp"][every["cp_comm"] > 0] > 1)           # a variant only where there is a ring to replace
    ulysses = every["cp_comm"] == CP_COMMS.index("a2a")
    assert np.all((8 // every["tp"][ulysses]) % every["cp"][ulysses] == 0)   # 8 KV heads over tp, whole per cp rank
    request = PlanTrainRequest(model="llama-3.1-8b", system=("dgx-h100",), cp_comms="p2p,all_gather",
                               framework="torchtitan")
    assert request.resolve(db)[3].space.cp_comms == ("p2p",)


@pytest.mark.parametrize("when", ["needed", "always"])
def test_activation_offload_search_agrees_with_brute_force(db, when):
    # Llama 3.1 8B at 64K tokens on 4 H200s: swapping activations to DDR competes with recomputation
    # ("always") or is tried only if nothing fits without it ("needed"); either way the search's answer is
    # brute force's over the same declared space, activation shares and offload placements included.
    from perfmodel.catalog import find_model

    spec = find_model("llama-3.1-8b")
    work = TrainWorkload(4, 65536)
    space = SpaceOptions(micro_batches=(1,), interleaves=(1,), precisions=("bf16",), max_cp=2, zero_stages=(1, 3),
                         activation_offloads=(0.25, 0.5, 1.0), activation_offload_when=when)
    machine = build_machine(db, "hgx-h200", 4)
    expected, _ = brute_force_training(spec, machine, work, space)
    result = search_training(spec, db, [("hgx-h200", 4)], work, SearchOptions(space=space))
    assert result.best is not None and result.evidence.status == "OPTIMAL" and not result.evidence.check
    assert result.best.step_time_s == pytest.approx(expected, rel=1e-6)
    if when == "always":
        assert result.best.plan.activation_offload > 0      # here a swap beats recomputing
