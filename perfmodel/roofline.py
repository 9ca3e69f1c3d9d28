"""Roofline time of each operator of a transformer layer (forward pass), vectorized over plans.

An operator takes max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) and is compute
bound when the first term is the larger (Williams, Waterman and Patterson, "Roofline", CACM 52(4),
2009). Operators and their FLOPs follow Narayanan et al. 2021 Sec. 3.2 and Korthikanti et al. 2022
Sec. 4 (GEMMs sharded by tensor parallelism t; norms, activations and residuals replicated unless
sequence parallelism shards them). Attention uses FlashAttention's IO (Dao et al. 2022, Theorem 2:
Q, K, V and O read and written once; the s^2 scores never reach HBM) unless ``flash`` is off, when
the score matrix is written and read by the softmax and the value GEMM as in Megatron 2021.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .kernels import ATTENTION_QUERY_TILE, MLA_QUERY_BLOCK, AttentionKernel, GemmKernel
from .layout import Layout
from .model import TransformerSpec


def roofline(flops, bytes_moved, flops_per_s, bytes_per_s):
    """(time, compute_bound) = (max(F / P, B / W), F / P >= B / W) (Williams et al. 2009)."""
    t_compute = np.asarray(flops, dtype=float) / flops_per_s
    t_memory = np.asarray(bytes_moved, dtype=float) / bytes_per_s
    return np.maximum(t_compute, t_memory), t_compute >= t_memory


@dataclass(frozen=True)
class Gemm:
    """One GEMM kernel of an operator: ``m`` rows (tokens) x ``k`` by ``k`` x ``n`` weights, run
    for ``groups`` experts at once (a grouped GEMM); ``routed``: the routed experts' grouped GEMMs,
    which take the device's grouped-GEMM fit where it has one (``ops_time``)."""

    m: object
    n: object
    k: object
    groups: object = 1.0
    routed: bool = False


def routed_expert_gemms(rows, experts, hidden, expert_hidden, gated: bool = True) -> tuple[Gemm, Gemm]:
    """The routed experts' grouped GEMMs on one device: gate-up (``hidden`` -> 2 x ``expert_hidden``
    gated, else 1 x) then down, over the ``experts`` it reads, each with an equal share of its
    ``rows`` token-expert rows (TensorRT-LLM's and SGLang's MoE: two grouped GEMMs around the
    activation)."""
    per_expert = np.asarray(rows, dtype=float) / np.maximum(experts, 1e-9)
    up = (2.0 if gated else 1.0) * np.asarray(expert_hidden, dtype=float)
    return (Gemm(per_expert, up, hidden, experts, routed=True),
            Gemm(per_expert, hidden, expert_hidden, experts, routed=True))


@dataclass(frozen=True)
class AttentionWork:
    """How the attention core's kernel is launched: in prefill, ``tiles`` query tiles (sequences x
    heads x ceil(queries / ATTENTION_QUERY_TILE)); in decode, ``tiles`` blocks (sequences x KV
    heads), each reading ``context`` cached keys. ``flash`` False: the unfused kernels of Megatron
    2021, and ``latent`` True: MLA's absorbed decode (all heads over one latent, on tensor cores),
    neither of which the fitted FlashAttention model describes."""

    tiles: object
    context: object
    decode: bool
    flash: object = True
    latent: bool = False
    padding: object = 1.0     # work the kernel does over the useful FLOPs (MLA decode's head blocks)
    io_bytes: object = 0.0    # decode: the Q read and O written, which splitting the KV does not spread
    steps: object = 1.0       # prefill: kernels the core runs as, one per context-parallel ring step


@dataclass(frozen=True)
class Op:
    """One operator of one layer for one device: FLOPs, HBM bytes, and the unit that runs it.

    ``unit`` is "gemm" (weight GEMMs, at the plan's GEMM precision), "attention" (QK^T and PV:
    bf16 in FlashAttention-style kernels unless the KV cache is fp8) or "vector" (elementwise,
    memory bound).
    """

    name: str
    flops: np.ndarray
    bytes: np.ndarray
    unit: str
    balanced_flops: np.ndarray | None = None   # with balanced routing (the experts on the busiest device differ)
    gemms: tuple[Gemm, ...] = ()               # its kernels' shapes, for the shape-aware kernel model
    element_bytes: tuple = (2.0, 2.0, 2.0)     # input, weight and output bytes per element of those kernels
    attention: AttentionWork | None = None     # the attention core's launch shape

    @property
    def gemm(self) -> bool:
        return self.unit != "vector"

    @property
    def mean_flops(self) -> np.ndarray:
        """FLOPs of the average device (what sums to the model's FLOPs over devices)."""
        return self.flops if self.balanced_flops is None else self.balanced_flops


@dataclass(frozen=True)
class OpTimes:
    """Time of a list of operators on one device, per operator and in total (seconds): forward,
    and the backward pass a training step adds."""

    total: np.ndarray
    seconds: dict[str, np.ndarray]
    compute_bound: dict[str, np.ndarray]
    flops: dict[str, np.ndarray]        # on this (the busiest) device
    mean_flops: np.ndarray              # the average device's GEMM and attention FLOPs
    backward: dict[str, np.ndarray]     # each operator's backward pass
    backward_total: np.ndarray
    bytes: dict[str, np.ndarray] = field(default_factory=dict)   # HBM traffic of each forward, this device

    def take(self, rows) -> "OpTimes":
        """The operator times of the plans at indices ``rows``."""
        pick = lambda v: np.broadcast_to(v, np.shape(rows))[...] if np.ndim(v) == 0 else np.asarray(v)[rows]  # noqa: E731
        each = lambda d: {n: pick(v) for n, v in d.items()}                                         # noqa: E731
        return OpTimes(pick(self.total), each(self.seconds), each(self.compute_bound), each(self.flops),
                       pick(self.mean_flops), each(self.backward), pick(self.backward_total), each(self.bytes))

    def where(self, mask, other: "OpTimes") -> "OpTimes":
        """Row by row, these times where ``mask`` holds, else ``other``'s (an operator only one of
        them runs counts 0 in the other)."""
        mask = np.asarray(mask, dtype=bool)

        def pick(a, b):
            return np.where(mask, a, b)

        def each(a: dict, b: dict, absent=0.0):
            return {k: pick(a.get(k, absent), b.get(k, absent)) for k in dict.fromkeys([*a, *b])}
        return OpTimes(pick(self.total, other.total), each(self.seconds, other.seconds),
                       each(self.compute_bound, other.compute_bound, False), each(self.flops, other.flops),
                       pick(self.mean_flops, other.mean_flops), each(self.backward, other.backward),
                       pick(self.backward_total, other.backward_total), each(self.bytes, other.bytes))

    def scaled(self, k) -> "OpTimes":
        """The same operators run ``k`` times (layers, microbatches)."""
        return OpTimes(self.total * k, {n: t * k for n, t in self.seconds.items()}, self.compute_bound,
                       {n: f * k for n, f in self.flops.items()}, self.mean_flops * k,
                       {n: t * k for n, t in self.backward.items()}, self.backward_total * k,
                       {n: b * k for n, b in self.bytes.items()})


# Memory passes of the token permute and unpermute around the routed experts' grouped GEMMs
# (Megatron-Core moe_permute / moe_unpermute; TensorRT-LLM expandInputRows / finalizeMoeRouting;
# SGLang ep_scatter / ep_gather): each routed row is read and written to group the rows by expert,
# read again to combine them, and each of the device's tokens is written once. The counts are the
# algorithm's; left free, a fit on aiconfigurator's measured MoE modules (TensorRT-LLM 1.3.0rc20,
# H100, balanced routing, bf16, at least 512 tokens, half the rows held out) gives 3.6 and 1.4,
# and the held-out error of the routed experts falls from 40% (GEMMs only) to 26% with 3 and 1.
PERMUTE_ROW_PASSES = 3.0
PERMUTE_TOKEN_PASSES = 1.0

# FlashAttention's backward pass runs five matrix products to the forward's two (Dao 2023,
# FlashAttention-2, Sec. 3.1.2 and Algorithm 2: S and P recomputed, then dV, dP, dQ and dK).
FLASH_BACKWARD_OVER_FORWARD = 2.5


def flash_backward_over_forward(keys, slowdown: tuple = (1.0, 0.0)):
    """Backward over forward time of a FlashAttention core whose queries attend ``keys`` keys
    (mean): FLASH_BACKWARD_OVER_FORWARD times the FLOPs, each run slower by
    slowdown[0] + slowdown[1] x 1024 / keys (the constants attention-backward-slowdown and
    attention-backward-slowdown-1k, fitted on measured kernels; (1, 0): at the forward's rate)."""
    return FLASH_BACKWARD_OVER_FORWARD * (slowdown[0] + slowdown[1] * 1024.0 / np.maximum(keys, 1.0))


def ops_time(ops: list[Op], rates: dict, bytes_per_s: float, kernel: GemmKernel | None = None,
             attention: AttentionKernel | None = None, keep_bytes: bool = True, with_backward: bool = True,
             attention_backward: tuple = (1.0, 0.0), grouped: GemmKernel | None = None) -> OpTimes:
    """Each operator's time on one device, and their sum (one op after another).

    ``rates`` maps an operator's unit ("gemm", "attention", "vector") to achievable FLOP/s. With a
    ``kernel``, operators that list their GEMMs take the kernel model's time for each of them
    (perfmodel.kernels), and their backward pass that of the data-gradient (m x n by n x k) and
    weight-gradient (k x m by m x n) GEMMs. With an ``attention`` kernel, a FlashAttention core
    takes that model's time (an MLA core only from a kernel fitted on MLA, except in prefill,
    where the FlashAttention fit also serves); its backward is flash_backward_over_forward times
    its forward (``attention_backward``: the slowdown constants). With a ``grouped`` kernel (the
    device's fit on measured MoE layers), the routed experts' grouped GEMMs take its time instead
    of ``kernel``'s, forward and backward. Every other operator is a
    roofline, and its backward twice its forward (Narayanan et al. 2021 Sec. 5.1). ``keep_bytes``:
    also carry each operator's HBM bytes (for the roofline report; a search leaves them out).
    ``with_backward`` False: a forward pass only (serving), every backward time 0.
    """
    seconds, bound, flops, backward, traffic = {}, {}, {}, {}, {}
    total, mean, back = 0.0, 0.0, 0.0
    gemm_seconds = _gemm_seconds(ops, kernel, with_backward, grouped) if kernel is not None else {}
    for op in ops:
        work = op.flops * op.attention.padding if op.attention is not None else op.flops
        t, cb = roofline(work, op.bytes, rates[op.unit], bytes_per_s)
        b = 2.0 * t
        if kernel is not None and op.gemms:
            t, b = gemm_seconds[op.name]
        elif op.attention is not None and np.any(op.attention.flash):
            a = op.attention
            if attention is not None and (attention.latent == a.latent or not (a.decode or attention.latent)):
                t = np.where(a.flash, core_seconds(attention, op), t)
            keys = a.context / np.maximum(np.asarray(a.steps, dtype=float), 1.0)   # per ring step
            b = np.where(a.flash, flash_backward_over_forward(keys, attention_backward), 2.0) * t
        b = b if with_backward else 0.0
        seconds[op.name], bound[op.name], flops[op.name], backward[op.name] = t, cb, op.flops, b
        if keep_bytes:
            traffic[op.name] = op.bytes
        total, back = total + t, back + b
        if op.gemm:
            mean = mean + op.mean_flops
    return OpTimes(total, seconds, bound, flops, mean, backward, back, traffic)


def _gemm_seconds(ops: list[Op], kernel: GemmKernel, with_backward: bool, grouped: GemmKernel | None = None) -> dict:
    """(forward, backward) kernel seconds of every operator that lists GEMMs, all timed in one
    kernel evaluation per kernel: the forward M x K x N GEMM, and backward the data gradient
    (m x n by n x k) and the weight gradient (k x m by m x n). Routed experts' GEMMs run on
    ``grouped`` when given."""
    out: dict = {op.name: [0.0, 0.0] for op in ops if op.gemms}
    for runs, routed in ((kernel, False), (grouped, True)):
        if runs is None:                            # no grouped fit: the routed GEMMs stay on ``kernel``
            continue
        shapes, owners = [], []
        for op in ops:
            x, w, y = op.element_bytes
            for g in op.gemms:
                if grouped is not None and g.routed != routed:
                    continue
                shapes.append((g.m, g.n, g.k, x, w, y, g.groups))
                owners.append((op.name, 0))
                if with_backward:
                    shapes += [(g.m, g.k, g.n, y, w, x, g.groups), (g.k, g.n, g.m, x, y, w, g.groups)]
                    owners += [(op.name, 1), (op.name, 1)]
        timed = iter(zip(owners, runs.times(shapes) if shapes else []))
        for (name, part), seconds in timed:
            if part:                                # data and weight gradients, summed as a pair
                seconds = seconds + next(timed)[1]
            out[name][part] = out[name][part] + seconds
    return out


def core_seconds(kernel: AttentionKernel, op: Op) -> np.ndarray:
    """Seconds of an attention-core ``op`` (``attention_core``) on a fitted ``kernel``, counting
    the work a padded MLA decode block does."""
    a = op.attention
    work = op.flops * a.padding
    if a.decode:
        return kernel.decode(work, op.bytes, a.tiles, a.context, a.io_bytes)
    # Ring context parallelism runs one kernel per ring step over the local queries and the K/V
    # chunk that arrived (Liu et al. 2023; Megatron-Core / Transformer Engine's P2P context
    # parallelism: one FlashAttention call per step), each with its launch and its waves of tiles.
    steps = np.maximum(np.asarray(a.steps, dtype=float), 1.0)
    return steps * kernel.prefill(work / steps, op.bytes / steps, a.tiles)


def merge(*parts: OpTimes) -> OpTimes:
    """Operator times of several op lists on one device, summed by operator name."""
    seconds, bound, flops, backward, traffic = {}, {}, {}, {}, {}
    for part in parts:
        for k, v in part.seconds.items():
            seconds[k] = seconds.get(k, 0.0) + v
            flops[k] = flops.get(k, 0.0) + part.flops[k]
            if part.bytes:
                traffic[k] = traffic.get(k, 0.0) + part.bytes[k]
            backward[k] = backward.get(k, 0.0) + part.backward[k]
            bound[k] = part.compute_bound[k]
    return OpTimes(sum(p.total for p in parts), seconds, bound, flops, sum(p.mean_flops for p in parts),
                   backward, sum(p.backward_total for p in parts), traffic)


def kv_width_per_device(spec: TransformerSpec, tp):
    """Cached K and V elements per token per layer that one TP rank reads.

    GQA/MQA heads split by TP down to one head per rank (replicated beyond that); MLA's latent is
    shared by all heads and replicated on every rank.
    """
    t = np.maximum(np.asarray(tp, dtype=float), 1.0)
    if spec.mla:
        return np.full_like(t, float(spec.kv_elements_per_token_per_layer()))
    return 2.0 * spec.dim_head * np.maximum(spec.kv_heads / t, 1.0)


def layer_ops(spec: TransformerSpec, tokens, context, layout: Layout, sp, weight_bytes=2.0, act_bytes=2.0,
              moe_layer=False, imbalance=1.0, flash=True, experts_read=None, decode=False, kv_bytes=2.0, cp_steps=None,
              router_bytes=None):
    """Forward operators of one layer on one device.

    ``tokens`` are the tokens this device's TP group processes (b * s / cp in training, the batch
    in decode); ``context`` the mean number of keys each query attends to; the ``layout``'s tp
    shards GEMMs and heads, its expert grid (etp x ep) the routed experts; ``sp`` shards norms and
    residuals. In ``decode`` every token reads its sequence's cached K and V (``kv_bytes`` per
    element) and MLA runs in its absorbed form (DeepSeek-V2, Sec. 2.1.2: scores and values over
    the latent, kv_lora_rank wide). ``experts_read`` is the number of routed experts whose
    weights this device reads (default: all it holds); ``imbalance`` multiplies the routed rows
    of the busiest device (its load over the mean); ``cp_steps`` the attention kernels a
    context-parallel layer runs (a ring's cp steps, the default; one when K and V are gathered).
    """
    h = spec.hidden_size
    t = layout.tp
    n = np.asarray(tokens, dtype=float)
    ctx = np.asarray(context, dtype=float)
    norm_shard = np.where(np.asarray(sp, dtype=bool), t, 1.0)
    ops: list[Op] = []

    sizes = (act_bytes, weight_bytes, act_bytes)

    def gemm(name, params, tokens_in, width_in, width_out, kernels=None, redundant=0.0):
        # 2 FLOP per multiply-add; bytes: weights once, input and output activations once.
        # ``kernels``: (k, n[, groups]) of each GEMM the operator launches (default: one, width_in deep);
        # ``redundant``: weights of ``params`` every TP rank also runs (not the model's FLOPs).
        flops = 2.0 * tokens_in * params
        moved = params * weight_bytes + tokens_in * (width_in + width_out) * act_bytes
        shapes = kernels or ((width_in, params / width_in),)
        useful = flops - 2.0 * tokens_in * redundant if np.any(redundant) else None
        ops.append(Op(name, flops, moved, "gemm", useful,
                      gemms=tuple(Gemm(tokens_in, s[1], s[0], *s[2:]) for s in shapes), element_bytes=sizes))

    attn_params = spec.attention_params / t
    q_w = spec.num_heads * (spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim if spec.mla else spec.dim_head)
    out_w = spec.num_heads * (spec.mla.v_head_dim if spec.mla else spec.dim_head)
    kv_w = kv_width_per_device(spec, t)
    proj_params = out_w * h / t
    qkv_kernels, redundant = None, 0.0
    if spec.mla:  # down-projections of q and kv (one fused GEMM, whole on every TP rank), then the up-projections
        m = spec.mla
        down = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        up = ((m.kv_lora_rank, spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim) / t),)
        if decode:  # absorbed (DeepSeek-V2 Sec. 2.1.2): per head, q_nope into the latent and the latent out to v
            up = ((m.qk_nope_head_dim, m.kv_lora_rank, spec.num_heads / t), (m.kv_lora_rank, m.v_head_dim, spec.num_heads / t))
        qkv_kernels = ((h, down),) + up
        redundant = h * down * (1.0 - 1.0 / t)
        if m.q_lora_rank:
            qkv_kernels += ((m.q_lora_rank, q_w / t),)
    gemm("qkv projection", attn_params - proj_params + redundant, n, h, q_w / t + kv_w, qkv_kernels, redundant)
    # Attention core: Q K^T and scores x V, 2 x 2 x context x width FLOPs per token (PaLM App. B).
    width = spec.attention_width
    if spec.mla and decode:
        m = spec.mla
        width = spec.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) / 2
    heads = spec.num_heads / t
    kv_heads = 1.0 if spec.mla else np.maximum(spec.kv_heads / t, 1.0)   # MLA: one latent all heads share
    ops.append(attention_core(n, ctx, width / t, q_w / t, out_w / t, kv_w, heads, kv_heads, act_bytes, kv_bytes,
                              decode, flash, latent=bool(spec.mla), steps=layout.cp if cp_steps is None else cp_steps))
    if spec.mla and decode:   # one block per sequence and MLA_QUERY_BLOCK query heads
        blocks = np.ceil(heads / MLA_QUERY_BLOCK)
        ops[-1] = replace(ops[-1], attention=replace(ops[-1].attention, tiles=n * blocks,
                                                     padding=blocks * MLA_QUERY_BLOCK / heads))
    gemm("output projection", proj_params, n, out_w / t, h)
    if moe_layer and spec.moe:
        m = spec.moe
        # The router runs on each rank's sequence shard (Megatron-Core runs MoE with TP sequence-parallel).
        # ``router_bytes``: the router's weight and input width where they differ from the layer's
        # (a quantized checkpoint's router stays in 16 bits).
        rw, ra = (weight_bytes, act_bytes) if router_bytes is None else (router_bytes, router_bytes)
        ops.append(Op("router", 2.0 * n / t * spec.router_params, spec.router_params * rw
                      + n / t * h * ra, "gemm", gemms=(Gemm(n / t, spec.router_params / h, h),),
                      element_bytes=(ra, rw, 4.0)))
        held = layout.expert_slots(spec)
        read = held if experts_read is None else np.minimum(experts_read, held)
        rows = layout.expert_rows(n, m.top_k)                 # balanced routing
        busiest = rows * imbalance
        routed_params = spec.expert_params / layout.etp       # each row meets 1/etp of its expert
        shared_params = spec.shared_expert_params / t         # shared experts follow attention's TP
        flops = 2.0 * busiest * routed_params + 2.0 * n * shared_params
        moved = (read * routed_params + shared_params) * weight_bytes \
            + (busiest + n * m.num_shared_experts) * 2 * h * act_bytes
        # Routed experts as grouped GEMMs (up/gate then down) over the experts this device reads,
        # each with its share of the busiest device's rows; shared experts as dense GEMMs.
        f_e = m.expert_ffn_hidden_size / layout.etp
        up = (2.0 if spec.mlp == "gated" else 1.0) * f_e
        kernels = routed_expert_gemms(busiest, read, h, f_e, spec.mlp == "gated")
        if m.num_shared_experts:
            f_s = m.num_shared_experts * m.expert_ffn_hidden_size / t
            kernels += (Gemm(n, f_s * up / f_e, h), Gemm(n, h, f_s))
        ops.append(Op("experts", flops, moved, "gemm", 2.0 * rows * routed_params + 2.0 * n * shared_params,
                      gemms=kernels, element_bytes=sizes))
        if not decode:   # decode's low-latency dispatch lays the rows out by expert itself (DeepEP)
            ops.append(Op("expert permute", 2.0 * busiest * h, (PERMUTE_ROW_PASSES * busiest + PERMUTE_TOKEN_PASSES
                                                                * n / norm_shard) * h * act_bytes, "vector"))
        f_tokens = busiest * m.expert_ffn_hidden_size / layout.etp \
            + n * m.num_shared_experts * m.expert_ffn_hidden_size / t
    else:
        f = spec.ffn_hidden_size / t
        gemm("mlp", spec.dense_mlp_params / t, n, h, h, ((h, (2.0 if spec.mlp == "gated" else 1.0) * f), (f, h)))
        f_tokens = n * spec.ffn_hidden_size / t
    # Elementwise: two norms and two residual adds (read + write h each) and the activation
    # function (gated: read gate and up, write product; plain: read and write) - memory bound.
    # Only what feeds a GEMM takes the GEMMs' input format (the norms' outputs, the activation's
    # product); the residual stream and the GEMM outputs the others read keep 16 bits
    # (Transformer Engine's LayerNormLinear and LayerNormMLP write fp8 only into the next GEMM).
    per_f = 3.0 if spec.mlp == "gated" else 2.0
    elementwise = n * h / norm_shard * (12.0 + 2.0 * act_bytes) + f_tokens * (2.0 * (per_f - 1.0) + act_bytes)
    # FLOPs: two RMS/LayerNorms (~4 per element each) and two residual adds (1 each) on h, and the
    # activation (~4 per hidden unit: SiLU/GeLU and the gate product). Memory bound either way.
    ops.append(Op("norms and activations", 10.0 * n * h / norm_shard + 4.0 * f_tokens, elementwise, "vector"))
    return ops


def attention_core(tokens, context, width, q_width, out_width, kv_width, heads, kv_heads, act_bytes=2.0,
                   kv_bytes=2.0, decode=False, flash=True, latent=False, steps=1.0) -> Op:
    """The attention core of ``tokens`` queries each attending to ``context`` keys (the mean over a
    causal prefill), on one device: Q K^T and scores x V, 2 x 2 x context x ``width`` FLOPs per
    token (PaLM App. B); bytes: Q read and O written, then in decode every token's cached K and V
    (``kv_width`` elements per key), in prefill the new K and V once (FlashAttention's IO, Dao et
    al. 2022 Theorem 2) or, without FlashAttention, the score matrix written and read as well.
    ``steps``: the kernels a context-parallel ring splits a prefill core into (``core_seconds``)."""
    n = np.asarray(tokens, dtype=float)
    ctx = np.asarray(context, dtype=float)
    flops = 4.0 * n * ctx * width
    io = n * (q_width + out_width) * act_bytes
    kv_io = n * ctx * kv_width * kv_bytes if decode else n * kv_width * act_bytes
    moved = io + kv_io
    if decode:
        tiles = n * kv_heads
    else:
        moved = moved + np.where(flash, 0.0, 4.0 * heads * n * ctx * act_bytes)
        # A causal prefill's queries per sequence are twice its mean context (all of the tokens
        # when they are one sequence's shard under context parallelism).
        queries = np.clip(2.0 * ctx, 1.0, np.maximum(n, 1.0))
        tiles = n / queries * heads * np.ceil(queries / ATTENTION_QUERY_TILE)
    return Op("attention core", flops, moved, "attention",
              attention=AttentionWork(tiles, ctx, bool(decode), np.asarray(flash, dtype=bool), latent,
                                      io_bytes=io if decode else 0.0, steps=1.0 if decode else steps))


def lm_head_ops(spec: TransformerSpec, tokens, tp, weight_bytes=2.0, act_bytes=2.0, with_loss=True):
    """The LM head GEMM and (in training) the fp32 softmax cross-entropy over the vocabulary."""
    t = np.maximum(np.asarray(tp, dtype=float), 1.0)
    n = np.asarray(tokens, dtype=float)
    params = spec.vocab_size * spec.hidden_size / t
    ops = [Op("lm head", 2.0 * n * params, params * weight_bytes + n * (spec.hidden_size + spec.vocab_size / t)
              * act_bytes, "gemm", gemms=(Gemm(n, spec.vocab_size / t, spec.hidden_size),),
              element_bytes=(act_bytes, weight_bytes, act_bytes))]
    if with_loss:
        # Softmax cross-entropy over fp32 logits: ~5 FLOP per logit (max, exp, sum, log, gradient);
        # the logits are read, exponentiated and written back as gradients: 3 passes of 4 bytes.
        ops.append(Op("cross entropy", 5.0 * n * spec.vocab_size / t, 3.0 * 4.0 * n * spec.vocab_size / t, "vector"))
    return ops


def mtp_ops(spec: TransformerSpec, tokens, context, layout: Layout, sp, act_bytes=2.0, imbalance=1.0, flash=True):
    """One multi-token-prediction depth in training (DeepSeek-V3 Sec. 2.2): the 2h -> h projection,
    one transformer block (MoE in an MoE model), the shared output head and its loss; named
    "mtp ..." so they read apart from the main model's operators."""
    n = np.asarray(tokens, dtype=float)
    h, t = spec.hidden_size, layout.tp
    proj = 2 * h * h / t
    ops = [Op("projection", 2.0 * n * proj, proj * 2.0 + n * 3 * h * act_bytes, "gemm",
              gemms=(Gemm(n, h / t, 2 * h),), element_bytes=(act_bytes, 2.0, act_bytes))]
    ops += layer_ops(spec, n, context, layout, sp, act_bytes=act_bytes, moe_layer=spec.moe is not None,
                     imbalance=imbalance, flash=flash)
    ops += lm_head_ops(spec, n, t)          # the output head keeps 16 bits (training._layer_times)
    return [replace(op, name=f"mtp {op.name}") for op in ops]
