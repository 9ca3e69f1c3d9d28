"""Queueing formulas pinned to their closed forms (Kleinrock Vol. 1, Sec. 3.5)."""

from __future__ import annotations

import numpy as np
import pytest

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
