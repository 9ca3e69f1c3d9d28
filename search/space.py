"""The declared search space of training plans, and its validity rules, stated once.

A space is the cartesian product of the options below, filtered by the rules; it is returned as
plan columns (numpy arrays) ready for one vectorized call of the cost model. Offload placements
are not in the lattice: the solver adds them only where memory binds (see search.train).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from perfmodel.hardware_db.schema import PRECISIONS
from perfmodel.machine import Machine
from perfmodel.memory import layers_on_stage
from perfmodel.model import TransformerSpec
from perfmodel.plan import CP_COMMS, DISPATCHERS, PLACES, RECOMPUTE, CpComm, Dispatcher

if TYPE_CHECKING:      # the serving search need not load the training model
    from perfmodel.training import TrainWorkload

RULES = (
    "tp x pp x dp x cp = devices",
    "tp within the scale-up domain, dividing the heads, and dividing or divided by the KV heads",
    "pp x interleave at most the layers, + 2 with the embedding and the loss as layers of the split and 1 more per "
    "MTP depth (uneven splits allowed; the last stage holds the loss and MTP slots); interleave > 1 only with "
    "pp > 1 and microbatches divisible by pp",
    "ep divides the routed experts; experts fold over each stage's tp x cp x dp devices with expert tensor "
    "parallelism etp = tp (ep divides dp x cp) or etp = 1 (ep divides tp x cp x dp) (MoE models only); a "
    "flex dispatcher (DeepEP, HybridEP) only with ep > 1 on NVIDIA GPUs",
    "cp divides the sequence length",
    "global batch divisible by micro-batch x dp",
    "sequence parallelism only with tp > 1; TP-communication overlap wherever sequence parallelism is on and the "
    "device and framework have it (NVIDIA GPUs; it never makes a step slower: tests/properties)",
    "the MoE exchange overlapped with compute wherever Megatron-Core allows it (ep > 1, no full recomputation, a "
    "virtual pipeline when pp > 1; never slower: tests/properties); recompute modules only for MLA or MoE models",
    "precision listed by the device",
    "each sharded state over a group of the dp x cp replicas inside one topology level (or all of them), weights "
    "within gradients within optimizer states; hpZ's secondary partition a smaller such group; hpZ, qwZ and qgZ "
    "with ZeRO-3 only",
)

# What the declared space does not hold, said with every search (plan train): plans a practitioner
# might run that the model or the search cannot express yet.
LEFT_OUT = (
    "pipeline schedules other than 1F1B and Megatron's interleaved one (DualPipe, zero-bubble, Llama 3's tunable "
    "warm-up; estimate train --schedule dualpipe evaluates DualPipe)",
    "storage other than mixed-precision Adam with 16-bit gradients (fp32 gradients, BF16 Adam moments, DeepSeek-V3's "
    "FP8-cached activations; estimate train --storage deepseek evaluates the last)",
    "context parallelism other than the ring unless --cp-comms names it (the all-gather, Ulysses), and Megatron's "
    "hierarchical a2a+p2p",
    "MoE token dispatchers other than Megatron-Core's alltoall unless --dispatchers names them (DeepEP, HybridEP)",
    "recomputation of other module sets; activation offload where some plan fits HBM without it (--swap-activations "
    "always searches it there too) and at shares other than 1/32, 1/16 and eighths (estimate train "
    "--activation-offload takes any)",
    "expert tensor parallelism other than tp or 1, and uneven expert placement",
    "micro-batches above 8 and interleaving above 8",
    "CUDA graphs: no plan pays host launch time, so an eager step and a graphed one cost the same (fine-grained MoE "
    "layers run eagerly at micro-batch 1 are where this flatters a plan: README, Validation)",
)

# The columns of a plan the lattice holds (perfmodel.training.TrainPlan's fields a search sets).
PLAN_FIELDS = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "interleave", "ends_as_layers", "micro_batch", "zero",
               "recompute", "sp", "flash", "tp_overlap", "ep_overlap", "dispatcher", "precision",
               "optimizer_place", "grad_place", "param_place", "moe_imbalance", "shard", "shard_grads", "shard_weights",
               "hpz", "qwz", "qgz", "activation_offload")

# Sharding families: search.vocabulary.SHARDING.
DEFAULT_SHARDING = ("flat", "hsdp", "hpz")   # what frameworks run (FSDP HSDP, MiCS, ZeRO++ hpZ)


@dataclass(frozen=True)
class SpaceOptions:
    """What the search may choose from (defaults: everything sensible)."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    interleaves: tuple[int, ...] = (1, 2, 4, 8)
    max_cp: int = 16
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recomputes: tuple[str, ...] = RECOMPUTE
    precisions: tuple[str, ...] = ("bf16", "fp8")
    offload_places: tuple[str, ...] = PLACES
    tps: tuple[int, ...] | None = None             # the tensor-parallel degrees allowed (None: every valid one)
    max_pp: int | None = None                      # a framework's limits (perfmodel.exports.Capabilities)
    max_ep: int | None = None
    offload_parts: tuple[tuple[str, tuple[str, ...]], ...] | None = None   # None: every part to every tier
    offload_zero: tuple[int, ...] = (0, 1, 2, 3)   # ZeRO stages offloading is searched with
    sharding: tuple[str, ...] = DEFAULT_SHARDING   # families of search.vocabulary.SHARDING searched
    hsdp_zero: tuple[int, ...] = (1, 2, 3)         # ZeRO stages sub-group sharding is searched with
    shard_whole_cp: bool = False                   # sub-groups of whole cp groups only (torchtitan's device mesh)
    zeropp_with_groups: bool = True                # ZeRO++ also with sub-group sharding (DeepSpeed: flat ZeRO-3 only)
    tp_overlap: bool = True                        # TP communication overlapped wherever sp and tp > 1 allow it
    sequence_parallel: tuple[bool, ...] = (False, True)   # sequence parallelism searched (with tp > 1 only)
    # FlashAttention (Dao et al. 2022); False: the s x s scores written, as frameworks ran attention
    # before it (benchmarks restrict a search to what a publisher's framework had).
    flash: bool = True
    ep_overlap: bool = True                        # the MoE exchange overlapped wherever Megatron-Core allows it
    # Context-parallel exchanges searched (plan.CpComm): the ring by default. The all-gather and
    # Ulysses variants more than double the lattice of a large model (the Megatron 1T plan: 203k ->
    # 517k plans) for a few percent at long sequences; plan train --cp-comms adds them.
    cp_comms: tuple[str, ...] = ("p2p",)
    # MoE token dispatchers searched (plan.Dispatcher): Megatron-Core's alltoall by default; the flex
    # backends (DeepEP, HybridEP) need their libraries installed, so plan train --dispatchers adds them.
    dispatchers: tuple[str, ...] = ("alltoall",)
    # Shares of saved activations swapped to host DDR (perfmodel.activation_offload), tried on the
    # memory-bound plans only (search.offload.activation_offload_rows); () leaves it out.
    # Small shares matter under full recomputation, where any swap moves every layer's input off HBM.
    activation_offloads: tuple[float, ...] = (0.03125, 0.0625, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
    # "needed": the shares are tried only for a candidate where no plan of the lattice fits HBM (MEMO's
    # million-token case); "always": wherever they may pay (memory-bound plans and full recomputation).
    activation_offload_when: str = "needed"
    dimensions: dict = field(default_factory=dict)  # filled by build_space for the report


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def level_groups(machine: Machine, tp: int, replicas: int, multiple_of: int = 1) -> list[int]:
    """Replica counts a sharding group may have with this tp: the dp x cp replicas inside one group of
    each topology level (when they divide the replicas, and are a multiple of ``multiple_of``), and
    all of them; ascending."""
    sizes = {int(size) // tp for size in machine.topology.sizes if int(size) % tp == 0}
    return sorted({m for m in sizes if 1 < m < replicas and replicas % m == 0 and m % multiple_of == 0} | {replicas})


def sharding_schemes(machine: Machine, tp: int, replicas: int, zero: int, options: "SpaceOptions",
                     cp: int = 1) -> list[tuple]:
    """(shard, shard_grads, shard_weights, hpz, qwz, qgz) of every sharding the families allow for ZeRO
    stage ``zero`` (0 in a group field: the next larger state's group, the plan's default); flat first."""
    fam, r = set(options.sharding), replicas
    levels = level_groups(machine, tp, r, cp if options.shard_whole_cp else 1)
    sub = zero in options.hsdp_zero
    nested = []                                   # widest groups first: flat ZeRO leads, as before
    down = levels[::-1]
    for o in (down if zero >= 1 else [1]):
        for g in ([x for x in down if x <= o and o % x == 0] if zero >= 2 else [1]):
            for w in ([x for x in down if x <= g and g % x == 0] if zero >= 3 else [1]):
                nested.append((o, g, w))
    out = []
    for o, g, w in nested:
        kind = ("flat" if o in (1, r) and g in (1, o) and w in (1, g) else
                "hsdp" if g in (1, o) and w in (1, g) else
                "hfsdp" if w in (1, g) and o == r else "levels")
        if kind != "flat" and not sub:
            continue
        if kind != "flat" and not (kind in fam or (kind == "hfsdp" and "levels" in fam)):
            continue
        groups = (0 if o in (1, r) else o, 0 if g in (1, o) else g, 0 if w in (1, g) else w)
        zeropp = zero >= 3 and (kind == "flat" or options.zeropp_with_groups)
        hpzs = [0] + ([h for h in levels if h < w and w % h == 0] if zeropp and "hpz" in fam else [])
        for h in hpzs:
            for qwz in ((False, True) if zeropp and "qwz" in fam else (False,)):
                for qgz in ((False, True) if zeropp and "qgz" in fam else (False,)):
                    out.append((*groups, h, qwz, qgz))
    return out


def build_space(spec: TransformerSpec, machine: Machine, work: TrainWorkload,
                options: SpaceOptions = SpaceOptions()) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Plan columns of every valid lattice point, and the declared size of each dimension."""
    n = machine.devices
    domain = machine.scale_up_domain
    kv = spec.kv_heads
    tps = [t for t in _divisors(n) if t <= domain and spec.num_heads % t == 0 and (kv % t == 0 or t % kv == 0)
           and (options.tps is None or t in options.tps)]
    cps = [c for c in _divisors(n) if c <= options.max_cp and work.seq_len % c == 0]
    pps = [p for p in _divisors(n) if p <= spec.num_layers and p <= (options.max_pp or n)]
    eps = ([e for e in _divisors(n) if spec.moe.num_experts % e == 0 and e <= (options.max_ep or n)]
           if spec.moe else [1])
    precisions = [p for p in options.precisions if machine.supports(p)]
    # Recomputing the norms, MLA's up-projections and the MoE activation saves memory only where
    # there is MLA or MoE; elsewhere it is selective recomputation at a higher price.
    recomputes = [r for r in options.recomputes if r != "modules" or spec.mla or spec.moe]
    etps = (0, 1) if spec.moe else (0,)          # 0: expert TP = tp (Megatron's default); 1: experts unsplit
    sps = sorted({int(bool(on)) for on in options.sequence_parallel})
    # Every (tp, cp, replicas) a layout can have, with its (zero, sharding) choices.
    keys = {(tp, cp, n // (tp * pp)) for tp, cp, pp in itertools.product(tps, cps, pps) if n % (tp * cp * pp) == 0}
    stage_schemes = {key: [(z, *scheme) for z in options.zero_stages
                           for scheme in sharding_schemes(machine, key[0], key[2], z, options, key[1])] for key in keys}
    widest = max((sum(1 for z, *_ in schemes if z == stage) for schemes in stage_schemes.values()
                  for stage in options.zero_stages), default=1)
    declared = {"tp": len(tps), "pp": len(pps), "cp": len(cps), "ep": len(eps), "etp": len(etps),
                "interleave": len(options.interleaves), "ends as layers": 2,
                "cp communication": len(options.cp_comms), "dispatcher": len(options.dispatchers) if spec.moe else 1,
                "micro_batch": len(options.micro_batches), "zero": len(options.zero_stages),
                "sharding (groups, hpZ, quantized collectives)": max(widest, 1),
                "recompute": len(recomputes), "sp": len(sps), "precision": len(precisions),
                "offload (optimizer x gradients x parameters)": len(options.offload_places) ** 3}
    comms = {(tp, cp): _cp_comms(spec, tp, cp, options.cp_comms) for tp, cp in itertools.product(tps, cps)}
    flex = [DISPATCHERS.index(d) for d in options.dispatchers if d != "alltoall"] if machine.runs_flex_dispatcher else []
    dispatchers = {ep: [Dispatcher.ALLTOALL] * ("alltoall" in options.dispatchers or ep == 1 or not flex)
                   + (flex if ep > 1 else []) for ep in eps}
    rows = []
    for tp, cp, pp in itertools.product(tps, cps, pps):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        for mb in options.micro_batches:
            if work.global_batch % (mb * dp):
                continue
            micro = work.global_batch // (mb * dp)
            for v, ends in itertools.product(options.interleaves, (False, True) if pp > 1 else (False,)):
                if (v > 1 and (pp == 1 or micro % pp)) or pp * v > spec.num_layers + (2 + spec.mtp_layers) * ends \
                        or (ends and spec.mtp_layers and layers_on_stage(spec.num_layers, pp, pp - 1, ends,
                                                                         spec.mtp_layers) < 0):
                    continue
                for ep, etp, comm in itertools.product(eps, etps, comms[tp, cp]):
                    if (etp == 0 and (dp * cp) % ep) or (etp == 1 and (tp == 1 or (tp * dp * cp) % ep)):
                        continue
                    rows.extend((tp, pp, dp, cp, ep, etp, v, mb, ends, comm, d) for d in dispatchers[ep])
    if not rows or not precisions:
        return {}, declared
    base = np.array(rows, dtype=np.int64)
    cheap = np.array(list(itertools.product([RECOMPUTE.index(r) for r in recomputes], sps,
                                            [PRECISIONS.index(p) for p in precisions])), dtype=np.int64)
    # Per (tp, replicas): every (zero, sharding) choice times every (recompute, sp, precision), zero-major.
    # Sequence parallelism needs tp > 1: with tp 1 only the rows without it (each choice once).
    without_sp = np.array(list(dict.fromkeys((r, 0, p) for r, _, p in cheap.tolist())), dtype=np.int64)
    tables = {}
    for pair, schemes in stage_schemes.items():
        stages = np.array(schemes, dtype=np.int64).reshape(-1, 7)
        allowed = cheap if pair[0] > 1 else without_sp
        tables[pair] = np.hstack([np.repeat(stages, len(allowed), axis=0), np.tile(allowed, (len(stages), 1))])
    per_row = [tables[(int(tp), int(cp), int(dp * cp))] for tp, _, dp, cp, *_ in rows]
    counts = np.array([len(t) for t in per_row])
    rep_base = np.repeat(base, counts, axis=0)
    rep_cheap = np.concatenate(per_row) if per_row else np.zeros((0, 10), dtype=np.int64)
    cols = {name: rep_base[:, i] for i, name in enumerate(("tp", "pp", "dp", "cp", "ep", "etp", "interleave",
                                                             "micro_batch", "ends_as_layers", "cp_comm",
                                                             "dispatcher"))}
    cols["ends_as_layers"] = cols["ends_as_layers"].astype(bool)
    cols.update(zero=rep_cheap[:, 0], shard=rep_cheap[:, 1], shard_grads=rep_cheap[:, 2],
                shard_weights=rep_cheap[:, 3], hpz=rep_cheap[:, 4], qwz=rep_cheap[:, 5].astype(bool),
                qgz=rep_cheap[:, 6].astype(bool), recompute=rep_cheap[:, 7], sp=rep_cheap[:, 8].astype(bool),
                precision=rep_cheap[:, 9])
    # A dominated choice (off) is not searched, where the device and the framework can overlap.
    cols["tp_overlap"] = cols["sp"] & (options.tp_overlap and machine.overlaps_tp_communication)
    cols["ep_overlap"] = ep_overlap_allowed(cols) & options.ep_overlap
    cols["flash"] = np.full(len(cols["tp"]), options.flash)
    zeros = np.zeros(len(cols["tp"]), dtype=np.int64)
    cols.update(optimizer_place=zeros, grad_place=zeros, param_place=zeros, moe_imbalance=np.zeros(len(zeros)),
                activation_offload=np.zeros(len(zeros)))
    return cols, declared


def _cp_comms(spec: TransformerSpec, tp: int, cp: int, allowed: tuple[str, ...] = CP_COMMS) -> list[int]:
    """CpComm codes a layout may use, of those ``allowed``: the ring alone without context
    parallelism; with it also the all-gather, and Ulysses where cp divides the query and KV heads
    of a TP rank."""
    if cp == 1:
        return [CpComm.P2P]
    kv = spec.num_heads if spec.mla else spec.kv_heads
    ulysses = (spec.num_heads // tp) % cp == 0 and max(kv // tp, 1) % cp == 0
    usable = [CpComm.P2P, CpComm.ALL_GATHER] + ([CpComm.A2A] if ulysses else [])
    return [c for c in usable if CP_COMMS[c] in allowed] or [CpComm.P2P]


def ep_overlap_allowed(cols: dict):
    """Where Megatron-Core (core_v0.15.0 to core_v0.19.0, TransformerConfig.__post_init__) runs the
    MoE exchange under compute (--overlap-moe-expert-parallel-comm): expert parallelism, no full
    recomputation, and a virtual pipeline whenever the pipeline has more than one stage."""
    return (np.asarray(cols["ep"]) > 1) & (np.asarray(cols["recompute"]) != RECOMPUTE.index("full")) \
        & ((np.asarray(cols["pp"]) == 1) | (np.asarray(cols["interleave"]) > 1))


def declared_size(declared: dict[str, int]) -> int:
    """The size of the full cartesian product the space declares (before the validity rules)."""
    return int(np.prod(list(declared.values()), dtype=float))
