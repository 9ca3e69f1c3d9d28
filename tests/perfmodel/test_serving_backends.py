"""Serving GEMMs per engine (issue 29, item 4): each engine's fits on its own measured GEMM table
(calibration.yaml ``serving_backends``), chosen by --framework; TensorRT-LLM's by default."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from perfmodel.catalog import load_model
from perfmodel.cli.app import main
from perfmodel.calibration_engines import HOST_BOUND_FLOOR, kernel_timed
from perfmodel.hardware_db.timings import fastest_kernels
from perfmodel.hardware_db import load_database
from perfmodel.machine import build_machine
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

SGLANG_SAMPLE = Path(__file__).parents[1] / "data" / "gemm_h100_sglang_sample.csv"
FP8 = dict(tp=8, batch=8, weight_precision="fp8", activation_precision="a8", kv_precision="fp8")


def _serve(args, capsys) -> dict:
    assert main(["estimate", "serve", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_serving_is_tensorrt_llm_as_before(db, capsys):
    """Without --framework the estimate is byte for byte the one with --framework trtllm, and its
    numbers those of a machine that knows no other engine's fits (the behaviour before them)."""
    args = ["--model", "llama-3.1-70b", "--system", "dgx-h100", "--weight-precision", "fp8",
            "--activation-precision", "a8", "--kv-precision", "fp8"]
    assert main(["estimate", "serve", *args, "--json"]) == 0
    default = capsys.readouterr().out
    assert main(["estimate", "serve", *args, "--framework", "trtllm", "--json"]) == 0
    assert capsys.readouterr().out == default
    spec, machine = load_model("llama-3.1-70b"), build_machine(db, "dgx-h100")
    work = ServeWorkload(1024, 256)
    before = estimate_serving(spec, replace(machine, engine_kernels=None), ServePlan(**FP8), work)
    now = estimate_serving(spec, machine, ServePlan(**FP8, backend="trtllm"), work)
    assert (float(now.ttft_s), float(now.tpot_s)) == (float(before.ttft_s), float(before.tpot_s))
    assert json.loads(default)["result"]["constants_from"]["gemm_tables"] == "TensorRT-LLM kernels"


def test_sglang_fp8_gemms_run_faster_at_decode_batches_as_its_table_measured(db, capsys):
    """SGLang's fp8 rows (one fused per-token quantization) take 0.62x TensorRT-LLM's (amax and
    quantize kernels) at M <= 64 on H100 (aiconfigurator 0.12.0 tables): decode is faster."""
    args = ["--model", "llama-3.1-70b", "--system", "dgx-h100", "--weight-precision", "fp8",
            "--activation-precision", "a8", "--batch", "8"]
    trtllm = _serve(args, capsys)["result"]
    sglang = _serve([*args, "--framework", "sglang"], capsys)["result"]
    assert sglang["tpot_s"] < trtllm["tpot_s"]
    assert sglang["constants_from"]["gemm_tables"] == "SGLang kernels"
    machine = build_machine(db, "dgx-h100")
    shapes = [np.array(x, dtype=float) for x in zip(*itertools.product((1, 8, 32, 64), (1024, 4096, 8192, 28672),
                                                                        (1024, 4096, 8192)))]
    ratio = machine.for_serving("sglang").gemm_kernel("fp8").time(*shapes, 1.0, 1.0, 2.0) \
        / machine.for_serving().gemm_kernel("fp8").time(*shapes, 1.0, 1.0, 2.0)
    assert np.median(ratio) < 0.8 and np.all(ratio < 1.01)


def test_dynamo_prices_with_vllm_and_an_engine_without_fits_falls_back(db, capsys):
    args = ["--model", "llama-3.1-8b", "--system", "dgx-h100", "--tp", "1", "--weight-precision", "fp8",
            "--activation-precision", "a8"]
    vllm = _serve([*args, "--framework", "vllm"], capsys)["result"]
    assert _serve([*args, "--framework", "dynamo"], capsys)["result"] == vllm
    assert vllm["constants_from"]["gemm_tables"] == "vLLM kernels"
    machine = build_machine(db, "dgx-h100")
    # vLLM's block-scaled rows time the host's eager path: its fp8_block GEMMs keep TensorRT-LLM's fit.
    assert machine.for_serving("vllm").block_kernels == machine.for_serving().block_kernels
    assert machine.for_serving("sglang").block_kernels != machine.for_serving().block_kernels
    only = replace(machine, engine_kernels={"trtllm": machine.engine_kernels["trtllm"]})
    assert only.for_serving("sglang").gemm_backend == "trtllm"
    from perfmodel.report import gemm_tables

    assert gemm_tables(only, "sglang") == "TensorRT-LLM kernels: the device has no SGLang GEMM fits"
    served = machine.for_serving("sglang")
    assert served.for_serving("sglang") is served and served.for_serving("vllm").gemm_backend == "vllm"
    assert served.for_serving("trtllm").gemm_kernels == machine.for_serving().gemm_kernels


def test_an_engine_fit_reproduces_its_table_and_is_written_beside_the_default(db, tmp_path, capsys):
    """A fit on 300 rows per precision of SGLang's H100 table predicts its held-out half within the
    held-out error recorded for the fit on the whole table (plus 5 points for the small sample);
    it lands in serving_backends, and the entry's TensorRT-LLM gemm block stays as it was."""
    assert main(["calibrate", "gemm", "--device", "h100-sxm", "--backend", "sglang", "--table", str(SGLANG_SAMPLE),
                 "--out", str(tmp_path), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]["sglang"]
    recorded = db.calibration("h100-sxm").serving_backends["sglang"]
    for precision, block in (("bf16", "gemm"), ("fp8", "gemm"), ("fp8", "block_scaled")):
        assert fit[block][precision]["held_out_mape"] <= getattr(recorded, block)[precision].held_out_mape + 0.05
    assert fit["gemm"]["fp8"]["cast"] and fit["gemm"]["fp8"]["cast_launch_us"] == 0.0   # one fused quantization
    written = load_database([tmp_path]).calibration("h100-sxm")
    assert written.gemm == db.calibration("h100-sxm").gemm
    assert set(written.serving_backends) == {"sglang", "vllm"}                        # vLLM's fit stays
    assert written.serving_backends["vllm"] == db.calibration("h100-sxm").serving_backends["vllm"]
    text = (tmp_path / "calibration-h100-sxm.yaml").read_text()
    assert text.count("gemm sglang: fitted by perfmodel calibrate gemm --backend sglang") == 1


def test_the_fastest_kernel_per_shape_where_several_were_measured():
    rows = [(1, 8, 8, "fp8_block", 3e-6), (1, 8, 8, "fp8_block", 2e-6), (2, 8, 8, "fp8_block", 5e-6),
            (1, 8, 8, "bf16", 4e-6), (1, 8, 8, "bf16", 1e-6)]
    kept = fastest_kernels(rows, ["cutlass", "deepgemm", "cutlass", "torch", "torch"])
    assert sorted(kept) == sorted([(1, 8, 8, "fp8_block", 2e-6), (2, 8, 8, "fp8_block", 5e-6),
                                   (1, 8, 8, "bf16", 4e-6), (1, 8, 8, "bf16", 1e-6)])   # one kernel: every row


def test_rows_that_time_the_host_are_left_out():
    cols = lambda least: ([1.0], [1.0], [1.0], [least, 2 * least], True)  # noqa: E731
    timings = {"bf16": cols(2.5e-6), "fp8": cols(4.6e-6), "fp8_block": cols(2.5e-6 * HOST_BOUND_FLOOR * 1.01)}
    kept, left = kernel_timed(timings)
    assert set(kept) == {"bf16", "fp8"} and set(left) == {"fp8_block"}
    assert left["fp8_block"][1] == pytest.approx(HOST_BOUND_FLOOR * 1.01)


def test_plan_serve_prices_with_the_frameworks_engine(capsys):
    """plan serve --framework vllm prices every deployment with vLLM's GEMM fits, and the reproduce
    line of the recommended deployment carries --framework vllm."""
    argv = ["plan", "serve", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--max-devices", "8", "--rate", "5",
            "--weight-precisions", "fp8", "--chunk-tokens", "2048"]
    assert main([*argv, "--framework", "vllm"]) == 0
    assert "--framework vllm" in " ".join(capsys.readouterr().out.split())
    tpot = {}
    for framework in ("trtllm", "vllm"):
        assert main([*argv, "--framework", framework, "--json"]) == 0
        tpot[framework] = json.loads(capsys.readouterr().out)["best"]["pools"][0]["tpot_p50_s"]
    assert tpot["vllm"] < tpot["trtllm"]     # vLLM's fp8 rows: 0.63x TensorRT-LLM's at M <= 64 on H100


@pytest.mark.parametrize("value", ["tgi", "VLLM"])
def test_an_unknown_framework_is_a_one_line_error(value, capsys):
    assert main(["estimate", "serve", "--framework", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--framework" in err
