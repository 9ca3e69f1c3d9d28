"""Co-activation measured from routing statistics (issue 33): a hand count on a tiny file, tokens
conserved by the per-token counts, and a synthetic process whose affinity nobody sets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.coactivation import latent_domain_routing, measure_coactivation, routing_counts
from perfmodel.routing import RoutingStats, read_routing, zipf_routing


def test_affinity_of_a_tiny_file_equals_a_hand_count(tmp_path):
    # 3 layers x 3 experts; layer pair 0 -> 1 and 1 -> 2.
    t01 = [[6, 1, 1], [0, 2, 2], [1, 0, 3]]      # row maxima 6, 2, 3: 11 of 16
    t12 = [[2, 2, 1], [1, 0, 2], [0, 5, 3]]      # row maxima 2, 2, 5: 9 of 16
    loads = [[8, 4, 4], [7, 3, 6], [3, 7, 6]]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"loads": loads, "transitions": [t01, t12]}))
    stats = read_routing(str(path), 3, 3)
    c = measure_coactivation(stats)
    assert c.affinity == pytest.approx((11 + 9) / 32)
    # Independent layers: each pair's busiest next-layer expert (7 of 16, then 7 of 16).
    assert c.independent == pytest.approx((7 + 7) / 32)
    assert c.tokens_between_layers == 32
    two = measure_coactivation(stats, slots=2)         # the two largest of each row
    assert two.reach == pytest.approx(((6 + 1) + (2 + 2) + (3 + 1) + (2 + 2) + (2 + 1) + (5 + 3)) / 32)
    assert two.reach_independent == pytest.approx(((7 + 6) + (7 + 6)) / 32)


def test_no_transitions_no_coactivation():
    assert measure_coactivation(RoutingStats(loads=np.ones((4, 8)))) is None
    assert measure_coactivation(RoutingStats(loads=np.ones((1, 8)), transitions=np.zeros((0, 8, 8)))) is None


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(2, 5), experts=st.integers(2, 9), tokens=st.integers(1, 60), k=st.integers(1, 3),
       seed=st.integers(0, 10_000))
def test_per_token_counts_conserve_tokens(layers, experts, tokens, k, seed):
    """Each row of T sums to the layer's loads and each column to the next layer's (tokens in =
    tokens out), and the shares stay in [0, 1] with reach >= affinity."""
    k = min(k, experts)
    rng = np.random.default_rng(seed)
    choices = np.stack([np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]) for _ in range(layers)])
    stats = routing_counts(choices, experts)
    assert stats.loads.sum(axis=1) == pytest.approx(np.full(layers, tokens * k))
    for l in range(layers - 1):
        assert stats.transitions[l].sum(axis=1) == pytest.approx(stats.loads[l])
        assert stats.transitions[l].sum(axis=0) == pytest.approx(stats.loads[l + 1])
    c = measure_coactivation(stats, slots=2)
    assert 0 < c.independent <= 1 and 0 < c.affinity <= 1
    assert c.affinity <= c.reach + 1e-12 <= 1 + 1e-12


def test_zipf_generator_affinity_is_measured_at_least_its_parameter():
    """zipf_routing sends a share ``affinity`` of each expert's tokens to one partner: the measured
    favourite-successor share is at least that, plus what popularity adds (not the flag handed back)."""
    for affinity in (0.0, 0.5, 0.9):
        c = measure_coactivation(zipf_routing(6, 16, 2, 4096, 1.0, affinity, seed=3))
        assert c.affinity >= affinity - 1e-12
        assert c.affinity > affinity or affinity == 1.0


def test_latent_domain_routing_is_seeded_and_coactivated():
    a = latent_domain_routing(4, 16, 2, 2000, seed=7)
    b = latent_domain_routing(4, 16, 2, 2000, seed=7)
    assert np.array_equal(a.loads, b.loads) and np.array_equal(a.transitions, b.transitions)
    c = measure_coactivation(a)
    assert c.lift > 1.05                       # the shared domain links the layers
    flat = measure_coactivation(latent_domain_routing(4, 16, 2, 2000, domains=1, seed=7))
    assert flat.lift < c.lift                  # one domain: only each token's noise, layers nearly independent
