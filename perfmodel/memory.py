"""Memory per device: model states under ZeRO, activations with TP/SP and recompute, KV cache.

All functions broadcast over numpy arrays of plan fields and return bytes.

References
----------
Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC20,
Sec. 3.1 and Fig. 1: mixed-precision Adam keeps 2 + 2 + K bytes per parameter (fp16 weights, fp16
gradients, K = 12 for fp32 weights, momentum and variance); stage 1 shards the K bytes over the
data-parallel degree, stage 2 also the gradients, stage 3 also the weights.
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys 2023
(arXiv 2205.05198), Sec. 4, Eq. 1-2 and Table 2: activations per layer of s b h (34 + 5 a s / h)
bytes, of which 10 s b h stay replicated under tensor parallelism t unless sequence parallelism
shards them, 24 s b h + 5 a s^2 b shard by t; selective recompute drops the 5 a s^2 b attention
core; full recompute keeps only the layer input, 2 s b h; Sec. 4.2.3: the first pipeline stage
holds p microbatches in flight (x (1 + (p-1)/(p v)) with v interleaved stages).
"""

from __future__ import annotations

import numpy as np

from .model import TransformerSpec
from .plan import Recompute


# Bytes per parameter of mixed-precision Adam (ZeRO paper, Sec. 3.1).
WEIGHT_BYTES, GRAD_BYTES, ADAM_STATE_BYTES = 2.0, 2.0, 12.0
# (weights, gradients, optimizer states) bytes per parameter of each plan.Storage: mixed-precision
# Adam; DeepSeek-V3's fp32 gradients, fp32 master weights and BF16 moments (report, Sec. 3.3.3).
_STATE_BYTES = np.array([(WEIGHT_BYTES, GRAD_BYTES, ADAM_STATE_BYTES), (2.0, 4.0, 4.0 + 2.0 + 2.0)])


def state_bytes_per_param(storage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, gradients, optimizer states) bytes per parameter under ``storage`` (plan.Storage codes)."""
    table = _STATE_BYTES[np.asarray(storage, dtype=int)]
    return table[..., 0], table[..., 1], table[..., 2]


def model_state_bytes(params, dp, zero, weight_bytes=WEIGHT_BYTES, grad_bytes=GRAD_BYTES,
                      optimizer_bytes=ADAM_STATE_BYTES):
    """(weights, gradients, optimizer states) bytes per device for ``params`` parameters held by the
    device's model-parallel shard, sharded over ``dp`` data-parallel ranks by ZeRO stage ``zero``
    (flat ZeRO; ``sharding.Sharding`` gives each state its own group)."""
    from .sharding import Sharding

    return Sharding.of(zero, dp).state_bytes(params, weight_bytes, grad_bytes, optimizer_bytes)


def activation_coefficients(spec: TransformerSpec, moe_layer: bool, gemm_input_bytes=2.0, modules=False,
                            low_precision=False):
    """Per-layer activation bytes in units of s*b*h, split as Korthikanti et al. Table 2 does:
    (replicated under TP unless SP, sharded by TP, attention-core multiplier of a*s/h).

    The stored tensors, per token: the two norm inputs (bf16) and the two norm outputs that feed
    the QKV and first MLP GEMMs; Q, K and V; the attention output; the MLP's first GEMM outputs
    (gate and up for a gated MLP) and the input of its last GEMM; one-byte dropout masks after
    attention and MLP when the model trains with dropout. GEMM inputs are kept at
    ``gemm_input_bytes``: Transformer Engine's fp8 recipe saves the fp8 cast of each GEMM input
    for the backward pass (1 byte), and the attention output then has an fp8 copy beside the bf16
    one the attention kernel keeps. For GPT (plain 4h MLP, MHA, dropout, bf16) this gives
    (10, 24, 5), the paper's numbers.

    With ``modules`` (Recompute.MODULES) the backward recomputes the norms, MLA's up-projections
    and the MoE activation from what stays: the norm outputs are not kept in 16 bits (an fp8
    GEMM's cast input still is), MLA keeps its query and KV latents (bf16) instead of Q, K and V,
    and an MoE layer drops its activation's output, the last GEMM's input (DeepSeek-V3 report Sec.
    3.2.3; Megatron-Core's output-discarding checkpoints of layernorm, mla_up_proj and moe_act).

    With ``low_precision`` (plan.Storage.DEEPSEEK; Sec. 3.3.3) the attention output is kept once, in
    E5M6 (1.5 bytes), for both the attention's backward and the output projection, and an MoE
    layer caches its SwiGLU inputs (the gate and up outputs) in FP8 and recomputes the rest.
    """
    h = spec.hidden_size
    g = np.asarray(gemm_input_bytes, dtype=float)
    if spec.mla:
        m = spec.mla
        q_w = spec.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) / h
        kv_w = spec.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2 / h
        ctx_w = spec.num_heads * m.v_head_dim / h
    else:
        q_w = ctx_w = spec.num_heads * spec.dim_head / h
        kv_w = spec.kv_heads * spec.dim_head / h
    # Q, K, V and the attention output in bf16; an fp8 copy of the output as the projection's input.
    qkv = 2 * q_w + 4 * kv_w
    if modules and spec.mla:      # the latents the up-projections are recomputed from
        qkv = 2.0 * ((spec.mla.q_lora_rank or 0) + spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) / h
    low = np.asarray(low_precision, dtype=bool)
    attention = qkv + np.where(low, 1.5, 2.0 + np.where(g < 2, g, 0.0)) * ctx_w
    per_f = (4.0 if spec.mlp == "gated" else 2.0) + g    # first GEMM's outputs (bf16) + last GEMM's input
    if moe_layer and spec.moe:
        f = spec.moe.expert_ffn_hidden_size * (spec.moe.top_k + spec.moe.num_shared_experts)
        per_f = per_f - (g if modules else 0.0)          # moe_act: the activation's output is recomputed
        # Low precision: only the first GEMM's outputs, in FP8 (the activation's output is recomputed).
        per_f = np.where(low, 2.0 if spec.mlp == "gated" else 1.0, per_f)
        mlp = per_f * f / h + g * spec.moe.top_k        # + the dispatched copies of the tokens
    else:
        mlp = per_f * spec.ffn_hidden_size / h
    dropout = 1.0 if spec.dropout else 0.0
    gemm_inputs = np.where(g < 2, 2.0 * g, 0.0) if modules else 2.0 * g   # norm outputs recomputed, fp8 casts kept
    replicated = 2.0 + 2.0 + gemm_inputs + 2.0 * dropout     # norm inputs, GEMM inputs, dropout masks
    core = (5.0 if spec.dropout else 2.0) * spec.num_heads / h   # softmax output (+ mask and dropout output)
    return replicated, attention + mlp, core


def activation_bytes_per_layer(spec: TransformerSpec, seq, micro_batch, tp, sp, recompute, flash=True,
                               moe_layer=False, gemm_input_bytes=2.0, low_precision=False):
    """Activation bytes one layer keeps for one microbatch on one device (Korthikanti et al. Eq. 1-2).

    ``recompute`` is a ``Recompute`` code; ``sp`` sequence parallelism (0/1); ``flash`` drops the
    s^2 attention matrices, which FlashAttention never stores (Dao et al. 2022, Sec. 3.1);
    ``low_precision`` DeepSeek-V3's low-precision storage (activation_coefficients).
    """
    seq = np.asarray(seq, dtype=float)
    sbh = seq * np.asarray(micro_batch, dtype=float) * spec.hidden_size
    t = np.maximum(np.asarray(tp, dtype=float), 1.0)
    sp = np.asarray(sp, dtype=bool)
    rep, shard, core = activation_coefficients(spec, moe_layer, gemm_input_bytes, low_precision=low_precision)
    lean_rep, lean_shard, _ = activation_coefficients(spec, moe_layer, gemm_input_bytes, modules=True,
                                                      low_precision=low_precision)
    core_term = np.where(np.asarray(flash, dtype=bool), 0.0, core * seq / t)
    replicated = np.where(sp, rep / t, rep)
    recompute = np.asarray(recompute)
    kept = np.select([recompute == Recompute.NONE, recompute == Recompute.SELECTIVE, recompute == Recompute.MODULES],
                     [replicated + shard / t + core_term, replicated + shard / t,
                      np.where(sp, lean_rep / t, lean_rep) + lean_shard / t], 2.0 / np.where(sp, t, 1.0))
    return sbh * kept


def stage_layers(num_layers: int, pp, ends=False, mtp_slots=0):
    """(q, r): the pipeline's slots = q x pp + r; the last r stages hold q + 1 slots, the first
    pp - r hold q. A slot is a layer, except that with ``ends`` (and pp > 1) the embedding and the
    loss each take one, on the first and the last stage, and each multi-token-prediction depth one
    more on the last (Megatron-Bridge's DeepSeek-V3 layout 'Et|(tt|)*30mL': embedding and one
    layer, thirty chunks of two layers, then MTP and loss as a chunk of two slots;
    scripts/performance/run_script.py, v0.1.0rc4).

    Shorter stages go first, where 1F1B keeps the most microbatches in flight (Megatron-Core sets
    them with --decoder-first-pipeline-num-layers). ``ends`` is Megatron-LM's
    --account-for-embedding-in-pipeline-split with --account-for-loss-in-pipeline-split, and Llama
    3's split: 'we reduce one Transformer layer each from the first and the last stages ... the
    first model chunk on the first stage has only the embedding, and the last model chunk on the
    last stage has only output projection and loss calculation' (Dubey et al. 2024, Sec. 3.3.2).
    """
    p = np.maximum(np.asarray(pp, dtype=float), 1.0)
    slots = num_layers + (2.0 + mtp_slots) * _ends(ends, p)
    q = np.floor(slots / p)
    return q, slots - q * p


def _ends(ends, pp):
    """1 where the embedding and the loss take a pipeline slot each (only with several stages)."""
    return (np.asarray(ends, dtype=bool) & (np.asarray(pp, dtype=float) > 1)).astype(float)


def layers_on_stage(num_layers: int, pp, stage, ends=False, mtp_slots=0):
    """Transformer layers of pipeline stage ``stage`` under ``stage_layers``' split."""
    return layers_by_stage(num_layers, pp, ends, mtp_slots)(stage)


def layers_by_stage(num_layers: int, pp, ends=False, mtp_slots=0):
    """``layers_on_stage`` as a function of the stage, the split computed once."""
    p = np.maximum(np.asarray(pp, dtype=float), 1.0)
    q, r = stage_layers(num_layers, p, ends, mtp_slots)
    e = _ends(ends, p)

    def on(stage):
        i = np.asarray(stage, dtype=float)
        return q + (i >= p - r) - e * (i == 0) - e * (1.0 + mtp_slots) * (i == p - 1)

    return on


def split_layers(num_layers: int, pp, ends=False, mtp_slots=0):
    """Transformer layers of (the first stage, the fullest stage without the LM head, the last
    stage) under ``stage_layers``' split. The stages before the last peak at the first, the second
    (the first short stage past it) or the one before the last (the longest of the long ones)."""
    p = np.maximum(np.asarray(pp, dtype=float), 1.0)
    on = layers_by_stage(num_layers, p, ends, mtp_slots)
    before_last = np.maximum(p - 2.0, 0.0)
    headless = np.maximum(np.maximum(on(0.0), on(np.minimum(1.0, before_last))), on(before_last))
    return on(0.0), np.where(p > 1, headless, 0.0), on(p - 1.0)


def dualpipe_rank_layers(num_layers: int, pp, ends=False, mtp_slots=0):
    """Transformer layers of (rank 0's two stages, the fullest other rank's two stages) when rank i
    holds pipeline stages i and PP - 1 - i, as DualPipe places them (DeepSeek-AI 2024, 'DeepSeek-V3
    Technical Report', Sec. 3.2.1, Fig. 5: the two directions of microbatches run the stages in
    opposite orders; Sec. 3.2.3: the shallowest layers, with the embedding, and the deepest, with
    the output head, on one rank), each stage split as ``stage_layers`` splits it. The second is 0
    with two stages or fewer (rank 0's pair is every rank's)."""
    p = np.maximum(np.asarray(pp, dtype=float), 1.0)
    on = layers_by_stage(num_layers, p, ends, mtp_slots)
    others = np.zeros(np.shape(p))
    for i in range(1, int(np.max(p)) // 2):
        others = np.where(i < p / 2.0, np.maximum(others, on(float(i)) + on(p - 1.0 - i)), others)
    return on(0.0) + on(p - 1.0), others


def in_flight_layers(layers, stage, pp, num_micro, interleave, embedding_slot=False):
    """Layer-microbatches of activations stage ``stage`` holds at its peak.

    1F1B: stage i warms up with p - i microbatches (Narayanan et al. 2021 Sec. 2.2). Interleaved
    (v model chunks of the stage's slots / v each): (p - i - 1) x 2 + (v - 1) x p warm-up chunks
    plus the one in progress, as Megatron-LM schedules them (groups of p microbatches run each
    chunk in turn; schedules.get_pp_rank_microbatches); for stage 0 this is Korthikanti et al.'s
    L (1 + (p-1)/(p v)) (Sec. 4.2.3). Never more than the microbatches (chunks) there are. With
    ``embedding_slot`` the stage's first chunk has one slot that holds no layer (the embedding's,
    ``stage_layers``' ends), so each microbatch it runs keeps one layer fewer.
    """
    p = np.maximum(np.asarray(pp, dtype=float), 1.0)
    v = np.maximum(np.asarray(interleave, dtype=float), 1.0)
    m = np.maximum(np.asarray(num_micro, dtype=float), 1.0)
    i = np.asarray(stage, dtype=float)
    e = np.asarray(embedding_slot, dtype=float)
    chunks = np.where(v > 1, np.minimum(2.0 * (p - i - 1.0) + (v - 1.0) * p + 1.0, m * v), np.minimum(p - i, m))
    # Of those chunk-microbatches, the first chunk's: p per group of v x p, in order.
    groups = np.floor(chunks / (v * p))
    first_chunk = groups * p + np.minimum(chunks - groups * v * p, p)
    return chunks * (layers + e) / v - first_chunk * e


def kv_cache_bytes_per_device(spec: TransformerSpec, tokens, kv_bytes_per_element, tp, pp):
    """KV cache of ``tokens`` cached tokens on one device: layers split by PP, KV heads by TP.

    KV heads cannot split below one per device: with TP above the KV-head count each device
    keeps a replica (GQA/MQA), and MLA's single latent is replicated on every TP rank.
    """
    tp = np.maximum(np.asarray(tp, dtype=float), 1.0)
    pp = np.maximum(np.asarray(pp, dtype=float), 1.0)
    heads = 1.0 if spec.mla else float(spec.kv_heads)
    shard = np.maximum(heads / tp, 1.0) / heads
    per_token_layer = spec.kv_elements_per_token_per_layer() * kv_bytes_per_element
    return np.asarray(tokens, dtype=float) * per_token_layer * spec.num_layers / pp * shard
