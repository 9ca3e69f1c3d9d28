"""The validation set: exact cases exactly, the calibration constant reproducible, errors bounded."""

from __future__ import annotations

import pytest

from perfmodel.validation import (CALIBRATED_CONSTANT, EXACT_KINDS, calibrate, load_cases, summarize,
                                  unmeasured_kernels_error, validate, without_kernel_fits)


@pytest.fixture(scope="module")
def outcomes(db):
    return validate(db)


def test_the_set_is_broad_and_cited():
    cases = load_cases()
    assert len(cases) >= 25
    assert all(len(c.source) > 20 for c in cases)
    systems = {c.system for c in cases}
    assert {"dgx-a100", "dgx-h100", "mi300x-8x", "cloudmatrix384-die"} <= systems
    assert {"training", "serving"} <= {c.kind for c in cases}
    calibration = [c for c in cases if c.calibration]
    assert len(calibration) == 10 and all("Table 1" in c.source for c in calibration)


def test_exact_cases_match_their_formulas(outcomes):
    exact = [o for o in outcomes if o.case.kind in EXACT_KINDS]
    assert len(exact) >= 10
    for o in exact:
        # Closed forms: the ZeRO figures are printed to three significant digits.
        tolerance = 0.005 if o.case.kind == "memory" else 1e-9
        assert abs(o.error) <= tolerance, (o.case.id, o.predicted, o.case.measured.value)


def test_errors_are_bounded(outcomes):
    s = summarize(outcomes)
    assert s["calibration"]["mape"] < 0.06
    assert s["held_out_by_kind"]["training"]["mape"] < 0.15
    assert s["held_out"]["mape"] < 0.40
    assert s["held_out"]["cases"] >= 30


def test_the_calibrated_constant_is_the_fit_of_its_set(db):
    fit = calibrate(db)
    assert fit["cases"] == 10
    assert db.constant(CALIBRATED_CONSTANT) == pytest.approx(fit["value"], abs=0.005)
    assert fit["mape_after"] < fit["mape_before"]
    # The prediction intervals carry the fit's remaining error.
    assert db.constant("framework-fit-error") == pytest.approx(fit["mape_after"], abs=0.005)


def test_serving_ranges_carry_the_measured_serving_error(db):
    """A serving prediction's range is at least the held-out serving error wide, and that constant is
    what validate measures."""
    from perfmodel.machine import build_machine
    from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving
    from perfmodel.catalog import load_model
    from perfmodel.validation import serving_error

    assert db.constant("serving-error") == pytest.approx(serving_error(db, measured=True), abs=0.005)
    assert db.constant("unmeasured-serving-error") == pytest.approx(serving_error(db, measured=False), abs=0.005)
    assert db.constant("unmeasured-serving-error") > db.constant("serving-error")
    r = estimate_serving(load_model("llama-3.1-8b"), build_machine(db, "dgx-h100", 1), ServePlan(batch=8),
                         ServeWorkload(2048, 512))
    for low_high, value in ((r.ttft_range_s, r.ttft_s), (r.tpot_range_s, r.tpot_s)):
        assert float(low_high[1]) >= float(value) * (1 + db.constant("serving-error")) * (1 - 1e-9)


def test_moe_training_ranges_carry_the_measured_moe_error(db):
    """An MoE model's training step is at least the MoE family's held-out error wide (the constant is
    what validate measures, above the dense cases'); a dense model's range does not carry it."""
    from perfmodel.catalog import find_model
    from perfmodel.machine import build_machine
    from perfmodel.training import TrainPlan, TrainWorkload, estimate_training
    from perfmodel.validation import moe_training_error

    error = db.constant("moe-training-error")
    assert error == pytest.approx(moe_training_error(db), abs=0.005)
    assert error > db.constant("framework-fit-error")
    machine, work = build_machine(db, "dgx-h100", 64), TrainWorkload(256, 4096)
    moe = estimate_training(find_model("mixtral-8x7b"), machine, TrainPlan(pp=4, dp=16, ep=8, etp=1), work)
    assert float(moe.step_time_high_s) >= float(moe.step_time_s) * (1 + error) * (1 - 1e-9)
    assert float(moe.step_time_low_s) <= float(moe.step_time_s) * (1 - error) * (1 + 1e-9)
    dense = estimate_training(find_model("llama-3.1-8b"), machine, TrainPlan(dp=64), work)
    assert float(dense.step_time_high_s) < float(dense.step_time_s) * (1 + error)


def test_the_unmeasured_device_error_is_measured_with_the_fits_removed(db):
    """A device without kernel measurements carries the step error the model makes where the kernel
    fits are removed on purpose: measured, larger than with them, and what its range adds."""
    measured = unmeasured_kernels_error(db)
    assert db.constant("unmeasured-kernels-error") == pytest.approx(measured, abs=0.005)
    assert measured > summarize(validate(db, [c for c in load_cases() if c.kind == "training"]))[
        "held_out_by_kind"]["training"]["mape"]
    stripped = without_kernel_fits(db)
    assert all(not c.gemm and c.attention is None and c.collectives is None for c in stripped.calibrations.values())
    assert any(c.matmul_fraction for c in stripped.calibrations.values())   # measured fractions stay
