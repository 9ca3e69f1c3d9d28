"""Queueing formulas pinned to their closed forms (Kleinrock Vol. 1, Sec. 3.5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.queueing import erlang_c, pool_latencies, wait_quantile


def test_erlang_c_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)           # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)         # M/M/2 at a = 1
    assert erlang_c(3, 5.0) == 1.0                          # unstable
    big = erlang_c(np.array([1000.0, 100000.0]), np.array([900.0, 99000.0]))
    assert np.all((big > 0) & (big < 0.01))


def test_wait_quantile_mm1_closed_form():
    # M/M/1, mu = 1, lambda = 0.5: P(W > t) = 0.5 exp(-0.5 t) -> t_90 = ln(5) / 0.5.
    assert wait_quantile(1, 1.0, 0.5, 0.9) == pytest.approx(np.log(5) / 0.5)
    assert wait_quantile(1, 1.0, 0.5, 0.4) == 0.0          # most arrivals do not wait
    assert wait_quantile(2, 1.0, 3.0, 0.5) == np.inf        # unstable


def test_a_bigger_pool_never_waits_longer():
    s50 = np.array([0.5])
    waits = [pool_latencies("prefill", n, 10.0, 100.0, np.array([8.0]), np.array([1.0]), s50, s50,
                            np.array([0.02]), np.array([0.02]))[0][0.9][0] for n in (6, 8, 16, 64)]
    assert waits == sorted(waits, reverse=True) and np.isfinite(waits[0])


def test_colocated_time_sharing_stretches_both_phases():
    args = (10.0, 200.0, np.array([64.0]), np.array([1.0]), np.array([0.3]), np.array([0.5]), np.array([0.02]),
            np.array([0.03]))
    alone_prefill = pool_latencies("prefill", 8, *args)
    alone_decode = pool_latencies("decode", 8, *args)
    together = pool_latencies("colocated", 8, *args)
    assert together[0][0.9][0] > alone_prefill[0][0.9][0]
    assert together[2][0] > alone_decode[2][0]
    assert together[3][0] == pytest.approx(alone_prefill[3][0] + alone_decode[3][0])


def test_concurrency_converts_by_littles_law():
    from perfmodel.queueing import rate_from_concurrency

    # 100 users, each request taking 1 s + 500 x 20 ms = 11 s: 100 / 11 requests per second.
    assert rate_from_concurrency(100, 1.0, 0.02, 500) == pytest.approx(100 / 11)


def _erlang_c_scipy(servers, load):
    """The incomplete-gamma form (the formula erlang_c had before its quadrature): B = P(X = c) /
    P(X <= c), X ~ Poisson(a), with P(X <= c) = Q(c + 1, a) from SciPy."""
    from scipy.special import gammaincc, gammaln

    servers, load = np.broadcast_arrays(np.asarray(servers, dtype=float), np.asarray(load, dtype=float))
    with np.errstate(all="ignore"):
        log_pmf = servers * np.log(load) - load - gammaln(servers + 1)
        b = np.exp(log_pmf - np.log(np.maximum(gammaincc(servers + 1, load), 1e-300)))
        c = servers * b / (servers - load * (1 - b))
    return np.clip(c, 0.0, 1.0), log_pmf


def _grid():
    """Servers 1 .. 1e8 (counts: instances x attention ranks), loads from far below to just under saturation
    (a = c - k sqrt(c), k down to 1e-6) and a random spread."""
    servers, loads = [], []
    for c in [1, 2, 3, 4, 5, 7, 8, 10, 16, 33, 50, 64, 100, 257, 1000, 4096, 1e4, 3e4, 1e5, 1e6, 1e7, 1e8]:
        for k in [1e-6, 1e-3, 0.01, 0.1, 0.3, 0.5, 1, 1.5, 2, 3, 5, 7, 9]:
            if c - k * np.sqrt(c) > 0:
                servers.append(c)
                loads.append(c - k * np.sqrt(c))
        for r in [1e-3, 0.01, 0.1, 0.3, 0.5, 0.8, 0.9, 0.99, 0.999, 0.999999]:
            servers.append(c)
            loads.append(c * r)
    rng = np.random.default_rng(27)
    c = np.round(10 ** rng.uniform(0, 8, 4000))
    servers += c.tolist()
    loads += (c * rng.uniform(0.0, 1.0, 4000) ** 0.1).tolist()
    return np.array(servers), np.array(loads)


def test_erlang_c_agrees_with_the_incomplete_gamma_form():
    """The quadrature agrees with SciPy's incomplete-gamma form to 1e-9 relative wherever C > 1e-12.
    Above about 1e5 servers that form itself loses digits (its log-pmf is a difference of terms of
    size c ln a: 1.8e-7 relative at c = 1e8 against a 30-digit reference), so there the tolerance
    adds that form's rounding, 4 eps (|c ln a| + a + ln c!)."""
    from scipy.special import gammaln

    servers, loads = _grid()
    ours = erlang_c(servers, loads)
    theirs, _ = _erlang_c_scipy(servers, loads)
    shown = theirs > 1e-12
    assert shown.sum() > 1000
    rounding = 4 * np.finfo(float).eps * (np.abs(servers * np.log(loads)) + loads + gammaln(servers + 1))
    tol = 1e-9 + np.where(servers <= 1e5, 0.0, rounding)
    rel = np.abs(ours[shown] / theirs[shown] - 1)
    assert np.all(rel <= tol[shown]), (rel.max(), servers[shown][rel.argmax()], loads[shown][rel.argmax()])
    assert np.all(ours[~shown] <= 2e-12)
    assert np.all((ours >= 0) & (ours <= 1))
    # A fractional server count (the integral's continuation) is not a pool the search builds; near
    # zero load its integrand's u^c corner costs the fixed nodes digits, still within 1e-6.
    frac = np.array([2.5, 2.5, 2.5, 17.5, 17.5]), np.array([1.28e-1, 2.5e-3, 2.5e-2, 1.0, 12.0])
    assert erlang_c(*frac) == pytest.approx(_erlang_c_scipy(*frac)[0], rel=1e-6)


def test_erlang_c_matches_a_high_precision_reference():
    """Against 30-digit arithmetic (mpmath, when installed), 1e-10 relative from 1 to 1e8 servers."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    cases = [(1, 0.5), (2, 1.0), (7, 0.07), (5, 4.99), (100, 99.0), (1000, 968.4), (1e4, 9900.0), (1e5, 99700.0),
             (1e6, 998000.0), (1e8, 99970000.0), (1e8, 99999990.0)]
    for c, a in cases:
        B = 1 / (mpmath.e ** mpmath.mpf(a) * mpmath.mpf(a) ** (-c) * mpmath.gammainc(c + 1, a))
        exact = float(c * B / (c - a * (1 - B)))
        assert erlang_c(c, a) == pytest.approx(exact, rel=1e-10), (c, a)


def test_erlang_c_bound_is_an_upper_bound_and_waits_use_it_only_below_one_minus_q():
    from perfmodel.queueing import erlang_c_bound

    servers, loads = _grid()
    assert np.all(erlang_c_bound(servers, loads) >= erlang_c(servers, loads) * (1 - 1e-12))
    assert erlang_c_bound(3, 5.0) == 1.0 and erlang_c(3, 3.0) == 1.0
    # The quantile from the exact C everywhere is the one wait_quantile gives (bound where C <= 1 - q).
    service = 1.0
    for q in (0.5, 0.9, 0.99):
        c = erlang_c(servers, loads)
        slack = servers - loads
        exact = np.where(slack > 0, np.maximum(np.log(np.maximum(c / (1 - q), 1e-300)) / slack, 0.0), np.inf)
        assert np.array_equal(wait_quantile(servers, service, loads, q), exact)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5000), st.floats(0.01, 0.999), st.floats(1e-3, 10.0))
def test_the_bounded_wait_is_never_below_the_exact_one(servers, utilization, service_s):
    """wait_quantile without ``exact`` (Erlang C's cheap bound, what the serving search sizes pools
    with first) never reports a shorter wait than the exact one, at every quantile."""
    rate = utilization * servers / service_s
    exact = wait_quantile(servers, service_s, rate, (0.5, 0.9, 0.99))
    bound = wait_quantile(servers, service_s, rate, (0.5, 0.9, 0.99), exact=False)
    for q in exact:
        assert float(bound[q]) >= float(exact[q]) * (1 - 1e-12)
