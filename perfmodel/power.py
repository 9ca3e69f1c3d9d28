"""Power, energy and cost of running devices, vectorized over plans.

Device power rises linearly from idle to TDP with the fraction of time it is busy (Fan, Weber and
Barroso, "Power Provisioning for a Warehouse-Sized Computer", ISCA 2007, Sec. 4.1: P(u) =
P_idle + (P_busy - P_idle) u); the facility multiplies IT power by its PUE (The Green Grid, "PUE: a
comprehensive examination of the metric", WP 49, 2012). Capital cost is amortized straight-line
over the depreciation life; energy is billed at a flat price per kWh. All constants are named in
the database (``constants``) with their sources and can be overridden there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .machine import Machine

HOURS_PER_YEAR = 8766.0  # 365.25 days


def device_power_w(machine: Machine, busy_fraction):
    """Accelerator power (W) at a busy fraction in [0, 1]: idle + (TDP - idle) x busy."""
    busy = np.clip(np.asarray(busy_fraction, dtype=float), 0.0, 1.0)
    return machine.idle_w + (machine.tdp_w - machine.idle_w) * busy


@dataclass(frozen=True)
class PhaseWork:
    """One phase (a prefill, a decode step) on one device at full clock, split by what the core clock
    sets: seconds of its compute-bound operators, of its memory-bound ones (with their FLOPs, which
    turn compute-bound at a low enough clock), and of what the clock does not set (collectives over
    links, streams from memory tiers); its FLOPs and HBM bytes."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    memory_flops: np.ndarray
    other_s: np.ndarray
    flops: np.ndarray
    hbm_bytes: np.ndarray
    precision: str

    @staticmethod
    def of(ops, total_s, precision: str) -> "PhaseWork":
        """From a phase's operator times (perfmodel.roofline.OpTimes) and its whole duration (s)."""
        zero = np.zeros_like(np.asarray(total_s, dtype=float))
        bound = lambda k: np.asarray(ops.compute_bound[k], dtype=bool)  # noqa: E731
        compute = sum((np.where(bound(k), t, 0.0) for k, t in ops.seconds.items()), zero)
        memory = sum((np.where(bound(k), 0.0, t) for k, t in ops.seconds.items()), zero)
        memory_flops = sum((np.where(bound(k), 0.0, ops.flops[k]) for k in ops.seconds), zero)
        flops = sum((ops.flops[k] for k in ops.seconds), zero)
        traffic = sum((ops.bytes.get(k, 0.0) for k in ops.seconds), zero)
        return PhaseWork(compute, memory, memory_flops, np.maximum(total_s - compute - memory, 0.0), flops, traffic,
                         precision)


def phase_seconds(machine: Machine, work: PhaseWork, clock):
    """The phase's duration at a core clock ``clock`` (a share of the full clock): compute-bound time
    stretches by 1 / clock, memory-bound operators keep their time until their FLOPs no longer fit
    under it, and collectives and tier streams keep theirs (their links are not clocked by the cores)."""
    rate = machine.flops(work.precision) * clock
    return work.compute_s / clock + np.maximum(work.memory_s, work.memory_flops / rate) + work.other_s


def phase_power_w(machine: Machine, work: PhaseWork, clock=1.0, seconds=None):
    """Accelerator power (W) over a phase at a core clock share ``clock``: idle plus dynamic power in
    proportion to the energy its FLOPs and HBM bytes take, spread over its duration,

        P = P_idle + (TDP - P_idle) x min(1, (F / R x clock^2 + m x B / BW) / T(clock)),

    R and BW the achievable GEMM rate and HBM bandwidth (so a device running GEMMs at its achievable
    rate draws its TDP: the measured kernels ran at the default power limit) and m the memory power
    weight (constant ``power-memory-weight``: what saturating HBM alone draws, as a share of the
    dynamic range). Energy per FLOP falls with the square of the clock, as the voltage follows the
    clock under DVFS (CMOS dynamic power ~ C V^2 f; Weste and Harris, CMOS VLSI Design, 4th ed.,
    Sec. 5.1); energy per HBM byte does not (its clock is separate). ``seconds``: the phase's actual
    duration when something the clock does not set stretches it (a stream from a memory tier)."""
    seconds = np.maximum(phase_seconds(machine, work, clock) if seconds is None else seconds, 1e-30)
    dynamic = (work.flops / machine.flops(work.precision) * clock ** 2
               + machine.constants.power_memory_weight * work.hbm_bytes / machine.hbm_bytes_per_s) / seconds
    return machine.idle_w + (machine.tdp_w - machine.idle_w) * np.minimum(dynamic, 1.0)


def capped_phase(machine: Machine, work: PhaseWork, cap_w):
    """(slowdown s, power W, clock share) of a phase under a per-device power cap: the highest clock
    whose power stays within the cap (power rises with the clock: bisection), full clock where the
    phase already draws less. The slowdown is the time the lower clock adds, exactly 0 at full
    clock (and with ``cap_w`` None: no cap). The clock floor is 5% of full."""
    full = phase_seconds(machine, work, 1.0)
    if cap_w is None:
        return np.zeros_like(full), phase_power_w(machine, work), np.ones_like(full)
    lo, hi = np.full(np.shape(full), 0.05), np.ones(np.shape(full))
    under = phase_power_w(machine, work, hi) <= cap_w
    for _ in range(40):
        mid = (lo + hi) / 2.0
        ok = phase_power_w(machine, work, mid) <= cap_w
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    clock = np.where(under, 1.0, lo)
    slowdown = np.where(under, 0.0, np.maximum(phase_seconds(machine, work, clock) - full, 0.0))
    return slowdown, phase_power_w(machine, work, clock), clock


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
