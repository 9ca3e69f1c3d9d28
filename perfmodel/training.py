"""Training step time, memory, energy and cost of plans, vectorized over plan columns.

One call evaluates one plan or a million: every plan field may be a numpy array and all of them
broadcast. The plan's device layout (``layout.Layout``: TP innermost, then CP, DP and PP, with
the experts folded over each stage's devices) decides each group's topology level and each
device's share. The estimate is a sequence of named terms, each a small frozen dataclass
(``training_terms``): compute (here), communication and its overlap (``training_comm``), memory and
the rules (``training_memory``).

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

from .activation_offload import recompute_kept
from .economics import energy_per_token_j, run_cost, usd_per_million_tokens
from .kernels import distinct_rows, on_distinct
from .layout import Layout
from .machine import Machine
from .memory import dualpipe_rank_layers, split_layers
from .model import TransformerSpec
from .plan import CpComm, Recompute, Schedule
from .power import device_power_w
from .roofline import OpTimes, layer_ops, lm_head_ops, merge, mtp_ops, ops_time
from .sharding import Sharding
from .training_comm import _communication, _overlap, _step_tail
from .training_memory import _feasibility, _memory
from .training_terms import Communication, Compute, Exposure, SHARDING_FIELDS, Shape, StepTail, TrainPlan, TrainWorkload


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
                  "recompute", "sp", "flash", "precision", "schedule", "moe_imbalance", "activation_offload")


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
        moe_frac=spec.moe_fraction,
        imbalance=np.where(c["moe_imbalance"] > 0, c["moe_imbalance"],
                           machine.constants.moe_load_imbalance) if moe else 1.0,
        gemm_input_bytes=np.where(c["precision"] == PRECISIONS.index("fp8"), 1.0, 2.0),
        sharding=Sharding.of(c["zero"], layout.dense_replicas, *(c[k] for k in SHARDING_FIELDS)))


def _rates(machine: Machine, precision_code) -> dict:
    """Achievable FLOP/s per operator unit. GEMMs run at the plan's precision; attention at the
    16-bit format of the plan (fp16 plans in fp16, bf16 and fp8 plans in bf16: Transformer
    Engine keeps the attention core in 16 bits), or fp16 on a device without bf16."""
    gemm = machine.flops_table()[precision_code]
    sixteen = machine.math16
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
    kernels = (machine.gemm_kernel(precision), machine.attention_kernel(machine.math16))
    kw = dict(sp=sp, act_bytes=gemm_input_bytes, flash=flash, cp_steps=cp_steps)
    kb = dict(keep_bytes=keep_bytes, attention_backward=(machine.constants.attention_backward_slowdown,
                                                         machine.constants.attention_backward_slowdown_1k))
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
    sixteen = PRECISIONS.index(machine.math16)
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
    # Under full recomputation the tokens whose activations are swapped whole are not recomputed
    # (activation_offload.recompute_kept); 1.0 where no plan swaps.
    share = np.asarray(c["activation_offload"], dtype=float)
    token_wise = recompute_kept(share, True) if np.any(share > 0) else 1.0

    def stage(layers, ends: tuple) -> tuple[OpTimes, np.ndarray]:
        """A stage's forward of ``layers`` layers and ``ends`` (the head and MTP), and its recompute."""
        parts = [dense.scaled(layers * (1 - sh.moe_frac))] if spec.dense_layers else []
        if moe is not None:
            parts.append(moe.scaled(layers * sh.moe_frac))
        forward = merge(*parts, *ends)
        core = forward.seconds["attention core"]
        lean = core + forward.seconds["norms and activations"] + up_share * forward.seconds["qkv projection"]
        again = np.select([recompute == Recompute.FULL, recompute == Recompute.SELECTIVE,
                           recompute == Recompute.MODULES], [sum(p.total for p in parts) * token_wise, core, lean],
                          0.0)
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
                      [layer_flops * token_wise, attention_flops, attention_flops + up_flops], 0.0)
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


def _breakdown(m, bubble, comp: Compute, comm: Communication, tail: StepTail, exposed: Exposure):
    """(exposed time by component, each transfer's time on its link) over one step (s)."""
    components = {
        "compute (fwd+bwd+recompute)": m * comp.per_micro_s,
        "pipeline bubble": bubble,
        "tp communication": m * exposed.micro["tp"],
        "ep all-to-all": m * exposed.micro["ep"],
        "cp exchange": m * exposed.micro["cp"],
        "pp point-to-point": m * exposed.pp,
        "zero-2/3 gathers and scatters": m * exposed.micro["zero3"],
        "parameter offload": m * exposed.micro["param"],
        **({"activation offload": m * exposed.micro["activation"]} if "activation" in exposed.micro else {}),
        "dp gradient reduction": exposed.tail["dp"],
        "offload transfers": exposed.tail["host"],
        "optimizer step": tail.optimizer,
        "updated weights back": tail.weights_back,
    }
    # Each transfer's time on its link over the step, before any overlap (what `--overlap none` exposes).
    links = {"tp communication": m * comm.tp, "ep all-to-all": m * comm.ep, "cp exchange": m * comm.cp,
             "pp point-to-point": m * comm.pp, "zero-2/3 gathers and scatters": m * (comm.zero3 + comm.zero3_reduce),
             "parameter offload": m * comm.param_fetch, "dp gradient reduction": tail.dp,
             "offload transfers": tail.host + tail.weights_back,
             **({"activation offload": m * comm.swap} if "activation" in exposed.micro else {})}
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
    comm = _communication(spec, machine, c, sh, comp, busiest, work)
    tail = _step_tail(spec, machine, c, sh, comp, _held(spec, lay, c, comp, busiest))
    mem = _memory(spec, machine, c, sh, work)
    code, shortfall, names = _feasibility(spec, machine, c, sh, mem, work)

    # TP-communication overlap runs only where the device has it (Machine.overlaps_tp_communication).
    exposed = _overlap({**c, "tp_overlap": c["tp_overlap"] & machine.overlaps_tp_communication}, sh, comp, comm, tail,
                       machine.exchange_sm_share, breakdown, machine.tp_overlap_sm_share, machine.collective_sm_share)
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
    energy_per_token = energy_per_token_j(power * machine.devices, tokens_per_s, machine.constants.pue)
    cost_hour = run_cost(machine, power) * machine.devices
    cost_mtok = usd_per_million_tokens(cost_hour, tokens_per_s)
    run_time = work.tokens / tokens_per_s if work.tokens else np.zeros_like(step)
    m = sh.num_micro
    idle = np.where(c["schedule"] == Schedule.DUALPIPE, bubble, (lay.pp - 1) / v * comp.per_micro_s)
    compute_s = sh.num_micro * comp.per_micro_s + idle + tail.optimizer
    # An MoE model's step carries at least the MoE family's measured error (moe-training-error).
    low, high = machine.interval(step, compute_s, np.maximum(step - compute_s, 0.0),
                                 machine.constants.moe_training_error if spec.moe else 0.0)
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


