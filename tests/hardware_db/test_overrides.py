"""What-ifs on the database (hardware_db.overrides): values kept exactly, invalid changes refused in one line."""

from __future__ import annotations

import re

import pytest

from perfmodel.cli.app import main
from perfmodel.hardware_db.errors import SpecError
from perfmodel.hardware_db.loader import ENTRY_KINDS
from perfmodel.hardware_db.overrides import with_overrides
from perfmodel.search.sweep import apply_point, evaluate_point, parse_spec


def test_an_empty_change_rebuilds_every_entry_exactly(db):
    """Each entry dumped and validated again under the context SI is the same entry, to the bit."""
    again = with_overrides(db, {kind: {name: {} for name in getattr(db, kind)} for kind in ENTRY_KINDS})
    for kind in ENTRY_KINDS:
        assert getattr(again, kind) == getattr(db, kind), kind


def test_a_change_is_kept_exactly_and_the_rest_untouched(db):
    again = with_overrides(db, {"accelerators": {"h100-sxm": {"hbm_bytes_per_s": 6e12 / 3}}})
    assert again.accelerator("h100-sxm").hbm_bytes_per_s == 6e12 / 3
    assert again.accelerator("h100-sxm").peak_flops == db.accelerator("h100-sxm").peak_flops
    assert again.systems is db.systems and db.accelerator("h100-sxm").hbm_bytes_per_s != 6e12 / 3


@pytest.mark.parametrize("changes, message", [
    ({"accelerators": {"h100-sxm": {"hbm_bytes_per_s": -1e12}}},
     "what-if accelerators.h100-sxm:hbm_tb_per_s: needs 0.05 to 50 TB/s, has -1"),
    ({"memory": {"pool": {"display_name": "p", "sources": ("s",), "kind": "pooled", "capacity_bytes": -5e9,
                          "read_bytes_per_s": 1e12, "write_bytes_per_s": 1e12, "latency_s": 1e-6}}},
     "what-if memory.pool:capacity_gb: needs 1 to 1e+07 GB, has -5"),
    ({"accelerators": {"h100-sxm": {"idle_w": 900.0}}}, "idle_w needs to be below tdp_w"),
    ({"systems": {"dgx-h100": {"accelerator": "no-such-device"}}}, "system dgx-h100:accelerator: unknown"),
    ({"accelerators": {"h100-sxm": {"hbm_gb": 80}}}, "has no field hbm_gb"),
])
def test_an_invalid_change_is_refused_in_one_line(db, changes, message):
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        with_overrides(db, changes)
    assert "\n" not in str(err.value)


def test_a_sweep_point_the_schema_refuses_is_an_invalid_row(db):
    """The spec's ranges are the schema's, so a spec asking for a pool faster than 10 TB/s is refused up
    front; a point whose derived values leave the schema's bounds (every peak x 100 puts H100's fp8
    above 40,000 TFLOP/s) is refused by the same validation as a file, its row INVALID with the one-line reason."""
    with pytest.raises(SpecError, match=re.escape("pool_tb_per_s needs 0.001 to 10 (TB/s of pooled memory per device)")):
        parse_spec(SPEC.format(pool_gb="[512]", pool_tb_per_s="[20]"))
    values = {"flops_scale": 100.0}
    with pytest.raises(SpecError, match=r"what-if accelerators\.h100-sxm:dense_tflops: .*needs 0\.01 to 40000 TFLOP/s"):
        apply_point(db, "dgx-h100", values)
    spec = parse_spec(SCALED)
    (row,) = evaluate_point(spec, 0, values, db)
    assert row["status"] == "INVALID" and "needs 0.01 to 40000 TFLOP/s" in row["reason"] and "\n" not in row["reason"]
    point_db, name = apply_point(db, "dgx-h100", {"pool_gb": 512.0, "pool_tb_per_s": 2.0})   # a valid pool
    assert point_db.memory_entry("sweep-pool").read_bytes_per_s == 2e12
    assert point_db.system(name).memory_tiers[-1].memory == "sweep-pool"


@pytest.mark.parametrize("pool_gb, pool_tb_per_s", [("[-512]", "[1]"), ("[512]", "[-1]")])
def test_the_command_refuses_a_negative_pool_with_exit_2(tmp_path, capsys, pool_gb, pool_tb_per_s):
    path = tmp_path / "negative.yaml"
    path.write_text(SPEC.format(pool_gb=pool_gb, pool_tb_per_s=pool_tb_per_s))
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "negative.yaml" in err


SPEC = """\
name: pool
base_system: dgx-h100
parameters:
  pool_gb: {pool_gb}
  pool_tb_per_s: {pool_tb_per_s}
workloads:
  - name: train8b
    kind: train
    model: llama-3.1-8b
    devices: 8
    global_batch: 64
    seq_len: 4096
"""
SCALED = SPEC.replace("  pool_gb: {pool_gb}\n  pool_tb_per_s: {pool_tb_per_s}\n", "  flops_scale: [100]\n")
