"""perfmodel.calibration_workflow: a calibrate run as typed results (blocks, notes, held-out errors,
provenance), no printing; the entry it writes keeps the blocks not refitted in the file's units."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from perfmodel.calibrate import FamilyFit
from perfmodel.calibration_workflow import (Refit, calibration_entry, refit_collectives, refit_dispatch, refit_gemm,
                                            refit_moe)
from perfmodel.hardware_db import load_database
from perfmodel.hardware_db.errors import SpecError
from perfmodel.hardware_db.schema import Calibration
from perfmodel.hardware_db.writer import file_units

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def db():
    return load_database()


def test_gemm_run_is_typed_and_silent(db, capsys):
    refit = refit_gemm(db, "h100-sxm", DATA / "gemm_h100_sample.csv", None, 0)
    assert capsys.readouterr() == ("", "")
    assert isinstance(refit, Refit) and isinstance(refit.family, FamilyFit)
    assert refit.device == "h100-sxm" and refit.provenance == "the measurements in gemm_h100_sample.csv"
    assert set(refit.blocks["gemm"]) <= set(refit.family.fits)
    assert refit.held_out["held_out_p90"] == {p: r.held_out_p90 for p, r in refit.family.fits.items()}
    assert refit.notes == (refit.family.note,) and refit.notes[0].startswith("gemm: fitted by perfmodel calibrate")
    with pytest.raises(FrozenInstanceError):
        refit.blocks = {}


def test_engine_blocks_sit_under_serving_backends(db):
    refit = refit_gemm(db, "h100-sxm", DATA / "gemm_h100_sglang_sample.csv", None, 0, "sglang")
    assert list(refit.blocks) == ["serving_backends"] and "gemm" in refit.blocks["serving_backends"]["sglang"]
    moe = refit_moe(db, "h100-sxm", DATA / "moe_h100_sglang_sample.csv", None, 0, "sglang")
    assert list(moe.blocks["serving_backends"]["sglang"]) == ["grouped_gemm"]


def test_shared_flags_checked_first(db):
    with pytest.raises(SpecError, match="one of the two"):
        refit_gemm(db, "h100-sxm", None, None, 0)
    with pytest.raises(SpecError, match="--seed needs"):
        refit_collectives(db, "h100-sxm", DATA / "nccl_h100_sample.csv", None, -1)
    with pytest.raises(SpecError, match="--backend needs"):
        refit_gemm(db, "h100-sxm", DATA / "gemm_h100_sample.csv", None, 0, "foo")


def test_entry_keeps_what_was_not_refitted(db):
    own = db.calibration("h100-sxm")
    refit = refit_collectives(db, "h100-sxm", DATA / "nccl_h100_sample.csv", None, 0)
    entry = calibration_entry(db, refit.device, refit.blocks, refit.notes)
    assert entry["collectives"] == refit.blocks["collectives"]
    assert entry["gemm"] == file_units(dict(own.gemm)) and entry["attention"] == file_units(own.attention)
    assert entry["sources"][-1] == refit.notes[0]
    assert not any(s.startswith("collectives:") for s in entry["sources"][:-1])
    assert Calibration.model_validate(entry).gemm == own.gemm      # loads back to the same fits


def test_normal_dispatch_needs_a_low_latency_fit(db):
    refit = refit_dispatch(db, "a100-sxm-80gb", DATA / "deepep_normal_h100_sample.csv", None, "dgx-h100", 0,
                           "normal")
    assert list(refit.blocks) == ["dispatch normal"] and set(refit.held_out) == {
        "held_out_p90", "held_out_mape", "held_out_mape_by_nodes"}
    with pytest.raises(SpecError, match="no low-latency dispatch fit"):
        calibration_entry(db, refit.device, refit.blocks, refit.notes)
