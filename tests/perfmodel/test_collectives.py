"""Collective costs pinned to their alpha-beta formulas and mapped onto topology levels."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.collectives import (Topology, all_gather_time, all_to_all_time, p2p_time, reduce_scatter_time,
                                   ring_all_reduce_time, tree_all_reduce_time)
from perfmodel.machine import build_machine

S, B, A = 1e9, 100e9, 5e-6


def test_ring_formulas_match_thakur_et_al():
    n = 8
    assert reduce_scatter_time(S, n, B, A) == pytest.approx(7 * A + 7 / 8 * S / B)
    assert all_gather_time(S, n, B, A) == pytest.approx(7 * A + 7 / 8 * S / B)
    assert ring_all_reduce_time(S, n, B, A) == pytest.approx(2 * 7 * A + 2 * 7 / 8 * S / B)
    assert ring_all_reduce_time(S, n, B, A) == pytest.approx(reduce_scatter_time(S, n, B, A) + all_gather_time(S, n, B, A))
    assert tree_all_reduce_time(S, n, B, A) == pytest.approx(2 * 3 * A + 2 * S / B)
    assert all_to_all_time(S, n, B, A) == pytest.approx(7 * A + 7 / 8 * S / B)
    assert p2p_time(S, B, A) == pytest.approx(A + S / B)


def test_one_device_costs_nothing():
    for f in (reduce_scatter_time, all_gather_time, ring_all_reduce_time, tree_all_reduce_time, all_to_all_time):
        assert f(S, 1, B, A) == 0.0


def test_vectorized_over_group_sizes():
    n = np.array([1, 2, 4, 8])
    np.testing.assert_allclose(ring_all_reduce_time(S, n, B, A),
                               [ring_all_reduce_time(S, int(k), B, A) for k in n])


TOPO = Topology(names=("nvlink", "ib"), sizes=np.array([8.0, 64.0]), bw=np.array([400e9, 50e9]),
                lat=np.array([2e-6, 5e-6]))


def test_groups_pay_the_slowest_level_they_cross():
    assert TOPO.level_of(1, 8) == 0          # TP 8 inside a node
    assert TOPO.level_of(1, 16) == 1         # 16 consecutive ranks cross nodes
    assert TOPO.level_of(8, 8) == 1          # one rank per node
    assert TOPO.link(1, 4) == (400e9, 2e-6)


def test_hierarchical_all_reduce_beats_flat_across_nodes():
    flat = ring_all_reduce_time(S, 64, 50e9, 5e-6)
    assert TOPO.all_reduce(S, 1, 64) < flat
    # Inside one level it is the best of ring and tree there.
    assert TOPO.all_reduce(S, 1, 8) == pytest.approx(min(ring_all_reduce_time(S, 8, 400e9, 2e-6),
                                                         tree_all_reduce_time(S, 8, 400e9, 2e-6)))
    assert TOPO.all_reduce(S, 1, 1) == 0.0


def test_moe_all_to_all_dedups_copies_across_nodes():
    token_bytes, k = 1e8, 8
    hier = TOPO.moe_all_to_all(token_bytes, k, 1, 64)
    flat = all_to_all_time(token_bytes * k, 64, 50e9, 5e-6)
    assert hier < flat
    # Inside one node it is the plain all-to-all of k copies.
    assert TOPO.moe_all_to_all(token_bytes, k, 1, 8) == pytest.approx(all_to_all_time(token_bytes * k, 8, 400e9, 2e-6))


def test_frontier_levels(db):
    topo = build_machine(db, "frontier", 8 * 256).topology
    assert topo.level_of(1, 2) == 0      # two GCDs of one MI250X
    assert topo.level_of(1, 8) == 1      # one node
    assert topo.level_of(8, 16) == 2     # across nodes inside a dragonfly group
    assert topo.level_of(1, 2048) == 3   # across dragonfly groups
    times = [float(topo.all_reduce(S, 1, n)) for n in (2, 8, 1024, 2048)]
    assert times == sorted(times)
