"""Power of running devices, vectorized over plans (what it costs: perfmodel.economics).

Device power rises linearly from idle to TDP with the fraction of time it is busy (Fan, Weber and
Barroso, "Power Provisioning for a Warehouse-Sized Computer", ISCA 2007, Sec. 4.1: P(u) =
P_idle + (P_busy - P_idle) u); a power cap lowers the core clock of a phase until it fits. All
constants are named in the database (``constants``) with their sources and can be overridden there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .machine import Machine


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
