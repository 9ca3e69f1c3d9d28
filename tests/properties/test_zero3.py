"""Invariants of ZeRO-3 / FSDP at scale: the sharded collectives across nodes (NCCL's ring and PAT
cost model), one collective per layer and pass, prefetch depth and the gathered-layer buffers.

Strategies are named after what they draw; ``@example`` pins the regimes the model once priced as
bandwidth only (a few KB per rank over a thousand ranks).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perfmodel.catalog import find_model
from perfmodel.collectives import NCCL_RING, pat_latency, ring_latency, sharded_collective_time
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

shard_bytes = st.floats(min_value=1.0, max_value=1e9)            # one rank's shard: a byte to a GB
ranks = st.integers(min_value=2, max_value=4096)
ranks_per_node = st.sampled_from([1, 2, 4, 8, 72])
bandwidths = st.floats(min_value=1e9, max_value=1e12)
powers_of_two = st.integers(min_value=1, max_value=11).map(lambda e: 2 ** e)


def _latency_floor(n, per_node):
    """The smallest latency any of NCCL's ring protocols (and PAT, one rank per node) pays."""
    floor = min(float(ring_latency(n, per_node, p)) for p in NCCL_RING)
    return min(floor, float(pat_latency(n))) if per_node <= 1 else floor


@given(shard=shard_bytes, n=ranks, per_node=ranks_per_node, bw=bandwidths)
@example(shard=4e3, n=1024, per_node=8, bw=42.5e9)
@example(shard=4e3, n=2048, per_node=1, bw=42.5e9)
def test_a_sharded_collective_is_never_below_its_bandwidth_or_its_latency_bound(shard, n, per_node, bw):
    size = shard * n
    t = float(sharded_collective_time(size, n, per_node, bw))
    assert t >= (n - 1) / n * size / bw * (1 - 1e-12)          # every rank receives (n-1)/n of the buffer
    assert t >= _latency_floor(n, min(per_node, n)) * (1 - 1e-12)   # the ring's steps (or PAT's) at least once


@given(size=st.floats(min_value=1.0, max_value=1e12), n=ranks, more=st.integers(1, 4096),
       per_node=ranks_per_node, bw=bandwidths)
def test_more_ranks_with_the_same_bytes_never_make_a_sharded_collective_faster(size, n, more, per_node, bw):
    assert float(sharded_collective_time(size, n + more, per_node, bw)) >= \
        float(sharded_collective_time(size, n, per_node, bw)) * (1 - 1e-12)


@given(shard=shard_bytes, n=powers_of_two, stride=st.sampled_from([1, 8]), op=st.sampled_from(["all_gather",
                                                                                                 "reduce_scatter"]))
@example(shard=2e3, n=1024, stride=1, op="all_gather")
@SLOW
def test_on_a_system_more_ranks_never_make_a_zero3_collective_faster_nor_beat_its_bounds(db, shard, n, stride, op):
    """On DGX H100 (measured collectives inside a node, NCCL's ring across nodes), a gather or
    reduce-scatter of the same total bytes over twice the ranks is never faster, and none beats the
    bandwidth its slowest link gives."""
    topo = build_machine(db, "dgx-h100", 2 * n * stride).topology
    size = shard * n
    t, t2 = float(getattr(topo, op)(size, stride, n)), float(getattr(topo, op)(size, stride, 2 * n))
    assert t2 >= t * (1 - 1e-12)
    bw, _ = topo.link(stride, n)
    assert t >= (n - 1) / n * size / float(bw) * (1 - 1e-9)


@given(name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b"]), dp=st.sampled_from([16, 64, 256]),
       recompute=st.sampled_from(["none", "full"]))
@SLOW
def test_zero3_pays_one_collective_per_layer_and_pass(db, name, dp, recompute):
    """ZeRO-3's link time per step is at least (2 + recompute) gathers and one reduce-scatter per
    layer and microbatch, each at least the latency of NCCL's fastest protocol over the group."""
    spec, machine = find_model(name), build_machine(db, "dgx-h100", dp)
    work = TrainWorkload(dp, 4096)
    r = estimate_training(spec, machine, TrainPlan(tp=1, dp=dp, zero=3, recompute=recompute), work)
    passes = 3.0 + (recompute == "full")
    floor = _latency_floor(dp, 8)
    assert float(r.link_times["zero-2/3 gathers and scatters"]) >= passes * spec.num_layers * floor * (1 - 1e-9)


@given(name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"]), dp=st.sampled_from([8, 64]),
       depth=st.integers(0, 3), recompute=st.sampled_from(["none", "full"]))
@SLOW
def test_memory_grows_with_prefetch_depth_and_prefetch_never_slows_a_step(db, name, dp, depth, recompute):
    spec, machine = find_model(name), build_machine(db, "dgx-h100", dp)
    work = TrainWorkload(2 * dp, 4096)
    ep = 8 if spec.moe else 1

    def run(prefetch):
        return estimate_training(spec, machine, TrainPlan(tp=1, dp=dp, ep=ep, zero=3, recompute=recompute,
                                                          prefetch=prefetch), work)

    shallow, deep = run(depth), run(depth + 1)
    held = "gathered layers (ZeRO-3)"
    assert float(deep.memory[held]) > float(shallow.memory[held])
    assert float(deep.hbm_used_bytes) > float(shallow.hbm_used_bytes)
    # Prefetching (any depth) never makes a step slower than gathering on demand.
    assert float(run(max(depth, 1)).step_time_s) <= float(run(0).step_time_s) * (1 + 1e-12)


def test_gathered_layers_are_the_layers_in_flight_plus_one_layers_gradients(db):
    """FSDP holds the computing layer and ``prefetch`` more whole (bf16) and one layer's gradient
    awaiting its reduce-scatter: (1 + prefetch) x 2 + 2 bytes per parameter of one layer."""
    spec, machine = find_model("llama-3.1-70b"), build_machine(db, "dgx-h100", 64)
    work = TrainWorkload(64, 4096)
    held = [float(estimate_training(spec, machine, TrainPlan(tp=1, dp=64, zero=3, prefetch=d), work)
                  .memory["gathered layers (ZeRO-3)"]) for d in (0, 1, 2)]
    # Each depth adds one layer's bf16 weights (2 bytes a parameter): equal steps, each half the
    # depth-0 total (2 bytes of weights + 2 of gradients).
    assert held[2] - held[1] == pytest.approx(held[1] - held[0], rel=1e-9)
    assert held[1] - held[0] == pytest.approx(held[0] / 2.0, rel=1e-9)


def test_a_thousand_rank_gather_of_kilobyte_shards_is_latency_bound(db):
    """The regime the bandwidth-only price missed: 1,024 ranks of 2 KB each across 128 nodes cost the
    ring's steps (milliseconds), not the 0.05 ms its bytes take on the NIC."""
    topo = build_machine(db, "dgx-h100", 1024).topology
    size = 2e3 * 1024
    t = float(topo.all_gather(size, 1, 1024))
    bw, _ = topo.link(1, 1024)
    assert t > 10 * size / float(bw)
    assert t == pytest.approx(float(sharded_collective_time(size, 1024, 8, bw)), rel=1e-12)
    assert np.isfinite(t)
