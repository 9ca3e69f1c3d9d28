"""Power, energy and cost of running devices, vectorized over plans.

Device power rises linearly from idle to TDP with the fraction of time it is busy (Fan, Weber and
Barroso, "Power Provisioning for a Warehouse-Sized Computer", ISCA 2007, Sec. 4.1: P(u) =
P_idle + (P_busy - P_idle) u); the facility multiplies IT power by its PUE (The Green Grid, "PUE: a
comprehensive examination of the metric", WP 49, 2012). Capital cost is amortized straight-line
over the depreciation life; energy is billed at a flat price per kWh. All constants are named in
the database (``constants``) with their sources and can be overridden there.
"""

from __future__ import annotations

import numpy as np

from .machine import Machine

HOURS_PER_YEAR = 8766.0  # 365.25 days


def device_power_w(machine: Machine, busy_fraction):
    """Accelerator power (W) at a busy fraction in [0, 1]: idle + (TDP - idle) x busy."""
    busy = np.clip(np.asarray(busy_fraction, dtype=float), 0.0, 1.0)
    return machine.idle_w + (machine.tdp_w - machine.idle_w) * busy


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
    energy = np.asarray(power_w, dtype=float) / 1000.0 * k.get("pue", 1.0) * k.get("electricity-usd-per-kwh", 0.0)
    capital = machine.price_usd_per_device / (1.0 - k.get("network-capex-fraction", 0.0)) / (
        k.get("depreciation-years", 5.0) * HOURS_PER_YEAR)
    provisioned_kw = (machine.tdp_w + machine.overhead_w_per_device) / 1000.0
    facility = provisioned_kw * k.get("facility-usd-per-kw-month", 0.0) * 12.0 / HOURS_PER_YEAR
    return capital + facility + energy


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
