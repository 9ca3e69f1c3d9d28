"""Expert-parallel load balancing (EPLB): redundant experts and their packing onto devices.

An MoE layer's expert GEMMs (and its dispatch and combine) wait for the busiest expert-parallel
device, so what a plan pays is the busiest device's tokens over the mean device's: ``imbalance``.
This module computes it from routing statistics (tokens per expert per layer) and the placement
DeepSeek's open-source load balancer makes of them (github.com/deepseek-ai/EPLB, ``eplb.py``,
described in DeepSeek-V3 Technical Report, arXiv 2412.19437, Sec. 3.4.1 and 3.4.2; written here
from that description, not copied):

1. **Replicate.** ``redundant`` extra copies, one at a time, each to the expert with the most tokens
   per copy; an expert's tokens split evenly over its copies (``replicate``: water-filling).
2. **Pack.** Copies heaviest first, each onto the lightest device that still has a free slot, every
   device getting exactly ``slots`` copies (``balanced_packing``; greedy longest-first, Graham 1969).

Policies (EPLB's ``rebalance_experts``):

- **hierarchical** (when the expert groups divide among the nodes; EPLB's prefill policy): whole
  expert groups packed onto nodes first (so group-limited routing keeps its tokens in few nodes),
  then steps 1 and 2 inside each node over its devices;
- **global** (otherwise; EPLB's decode policy): steps 1 and 2 over all devices at once.

Unlike ``search.placement`` (CP-SAT, distinct devices per copy, inter-layer affinity), EPLB is what
the engines run (SGLang ``--enable-eplb --ep-num-redundant-experts``, vLLM ``--enable-eplb``), so
it is the rule every plan's busiest device comes from.

Default routing when no statistics are given (``power_law_loads``): aiconfigurator's power law, the
distribution its measured MoE kernel tables are collected under (ai-dynamo/aiconfigurator,
``collector/helper.py``, ``sample_power_law`` and ``_generate_power_law_distribution``): each
expert's tokens drawn from the density p(x) proportional to x^-alpha on [1, 0.8 N] (N tokens, when
N x top-k exceeds the experts; else on [0.01, 2]), scaled to N x top-k routed tokens; alpha 1.2 is
its default for MoE models (``aiconfigurator_core.sdk.models.moe``, ``_power_law_alpha``). Here the
draws are replaced by the distribution's quantiles at (i + 1/2) / E, so the same inputs give the same
loads (a typical draw, not a random one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from perfmodel.hardware_db.errors import SpecError

from .kernels import sorted_distinct
from .plan import EXPERT_BALANCES

POLICIES = ("global", "hierarchical")
# The largest batch aiconfigurator's power-law rows measure (aiconfigurator_core 0.12.0, trtllm
# 1.3.0rc20 moe_perf.parquet on h100_sxm: num_tokens 1 to 16,384 for power_law_1.01, power_law_1.2
# and balanced). Its x_max = 0.8 N grows the skew without bound; above this batch the shares of
# the 16,384-token distribution are kept (the distribution is not extrapolated past its data).
POWER_LAW_MAX_TOKENS = 16384


def power_law_loads(experts: int, top_k: int, tokens, alpha: float) -> np.ndarray:
    """(len(tokens) x experts) routed tokens per expert under aiconfigurator's power law (see the
    module docstring): quantiles (i + 1/2) / E of p(x) ~ x^-alpha on [x_min, x_max], by its inverse
    CDF x(u) = ((x_max^(1-a) - x_min^(1-a)) u + x_min^(1-a))^(1/(1-a)) (a = 1: x_min (x_max/x_min)^u),
    scaled to tokens x top_k per row and capped at N tokens per expert (``_capped``); above
    POWER_LAW_MAX_TOKENS the shape is that of POWER_LAW_MAX_TOKENS tokens. Expert ids take
    the quantiles in a fixed shuffled order (seed 0), so contiguous expert groups are not sorted by
    load."""
    if not (experts >= 1 and 1 <= top_k <= experts and 0 <= alpha <= 10):
        raise SpecError(f"power-law routing needs experts >= 1, 1 <= top_k <= experts and 0 <= alpha <= 10; has "
                        f"{experts}, {top_k}, {alpha:g}")
    n = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1.0)[:, None]
    shape_n = np.minimum(n, POWER_LAW_MAX_TOKENS)
    many = shape_n * top_k > experts
    x_min = np.where(many, 1.0, 0.01)
    x_max = np.where(many, np.maximum(0.8 * shape_n, 1.0 + 1e-9), 2.0)
    u = ((np.arange(experts) + 0.5) / experts)[None, :]
    if abs(alpha - 1.0) < 1e-9:
        x = x_min * (x_max / x_min) ** u
    else:
        b = 1.0 - alpha
        x = ((x_max ** b - x_min ** b) * u + x_min ** b) ** (1.0 / b)
    x = np.ascontiguousarray(x[:, _expert_order(experts)])   # C order: row sums do not depend on the batch
    return _capped(x / x.sum(axis=1, keepdims=True) * n * top_k, n)


@lru_cache(maxsize=64)
def _expert_order(experts: int) -> np.ndarray:
    """The fixed shuffled order in which expert ids take the power law's quantiles (seed 0)."""
    order = np.random.default_rng(0).permutation(experts)
    order.flags.writeable = False
    return order


def _capped(loads: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Loads with no expert above ``cap`` (a token meets an expert once, so an expert gets at most
    the N tokens), the excess spread over the experts under it in proportion to their loads (as
    aiconfigurator's later collector redraws until the largest expert is under N:
    ``power_law_logits_v4``). Each round caps at least one more expert: at most E rounds."""
    loads = loads.copy()
    for _ in range(loads.shape[1]):
        over = loads > cap * (1 + 1e-12)
        if not over.any():
            break
        excess = np.where(over, loads - cap, 0.0).sum(axis=1, keepdims=True)
        loads = np.where(over, np.broadcast_to(cap, loads.shape), loads)
        free = np.where(loads < cap * (1 - 1e-12), loads, 0.0)
        loads = loads + free / np.maximum(free.sum(axis=1, keepdims=True), 1e-300) * excess
    return loads


def replicate(loads: np.ndarray, physical: int) -> np.ndarray:
    """(layers x experts) copies: one each, then ``physical - experts`` more, each to the expert with
    the most tokens per copy (the lowest index on ties). Since load / k falls with k, the extra
    copies are the largest load_e / k over (e, k = 1..extra), taken in that order: one sort."""
    loads = np.atleast_2d(np.asarray(loads, dtype=float))
    layers, experts = loads.shape
    extra = physical - experts
    copies = np.ones((layers, experts), dtype=int)
    if extra <= 0:
        return copies
    # Only k <= K can reach the threshold: at t = total / (experts + extra), sum_e floor(load_e / t) >= extra,
    # so the extra-th largest value is at least t, and load_e / k >= t needs k <= load_e (experts + extra) / total.
    total = loads.sum(axis=1)
    bound = (np.max(loads, axis=1) * (experts + extra) / np.where(total > 0, total, 1.0)).max()
    most = extra if not np.all(total > 0) or not np.isfinite(bound) else min(extra, int(np.ceil(bound)) + 1)
    k = np.arange(1, most + 1)
    value = (loads[:, :, None] / k).reshape(layers, -1)                   # expert-major: e, then k
    # The ``extra`` largest values, the lowest index among equal ones (the set a stable descending sort
    # takes first), found by the extra-th largest value in linear time rather than by sorting.
    threshold = -np.partition(-value, extra - 1, axis=1)[:, extra - 1:extra]
    above, tied = value > threshold, value == threshold
    wanted = extra - above.sum(axis=1, keepdims=True)
    chosen = above | (tied & (np.cumsum(tied, axis=1) <= wanted))
    return copies + chosen.reshape(layers, experts, most).sum(axis=2)


def balanced_packing(weights: np.ndarray, packs: int) -> np.ndarray:
    """(rows x items) pack of each item: heaviest first onto the lightest pack with room, each pack
    exactly items / packs items (the lowest pack index on ties). Vectorized over rows."""
    weights = np.atleast_2d(np.asarray(weights, dtype=float))
    rows, items = weights.shape
    if packs < 1 or items % packs:
        raise SpecError(f"balanced packing needs items divisible by packs, has {items} and {packs}")
    per_pack = items // packs
    order = np.argsort(-weights, axis=1, kind="stable")
    heavy = np.take_along_axis(weights, order, axis=1)              # each row's weights, heaviest first
    load = np.zeros((rows, packs))                                  # a pack's load; inf once it is full
    count = np.zeros((rows, packs), dtype=np.int64)
    target = np.empty((rows, items), dtype=np.int64)                # the pack of each row's step-th item
    start = 0
    if per_pack == 1 or (heavy[:, :packs - 1] > 0).all():
        # The first round is fixed: each of the first ``packs`` items finds the packs before it loaded
        # (with a positive weight) and takes the lowest empty one; with one item per pack, likewise.
        start = packs
        target[:, :packs] = np.arange(packs)
        load[:] = np.inf if per_pack == 1 else heavy[:, :packs]
        count[:] = 1
    flat_load, flat_count, first_of_row = load.reshape(-1), count.reshape(-1), np.arange(rows) * packs
    for step in range(start, items):
        target[:, step] = load.argmin(axis=1)
        at = first_of_row + target[:, step]
        flat_load[at] += heavy[:, step]
        flat_count[at] += 1
        flat_load[at[flat_count[at] == per_pack]] = np.inf
    pack = np.empty((rows, items), dtype=int)
    np.put_along_axis(pack, order, target, axis=1)
    return pack


@dataclass(frozen=True, eq=False)
class EplbPlacement:
    """Where every copy of every expert sits, per layer: ``slot_expert[l, s]`` is the expert in slot
    ``s``; slot s is on device s // slots (``slots`` per device)."""

    policy: str
    devices: int
    devices_per_node: int
    slot_expert: np.ndarray        # (layers, physical) expert in each slot
    copies: np.ndarray             # (layers, experts)
    device_load: np.ndarray        # (layers, devices) tokens

    @property
    def slots(self) -> int:
        return self.slot_expert.shape[1] // self.devices

    @property
    def redundant(self) -> int:
        return self.slot_expert.shape[1] - self.copies.shape[1]

    @property
    def layer_imbalance(self) -> np.ndarray:
        """Per layer: the busiest device's tokens over the mean device's (1 = balanced)."""
        return _ratio(self.device_load)

    @property
    def imbalance(self) -> float:
        """Busiest over mean device load, averaged over layers (``search.placement.Placement``'s
        definition: every layer waits for its own busiest device)."""
        return float(np.mean(self.layer_imbalance))


def _policy(experts: int, groups: int, nodes: int) -> str:
    """EPLB's choice: hierarchical when the groups divide among the nodes, else global (on one node
    the two are the same placement)."""
    return "hierarchical" if nodes > 1 and groups >= 1 and experts % groups == 0 and groups % nodes == 0 else "global"


def rebalance(loads, devices: int, redundant: int = 0, devices_per_node: int | None = None, groups: int = 1,
              policy: str | None = None) -> EplbPlacement:
    """EPLB placement of ``loads`` ((layers x experts) tokens) on ``devices`` devices with
    ``redundant`` extra copies per layer: (experts + redundant) / devices slots per device.

    ``policy`` None chooses as EPLB does (``_policy``); "global" treats all devices as one node."""
    loads = np.atleast_2d(np.asarray(loads, dtype=float))
    layers, experts = loads.shape
    per_node = devices if devices_per_node is None else devices_per_node
    physical = experts + redundant
    if devices < 1 or per_node < 1 or devices % per_node:
        raise SpecError(f"EPLB needs devices divisible by devices per node, has {devices} and {per_node}")
    if redundant < 0 or physical % devices:
        raise SpecError(f"EPLB needs experts + redundant experts divisible by devices, has {experts} + {redundant} "
                        f"on {devices}")
    if not np.all(np.isfinite(loads)) or np.any(loads < 0):
        raise SpecError("EPLB needs finite, non-negative token counts")
    nodes = devices // per_node
    policy = policy or _policy(experts, groups, nodes)
    if policy not in POLICIES:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError("EPLB policy", policy, POLICIES)
    if policy == "global" or nodes == 1:
        groups, nodes, per_node = 1, 1, devices
    elif experts % groups or groups % nodes:
        raise SpecError(f"hierarchical EPLB needs {experts} experts in groups that divide among {nodes} nodes, "
                        f"has {groups} groups")
    group_size, local = experts // groups, experts // nodes
    # 1. Whole groups onto nodes: node_experts[l, n] lists node n's experts (ascending group, then id).
    group_node = balanced_packing(loads.reshape(layers, groups, group_size).sum(axis=2), nodes)
    order = np.argsort(np.repeat(group_node, group_size, axis=1), axis=1, kind="stable")   # (layers, experts)
    node_experts = order.reshape(layers * nodes, local)
    node_loads = np.take_along_axis(loads, order, axis=1).reshape(layers * nodes, local)
    # 2. Replicas inside each node: physical / nodes slots there.
    copies_local = replicate(node_loads, physical // nodes)
    copy_of = np.stack([np.repeat(np.arange(local), c) for c in copies_local])           # (rows, physical / nodes)
    size = np.take_along_axis(node_loads / copies_local, copy_of, axis=1)
    # 3. Copies onto the node's devices, slots each.
    device = balanced_packing(size, per_node)
    slots = physical // devices
    rank = np.argsort(device, axis=1, kind="stable")                                     # copies by device
    slot_local = np.take_along_axis(np.take_along_axis(node_experts, copy_of, axis=1), rank, axis=1)
    slot_expert = slot_local.reshape(layers, physical)
    copies = np.zeros((layers, experts), dtype=int)
    np.put_along_axis(copies, node_experts.reshape(layers, experts), copies_local.reshape(layers, experts), axis=1)
    # Each slot's share of its expert's tokens, summed per device in units of the layer's largest
    # load: a subnormal load split into copies would round to nothing (5e-324 in two copies).
    top = loads.max(axis=1, keepdims=True)
    scale = np.where(top > 0, top, 1.0)
    share = np.take_along_axis(loads / scale / copies, slot_expert, axis=1)
    device_load = share.reshape(layers, devices, slots).sum(axis=2) * scale
    return EplbPlacement(policy, devices, per_node if policy == "hierarchical" else devices, slot_expert, copies,
                         device_load)


def contiguous_loads(loads, devices: int) -> np.ndarray:
    """(layers x devices) tokens with no balancing: expert e on device floor(e x D / E), no replicas
    (the baseline EPLB is measured against)."""
    loads = np.ascontiguousarray(np.atleast_2d(np.asarray(loads, dtype=float)))
    experts = loads.shape[1]
    first = -(-np.arange(devices + 1) * experts // devices)       # device d holds experts first[d]:first[d + 1]
    out = np.zeros((loads.shape[0], devices))
    for d in range(devices):
        out[:, d] = loads[:, first[d]:first[d + 1]].sum(axis=1)
    return out


def _ratio(device_load: np.ndarray) -> np.ndarray:
    """Per layer: the busiest device over the mean device (1 for a layer without tokens)."""
    mean = device_load.mean(axis=1)
    return np.where(mean > 0, device_load.max(axis=1) / np.where(mean > 0, mean, 1.0), 1.0)


def busiest_over_mean(loads, devices: int, redundant: int = 0, devices_per_node: int | None = None,
                      groups: int = 1) -> np.ndarray:
    """Per layer, the busiest over the mean device after balancing: EPLB's placement (``rebalance``)
    or, where it is no better, the contiguous one it would replace (``contiguous_loads``).

    EPLB alone can lose to no balancing on small layouts, since every device takes exactly the same
    number of copies (loads [0, 1, 1] on 2 devices with 3 redundant copies: 7/6 against 1); a
    deployment keeps the layout it has when the balancer's plan is not better, so the rule every
    plan uses takes the lower of the two."""
    loads = np.atleast_2d(np.asarray(loads, dtype=float))
    placed = rebalance(loads, devices, redundant, devices_per_node, groups)
    return np.minimum(_ratio(placed.device_load), _ratio(contiguous_loads(loads, devices)))


def check(loads, placement: EplbPlacement) -> None:
    """Re-derive a placement's figures from the loads alone; AssertionError names what breaks:
    every expert placed, copies as counted, each device exactly its slots, device loads recomputed
    copy by copy and conserved (their sum is the layer's tokens)."""
    loads = np.atleast_2d(np.asarray(loads, dtype=float))
    layers, experts = loads.shape
    d, slots = placement.devices, placement.slots
    assert placement.slot_expert.shape == (layers, d * slots), "slots do not fill every device equally"
    for l in range(layers):
        count = np.bincount(placement.slot_expert[l], minlength=experts)
        assert len(count) == experts and count.min() >= 1, f"layer {l}: an expert has no copy"
        assert np.array_equal(count, placement.copies[l]), f"layer {l}: copies differ from the slots"
        per_copy = loads[l] / count
        device_load = np.zeros(d)
        for s, e in enumerate(placement.slot_expert[l].tolist()):
            device_load[s // slots] += per_copy[e]
        total = loads[l].sum()
        assert abs(device_load.sum() - total) <= 1e-9 * max(total, 1.0), f"layer {l}: loads not conserved"
        assert np.allclose(device_load, placement.device_load[l], rtol=1e-9, atol=1e-9 * max(total, 1.0)), \
            f"layer {l}: device loads differ"


def redundant_experts(experts: int, ep: int, share: float) -> int:
    """Redundant copies per layer for ``ep`` devices: slots per device ceil(E (1 + share) / ep), the
    copies beyond E filling them (share 0: the fewest slots, ceil(E / ep), the copies beyond E only
    where ep does not divide E). share 1/8 reproduces DeepSeek's deployments: 32 redundant of 256
    experts on 32 prefill GPUs (9 slots each) and on 144 decode GPUs (2 each), and 64 on 320 decode
    GPUs, one each (DeepSeek-V3 Technical Report Sec. 3.4; 'DeepSeek-V3/R1 Inference System
    Overview', github.com/deepseek-ai/open-infra-index, 2025-03-01)."""
    if ep < 1 or share < 0:
        raise SpecError(f"redundant experts need ep >= 1 and a share >= 0, has {ep} and {share:g}")
    return max(int(slots_per_device(experts, ep, share)) * ep - experts, 0)


def slots_per_device(experts: int, ep, share: float) -> np.ndarray:
    """Expert slots each of ``ep`` devices holds with ``share`` redundant copies: ceil(E (1 + share) / ep)
    (``redundant_experts``); every slot is a copy of an expert's weights in that device's memory."""
    return np.ceil(experts * (1.0 + share) / np.asarray(ep, dtype=float) - 1e-9)


BALANCES = EXPERT_BALANCES


def routing_imbalance(loads, ep: int, share: float = 0.0, balance: str = "eplb") -> float:
    """Busiest over mean EP device load of routing statistics ((layers x experts) tokens) on ``ep``
    devices, averaged over layers (every layer waits for its own busiest device): "eplb" places
    them by ``busiest_over_mean`` with ``redundant_experts(E, ep, share)`` copies (global policy),
    "none" keeps contiguous experts, "balanced" is 1. The one rule ``estimate serve --routing``,
    ``plan serve`` and ``plan train`` use (search.placement.imbalance_table)."""
    if balance not in BALANCES:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError("expert balance", balance, BALANCES)
    loads = np.atleast_2d(np.asarray(loads, dtype=float))
    if balance == "balanced" or ep <= 1:
        return 1.0
    if balance == "none":
        return float(np.mean(_ratio(contiguous_loads(loads, ep))))
    return float(np.mean(busiest_over_mean(loads, ep, redundant_experts(loads.shape[1], ep, share))))
ORDERS = 16    # expert orders averaged for the busiest device with no balancing (a count, no fit)


# Busiest over mean device under the default routing, per (experts, top_k, ep, alpha, share, balance), by
# routed tokens: a row's ratio does not depend on which other rows are placed with it (every reduction
# runs along a row of a C-ordered array; tests/properties/test_eplb.py), so each row is placed once and
# kept: searches ask for the same token counts from many layouts and phases. Cleared past _MEMO_ROWS.
_MEMO: dict[tuple, dict[float, float]] = {}
_MEMO_ROWS = 1 << 16


def _default_rows(experts: int, top_k: int, ep: int, alpha: float, share: float, balance: str,
                  tokens: list) -> list:
    key = (experts, top_k, ep, alpha, share, balance)
    if sum(len(v) for v in _MEMO.values()) > _MEMO_ROWS:
        _MEMO.clear()
    known = _MEMO.setdefault(key, {})
    missing = [t for t in tokens if t not in known]
    if missing:
        known.update(zip(missing, _default_ratios(experts, top_k, ep, alpha, share, balance, missing)))
    return [known[t] for t in tokens]


def _default_ratios(experts: int, top_k: int, ep: int, alpha: float, share: float, balance: str,
                    tokens: list) -> list:
    loads = power_law_loads(experts, top_k, np.array(tokens), alpha)
    if balance == "none":
        # Expert ids say nothing of popularity: the expected busiest device over ORDERS shuffles.
        rng = np.random.default_rng(0)
        shuffled = [_ratio(contiguous_loads(loads[:, rng.permutation(experts)], ep)) for _ in range(ORDERS)]
        return np.ascontiguousarray(np.stack(shuffled, axis=1)).mean(axis=1).tolist()
    return busiest_over_mean(loads, ep, redundant_experts(experts, ep, share)).tolist()


def default_imbalance(experts: int, top_k: int, tokens, ep, alpha: float, share: float,
                      balance: str = "eplb") -> np.ndarray:
    """Busiest over mean EP device load under the default routing (``power_law_loads``), per plan
    (``tokens`` routed per layer in the EP group and ``ep`` broadcast together); 1 where ep is 1.

    ``balance``: "eplb" places it with EPLB and ``redundant_experts(E, ep, share)`` copies
    (``busiest_over_mean``; global policy: the catalog's specs do not list expert groups); "none"
    keeps experts in contiguous blocks with no replicas (what aiconfigurator's power-law kernel tables measure on their busiest rank);
    "balanced" assumes every device equal (1). Each distinct (ep, tokens) pair is placed once
    (tokens rounded to whole tokens)."""
    if balance not in BALANCES:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError("expert balance", balance, BALANCES)
    routed, ep = np.broadcast_arrays(np.maximum(np.round(np.asarray(tokens, dtype=float)), 1.0),
                                     np.asarray(ep, dtype=float))
    # Above POWER_LAW_MAX_TOKENS the loads keep one shape and scale with the tokens: the same ratio.
    tokens = np.minimum(routed, POWER_LAW_MAX_TOKENS)
    out = np.ones(tokens.shape)
    if balance == "balanced":
        return out
    for e in sorted_distinct(ep)[0]:
        if e <= 1:
            continue
        mask = ep == e
        distinct, where = sorted_distinct(tokens[mask])
        rows = np.array(_default_rows(experts, top_k, int(e), float(alpha), float(share), balance,
                                      distinct.tolist()))
        out[mask] = rows[where.ravel()]
    return np.minimum(out + sampling_excess(routed, top_k, ep), np.maximum(ep, 1.0))


def sampling_excess(tokens, top_k: int, ep) -> np.ndarray:
    """What one batch's own routing adds to its busiest EP device, as a share of the mean device: a
    placement balances the expected loads, but each of the ep devices receives about m = tokens x top_k
    / ep expert rows, a count of independent routings that varies by about sqrt(m) (Poisson), and the
    busiest of ep such devices exceeds the mean by about sqrt(2 ln ep) of those deviations (the expected
    maximum of ep normal variables; David and Nagaraja, "Order Statistics", 3rd ed., 2003, Sec. 10.5):
    sqrt(2 ln ep / m); 0 at ep 1. At EP 32 with DeepSeek-R1's top 8 and 4,096 tokens this is 0.08, the
    part of TensorRT-LLM's measured 1.11 with EPLB ("Scaling Expert Parallelism in TensorRT-LLM", Part 1,
    Table 1) that a placement of the expected loads (1.04) leaves out; not fitted."""
    ep = np.maximum(np.asarray(ep, dtype=float), 1.0)
    rows = np.maximum(np.asarray(tokens, dtype=float) * top_k / ep, 1.0)
    return np.sqrt(2.0 * np.log(ep) / rows)

