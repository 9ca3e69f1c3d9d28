"""Economics of running devices: cost per device-hour on a cost basis, and energy and cost per token.

One place for what training and serving both report: dollars per device-hour on the machine's basis
(cloud rent, or total cost of ownership: Cottier et al. 2024, arXiv 2405.21015, Sec. 2), energy per
token at the facility (IT power times PUE: The Green Grid, "PUE: a comprehensive examination of the
metric", WP 49, 2012), and dollars per million tokens. Vectorized over plans; the constants are
named in the database (``constants``) with their sources.
"""

from __future__ import annotations

import numpy as np

from .machine import Machine

HOURS_PER_YEAR = 8766.0  # 365.25 days


def energy_per_token_j(power_w, tokens_per_s, pue: float):
    """Joules per token at the facility: IT power ``power_w`` (W, all devices producing the tokens,
    node shares included) times the PUE, over ``tokens_per_s``; 0 where nothing is produced."""
    tokens = np.asarray(tokens_per_s, dtype=float)
    return np.where(tokens > 0, np.asarray(power_w, dtype=float) * pue / np.where(tokens > 0, tokens, 1.0), 0.0)


def usd_per_million_tokens(usd_per_hour, tokens_per_s):
    """US dollars per million tokens from dollars per hour (all devices producing the tokens) and
    ``tokens_per_s``; 0 where nothing is produced, NaN where unpriced."""
    tokens = np.asarray(tokens_per_s, dtype=float)
    return np.where(tokens > 0, np.asarray(usd_per_hour, dtype=float) / 3600.0 / np.where(tokens > 0, tokens, 1.0)
                    * 1e6, 0.0)


def run_cost(machine: Machine, power_w):
    """US dollars per device-hour at ``power_w`` per device (accelerator plus its share of the node),
    on the machine's cost basis; NaN without a price, which callers report as "unpriced".

    - The user's ``--price`` for the system, all-in, on either basis.
    - cloud: the on-demand rent per device-hour (it includes power, facility and network).
    - owned: total cost of ownership (Cottier et al. 2024, arXiv 2405.21015, Sec. 2): capital
      (price with the cluster network's share, network-capex-fraction) straight-line over
      depreciation-years, plus facility rent for the provisioned power (TDP and node share, at
      facility-usd-per-kw-month), plus energy (power x PUE x electricity price).
    """
    shape = np.shape(power_w)
    if machine.price_override is not None:
        return np.full(shape, machine.price_override)
    if machine.pricing == "cloud":
        return np.full(shape, np.nan if machine.cloud_usd_per_hour is None else machine.cloud_usd_per_hour)
    if machine.price_usd_per_device is None:
        return np.full(shape, np.nan)
    k = machine.constants
    capital = machine.price_usd_per_device / (1.0 - k.network_capex_fraction) / (
        k.depreciation_years * HOURS_PER_YEAR)
    return capital + _operating_usd_per_hour(machine, power_w)


def _operating_usd_per_hour(machine: Machine, power_w):
    """What running an owned device costs per hour beyond its capital: facility rent for the
    provisioned power (TDP and node share, at facility-usd-per-kw-month) and energy (power x PUE x
    electricity price)."""
    k = machine.constants
    energy = np.asarray(power_w, dtype=float) / 1000.0 * k.pue * k.electricity_usd_per_kwh
    provisioned_kw = (machine.tdp_w + machine.overhead_w_per_device) / 1000.0
    facility = provisioned_kw * k.facility_usd_per_kw_month * 12.0 / HOURS_PER_YEAR
    return facility + energy


def owned_device_usd_per_hour(machine: Machine, power_w, value_usd: float = 0.0):
    """US dollars per device-hour of a device already owned: what running it costs (as ``run_cost``'s
    owned basis) plus the resale value it forgoes, straight-line over the depreciation life (0 when
    the purchase is sunk: capital already spent is no cost of the choice)."""
    return _operating_usd_per_hour(machine, power_w) + value_usd / (
        machine.constants.depreciation_years * HOURS_PER_YEAR)


def cost_basis(machine: Machine) -> str:
    """One line: the basis a machine's cost is on and where its price comes from, or why it has none."""
    name = machine.system.name
    if machine.price_override is not None:
        return f"{name}: your --price of ${machine.price_override:,.4g} per device-hour (all-in)"
    if machine.pricing == "cloud" and machine.cloud_usd_per_hour is not None:
        return f"{name}: cloud on-demand rent, ${machine.cloud_usd_per_hour:,.4g} per device-hour (source in its YAML)"
    if machine.pricing == "owned" and machine.price_usd_per_device is not None:
        return (f"{name}: owned, ${machine.price_usd_per_device:,.0f} per device with its node share, with network, "
                "facility and energy (sources in the YAML and constants)")
    reason = (machine.unpriced or {}).get(machine.pricing, "no published price in the database")
    return f"{name}: unpriced on the {machine.pricing} basis ({reason}); give --price {name}=USD_PER_DEVICE_HOUR"
