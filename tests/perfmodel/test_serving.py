"""Serving: decode reads weights once per step, MoE reads only the experts hit, precisions are listed."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.hardware_db.errors import SpecError, UnsupportedPrecisionError
from perfmodel.catalog import find_model
from perfmodel.layout import Layout
from perfmodel.machine import build_machine
from perfmodel.serving import ServePlan, ServeWorkload, distinct_experts, estimate_serving


@pytest.fixture(scope="module")
def h100(db):
    return build_machine(db, "dgx-h100", 8)


def test_distinct_experts_expectation():
    assert distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert distinct_experts(256, 8, 1e6) == pytest.approx(256.0)
    assert distinct_experts(256, 8, 16) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 16))


def test_decode_time_grows_with_context_and_batch(h100):
    spec = find_model("llama-3.1-70b")
    batches = np.array([1, 8, 64, 256])
    r = estimate_serving(spec, h100, ServePlan(tp=8, batch=batches), ServeWorkload(1024, 256))
    assert np.all(np.diff(r.tpot_s) >= 0)
    short = estimate_serving(spec, h100, ServePlan(tp=8, batch=32), ServeWorkload(512, 256))
    long = estimate_serving(spec, h100, ServePlan(tp=8, batch=32), ServeWorkload(32768, 256))
    assert float(long.tpot_s) > float(short.tpot_s) and float(long.ttft_s) > float(short.ttft_s)


def test_small_batch_decode_is_memory_bound_on_weights(h100):
    spec = find_model("llama-3.1-70b")
    r = estimate_serving(spec, h100, ServePlan(tp=8, batch=1), ServeWorkload(128, 128))
    weight_bytes = spec.total_params * 2 / 8
    assert float(r.tpot_s) >= weight_bytes / h100.hbm_bytes_per_s
    assert not bool(r.bounds["decode mlp"])


def test_quantized_weights_are_smaller_and_faster(h100):
    spec = find_model("llama-3.1-70b")
    bf16 = estimate_serving(spec, h100, ServePlan(tp=8, batch=8), ServeWorkload(1024, 256))
    fp8 = estimate_serving(spec, h100, ServePlan(tp=8, batch=8, weight_precision="fp8", activation_precision="a8",
                                                 kv_precision="fp8"), ServeWorkload(1024, 256))
    int4 = estimate_serving(spec, h100, ServePlan(tp=8, batch=8, weight_precision="int4"), ServeWorkload(1024, 256))
    # Every weight at its width, except the embedding, the head and the routers, which stay 16-bit
    # (Layout.sixteen_bit_params_per_device): 2 bytes less 1 (fp8) or 0.5 (int4) per parameter.
    wide = float(Layout(tp=8).sixteen_bit_params_per_device(spec, spec.num_layers, True, True))
    assert wide > 0
    assert float(fp8.memory["weights"]) == pytest.approx(float(bf16.memory["weights"]) / 2 + wide * 1.0)
    assert float(int4.memory["weights"]) == pytest.approx(float(bf16.memory["weights"]) / 4 + wide * 1.5)
    assert float(fp8.tpot_s) < float(bf16.tpot_s) and float(int4.tpot_s) < float(bf16.tpot_s)
    assert float(fp8.max_batch) > float(bf16.max_batch)


def test_unlisted_rates_are_errors(h100):
    spec = find_model("llama-3.1-8b")
    with pytest.raises(UnsupportedPrecisionError, match="h100-sxm does not support fp4"):
        estimate_serving(spec, h100, ServePlan(weight_precision="fp4", activation_precision="a4"), ServeWorkload(8, 8))
    with pytest.raises(SpecError, match="needs weights it pairs with"):
        estimate_serving(spec, h100, ServePlan(weight_precision="bf16", activation_precision="a8"), ServeWorkload(8, 8))


def test_moe_decode_reads_only_the_experts_hit(db):
    machine = build_machine(db, "dgx-h100", 16)
    spec = find_model("deepseek-v3")
    small = estimate_serving(spec, machine, ServePlan(tp=1, ep=16, dp_attention=16, batch=16, weight_precision="fp8",
                                                      activation_precision="a8"), ServeWorkload(1024, 128))
    big = estimate_serving(spec, machine, ServePlan(tp=1, ep=16, dp_attention=16, batch=16 * 64,
                                                    weight_precision="fp8", activation_precision="a8"),
                           ServeWorkload(1024, 128))
    assert float(small.decode_operator_times["experts"]) < float(big.decode_operator_times["experts"])


def test_weights_streamed_from_a_pooled_tier(db):
    """Weights in a pooled tier (FengHuang) stream each step: HBM keeps two layers' worth, the step is
    never shorter than the stream, the pool holds the weights and KV together, and a tier too small
    is the binding constraint, by the bytes it lacks."""
    spec = find_model("llama-3.1-70b")
    pool = build_machine(db, "fenghuang-h200", 8)
    tier = pool.tier("pooled")
    work = ServeWorkload(2048, 256)
    local = estimate_serving(spec, pool, ServePlan(tp=8, batch=32), work)
    assert local.binding[()] == "hbm"                           # 17.6 GB of weights per device, 20 GB of HBM
    streamed = estimate_serving(spec, pool, ServePlan(tp=8, batch=32, weight_place="pooled", kv_place="pooled"), work)
    assert bool(streamed.feasible)
    weights = float(streamed.memory["weights in pooled"])
    assert float(streamed.memory["weights"]) == pytest.approx(weights * 2 / spec.num_layers)
    kv = float(streamed.memory["kv cache in pooled"])
    assert float(streamed.tpot_s) >= (weights + kv) / tier.read_bytes_per_s
    assert float(streamed.ttft_s) >= weights / tier.read_bytes_per_s
    assert float(streamed.weight_stream_s) == pytest.approx(weights / tier.read_bytes_per_s)
    # The same instance on H200s with the weights in HBM: streaming is never faster.
    h200 = estimate_serving(spec, build_machine(db, "hgx-h200", 8), ServePlan(tp=8, batch=32), work)
    assert float(streamed.tpot_s) >= float(h200.tpot_s) * (1 - 1e-9)
    # One copy of the weights serves the node (_copy_share): a model whose copy outgrows the node's
    # pool binds there, by the bytes each device lacks.
    big = estimate_serving(find_model("deepseek-v3"), pool, ServePlan(tp=8, batch=1, weight_place="pooled",
                                                                        weight_precision="bf16"), work)
    held = float(big.memory["weights in pooled"])
    assert big.binding[()] == "pooled" and float(big.shortfall) == pytest.approx(held - tier.bytes_per_device)


def test_a_pooled_tier_holds_one_copy_of_the_weights_per_node(db):
    """A pooled tier is shared by its node's devices: an instance of d of the node's D devices keeps
    d / D of its shards there (one copy read by every instance), while each device still streams its
    whole shard each step; a tier behind one host (DDR) keeps the whole shard."""
    spec, work = find_model("llama-3.1-405b"), ServeWorkload(2048, 256)
    pool = build_machine(db, "fenghuang-h200", 8)
    tier = pool.tier("pooled")
    for tp in (1, 2, 4, 8):
        r = estimate_serving(spec, pool, ServePlan(tp=tp, batch=1, weight_place="pooled"), work)
        shard = float(r.weight_stream_s) * tier.read_bytes_per_s
        assert float(r.memory["weights in pooled"]) == pytest.approx(shard * tp / 8)
        assert float(r.memory["weights in pooled"]) == pytest.approx(spec.total_params * 2.0 / 8, rel=0.05)
    host = build_machine(db, "hgx-h200", 8)
    r = estimate_serving(spec, host, ServePlan(tp=8, batch=1, weight_place="ddr"), work)
    assert float(r.memory["weights in ddr"]) == pytest.approx(float(r.weight_stream_s) * host.tier("ddr").read_bytes_per_s)


def test_weights_in_hbm_are_the_default_and_unchanged(h100):
    spec = find_model("llama-3.1-8b")
    a = estimate_serving(spec, h100, ServePlan(tp=1, batch=8), ServeWorkload(1024, 128))
    assert "weights in ddr" not in a.memory and float(a.weight_stream_s) == 0.0
    assert float(a.decode_components["streamed from memory tiers (exposed)"]) == 0.0


@pytest.mark.parametrize("name, tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 8)])
def test_power_by_phase_and_under_a_cap(h100, name, tp):
    """Prefill draws more than memory-bound decode; both stay between idle and TDP; under a cap each
    phase draws at most the cap, never runs faster, and decode slows far less than prefill."""
    spec = find_model(name)
    batches = np.array([1, 8, 32, 128])
    free = estimate_serving(spec, h100, ServePlan(tp=tp, batch=batches), ServeWorkload(2048, 256))
    node = h100.overhead_w_per_device
    decode, prefill = free.power_w - node, free.prefill_power_w - node
    assert np.all((h100.idle_w <= decode) & (decode < prefill) & (prefill <= h100.tdp_w + 1e-9))
    assert np.all(np.diff(decode) >= 0)                        # a larger batch does more work per step
    previous = free
    for cap in (600.0, 450.0, 300.0):
        capped = estimate_serving(spec, h100, ServePlan(tp=tp, batch=batches, power_cap_w=cap), ServeWorkload(2048, 256))
        assert np.all(capped.power_w - node <= cap + 1e-6) and np.all(capped.prefill_power_w - node <= cap + 1e-6)
        assert np.all(capped.ttft_s >= previous.ttft_s * (1 - 1e-9)) and np.all(capped.tpot_s >= previous.tpot_s * (1 - 1e-9))
        previous = capped
    assert np.all(previous.tpot_s / free.tpot_s - 1 <= (previous.ttft_s / free.ttft_s - 1) + 1e-9)
    assert float(previous.ttft_s[-1] / free.ttft_s[-1]) > 1.05   # a 300 W cap slows a 700 W GPU's prefill


@pytest.mark.parametrize("model, system, overlap", [("deepseek-v3", "dgx-h100", True), ("llama-3.1-70b", "dgx-h100", False)])
def test_one_phase_alone_equals_its_share_of_the_whole(db, model, system, overlap):
    """The serving search prices prefill and decode apart (``phases``): each alone gives the whole
    estimate's own numbers for it, over many plans (MoE two-batch overlap included), and the phase
    left out reads 0 s with finite throughput, energy and cost."""
    spec, machine = find_model(model), build_machine(db, system, 16)
    tp, dpa = np.array([8.0, 4.0, 2.0, 1.0]), np.array([2.0, 4.0, 8.0, 16.0])
    plan = ServePlan(tp=tp, dp_attention=dpa, ep=np.full(4, 16.0 if spec.moe else 1.0), batch=dpa * 16,
                     weight_precision="fp8", kv_precision="fp8", overlap_comm=overlap)
    work = ServeWorkload(np.array([512.0, 2048.0, 4096.0, 1024.0]), 512)
    whole = estimate_serving(spec, machine, plan, work)
    prefill = estimate_serving(spec, machine, plan, work, phases=("prefill",))
    decode = estimate_serving(spec, machine, plan, work, phases=("decode",))
    assert np.array_equal(prefill.ttft_s, whole.ttft_s) and np.array_equal(decode.tpot_s, whole.tpot_s)
    assert np.array_equal(decode.power_w, whole.power_w) and np.array_equal(prefill.prefill_power_w,
                                                                           whole.prefill_power_w)
    assert np.all(prefill.tpot_s == 0) and np.all(decode.ttft_s == 0)
    for r in (prefill, decode):
        for values in (r.energy_per_token_j, r.cost_per_million_tokens_usd, r.prefill_tokens_per_s_per_device,
                       r.decode_tokens_per_s_per_device):
            assert np.all(np.isfinite(values))


def test_one_evaluation_for_every_place_equals_one_estimate_per_place(db):
    """estimate_serving_placed evaluates the phases once for every (KV place, weight place): each
    result is exactly (every field, bit for bit) the estimate with the plan at that place."""
    from dataclasses import fields, replace

    from perfmodel.serving import estimate_serving_placed

    machine = build_machine(db, "fenghuang-h200", 8)
    spec = find_model("llama-3.1-70b")
    plan = ServePlan(tp=np.array([4.0, 8.0, 8.0]), batch=np.array([8.0, 32.0, 128.0]), weight_precision="fp8",
                     power_cap_w=500.0)
    work = ServeWorkload(np.array([1024.0, 2048.0, 4096.0]), 512)
    places = [("hbm", "hbm"), ("pooled", "hbm"), ("hbm", "pooled"), ("pooled", "pooled")]
    for phases in (("prefill", "decode"), ("decode",), ("prefill",)):
        together = estimate_serving_placed(spec, machine, plan, work, places, phases=phases)
        for (kv, w), got in zip(places, together):
            alone = estimate_serving(spec, machine, replace(plan, kv_place=kv, weight_place=w), work, phases=phases)
            for f in fields(alone):
                a, b = getattr(alone, f.name), getattr(got, f.name)
                if isinstance(a, dict):
                    assert a.keys() == b.keys()
                    for k in a:
                        np.testing.assert_array_equal(np.asarray(a[k], dtype=object), np.asarray(b[k], dtype=object))
                elif isinstance(a, tuple):
                    for x, y in zip(a, b):
                        np.testing.assert_array_equal(x, y)
                elif f.name != "quant":
                    np.testing.assert_array_equal(a, b)


def test_a_measured_decode_attention_rate_prices_a_roofline_decode_core(db):
    """Ascend has no decode attention fit, only one published kernel measurement (AMLA: 82% of the BF16
    peak, calibration ascend-910c-measured): its decode attention core runs at that rate, where it is
    compute-bound, instead of the unmeasured large-GEMM floor; its prefill and its GEMMs keep the floor."""
    from dataclasses import replace

    spec = find_model("deepseek-v3")
    machine = build_machine(db, "cloudmatrix384-die", 32)
    assert machine.decode_attention_fraction == {"bf16": 0.816}
    assert machine.decode_attention_flops("bf16") == pytest.approx(0.816 * machine.peak_flops["bf16"], rel=1e-12)
    plan = ServePlan(tp=1, ep=32, dp_attention=32, batch=32 * 96, weight_precision="int8", activation_precision="a8")
    work = ServeWorkload(4096, 1)
    measured = estimate_serving(spec, machine, plan, work)
    floor = estimate_serving(spec, replace(machine, decode_attention_fraction={}), plan, work)
    ratio = float(floor.decode_operator_times["attention core"] / measured.decode_operator_times["attention core"])
    assert ratio == pytest.approx(0.816 * machine.peak_flops["bf16"] / machine.for_serving().flops("bf16"), rel=1e-6)
    for phase in ("prefill_operator_times", "decode_operator_times"):
        same = [k for k in getattr(measured, phase) if not (phase.startswith("decode") and k == "attention core")]
        assert all(float(getattr(measured, phase)[k]) == float(getattr(floor, phase)[k]) for k in same)
