"""perfmodel.economics on a DGX H100: the per-device-hour cost on each basis follows the database's
prices and constants; energy per token is facility power (IT power times PUE) over tokens, and
dollars per million tokens the hourly cost over tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.economics import (
    HOURS_PER_YEAR,
    cost_basis,
    energy_per_token_j,
    owned_device_usd_per_hour,
    run_cost,
    usd_per_million_tokens,
)
from perfmodel.machine import build_machine


def test_cloud_cost_is_the_rent_whatever_the_power(db, m):
    rent = db.accelerator("h100-sxm").cloud_usd_per_hour
    assert m.pricing == "cloud" and rent is not None
    np.testing.assert_array_equal(run_cost(m, np.array([100.0, 700.0, 1200.0])), [rent] * 3)


def test_owned_cost_from_the_databases_prices_and_constants(db, owned):
    """Capital with the network's share over the depreciation life, facility rent for the provisioned
    watts, energy at the PUE and electricity price: recomputed from the database entries."""
    system = db.system("dgx-h100")
    price = system.node_price_usd / system.devices_per_node
    provisioned = db.accelerator("h100-sxm").tdp_w + (system.node_overhead_w or 0.0) / system.devices_per_node
    k = db.constant
    hours = k("depreciation-years") * 8766.0
    fixed = (price / (1 - k("network-capex-fraction")) / hours
             + provisioned / 1000 * k("facility-usd-per-kw-month") * 12 / 8766.0)
    per_w = k("pue") * k("electricity-usd-per-kwh") / 1000
    power = np.array([0.0, 350.0, 700.0])
    np.testing.assert_allclose(run_cost(owned, power), fixed + per_w * power, rtol=1e-12)
    assert HOURS_PER_YEAR == 8766.0


def test_price_override_wins_on_either_basis(db):
    for basis in ("cloud", "owned"):
        machine = build_machine(db, "dgx-h100", 8, basis, prices={"DGX-H100": 2.5})
        np.testing.assert_array_equal(run_cost(machine, np.array([70.0, 700.0])), [2.5, 2.5])
        assert "--price" in cost_basis(machine) and "2.5" in cost_basis(machine)


def test_unpriced_system_is_nan_on_both_bases(db):
    for basis in ("cloud", "owned"):
        machine = build_machine(db, "fenghuang-h200", 8, basis)
        cost = run_cost(machine, np.array([300.0, 600.0]))
        assert cost.shape == (2,) and np.all(np.isnan(cost))
        line = cost_basis(machine)
        assert "unpriced" in line and f"--price {machine.system.name}=" in line and "\n" not in line


def test_owned_device_cost_is_running_cost_plus_forgone_value(owned):
    power = np.array([100.0, 700.0])
    k = owned.constants
    capital = owned.price_usd_per_device / (1 - k.network_capex_fraction)
    sunk = owned_device_usd_per_hour(owned, power)
    np.testing.assert_allclose(sunk + capital / (k.depreciation_years * HOURS_PER_YEAR), run_cost(owned, power))
    # Valued at its purchase with the network share, it costs what buying it would.
    np.testing.assert_allclose(owned_device_usd_per_hour(owned, power, capital), run_cost(owned, power))
    assert np.all(sunk > 0) and sunk[1] > sunk[0]


def test_cost_basis_names_the_basis_and_figure(m, owned):
    assert cost_basis(m).startswith("dgx-h100: cloud on-demand rent, $3.99")
    assert cost_basis(owned).startswith(f"dgx-h100: owned, ${owned.price_usd_per_device:,.0f} per device")


@settings(max_examples=60, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(1e-3, 1e7), st.floats(1.0, 2.0))
def test_energy_per_token_is_facility_power_over_tokens(power, tokens, pue):
    joules = float(energy_per_token_j(power, tokens, pue))
    assert joules == pytest.approx(power * pue / tokens, rel=1e-12)
    assert joules * tokens >= power * (1 - 1e-12)   # the facility never draws less than its IT load


def test_per_token_figures_are_zero_without_tokens_and_nan_unpriced():
    assert float(energy_per_token_j(500.0, 0.0, 1.3)) == 0.0
    assert float(usd_per_million_tokens(10.0, 0.0)) == 0.0
    assert np.isnan(usd_per_million_tokens(np.nan, 100.0))
    # $3,600 an hour producing 1,000 tokens a second: a dollar per second, $1,000 per million tokens.
    assert float(usd_per_million_tokens(3600.0, 1000.0)) == pytest.approx(1000.0)
