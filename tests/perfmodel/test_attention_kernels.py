"""Attention kernels: the prefill and decode model, its fit on measured kernels, and its use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from perfmodel.hardware_db.timings import read_attention_timings
from perfmodel.hardware_db import load_database
from perfmodel.hardware_db.errors import SpecError
from perfmodel.calibrate import fit_attention
from perfmodel.kernels import AttentionKernel
from perfmodel.machine import build_machine
from perfmodel.roofline import FLASH_BACKWARD_OVER_FORWARD, attention_core, ops_time

SAMPLE = Path(__file__).parents[1] / "data" / "attention_h100_sample.csv"
H100 = dict(peak=989.4e12, bandwidth=3.35e12, compute_fraction=0.6, memory_fraction=0.8, launch_s=8e-6,
            tile_s=1e-6, sharpness=1.0, saturation=0.3, units=132)


def _gqa(batch, queries, context, decode, heads=32.0, kv_heads=8.0, dim=128.0):
    return attention_core(batch * queries, context, heads * dim, heads * dim, heads * dim, 2 * kv_heads * dim,
                          heads, kv_heads, decode=decode)


def test_decode_time_grows_with_context_and_batch_and_never_falls_below_the_launch():
    k = AttentionKernel(**H100)
    ctx = np.arange(1.0, 5000.0, 37.0)
    op = _gqa(16.0, 1.0, ctx, True)
    t = k.decode(op.flops, op.bytes, op.attention.tiles, ctx)
    assert np.all(np.diff(t) >= -1e-15) and np.all(t >= 8e-6)
    batch = np.arange(1.0, 400.0)
    op = _gqa(batch, 1.0, 2048.0, True)
    assert np.all(np.diff(k.decode(op.flops, op.bytes, op.attention.tiles, 2048.0)) >= -1e-15)


def test_decode_of_one_long_sequence_draws_less_bandwidth_than_a_full_batch():
    k = AttentionKernel(**H100)
    one, full = _gqa(1.0, 1.0, 8192.0, True, kv_heads=1.0), _gqa(256.0, 1.0, 8192.0, True, kv_heads=1.0)
    per_byte = [float(k.decode(o.flops, o.bytes, o.attention.tiles, 8192.0) - 8e-6) / float(o.bytes) for o in (one, full)]
    assert per_byte[0] > 1.2 * per_byte[1]
    assert float(full.bytes) / float(k.decode(full.flops, full.bytes, full.attention.tiles, 8192.0)) <= 0.8 * 3.35e12


def test_prefill_tiles_follow_sequences_heads_and_query_blocks():
    op = _gqa(4.0, 1000.0, 500.0, False)             # 4 sequences of 1000 queries, 32 heads
    assert float(op.attention.tiles) == pytest.approx(4 * 32 * 8)
    k = AttentionKernel(**H100)
    spill = _gqa(1.0, 128.0 * 133, 128.0 * 133 / 2, False, heads=1.0, kv_heads=1.0)
    full = _gqa(1.0, 128.0 * 132, 128.0 * 132 / 2, False, heads=1.0, kv_heads=1.0)
    t_full, t_spill = (float(k.prefill(o.flops, o.bytes, o.attention.tiles)) for o in (full, spill))
    assert t_spill > t_full


def test_a_context_parallel_ring_runs_one_kernel_per_step():
    # cp ranks pass K/V around a ring: each step is one FlashAttention call over the local queries and
    # the arrived chunk, with its own launch and waves (the same FLOPs, more fixed costs).
    k = AttentionKernel(**H100)
    one = attention_core(8192.0, 4096.0, 4096.0, 4096.0, 4096.0, 2048.0, 32.0, 8.0)
    ring = attention_core(8192.0, 4096.0, 4096.0, 4096.0, 4096.0, 2048.0, 32.0, 8.0, steps=8.0)
    single = float(ops_time([one], {"attention": 600e12}, 3.35e12, attention=k).seconds["attention core"])
    eight = float(ops_time([ring], {"attention": 600e12}, 3.35e12, attention=k).seconds["attention core"])
    assert eight == pytest.approx(8 * float(k.prefill(ring.flops / 8, ring.bytes / 8, ring.attention.tiles)))
    assert eight > single + 7 * 8e-6 * (1 - 1e-9)


def test_flash_backward_runs_slower_per_flop_at_the_fitted_rate(db):
    """The backward's 2.5x FLOPs run at forward-over-backward throughput s + s_1k x 1024 / keys
    (constants fitted on FlashAttention-3's measured cuDNN kernels, H100): 1.40x at 1,024 keys,
    about 1.17x at 16k; keys are per ring step under context parallelism."""
    from perfmodel.roofline import flash_backward_over_forward

    constants = build_machine(db, "dgx-h100", 8).constants
    slow = (constants.attention_backward_slowdown, constants.attention_backward_slowdown_1k)
    assert flash_backward_over_forward(1024.0, slow) == pytest.approx(2.5 * 1.400, rel=1e-3)
    assert flash_backward_over_forward(16384.0, slow) == pytest.approx(2.5 * 1.171, rel=1e-3)
    k = AttentionKernel(**H100)
    ring = attention_core(8192.0, 4096.0, 4096.0, 4096.0, 4096.0, 2048.0, 32.0, 8.0, steps=8.0)
    times = ops_time([ring], {"attention": 600e12}, 3.35e12, attention=k, attention_backward=slow)
    assert float(times.backward["attention core"]) == pytest.approx(
        flash_backward_over_forward(4096.0 / 8, slow) * float(times.seconds["attention core"]))


def test_attention_backward_slowdown_is_the_fit_of_its_measured_kernels(db):
    """The two constants are the least-squares fit of forward over backward throughput on the
    measured cuDNN kernels (tests/data/attention_backward_h100_fa3.csv), and the held-out
    FlashAttention-2 and -3 kernels stay within the error their source states (4.5%, 4.3%)."""
    import csv

    path = Path(__file__).parents[1] / "data" / "attention_backward_h100_fa3.csv"
    rows = list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))
    data = {k: np.array([[float(r["seq"]), float(r["forward_tflops"]) / float(r["backward_tflops"])]
                         for r in rows if r["kernel"] == k]) for k in ("cudnn", "flash2", "flash3")}
    seq, ratio = data["cudnn"].T
    fit, *_ = np.linalg.lstsq(np.stack([np.ones_like(seq), 1024.0 / seq], axis=1), ratio, rcond=None)
    constants = build_machine(db, "dgx-h100", 8).constants
    assert (constants.attention_backward_slowdown, constants.attention_backward_slowdown_1k) == \
        pytest.approx(tuple(fit), abs=1e-3)
    for kernel, stated in (("flash2", 0.045), ("flash3", 0.043)):
        seq, ratio = data[kernel].T
        error = np.mean(np.abs((fit[0] + fit[1] * 1024.0 / seq) / ratio - 1.0))
        assert error == pytest.approx(stated, abs=0.001)


def test_flash_backward_is_two_and_a_half_forwards_and_unfused_attention_stays_a_roofline():
    k = AttentionKernel(**H100)
    flash = _gqa(2.0, 4096.0, 2048.0, False)
    times = ops_time([flash], {"attention": 600e12}, 3.35e12, attention=k)
    assert float(times.backward["attention core"]) == pytest.approx(
        FLASH_BACKWARD_OVER_FORWARD * float(times.seconds["attention core"]))
    assert float(times.seconds["attention core"]) == pytest.approx(
        float(k.prefill(flash.flops, flash.bytes, flash.attention.tiles)))
    unfused = attention_core(8192.0, 2048.0, 4096.0, 4096.0, 4096.0, 2048.0, 32.0, 8.0, flash=False)
    plain = ops_time([unfused], {"attention": 600e12}, 3.35e12, attention=k)
    assert float(plain.backward["attention core"]) == pytest.approx(2.0 * float(plain.seconds["attention core"]))
    assert float(plain.seconds["attention core"]) == pytest.approx(
        max(float(unfused.flops) / 600e12, float(unfused.bytes) / 3.35e12))


def test_fit_on_half_of_measured_h100_attention_predicts_the_other_half():
    timings, left_out = read_attention_timings(SAMPLE)
    assert set(timings) == {("prefill", "bf16"), ("decode", "bf16")} and left_out == 0
    for (phase, _), cols in timings.items():
        fit = fit_attention(*cols, 989.4e12, 3.35e12, 132, phase == "decode")
        # issue 11: attention <= 15% (prefill meets it on the full table; decode reaches 19.7%)
        assert fit.held_out_mape <= (0.16 if phase == "prefill" else 0.25), (phase, fit.held_out_mape)
        assert 0.0 < fit.kernel.compute_fraction <= 1.0 and 0.0 < fit.kernel.memory_fraction <= 1.0
        assert 1e-6 < fit.kernel.launch_s < 30e-6


def test_attention_rows_need_a_known_phase_and_dtype(tmp_path):
    bad = tmp_path / "a.csv"
    bad.write_text("phase,batch,seq_len,heads,kv_heads,head_dim,dtype,kv_dtype,seconds\nverify,1,2,3,1,64,bf16,bf16,1e-5\n")
    with pytest.raises(SpecError, match="phase needs prefill or decode"):
        read_attention_timings(bad)
    with pytest.raises(SpecError, match="at least 20 rows"):
        fit_attention([1.0], [1.0], [1.0], [1.0], [1.0], [64.0], 2.0, 2.0, [1e-5], 1e15, 1e12, 132, True)


def test_calibrate_attention_cli_writes_an_entry_serving_uses(tmp_path, capsys):
    from perfmodel.cli.app import main

    assert main(["calibrate", "attention", "--device", "h100-sxm", "--table", str(SAMPLE), "--out", str(tmp_path),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["fit"]["prefill"]) == {"bf16"} and set(out["fit"]["decode"]) == {"bf16"}
    text = (tmp_path / "calibration-h100-sxm.yaml").read_text()
    assert "attention:" in text and "gemm:" in text and "collectives:" in text   # other blocks stay
    machine = build_machine(load_database([tmp_path]), "dgx-h100")
    decode = machine.attention_kernel("bf16", decode=True)
    assert decode is not None and decode.launch_s == pytest.approx(out["fit"]["decode"]["bf16"]["launch_us"] * 1e-6,
                                                                   rel=1e-3)
    assert machine.attention_kernel("fp8") is machine.attention_kernel("bf16")         # nearest fitted precision


def test_only_measured_devices_have_attention_kernels():
    db = load_database()
    assert build_machine(db, "dgx-h100").attention_kernel("bf16") is not None
    assert build_machine(db, "dgx-h100").attention_kernel("fp8", decode=True) is not None
    assert build_machine(db, "mi300x-8x").attention_kernel("bf16") is None
    assert build_machine(db, "mi300x-8x").attention_kernel("bf16", decode=True) is None


# --- multi-head latent attention (MLA) ---------------------------------------------------------

def _deepseek():
    from perfmodel.catalog import load_model
    return load_model("deepseek-v3")


def test_mla_fit_recovers_a_known_core_from_synthetic_module_timings():
    from perfmodel.calibrate import fit_mla, mla_module_parts, projection_seconds
    from perfmodel.roofline import core_seconds
    from perfmodel.kernels import GemmKernel

    spec = _deepseek()
    gemm = GemmKernel(peak=1979e12, bandwidth=3.35e12, compute_fraction=0.7, memory_fraction=0.8, launch_s=6e-6,
                      units=132)
    true = AttentionKernel(**(H100 | dict(compute_fraction=0.3, saturation=0.5)), latent=True)
    batch, isl = np.meshgrid([1.0, 4.0, 16.0, 64.0, 128.0, 256.0], [64.0, 512.0, 2048.0, 8192.0])
    batch, isl = batch.ravel(), isl.ravel()
    heads = np.where(np.arange(batch.size) % 2, 128.0, 16.0)
    gemms, core = mla_module_parts(spec, batch, isl, heads, 1.0, True)
    seconds = projection_seconds(gemms, gemm) + core_seconds(true, core)
    fit = fit_mla(spec, batch, isl, heads, 1.0, seconds, gemm, 989.4e12, 3.35e12, 132, True, memory_fraction=0.8)
    assert fit.kernel.latent and fit.kernel.memory_fraction == 0.8
    assert fit.held_out_mape < 0.01
    assert fit.kernel.compute_fraction == pytest.approx(0.3, rel=0.05)


def test_mla_fit_needs_an_mla_model():
    from perfmodel.calibrate import fit_mla
    from perfmodel.catalog import load_model
    from perfmodel.kernels import GemmKernel

    gemm = GemmKernel(peak=1979e12, bandwidth=3.35e12, compute_fraction=0.7, memory_fraction=0.8, units=132)
    with pytest.raises(SpecError, match="latent"):
        fit_mla(load_model("llama-3.1-8b"), [1.0] * 20, [64.0] * 20, [32.0] * 20, 1.0, [1e-4] * 20, gemm, 1e15,
                3e12, 132, True)


# aiconfigurator-core 0.12.0 (Apache-2.0), data/h100_sxm/mla/sglang/0.5.10/wideep_generation_mla_perf.parquet,
# fa3 rows, DeepSeek-V3, fp8 KV: (batch, isl, query heads per rank, latency ms) of the MLA module.
H100_MLA_DECODE = [(1, 1024, 128, 0.114), (16, 4096, 8, 0.071), (128, 1024, 8, 0.101), (256, 1024, 128, 0.3296)]


@pytest.mark.parametrize("batch, isl, heads, ms", H100_MLA_DECODE)
def test_shipped_h100_mla_fit_reproduces_measured_modules(batch, isl, heads, ms):
    """The shipped fit as fitted (no in-framework factor), against rows of its table: within 30%
    (its worst region, many sequences over long contexts at 128 heads, runs up to +39%)."""
    from perfmodel.calibrate import mla_module_parts, projection_seconds
    from perfmodel.roofline import core_seconds
    from perfmodel.machine import attention_kernels, gemm_kernel

    db = load_database()
    acc = db.accelerator("h100-sxm")
    cal = db.calibration("h100-sxm")
    core_kernel = attention_kernels(acc, cal, 1.0)[2]["decode"]
    gemm = gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0).fused()
    gemms, core = mla_module_parts(_deepseek(), float(batch), float(isl), float(heads), 1.0, True)
    module = projection_seconds(gemms, gemm) + core_seconds(core_kernel, core)
    assert float(module) == pytest.approx(ms * 1e-3, rel=0.3)


def test_mla_decode_pads_query_heads_to_a_block_without_counting_the_padding_as_flops():
    from perfmodel.layout import Layout
    from perfmodel.roofline import layer_ops

    spec = _deepseek()
    cores = [next(o for o in layer_ops(spec, 64.0, 2048.0, Layout(tp=tp), sp=True, decode=True)
                  if o.name == "attention core") for tp in (1, 8)]
    assert float(cores[0].flops) == pytest.approx(8 * float(cores[1].flops))     # 128 vs 16 heads per rank
    assert float(cores[0].attention.padding) == 1.0 and float(cores[1].attention.padding) == 8.0
    assert float(cores[0].attention.tiles) == float(cores[1].attention.tiles) == 64


def test_mla_decode_uses_its_own_fit_and_gqa_decode_never_does():
    db = load_database()
    m = build_machine(db, "dgx-h100")
    latent = m.attention_kernel("bf16", decode=True, latent=True)
    gqa = m.attention_kernel("bf16", decode=True)
    assert latent.latent and not gqa.latent
    op = _gqa(64.0, 1.0, 4096.0, True)
    rates = {"attention": 400e12, "gemm": 400e12, "vector": 1e12}
    # A GQA core is never timed by the MLA fit: with it, the core is the roofline.
    assert float(ops_time([op], rates, 3.35e12, attention=latent).total) == pytest.approx(
        max(float(op.flops) / 400e12, float(op.bytes) / 3.35e12))
