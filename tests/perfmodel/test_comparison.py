"""perfmodel.comparison (what ``perfmodel compare`` shows): every row recomputed from the database's
own figures (ridge points, per-watt, per-dollar, prices per device-hour, the GEMM constants' origin
and error), systems shown per device with their topology, the best of each row picked by its
direction, and a name that is not an accelerator or system a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.comparison import best_index, compare, device_hour_prices, gemm_provenance, metrics, profile
from perfmodel.hardware_db.errors import SpecError, UnknownNameError
from perfmodel.hardware_db.schema import PRECISIONS


def test_rows_are_unique_and_every_profile_has_exactly_them(db):
    keys = [m.key for m in metrics()]
    assert len(set(keys)) == len(keys)
    for name in [*db.accelerators, *db.systems]:
        assert set(profile(name, db)) == {*keys, "name", "display_name", "kind"}, name


def test_directions_of_the_rows():
    better = {m.key: m.higher_is_better for m in metrics()}
    assert better["hbm_bytes_per_s"] and better["bf16_flops_per_w"] and better["bf16_flops_per_usd"]
    assert not better["tdp_w"] and not better["price_usd"] and not better["ridge_bf16_flop_per_byte"]
    assert not better["cloud_usd_per_device_hour"] and not better["compute_error"]


def test_ridge_points_and_per_watt_from_the_datasheet(db):
    for name, acc in db.accelerators.items():
        row = profile(name, db)
        for p in PRECISIONS:
            peak = acc.peak_flops.get(p)
            assert row[f"peak_{p}_flops"] == peak
            want = peak / acc.hbm_bytes_per_s if peak else None
            assert row[f"ridge_{p}_flop_per_byte"] == (pytest.approx(want) if want else None), (name, p)
        for p in ("bf16", "fp8"):
            peak = acc.peak_flops.get(p)
            assert row[f"{p}_flops_per_w"] == (pytest.approx(peak / acc.tdp_w) if peak else None), (name, p)


def test_h100_sxm_named_figures(db):
    """Named datasheet figures, so a unit slip (bits for bytes, per node for per device) shows."""
    row = profile("h100-sxm", db)
    assert row["ridge_bf16_flop_per_byte"] == pytest.approx(989.4e12 / 3.35e12)      # ~295 FLOP/B
    assert row["ridge_fp8_flop_per_byte"] == pytest.approx(2 * row["ridge_bf16_flop_per_byte"], rel=1e-3)
    assert row["bf16_flops_per_w"] == pytest.approx(989.4e12 / 700.0)
    assert row["peak_fp4_flops"] is None and row["ridge_fp4_flop_per_byte"] is None


def test_an_accelerator_is_one_device_priced_by_its_own_entry(db):
    for name, acc in db.accelerators.items():
        row = profile(name, db)
        assert row["kind"] == "accelerator" and row["devices"] == 1 and row["scale_up_domain"] is None
        assert row["price_usd"] == acc.price_usd and row["cloud_usd_per_device_hour"] == acc.cloud_usd_per_hour
        assert row["owned_usd_per_device_hour"] is None
        assert row["scale_up_bytes_per_s"] == acc.scale_up_bytes_per_s
        assert row["scale_out_bytes_per_s"] == acc.nic_bytes_per_s
        bf16 = acc.peak_flops.get("bf16")
        want = bf16 / acc.price_usd if bf16 and acc.price_usd else None
        assert row["bf16_flops_per_usd"] == (pytest.approx(want) if want else None), name


def test_a_system_is_shown_per_device(db):
    row, acc = profile("dgx-h100", db), profile("h100-sxm", db)
    system = db.system("dgx-h100")
    assert row["kind"] == "system" and row["name"] == "dgx-h100"
    assert row["devices"] == system.devices == 8
    assert row["scale_up_domain"] == 8                               # NVLink joins the node's 8 GPUs
    # Per-device figures are the accelerator's ...
    for key in ("peak_bf16_flops", "ridge_bf16_flop_per_byte", "hbm_bytes", "tdp_w", "bf16_flops_per_w"):
        assert row[key] == acc[key], key
    # ... and the price is the node's share, which prices the per-dollar row.
    assert row["price_usd"] == pytest.approx(system.node_price_usd / system.devices_per_node)
    assert row["bf16_flops_per_usd"] == pytest.approx(row["peak_bf16_flops"] / row["price_usd"])


def test_scale_up_domain_is_the_largest_scale_up_tier(db):
    for name in ("gb200-nvl72", "cloudmatrix384"):
        system = db.system(name)
        levels = [lv for lv in db.levels(system) if db.link(lv.link).kind in ("scale-up", "package")]
        row = profile(name, db)
        assert row["scale_up_domain"] == levels[-1].group_size and row["scale_up_domain"] > 8
        assert row["scale_up_bytes_per_s"] == levels[-1].bytes_per_s


def test_device_hour_prices_of_a_system(db):
    """Cloud: the accelerator's rent. Owned at TDP: capital with the network share over the
    depreciation life, facility rent and energy for TDP plus the node's overhead share."""
    system, acc = db.system("dgx-h100"), db.accelerator("h100-sxm")
    k = db.constant
    watts = acc.tdp_w + (system.node_overhead_w or 0.0) / system.devices_per_node
    owned = (system.node_price_usd / system.devices_per_node / (1 - k("network-capex-fraction"))
             / (k("depreciation-years") * 8766.0)
             + watts / 1000 * k("facility-usd-per-kw-month") * 12 / 8766.0
             + watts / 1000 * k("pue") * k("electricity-usd-per-kwh"))
    row = profile("dgx-h100", db)
    assert row["cloud_usd_per_device_hour"] == acc.cloud_usd_per_hour
    assert row["owned_usd_per_device_hour"] == pytest.approx(owned, rel=1e-12)
    assert device_hour_prices(db, "dgx-h100") == {"cloud_usd_per_device_hour": row["cloud_usd_per_device_hour"],
                                                  "owned_usd_per_device_hour": row["owned_usd_per_device_hour"]}


def test_an_unpriced_system_has_no_prices(db):
    row = profile("fenghuang-h200", db)
    assert row["price_usd"] is None and row["bf16_flops_per_usd"] is None
    assert row["cloud_usd_per_device_hour"] is None and row["owned_usd_per_device_hour"] is None


def test_gemm_provenance_by_what_was_measured(db):
    unfitted = db.constant("unfitted-gemm-error")
    fitted = db.calibration("h100-sxm").gemm
    text, error = gemm_provenance(db.accelerator("h100-sxm"), db)
    assert text.startswith("fitted on measured GEMMs") and error == max(f.held_out_mape for f in fitted.values())
    assert error != unfitted
    text, error = gemm_provenance(db.accelerator("mi300x"), db)
    assert text.startswith("measured large-GEMM fraction") and error == unfitted
    text, error = gemm_provenance(db.accelerator("h100-pcie"), db)
    assert text == "not measured: the median of NVIDIA's measured devices" and error == unfitted
    text, error = gemm_provenance(db.accelerator("ascend-910b"), db)
    assert text == "not measured: the lowest fraction measured on any device" and error == unfitted


def test_step_error_follows_the_kind_of_constants(db):
    assert profile("h100-sxm", db)["step_error"] == db.constant("framework-fit-error")
    assert profile("mi300x", db)["step_error"] == db.constant("unmeasured-kernels-error")
    assert db.constant("framework-fit-error") != db.constant("unmeasured-kernels-error")


def test_compare_keeps_the_order_and_resolves_names(db):
    rows = compare(["mi300x", "DGX-H100", "h100-sxm"], db)
    assert [r["name"] for r in rows] == ["mi300x", "dgx-h100", "h100-sxm"]
    assert [r["kind"] for r in rows] == ["accelerator", "system", "accelerator"]


def test_best_of_each_row_in_a_comparison(db):
    """What compare highlights: per numeric row, the entry with the highest (or lowest) value."""
    names = ["h100-sxm", "b200", "mi300x", "dgx-h100", "v100-sxm2-32gb"]
    rows = compare(names, db)
    checked = 0
    for m in metrics():
        values = [r[m.key] for r in rows]
        if any(isinstance(v, str) for v in values):
            continue
        best = best_index(values, m.higher_is_better)
        present = [v for v in values if v is not None]
        if len(set(present)) < 2:
            assert best is None
            continue
        assert values[best] == (max if m.higher_is_better else min)(present), m.key
        checked += 1
    assert checked >= 15
    by = {m.key: m for m in metrics()}
    tdp = [r["tdp_w"] for r in rows]
    assert rows[best_index(tdp, by["tdp_w"].higher_is_better)]["name"] == "v100-sxm2-32gb"   # 300 W: least
    fp4 = [r["peak_fp4_flops"] for r in rows]
    assert fp4.count(None) == 4 and best_index(fp4, True) is None   # only B200 has fp4: nothing to beat
    hbm = [r["hbm_bytes_per_s"] for r in rows]
    assert rows[best_index(hbm, by["hbm_bytes_per_s"].higher_is_better)]["name"] == "b200"   # 7.7 TB/s


def test_best_index_needs_two_distinct_values():
    assert best_index([], True) is None
    assert best_index([None, 3.0, None], True) is None
    assert best_index([2.0, 2.0, None], False) is None
    assert best_index([2.0, None, 1.0], True) == 0
    assert best_index([2.0, None, 1.0], False) == 2


@given(st.lists(st.none() | st.floats(-1e6, 1e6, allow_nan=False), max_size=8), st.booleans())
def test_best_index_is_the_extreme_of_the_values_present(values, higher):
    best = best_index(values, higher)
    present = [v for v in values if v is not None]
    if len(set(present)) < 2:
        assert best is None
    else:
        assert values[best] is not None
        assert values[best] == (max(present) if higher else min(present))


@pytest.mark.parametrize("names", [["h100-sxm", "h100-sxm-99gb"], ["no-such-device"]])
def test_unknown_names_are_one_line_errors(db, names):
    with pytest.raises(UnknownNameError) as err:
        compare(names, db)
    message = str(err.value)
    assert names[-1] in message and "\n" not in message


@pytest.mark.parametrize("name,kind", [("epyc-7742", "cpu"), ("ib-edr-100", "link"), ("pue", "constant")])
def test_entries_of_other_kinds_are_refused_in_one_line(db, name, kind):
    with pytest.raises(SpecError) as err:
        profile(name, db)
    message = str(err.value)
    assert f"'{name}' is a {kind}" in message and "accelerators or systems" in message and "\n" not in message


def test_profiles_are_finite_numbers_or_text(db):
    for name in [*db.accelerators, *db.systems]:
        for key, value in profile(name, db).items():
            assert value is None or isinstance(value, str) or np.isfinite(value), (name, key)
