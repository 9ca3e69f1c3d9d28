"""Least-loaded expert parallelism (LLEP): a batch's excess tokens rerouted, with their expert's
weights, from overloaded devices to the least-loaded ones.

Nguyen, Pandit, Xu, Xiong and Joty, "Least-Loaded Expert Parallelism: Load Balancing An Imbalanced
Mixture-of-Experts", arXiv 2601.17111 (2026); code: github.com/SalesforceAIResearch/LeastLoadedEP.
The paper's knobs: a capacity factor alpha (a device takes up to alpha x the mean device's tokens),
a minimum chunk m (a spill smaller than m tokens is not worth its weight transfer) and an imbalance
threshold lambda (below max / mean = lambda the layer runs as standard EP); the repository's example
runs alpha 1.0, m 1,024 and lambda 1.3 (``max_tokens_factor``, ``min_tokens_per_gemm``,
``MOE_ADAPTIVE_LPT_ROUTING_RATIO``), the defaults here.

The rule as modelled here (our reading of the paper's least-loaded assignment, written from its
description, not its code), per layer and per batch, on the static placement's homes (standard EP:
contiguous experts, one copy each):

1. If the busiest device's tokens are below lambda x the mean device's, nothing moves.
2. Each expert, heaviest first, keeps on its home device what fits under the capacity
   C = alpha x mean (devices' tokens so far counted).
3. Each expert's excess, heaviest first, goes in chunks to the least-loaded device (other than
   those already computing that expert), each chunk filling that device up to C, or m tokens if
   more, and only while the receiver ends below what the home would carry; an excess below m (or
   one no device has room for) stays at home, over C. So the busiest device never carries more
   than under the static placement, and every token is computed somewhere (tested).

Assumptions: the routing (which experts a token uses) is unchanged, as in LLEP; a device that
computes a foreign expert receives its weights for that batch (``foreign`` counts them: the memory
and the transfer LLEP pays instead of permanent replicas); the token exchange is the static
placement's (a rerouted token crosses devices either way); the weight transfer is not overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.hardware_db.errors import SpecError

from .defaults import LLEP_DEFAULTS

LLEP_CAPACITY = LLEP_DEFAULTS["capacity"]        # alpha (max_tokens_factor)
LLEP_MIN_TOKENS = LLEP_DEFAULTS["min_tokens"]    # m (min_tokens_per_gemm)
LLEP_THRESHOLD = LLEP_DEFAULTS["threshold"]      # lambda (MOE_ADAPTIVE_LPT_ROUTING_RATIO)


@dataclass(frozen=True)
class LlepRule:
    """LLEP's knobs (see the module docstring)."""

    capacity: float = LLEP_CAPACITY        # alpha, >= 1: a device's tokens up to alpha x mean
    min_tokens: float = LLEP_MIN_TOKENS    # m: the smallest spill worth a weight transfer, tokens
    threshold: float = LLEP_THRESHOLD      # lambda, >= 1: reroute only when busiest / mean reaches it

    def __post_init__(self):
        if not (1.0 <= self.capacity <= 100 and 0 <= self.min_tokens <= 1e15 and 1.0 <= self.threshold <= 100):
            raise SpecError(f"least-loaded rerouting needs a capacity and a threshold from 1 to 100 and a minimum "
                            f"chunk from 0 to 1e15 tokens; has {self.capacity:g}, {self.threshold:g}, "
                            f"{self.min_tokens:g}")


@dataclass(frozen=True, eq=False)
class Rerouted:
    """One layer's batch after least-loaded rerouting."""

    device_load: np.ndarray      # (devices,) tokens each device computes
    foreign: np.ndarray          # (devices,) experts whose weights a device receives for this batch
    moved_tokens: float          # tokens computed away from their expert's home
    rerouted: bool               # False: below the threshold, standard EP


def reroute_least_loaded(expert_tokens, home, devices: int, rule: LlepRule = LlepRule()) -> Rerouted:
    """LLEP's least-loaded assignment of one layer (module docstring): ``expert_tokens`` (experts,)
    tokens routed to each expert, ``home`` (experts,) the device holding each."""
    load = np.asarray(expert_tokens, dtype=float)
    home = np.asarray(home, dtype=int)
    static = np.bincount(home, load, devices)
    mean = float(load.sum()) / devices
    none = np.zeros(devices, dtype=int)
    if mean <= 0 or static.max() < rule.threshold * mean:
        return Rerouted(static, none, 0.0, False)
    cap = rule.capacity * mean
    device_load = np.zeros(devices)
    order = np.lexsort((np.arange(len(load)), -load))          # heaviest first, lowest id on ties
    excess = np.zeros(len(load))
    for e in order.tolist():
        kept = min(load[e], max(cap - device_load[home[e]], 0.0))
        device_load[home[e]] += kept
        excess[e] = load[e] - kept
    foreign = np.zeros(devices, dtype=int)
    moved = 0.0
    for e in order.tolist():
        left = excess[e]
        used = np.zeros(devices, dtype=bool)
        used[home[e]] = True
        while left > 0 and left >= rule.min_tokens and not used.all():
            d = int(np.argmin(np.where(used, np.inf, device_load)))
            room = cap - device_load[d]
            if room <= 0:
                break
            chunk = min(left, max(room, rule.min_tokens))
            if device_load[d] + chunk >= device_load[home[e]] + left:
                break                                         # the spill would not lower the busier side
            device_load[d] += chunk
            foreign[d] += 1
            used[d] = True
            left -= chunk
            moved += chunk
        device_load[home[e]] += left
    return Rerouted(device_load, foreign, moved, True)


def expert_weight_bytes(spec, weight_bytes: float = 2.0) -> float:
    """One routed expert's weights (gate, up and down projections), bytes."""
    return float(spec.expert_params) * weight_bytes


def row_bytes(spec, act_bytes: float = 2.0) -> float:
    """Working memory of one token-expert row in the expert GEMMs, bytes: its input and output
    (hidden each) and the gate, up and activated intermediates (expert width each)."""
    return act_bytes * (2.0 * spec.hidden_size + 3.0 * spec.moe.expert_ffn_hidden_size)
