"""perfmodel.feasibility.FirstBroken: each plan keeps the first rule it breaks (code 1 + the rule's
index, 0 where none breaks) with that rule's shortfall; later rules never overwrite it, every rule
checked is named in order, and ``binding`` is an array of names at every shape, 0-d included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.feasibility import FirstBroken


def test_first_broken_rule_wins_and_keeps_its_shortfall():
    acc = FirstBroken((4,))
    acc.rule(np.array([False, True, False, False]), "devices", np.array([0.0, 8.0, 0.0, 0.0]))
    acc.rule(np.array([False, True, True, False]), "divisible", np.array([0.0, 3.0, 5.0, 0.0]))
    acc.rule(np.array([True, True, True, False]), "memory", 2.5)  # a scalar amount broadcasts
    np.testing.assert_array_equal(acc.code, [3, 1, 2, 0])
    np.testing.assert_array_equal(acc.shortfall, [2.5, 8.0, 5.0, 0.0])
    assert acc.names == ["devices", "divisible", "memory"]
    assert acc.binding.tolist() == ["memory", "devices", "divisible", ""]
    assert acc.code.dtype == np.int16


def test_a_rule_that_holds_everywhere_is_still_named_and_counted():
    """The early return for a rule broken nowhere must still advance the index: the next rule's code is 2."""
    acc = FirstBroken((3,))
    acc.rule(np.zeros(3, dtype=bool), "devices", 99.0)
    acc.rule(np.array([False, True, False]), "memory", np.array([0.0, 1e9, 0.0]))
    assert acc.names == ["devices", "memory"]
    np.testing.assert_array_equal(acc.code, [0, 2, 0])
    np.testing.assert_array_equal(acc.shortfall, [0.0, 1e9, 0.0])
    assert acc.binding.tolist() == ["", "memory", ""]


def test_nothing_broken_leaves_zero_codes_and_empty_names():
    acc = FirstBroken((2, 3))
    for name in ("a", "b", "c"):
        acc.rule(np.zeros((2, 3), dtype=bool), name, 1.0)
    assert not acc.code.any() and not acc.shortfall.any()
    assert acc.binding.shape == (2, 3) and set(acc.binding.ravel()) == {""}


@pytest.mark.parametrize("shape", [(), (0,), (1,), (5,), (2, 3), (2, 1, 4)])
def test_binding_is_an_array_of_the_plans_shape(shape):
    acc = FirstBroken(shape)
    acc.rule(np.ones(shape, dtype=bool), "only", np.full(shape, 7.0))
    binding = acc.binding
    assert isinstance(binding, np.ndarray) and binding.shape == shape
    assert all(name == "only" for name in binding.ravel())
    assert np.shape(acc.code) == shape and np.shape(acc.shortfall) == shape


def test_zero_d_plan_takes_scalar_rules():
    acc = FirstBroken(())
    acc.rule(False, "devices", 1.0)
    acc.rule(True, "memory", 4.0)
    acc.rule(True, "later", 9.0)
    assert int(acc.code) == 2 and float(acc.shortfall) == 4.0
    assert acc.binding.ndim == 0 and acc.binding.item() == "memory"


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.lists(
    st.tuples(st.lists(st.booleans(), min_size=n, max_size=n),
              st.lists(st.floats(0.0, 1e12, allow_nan=False), min_size=n, max_size=n)),
    min_size=0, max_size=6)))
def test_matches_a_plan_by_plan_reference(rules):
    """Against a per-plan loop: the code and shortfall of the first True, in the order checked."""
    n = len(rules[0][0]) if rules else 3
    acc = FirstBroken((n,))
    for k, (broken, amount) in enumerate(rules):
        acc.rule(np.array(broken), f"rule{k}", np.array(amount))
    for i in range(n):
        first = next((k for k, (broken, _) in enumerate(rules) if broken[i]), None)
        assert acc.code[i] == (0 if first is None else first + 1)
        assert acc.shortfall[i] == (0.0 if first is None else rules[first][1][i])
        assert acc.binding[i] == ("" if first is None else f"rule{first}")
    assert acc.names == [f"rule{k}" for k in range(len(rules))]
