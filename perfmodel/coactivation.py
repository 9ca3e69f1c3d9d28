"""Inter-layer expert co-activation measured from routing statistics, and a token-level routing
process that produces statistics with co-activation nobody typed in.

ExFlow (Yao et al., "Exploiting Inter-Layer Expert Affinity for Accelerating Mixture-of-Experts
Model Inference", IPDPS 2024, arXiv 2401.08383, Sec. III) observes that a token routed to expert i
in layer l is routed, far more often than chance, to a few experts of layer l + 1, and places those
experts together. The statistic it exploits is read here from the transition counts
``RoutingStats.transitions`` (T_l[i, j]: tokens at expert i in layer l and at expert j in l + 1):

- ``affinity``: the share of the tokens moving between layers that go to their expert's most
  likely successor, sum_l sum_i max_j T_l[i, j] / sum_l sum_ij T_l[i, j];
- ``independent``: the same share if each layer routed independently of the previous one (the
  next layer's most popular expert's share), the floor ``affinity`` is compared with;
- ``reach`` / ``reach_independent``: the same two shares for each expert's ``slots`` most likely
  successors (the experts one device holds), what a placement can keep on a device at most.

``routing_counts`` turns per-token expert choices into loads and transitions (a token with top-k
experts {i} in layer l and {j} in l + 1 adds 1/k to each of the k x k pairs, so each row of T sums
to the layer's loads and each column to the next layer's: tokens are conserved).
``latent_domain_routing`` is the seeded synthetic process of the shipped example file (README).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.hardware_db.errors import SpecError

from .routing import RoutingStats


@dataclass(frozen=True)
class Coactivation:
    """Inter-layer co-activation of a routing statistics file (shares of tokens, 0 to 1)."""

    affinity: float          # tokens going to their expert's most likely successor, of all moving between layers
    independent: float       # the same share were the layers routed independently (next layer's top expert)
    tokens_between_layers: float   # tokens moving between consecutive layers, all layer pairs summed
    slots: int = 1           # successors counted by ``reach``
    reach: float = 0.0       # tokens going to one of their expert's ``slots`` most likely successors
    reach_independent: float = 0.0   # the same were the layers independent (next layer's top ``slots``)

    @property
    def lift(self) -> float:
        """How many times more often a token follows its expert's favourite successor than chance."""
        return self.affinity / self.independent if self.independent > 0 else 1.0

    def as_dict(self) -> dict[str, float]:
        return {"affinity": self.affinity, "independent": self.independent, "lift": self.lift,
                "tokens_between_layers": self.tokens_between_layers, "slots": self.slots, "reach": self.reach,
                "reach_independent": self.reach_independent}


def _top_sum(values: np.ndarray, count: int) -> float:
    """Sum of the ``count`` largest entries along the last axis, summed over the rest."""
    count = min(max(int(count), 1), values.shape[-1])
    return float(np.sort(values, axis=-1)[..., values.shape[-1] - count:].sum())


def measure_coactivation(stats: RoutingStats, slots: int = 1) -> Coactivation | None:
    """The co-activation of ``stats`` (None without transition counts or with one layer);
    ``slots``: the successors ``reach`` counts (the experts one device holds)."""
    if stats.transitions is None or stats.layers < 2:
        return None
    t = np.asarray(stats.transitions, dtype=float)
    total = float(t.sum())
    if total <= 0:
        return None
    followed = float(t.max(axis=2).sum())
    # Independent layers: every token reaches j in l + 1 with p_l+1(j), so the favourite successor of
    # every expert is the next layer's busiest expert, and sum_i load_i max_j p(j) = max_j arriving_j.
    arriving = t.sum(axis=1)                               # (layers - 1, experts): tokens reaching layer l + 1
    independent = float(arriving.max(axis=1).sum()) / total
    return Coactivation(affinity=followed / total, independent=independent, tokens_between_layers=total,
                        slots=int(slots), reach=_top_sum(t, slots) / total,
                        reach_independent=_top_sum(arriving, slots) / total)


def routing_counts(choices: np.ndarray, experts: int) -> RoutingStats:
    """Loads and transitions of per-token choices ((layers x tokens x top_k) expert ids)."""
    c = np.asarray(choices)
    if c.ndim != 3 or c.size == 0 or c.min() < 0 or c.max() >= experts:
        raise SpecError(f"routing choices need (layers x tokens x top_k) expert ids below {experts}")
    layers, tokens, k = c.shape
    loads = np.stack([np.bincount(c[l].ravel(), minlength=experts) for l in range(layers)]).astype(float)
    transitions = np.zeros((layers - 1, experts, experts))
    for l in range(layers - 1):
        pairs = (c[l][:, :, None] * experts + c[l + 1][:, None, :]).ravel()
        transitions[l] = np.bincount(pairs, minlength=experts * experts).reshape(experts, experts) / k
    return RoutingStats(loads=loads, transitions=transitions)


def latent_domain_routing(layers: int, experts: int, top_k: int, tokens: int, domains: int = 32,
                          domain_zipf: float = 1.0, preference: float = 1.5, popularity: float = 0.75,
                          noise: float = 1.0, seed: int = 0) -> RoutingStats:
    """Synthetic routing from a token-level process (no affinity parameter): each of ``tokens``
    tokens belongs to one of ``domains`` latent domains (domain d drawn with weight 1 / (d + 1) **
    domain_zipf); in each layer a token's router logits are its domain's preference for every
    expert (normal, standard deviation ``preference``, drawn once per layer and domain) plus the
    layer's expert popularity (normal, ``popularity``) plus its own noise (normal, ``noise``), and
    it takes the ``top_k`` largest. Co-activation across layers comes only from the shared domain;
    it is measured afterwards (``measure_coactivation``), never set. Seeded: the same arguments
    give the same counts."""
    if not (layers >= 2 and experts >= 1 and 1 <= top_k <= experts and tokens >= 1 and domains >= 1):
        raise SpecError("latent-domain routing needs layers >= 2, experts >= 1, 1 <= top_k <= experts, tokens and "
                        "domains >= 1")
    rng = np.random.default_rng(seed)
    weight = 1.0 / np.arange(1, domains + 1) ** domain_zipf
    domain = rng.choice(domains, size=tokens, p=weight / weight.sum())
    choices = np.empty((layers, tokens, top_k), dtype=np.int64)
    for l in range(layers):
        prefer = rng.normal(0.0, preference, (domains, experts)) + rng.normal(0.0, popularity, experts)[None, :]
        logits = prefer[domain] + rng.normal(0.0, noise, (tokens, experts))
        choices[l] = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    return routing_counts(choices, experts)
