"""Power oversubscription from the fleet's power distribution (perfmodel.oversubscription): the
probability a fleet exceeds its budget is the exact tail of its total, and the copies a budget
holds are the most whose tail stays within the risk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from perfmodel.hardware_db.errors import SpecError
from perfmodel.oversubscription import InstancePower, copies_held, exceed_probability

BUSY_IDLE = InstancePower((1000.0, 200.0), (0.6, 0.4))


@pytest.mark.parametrize("budget", [65_000.5, 70_000.5, 75_000.5, 79_990.5])
def test_the_tail_is_the_binomial_one(budget):
    """100 two-state instances: the total is 200 n + 800 k with k binomial; the grid rounds each state up
    by less than 0.4 W, so away from a state boundary the tail is exact."""
    k = np.arange(101)
    exact = binom.pmf(k, 100, 0.6)[200 * 100 + 800 * k > budget].sum()
    assert exceed_probability([(BUSY_IDLE, 100)], budget) == pytest.approx(exact, abs=1e-9)


def test_copies_held_is_the_largest_within_the_risk():
    deployment = [(BUSY_IDLE, 3), (InstancePower((2500.0, 1300.0, 800.0), (0.2, 0.5, 0.3)), 2)]
    budget, risk = 400_000.0, 0.01
    held = copies_held(deployment, budget, risk)
    at = lambda m: exceed_probability([(p, n * m) for p, n in deployment], budget)  # noqa: E731
    assert at(held) <= risk < at(held + 1)
    # Below the peak's count nothing can exceed; the mean alone caps what a budget can hold.
    peak = sum(max(p.watts) * n for p, n in deployment)
    mean = sum(p.mean_w * n for p, n in deployment)
    assert budget // peak <= held <= budget // mean


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(1, 40), st.floats(50.0, 2000.0), st.floats(10_000.0, 60_000.0))
def test_more_instances_or_less_budget_never_lower_the_tail(busy, count, watts, budget):
    states = InstancePower((watts, 0.3 * watts), (busy, 1.0 - busy))
    p = exceed_probability([(states, count)], budget)
    assert 0.0 <= p <= 1.0
    assert exceed_probability([(states, count + 1)], budget) >= p - 1e-9
    assert exceed_probability([(states, count)], 0.9 * budget) >= p - 1e-9


def test_bad_states_and_risks_are_one_line_errors():
    with pytest.raises(SpecError):
        InstancePower((100.0, 10.0), (0.7, 0.7))
    with pytest.raises(SpecError):
        copies_held([(BUSY_IDLE, 1)], 10_000.0, 1.5)
