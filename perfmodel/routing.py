"""Routing statistics of an MoE model: tokens per expert per layer, and transitions between layers.

``RoutingStats.loads`` is (layers x experts) token counts (each token counts once per expert it is
routed to, so a layer's total is tokens x top-k); ``transitions`` (optional, (layers - 1) x experts
x experts) counts tokens routed to expert i in layer l and to expert j in layer l + 1.

The synthetic generator draws skewed, correlated routing: expert popularity follows a Zipf law
with exponent ``zipf`` (p_e proportional to 1 / rank^s; rank order shuffled per layer), and a token
that used expert i in layer l reuses its "affine" expert a(i) in layer l + 1 with probability
``affinity``, else follows the next layer's popularity (the inter-layer locality ExFlow exploits:
Yao et al., "Exploiting Inter-Layer Expert Affinity for Accelerating MoE Inference", IPDPS 2024).
Seeded: the same arguments give the same statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.hardware_db.errors import SpecError


MAX_TOKENS = 1e15  # routed tokens of one expert in one layer: far above any measured batch, far below overflow
# Counts below a billionth of a token read as 0: they change no placement, and far below them
# (subnormal floats, 5e-324) sums and ratios lose their precision.
MIN_TOKENS = 1e-9


def _counts(value, what: str) -> np.ndarray:
    """Finite counts from 0 to MAX_TOKENS, those below MIN_TOKENS set to 0; else a one-line error."""
    counts = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(counts)) or np.any(counts < 0) or np.any(counts > MAX_TOKENS):
        raise SpecError(f"routing {what} need token counts from 0 to {MAX_TOKENS:g}")
    return np.where(counts < MIN_TOKENS, 0.0, counts)


@dataclass(frozen=True)
class RoutingStats:
    loads: np.ndarray                      # (layers, experts) tokens
    transitions: np.ndarray | None = None  # (layers - 1, experts, experts) tokens

    def __post_init__(self):
        loads = np.asarray(self.loads, dtype=float)
        if loads.ndim != 2 or loads.shape[0] < 1 or loads.shape[1] < 1:
            raise SpecError(f"routing loads need a (layers x experts) table, has shape {loads.shape}")
        loads = _counts(loads, "loads")
        object.__setattr__(self, "loads", loads)     # frozen: the validated counts, set once here
        per_layer = loads.sum(axis=1)
        if np.any(per_layer <= 0):
            raise SpecError(f"routing loads need tokens in every layer; layer {int(np.argmin(per_layer))} has none")
        if self.transitions is not None:
            t = np.asarray(self.transitions, dtype=float)
            expected = (loads.shape[0] - 1, loads.shape[1], loads.shape[1])
            if t.shape != expected:
                raise SpecError(f"routing transitions need shape {expected}, has {t.shape}")
            object.__setattr__(self, "transitions", _counts(t, "transitions"))

    @property
    def layers(self) -> int:
        return int(np.asarray(self.loads).shape[0])

    @property
    def experts(self) -> int:
        return int(np.asarray(self.loads).shape[1])


def zipf_routing(layers: int, experts: int, top_k: int, tokens: float, zipf: float, affinity: float,
                 seed: int = 0) -> RoutingStats:
    """Expected routing counts under a Zipf popularity per layer and inter-layer affinity."""
    if not (layers >= 1 and experts >= 1 and 1 <= top_k <= experts):
        raise SpecError(f"synthetic routing needs layers, experts >= 1 and 1 <= top_k <= experts, has "
                        f"{layers}, {experts}, {top_k}")
    if not (0 <= zipf <= 10 and 0 <= affinity <= 1 and 1 <= tokens <= MAX_TOKENS):
        raise SpecError(f"synthetic routing needs 0 <= zipf <= 10, 0 <= affinity <= 1 and 1 to {MAX_TOKENS:g} tokens; "
                        f"has {zipf:g}, {affinity:g}, {tokens:g}")
    if not 0 <= seed < 2**63:
        raise SpecError(f"--seed needs 0 to 2^63 - 1, has {seed}")
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, experts + 1) ** zipf
    base /= base.sum()
    popularity = np.stack([base[rng.permutation(experts)] for _ in range(layers)])
    routed = tokens * top_k
    loads = popularity * routed
    transitions = np.empty((layers - 1, experts, experts))
    for layer in range(layers - 1):
        partner = rng.permutation(experts)                 # a(i): the affine expert in the next layer
        stay = np.zeros((experts, experts))
        stay[np.arange(experts), partner] = 1.0
        follow = (1 - affinity) * popularity[layer + 1][None, :] + affinity * stay
        transitions[layer] = loads[layer][:, None] * follow
        # The next layer's loads are what arrives from this one.
        loads[layer + 1] = transitions[layer].sum(axis=0)
    return RoutingStats(loads=loads, transitions=transitions)


def read_routing(path: str, max_layers: int, max_experts: int) -> RoutingStats:
    """Routing statistics from a .json, .csv or .npz file (formats in the README), bounded by the
    model's shape before anything is allocated."""
    from perfmodel.hardware_db.routing_files import read_routing_counts

    loads, transitions = read_routing_counts(path, max_layers, max_experts, MAX_TOKENS)
    return RoutingStats(loads=loads, transitions=transitions)


def routing_for(spec, routing: str | None = None, zipf: float | None = None, affinity: float = 0.5, seed: int = 0,
                tokens_per_layer: float = 65536.0) -> RoutingStats | None:
    """The statistics a request asks for: a file (``routing``), synthetic (``zipf``), or None."""
    if routing is not None and zipf is not None:
        raise SpecError("give --routing or --zipf, not both")
    if not spec.moe:
        if routing is not None or zipf is not None:
            raise SpecError(f"{spec.name} has no routed experts; --routing and --zipf apply to MoE models")
        return None
    if routing is not None:
        stats = read_routing(routing, spec.moe_layers, spec.moe.num_experts)
    elif zipf is not None:
        stats = zipf_routing(spec.moe_layers, spec.moe.num_experts, spec.moe.top_k, tokens_per_layer, zipf, affinity,
                             seed)
    else:
        return None
    if stats.experts != spec.moe.num_experts:
        raise SpecError(f"routing statistics have {stats.experts} experts, {spec.name} has {spec.moe.num_experts}")
    if stats.layers != spec.moe_layers:
        raise SpecError(f"routing statistics have {stats.layers} MoE layers, {spec.name} has {spec.moe_layers}: "
                        "give one row of loads per MoE layer")
    return stats
