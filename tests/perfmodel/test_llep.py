"""Least-loaded rerouting (LLEP, issue 33): every token computed somewhere, the busiest device never
above the static placement's, nothing moved below the threshold, deterministic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perfmodel.hardware_db.errors import SpecError
from perfmodel.llep import LlepRule, reroute_least_loaded

loads_strategy = st.lists(st.floats(0, 1e5, allow_nan=False), min_size=2, max_size=40)


@settings(max_examples=200, deadline=None)
@given(loads=loads_strategy, devices=st.integers(1, 9), capacity=st.floats(1, 3), min_tokens=st.floats(0, 5e4),
       threshold=st.floats(1, 2), seed=st.integers(0, 1000))
@example(loads=[10.0, 9.0, 1.0], devices=2, capacity=1.0, min_tokens=8.0, threshold=1.0, seed=0)
def test_rerouting_conserves_tokens_and_never_raises_the_busiest_device(loads, devices, capacity, min_tokens,
                                                                        threshold, seed):
    load = np.array(loads)
    home = np.random.default_rng(seed).integers(0, devices, len(load))
    rule = LlepRule(capacity=capacity, min_tokens=min_tokens, threshold=threshold)
    r = reroute_least_loaded(load, home, devices, rule)
    static = np.bincount(home, load, devices)
    assert r.device_load.sum() == pytest.approx(load.sum(), rel=1e-9, abs=1e-9)      # tokens in = tokens out
    assert r.device_load.max() <= static.max() * (1 + 1e-12) + 1e-9                 # never worse than static
    assert np.all(r.device_load >= -1e-9) and np.all(r.foreign >= 0)
    assert r.moved_tokens <= load.sum() + 1e-9
    if not r.rerouted:
        assert np.array_equal(r.device_load, static) and r.foreign.sum() == 0
    again = reroute_least_loaded(load, home, devices, rule)
    assert np.array_equal(again.device_load, r.device_load) and np.array_equal(again.foreign, r.foreign)


def test_one_hot_expert_spills_to_the_idle_devices():
    """95% of the tokens on expert 0 (LLEP's extreme case): with m = 0 and alpha = 1 every device ends
    at the mean, and each helper receives expert 0's weights once."""
    load = np.array([950.0] + [50.0 / 7] * 7)
    r = reroute_least_loaded(load, np.arange(8), 8, LlepRule(min_tokens=0.0))
    assert r.rerouted and r.device_load == pytest.approx(np.full(8, 125.0))
    assert r.foreign.tolist() == [0] + [1] * 7
    assert r.moved_tokens == pytest.approx(950.0 - 125.0)


def test_below_the_threshold_or_chunk_nothing_moves():
    load = np.array([12.0, 10.0, 9.0, 9.0])
    assert not reroute_least_loaded(load, np.arange(4), 4, LlepRule(threshold=1.3)).rerouted   # 12 / 10 < 1.3
    big_chunk = reroute_least_loaded(load * 100, np.arange(4), 4, LlepRule(threshold=1.0, min_tokens=1e6))
    assert big_chunk.rerouted and big_chunk.moved_tokens == 0


def test_rule_is_checked():
    with pytest.raises(SpecError):
        LlepRule(capacity=0.5)
    with pytest.raises(SpecError):
        LlepRule(threshold=0.9)
