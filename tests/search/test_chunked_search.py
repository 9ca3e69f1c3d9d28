"""plan serve searches how a colocated instance runs its prompts (--chunk-tokens), and exports it."""

from __future__ import annotations

import pytest

from perfmodel.search.api import plan_serve
from perfmodel.hardware_db.errors import SpecError
from perfmodel.search.requests import chunk_sizes

LLAMA = dict(model="llama-3.1-70b", system=["dgx-h100"], rate=20, modes="colocated")


def _pools(planning):
    result = planning.result
    return [p for d in [result.best, *result.top] if d is not None for p in d.pools]


def test_chunk_sizes_parse_and_frameworks_that_always_mix():
    assert chunk_sizes("8192,0,2048") == (0, 2048, 8192)
    assert chunk_sizes("0,2048", "vllm") == (2048,) and chunk_sizes("0,2048", "sglang") == (0, 2048)
    for bad in ("", "x", "-1", "2000000"):
        with pytest.raises(SpecError, match="--chunk-tokens"):
            chunk_sizes(bad)
    with pytest.raises(SpecError, match="give a size above 0"):
        chunk_sizes("0", "trtllm")


def test_separate_batches_only_when_asked():
    found = plan_serve(**LLAMA, chunk_tokens="0")
    assert found.result.best is not None and all(p.config["chunk_tokens"] == 0 for p in _pools(found))


def test_mixed_steps_carry_more_on_the_same_fleet():
    """More ways to schedule never lowers what 16 H100 carry within the targets; on Llama 3.1 70B,
    mixing prompt chunks into the decode steps carries more (the weights are read once for both)."""
    common = dict(LLAMA, objective="throughput", max_devices=16)
    separate = plan_serve(**common, chunk_tokens="0").result.capacity[0]
    mixed = plan_serve(**common, chunk_tokens="0,2048,8192").result
    assert mixed.capacity[0] >= separate * 1.05
    assert mixed.best.pools[0].config["chunk_tokens"] > 0


def test_a_chunked_pool_meets_its_targets_and_reproduces(db):
    found = plan_serve(**LLAMA, chunk_tokens="2048")
    pool = found.result.best.pools[0]
    assert pool.config["chunk_tokens"] == 2048
    assert pool.ttft_p90_s <= 2.0 and pool.tpot_p90_s <= 0.050
