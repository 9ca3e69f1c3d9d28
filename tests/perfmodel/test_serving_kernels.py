"""Serving runs its kernels at the serving fits' own rates, and its decode GEMMs agree with the
measured TensorRT-LLM tables within each fit's stated held-out error."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from perfmodel.catalog import load_model
from perfmodel.hardware_db import load_database
from perfmodel.machine import build_machine
from perfmodel.plan import QuantScheme
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

DECODE_SAMPLE = Path(__file__).parents[1] / "data" / "gemm_decode_sample.csv"
SYSTEMS = {"h100-sxm": "dgx-h100", "h200": "hgx-h200"}
# The serving scheme of each measured recipe: (QuantScheme, block-scaled checkpoint, input bytes).
RECIPES = {"bfloat16": (QuantScheme("bf16", "a16", "bf16", "bf16"), False, 2.0),
           "fp8": (QuantScheme("fp8", "a8", "bf16", "bf16"), False, 1.0),
           "fp8_block": (QuantScheme("fp8", "a8", "bf16", "bf16"), True, 1.0)}


@pytest.fixture(scope="module")
def db():
    return load_database()


def _rows():
    with DECODE_SAMPLE.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _stated_error(db, device: str, recipe: str) -> float:
    cal = db.calibration(device)
    fit = cal.block_scaled["fp8"] if recipe == "fp8_block" else cal.gemm["bf16" if recipe == "bfloat16" else "fp8"]
    return fit.held_out_mape


@pytest.mark.parametrize("device", sorted(SYSTEMS))
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_decode_gemms_agree_with_the_measured_tables_within_the_stated_error(db, device, recipe):
    """100 sampled decode-sized rows (M <= 64, N and K 1,024-32,768) per device and recipe: the
    GEMM serving runs (per-tensor fp8 with its activation quantization, block-scaled fp8 on its
    own fit) is within the fit's held-out MAPE, and neither side of the table on the whole."""
    rows = [r for r in _rows() if r["device"] == device and r["dtype"] == recipe]
    assert len(rows) == 100
    m, n, k, seconds = (np.array([float(r[c]) for r in rows]) for c in ("m", "n", "k", "seconds"))
    quant, block, width = RECIPES[recipe]
    kernel = build_machine(db, SYSTEMS[device]).for_serving().serving_kernel(quant, block=block)
    ratio = kernel.time(m, n, k, width, width, 2.0) / seconds
    assert np.mean(np.abs(ratio - 1.0)) <= _stated_error(db, device, recipe)
    assert 0.9 < np.median(ratio) < 1.1


def test_serving_kernels_run_at_the_fits_own_rates_and_training_keeps_the_framework_factor(db):
    """The training framework factor (framework-gemm-efficiency, fitted on Megatron training steps)
    scales training's GEMMs and attention only; serving's are the fits' own."""
    machine = build_machine(db, "dgx-h100")
    served = machine.for_serving()
    factor = db.constant("framework-gemm-efficiency")
    fit = db.calibration("h100-sxm")
    assert factor < 1.0
    assert float(served.gemm_kernel("bf16").compute_fraction) == pytest.approx(fit.gemm["bf16"].compute_fraction)
    assert float(machine.gemm_kernel("bf16").compute_fraction) == pytest.approx(
        fit.gemm["bf16"].compute_fraction * factor)
    assert served.attention_kernel("bf16").compute_fraction == pytest.approx(
        fit.attention.prefill["bf16"].compute_fraction)
    assert served.flops("bf16") == pytest.approx(machine.flops("bf16") / factor)
    assert served.for_serving() is served                      # idempotent
    # A device without kernel fits: its large-GEMM fraction, without the training factor.
    mi300x = build_machine(db, "mi300x-8x")
    assert mi300x.for_serving().flops("bf16") == pytest.approx(mi300x.flops("bf16") / factor)


def test_a_serving_estimate_does_not_depend_on_the_training_factor(db):
    """Changing framework-gemm-efficiency leaves every serving time unchanged."""
    from dataclasses import replace

    spec = load_model("llama-3.1-8b")
    work = ServeWorkload(input_len=2048, output_len=256)
    plan = ServePlan(tp=1, batch=16, weight_precision="fp8", activation_precision="a8")
    constant = db.constants["framework-gemm-efficiency"]
    halved = replace(db, constants={**db.constants, "framework-gemm-efficiency": constant.model_copy(
        update={"value": constant.value / 2})})
    one, two = (estimate_serving(spec, build_machine(d, "dgx-h100", 8), plan, work) for d in (db, halved))
    assert float(one.ttft_s) == float(two.ttft_s) and float(one.tpot_s) == float(two.tpot_s)


def test_fp8_checkpoints_with_weight_blocks_run_the_block_scaled_fit(db):
    """DeepSeek-V3's fp8 checkpoint (128 x 128 weight blocks) runs the block-scaled GEMM fit; a
    model quantized per tensor runs the per-tensor fit with its activation casts; a device
    without a block fit keeps the per-tensor kernel without its casts."""
    served = build_machine(db, "dgx-h100").for_serving()
    fp8 = QuantScheme("fp8", "a8", "bf16", "bf16")
    block, per_tensor = served.serving_kernel(fp8, block=True), served.serving_kernel(fp8)
    assert block is served.block_kernels["fp8"]
    assert float(per_tensor.cast) == 1.0 and per_tensor.launch_s == served.gemm_kernel("fp8").launch_s
    without = build_machine(db, "dgx-h100").for_serving()
    from dataclasses import replace
    without = replace(without, block_kernels={})
    fused = without.serving_kernel(fp8, block=True)
    assert float(fused.cast) == 0.0 and fused.launch_s < per_tensor.launch_s
