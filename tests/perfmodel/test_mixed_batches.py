"""Prompts as chunks inside decode steps (chunked prefill in mixed batches; Agrawal et al., Sarathi-Serve,
OSDI 2024): the mixed step's physics, its queueing, the search's choice and the launch files that run it."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.queueing import pool_latencies
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

PHASES = ("prefill", "decode", "mixed")


@pytest.fixture(scope="module")
def h100(db):
    return build_machine(db, "dgx-h100", 8)


def _mixed(spec, machine, chunk, batch=64, tp=8, **plan):
    return estimate_serving(spec, machine, ServePlan(tp=tp, batch=batch, chunk_tokens=chunk, **plan),
                            ServeWorkload(2048, 1024), PHASES)


def test_a_step_carrying_no_prompt_tokens_is_the_decode_step(h100):
    """chunk_tokens equal to the decode batch leaves no prompt tokens: the mixed step is the decode step."""
    spec = find_model("llama-3.1-70b")
    r = _mixed(spec, h100, 64)
    assert float(r.chunk_prompt_tokens) == 0.0
    assert float(r.mixed_step_s) == pytest.approx(float(r.tpot_s), rel=1e-12)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b"])
def test_a_mixed_step_costs_at_most_the_two_steps_it_replaces(h100, model):
    """Weights are read once for the decode tokens and the chunk: never slower than a decode step plus a
    prefill of the chunk's tokens run on their own, never faster than the decode step alone, and slower
    the more prompt tokens it carries."""
    spec = find_model(model)
    chunks = np.array([256.0, 1024.0, 4096.0, 16384.0])
    r = _mixed(spec, h100, chunks + 64)
    carried = np.asarray(r.chunk_prompt_tokens)
    assert np.allclose(carried, chunks)
    alone = estimate_serving(spec, h100, ServePlan(tp=8, batch=1), ServeWorkload(chunks, 1), ("prefill",))
    step, decode = np.asarray(r.mixed_step_s), float(r.tpot_s)
    assert np.all(step >= decode) and np.all(np.diff(step) > 0)
    # The chunk attends to half its prompt on average, a prompt of its own length to half of that:
    # compare against prefilling the chunk as a prompt of its own, padded by that attention difference.
    assert np.all(step <= decode + np.asarray(alone.ttft_s) * 1.10)


def test_moe_mixed_step_grows_with_its_chunk(db):
    spec = find_model("deepseek-v3")
    machine = build_machine(db, "hgx-h200", 8)
    r = _mixed(spec, machine, np.array([64.0, 576.0, 2112.0, 8256.0]), tp=8, ep=8, weight_precision="fp8",
               activation_precision="a8")
    step = np.asarray(r.mixed_step_s)
    assert np.all(np.diff(step) > 0) and step[0] == pytest.approx(float(r.tpot_s), rel=0.05)


def test_unloaded_chunked_ttft_is_its_chunks(h100):
    spec = find_model("llama-3.1-70b")
    r = _mixed(spec, h100, 64 + 512)
    assert float(r.chunked_ttft_s) == pytest.approx(4 * float(r.mixed_step_s))      # 2,048 / 512 chunks


def test_mixed_queue_decode_and_prompt_lane():
    """TPOT: the decode step at no load, T_d / (1 - u (1 - T_d / T_m)) at prompt-lane load u; a step that
    carries prompt tokens for free (T_m = T_d) never stretches TPOT; TTFT at least one mixed step."""
    batch, dpa, out = np.array([64.0]), np.array([1.0]), 512.0
    t_d, t_m = np.array([0.02]), np.array([0.08])
    service = 2048 / 1984 * t_m                    # a 2,048-token prompt in chunks of 1,984
    for rate in (1e-9, 2.0, 8.0):
        ttft, t50, _, load, _ = pool_latencies("colocated", 1.0, rate, out, batch, dpa, service, service, t_d, t_d,
                                               mixed50=t_m, mixed90=t_m)
        u = rate * float(service[0])
        assert float(load[0]) == pytest.approx(u)
        assert float(t50[0]) == pytest.approx(0.02 / (1 - u * (1 - 0.02 / 0.08)))
        assert float(ttft[0.5][0]) >= 0.08
    free = pool_latencies("colocated", 1.0, 8.0, out, batch, dpa, service, service, t_d, t_d, mixed50=t_d, mixed90=t_d)
    assert float(free[1][0]) == pytest.approx(0.02)


def test_separate_batches_are_unchanged_by_the_mixed_columns():
    args = ("colocated", np.array([2.0, 4.0]), 6.0, 256.0, np.array([32.0, 32.0]), np.array([1.0, 1.0]),
            np.array([0.3, 0.3]), np.array([0.4, 0.4]), np.array([0.02, 0.02]), np.array([0.025, 0.025]))
    plain, zeros = pool_latencies(*args), pool_latencies(*args, mixed50=np.zeros(2), mixed90=np.zeros(2))
    for a, b in zip(plain[1:], zeros[1:]):
        assert np.array_equal(a, b)
    assert all(np.array_equal(plain[0][q], zeros[0][q]) for q in plain[0])
