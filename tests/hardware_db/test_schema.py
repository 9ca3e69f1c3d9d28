"""The schema converts units once and catches the usual slips with a hint."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from perfmodel.hardware_db.errors import UnsupportedPrecisionError
from perfmodel.hardware_db.schema import Accelerator, Link, System

H100 = dict(
    name="x-gpu", display_name="X", vendor="V", sources=["test"],
    dense_tflops={"fp64": 67, "fp32": 67, "tf32": 494.5, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    hbm_gb=80, hbm_tb_per_s=3.35, l2_mb=50, tdp_w=700, scale_up_gb_per_s_per_direction=450,
    nic_gbit_per_s_per_direction=400,
)


def accel(**changes):
    return Accelerator.model_validate({**H100, **changes})


def test_units_convert_to_si():
    a = accel()
    assert a.hbm_bytes == 80 * 2**30
    assert a.hbm_bytes_per_s == 3.35e12
    assert a.peak("bf16") == pytest.approx(989.4e12)
    assert a.scale_up_bytes_per_s == 450e9
    assert a.nic_bytes_per_s == 50e9  # 400 Gbit/s = 50 GB/s
    assert a.sram_bytes == 50e6
    assert a.ridge_point("bf16") == pytest.approx(989.4e12 / 3.35e12)


def test_unlisted_precision_is_unsupported_not_derived():
    a = accel()
    assert not a.supports("fp4")
    with pytest.raises(UnsupportedPrecisionError, match="does not support fp4.*lists fp64, fp32, tf32, bf16, fp16, fp8"):
        a.peak("fp4")


@pytest.mark.parametrize("changes, message", [
    ({"hbm_tb_per_s": 3350}, "is it in GB/s"),
    ({"hbm_gb": 80_000}, "is it in MB or TB"),
    ({"tdp_w": 0.7}, "needs 1 to 200000 W"),
    ({"dense_tflops": {"bf16": 989.4, "fp8": 3958}}, "2:4 sparse"),
    ({"dense_tflops": {"tf32": 494.5, "bf16": 1978.9}}, "2:4 sparse"),
    ({"dense_tflops": {"bf16": 989.4, "fp16": 1978.9}}, "differs from"),
    ({"dense_tflops": {"bf16": float("nan")}}, "finite number"),
    ({"scale_up_gb_per_s_per_direction": 0.01}, "Gbit/s"),
    ({"idle_w": 900}, "below tdp_w"),
    ({"hbm_bytes_per_s_typo": 1}, "Extra inputs"),
])
def test_slips_are_caught_with_a_hint(changes, message):
    with pytest.raises(ValidationError, match=message):
        accel(**changes)


def test_sources_are_required():
    with pytest.raises(ValidationError, match="sources"):
        accel(sources=[])


def test_link_needs_exactly_one_bandwidth_with_its_unit():
    base = dict(name="l", display_name="L", kind="scale-out", latency_us=2, sources=["s"])
    assert Link.model_validate({**base, "gbit_per_s_per_direction": 400}).bytes_per_s == 50e9
    assert Link.model_validate({**base, "gb_per_s_per_direction": 450}).bytes_per_s == 450e9
    with pytest.raises(ValidationError, match="exactly one"):
        Link.model_validate({**base, "gbit_per_s_per_direction": 400, "gb_per_s_per_direction": 50})
    with pytest.raises(ValidationError, match="exactly one"):
        Link.model_validate(base)


def system(tiers):
    return System.model_validate(dict(name="s", display_name="S", vendor="V", sources=["s"], accelerator="x",
                                      devices_per_node=8, tiers=tiers))


def test_tiers_nest_and_the_last_spans_the_system():
    ok = system([{"name": "a", "link": "l", "group_size": 2}, {"name": "b", "link": "l", "group_size": 8},
                 {"name": "c", "link": "l"}])
    assert ok.scaled(4).devices == 32
    with pytest.raises(ValidationError, match="nest"):
        system([{"name": "a", "link": "l", "group_size": 3}, {"name": "b", "link": "l", "group_size": 8},
                {"name": "c", "link": "l"}])
    with pytest.raises(ValidationError, match="spans the system"):
        system([{"name": "a", "link": "l", "group_size": 8}])
