"""Shape-aware GEMM kernels: tiles and waves, the fit on measured GEMMs, and its use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.hardware_db.timings import read_gemm_timings
from perfmodel.hardware_db import load_database
from perfmodel.hardware_db.errors import SpecError
from perfmodel.calibrate import fit_gemm
from perfmodel.kernels import GemmKernel, distinct_rows
from perfmodel.machine import build_machine

SAMPLE = Path(__file__).parents[1] / "data" / "gemm_h100_sample.csv"
H100 = dict(peak=989.4e12, bandwidth=3.35e12, compute_fraction=0.8, memory_fraction=0.8, launch_s=3e-6,
            sharpness=3.0, tile_overhead=0.2, units=132)


def test_a_wave_that_spills_by_one_tile_costs_more_than_its_flops():
    k = GemmKernel(**H100)
    full = float(k.time(128 * 132, 256, 8192))        # 132 tiles of 128 x 256: one full wave
    spill = float(k.time(128 * 133, 256, 8192))       # one tile more: a second wave, or smaller tiles
    assert spill > 1.02 * full * 133 / 132             # dearer per FLOP (the library's best tile limits it)
    alone = GemmKernel(**{**H100, "tile_overhead": 1e9})   # with only the largest tile worth using...
    assert float(alone.time(128 * 133, 256, 8192)) > 1.5 * float(alone.time(128 * 132, 256, 8192))  # ...a 2nd wave
    assert float(k.time(1, 4096, 4096)) > 3e-6        # never below the launch


def test_time_never_falls_as_a_dimension_grows():
    k = GemmKernel(**H100)
    for axis in range(3):
        shape = [np.full(400, 1024.0) for _ in range(3)]
        shape[axis] = np.arange(1.0, 401.0) * 64
        t = k.time(*shape)
        assert np.all(np.diff(t) >= -1e-15)


def test_the_datasheet_kernel_is_the_plain_roofline():
    k = GemmKernel(peak=1e15, bandwidth=2e12, compute_fraction=0.5, memory_fraction=0.5)
    m, n, kk = 4096.0, 8192.0, 8192.0
    compute, memory = 2 * m * n * kk / 5e14, (m * kk + kk * n + m * n) * 2 / 1e12
    assert float(k.time(m, n, kk)) == pytest.approx(max(compute, memory))


def test_fit_recovers_known_parameters_from_synthetic_timings():
    rng = np.random.default_rng(0)
    m, n, k = (2.0 ** rng.integers(0, 15, 3000), 2.0 ** rng.integers(5, 15, 3000), 2.0 ** rng.integers(5, 15, 3000))
    truth = GemmKernel(**H100)
    fit = fit_gemm(m, n, k, truth.time(m, n, k), H100["peak"], H100["bandwidth"], 132, 2.0)
    assert fit.held_out_mape < 0.01
    assert fit.kernel.compute_fraction == pytest.approx(0.8, rel=0.02)
    assert fit.kernel.launch_s == pytest.approx(3e-6, rel=0.05)


def test_fit_on_half_of_measured_h100_gemms_predicts_the_other_half():
    timings = read_gemm_timings(SAMPLE)
    assert set(timings) == {"bf16", "fp8"}
    for precision, (m, n, k, seconds, cast) in timings.items():
        peak = 989.4e12 if precision == "bf16" else 1978.9e12
        fit = fit_gemm(m, n, k, seconds, peak, 3.35e12, 132, 2.0 if precision == "bf16" else 1.0, cast)
        assert fit.held_out_mape <= 0.12, (precision, fit.held_out_mape)     # issue 11: GEMM <= 10% on the full table
        assert 0.5 < fit.kernel.compute_fraction <= 1.0
        assert 1e-6 < fit.kernel.launch_s < 20e-6


def test_gemm_rows_need_known_dtypes(tmp_path):
    bad = tmp_path / "g.csv"
    bad.write_text("m,n,k,dtype,seconds\n1,2,3,int3,1e-6\n")
    with pytest.raises(SpecError, match="dtype needs one of"):
        read_gemm_timings(bad)
    with pytest.raises(SpecError, match="at least 20 rows"):
        fit_gemm([1.0], [2.0], [3.0], [1e-6], 1e15, 1e12, 132, 2.0)


def test_calibrate_gemm_cli_writes_a_loadable_entry(tmp_path, capsys):
    from perfmodel.cli.app import main

    assert main(["calibrate", "gemm", "--device", "h100-sxm", "--table", str(SAMPLE), "--out", str(tmp_path),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["fit"]) == {"bf16", "fp8"}
    text = (tmp_path / "calibration-h100-sxm.yaml").read_text()
    assert "gemm:" in text and "collectives:" in text          # the collective fit it already had stays
    assert "hop_us: 0.774" in text                              # in the file's units, not seconds
    machine = build_machine(load_database([tmp_path]), "dgx-h100")
    assert machine.gemm_kernel("bf16").source == "fitted"
    assert float(machine.gemm_kernel("bf16").compute_fraction) == pytest.approx(
        out["fit"]["bf16"]["compute_fraction"] * machine.constants.framework_gemm_efficiency, rel=1e-3)


def test_fitted_devices_say_so_and_others_do_not():
    db = load_database()
    assert build_machine(db, "dgx-h100").gemm_kernel("bf16").source == "fitted"
    assert build_machine(db, "dgx-h100").gemm_kernel("fp16").source == "fitted"      # nearest: bf16's fit
    assert build_machine(db, "mi300x-8x").gemm_kernel("bf16").source == "datasheet"
    assert build_machine(db, "cloudmatrix384", 4).gemm_kernel("bf16").source == "default"


def test_distinct_rows_are_exact():
    rng = np.random.default_rng(1)
    a, b = rng.choice([1.0, 2.0, 3.0], 10_000), rng.choice([5.0, 7.0], 10_000)
    first, inverse = distinct_rows(a, b)
    assert len(first) == 6
    assert np.array_equal(a[first][inverse], a) and np.array_equal(b[first][inverse], b)
    assert distinct_rows(a[:10], b[:10]) is None          # small inputs are evaluated directly


def test_distinct_rows_keep_apart_rows_whose_columns_trade_off():
    """Rows whose columns trade off exactly (a + b equal, a x b equal) stay distinct groups."""
    a = np.tile(np.arange(1.0, 65.0), 32)
    b = 65.0 - a
    first, inverse = distinct_rows(a, b, a * b)
    assert len(first) == 64 and np.array_equal(a[first][inverse], a) and np.array_equal(b[first][inverse], b)


@pytest.mark.parametrize("run", [1, 3, 40])
@pytest.mark.parametrize("fast_columns", [0, 1, 2])
def test_distinct_rows_group_as_np_unique_does(run, fast_columns):
    """Rows in runs (a lattice's layouts: grouped by their runs), in no order (hashed and sorted),
    and both at once, of floats, integers and booleans, are grouped into the same groups as
    np.unique's, each row equal to its representative; a NaN, which equals nothing, leaves the rows
    ungrouped."""
    rng = np.random.default_rng(run * 10 + fast_columns)
    n = 6000
    slow = [np.repeat(rng.choice(values, n // run + 1), run)[:n] for values in ([1.0, 2.0, 4.0], [0, 8])]
    columns = slow + [rng.choice([0.0, 1.0, 3.0], n), rng.random(n) < 0.5][:fast_columns]   # floats, ints, bools
    first, inverse = distinct_rows(*columns, 2.5)
    rows = np.stack(columns, axis=1)
    assert all(np.array_equal(c[first][inverse], c) for c in columns)
    assert len(first) == len(np.unique(rows, axis=0))
    columns[0] = columns[0].copy()
    columns[0][n // 2] = np.nan
    assert distinct_rows(*columns) is None


@pytest.mark.parametrize("per_plan", [False, True])
def test_several_gemms_at_once_equal_each_alone(per_plan):
    """``times`` over a pass's GEMMs gives each the same seconds, to the bit, as its own ``time``
    call, with plans of one precision or of several (per-plan kernel fields)."""
    rng = np.random.default_rng(3)
    rows = 3000
    tokens, tp = rng.choice([1.0, 7.5, 64.0, 512.0, 8192.0], rows), rng.choice([1.0, 2.0, 8.0], rows)
    kernel = GemmKernel(**H100, cast=1.0) if not per_plan else GemmKernel(**{
        **H100, "peak": np.where(tp > 1, 1979e12, 989.4e12), "cast": (tp > 1) * 1.0})
    shapes = [(tokens, 3 * 8192 / tp, 8192.0, 2.0, 2.0, 2.0, 1.0), (tokens, 8192.0, 8192 / tp, 1.0, 1.0, 2.0, 1.0),
              (tokens / 4, 2048.0, 7168.0, 1.0, 1.0, 2.0, 8.0), (2.0, 512.0, 4096.0, 2.0, 2.0, 2.0, 1.0)]
    together = kernel.times(shapes)
    for shape, seconds in zip(shapes, together):
        assert np.array_equal(np.broadcast_to(kernel.time(*shape), (rows,)), np.broadcast_to(seconds, (rows,)))


def test_calibrate_without_a_source_is_a_one_line_error(capsys):
    from perfmodel.cli.app import main

    assert main(["calibrate"]) == 2
    assert "needs --from aiconfigurator" in capsys.readouterr().err


def test_weight_only_kernels_pay_their_dequantization_and_never_beat_their_bytes():
    """A100's int8 / int4 weight-only kernels (fitted on TensorRT-LLM's tables): at one token a
    GEMM is faster than bf16 but never by more than the weight bytes saved; at 4,096 tokens it runs
    bf16 math and is no faster than the bf16 GEMM's compute; a decode step follows."""
    from perfmodel.hardware_db import load_database
    from perfmodel.catalog import load_model
    from perfmodel.machine import build_machine
    from perfmodel.plan import QuantScheme
    from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

    machine = build_machine(load_database(), "dgx-a100", 1)
    bf16 = machine.gemm_kernel("bf16")
    for weight, size in (("int8", 1.0), ("int4", 0.5)):
        wo = machine.serving_kernel(QuantScheme(weight, "a16"))
        assert wo is not machine.gemm_kernel("bf16").fused()
        small, small16 = float(wo.time(1, 14336, 4096, 2, size, 2)), float(bf16.time(1, 14336, 4096))
        assert small16 * size / 2.0 <= small < small16
        assert float(wo.time(4096, 14336, 4096, 2, size, 2)) >= 0.9 * float(bf16.time(4096, 14336, 4096))
    spec = load_model("llama-3.1-8b")
    tpot = {w: float(estimate_serving(spec, machine, ServePlan(tp=1, batch=1, weight_precision=w),
                                      ServeWorkload(2048, 128)).tpot_s) for w in ("bf16", "int8", "int4")}
    assert tpot["bf16"] / 2.0 < tpot["int8"] < tpot["bf16"] and tpot["bf16"] / 4.0 < tpot["int4"] < tpot["bf16"]


def test_quantized_gemms_run_at_their_measured_kernels(db):
    """W8A8 int8 on A100 and W4A4 NVFP4 on B200 and GB200 run the kernels fitted on TensorRT-LLM's
    tables (aiconfigurator's "sq" and "nvfp4" rows), with their activation quantization; a large
    A100 int8 GEMM lands near the 585 TOPS its table measured (8192 x 8192 x 16384: 3.76 ms)."""
    a100 = build_machine(db, "dgx-a100", 1).for_serving("trtllm")
    int8 = a100.gemm_kernel("int8")
    assert int8.source == "fitted" and int8.cast == 1.0
    assert float(int8.time(8192, 8192, 16384, 1.0, 1.0, 2.0)) == pytest.approx(3.7632e-3, rel=0.15)
    for system in ("dgx-b200", "gb200-nvl72"):
        machine = build_machine(db, system, 1).for_serving("trtllm")
        fp4, fp8 = machine.gemm_kernel("fp4"), machine.gemm_kernel("fp8")
        assert fp4.source == "fitted" and fp4.cast == 1.0
        # Measured: far from the 2x over fp8 the datasheet peaks promise at a large shape.
        big = (8192, 8192, 8192)
        assert 1.0 < float(fp8.time(*big, 1.0, 1.0, 2.0)) / float(fp4.time(*big, 0.5, 0.5, 2.0)) < 1.9


def test_four_bit_gemms_without_a_kernel_take_the_cited_speedup(db):
    """int4 on A100 has no measured W4A4 kernel: it runs the measured bf16 kernel at COMET's
    kernel-level 2.88x (four-bit-gemm-speedup), not at the int8 fit's share of the int4 peak (4x)."""
    machine = build_machine(db, "dgx-a100", 1).for_serving("trtllm")
    bf16, int4 = machine.gemm_kernel("bf16"), machine.gemm_kernel("int4")
    speedup = machine.constants.four_bit_gemm_speedup
    assert speedup == pytest.approx(2.88)
    assert int4.peak * int4.compute_fraction == pytest.approx(bf16.peak * bf16.compute_fraction * speedup)
    big = float(bf16.time(16384, 16384, 16384)) / float(int4.time(16384, 16384, 16384, 0.5, 0.5, 2.0))
    assert 2.5 < big <= speedup + 1e-9


def test_w4a8_reads_four_bit_weights_at_the_eight_bit_rate(db):
    """W4A8 (COMET's and QServe's int4 weights in int8 GEMMs) is a scheme of its own: its prefill
    runs as W8A8's, its decode reads half the weight bytes, so it is faster than W8A8 and no faster
    than W4A4."""
    from perfmodel.catalog import load_model
    from perfmodel.plan import QuantScheme
    from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving

    assert QuantScheme("int4", "a8").gemm_precision == "int8" and QuantScheme("fp4", "a8").gemm_precision == "fp8"
    machine, spec = build_machine(db, "dgx-a100", 1), load_model("llama-3.1-8b")
    run = {f"{w}{a}": estimate_serving(spec, machine, ServePlan(tp=1, batch=32, weight_precision=w,
                                                                activation_precision=a, kv_precision="int4"),
                                       ServeWorkload(1024, 256))
           for w, a in (("int8", "a8"), ("int4", "a8"), ("int4", "a4"))}
    assert float(run["int4a8"].ttft_s) == pytest.approx(float(run["int8a8"].ttft_s), rel=0.02)
    assert float(run["int4a4"].tpot_s) <= float(run["int4a8"].tpot_s) < float(run["int8a8"].tpot_s)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 8.0, 16.0, 4096.0, 16384.0, 0.5]), min_size=1, max_size=60))
def test_sorted_distinct_is_np_unique_with_its_inverse(values):
    from perfmodel.kernels import sorted_distinct

    distinct, inverse = sorted_distinct(np.array(values))
    expected, expected_inverse = np.unique(np.array(values), return_inverse=True)
    np.testing.assert_array_equal(distinct, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.ravel())
