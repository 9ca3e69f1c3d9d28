"""Human units of the CLI's tables: the documented examples, the prefix boundaries, and '-' for no value."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from perfmodel.cli.units import count, device_noun, energy, fleet, flop, joules, rate, seconds, size, usd, watts


@pytest.mark.parametrize("value, text", [
    (13_460_000, "$13.5 M"), (1234.5, "$1,235"), (0.4213, "$0.421"), (2.1e9, "$2.10 B"), (12_345, "$12,345"),
    (963_895, "$964 k"), (3.99, "$3.99"), (12.34, "$12.3"), (4, "$4.00"), (0, "$0"), (1.5e12, "$1.50 T"),
    # Rounding that reaches the next band moves to it.
    (999.7, "$1,000"), (99_999.6, "$100 k"), (999_600, "$1.00 M"), (0.99996, "$1.00"),
])
def test_usd(value, text):
    assert usd(value) == text


@pytest.mark.parametrize("value, text", [
    (8.06e13, "22.4 GWh"), (3.6e6, "1 kWh"), (3600.0, "1 Wh"), (1.26e9, "350 kWh"), (3.6e15, "1 TWh"),
])
def test_energy_in_watt_hours(value, text):
    assert energy(value) == text


@pytest.mark.parametrize("value, text", [
    (0.42, "0.42 J"), (1.407, "1.41 J"), (0.042, "42 mJ"), (0.0042, "4.2 mJ"), (12_500, "12.5 kJ"),
    (0.099996, "0.1 J"), (2e-5, "20 uJ"),
])
def test_joules(value, text):
    assert joules(value) == text


@pytest.mark.parametrize("value, text", [(1200, "1.2 kW"), (700, "700 W"), (11.2e6, "11.2 MW"), (999.9, "1 kW")])
def test_watts(value, text):
    assert watts(value) == text


@pytest.mark.parametrize("value, text", [(80e9, "80 GB"), (141e9, "141 GB"), (1.5e12, "1.5 TB"), (512, "512 B"),
                                         (999.6e6, "1 GB"), (50e6, "50 MB")])
def test_size_decimal_prefixes(value, text):
    assert size(value) == text


def test_flop():
    assert flop(9.372e10) == "93.7 GFLOP" and flop(2.5e15) == "2.5 PFLOP" and flop(512) == "512 FLOP"


def test_rate():
    assert rate(3.35e12) == "3.35 TB/s" and rate(None) == "-"


@pytest.mark.parametrize("value, text", [
    (57, "57.0 s"), (0.412, "412 ms"), (3.2 * 3600, "3.2 h"), (41.5 * 86400, "41.5 days"), (412, "412 s"), (750, "12.5 min"),
    (2.83e-6, "2.83 us"), (8.5e-7, "850 ns"), (0.9996, "1.00 s"), (599.7, "10.0 min"), (59.97, "60.0 s"), (0.0009996, "1.00 ms"),
    (0, "0 s"),
])
def test_seconds(value, text):
    assert seconds(value) == text


@pytest.mark.parametrize("value, text", [(1e12, "1T"), (15e12, "15T"), (70.55e9, "70.6B"), (512, "512"),
                                         (12_345, "12,345"), (2.5e6, "2.5M"), (0.5, "0.5")])
def test_count(value, text):
    assert count(value) == text


@pytest.mark.parametrize("f", [usd, energy, joules, watts, size, rate, seconds, count, flop])
@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf, float("nan")])
def test_no_value_prints_a_dash(f, value):
    assert f(value) == "-"


def _system(name, per_node, nodes=1):
    return SimpleNamespace(name=name, devices_per_node=per_node, nodes=nodes)


H100 = SimpleNamespace(name="h100-sxm", vendor="NVIDIA")
MI300X = SimpleNamespace(name="mi300x", vendor="AMD")
ASCEND = SimpleNamespace(name="ascend-910c", vendor="Huawei")
OTHER = SimpleNamespace(name="wse-3", vendor="Cerebras")


def test_device_nouns():
    assert device_noun(H100) == "GPUs" and device_noun(MI300X) == "GPUs" and device_noun(ASCEND) == "NPUs"
    assert device_noun(OTHER) == "devices" and device_noun(H100, 1) == "GPU" and device_noun(OTHER, 1) == "device"


def test_fleet():
    dgx = _system("dgx-h100", 8)
    assert fleet(16_384, dgx, H100) == "16,384 GPUs (2,048 x dgx-h100)"
    assert fleet(8, dgx, H100) == "8 GPUs (1 x dgx-h100)"
    assert fleet(12, dgx, H100) == "12 GPUs of dgx-h100 (8 per node)"
    assert fleet(1, dgx, H100) == "1 GPU of dgx-h100 (8 per node)"
    assert fleet(64, _system("mi300x-8x", 8), MI300X) == "64 GPUs (8 x mi300x-8x)"
    assert fleet(4, _system("box", 4), OTHER) == "4 devices (1 x box)"


def test_fleet_of_a_system_that_names_several_nodes():
    """cloudmatrix384 is 48 nodes of 8: 384 NPUs are 48 nodes of it, not 48 cloudmatrix384s."""
    cm = _system("cloudmatrix384", 8, nodes=48)
    assert fleet(384, cm, ASCEND) == "384 NPUs (48 nodes of cloudmatrix384)"
    assert fleet(8, cm, ASCEND) == "8 NPUs (1 node of cloudmatrix384)"
    # A resized copy of an entry says nothing of what its name stands for: the caller does.
    assert fleet(64, _system("dgx-h100", 8, nodes=8), H100, named_node=True) == "64 GPUs (8 x dgx-h100)"
    assert fleet(64, _system("dgx-h100", 8, nodes=8), H100, named_node=False) == "64 GPUs (8 nodes of dgx-h100)"


def test_fleet_with_database_entries():
    from perfmodel.hardware_db.loader import load_database

    db = load_database()
    system = db.system("gb200-nvl72")
    assert fleet(144, system, db.accelerator(system.accelerator)) == "144 GPUs (2 x gb200-nvl72)"
    system = db.system("cloudmatrix384-die")
    assert fleet(768, system, db.accelerator(system.accelerator)) == "768 NPUs (48 nodes of cloudmatrix384-die)"
