"""The routed experts' grouped GEMMs fitted on measured MoE layers (issue 29, item 2): the fit and
its held-out error, the checked-in fits against measured rows, the recipe a plan takes, and the
fallback of devices without a fit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from perfmodel.calibrate import balanced_rank_rows, fit_grouped_gemm, moe_layer_parts, shape_split
from perfmodel.catalog import load_model
from perfmodel.hardware_db.timings import read_moe_layer_timings
from perfmodel.hardware_db import load_database
from perfmodel.hardware_db.errors import SpecError
from perfmodel.kernels import GemmKernel
from perfmodel.layout import Layout
from perfmodel.machine import build_machine
from perfmodel.roofline import layer_ops, ops_time
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

SAMPLE = Path(__file__).parents[1] / "data" / "moe_h100_sample.csv"
H100_PEAK = {"bf16": 989.4e12, "fp8": 1978.9e12, "fp8_block": 1978.9e12}


@pytest.fixture(scope="module")
def db():
    return load_database()


@pytest.fixture(scope="module")
def h100(db):
    return build_machine(db, "dgx-h100")


def measured_error(machine, recipe: str) -> np.ndarray:
    """|predicted / measured - 1| of the sample's rows of ``recipe`` on the machine's checked-in fit."""
    cols, x, w, _ = read_moe_layer_timings(SAMPLE)[recipe]
    *shape, gated, seconds = (np.asarray(c, dtype=float) for c in cols)
    (up, down), vector = moe_layer_parts(*shape, gated > 0, x, machine.hbm_bytes_per_s)
    kernel = machine.grouped_kernels[recipe]
    predicted = sum(kernel.time(g.m, g.n, g.k, x, w, 2.0, g.groups) for g in (up, down)) + vector
    return np.abs(predicted / seconds - 1.0)


@pytest.mark.parametrize("recipe", ["bf16", "fp8", "fp8_block"])
def test_the_checked_in_h100_fit_reproduces_measured_moe_layers_within_its_stated_error(db, h100, recipe):
    stated = db.calibration("h100-sxm").grouped_gemm[recipe]
    error = measured_error(h100, recipe)
    # The sample mixes rows the fit saw with rows it held out: its error is about the held-out one.
    assert error.mean() <= 1.1 * stated.held_out_mape, (recipe, error.mean(), stated.held_out_mape)
    assert np.quantile(error, 0.9) <= 1.25 * stated.held_out_p90
    assert stated.held_out_mape <= 0.25 and "TensorRT-LLM" in stated.backend


def test_the_dense_gemm_fit_is_what_the_grouped_fit_replaced(h100):
    """On the same rows the dense fp8 GEMM fit is far off (the issue's 1.57 ms against 2.50 ms):
    the test fails if the grouped fit were absent or no better."""
    cols, x, w, _ = read_moe_layer_timings(SAMPLE)["fp8_block"]
    *shape, gated, seconds = (np.asarray(c, dtype=float) for c in cols)
    (up, down), vector = moe_layer_parts(*shape, gated > 0, x, h100.hbm_bytes_per_s)
    dense = h100.gemm_kernel("fp8").fused()
    old = sum(dense.time(g.m, g.n, g.k, x, w, 2.0, g.groups) for g in (up, down)) + vector
    assert np.median(old / seconds) < 0.8
    assert np.abs(old / seconds - 1).mean() > 2 * measured_error(h100, "fp8_block").mean()


def test_fit_recovers_a_known_grouped_kernel_from_synthetic_layers():
    rng = np.random.default_rng(0)
    n = 600
    shapes = np.array([(4096, 14336, 8, 2), (7168, 2048, 256, 8), (2048, 768, 128, 8), (5120, 1536, 160, 6)])
    h, f, e, k = shapes[rng.integers(0, len(shapes), n)].T.astype(float)
    tokens = 2.0 ** rng.integers(0, 15, n)
    ep = 2.0 ** rng.integers(0, 4, n)
    etp = np.ones(n)
    truth = GemmKernel(peak=1978.9e12, bandwidth=3.35e12, compute_fraction=0.6, memory_fraction=0.8, launch_s=12e-6,
                       sharpness=2.5, tile_overhead=8.0, units=132, cast=2.0, group_launch_s=0.2e-6)
    (up, down), vector = moe_layer_parts(tokens, ep, etp, e, k, h, f, True, 1.0, 3.0e12)
    seconds = sum(truth.time(g.m, g.n, g.k, 1.0, 1.0, 2.0, g.groups) for g in (up, down)) + vector
    fit = fit_grouped_gemm(tokens, ep, etp, e, k, h, f, np.ones(n), seconds, 1978.9e12, 3.35e12, 3.0e12, 132,
                           1.0, 1.0, "synthetic")
    assert fit.held_out_mape < 0.02
    assert fit.kernel.launch_s == pytest.approx(12e-6, rel=0.1)
    assert fit.kernel.cast == pytest.approx(2.0, rel=0.15)
    assert fit.as_yaml()["backend"] == "synthetic"


def test_the_measured_rank_gets_the_spread_picks_of_the_balanced_routing():
    # DeepSeek-V3 (E 256, top 8) at EP 8: rank 0 holds experts 0-31; token t picks (t + 32 i) mod 256
    # from 32 tokens on, floor(t 32 / T + 32 i) below: every pick of rank 0 a distinct expert.
    rows, hit = balanced_rank_rows([1, 16, 32, 64, 16384], 256, 8, 8)
    assert rows.tolist() == [1, 16, 32, 64, 16384] and hit.tolist() == [1, 16, 32, 32, 32]
    # More experts than uniform random routing hits (20.4 of 32 at 32 tokens).
    assert hit[2] > 32 * (1 - (1 - 8 / 256) ** 32) + 10
    # One rank holds them all: every pick, and min(E, T k) distinct experts.
    tokens = np.array([1, 3, 5, 31, 32, 100])
    rows, hit = balanced_rank_rows(tokens, 256, 8, 1)
    assert rows.tolist() == (tokens * 8).tolist() and hit.tolist() == np.minimum(256, tokens * 8).tolist()
    # Mixtral (E 8, top 2) at EP 2: one token picks experts 0 and 4, one on each rank.
    assert [x.tolist() for x in balanced_rank_rows(1, 8, 2, 2)] == [1.0, 1.0]


def test_the_held_out_shapes_are_never_fitted():
    ids = np.repeat(np.arange(6), 10)
    train = shape_split(ids, 0, 0.5)
    assert len(set(ids[train]) & set(ids[~train])) == 0
    assert len(set(ids[~train])) == 3
    assert shape_split(np.array([0, 0, 1, 1]), 0, 0.9).sum() == 2      # at least one shape each way


def test_moe_rows_need_two_shapes_and_sane_values():
    one = dict(tokens=np.full(30, 64.0), ep=1, etp=1, num_experts=8, top_k=2, hidden=4096, expert_hidden=14336,
               gated=1, seconds=np.full(30, 1e-4), peak=1e15, bandwidth=3e12, vector_bytes_per_s=3e12, units=132,
               in_bytes=2.0, weight_bytes=2.0)
    with pytest.raises(SpecError, match="two MoE shapes"):
        fit_grouped_gemm(**one)
    with pytest.raises(SpecError, match="at least 20 rows"):
        fit_grouped_gemm(**{**one, "tokens": np.full(3, 64.0), "seconds": np.full(3, 1e-4)})
    with pytest.raises(SpecError, match="top_k at most"):
        fit_grouped_gemm(**{**one, "top_k": 9})


def test_a_plan_takes_its_recipe_and_devices_without_a_fit_keep_the_gemm_kernel(db, h100):
    assert h100.grouped_kernel("fp8", block=True) is h100.grouped_kernels["fp8_block"]
    assert h100.grouped_kernel("fp8") is h100.grouped_kernels["fp8"]
    assert h100.grouped_kernel("bf16") is h100.grouped_kernels["bf16"]
    assert h100.grouped_kernel("bf16", weight="int8") is None               # int8 weight-only experts: unmeasured
    assert h100.grouped_kernel(np.array([0, 1])) is None                    # mixed precisions: the GEMM kernel
    trained = h100.grouped_kernel("bf16", in_framework=True)
    assert trained.compute_fraction == pytest.approx(h100.grouped_kernels["bf16"].compute_fraction
                                                     * h100.constants.framework_gemm_efficiency)
    assert build_machine(db, "hgx-h800").grouped_kernels.keys() == h100.grouped_kernels.keys()   # same silicon
    for system in ("mi300x-8x", "dgx-a100"):
        assert build_machine(db, system).grouped_kernel("bf16") is None


def test_routed_experts_run_on_the_grouped_kernel_and_the_rest_on_the_gemm_kernel(h100):
    spec = load_model("deepseek-v3")
    ops = layer_ops(spec, 4096.0, 1024.0, Layout(tp=1, ep=8, etp=1), sp=True, weight_bytes=1.0, act_bytes=1.0,
                    moe_layer=True)
    rates = {"gemm": 1e15, "attention": 1e15, "vector": np.inf}
    dense, grouped = h100.gemm_kernel("fp8").fused(), h100.grouped_kernels["fp8_block"]
    without = ops_time(ops, rates, h100.hbm_bytes_per_s, dense, with_backward=False)
    fitted = ops_time(ops, rates, h100.hbm_bytes_per_s, dense, with_backward=False, grouped=grouped)
    experts = next(op for op in ops if op.name == "experts")
    routed = [g for g in experts.gemms if g.routed]
    shared = [g for g in experts.gemms if not g.routed]
    assert len(routed) == 2 and len(shared) == 2
    expect = sum(grouped.time(g.m, g.n, g.k, 1.0, 1.0, 1.0, g.groups) for g in routed) \
        + sum(dense.time(g.m, g.n, g.k, 1.0, 1.0, 1.0, g.groups) for g in shared)
    assert float(fitted.seconds["experts"]) == pytest.approx(float(expect), rel=1e-9)
    assert all(float(fitted.seconds[k]) == float(without.seconds[k]) for k in without.seconds if k != "experts")
    # The same kernel as the grouped one changes nothing: the routing of GEMMs to kernels is exact.
    same = ops_time(ops, rates, h100.hbm_bytes_per_s, dense, with_backward=True, grouped=dense)
    before = ops_time(ops, rates, h100.hbm_bytes_per_s, dense, with_backward=True)
    assert float(same.total) == pytest.approx(float(before.total), rel=1e-12)
    assert float(same.backward_total) == pytest.approx(float(before.backward_total), rel=1e-12)


def test_serving_prices_deepseek_experts_block_scaled_and_a_device_without_a_fit_as_before(db, h100):
    spec = load_model("deepseek-v3")
    plan = ServePlan(tp=1, ep=16, dp_attention=16, batch=256, weight_precision="fp8", activation_precision="a8",
                     kv_precision="fp8")
    work = ServeWorkload(input_len=2048, output_len=512)
    machine = build_machine(db, "dgx-h100", 16)
    fitted = estimate_serving(spec, machine, plan, work)
    unfitted = estimate_serving(spec, replace(machine, grouped_kernels={}), plan, work)
    # Block-scaled fp8 experts measured slower than the dense per-tensor fit: a longer prefill.
    assert float(fitted.ttft_s) > 1.1 * float(unfitted.ttft_s)
    block = replace(machine, grouped_kernels={"fp8": machine.grouped_kernels["fp8_block"]})
    assert float(estimate_serving(spec, block, plan, work).ttft_s) == pytest.approx(float(fitted.ttft_s))


def test_calibrate_moe_cli_writes_a_loadable_entry_that_keeps_the_other_fits(tmp_path, capsys):
    from perfmodel.cli.app import main

    assert main(["calibrate", "moe", "--device", "h100-sxm", "--table", str(SAMPLE), "--out", str(tmp_path),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["fit"]) == {"bf16", "fp8", "fp8_block"}
    assert all(v["held_out_mape"] <= 0.25 for v in out["fit"].values())
    text = (tmp_path / "calibration-h100-sxm.yaml").read_text()
    assert "grouped_gemm:" in text and "gemm:" in text and "dispatch:" in text
    machine = build_machine(load_database([tmp_path]), "dgx-h100")
    assert machine.grouped_kernels["fp8"].launch_s == pytest.approx(out["fit"]["fp8"]["launch_us"] * 1e-6)
    assert machine.gemm_kernel("bf16").source == "fitted"


def test_an_moe_estimate_says_where_its_expert_gemm_constants_came_from(db, h100):
    from perfmodel.report import constants_from

    spec = load_model("mixtral-8x7b")
    assert constants_from(h100, spec, serving=True)["expert_gemm"] == "fitted (measured MoE layers)"
    assert constants_from(build_machine(db, "mi300x-8x"), spec, serving=True)["expert_gemm"] == "as the GEMMs"
    assert "expert_gemm" not in constants_from(h100, load_model("llama-3.1-8b"), serving=True)
