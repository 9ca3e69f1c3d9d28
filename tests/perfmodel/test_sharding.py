"""Hierarchical sharding: HSDP / MiCS, a group per state (Frontier's three levels), ZeRO++ (hpZ, qwZ,
qgZ). Invariants of the groups, the bytes and the links (the Frontier comparison, typed as commands, is in
tests/cli/test_frontier_sharding.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perfmodel.catalog import find_model
from perfmodel.collectives import Topology, reduce_scatter_time
from perfmodel.layout import Layout
from perfmodel.machine import build_machine
from perfmodel.requests import TrainRequest
from perfmodel.sharding import QGZ_BYTES, QWZ_BYTES, Sharding
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training
from perfmodel.training_comm import _dense_gathers, _reduce_scatter

SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WORK = TrainWorkload(256, 4096)

stages = st.integers(1, 3)
powers_of_two = st.sampled_from([1, 2, 4, 8, 16, 32, 64])
byte_counts = st.floats(min_value=1e3, max_value=1e12)


@pytest.fixture(scope="module")
def h100x64(db):
    return build_machine(db, "dgx-h100", 64)


@pytest.fixture(scope="module")
def spec():
    return find_model("llama-3.1-8b")


def _same(a, b):
    for field in ("step_time_s", "hbm_used_bytes", "feasible"):
        assert np.array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field))), field
    for part in a.memory:
        assert np.array_equal(np.asarray(a.memory[part]), np.asarray(b.memory[part])), part


# --- the groups ------------------------------------------------------------------------------------

@pytest.mark.parametrize("zero", [1, 2, 3])
def test_sharding_over_a_group_of_one_is_no_sharding(h100x64, spec, zero):
    plan = dict(tp=1, pp=1, dp=64, recompute="full")
    one = estimate_training(spec, h100x64, TrainPlan(**plan, zero=zero, shard=1), WORK)
    none = estimate_training(spec, h100x64, TrainPlan(**plan, zero=0), WORK)
    _same(one, none)


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 2), (8, 1)])
def test_a_group_of_every_replica_is_flat_zero(h100x64, spec, zero, tp, cp):
    replicas = 64 // tp
    plan = dict(tp=tp, pp=1, dp=replicas // cp, cp=cp, zero=zero, recompute="full", sp=tp > 1)
    flat = estimate_training(spec, h100x64, TrainPlan(**plan), WORK)
    explicit = dict(shard=replicas, shard_grads=replicas if zero >= 2 else 0,
                    shard_weights=replicas if zero >= 3 else 0)
    _same(estimate_training(spec, h100x64, TrainPlan(**plan, **explicit), WORK), flat)


@given(params=st.floats(1e6, 1e12), zero=stages, small=powers_of_two, k=st.sampled_from([1, 2, 4, 8]))
@example(params=8e9, zero=3, small=1, k=8)
def test_memory_per_device_never_grows_with_the_group(params, zero, small, k):
    replicas = 512
    narrow, wide = (Sharding.of(zero, replicas, shard=size).state_bytes(params) for size in (small, small * k))
    assert sum(wide) <= sum(narrow) * (1 + 1e-12)
    for a, b in zip(wide, narrow):
        assert a <= b * (1 + 1e-12)


def test_each_state_holds_exactly_its_share():
    # Frontier's three levels for 20B parameters: weights over 2, gradients over 8, optimizer states over 384.
    s = Sharding.of(3, 384, shard_grads=8, shard_weights=2)
    weights, grads, optimizer = s.state_bytes(20e9)
    assert (weights, grads, optimizer) == (20e9 * 2 / 2, 20e9 * 2 / 8, 20e9 * 12 / 384)
    # hpZ keeps a secondary copy over its group besides the primary partition (ZeRO++ Sec. 3.2).
    primary, _, _ = Sharding.of(3, 384, hpz=8).state_bytes(20e9)
    assert primary == 20e9 * 2 / 384 + 20e9 * 2 / 8


def test_rules_name_what_does_not_nest(h100x64, spec):
    def binding(**kw):
        return estimate_training(spec, h100x64, TrainPlan(tp=1, pp=1, dp=64, recompute="full", **kw), WORK).binding
    assert binding(zero=3, shard=5) == "shard divides dp x cp"
    assert binding(zero=3, shard=8, shard_grads=16) == "shard-grads divides the optimizer states' group"
    assert binding(zero=3, shard_grads=8, shard_weights=16) == "shard-weights divides the gradients' group"
    assert binding(zero=3, hpz=64) == "hpz divides the weights' group and is smaller"
    assert binding(zero=2, qwz=True) == "hpz, qwz and qgz need zero 3 (ZeRO++)"
    assert binding(zero=1, shard_weights=2) == "shard-weights needs zero 3"


def test_request_refuses_in_one_line():
    from perfmodel.hardware_db import load_database
    from perfmodel.hardware_db.errors import SpecError

    db = load_database()
    base = dict(model="llama-3.1-8b", system="dgx-h100", devices=64, tp=1, pp=1)
    for kw, words in ((dict(zero=1, hpz=8), "--hpz, --qwz and --qgz need --zero 3"),
                      (dict(zero=3, shard=3), "--shard needs a divisor of dp x cp = 64"),
                      (dict(zero=2, shard_weights=2), "--shard-weights needs --zero 3")):
        with pytest.raises(SpecError, match=words):
            TrainRequest(**base, **kw).resolve(db)


# --- the bytes and the links -----------------------------------------------------------------------

def _one_level(bw=50e9):
    return Topology(("one",), np.array([1e9]), np.array([bw]), np.array([0.0]))


def _two_levels(inner=8, inner_bw=400e9, outer_bw=50e9):
    return Topology(("node", "network"), np.array([float(inner), 1e9]), np.array([inner_bw, outer_bw]),
                    np.array([0.0, 0.0]))


@given(size=byte_counts, n=st.integers(2, 512))
def test_quantized_collectives_move_the_stated_fraction(size, n):
    topo = _one_level()
    # qgZ: int4 of bf16 is a quarter; on one level its all-to-all moves what a ring reduce-scatter moves.
    assert topo.two_hop_reduce_scatter(size * QGZ_BYTES / 2.0, 1, n) == pytest.approx(
        topo.reduce_scatter(size, 1, n) * QGZ_BYTES / 2.0, rel=1e-12)
    # qwZ: int8 of bf16 is a half, in the gather itself (kernels left out: infinite HBM bandwidth).
    machine = SimpleNamespace(topology=topo, hbm_bytes_per_s=np.inf)
    lay = Layout(tp=1, dp=n)
    params = size / 2.0
    plain = sum(_dense_gathers(machine, lay, Sharding.of(3, n), params, 0.0))
    int8 = sum(_dense_gathers(machine, lay, Sharding.of(3, n, qwz=True), params, 0.0))
    assert int8 == pytest.approx(plain * QWZ_BYTES / 2.0, rel=1e-12)
    grads = _reduce_scatter(machine, lay.replica_subgroup(n), Sharding.of(3, n, qgz=True), size)
    assert grads == pytest.approx(reduce_scatter_time(size * QGZ_BYTES / 2.0, n, 50e9, 0.0), rel=1e-12)


@given(size=byte_counts, nodes=st.integers(1, 64), inner=st.sampled_from([2, 4, 8]),
       inner_bw=st.floats(1e10, 1e12), outer_bw=st.floats(1e9, 1e11))
@example(size=1e9, nodes=48, inner=8, inner_bw=154e9, outer_bw=10.6e9)
def test_no_two_hop_reduce_scatter_beats_its_links(size, nodes, inner, inner_bw, outer_bw):
    topo = _two_levels(inner, inner_bw, outer_bw)
    n = inner * nodes
    t = topo.two_hop_reduce_scatter(size, 1, n)
    inside = (inner - 1) / inner * size / inner_bw              # what leaves each device inside its node
    across = (nodes - 1) / nodes * size / inner / outer_bw       # what leaves it across nodes, reduced k-fold
    assert t >= max(inside, across) * (1 - 1e-12)


@SLOW
@given(zero=stages, shard=st.sampled_from([0, 2, 8, 32]), hpz=st.sampled_from([0, 2, 8]), qwz=st.booleans(),
       qgz=st.booleans())
def test_no_sharded_transfer_beats_the_link_its_group_spans(db, zero, shard, hpz, qwz, qgz):
    # Per microbatch, ZeRO-3 receives every weight at least once per pass over the link of the smallest
    # group it gathers in: no schedule moves those bytes faster than that link.
    machine = build_machine(db, "frontier", 64)
    spec = find_model("llama-3.1-8b")
    zero3 = zero == 3
    plan = TrainPlan(tp=1, pp=1, dp=64, zero=zero, recompute="none", shard=shard, hpz=hpz if zero3 else 0,
                     qwz=qwz and zero3, qgz=qgz and zero3)
    r = estimate_training(spec, machine, plan, TrainWorkload(64, 2048))
    s = Sharding.of(zero, 64, shard, 0, 0, hpz if zero3 else 0, qwz and zero3, qgz and zero3)
    dense, _ = Layout(tp=1, dp=64).params_per_device(spec, spec.num_layers, True, True)
    topo = machine.topology
    fastest = topo.bw[topo.level_of(1, np.minimum(s.secondary, s.weights))]
    received = np.where(s.weights > 1, dense * (1 - 1 / s.weights) * np.where(s.qwz, QWZ_BYTES, 2.0), 0.0)
    gathers = float(r.link_times["zero-2/3 gathers and scatters"]) / float(r.num_microbatches)
    assert gathers >= float(received / fastest) * (1 - 1e-9)


@pytest.mark.parametrize("name, ep", [("llama-3.1-8b", 1), ("mixtral-8x7b", 8)])
def test_sharded_gradients_are_reduced_with_every_microbatch(h100x64, name, ep):
    # A rank that keeps only its shard of the gradients reduce-scatters each microbatch's gradients in
    # that microbatch's backward (Megatron-FSDP's optim_grads: 'gradient reduction occurs on every
    # backward propagation'); whole gradients (ZeRO-1) are reduced once per step. So ZeRO-2's gradient
    # traffic grows with the microbatches of a step and ZeRO-1's does not.
    spec = find_model(name)

    def links(zero, batch):
        plan = TrainPlan(tp=1, pp=1, dp=64, ep=ep, zero=zero, recompute="full", sp=False)
        r = estimate_training(spec, h100x64, plan, TrainWorkload(batch, 2048))
        return (float(r.link_times["zero-2/3 gathers and scatters"]), float(r.link_times["dp gradient reduction"]),
                float(r.num_microbatches))
    for zero in (1, 2):
        (s1, d1, m1), (s4, d4, m4) = links(zero, 64), links(zero, 256)
        assert (m1, m4) == (1, 4) and d4 == pytest.approx(d1, rel=1e-12)
        if zero == 1:
            assert s1 == s4 == 0
        else:
            assert s4 == pytest.approx(4 * s1, rel=1e-12) and s1 > 0
