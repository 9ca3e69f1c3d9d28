"""Power oversubscription from the distribution of a fleet's power, not its peak (POLCA: Patel et al.,
"POLCA: Power Oversubscription in LLM Cloud Providers", arXiv:2308.12908, 2024).

A facility's power budget is provisioned for D devices at their TDP, each with its share of the node.
Inference servers rarely all draw TDP at once, so the budget holds more devices than D if the rare
moments their total exceeds it are capped. How many more follows from the distribution of the
total, under a stated risk: the share of time the facility may need to cap.

Each serving instance is, at any moment, in one of a few states (prefilling, decoding, idle) with the
share of its time the queueing model gives each (perfmodel.queueing.pool_shares), drawing that
state's power (perfmodel.power: its devices and their node share). Instances are taken as
independent: each one's state follows its own queue of Poisson arrivals. Load that rises and falls
together across the facility (the diurnal cycle) correlates them; a lower risk covers it. The
total's distribution is the convolution of the instances' (Feller, An Introduction to Probability
Theory, Vol. 1, Ch. XI), computed exactly on a grid of watts by the FFT, each state's power rounded
up to the grid, so the probability of exceeding the budget is never understated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from perfmodel.hardware_db.errors import SpecError

GRID_POINTS = 2 ** 20      # bins of the total's distribution (each state's power rounded up to one)


@dataclass(frozen=True)
class InstancePower:
    """One instance's draw in each of its states (W: its devices with their node share) and the
    share of its time in each (summing to 1)."""

    watts: tuple[float, ...]
    shares: tuple[float, ...]

    def __post_init__(self):
        shares = np.asarray(self.shares, dtype=float)
        if len(self.watts) != len(shares) or not np.all(np.isfinite(self.watts)) or min(self.watts) < 0 \
                or np.any(shares < 0) or not math.isclose(float(shares.sum()), 1.0, abs_tol=1e-9):
            raise SpecError("an instance's power states need finite watts >= 0 and time shares >= 0 summing to 1")

    @property
    def mean_w(self) -> float:
        return float(np.dot(self.watts, self.shares))


def exceed_probability(fleet: Sequence[tuple[InstancePower, int]], budget_w: float) -> float:
    """P(the fleet's total power > ``budget_w``): ``fleet`` lists (an instance's states, how many such
    independent instances)."""
    fleet = [(p, int(n)) for p, n in fleet if n > 0]
    top = sum(max(p.watts) * n for p, n in fleet)
    if top <= budget_w:
        return 0.0
    if sum(min(p.watts) * n for p, n in fleet) > budget_w:
        return 1.0
    grid = top / (GRID_POINTS - 1)
    size = 1 << int(math.ceil(math.log2(GRID_POINTS + 1)))
    spectrum = np.ones(size // 2 + 1, dtype=complex)
    for power, count in fleet:
        bins = np.ceil(np.asarray(power.watts) / grid - 1e-9).astype(int)
        pmf = np.zeros(int(bins.max()) + 1)
        np.add.at(pmf, bins, power.shares)
        spectrum *= np.fft.rfft(pmf, size) ** count
    total = np.clip(np.fft.irfft(spectrum, size), 0.0, None)
    above = int(math.floor(budget_w / grid)) + 1            # bins whose power exceeds the budget
    return float(min(total[above:].sum() / total.sum(), 1.0))


def copies_held(deployment: Sequence[tuple[InstancePower, int]], budget_w: float, risk: float) -> int:
    """The most copies of ``deployment`` (its instances' states and counts) whose total power exceeds
    ``budget_w`` with probability at most ``risk``. One more copy never lowers the total, so the
    probability rises with the copies: the search starts where the normal approximation of the total
    (its exact mean and variance) puts the answer and steps one copy at a time on the exact
    probability until the bracket closes."""
    if not 0 < risk < 1:
        raise SpecError(f"the capping risk needs a probability between 0 and 1, has {risk:g}")
    mean = sum(p.mean_w * n for p, n in deployment)
    variance = max(sum((float(np.dot(np.square(p.watts), p.shares)) - p.mean_w ** 2) * n for p, n in deployment), 0.0)
    if mean <= 0:
        raise SpecError("a deployment drawing no power has no power budget to share")
    z, sd = NormalDist().inv_cdf(1.0 - risk), math.sqrt(variance)
    # m mean + z sqrt(m) sd = budget, solved for sqrt(m).
    root = (-z * sd + math.sqrt(z * z * variance + 4.0 * mean * budget_w)) / (2.0 * mean)
    copies = max(int(root * root), 0)

    def holds(m: int) -> bool:
        return m == 0 or exceed_probability([(p, n * m) for p, n in deployment], budget_w) <= risk

    if holds(copies):
        while holds(copies + 1):
            copies += 1
        return copies
    while not holds(copies - 1):
        copies -= 1
    return copies - 1
