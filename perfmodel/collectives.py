"""Collective communication over a system's topology levels: latency-bandwidth (alpha-beta) costs.

Every function broadcasts over numpy arrays. ``size_bytes`` is the whole buffer one device holds
(before a reduce-scatter, after an all-gather); ``n`` the group size; ``bw`` the bytes/s one device
sends in one direction across the level the group spans; ``lat`` one hop's latency in seconds. A
group of one device costs nothing.

References
----------
Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 19(1), 2005, Sec. 4 (ring reduce-scatter / all-gather: (n-1) alpha + (n-1)/n * S * beta;
all-reduce as reduce-scatter + all-gather; pairwise-exchange all-to-all).
Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC
69(2), 2009 (the 2 (n-1)/n * S / B lower bound a ring attains).
Sanders, Speck and Traeff, "Two-tree algorithms for full bandwidth broadcast, reduction and scan",
Parallel Computing 35(12), 2009 (double binary tree: 2 log2(n) alpha + 2 S / B, as in NCCL's tree).
NVIDIA NCCL 2.30 (github.com/NVIDIA/nccl, master 5067397, 2026-06-11), src/graph/tuning.cc,
ncclTopoTuneModel: the cost model NCCL itself uses to choose a ring protocol for an all-gather or a
reduce-scatter across nodes (latency = base + (n - nodes) intra-node steps + (nodes - 1) network
steps, bandwidth = bus bandwidth x a per-protocol share; PAT, a logarithmic-latency all-gather /
reduce-scatter, only with one rank per node). Jeaugey, "PAT: a new algorithm for all-gather and
reduce-scatter operations at scale", arXiv:2506.20252, 2025 (why: the ring's latency grows
linearly with the ranks). Singh et al., "The Big Send-off: Scalable and Performant Collectives for
Deep Learning", arXiv:2504.18658 (NCCL and RCCL all-gather / reduce-scatter are rings whose latency
grows as O(p): measured at up to 2,048 GPUs on Perlmutter and Frontier).
DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024, Sec. 3.2.2, and DeepEP's README
(deepseek-ai/DeepEP, "Normal kernels with NVLink and RDMA forwarding" and "Low-latency kernels with
pure RDMA"): the two expert-exchange kernels of MoE serving.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _n(n):
    return np.maximum(np.asarray(n, dtype=float), 1.0)


def reduce_scatter_time(size_bytes, n, bw, lat):
    """Ring reduce-scatter: (n-1) hops, each moving S/n (Thakur et al. 2005, Sec. 4.4)."""
    n = _n(n)
    return (n - 1) * lat + (n - 1) / n * size_bytes / bw


def all_gather_time(size_bytes, n, bw, lat):
    """Ring all-gather: (n-1) hops, each moving S/n (Thakur et al. 2005, Sec. 4.1)."""
    return reduce_scatter_time(size_bytes, n, bw, lat)


def ring_all_reduce_time(size_bytes, n, bw, lat):
    """Ring all-reduce = reduce-scatter + all-gather: 2(n-1) alpha + 2 (n-1)/n S/B (Patarasuk & Yuan 2009)."""
    return 2 * reduce_scatter_time(size_bytes, n, bw, lat)


def tree_all_reduce_time(size_bytes, n, bw, lat):
    """Double-binary-tree all-reduce: 2 ceil(log2 n) alpha + 2 S/B (Sanders et al. 2009); 0 for n = 1."""
    n = _n(n)
    return np.where(n > 1, 2 * np.ceil(np.log2(n)) * lat + 2 * size_bytes / bw, 0.0)


def all_to_all_time(size_bytes, n, bw, lat):
    """Pairwise-exchange all-to-all: each device sends (n-1)/n of its S bytes in n-1 steps."""
    return reduce_scatter_time(size_bytes, n, bw, lat)


def p2p_time(size_bytes, bw, lat):
    """One point-to-point message: alpha + S/B."""
    return lat + np.asarray(size_bytes, dtype=float) / bw


@dataclass(frozen=True)
class RingProtocol:
    """One NCCL protocol's terms for a ring all-gather or reduce-scatter across nodes (SI): a base
    latency, one step's latency inside a node, one network step's latency (``inter``, or
    ``inter_alone`` when each node holds one rank of the ring), and the share of the link's bus
    bandwidth the protocol reaches."""

    name: str
    base: float
    intra: float
    inter: float
    inter_alone: float
    share: float


# NCCL 2.30's tuner constants (src/graph/tuning.cc, ncclTunerConstantsDefaults and
# ncclTopoTuneModel; not fitted here). Ring baseLatencies {LL 6.6, LL128 14.0, Simple 8.4} us;
# hwLatencies NVLINK Ring {0.6, 1.9, 3.4}, NET Ring {2.7, 4.0, 14.0}, NET Tree {5.0, 8.5, 14} (used
# for the network steps when each node holds one rank, "ppn == 1"); once the ring leaves the node
# an intra-node step costs at least the network post overhead (getNetOverhead: 1.0 us, x3 with
# Simple): max(0.6, 1.0) = 1.0, max(1.9, 1.0) = 1.9, max(3.4, 3.0) = 3.4. Bus bandwidth x0.5 with
# LL, x0.92 with LL128 (its per-channel cap, 36.7 GB/s per channel on Hopper, never binds at one
# NIC per GPU), x1 with Simple. The graph's own network latency (latencyInter, 0 on InfiniBand)
# is left out.
NCCL_RING = (
    RingProtocol("LL", 6.6e-6, 1.0e-6, 2.7e-6, 5.0e-6, 0.5),
    RingProtocol("LL128", 14.0e-6, 1.9e-6, 4.0e-6, 8.5e-6, 0.92),
    RingProtocol("Simple", 8.4e-6, 3.4e-6, 14.0e-6, 14.0e-6, 1.0),
)
# PAT (NCCL >= 2.23, Simple protocol, enabled by default only with one rank per node): base 8.0 us,
# log2(nodes) x NET latency / 3.5 + nRanks x 2.8 us, bus bandwidth x0.75 (same file).
PAT_BASE, PAT_PER_RANK, PAT_NET, PAT_SHARE = 8.0e-6, 2.8e-6, 14.0e-6, 0.75


def ring_latency(n, per_node, protocol: RingProtocol):
    """Latency of one ring all-gather or reduce-scatter over ``n`` ranks, ``per_node`` of them in
    each node: base + (n - g) intra-node steps + (g - 1) network steps, g = n / per_node nodes
    (NCCL 2.30 src/graph/tuning.cc, nsteps = n - 1 of which nInterSteps = nodes - 1)."""
    n = _n(n)
    k = np.clip(np.asarray(per_node, dtype=float), 1.0, n)
    nodes = n / k
    inter = np.where(k <= 1.0, protocol.inter_alone, protocol.inter)
    return protocol.base + (n - nodes) * protocol.intra + (nodes - 1.0) * inter


def pat_latency(n):
    """Latency of PAT over ``n`` ranks, one per node: base + floor(log2 n) x NET / 3.5 + n x 2.8 us
    (NCCL 2.30 src/graph/tuning.cc; Jeaugey 2025: a logarithmic number of network transfers)."""
    n = _n(n)
    return PAT_BASE + np.floor(np.log2(n)) * PAT_NET / 3.5 + n * PAT_PER_RANK


def sharded_collective_time(size_bytes, n, per_node, bw, protocols=NCCL_RING):
    """All-gather (or reduce-scatter) of ``size_bytes`` (the whole buffer) over ``n`` ranks spread
    over nodes of ``per_node`` ranks, as NCCL runs it across nodes: the fastest of its ring
    protocols, latency (ring_latency) + (n-1)/n x S over the protocol's share of ``bw``, and with one
    rank per node also PAT. Named terms: the latency grows with the ranks (the alpha term the
    ring pays once per step), small messages run at LL's half bandwidth or pay Simple's higher
    steps. 0 for a group of one."""
    n = _n(n)
    volume = (n - 1) / n * np.asarray(size_bytes, dtype=float)
    best = np.full(np.broadcast(n, volume, per_node, bw).shape, np.inf)
    for protocol in protocols:
        best = np.minimum(best, ring_latency(n, per_node, protocol) + volume / (bw * protocol.share))
    alone = np.asarray(per_node, dtype=float) <= 1.0
    best = np.where(alone, np.minimum(best, pat_latency(n) + volume / (bw * PAT_SHARE)), best)
    return np.where(n > 1, best, 0.0)


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class FittedCollectives:
    """Measured collective costs inside the scale-up domain (SI): per op, the low-latency and the
    bandwidth protocol's launch time and bandwidth fraction of ``link``, and one hop's latency.

    A collective of ``n`` ranks and ``size`` bytes takes min over the two protocols of launch +
    steps x hop + size x volume / (link x fraction): steps and volume are the ring's (all-reduce
    2(n-1) and 2(n-1)/n, the others n-1 and (n-1)/n; an all-to-all posts every send at once, one
    step), as NCCL's tuning model writes them (src/graph/tuning.cc: latency + size / bandwidth
    per algorithm and protocol).
    """

    link: float
    hop: float
    ll_launch: dict[str, float]
    ll_fraction: dict[str, float]
    launch: dict[str, float]
    fraction: dict[str, float]

    def time(self, op: str, size_bytes, n):
        n = _n(n)
        steps = 2 * (n - 1) if op == "all_reduce" else (np.ones_like(n) if op == "all_to_all" else n - 1)
        volume = (2 if op == "all_reduce" else 1) * (n - 1) / n * np.asarray(size_bytes, dtype=float)
        low = self.ll_launch[op] + steps * self.hop + volume / (self.link * self.ll_fraction[op])
        bulk = self.launch[op] + steps * self.hop + volume / (self.link * self.fraction[op])
        return np.where(n > 1, np.minimum(low, bulk), 0.0)


EXCHANGES = ("dispatch", "combine")


@dataclass(frozen=True)
class FittedDispatch:
    """One of DeepEP's expert exchanges (low-latency or normal kernels) fitted on measured kernels
    (SI): per op a launch time and the share of the scale-up and of the scale-out link's
    per-direction bandwidth it reaches, and one latency more when the group leaves the scale-up
    domain. ``out_fraction`` is None where only one domain was measured (the scale-out level then
    keeps its link model)."""

    launch: dict[str, float]
    remote: float
    up_fraction: dict[str, float]
    out_fraction: dict[str, float] | None = None


def expert_exchange_time(copies, copy_bytes, n, k, inner_bw, outer_bw, launch, remote):
    """One device's low-latency dispatch (or combine) over an EP group of ``n`` ranks, ``k`` of
    them in its own scale-up domain: each of its ``copies`` token-expert pairs goes straight to
    the expert's rank (DeepEP low-latency kernels: IBGDA RDMA across domains, no forwarding or
    deduplication over NVLink; DeepEP README, "Low-latency kernels"). With uniform routing (k-1)/n
    of the copies cross the inner level and (n-k)/n the outer one, concurrently; the slower sets
    the time, after a launch and, when the group leaves the domain, one remote latency."""
    n, k = _n(n), np.minimum(_n(k), _n(n))
    volume = np.asarray(copies, dtype=float) * copy_bytes
    wire = np.maximum(volume * (k - 1) / n / inner_bw, volume * (n - k) / n / outer_bw)
    return np.where(n > 1, launch + np.where(n > k, remote, 0.0) + wire, 0.0)


def expert_miss(num_experts, top_k, held):
    """Probability that a bin holding ``held`` of the ``num_experts`` experts holds none of a
    token's top_k (k distinct experts, every set of k equally likely): the hypergeometric
    C(E - b, k) / C(E, k) = prod_{i<k} (E - b - i) / (E - i) (Feller, An Introduction to Probability
    Theory, Vol. 1, Ch. II.6). A bin of one expert misses with 1 - k/E; a fractional ``held`` (a
    rank's share when ranks outnumber experts) continues the product; a bin of more than E - k
    experts never misses. Broadcasts over all three arguments."""
    e, b, k = (np.asarray(x, dtype=float) for x in (num_experts, held, top_k))
    miss = np.ones(np.broadcast(e, b, k).shape)
    for i in range(int(np.max(k, initial=0))):
        miss = miss * np.where(i < k, np.clip((e - b - i) / np.maximum(e - i, 1.0), 0.0, 1.0), 1.0)
    return miss


def normal_exchange_copies(top_k, num_experts, n, k):
    """(NVLink, RDMA) copies of one token that DeepEP's normal dispatch (or combine) sends from one
    rank of an EP group of ``n`` ranks, ``k`` of them per scale-up domain (node), uniform routing.

    A token goes once to each remote node holding one of its experts (RDMA to the same-index GPU
    there), never once per expert; each node it reaches, its own included, forwards it over NVLink
    once to each other rank of that node holding one of its experts (DeepEP README, "Normal kernels
    with NVLink and RDMA forwarding"; DeepSeek-V3 Technical Report, Sec. 3.2.2). With g = n / k
    nodes, a rank holds E / n experts and a node E / g, so per token: NVLink g (k - 1) (1 - miss(E /
    n)) = (n - g) (1 - miss(E / n)) and RDMA (g - 1) (1 - miss(E / g)) copies (``expert_miss``). By
    symmetry what a rank forwards for its peers equals what its own tokens cause to be forwarded.
    Inside one node, (n - 1)(1 - miss(E / n)) < min(top_k, n - 1) copies: a token meets each rank
    once however many of its experts that rank holds. Ranks outnumbering the experts hold replicas
    and a token goes to one replica of each of its experts, so a rank is hit with k / n: the union
    bound k b / E, which the hypergeometric meets at b = 1 and stays under above it."""
    n = _n(n)
    k = np.minimum(_n(k), n)
    nodes = n / k
    e = np.asarray(num_experts, dtype=float)

    def hit(held):
        return np.minimum(1.0 - expert_miss(e, top_k, held), np.asarray(top_k, dtype=float) * held / e)

    return (n - nodes) * hit(e / n), (nodes - 1.0) * hit(e / nodes)


def normal_exchange_time(tokens, token_bytes, top_k, num_experts, n, k, inner_bw, outer_bw, launch, remote):
    """One device's normal-mode dispatch (or combine) of ``tokens`` tokens of ``token_bytes`` each to
    their ``top_k`` of ``num_experts`` experts over an EP group of ``n`` ranks, ``k`` of them in its
    own scale-up domain, as prefill runs it (DeepEP normal kernels: NVLink inside a node, RDMA
    once per remote node then NVLink forwarding; ``normal_exchange_copies``). Named terms: a launch;
    one remote latency when the group leaves the domain; the NVLink and the RDMA bytes, each over its
    link, moving concurrently, so the slower sets the wire time (DeepSeek-V3 Sec. 3.2.2 overlaps the
    IB and NVLink legs)."""
    n, k = _n(n), np.minimum(_n(k), _n(n))
    nvlink, rdma = normal_exchange_copies(top_k, num_experts, n, k)
    volume = np.asarray(tokens, dtype=float) * token_bytes
    return exchange_legs_time(volume * nvlink, volume * rdma, n, k, inner_bw, outer_bw, launch, remote)


def exchange_legs_time(nvlink_bytes, rdma_bytes, n, k, inner_bw, outer_bw, launch, remote):
    """One device's normal-mode exchange that sends ``nvlink_bytes`` inside its scale-up domain and
    ``rdma_bytes`` across it, over an EP group of ``n`` ranks, ``k`` of them per domain: a launch,
    one remote latency when the group leaves the domain, and the two legs moving concurrently, the
    slower setting the wire time (DeepSeek-V3 Technical Report, Sec. 3.2.2)."""
    n, k = _n(n), np.minimum(_n(k), _n(n))
    wire = np.maximum(nvlink_bytes / inner_bw, rdma_bytes / outer_bw)
    return np.where(n > 1, launch + np.where(n > k, remote, 0.0) + wire, 0.0)


@dataclass(frozen=True)
class Topology:
    """A sized system's levels as arrays, innermost first (SI units, achievable bandwidths).

    ``sizes[i]`` is the number of devices in one group of level i (the last one spans the
    system); ``bw[i]`` what one device sends per direction across level i; ``lat[i]`` one hop.
    """

    names: tuple[str, ...]
    sizes: np.ndarray
    bw: np.ndarray
    lat: np.ndarray
    fitted: FittedCollectives | None = None   # measured costs for groups inside level ``fitted_level``
    fitted_level: int = 0
    launch: float = 0.0                       # s per collective when none is measured (a kernel launch)
    link_bw: np.ndarray | None = None         # per level: the link's datasheet bandwidth (what fits scale)
    kinds: tuple[str, ...] = ()               # per level: scale-up, package or scale-out
    dispatch: FittedDispatch | None = None    # measured expert dispatch / combine (decode kernels)
    dispatch_normal: FittedDispatch | None = None   # measured normal-mode dispatch / combine (prefill kernels)

    def _within(self, op: str, size_bytes, stride, n):
        """The measured cost of ``op`` over the group's members inside one measured domain (all of
        them when the group fits in it); 0 without a fit."""
        if self.fitted is None:
            return np.zeros(np.broadcast(np.asarray(size_bytes, dtype=float), _n(n)).shape)
        within = np.minimum(_n(n), self.sizes[self.fitted_level] / np.maximum(np.asarray(stride, dtype=float), 1.0))
        return self.fitted.time(op, size_bytes, np.maximum(within, 1.0))

    def _measured(self, op: str, size_bytes, stride, n, modelled):
        """The measured cost for a group inside the measured level; for one reaching beyond it,
        ``modelled`` plus the measured launch time (every collective is a kernel launch), and never
        less than the measured cost over the members it has inside one domain."""
        if self.fitted is None:
            return modelled + np.where(_n(n) > 1, self.launch, 0.0)
        # The members inside one measured domain (all of them when the group fits in it): a group
        # reaching beyond is the link model plus a launch, never cheaper than the measured
        # collective over those members.
        within = np.minimum(_n(n), self.sizes[self.fitted_level] / np.maximum(np.asarray(stride, dtype=float), 1.0))
        measured = self._within(op, size_bytes, stride, n)
        beyond = within < _n(n)
        # A group of one costs nothing, however far apart its (absent) members would be.
        return np.where(_n(n) > 1, np.maximum(measured, np.where(beyond, modelled + self.fitted.ll_launch[op], 0.0)),
                        0.0)

    def _sharded(self, op: str, size_bytes, stride, n, modelled):
        """An all-gather or reduce-scatter: inside one node as measured (or the link model); a group
        spanning nodes (its slowest level is scale-out) as NCCL's ring across nodes
        (sharded_collective_time, with the members per node), never less than the measured cost
        over its members inside one domain."""
        plain = self._measured(op, size_bytes, stride, n, modelled)
        if not self.kinds:
            return plain
        idx, bw, _, k, _, _ = self._two_levels(stride, n)
        crosses = (np.asarray(self.kinds, dtype=object)[idx] == "scale-out") & (_n(n) > 1)
        if not np.any(crosses):
            return plain
        ring = np.maximum(sharded_collective_time(size_bytes, n, k, bw), self._within(op, size_bytes, stride, n))
        return np.where(crosses, ring, plain)

    def level_of(self, stride, n):
        """Index of the innermost level holding a whole group of ``n`` devices ``stride`` apart.

        The group spans ``stride * n`` consecutive device ranks, so it crosses every level
        smaller than that and pays the slowest of them, the one returned.
        """
        extent = np.asarray(stride, dtype=float) * _n(n)
        idx = np.searchsorted(self.sizes, extent, side="left")
        return np.minimum(idx, len(self.sizes) - 1)

    def link(self, stride, n):
        """(bandwidth, latency) a group pays: its slowest level's."""
        idx = self.level_of(stride, n)
        return self.bw[idx], self.lat[idx]

    def _two_levels(self, stride, n):
        """Slow level's (bw, lat), the members per inner group k, and the inner level's (bw, lat)."""
        idx = self.level_of(stride, n)
        inner = np.maximum(idx - 1, 0)
        below = np.where(idx > 0, self.sizes[inner], 1)
        k = np.clip(below // np.maximum(np.asarray(stride), 1), 1, _n(n))
        return idx, self.bw[idx], self.lat[idx], k, self.bw[inner], self.lat[inner]

    def inner_members(self, stride, n):
        """Members of the group inside one group of the level below its slowest (for two-level algorithms)."""
        return self._two_levels(stride, n)[3]

    def all_reduce(self, size_bytes, stride, n):
        """The fastest of ring, tree and hierarchical two-level all-reduce for this group.

        Hierarchical: reduce-scatter among the k members inside the faster inner level,
        all-reduce of S/k across the n/k groups over the slow level, all-gather inside (as
        NCCL and Horovod do across nodes).
        """
        _, bw, lat, k, ibw, ilat = self._two_levels(stride, n)
        flat = np.minimum(ring_all_reduce_time(size_bytes, n, bw, lat), tree_all_reduce_time(size_bytes, n, bw, lat))
        outer = _n(n) / k
        hier = 2 * reduce_scatter_time(size_bytes, k, ibw, ilat) + np.minimum(
            ring_all_reduce_time(size_bytes / k, outer, bw, lat), tree_all_reduce_time(size_bytes / k, outer, bw, lat))
        modelled = np.where(_n(n) > 1, np.minimum(flat, np.where(k > 1, hier, np.inf)), 0.0)
        return self._measured("all_reduce", size_bytes, stride, n, modelled)

    def reduce_scatter(self, size_bytes, stride, n):
        bw, lat = self.link(stride, n)
        return self._sharded("reduce_scatter", size_bytes, stride, n, reduce_scatter_time(size_bytes, n, bw, lat))

    def all_gather(self, size_bytes, stride, n):
        bw, lat = self.link(stride, n)
        return self._sharded("all_gather", size_bytes, stride, n, all_gather_time(size_bytes, n, bw, lat))

    def all_to_all(self, size_bytes, stride, n):
        bw, lat = self.link(stride, n)
        return self._measured("all_to_all", size_bytes, stride, n, all_to_all_time(size_bytes, n, bw, lat))

    def two_hop_reduce_scatter(self, size_bytes, stride, n):
        """Reduce-scatter as two all-to-alls (ZeRO++ qgZ, Wang et al. 2023, Sec. 3.3): each device
        sends its whole buffer S, sliced, to the k members inside the inner level (all-to-all over
        the fast link), reduces the k slices it receives, then sends that S/k to the n/k groups
        across the slow level (all-to-all), reducing again. Per device, (k-1)/k S crosses the inner
        level and (n/k-1)/(n/k) S/k the outer one. A group inside one level is one all-to-all."""
        k = self.inner_members(stride, n)
        outer = _n(n) / k
        inner = self.all_to_all(size_bytes, stride, k)
        across = self.all_to_all(np.asarray(size_bytes, dtype=float) / k, np.asarray(stride, dtype=float) * k, outer)
        return np.where(_n(n) > 1, inner + across, 0.0)

    def moe_all_to_all(self, token_bytes, top_k, stride, n, deduplicated=True):
        """Dispatch (or combine) of tokens to their top-k experts over an EP group of ``n``.

        ``token_bytes`` is one device's tokens x hidden x bytes. Inside one inner-level group
        (a node) it is a plain all-to-all of top_k copies. Across inner groups:
        - ``deduplicated`` (DeepEP's and HybridEP's kernels): a token crosses to each remote group
          holding one of its experts once and is forwarded inside that group over the fast level
          (DeepSeek-V3 Technical Report, Sec. 3.2.2: IB once per node, then NVLink); with G groups
          the expected remote groups per token are (G-1)(1 - (1-1/G)^k);
        - otherwise (Megatron-Core's alltoall dispatcher, MoEAlltoAllTokenDispatcher in
          core_v0.19.0 token_dispatcher.py: tokens permuted per expert, then one NCCL all-to-all
          of the copies) every copy goes straight to its expert's rank: the copies bound for other
          groups, (n - k) / n of them, cross the slow level.
        The two levels run concurrently; the slower sets the time. ``deduplicated`` broadcasts
        with the plans.
        """
        n_ = _n(n)
        idx, bw, lat, k_in, ibw, ilat = self._two_levels(stride, n)
        groups = n_ / k_in
        copies = token_bytes * top_k
        flat = all_to_all_time(copies, n, bw, lat)
        remote = (groups - 1) * (1 - (1 - 1 / groups) ** top_k)
        outer = (groups - 1) * lat + remote * token_bytes / bw
        inner = all_to_all_time(copies, k_in, ibw, ilat)
        hier = np.maximum(outer, inner)
        direct = np.maximum((groups - 1) * lat + (n_ - k_in) / n_ * copies / bw,
                            all_to_all_time(copies * k_in / n_, k_in, ibw, ilat))
        spans = (idx > 0) & (k_in > 1) & (groups > 1)
        two_levels = np.minimum(np.where(deduplicated, hier, direct), flat)
        modelled = np.where(n_ > 1, np.where(spans, two_levels, flat), 0.0)
        return self._measured("all_to_all", copies, stride, n, modelled)

    def _exchange_links(self, fit: FittedDispatch | None, op: str, stride, n) -> tuple:
        """(members per scale-up domain, inner and outer bandwidth, launch, remote latency) an
        expert exchange ``op`` over the EP group of ``n`` ranks ``stride`` apart pays: the fitted
        kernel's launch and link shares (of the links' datasheet bandwidths) where the device has a
        ``fit``, else the levels' achievable bandwidths, a collective launch and the slow level's hop."""
        idx, bw, lat, k, ibw, _ = self._two_levels(stride, n)
        spans = (idx > 0) & (k < _n(n))
        inner_bw, outer_bw = np.where(spans, ibw, bw), bw
        launch, remote = self.launch, lat
        if fit is not None and self.link_bw is not None:
            kinds = np.array(self.kinds, dtype=object)
            inner = np.where(spans, np.maximum(idx - 1, 0), idx)
            inner_bw = np.where(kinds[inner] != "scale-out", self.link_bw[inner] * fit.up_fraction[op], inner_bw)
            if fit.out_fraction is not None:
                outer_bw = np.where(kinds[idx] == "scale-out", self.link_bw[idx] * fit.out_fraction[op], outer_bw)
                remote = np.where(kinds[idx] == "scale-out", fit.remote, lat)
            launch = fit.launch[op]
        return np.where(spans, k, _n(n)), inner_bw, outer_bw, launch, remote

    def expert_exchange(self, op: str, copies, copy_bytes, stride, n):
        """Low-latency expert dispatch or combine (``op``) of one device's ``copies`` token-expert
        pairs of ``copy_bytes`` over the EP group of ``n`` ranks ``stride`` apart, as decode runs it
        (expert_exchange_time), on the fitted low-latency kernel where the device has one."""
        k, inner_bw, outer_bw, launch, remote = self._exchange_links(self.dispatch, op, stride, n)
        return expert_exchange_time(copies, copy_bytes, n, k, inner_bw, outer_bw, launch, remote)

    def normal_exchange(self, op: str, tokens, token_bytes, top_k, num_experts, stride, n):
        """Normal-mode expert dispatch or combine (``op``) of one device's ``tokens`` tokens of
        ``token_bytes`` to their ``top_k`` of ``num_experts`` experts over the EP group of ``n``
        ranks ``stride`` apart, as prefill runs it (normal_exchange_time), on the fitted normal
        kernel (``dispatch_normal``). A device without that fit keeps the link model
        (``moe_all_to_all``: top_k copies inside a node, once per remote node across)."""
        if self.dispatch_normal is None:
            return self.moe_all_to_all(np.asarray(tokens, dtype=float) * token_bytes, top_k, stride, n)
        k, inner_bw, outer_bw, launch, remote = self._exchange_links(self.dispatch_normal, op, stride, n)
        return normal_exchange_time(tokens, token_bytes, top_k, num_experts, n, k, inner_bw, outer_bw, launch, remote)

    def placed_exchange(self, op: str, nvlink_bytes, rdma_bytes, stride, n):
        """Normal-mode dispatch or combine (``op``) of one device whose tokens send ``nvlink_bytes``
        inside its node and ``rdma_bytes`` across nodes, as a placement of the experts routes them
        (exchange_legs_time), on the fitted normal kernel where the device has one, else over the
        levels' achievable bandwidths."""
        k, inner_bw, outer_bw, launch, remote = self._exchange_links(self.dispatch_normal, op, stride, n)
        return exchange_legs_time(nvlink_bytes, rdma_bytes, n, k, inner_bw, outer_bw, launch, remote)

    def p2p(self, size_bytes, stride):
        """A message between neighbours ``stride`` ranks apart (pipeline stages)."""
        bw, lat = self.link(stride, 2)
        return p2p_time(size_bytes, bw, lat)
