"""hardware_db.writer: validated entries back in their YAML file's units, by the schema's own scales."""

from __future__ import annotations

import pytest
import yaml

from perfmodel.hardware_db import load_database
from perfmodel.hardware_db.schema import ENTRY_KINDS, Calibration, CollectiveFit, DispatchFit, GemmFit
from perfmodel.hardware_db.writer import file_units, write_entries


@pytest.fixture(scope="module")
def db():
    return load_database()


def test_quantities_back_in_their_keys_units():
    fit = GemmFit.model_validate({"units": 132, "compute_fraction": 0.8, "memory_fraction": 0.7, "launch_us": 11.255,
                                  "sharpness": 2.0, "tile_overhead": 0.1, "held_out_mape": 0.05, "samples": 10})
    assert fit.launch_s == pytest.approx(11.255e-6)
    out = file_units(fit)
    assert out["launch_us"] == 11.255          # the SI round trip's last digit undone
    assert out["cast_launch_us"] == 0.0 and out["units"] == 132 and out["compute_fraction"] == 0.8
    assert "launch_s" not in out


def test_nested_blocks_and_dicts_of_quantities(db):
    cal = db.calibration("h100-sxm")
    assert isinstance(cal.collectives, CollectiveFit) and isinstance(cal.dispatch, DispatchFit)
    coll = file_units(cal.collectives)
    assert coll["link_gb_per_s"] == pytest.approx(cal.collectives.link_bytes_per_s / 1e9)
    assert coll["ops"]["all_reduce"]["launch_us"] == pytest.approx(cal.collectives.ops["all_reduce"].launch_s * 1e6)
    dispatch = file_units(cal.dispatch, exclude_none=True)
    assert dispatch["launch_us"]["combine"] == pytest.approx(cal.dispatch.launch_s["combine"] * 1e6)
    assert None not in dispatch.values()


def test_round_trip_through_the_schema(db):
    """Every entry of the database, written in its file's units, loads back to the same entry."""
    for kind, model in ENTRY_KINDS.items():
        entries = getattr(db, kind).values()
        assert entries, kind
        for entry in entries:
            assert model.model_validate(file_units(entry)) == entry, (kind, entry.name)
    written = file_units(db.accelerator("h100-sxm"))
    assert written["hbm_gb"] == 80.0           # binary GiB, as the schema scales it
    assert written["dense_tflops"]["bf16"] == 989.4


def test_write_entries(tmp_path, db):
    cal = db.calibration("h100-sxm")
    path = write_entries(tmp_path / "new", "calibration-h100-sxm.yaml", "calibrations", [cal])
    assert path == tmp_path / "new" / "calibration-h100-sxm.yaml"
    loaded = yaml.safe_load(path.read_text())
    assert Calibration.model_validate(loaded["calibrations"][0]) == cal
