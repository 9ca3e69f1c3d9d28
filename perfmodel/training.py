"""Training step time, memory, energy and cost of plans, vectorized over plan columns.

One call evaluates one plan or a million: every plan field may be a numpy array and all of them
broadcast. The plan's device layout (``layout.Layout``: TP innermost, then CP, DP and PP, with
the experts folded over each stage's devices) decides each group's topology level and each
device's share. The estimate is a sequence of named terms, each a small frozen dataclass:
compute, communication, gradient reduction, optimizer, memory, feasibility.

References
----------
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC21: Sec. 2.2 (1F1B and interleaved schedules; bubble (p-1)/(v m)), Sec. 3.2 (TP: two all-reduces
per layer forward and two backward), Sec. 5.1 (FLOPs; backward = 2 x forward).
Korthikanti et al. 2022, Sec. 4-5 (sequence parallelism: all-gather + reduce-scatter in place of
each all-reduce, same volume; selective and full recompute).
Rajbhandari et al., ZeRO, SC20, Sec. 7 (communication: stages 1-2 as an all-reduce, stage 3 adds
an all-gather of the parameters in forward and backward, 1.5x) and ZeRO-Offload (Ren et al.,
USENIX ATC 2021, Sec. 4: gradients to the CPU during backward, Adam on the CPU, fp16 parameters
back) and ZeRO-Infinity (Rajbhandari et al., SC21, Sec. 5: parameters streamed from CPU or NVMe).
Lepikhin et al., "GShard", 2020, and Rajbhandari et al., "DeepSpeed-MoE", ICML 2022: two
all-to-alls (dispatch, combine) per MoE layer forward and two backward.
Liu et al., "Ring Attention", 2023: context parallelism passes K and V around a ring of cp ranks,
overlapped with the blockwise attention.
Hierarchical sharding (``sharding.Sharding``): Zhang et al., "MiCS", VLDB 2022, arXiv:2205.00119
(partition and replication groups; its 2-hop gradient synchronization: reduce-scattered inside the
partition group with every microbatch, all-reduced across replication groups once per step); Wang et
al., "ZeRO++", 2023,
Sec. 3.1-3.3 (qwZ, hpZ, qgZ); Xu et al., arXiv:2501.04266, 2025 (weights, gradients and optimizer
states each over its own level of Frontier's GCD / GPU / node hierarchy).
Chowdhery et al., "PaLM", 2022, App. B: model FLOPs utilization.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from perfmodel.hardware_db.schema import PRECISIONS

from .layout import Layout
from .machine import Machine
from .memory import (GRAD_BYTES, WEIGHT_BYTES, activation_bytes_per_layer, dualpipe_rank_layers, in_flight_layers,
                     layers_on_stage, model_state_bytes, split_layers, stage_layers, state_bytes_per_param)
from .model import TransformerSpec
from .plan import (CP_COMMS, INTERLEAVED, OVERLAP, PLACES, RECOMPUTE, SCHEDULES, STORAGES, TIERS, CpComm, Overlap,
                   Place, Recompute, Schedule, Storage)
from .power import device_power_w, run_cost
from .kernels import distinct_rows, on_distinct
from .roofline import OpTimes, layer_ops, lm_head_ops, merge, mtp_ops, ops_time
from .sharding import QGZ_BYTES, Sharding



@dataclass(frozen=True)
class TrainPlan:
    """Plan columns (scalars or equal-length arrays). Precision, recompute and places are names or codes."""

    tp: object = 1
    pp: object = 1
    dp: object = 1
    cp: object = 1
    cp_comm: object = "p2p"           # plan.CpComm: how context parallelism moves K and V
    ep: object = 1
    etp: object = 0                   # expert tensor parallelism; 0: the same as tp
    interleave: object = 1
    ends_as_layers: object = False    # the embedding and the loss each take a layer's pipeline slot (memory.stage_layers)
    micro_batch: object = 1
    zero: object = 0
    recompute: object = "none"
    sp: object = False
    precision: object = "bf16"
    optimizer_place: object = "hbm"
    grad_place: object = "hbm"
    param_place: object = "hbm"
    flash: object = True              # see ATTENTION
    overlap_dp: object = True         # bucketed gradient reduction overlapped with backward
    overlap: object = "framework"     # see plan.Overlap
    tp_overlap: object = False        # Megatron's TP-communication overlap (with sequence parallelism)
    ep_overlap: object = False        # MoE dispatch and combine under another microbatch's compute (see _overlap)
    schedule: object = "1f1b"         # plan.Schedule: 1F1B (interleaved with virtual stages) or DualPipe
    storage: object = "mixed"         # plan.Storage: mixed-precision Adam, or DeepSeek-V3's low-precision storage
    moe_imbalance: object = 0.0       # busiest over mean EP device load; 0: the named constant
    shard: object = 0                 # replica ranks ZeRO shards its states over (0: all dp x cp; see sharding)
    shard_grads: object = 0           # ... the gradients over (0: as the optimizer states)
    shard_weights: object = 0         # ... the weights over, with zero 3 (0: as the gradients)
    hpz: object = 0                   # ZeRO++ secondary weight partition for the backward gathers (0: none)
    qwz: object = False               # ZeRO++ int8 weight gathers
    qgz: object = False               # ZeRO++ int4 gradient reduce-scatter (two all-to-alls)
    prefetch: object = 1              # ZeRO-3 layers gathered ahead of the one computing (FSDP's default 1; 0: none)

    def columns(self) -> dict[str, np.ndarray]:
        """Every field as a numpy array, names turned into codes (numeric columns pass through)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = np.asarray(getattr(self, name))
            codes = {"recompute": RECOMPUTE, "precision": PRECISIONS, "optimizer_place": PLACES,
                     "grad_place": PLACES, "param_place": PLACES, "overlap": OVERLAP,
                     "schedule": SCHEDULES, "storage": STORAGES, "cp_comm": CP_COMMS}.get(name)
            if codes is not None and value.dtype.kind in "USO":
                lookup = {c: i for i, c in enumerate(codes)}
                value = np.vectorize(lambda v: lookup[v] if isinstance(v, str) else int(v), otypes=[int])(value)
            out[name] = value
        return out


@dataclass(frozen=True)
class TrainWorkload:
    """Global batch in sequences, sequence length, and total training tokens (for run totals)."""

    global_batch: int
    seq_len: int
    tokens: float = 0.0


@dataclass
class TrainResult:
    """Per-plan arrays: times (s), memory (bytes per device), rates, energy (J), cost (USD)."""

    step_time_s: np.ndarray
    components: dict[str, np.ndarray]
    bounds: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    tier_bytes: dict[str, np.ndarray]
    tokens_per_s: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    power_w: np.ndarray
    energy_per_token_j: np.ndarray
    cost_per_hour_usd: np.ndarray
    cost_per_million_tokens_usd: np.ndarray
    run_time_s: np.ndarray
    run_energy_kwh: np.ndarray
    run_cost_usd: np.ndarray
    hbm_used_bytes: np.ndarray    # per device, with the reserve
    feasible: np.ndarray
    binding_code: np.ndarray      # 0 when feasible, else 1 + index into constraint_names
    shortfall: np.ndarray         # by how much (bytes, or the ratio for divisibility), 0 when feasible
    constraint_names: tuple[str, ...] = ()
    num_microbatches: np.ndarray = 0.0
    operator_times: dict[str, np.ndarray] = field(default_factory=dict)   # per step, busiest device
    operator_flops: dict[str, np.ndarray] = field(default_factory=dict)   # per step, busiest device (fwd+bwd)
    operator_bytes: dict[str, np.ndarray] = field(default_factory=dict)   # per step, busiest device (fwd+bwd)
    busy_fraction: np.ndarray = 0.0
    model_flops_per_step: np.ndarray = 0.0       # the model's FLOPs (causal when the kernel is), all devices
    executed_flops_per_step: np.ndarray = 0.0    # summed over devices, with recompute
    memory_stage: np.ndarray = 0                 # the pipeline stage whose memory is reported (the fullest)
    link_times: dict[str, np.ndarray] = field(default_factory=dict)     # per step, each transfer on its link
    step_time_low_s: np.ndarray = 0.0            # prediction interval of the step (Machine.interval)
    step_time_high_s: np.ndarray = 0.0

    @property
    def binding(self) -> np.ndarray:
        """Name of the violated constraint of each plan ("" when feasible)."""
        return np.asarray(("",) + self.constraint_names, dtype=object)[self.binding_code]


# Rows evaluated per pass: blocks of this size keep each temporary array in the CPU cache (several
# times faster than one pass over a million rows), and numpy releases the GIL inside each array
# operation, so blocks run on every core at once (benchmarks/bench_evaluate.py measures both).
BLOCK_ROWS = 16384
# Up to this many rows one pass is faster than blocks on threads (60,072 rows of the 1T plan on 2
# cores: 0.075 s in one pass, 0.085 s in four blocks); beyond it, blocks.
SINGLE_PASS_ROWS = 4 * BLOCK_ROWS


def estimate_training(spec: TransformerSpec, machine: Machine, plan: TrainPlan, work: TrainWorkload,
                      detail: bool = True, threads: int | None = None) -> TrainResult:
    """Step time, memory per tier, MFU, energy and cost of every plan (Narayanan et al. 2021 Sec. 2-3).

    Plan columns broadcast; a long plan is evaluated in cache-sized blocks and joined. With
    ``detail=False`` (the search's mode) the per-component breakdowns (time components, link
    times, operators) are left empty and only the per-plan totals and memory are computed.
    ``threads``: the threads a long plan's blocks run on (None: every core).
    """
    return _in_blocks(lambda c: _estimate(spec, machine, c, work, detail), plan, threads)


@dataclass(frozen=True)
class Screen:
    """Memory and the validity rules of every plan, before any time is computed: what a search
    decides first (most plans of a large model do not fit, and need no step time)."""

    binding_code: np.ndarray      # 0 when feasible, else 1 + index into constraint_names
    shortfall: np.ndarray         # by how much, 0 when feasible (as TrainResult's)
    hbm_used_bytes: np.ndarray    # per device, with the reserve
    constraint_names: tuple[str, ...] = ()

    @property
    def feasible(self) -> np.ndarray:
        return self.binding_code == 0

    @property
    def binding(self) -> np.ndarray:
        """Name of the violated constraint of each plan ("" when feasible)."""
        return np.asarray(("",) + self.constraint_names, dtype=object)[self.binding_code]


def screen_training(spec: TransformerSpec, machine: Machine, plan: TrainPlan, work: TrainWorkload,
                    threads: int | None = None) -> Screen:
    """Feasibility and memory of every plan, exactly as estimate_training decides them (``threads``: as there)."""
    def block(c: dict) -> Screen:
        sh = _shape(spec, machine, c, work)
        mem = _memory(spec, machine, c, sh, work, parts=False)
        code, shortfall, names = _feasibility(spec, machine, c, sh, mem, work)
        return Screen(code, shortfall, mem.hbm_used, names)

    return _in_blocks(block, plan, threads)


def step_time_floor(spec: TransformerSpec, machine: Machine, plan: TrainPlan, work: TrainWorkload) -> np.ndarray:
    """A lower bound of each plan's step time (s) from its compute alone: every microbatch's
    forward, backward and recompute plus the pipeline bubble's share of it. Every other term of
    the step (exposed transfers, the tail, the optimizer) adds a non-negative time, and the
    exposed microbatch is never shorter than its compute (_overlap), so no plan is faster.
    The plans of a search share few compute shapes (COMPUTE_FIELDS): each is evaluated once."""
    defaults = TrainPlan().columns()

    def floor(*values) -> np.ndarray:
        # Only the compute fields reach the formulas; the rest keep their defaults, so the floor
        # depends on nothing else and each distinct compute row is evaluated once.
        c = {**defaults, **dict(zip(COMPUTE_FIELDS, values))}
        sh = _shape(spec, machine, c, work)
        comp = _compute(spec, machine, c, sh, work, False)
        v = np.maximum(c["interleave"], 1)
        bubble = np.where(c["schedule"] == Schedule.DUALPIPE, _dualpipe_bubble(sh.layout.pp, comp),
                          (sh.layout.pp - 1) / v * comp.per_micro_s)
        return sh.num_micro * comp.per_micro_s + bubble

    columns = plan.columns()
    shape = np.broadcast(*columns.values()).shape
    return np.broadcast_to(on_distinct(floor, *(columns[f] for f in COMPUTE_FIELDS)), shape)


# The plan fields the compute of a microbatch and the bubble depend on (_shape's workload terms,
# _compute, the schedule); sharding, offload and overlap only add transfers and memory.
COMPUTE_FIELDS = ("tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "interleave", "ends_as_layers", "micro_batch",
                  "recompute", "sp", "flash", "precision", "schedule", "moe_imbalance")


def _in_blocks(evaluate: Callable[[dict], object], plan: TrainPlan, threads: int | None = None):
    """``evaluate`` over the plan's columns: in one pass, or in cache-sized blocks on ``threads`` threads
    (None: one per core, at most 8; a process pool that already keeps every core busy, as perfmodel
    sweep's, passes 1), joined."""
    columns = plan.columns()
    n = int(np.broadcast(*columns.values()).size)
    if n <= SINGLE_PASS_ROWS:
        return evaluate(columns)
    from concurrent.futures import ThreadPoolExecutor

    full = {k: np.broadcast_to(v, (n,)) for k, v in columns.items()}
    with ThreadPoolExecutor(max_workers=threads or min(os.cpu_count() or 1, 8)) as pool:
        parts = list(pool.map(lambda start: evaluate({k: v[start:start + BLOCK_ROWS] for k, v in full.items()}),
                              range(0, n, BLOCK_ROWS)))
    if isinstance(parts[0], np.ndarray):
        return _join(parts, n)
    kind = type(parts[0])
    # Breakdowns left empty (estimate_training without ``detail``) stay empty; memory and tier
    # bytes are always joined.
    return kind(**{f: _join([getattr(p, f) for p in parts], n)
                   if not isinstance(getattr(parts[0], f), dict) or getattr(parts[0], f) else {}
                   for f in kind.__dataclass_fields__})


def _join(values: list, n: int):
    """Concatenate the per-block values of one result field (arrays, or dicts of them)."""
    if isinstance(values[0], tuple):
        return values[0]
    if isinstance(values[0], dict):
        return {k: _join([v[k] for v in values], n) for k in values[0]}
    return np.concatenate([np.broadcast_to(v, (min(BLOCK_ROWS, n - i * BLOCK_ROWS),))
                           for i, v in enumerate(values)])


@dataclass(frozen=True)
class Shape:
    """What a plan makes of the workload: microbatches, tokens per TP group, attended keys."""

    layout: Layout
    num_micro: np.ndarray          # microbatches per step per pipeline
    tokens: np.ndarray             # tokens of one microbatch on one TP group: b s / cp
    context: np.ndarray            # mean keys a query attends to (causal with flash)
    layers: np.ndarray             # layers of the last stage (it also runs the LM head)
    headless_layers: np.ndarray    # layers of the fullest stage without the head (memory.split_layers)
    ends: np.ndarray               # the embedding and the loss take a pipeline slot each (pp > 1 only)
    moe_frac: float                # share of layers with routed experts
    imbalance: object              # busiest over mean expert load
    gemm_input_bytes: np.ndarray   # 1 for fp8 GEMMs (inputs cast and kept in fp8), else 2
    sharding: Sharding             # the group each dense model state is sharded over


@dataclass(frozen=True)
class Compute:
    """Per microbatch on the busiest stage (s), and the FLOPs of the whole step."""

    forward: OpTimes               # one forward pass of the busiest stage's layers (and the LM head on the last)
    layers: np.ndarray             # the busiest stage's layers
    last: np.ndarray               # whether the busiest stage is the last (it holds the head)
    recompute_s: np.ndarray
    per_micro_s: np.ndarray        # forward + backward + recompute
    model_flops: np.ndarray        # per step, all devices, the model's FLOPs as the kernels compute them
    executed_flops: np.ndarray     # the same plus what recompute executes again


@dataclass(frozen=True)
class Communication:
    """Per microbatch on the busiest stage: each transfer's time on its link (s), before overlap."""

    tp: np.ndarray
    ep: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    zero3: np.ndarray              # ZeRO-3 parameter all-gathers (one per layer and pass) ...
    zero3_forward: np.ndarray      # ... of which the forward pass's
    zero3_reduce: np.ndarray       # ... and gradient reduce-scatters, on the same replicas' link
    param_fetch: np.ndarray        # parameters streamed from their tier (ZeRO-Infinity)


@dataclass(frozen=True)
class StepTail:
    """Once per step (s): transfers on their links, the window they may hide under, the optimizer."""

    dp: np.ndarray                 # gradient reduction (and ZeRO-2 gathers) on the network
    dp_overlap: np.ndarray         # share of the last backward it may hide under (0 when not overlapped)
    host: np.ndarray               # offloaded gradients out, over the host path (may hide under backward)
    optimizer: np.ndarray          # the Adam step, on the device or on the CPU over the states' tier
    optimizer_on_device: np.ndarray
    weights_back: np.ndarray       # updated weights back to the device after an off-device step


@dataclass(frozen=True)
class Exposure:
    """What the overlap leaves on the critical path: per microbatch (s) and once per step (s)."""

    per_micro: np.ndarray
    micro: dict[str, np.ndarray]   # per microbatch, by transfer
    pp: np.ndarray                 # per microbatch
    tail: dict[str, np.ndarray]    # per step, by transfer


@dataclass(frozen=True)
class Memory:
    """Bytes per device of the fullest pipeline stage, by part and by tier."""

    parts: dict[str, np.ndarray]   # without parts (_memory's screen): only the offloaded ones
    hbm_used: np.ndarray           # with the reserve
    tier_bytes: dict[str, np.ndarray]
    stage: np.ndarray | None       # the fullest stage (None without parts)


def _shape(spec: TransformerSpec, machine: Machine, c: dict, work: TrainWorkload) -> Shape:
    layout = Layout(c["tp"], c["cp"], c["dp"], c["pp"], c["ep"], c["etp"])
    s = float(work.seq_len)
    flash = c["flash"].astype(bool)
    moe = spec.moe is not None
    ends = np.asarray(c["ends_as_layers"], dtype=bool) & (layout.pp > 1)
    # The plans share few pipeline depths: each split is computed once.
    _, headless, last = on_distinct(lambda pp, e: list(split_layers(spec.num_layers, pp, e, spec.mtp_layers)),
                                    layout.pp, ends)
    return Shape(
        layout=layout,
        num_micro=np.maximum(work.global_batch / (np.maximum(c["micro_batch"], 1) * layout.dp), 1.0),
        tokens=np.maximum(c["micro_batch"], 1) * s / layout.cp,
        # Causal kernels skip the masked half (and windowed layers attend to their window); the
        # 2021 kernels computed every score.
        context=np.where(flash, spec.attended_context(s, causal=True), spec.attended_context(s)),
        layers=last,
        headless_layers=headless,
        ends=ends,
        moe_frac=spec.moe_layers / spec.num_layers if moe else 0.0,
        imbalance=np.where(c["moe_imbalance"] > 0, c["moe_imbalance"],
                           machine.constants.get("moe-load-imbalance", 1.0)) if moe else 1.0,
        gemm_input_bytes=np.where(c["precision"] == PRECISIONS.index("fp8"), 1.0, 2.0),
        sharding=Sharding.of(c["zero"], layout.dense_replicas, *(c[k] for k in SHARDING_FIELDS)))


SHARDING_FIELDS = ("shard", "shard_grads", "shard_weights", "hpz", "qwz", "qgz")


def _rates(machine: Machine, precision_code) -> dict:
    """Achievable FLOP/s per operator unit. GEMMs run at the plan's precision; attention at the
    16-bit format of the plan (fp16 plans in fp16, bf16 and fp8 plans in bf16: Transformer
    Engine keeps the attention core in 16 bits), or fp16 on a device without bf16."""
    gemm = machine.flops_table()[precision_code]
    sixteen = "bf16" if machine.supports("bf16") else "fp16"
    attention_table = np.array([machine.achievable_flops.get("fp16" if p == "fp16" else sixteen, np.nan)
                                for p in PRECISIONS])
    attention = attention_table[precision_code]
    for rate in (gemm, attention):
        if np.isnan(rate).any():
            bad = PRECISIONS[int(np.asarray(precision_code).flat[int(np.argmax(np.isnan(np.atleast_1d(rate))))])]
            machine.flops(bad if np.isnan(gemm).any() else sixteen)  # raises with the precisions the device lists
    return {"gemm": gemm, "attention": attention, "vector": np.inf}


def _layer_times(spec: TransformerSpec, machine: Machine, precision, sp, flash, tokens, context, gemm_input_bytes,
                 imbalance, tp, cp, dp, ep, etp, cp_steps=None, keep_bytes: bool = True) -> tuple:
    """Forward and backward times of one dense layer, one MoE layer, the head and the MTP depths
    (None where the model has none) for one microbatch on one device; ``cp_steps`` attention
    kernels per layer (a context-parallel ring's steps; default cp)."""
    lay = Layout(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)
    rates, bw = _rates(machine, precision), machine.hbm_bytes_per_s
    kernels = (machine.gemm_kernel(precision), machine.attention_kernel("bf16" if machine.supports("bf16") else "fp16"))
    kw = dict(sp=sp, act_bytes=gemm_input_bytes, flash=flash, cp_steps=cp_steps)
    kb = dict(keep_bytes=keep_bytes, attention_backward=(machine.constants.get("attention-backward-slowdown", 1.0),
                                                         machine.constants.get("attention-backward-slowdown-1k", 0.0)))
    dense = ops_time(layer_ops(spec, tokens, context, lay, **kw), rates, bw, *kernels, **kb)
    # Routed experts on the grouped-GEMM fit where the device has one (fp8 block-scaled for a
    # model trained in fp8 with block scales, DeepSeek-V3 Sec. 3.3), at the framework's rate.
    grouped = machine.grouped_kernel(precision, block=spec.native_precision == "fp8", in_framework=True) \
        if spec.moe else None
    moe = ops_time(layer_ops(spec, tokens, context, lay, moe_layer=True, imbalance=imbalance, **kw),
                   rates, bw, *kernels, grouped=grouped, **kb) if spec.moe else None
    # The output head keeps 16 bits in fp8 training: Megatron-Core's output layer is a plain
    # ColumnParallelLinear, outside Transformer Engine's fp8 autocast (models/gpt/gpt_model.py), and
    # DeepSeek-V3 keeps 'the embedding module, the output head' in BF16 (Sec. 3.3.1).
    wide = _sixteen_bit(machine, precision)
    head_kernels, head_rates = (machine.gemm_kernel(wide), kernels[1]), _rates(machine, wide)
    head = ops_time(lm_head_ops(spec, tokens, lay.tp), head_rates, bw, *head_kernels, **kb)
    mtp = None
    if spec.mtp_layers:   # the last stage also runs the multi-token-prediction depths (DeepSeek-V3 Sec. 2.2)
        ops = mtp_ops(spec, tokens, context, lay, sp, gemm_input_bytes, imbalance, flash)
        head_op = [op.name in ("mtp lm head", "mtp cross entropy") for op in ops]
        mtp = merge(ops_time([op for op, h in zip(ops, head_op) if not h], rates, bw, *kernels, grouped=grouped, **kb),
                    ops_time([op for op, h in zip(ops, head_op) if h], head_rates, bw, *head_kernels, **kb)
                    ).scaled(spec.mtp_layers)
    return dense, moe, head, mtp


def _sixteen_bit(machine: Machine, precision):
    """PRECISIONS codes of the 16-bit format an 8-bit (or narrower) plan keeps where it does not
    quantize (bf16, or fp16 on a device without it); wider plans keep their own."""
    sixteen = PRECISIONS.index("bf16" if machine.supports("bf16") else "fp16")
    narrow = np.isin(precision, [PRECISIONS.index(p) for p in ("fp8", "int8", "fp4", "int4")])
    return np.where(narrow, sixteen, precision)


def _compute(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, work: TrainWorkload,
             breakdown: bool = True) -> Compute:
    """Forward, backward (each GEMM's data- and weight-gradient kernels, every other operator 2 x
    forward; Narayanan et al. 2021 Sec. 5.1) and recompute of one microbatch on the busiest
    stage, and the step's FLOPs summed over every device."""
    lay, sp, flash = sh.layout, c["sp"].astype(bool), c["flash"].astype(bool)
    # A ring runs one attention kernel per step; a gathered or head-split sequence runs one.
    steps = np.where(c["cp_comm"] == CpComm.P2P, lay.cp, 1)
    inputs = (c["precision"], sp, flash, sh.tokens, sh.context, sh.gemm_input_bytes, sh.imbalance,
              lay.tp, lay.cp, lay.dp, lay.ep, lay.etp, steps)
    rows = distinct_rows(*inputs)
    if rows is None:
        dense, moe, head, mtp = _layer_times(spec, machine, *inputs, keep_bytes=breakdown)
    else:  # the plans' few distinct layer shapes, evaluated once each
        first, inverse = rows
        picked = [np.broadcast_to(np.asarray(x), inverse.shape)[first] for x in inputs]
        dense, moe, head, mtp = (t.take(inverse) if t is not None else None
                                 for t in _layer_times(spec, machine, *picked, keep_bytes=breakdown))
    recompute = c["recompute"]
    up_share = _mla_up_share(spec)

    def stage(layers, ends: tuple) -> tuple[OpTimes, np.ndarray]:
        """A stage's forward of ``layers`` layers and ``ends`` (the head and MTP), and its recompute."""
        parts = [dense.scaled(layers * (1 - sh.moe_frac))] if spec.dense_layers else []
        if moe is not None:
            parts.append(moe.scaled(layers * sh.moe_frac))
        forward = merge(*parts, *ends)
        core = forward.seconds["attention core"]
        lean = core + forward.seconds["norms and activations"] + up_share * forward.seconds["qkv projection"]
        again = np.select([recompute == Recompute.FULL, recompute == Recompute.SELECTIVE,
                           recompute == Recompute.MODULES], [sum(p.total for p in parts), core, lean], 0.0)
        return forward, again

    ends = (head, *([mtp] if mtp else []))
    forward, recompute_s = stage(sh.layers, ends)
    layers, last = sh.layers, np.ones(np.shape(sh.layers), dtype=bool)
    if np.any(sh.headless_layers > sh.layers):
        # With the ends in the split a stage without the head may hold more layers and set the pace.
        forward, recompute_s, layers, last = _pace(forward, recompute_s, sh.layers, stage(sh.headless_layers, ()),
                                                   sh.headless_layers)
    dualpipe = c["schedule"] == Schedule.DUALPIPE
    if np.any(dualpipe):
        # A DualPipe rank runs half the microbatches through each of its two stages, so its
        # microbatch costs their mean: the head's stage beside the embedding's on rank 0.
        paired, others = dualpipe_rank_layers(spec.num_layers, sh.layout.pp, sh.ends, spec.mtp_layers)
        first, first_again = stage(paired - sh.layers, ())
        last_forward, last_again = stage(sh.layers, ends)
        rank0 = (merge(first.scaled(0.5), last_forward.scaled(0.5)), 0.5 * (first_again + last_again))
        paced = _pace(*rank0, paired / 2.0, stage(others / 2.0, ()), others / 2.0)
        forward = paced[0].where(dualpipe, forward)
        recompute_s, layers, last = (np.where(dualpipe, a, b) for a, b in zip(paced[1:], (recompute_s, layers, last)))
    # Summed over devices: each stage's tp x cp x dp devices, every layer once over the stages.
    layer_flops = dense.mean_flops * spec.dense_layers + (moe.mean_flops * spec.moe_layers if moe else 0.0)
    attention_flops = dense.flops["attention core"] * spec.num_layers
    per_micro = lay.stage_devices * sh.num_micro
    model_flops = per_micro * 3.0 * (layer_flops + head.mean_flops + (mtp.mean_flops if mtp else 0.0))
    up_flops = up_share * dense.flops["qkv projection"] * spec.num_layers
    again = np.select([recompute == Recompute.FULL, recompute == Recompute.SELECTIVE, recompute == Recompute.MODULES],
                      [layer_flops, attention_flops, attention_flops + up_flops], 0.0)
    return Compute(forward, layers, last, recompute_s, forward.total + forward.backward_total + recompute_s,
                   model_flops, model_flops + per_micro * again)


def _held(spec: TransformerSpec, lay: Layout, c: dict, comp: Compute, busiest: tuple) -> tuple:
    """(dense, routed-expert) parameters the pacing rank reduces and updates once per step: its
    stage's, or with DualPipe both of its stages' (comp.layers is their mean; rank 0's pair holds
    the embedding and the head), the two copies of Table 2 of the DeepSeek-V3 report."""
    dualpipe = c["schedule"] == Schedule.DUALPIPE
    if not np.any(dualpipe):
        return busiest
    both = lay.params_per_device(spec, np.where(dualpipe, 2.0, 1.0) * comp.layers,
                                 (lay.pp == 1) | (dualpipe & comp.last), comp.last)
    return tuple(np.where(dualpipe, b, a) for a, b in zip(busiest, both))


def _pace(forward: OpTimes, again, layers, other: tuple[OpTimes, np.ndarray], other_layers):
    """(forward, recompute, layers, whether the first) of whichever of two stages takes longer per
    microbatch (forward, backward and recompute): the one that paces the pipeline."""
    other_forward, other_again = other
    first = forward.total + forward.backward_total + again >= other_forward.total + other_forward.backward_total \
        + other_again
    return (forward.where(first, other_forward), np.where(first, again, other_again),
            np.where(first, layers, other_layers), first)


def _dualpipe_bubble(pp, comp: Compute):
    """DualPipe's bubble (DeepSeek-V3 report, Table 2): (PP/2 - 1)(F&B + B - 3W) in chunks, each
    rank holding two chunks of half a stage. F&B, a forward and a backward chunk overlapped, takes
    F + B + W of compute (their communication hides); the backward splits evenly into its input
    (B) and weight (W) gradients, as their GEMMs have equal FLOPs; so the bubble is (PP/2 - 1)
    times one chunk's forward (with its recompute), half the stage's."""
    forward = comp.forward.total + comp.recompute_s
    return np.maximum(pp / 2.0 - 1.0, 0.0) * forward / 2.0


def _mla_up_share(spec: TransformerSpec) -> float:
    """Share of the QKV projection's FLOPs that MLA's up-projections take (the rest: the fused
    down-projection of the query and KV latents); 0 without MLA."""
    if not spec.mla:
        return 0.0
    m = spec.mla
    down = spec.hidden_size * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim)
    qkv = spec.attention_params - spec.num_heads * m.v_head_dim * spec.hidden_size
    return float(max(1.0 - down / qkv, 0.0))


def _communication(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, comp: Compute,
                   stage_params: tuple) -> Communication:
    """Collectives of one microbatch on the busiest stage (Narayanan et al. 2021 Sec. 3.2 and 4.1;
    Korthikanti et al. 2022 Sec. 4; GShard / DeepSpeed-MoE; Ring Attention; ZeRO-3 and
    ZeRO-Infinity), each over its layout group's slowest link."""
    lay, topo, h = sh.layout, machine.topology, spec.hidden_size
    full = c["recompute"] == Recompute.FULL
    act = sh.tokens * h * 2.0                    # one layer's activation, bf16, per TP group
    passes = 4.0 + 2.0 * full                    # 2 forward + 2 backward (+2 in the recomputed forward)
    tp = comp.layers * passes * topo.all_reduce(act, lay.tp_group.stride, lay.tp_group.size)
    ep = 0.0
    if spec.moe:
        # Each device dispatches the rows it holds (tokens x etp / tp) to top-k experts, busiest load.
        # Training keeps this link model, not the DeepEP kernel fits serving uses: the Megatron and
        # NeMo exports run Megatron-Core's token dispatcher over NCCL (--moe-token-dispatcher-type
        # alltoall where the exchange overlaps), not DeepEP's kernels.
        token_bytes = lay.expert_rows(sh.tokens, 1) * h * 2.0 * sh.imbalance
        ep = comp.layers * sh.moe_frac * passes * topo.moe_all_to_all(token_bytes, spec.moe.top_k,
                                                                    lay.ep_group.stride, lay.ep_group.size)
    cp = comp.layers * _cp_exchange(spec, topo, c["cp_comm"], sh.tokens, lay) * (lay.cp > 1)
    # Scatter-gather: each TP rank sends 1/t, then an all-gather (Narayanan et al. Sec. 4.1).
    pp = 2.0 * np.maximum(c["interleave"], 1) * topo.p2p(act / lay.tp, lay.pp_neighbour_stride) * (lay.pp > 1)

    dense, expert = stage_params
    zero3 = c["zero"] >= 3
    # ZeRO-3 / FSDP gathers and reduce-scatters one layer (one FSDP unit) at a time: each pass
    # runs one collective per layer of a layer's parameters (Zhao et al., "PyTorch FSDP", VLDB
    # 2023: one all-gather per unit in the forward and in the backward, one
    # reduce-scatter per unit in the backward; DeepSpeed ZeRO-3 likewise per submodule), so
    # each collective pays its latency once per layer, at the layer's shard size.
    layers = np.maximum(comp.layers, 1.0)
    forward, backward = _dense_gathers(machine, lay, sh.sharding, dense / layers, full)
    gathers_forward = layers * forward
    gathers = gathers_forward + layers * backward
    scatters = layers * _dense_scatters(machine, lay, sh.sharding, dense / layers)
    if spec.moe:  # routed experts: flat ZeRO-3 over their expert-data-parallel group, per MoE layer
        moe_layers = np.maximum(comp.layers * sh.moe_frac, 1.0)
        expert_gather = moe_layers * topo.all_gather(expert / moe_layers * WEIGHT_BYTES, lay.edp_group.stride,
                                                     lay.edp_group.size)
        gathers_forward = gathers_forward + expert_gather
        gathers = gathers + (2.0 + full) * expert_gather
        scatters = scatters + moe_layers * topo.reduce_scatter(expert / moe_layers * GRAD_BYTES,
                                                               lay.edp_group.stride, lay.edp_group.size)
    gathers, scatters = np.where(zero3, gathers, 0.0), np.where(zero3, scatters, 0.0)
    gathers_forward = np.where(zero3, gathers_forward, 0.0)
    fetch_bytes = (dense / sh.sharding.weights + expert / np.where(zero3, lay.edp, 1.0)) * WEIGHT_BYTES * (2.0 + full)
    fetch = np.where(c["param_place"] > 0, fetch_bytes / _tier_bandwidth(machine, c["param_place"], "read"), 0.0)
    return Communication(tp, ep, cp, pp, gathers, gathers_forward, scatters, fetch)


def _cp_exchange(spec: TransformerSpec, topo, cp_comm, tokens, lay: Layout):
    """One layer's context-parallel traffic for one microbatch, forward and backward, bf16
    (plan.CpComm). The ring passes the local K and V (cp - 1) steps forward and K, V and their
    gradients backward; the all-gather variant gathers K and V in the forward and again in the
    backward and reduce-scatters their gradients; Ulysses all-to-alls Q, K, V and the output in
    the forward and their gradients in the backward."""
    kv_w = 2.0 * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim if spec.mla else spec.kv_heads * spec.dim_head)
    kv = tokens * kv_w / lay.tp * 2.0                        # this rank's K and V, bytes
    group = lay.cp_group
    ring = (lay.cp - 1) * topo.p2p(kv, group.stride) * 3.0
    gathering, ulysses = cp_comm == CpComm.ALL_GATHER, cp_comm == CpComm.A2A
    gathered = heads = 0.0                   # each variant's traffic only where some plan runs it
    if np.any(gathering):
        gathered = 2.0 * topo.all_gather(kv * lay.cp, group.stride, group.size) \
            + topo.reduce_scatter(kv * lay.cp, group.stride, group.size)
    if np.any(ulysses):
        q_w = spec.num_heads * (spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim if spec.mla else spec.dim_head)
        out_w = spec.num_heads * (spec.mla.v_head_dim if spec.mla else spec.dim_head)
        heads = 2.0 * (topo.all_to_all(tokens * q_w / lay.tp * 2.0 + kv, group.stride, group.size)
                       + topo.all_to_all(tokens * out_w / lay.tp * 2.0, group.stride, group.size))
    return np.select([gathering, ulysses], [gathered, heads], ring)


def _dense_gathers(machine: Machine, lay: Layout, s: Sharding, dense, full) -> tuple:
    """ZeRO-3's weight all-gathers of ``dense`` parameters (one layer's) for one microbatch (s), as
    (forward, backward): forward over the weights' group, backward (and the recomputed forward)
    over the same group, or inside hpZ's secondary partition in bf16 (ZeRO++ Sec. 3.2); with qwZ
    every primary gather sends int8 (Sec. 3.1) and pays its kernels' HBM passes: each rank
    quantizes its shard (read 2, write 1 byte per element), each receiver dequantizes the
    gathered weights (read 1, write 2)."""
    topo = machine.topology
    primary, secondary = lay.replica_subgroup(s.weights), lay.replica_subgroup(s.secondary)
    hpz = s.secondary < s.weights
    forward = topo.all_gather(dense * s.weight_gather_bytes, primary.stride, primary.size)
    backward = np.where(hpz, topo.all_gather(dense * WEIGHT_BYTES, secondary.stride, secondary.size), forward)
    kernel = np.where(s.qwz & (s.weights > 1), 3.0 * (dense + dense / s.weights), 0.0) / machine.hbm_bytes_per_s
    return forward + kernel, (1.0 + full) * backward + np.where(hpz, 0.0, 1.0 + full) * kernel


def _reduce_scatter(machine: Machine, group, s: Sharding, grad_bytes):
    """A gradient reduce-scatter of ``grad_bytes`` (bf16) over ``group``: a ring, or with qgZ two
    int4 all-to-alls, inside the fast level then across (ZeRO++ Sec. 3.3), plus its kernels' HBM
    passes per bf16 element: quantize (read 2, write 0.5 bytes), then after each hop read what
    arrived and write the reduced slice (0.5 + 0.5 / k, 0.5 / k + 2 / n)."""
    topo = machine.topology
    ring = topo.reduce_scatter(grad_bytes, group.stride, group.size)
    quantizing = s.qgz & (group.size > 1)
    quantized = 0.0                          # the qgZ path only where some plan takes it
    if np.any(quantizing):
        elements = np.asarray(grad_bytes, dtype=float) / GRAD_BYTES
        k = topo.inner_members(group.stride, group.size)
        passes = elements * (2.5 + 0.5 + 1.0 / k + 2.0 / group.size)
        quantized = topo.two_hop_reduce_scatter(elements * QGZ_BYTES, group.stride, group.size) \
            + passes / machine.hbm_bytes_per_s
    return np.where(quantizing, quantized, ring)


def _dense_scatters(machine: Machine, lay: Layout, s: Sharding, dense):
    """ZeRO-3's gradient reduce-scatter of one microbatch (s), inside the gradients' group."""
    return _reduce_scatter(machine, lay.replica_subgroup(s.grads), s, dense * GRAD_BYTES)


def _dense_step_sync(machine: Machine, lay: Layout, s: Sharding, zero, dense):
    """The dense gradients' reduction and the updated weights' return, once per step (s), level by
    level. Gradients: stage 2 reduce-scatters inside the gradients' group (stage 3 did with every
    microbatch); each gradient shard is reduce-scattered across the gradients' groups of one
    optimizer group, then all-reduced across optimizer groups (MiCS's second hop). After
    the update, weights return to their shards: all-gathered across the gradients' groups, then
    across the weights' groups inside one (the three-level scheme's levels in reverse). Over the
    whole group this is ZeRO's accounting: stage 1 one all-reduce, stage 2 a reduce-scatter and an
    all-gather, stage 3 nothing more (Rajbhandari et al. 2020, Sec. 7)."""
    topo = machine.topology
    r, o, g, w = s.replicas, s.optimizer, s.grads, s.weights
    grads, weights = dense * GRAD_BYTES, dense * WEIGHT_BYTES
    inside, across = lay.replica_subgroup(g), lay.replica_subgroup(o / g, every=g)
    replicas = lay.replica_subgroup(r / o, every=o)
    back_across, back_inside = lay.replica_subgroup(o / g, every=g), lay.replica_subgroup(g / w, every=w)
    reduce = np.where(zero == 2, topo.reduce_scatter(grads, inside.stride, inside.size), 0.0) \
        + _reduce_scatter(machine, across, s, grads / g) + topo.all_reduce(grads / o, replicas.stride, replicas.size)
    gather = topo.all_gather(weights / g, back_across.stride, back_across.size) \
        + topo.all_gather(weights / w, back_inside.stride, back_inside.size)
    whole = lay.replica_group
    return np.where((zero == 1) & (o == r), topo.all_reduce(grads, whole.stride, whole.size), reduce + gather)


def _step_tail(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, comp: Compute,
               stage_params: tuple) -> StepTail:
    """Gradient reduction (bucketed under the last backward; Li et al., VLDB 2020, Sec. 3.2.3),
    offloaded gradients and updated weights over the host path (ZeRO-Offload, Ren et al. 2021,
    Sec. 4.1), and the Adam step on the device or on the CPU over the states' tier."""
    lay, topo = sh.layout, machine.topology
    dense, expert = stage_params
    zero = c["zero"]
    edp = lay.edp_group
    o = sh.sharding.optimizer
    dp = _dense_step_sync(machine, lay, sh.sharding, zero, dense)
    if spec.moe:
        dp = dp + np.where(zero >= 3, 0.0, topo.all_reduce(expert * GRAD_BYTES, edp.stride, edp.size))
    dp_overlap = machine.constants.get("dp-overlap-fraction", 0.0) * c["overlap_dp"].astype(bool)

    opt_params = dense / o + expert / np.where(zero >= 1, lay.edp, 1.0)
    weight_bytes, grad_bytes, state_bytes = state_bytes_per_param(c["storage"])
    adam_bytes = opt_params * (state_bytes * 2 + grad_bytes + weight_bytes * 2)     # states read and written
    on_device = c["optimizer_place"] == Place.HBM
    host_link = machine.host_bytes_per_s or np.inf
    # Over the device's host path: gradients out and updated weights back when the optimizer runs on
    # the CPU, or the reduced gradient partition to its tier when gradients are offloaded (the one the
    # CPU step then reads: it crosses once).
    gradients_out = np.where(on_device | (c["grad_place"] > 0), 0.0, opt_params * GRAD_BYTES / host_link)
    weights_back = np.where(on_device, 0.0, opt_params * WEIGHT_BYTES / host_link)
    grad_partition = (dense / o + expert / lay.edp) * GRAD_BYTES
    grad_io = np.where(c["grad_place"] > 0, grad_partition / _tier_bandwidth(machine, c["grad_place"], "write"), 0.0)
    # Off the device the step runs on the host CPU over the states where they lie: at the memory's own
    # bandwidth (DeepSpeedCPUAdam is memory-bound; Ren et al. 2021, 'Optimized CPU execution'), not
    # over the device's path.
    optimizer = np.where(on_device, adam_bytes / machine.hbm_bytes_per_s,
                         adam_bytes / _tier_bandwidth(machine, c["optimizer_place"], "host"))
    return StepTail(dp, dp_overlap, gradients_out + grad_io, optimizer, on_device, weights_back)


def _overlap(c: dict, sh: Shape, comp: Compute, comm: Communication, tail: StepTail, held: float = 0.0,
             breakdown: bool = True) -> Exposure:
    """What each transfer leaves exposed, with every compute window spent once.

    Framework (Megatron-LM / DeepSpeed schedules): TP all-reduces block compute unless TP-comm
    overlap pipelines all but one chunk of them with the layer's GEMMs (with sequence
    parallelism); the CP ring passes K and V under the attention it feeds (Liu et al., Ring
    Attention, 2023); EP dispatch and combine block (Megatron's default); ZeRO-3 gathers and
    parameter streaming prefetch the next layer under the compute of its phase, each on its own
    link, except each phase's first layer's; the pipeline's point-to-point messages block, except
    in an interleaved schedule, where only the warm-up's and the flush's do (Megatron's
    overlap_p2p_comm). Once per step, the gradient reduction hides under the last backward on the
    network while offload transfers use the host path. Transfers hiding under one window add up
    on it, so a faster device or format never makes a step slower. None: every transfer exposed.
    Ideal: every transfer under the whole compute (T_lower = max, as the scaling book writes it;
    T_upper = sum is ``none``).

    ZeRO-3 prefetch (``prefetch`` layers ahead, PyTorch FSDP's default 1: Zhao et al., VLDB 2023:
    backward and forward prefetching; DeepSpeed's stage3_prefetch_bucket_size): each
    layer's gather runs under the previous layer's compute, so a pass is as long as the slower
    of its compute and its network traffic, phase by phase (the forward's gathers under the
    forward; the backward's gathers, the recomputed forward's and the reduce-scatters under the
    backward and the recompute), after the phase's first layer's gather (_prefetch_exposure).
    Deeper prefetch holds more gathered layers (``_memory``) but with layers of one size runs no
    faster. Without prefetch (0) every gather blocks the compute that needs it.

    With ``ep_overlap`` the dispatch and combine of one microbatch run under another's compute
    (Megatron-Core's --overlap-moe-expert-parallel-comm, forward of one microbatch against the
    backward of the previous; DeepSeek-V3's DualPipe, DeepSeek-AI 2024, Sec. 3.2.1). The exchange
    kernels hold ``exchange-sms`` of the SMs while they run (Sec. 3.2.2), so the rest of the
    microbatch runs on fewer SMs for that long: the pair takes max(A, X + A h), A the exchange, X
    everything else, h the held share; never more than X + A. A pipeline's first microbatch has
    none before it to pair with and pays A in full.
    """
    mode = c["overlap"]
    compute = comp.per_micro_s
    attention = comp.forward.seconds["attention core"] + comp.forward.backward["attention core"]
    others = compute - attention
    tp_overlapped = c["tp_overlap"].astype(bool) & c["sp"].astype(bool) & (sh.layout.tp > 1)
    # The overlap splits each all-gather and reduce-scatter into tp chunks around the GEMM it feeds
    # (Transformer Engine's userbuffers ring exchange; Wang et al., "Overlap Communication with
    # Dependent Computation via Decomposition", ASPLOS 2023, Sec. 3): the first chunk's gather and
    # the last chunk's scatter have no GEMM to hide under, 1 / tp of the transfer stays exposed.
    tp_hidden = np.where(tp_overlapped, comm.tp * (1.0 - 1.0 / np.maximum(sh.layout.tp, 1.0)), 0.0)
    # The first layer's gathers of each phase (the forward's first, the backward's first) are not prefetched.
    first = comm.zero3 / np.maximum(comp.layers, 1.0)
    # ZeRO-3's reduce-scatters share the gathers' link; when the reduction does not overlap the
    # backward (--no-dp-overlap) they also block compute.
    reduce_hidden = comm.zero3_reduce * tail.dp_overlap
    # Only the ring's messages run under the attention; the all-gather and the all-to-alls block it.
    ring = c["cp_comm"] == CpComm.P2P
    cp_part = np.where(ring, np.maximum(attention, comm.cp), attention + comm.cp)
    rest = np.maximum(others, tp_hidden) + cp_part + (comm.tp - tp_hidden) \
        + (comm.zero3_reduce - reduce_hidden)
    ep_exposed = _exposed_exchange(c, sh, comm.ep, rest, held)
    main = rest + ep_exposed
    gathered, fetched = _prefetch_exposure(c, comp, comm, main, first)
    framework = main + first + gathered + fetched
    transfers = {"tp": comm.tp, "ep": comm.ep, "cp": comm.cp, "zero3": comm.zero3 + comm.zero3_reduce,
                 "param": comm.param_fetch}
    none = compute + sum(transfers.values())
    ideal = np.maximum(compute, np.maximum.reduce(np.broadcast_arrays(*transfers.values())))
    per_micro = np.select([mode == Overlap.NONE, mode == Overlap.IDEAL], [none, ideal], framework)

    micro = _attribution(mode, compute, cp_part - attention, others, comm, tp_hidden, first, reduce_hidden,
                         gathered, fetched, transfers, ideal, ep_exposed) if breakdown else {}
    # Interleaved schedules overlap each chunk's pipeline messages with the next chunk's compute
    # (Megatron-LM's overlap_p2p_comm, on by default with a virtual pipeline; Megatron-Bridge sets it
    # whenever vp > 1): only the warm-up's and the flush's messages stay exposed.
    v = np.maximum(c["interleave"], 1)
    warm = np.minimum(2.0 * (sh.layout.pp - 1) + (v - 1) * sh.layout.pp, sh.num_micro * v)
    steady_hidden = np.where((v > 1) & (mode == Overlap.FRAMEWORK), warm / (sh.num_micro * v), 1.0)
    pp = np.where(mode == Overlap.IDEAL, 0.0, comm.pp * steady_hidden)

    # Once per step: the reduction on the network and the host transfers run side by side.
    # The last backward as it runs, stalls included; its links also carry that microbatch's own
    # transfers (parameters over the host path, ZeRO-3 traffic over the network), so only their
    # idle time is free for the step's transfers.
    backward = np.maximum(per_micro - comp.forward.total - comp.recompute_s, 0.0)
    host_window = np.minimum(backward, np.maximum(per_micro - comm.param_fetch, 0.0))
    dp_window = np.minimum(tail.dp_overlap * backward, np.maximum(per_micro - comm.zero3 - comm.zero3_reduce, 0.0))
    dp_exposed = np.maximum(tail.dp - dp_window, 0.0)
    host_exposed = np.maximum(np.maximum(tail.host - host_window, 0.0) - dp_exposed, 0.0)
    none_mode = mode == Overlap.NONE
    return Exposure(per_micro, micro, pp, {"dp": np.where(none_mode, tail.dp, dp_exposed),
                                           "host": np.where(none_mode, tail.host, host_exposed)})


def _exposed_exchange(c: dict, sh: Shape, exchange, rest, held: float):
    """Per microbatch, what the MoE dispatch and combine (``exchange``, s) add to the rest of the
    microbatch (``rest``, s): all of it, or with ``ep_overlap`` max(A, X + A h) - X on all but a
    pipeline's first microbatch (see _overlap); ``held`` the exchange kernels' share of the SMs."""
    overlapped = c["ep_overlap"].astype(bool) & (sh.layout.ep > 1)
    paired = np.maximum(exchange, rest + exchange * held) - rest
    share = np.where(overlapped, (sh.num_micro - 1.0) / np.maximum(sh.num_micro, 1.0), 0.0)
    return exchange - share * (exchange - paired)


def _prefetch_exposure(c: dict, comp: Compute, comm: Communication, main, first) -> tuple:
    """(ZeRO-3 traffic, streamed parameters) each microbatch exposes beyond ``main`` (the
    microbatch's compute and blocking transfers, s) and ``first``, the gathers of each phase's
    first layer (its forward share: the forward's).

    With prefetch (depth >= 1) each phase lasts max(its share of ``main``, its network traffic,
    its parameter streaming): the forward's gathers (after the first) under the forward share,
    the backward's and the recomputed forward's gathers plus the reduce-scatters under the rest;
    the phase's excess belongs to the longer transfer. Without prefetch the gathers and the
    streaming block (a + G_f + P_f + max(b, R) + G_b + P_b: only the reduce-scatters run under
    the backward), never less than with it. The forward share is the forward's part of the
    compute (Compute.forward over per_micro_s)."""
    full = c["recompute"] == Recompute.FULL
    share = comp.forward.total / np.maximum(comp.per_micro_s, 1e-30)
    ahead, behind = share * main, (1.0 - share) * main
    fetch_forward = comm.param_fetch / (2.0 + full)           # one of the 2 (+1 recomputed) passes
    fetch_backward = comm.param_fetch - fetch_forward
    first_forward = first * comm.zero3_forward / np.maximum(comm.zero3, 1e-30)
    net_forward = comm.zero3_forward - first_forward
    net_backward = comm.zero3 - comm.zero3_forward - (first - first_forward) + comm.zero3_reduce
    excess_forward = np.maximum(ahead, np.maximum(net_forward, fetch_forward)) - ahead
    excess_backward = np.maximum(behind, np.maximum(net_backward, fetch_backward)) - behind
    lead_forward, lead_backward = net_forward >= fetch_forward, net_backward >= fetch_backward
    gathered = np.where(lead_forward, excess_forward, 0.0) + np.where(lead_backward, excess_backward, 0.0)
    fetched = np.where(lead_forward, 0.0, excess_forward) + np.where(lead_backward, 0.0, excess_backward)
    prefetching = np.asarray(c["prefetch"]) >= 1
    blocking = comm.zero3 - first + np.maximum(behind, comm.zero3_reduce) - behind
    return np.where(prefetching, gathered, blocking), np.where(prefetching, fetched, comm.param_fetch)


def _attribution(mode, compute, cp_exposed, others, comm, tp_hidden, first, reduce_hidden, gathered, fetched,
                 transfers, ideal, ep_exposed) -> dict[str, np.ndarray]:
    """Which transfer each exposed second belongs to, for the breakdown (the totals are _overlap's)."""
    framework = {"tp": (comm.tp - tp_hidden) + np.maximum(tp_hidden - others, 0.0),
                 "cp": cp_exposed, "ep": ep_exposed,
                 "zero3": first + (comm.zero3_reduce - reduce_hidden) + gathered,
                 "param": fetched}
    largest = np.argmax(np.stack(np.broadcast_arrays(*transfers.values())), axis=0)
    return {k: np.select([mode == Overlap.NONE, mode == Overlap.IDEAL],
                         [transfers[k], np.where(largest == i, ideal - compute, 0.0)], framework[k])
            for i, k in enumerate(transfers)}


def _memory(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, work: TrainWorkload,
            parts: bool = True) -> Memory:
    """Memory per device of the fullest pipeline stage: the first (embedding, most microbatches in
    flight), the first of the longer stages, or the last (LM head, fp32 logits); model states by
    ZeRO stage (Rajbhandari et al. 2020), activations by Korthikanti et al. 2022 Eq. 1-2. Without
    ``parts`` (the screen: the HBM total and the tiers only) the fullest stage's parts are left out,
    except those offloaded, which the tiers hold."""
    lay = sh.layout
    zero, sp, flash, recompute = c["zero"], c["sp"].astype(bool), c["flash"].astype(bool), c["recompute"]
    s = float(work.seq_len)
    mb = np.maximum(c["micro_batch"], 1)
    low = c["storage"] == Storage.DEEPSEEK
    kw = dict(flash=flash, gemm_input_bytes=sh.gemm_input_bytes, low_precision=low)
    per_layer = activation_bytes_per_layer(spec, s / lay.cp, mb, lay.tp, sp, recompute, **kw)
    if spec.moe:
        per_layer = per_layer * (1 - sh.moe_frac) + sh.moe_frac * activation_bytes_per_layer(
            spec, s / lay.cp, mb, lay.tp, sp, recompute, moe_layer=True, **kw)
    mtp_acts = spec.mtp_layers * activation_bytes_per_layer(
        spec, s / lay.cp, mb, lay.tp, sp, recompute, moe_layer=spec.moe is not None, **kw) if spec.mtp_layers else 0.0
    last = lay.pp - 1
    dualpipe = c["schedule"] == Schedule.DUALPIPE
    candidates = _stage_candidates(spec, lay, sh.num_micro, c["interleave"], sh.ends, dualpipe)
    reserve = machine.constants.get("hbm-reserve-fraction", 0.0) * machine.hbm_bytes
    # Bytes per parameter of each state (linear in the parameters): dense weights shard over the
    # dp x cp replicas, routed experts over expert data parallelism.
    state_bytes = state_bytes_per_param(c["storage"])
    per_dense = sh.sharding.state_bytes(1.0, *state_bytes)
    per_expert = model_state_bytes(1.0, lay.edp, zero, *state_bytes) if spec.moe else (0.0, 0.0, 0.0)
    stages = []
    # ZeRO-3 gathers each layer's weights before it runs: the layer computing and the one being
    # prefetched are whole (PyTorch FSDP's rate limiter, limit_all_gathers, keeps at most two
    # all-gathers in flight; Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
    # Parallel", VLDB 2023), and in the backward the layer's whole gradient waits for its reduce-scatter.
    one_dense = lay.params_per_device(spec, 1.0, False, False)[0] - lay.params_per_device(spec, 0.0, False, False)[0]
    one_expert = lay.expert_slots(spec) * spec.expert_params / lay.etp if spec.moe else 0.0
    # ``prefetch`` layers ahead hold theirs too (FSDP's limit_all_gathers bounds the in-flight
    # gathers; depth 0 holds only the layer computing).
    in_flight = 1.0 + np.maximum(np.asarray(c["prefetch"], dtype=float), 0.0)
    gathered = (np.where((c["zero"] >= 3) & (sh.sharding.weights > 1), one_dense, 0.0)
                + np.where((c["zero"] >= 3) & (lay.edp > 1), one_expert, 0.0)) * (in_flight * state_bytes[0]
                                                                                  + state_bytes[1])
    # DualPipe keeps two copies of the parameters (and their gradients) on every rank (DeepSeek-V3
    # report, Table 2).
    copies = np.where(dualpipe, 2.0, 1.0)
    for stage, flight, dense, expert in candidates:
        weights, grads, optim = (dense * d + expert * e if spec.moe else dense * d
                                 for d, e in zip(per_dense, per_expert))
        weights, grads = weights * copies, grads * copies
        acts = per_layer * flight
        # The last stage: fp32 logits of its microbatch in flight, for the head and each MTP depth,
        # and the MTP blocks' activations.
        acts = acts + np.where(stage == last, 4.0 * sh.tokens * spec.vocab_size / lay.tp * (1 + spec.mtp_layers)
                               + mtp_acts, 0.0)
        held = {"weights": weights, "gradients": grads, "optimizer states": optim, "activations": acts,
                "gathered layers (ZeRO-3)": gathered}
        hbm = acts + gathered + sum(_in_hbm(c[place], held[part]) for place, part in _OFFLOADABLE)
        stages.append((held, hbm))
    fullest = _first_largest([hbm for _, hbm in stages])

    def pick(values):
        return np.choose(fullest, np.broadcast_arrays(*values))

    hbm = pick([hbm for _, hbm in stages])
    names = stages[0][0] if parts else [part for place, part in _OFFLOADABLE if np.any(c[place])]
    picked = {k: pick([p[k] for p, _ in stages]) for k in names}
    tier_bytes = {name: _tier_bytes(machine, name, c, picked, np.shape(hbm)) for name in TIERS}
    if not parts:
        return Memory(picked, hbm + reserve, tier_bytes, None)
    picked["reserve"] = np.full(np.shape(hbm), reserve)
    stage = pick([np.broadcast_to(st, np.shape(hbm)) for st, *_ in candidates])
    return Memory(picked, hbm + reserve, tier_bytes, stage)


def _in_hbm(place, part_bytes):
    """The bytes of a part where its place is HBM (code 0), else 0: the bytes themselves when every
    plan keeps the part in HBM (a search's lattice) and the places add no dimension."""
    if np.any(place) or np.ndim(place) > np.ndim(part_bytes):
        return np.where(place == Place.HBM, part_bytes, 0.0)
    return part_bytes


def _first_largest(values: list) -> np.ndarray:
    """Per row, the index of the first of ``values`` (arrays of equal shape or scalars, none NaN)
    that is largest: ``np.argmax`` over them stacked, without the stack (a strided reduction)."""
    index, largest = np.zeros(np.broadcast(*values).shape, dtype=np.intp), values[0]
    for i, value in enumerate(values[1:], start=1):
        larger = value > largest
        index, largest = np.where(larger, i, index), np.where(larger, value, largest)
    return index


def _stage_candidates(spec: TransformerSpec, lay: Layout, num_micro, interleave, ends, dualpipe) -> list[tuple]:
    """(stage, layer-microbatches of activations in flight, dense and routed-expert parameters) of
    each stage that may be the fullest: the first (the most microbatches in flight), the second
    (with the embedding's slot in the split it may hold more), the first of the longer stages, the
    last (the head and its logits). DualPipe keeps PP + 1 microbatches in flight on every rank
    (DeepSeek-V3 report, Table 2). A search's plans share few layouts: each is evaluated once."""
    def terms(tp, cp, dp, pp, ep, etp, num_micro, interleave, ends, dualpipe) -> list[np.ndarray]:
        layout = Layout(tp, cp, dp, pp, ep, etp)
        _, r = stage_layers(spec.num_layers, pp, ends, spec.mtp_layers)
        last = pp - 1
        out = []
        for stage in (0.0, np.minimum(1.0, last), np.minimum(pp - r, last), last):
            layers = layers_on_stage(spec.num_layers, pp, stage, ends, spec.mtp_layers)
            flight = np.where(dualpipe, np.minimum(pp + 1.0, num_micro) * layers,
                              in_flight_layers(layers, stage, pp, num_micro, interleave, ends & (stage == 0)))
            out += [stage, flight, *layout.params_per_device(spec, layers, stage == 0, stage == last)]
        return out

    values = on_distinct(terms, lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, num_micro, interleave, ends, dualpipe)
    return [tuple(values[i:i + 4]) for i in range(0, len(values), 4)]


def _tier_bytes(machine: Machine, name: str, c: dict, parts: dict, shape: tuple) -> np.ndarray:
    """Bytes per device (an array of ``shape``) the offloaded parts keep in tier ``name`` (a DDR+CXL
    place its share); ``parts`` holds at least the parts some plan offloads."""
    out = np.zeros(shape)
    share = interleave_share(machine, name)
    for place, part in _OFFLOADABLE:
        if not np.any(c[place]):              # every plan keeps this part in HBM
            continue
        here = (c[place] == PLACES.index(name)) + (c[place] == Place.DDR_CXL) * share
        if np.any(here):                      # a search's lattice keeps every part in HBM
            out = out + parts[part] * here
    return out


GRADS_WITH_OPTIMIZER = "gradient offload needs the optimizer states offloaded to the same tier"
_OFFLOADABLE = (("param_place", "weights"), ("grad_place", "gradients"), ("optimizer_place", "optimizer states"))


def _feasibility(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, mem: Memory, work: TrainWorkload):
    """(code, shortfall, names): the first rule each plan breaks, in the order a planner reads them."""
    lay = sh.layout
    gb, s = float(work.global_batch), float(work.seq_len)
    mb, v = np.maximum(c["micro_batch"], 1), np.maximum(c["interleave"], 1)
    code = np.zeros(np.shape(mem.hbm_used), dtype=np.int8)     # 0 = feasible, else 1 + index into names
    shortfall = np.zeros(np.shape(mem.hbm_used))
    names: list[str] = []

    def violate(mask, name, amount):
        nonlocal code, shortfall
        names.append(name)
        if not np.any(mask):                  # most rules hold everywhere: nothing to record
            return
        new = np.asarray(mask) & (code == 0)
        code = np.where(new, len(names), code)
        shortfall = np.where(new, amount, shortfall)

    violate(lay.devices != machine.devices, "devices", lay.devices - machine.devices)
    violate(gb % (mb * lay.dp) != 0, f"global batch ({gb:g}) divisible by micro batch x dp", mb * lay.dp)
    violate(spec.num_heads % lay.tp != 0, "tp divides heads", lay.tp)
    violate((lay.ep > 1) & (spec.moe is None), "ep needs an MoE model", lay.ep)
    if spec.moe:
        violate(spec.moe.num_experts % lay.ep != 0, "ep divides experts", lay.ep)
        violate(spec.moe.expert_ffn_hidden_size % lay.etp != 0, "etp divides the expert hidden size", lay.etp)
        violate(~lay.folds, "ep x etp divides tp x cp x dp", lay.ep * lay.etp)
    violate(s % lay.cp != 0, "cp divides sequence", lay.cp)
    # Ulysses hands each cp rank whole heads of its TP rank's share (MLA trains as full heads).
    kv_heads = spec.num_heads if spec.mla else spec.kv_heads
    ulysses = (c["cp_comm"] == CpComm.A2A) & (lay.cp > 1)
    if np.any(ulysses):                       # the heads' split, only where Ulysses runs
        ulysses = ulysses & (((spec.num_heads // lay.tp) % lay.cp != 0)
                             | (np.maximum(kv_heads // lay.tp, 1) % lay.cp != 0))
    violate(ulysses, "cp a2a (Ulysses) needs cp to divide the query and KV heads of a TP rank", lay.cp)
    # Uneven splits are allowed (the longest stage holds ceil(L / pp) layers and sets the pace).
    violate(lay.pp * v > spec.num_layers + (2 + spec.mtp_layers) * sh.ends,
            "pp x interleave at most the pipeline's slots (the layers; with the ends as layers 2 and the MTP depths "
            "more)", lay.pp * v)
    violate(sh.layers < 0, "the last stage has a slot for the loss and each MTP depth", -sh.layers)
    violate((v > 1) & (sh.num_micro % lay.pp != 0), "interleaving needs microbatches divisible by pp", sh.num_micro)
    violate((c["storage"] == Storage.DEEPSEEK) & (c["precision"] != PRECISIONS.index("fp8")),
            "DeepSeek's low-precision storage caches FP8 activations: it needs fp8 GEMMs", c["precision"])
    dualpipe = c["schedule"] == Schedule.DUALPIPE
    if np.any(dualpipe):                      # its pairing rules, only where DualPipe runs
        dualpipe = dualpipe & ((lay.pp % 2 != 0) | (sh.num_micro % 2 != 0) | (v > 1))
    violate(dualpipe, "DualPipe needs an even pp, an even number of microbatches and no interleaving", lay.pp)
    # Offload follows DeepSpeed: optimizer states with ZeRO >= 1 (ZeRO-Offload), gradients with
    # ZeRO >= 2 (partitioned before they leave) and with the optimizer states, parameters with
    # ZeRO-3 (ZeRO-Infinity).
    zero = c["zero"]
    violate((c["optimizer_place"] > 0) & (zero < 1), "optimizer offload needs zero >= 1", zero)
    violate((c["grad_place"] > 0) & (zero < 2), "gradient offload needs zero >= 2", zero)
    # DeepSpeed has no gradient offload of its own: offload_optimizer moves the fp32 gradient
    # partitions to where the optimizer step runs, with the optimizer states.
    violate((c["grad_place"] > 0) & (c["grad_place"] != c["optimizer_place"]), GRADS_WITH_OPTIMIZER,
            c["optimizer_place"])
    violate((c["param_place"] > 0) & (zero < 3), "parameter offload needs zero 3", zero)
    for mask, name, amount in sh.sharding.rules(zero, *(c[k] for k in SHARDING_FIELDS)):
        violate(mask, name, amount)
    # The offloaded gradients are the optimizer's partition (ZeRO-Offload moves each rank's reduced
    # shard to where its optimizer step runs), so they cannot be sharded over a smaller group.
    violate((c["grad_place"] > 0) & (sh.sharding.grads != sh.sharding.optimizer),
            "gradient offload needs the gradients sharded as the optimizer states", sh.sharding.grads)
    violate(mem.hbm_used > machine.hbm_bytes, "hbm", mem.hbm_used - machine.hbm_bytes)
    for name in TIERS:
        capacity = _tier_capacity(machine, name)
        violate(mem.tier_bytes[name] > capacity, name, mem.tier_bytes[name] - capacity)
    return code, shortfall, tuple(names)


def _breakdown(m, bubble, comp: Compute, comm: Communication, tail: StepTail, exposed: Exposure):
    """(exposed time by component, each transfer's time on its link) over one step (s)."""
    components = {
        "compute (fwd+bwd+recompute)": m * comp.per_micro_s,
        "pipeline bubble": bubble,
        "tp communication": m * exposed.micro["tp"],
        "ep all-to-all": m * exposed.micro["ep"],
        "cp exchange": m * exposed.micro["cp"],
        "pp point-to-point": m * exposed.pp,
        "zero-3 gathers and scatters": m * exposed.micro["zero3"],
        "parameter offload": m * exposed.micro["param"],
        "dp gradient reduction": exposed.tail["dp"],
        "offload transfers": exposed.tail["host"],
        "optimizer step": tail.optimizer,
        "updated weights back": tail.weights_back,
    }
    # Each transfer's time on its link over the step, before any overlap (what `--overlap none` exposes).
    links = {"tp communication": m * comm.tp, "ep all-to-all": m * comm.ep, "cp exchange": m * comm.cp,
             "pp point-to-point": m * comm.pp, "zero-3 gathers and scatters": m * (comm.zero3 + comm.zero3_reduce),
             "parameter offload": m * comm.param_fetch, "dp gradient reduction": tail.dp,
             "offload transfers": tail.host + tail.weights_back}
    return components, links


def _after_step(tail: StepTail) -> np.ndarray:
    """The optimizer step, then, after an off-device step, the updated weights' way back: they cannot
    overlap the step's own backward (they do not exist yet), and without ZeRO-Offload's one-step
    delayed parameter update (Ren et al. 2021, 'Optimized CPU execution'; off by default) the next
    forward waits for them. Counted in full after the step: the conservative reading (a fused
    step-and-copy overlaps part of it), and one that keeps every offload move's added time additive
    for the search's knapsack."""
    return tail.optimizer + tail.weights_back


def _estimate(spec: TransformerSpec, machine: Machine, c: dict[str, np.ndarray], work: TrainWorkload,
              breakdown: bool = True) -> TrainResult:
    """One block of plans (see estimate_training; ``breakdown`` is its ``detail``)."""
    sh = _shape(spec, machine, c, work)
    lay = sh.layout
    comp = _compute(spec, machine, c, sh, work, breakdown)
    busiest = lay.params_per_device(spec, comp.layers, lay.pp == 1, comp.last)
    comm = _communication(spec, machine, c, sh, comp, busiest)
    tail = _step_tail(spec, machine, c, sh, comp, _held(spec, lay, c, comp, busiest))
    mem = _memory(spec, machine, c, sh, work)
    code, shortfall, names = _feasibility(spec, machine, c, sh, mem, work)

    # TP-communication overlap runs only where the device has it (Machine.overlaps_tp_communication).
    exposed = _overlap({**c, "tp_overlap": c["tp_overlap"] & machine.overlaps_tp_communication}, sh, comp, comm, tail,
                       machine.exchange_sm_share, breakdown)
    per_micro = exposed.per_micro
    v = np.maximum(c["interleave"], 1)
    bubble = np.where(c["schedule"] == Schedule.DUALPIPE, _dualpipe_bubble(lay.pp, comp),
                      (lay.pp - 1) / v * per_micro)              # (p - 1) / v (Narayanan et al. Sec. 2.2)
    pipeline = sh.num_micro * per_micro + bubble + sh.num_micro * exposed.pp
    step = pipeline + exposed.tail["dp"] + exposed.tail["host"] + _after_step(tail)

    # --- rates, utilization, energy and cost ------------------------------------------------------
    tokens_per_step = float(work.global_batch) * work.seq_len
    tokens_per_s = tokens_per_step / step
    # Utilization against the dense peak of the precision the GEMMs run at (fp8 plans against fp8),
    # with the FLOPs the kernels compute (causal attention with FlashAttention; PaLM App. B).
    peak = np.array([machine.peak_flops.get(p, np.nan) for p in PRECISIONS])[c["precision"]]
    mfu = comp.model_flops / (step * machine.devices * peak)
    hfu = comp.executed_flops / (step * machine.devices * peak)
    busy = np.clip((sh.num_micro * comp.per_micro_s + tail.optimizer * tail.optimizer_on_device) / step, 0.0, 1.0)
    power = device_power_w(machine, busy) + machine.overhead_w_per_device
    energy_per_token = power * machine.devices * machine.constants.get("pue", 1.0) / tokens_per_s
    cost_hour = run_cost(machine, power) * machine.devices
    cost_mtok = cost_hour / 3600.0 / tokens_per_s * 1e6
    run_time = work.tokens / tokens_per_s if work.tokens else np.zeros_like(step)
    m = sh.num_micro
    idle = np.where(c["schedule"] == Schedule.DUALPIPE, bubble, (lay.pp - 1) / v * comp.per_micro_s)
    compute_s = sh.num_micro * comp.per_micro_s + idle + tail.optimizer
    low, high = machine.interval(step, compute_s, np.maximum(step - compute_s, 0.0))
    components, links = ({}, {}) if not breakdown else _breakdown(m, bubble, comp, comm, tail, exposed)
    fwd = comp.forward
    return TrainResult(
        step_time_s=step, components=components, bounds=dict(fwd.compute_bound), memory=mem.parts,
        tier_bytes=mem.tier_bytes, tokens_per_s=tokens_per_s, mfu=mfu, hfu=hfu, power_w=power,
        energy_per_token_j=energy_per_token, cost_per_hour_usd=cost_hour, cost_per_million_tokens_usd=cost_mtok,
        run_time_s=run_time, run_energy_kwh=energy_per_token * work.tokens / 3.6e6,
        run_cost_usd=cost_hour * run_time / 3600.0, feasible=code == 0, binding_code=code, shortfall=shortfall,
        constraint_names=names, hbm_used_bytes=mem.hbm_used, num_microbatches=sh.num_micro,
        operator_times={k: m * (t + fwd.backward[k]) for k, t in fwd.seconds.items()} if breakdown else {},
        operator_flops={k: m * 3.0 * f for k, f in fwd.flops.items()} if breakdown else {},
        # The backward's two GEMMs per forward GEMM move about the forward's bytes each (as its FLOPs).
        operator_bytes={k: m * 3.0 * b for k, b in fwd.bytes.items()} if breakdown else {},
        busy_fraction=busy, model_flops_per_step=np.broadcast_to(comp.model_flops, np.shape(step)),
        executed_flops_per_step=np.broadcast_to(comp.executed_flops, np.shape(step)), memory_stage=mem.stage,
        link_times=links, step_time_low_s=low, step_time_high_s=high)


def _kind_bandwidth(machine: Machine, kind: str, direction: str) -> float:
    """Per-device bandwidth of the first tier of ``kind`` ("read", "write" over the device's path;
    "host": the memory's own, as the host CPU reads it); 0 when the system has none."""
    tier = next((t for t in machine.memory_tiers if t.kind == kind), None)
    return getattr(tier, f"{direction}_bytes_per_s") if tier else 0.0


def interleave_share(machine: Machine, kind: str) -> float:
    """Share of an interleaved state (DDR + CXL) that lives in ``kind``: in proportion to each
    memory's bandwidth, so that a pass over the state (the CPU optimizer step) reads both at once and
    ends on both together (bandwidth-weighted interleaving, as Linux's weighted-interleave memory
    policy does for CXL memory: MPOL_WEIGHTED_INTERLEAVE, Linux 6.9)."""
    kinds = INTERLEAVED["ddr+cxl"]
    if kind not in kinds:
        return 0.0
    total = sum(_kind_bandwidth(machine, k, "host") for k in kinds)
    return _kind_bandwidth(machine, kind, "host") / total if total > 0 else 0.0


def _tier_bandwidth(machine: Machine, place_code, direction: str):
    """Per-device bandwidth of the tier each plan places a state in (HBM for code 0). An interleaved
    state is read at the sum of its memories' bandwidths by the CPU, and over the device's one host
    path (at most that path's rate) by the device."""
    table = [machine.hbm_bytes_per_s]
    for name in PLACES[1:]:
        kinds = INTERLEAVED.get(name, (name,))
        bw = sum(_kind_bandwidth(machine, k, direction) for k in kinds)
        if len(kinds) > 1 and direction != "host" and machine.host_bytes_per_s:
            bw = min(bw, machine.host_bytes_per_s)
        # A missing tier gets 1 byte/s: any plan placing state there fails its capacity check (0 bytes).
        table.append(bw if all(_kind_bandwidth(machine, k, "read") for k in kinds) else 1.0)
    return np.asarray(table)[np.asarray(place_code)]


def _tier_capacity(machine: Machine, kind: str) -> float:
    return sum(t.bytes_per_device for t in machine.memory_tiers if t.kind == kind)
