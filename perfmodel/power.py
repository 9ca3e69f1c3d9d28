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
    """US dollars per device-hour at ``power_w`` per device (accelerator plus its share of the node).

    Owned hardware: price / (life x hours per year) + power x PUE x electricity price. Without a
    price in the database, the device's cloud price per hour if listed; otherwise NaN, which the
    callers report as "no price" (never print it).
    """
    k = machine.constants
    energy = np.asarray(power_w, dtype=float) / 1000.0 * k.get("pue", 1.0) * k.get("electricity-usd-per-kwh", 0.0)
    if machine.price_usd_per_device is not None:
        capital = machine.price_usd_per_device / (k.get("depreciation-years", 5.0) * HOURS_PER_YEAR)
        return capital + energy
    if machine.cloud_usd_per_hour is not None:
        return np.full(np.shape(energy), machine.cloud_usd_per_hour)
    return np.full(np.shape(energy), np.nan)
