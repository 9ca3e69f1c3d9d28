"""Attention and routed-expert kernels per serving engine (issue 29, item 4): each engine's
attention and grouped-GEMM fits on its own measured tables (calibration.yaml
``serving_backends.<engine>.attention`` / ``grouped_gemm``), chosen by --framework; TensorRT-LLM's
by default and wherever an engine did not measure a family, precision or phase."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from perfmodel.calibrate import moe_layer_parts
from perfmodel.catalog import load_model
from perfmodel.cli.app import main
from perfmodel.hardware_db.timings import read_moe_layer_timings
from perfmodel.hardware_db import load_database
from perfmodel.machine import build_machine
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

DATA = Path(__file__).parents[1] / "data"
MOE_SAMPLE = DATA / "moe_h100_sglang_sample.csv"
ATTENTION_SAMPLE = DATA / "attention_h100_sglang_sample.csv"
MIXTRAL = ["--model", "mixtral-8x7b", "--system", "dgx-h100", "--tp", "2", "--ep", "2", "--batch", "32"]


@pytest.fixture(scope="module")
def h100(db):
    return build_machine(db, "dgx-h100")


def _serve(args, capsys) -> dict:
    assert main(["estimate", "serve", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_moe_serving_is_byte_identical_to_trtllm_and_to_a_machine_without_engine_fits(h100, capsys):
    """An MoE estimate without --framework is byte for byte the --framework trtllm one, and its
    numbers those of a machine that knows no engine's fits (the behaviour before them)."""
    assert main(["estimate", "serve", *MIXTRAL, "--json"]) == 0
    default = capsys.readouterr().out
    assert main(["estimate", "serve", *MIXTRAL, "--framework", "trtllm", "--json"]) == 0
    assert capsys.readouterr().out == default
    tables = json.loads(default)["result"]["constants_from"]["kernel_tables"]
    assert set(tables.values()) == {"TensorRT-LLM"}
    spec, work = load_model("mixtral-8x7b"), ServeWorkload(2048, 512)
    plan = ServePlan(tp=2, ep=2, batch=32)
    before = estimate_serving(spec, replace(h100, engine_kernels=None), plan, work)
    now = estimate_serving(spec, h100, replace(plan, backend="trtllm"), work)
    assert (float(now.ttft_s), float(now.tpot_s)) == (float(before.ttft_s), float(before.tpot_s))


def test_sglang_prices_mixtral_experts_slower_as_its_moe_table_measured(h100, capsys):
    """SGLang 0.5.14's Triton fused MoE on H100 takes 6.8x TensorRT-LLM's CUTLASS MoE at Mixtral's
    shape, moe tp 2 x ep 2, from 4,096 tokens (median of the balanced rows both tables measured;
    1.35x at <= 128 tokens): with SGLang's grouped-GEMM fit the prompt batch takes longer, and
    the estimate names SGLang's tables for every family."""
    trtllm = _serve(MIXTRAL, capsys)["result"]
    sglang = _serve([*MIXTRAL, "--framework", "sglang"], capsys)["result"]
    assert sglang["ttft_s"] > 1.5 * trtllm["ttft_s"]
    assert sglang["tpot_s"] > trtllm["tpot_s"]
    assert sglang["constants_from"]["kernel_tables"] == {"gemm": "SGLang", "attention": "SGLang",
                                                         "grouped_gemm": "SGLang"}
    served, default = h100.for_serving("sglang"), h100.for_serving()
    assert served.grouped_kernels["bf16"] != default.grouped_kernels["bf16"]
    assert served.kernel_backends == (("gemm", "sglang"), ("attention", "sglang"), ("grouped_gemm", "sglang"))


def _layer_seconds(kernel, tokens, ep, etp, shape, in_bytes, bandwidth):
    """One MoE layer's grouped GEMMs and vector work on ``kernel`` (as the fits price it)."""
    (up, down), vector = moe_layer_parts(tokens, ep, etp, *shape, True, in_bytes, bandwidth)
    return sum(kernel.time(g.m, g.n, g.k, in_bytes, in_bytes, 2.0, g.groups) for g in (up, down)) + vector


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_block_scaled_deepseek_experts_at_moe_tp_8_run_faster_as_measured(h100, backend):
    """At DeepSeek-V3's shape (hidden 7,168, expert width 2,048, 256 experts, top 8) with moe tp 8,
    SGLang's and vLLM's fp8_block MoE rows take 0.38-0.55x TensorRT-LLM's on H100 (aiconfigurator
    0.12.0, balanced rows, medians at <= 128 and >= 4,096 tokens): their fits price it faster."""
    tokens = np.array([16.0, 128.0, 4096.0, 16384.0])
    shape = (256, 8, 7168, 2048)
    bandwidth = h100.hbm_bytes_per_s
    engine = _layer_seconds(h100.for_serving(backend).grouped_kernels["fp8_block"], tokens, 1, 8, shape, 1.0, bandwidth)
    trtllm = _layer_seconds(h100.for_serving().grouped_kernels["fp8_block"], tokens, 1, 8, shape, 1.0, bandwidth)
    assert np.all(engine < trtllm)


def test_an_engines_attention_replaces_only_what_it_measured(h100):
    """vLLM 0.24.0 measured FA3 prefill in bf16 math only: its bf16 prefill and decode kernels are
    its own fits, fp8 prefill keeps TensorRT-LLM's; both engines' MLA cores are their own (SGLang's
    wide-EP modules less its own block-scaled GEMM fit, vLLM's own module tables)."""
    vllm, sglang, default = h100.for_serving("vllm"), h100.for_serving("sglang"), h100.for_serving()
    assert vllm.attention_kernel("bf16") != default.attention_kernel("bf16")
    assert vllm.attention_kernel("bf16", decode=True) != default.attention_kernel("bf16", decode=True)
    assert vllm.attention_kernel("fp8") == default.attention_kernel("fp8")
    assert sglang.mla_attention["decode"] != default.mla_attention["decode"]
    # vLLM's MLA modules carry its per-module overhead: a larger fixed cost than SGLang's FA3 module.
    assert vllm.mla_attention["decode"].launch_s > sglang.mla_attention["decode"].launch_s
    # Training never takes an engine's fits.
    assert h100.attention_kernels["bf16"].compute_fraction < default.attention_kernel("bf16").compute_fraction


def test_an_engine_moe_fit_on_a_sample_is_written_beside_the_others(db, tmp_path, capsys):
    """A fit on 200 rows per dtype of SGLang's H100 MoE table predicts its held-out shapes within the
    held-out error recorded for the fit on the whole table (plus 10 points for the small sample);
    it lands in serving_backends.sglang.grouped_gemm, and every other fit of the entry stays."""
    assert main(["calibrate", "moe", "--device", "h100-sxm", "--backend", "sglang", "--table", str(MOE_SAMPLE),
                 "--out", str(tmp_path), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]["sglang"]["grouped_gemm"]
    recorded = db.calibration("h100-sxm").serving_backends["sglang"].grouped_gemm
    assert set(fit) == {"bf16", "fp8_block"}
    for recipe in fit:
        assert fit[recipe]["held_out_mape"] <= recorded[recipe].held_out_mape + 0.10, recipe
    own, written = db.calibration("h100-sxm"), load_database([tmp_path]).calibration("h100-sxm")
    assert written.grouped_gemm == own.grouped_gemm
    assert written.serving_backends["sglang"].gemm == own.serving_backends["sglang"].gemm
    assert written.serving_backends["sglang"].attention == own.serving_backends["sglang"].attention
    assert written.serving_backends["vllm"] == own.serving_backends["vllm"]
    text = (tmp_path / "calibration-h100-sxm.yaml").read_text()
    assert text.count("grouped_gemm sglang: routed experts") == 1 and text.count("attention sglang:") == 2


def test_an_engine_attention_fit_on_a_sample_is_written_beside_the_others(db, tmp_path, capsys):
    """300 prefill and 300 decode rows of SGLang's FA3 H100 tables: held-out error within the
    recorded whole-table one plus 5 points; TensorRT-LLM's attention block stays as it was."""
    assert main(["calibrate", "attention", "--device", "h100-sxm", "--backend", "sglang", "--table",
                 str(ATTENTION_SAMPLE), "--out", str(tmp_path), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]["sglang"]["attention"]
    recorded = db.calibration("h100-sxm").serving_backends["sglang"].attention
    assert fit["prefill"]["bf16"]["held_out_mape"] <= recorded.prefill["bf16"].held_out_mape + 0.05
    assert fit["decode"]["bf16"]["held_out_mape"] <= recorded.decode["bf16"].held_out_mape + 0.05
    own, written = db.calibration("h100-sxm"), load_database([tmp_path]).calibration("h100-sxm")
    assert written.attention == own.attention
    assert written.serving_backends["sglang"].grouped_gemm == own.serving_backends["sglang"].grouped_gemm
    assert written.serving_backends["sglang"].attention.prefill["bf16"] != own.serving_backends["sglang"].attention.prefill["bf16"]


def test_an_engines_moe_rows_keep_the_fastest_kernel_and_fit_relu2_shapes_non_gated(tmp_path):
    header = "kernel_source,moe_dtype,distribution,num_tokens,hidden_size,inter_size,topk,num_experts,moe_tp_size," \
             "moe_ep_size,latency\n"
    rows = ["triton,bfloat16,balanced,16,4096,14336,2,8,1,1,0.30", "cutlass,bfloat16,balanced,16,4096,14336,2,8,1,1,0.20",
            "triton,bfloat16,balanced,16,2048,5120,22,512,1,1,0.40", "triton,bfloat16,power_law_1.2,16,4096,14336,2,8,1,1,0.1",
            "x_situ_as_silu,bfloat16,balanced,32,4096,14336,2,8,1,1,0.5"]
    path = tmp_path / "moe.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    cols, _, _, kernels = read_moe_layer_timings(path, lambda k: not k.endswith("situ_as_silu"),
                                                 frozenset({(2048, 5120, 512, 22)}))["bf16"]
    assert cols[-1] == [0.20e-3, 0.40e-3]                  # the faster of two kernels at one row; balanced only
    assert cols[-2] == [1.0, 0.0] and kernels == ["cutlass", "triton"]


@pytest.mark.parametrize("family", ["attention", "moe"])
def test_an_unknown_engine_is_a_one_line_error(family, capsys):
    assert main(["calibrate", family, "--device", "h100-sxm", "--backend", "tgi", "--table", str(MOE_SAMPLE)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend" in err


def test_vllm_mla_module_rows_take_the_cached_tokens_and_the_fastest_kernel(tmp_path):
    """vLLM's MLA module tables: decode rows over isl + step cached tokens, only an fp8 KV cache with
    block-scaled projections, the fastest kernel at each shape."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from perfmodel.hardware_db.timings import read_mla_module_timings

    rows = [("FLASHMLA", 4, 1, 1023, 16, "fp8", "fp8_block", 0.30), ("FLASH_ATTN_MLA", 4, 1, 1023, 16, "fp8", "fp8_block", 0.20),
            ("FLASHMLA", 4, 1, 1023, 16, "bfloat16", "fp8_block", 0.10), ("FLASHMLA", 4, 1, 1023, 16, "fp8", "bfloat16", 0.10),
            ("FLASHMLA", 8, 1, 2047, 16, "fp8", "fp8_block", 0.50)]
    names = ("kernel_source", "batch_size", "isl", "step", "num_heads", "kv_cache_dtype", "gemm_type", "latency")
    path = tmp_path / "mla_generation_module_perf.parquet"
    pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}), path)
    (batch, context, heads, kv_bytes, seconds), kernels = read_mla_module_timings(path, "generation")
    assert batch == [4.0, 8.0] and context == [1024.0, 2048.0] and heads == [16.0, 16.0]
    assert seconds == pytest.approx([0.20e-3, 0.50e-3]) and kv_bytes == [1.0, 1.0]
    assert kernels == "FLASHMLA/FLASH_ATTN_MLA"
