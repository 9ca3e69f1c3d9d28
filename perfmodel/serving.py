"""Serving: prefill (time to first token) and decode (time per output token) of one instance.

An instance is tp x dp_attention x pp devices (``layout.Layout``): each stage's tp x dp_attention
devices run attention as dp_attention TP groups, and the same devices run the routed experts as
an ep x etp grid, etp = tp x dp_attention / ep (as DeepSeek-V3 deployments and SGLang fold
them: attention data-parallel, experts expert-parallel). All plan fields broadcast over arrays.

Decode reads every weight the batch touches once per step and each sequence's KV cache; for an MoE
layer the expected number of distinct routed experts a batch of B tokens hits, with top-k of E
chosen uniformly, is E (1 - (1 - k/E)^B) (the occupancy expectation; Feller, An Introduction to
Probability Theory, Vol. 1, Ch. II.11). Quantized weights are streamed at their width and
dequantized in the GEMM (W4A16 / W8A16: bf16 math); W8A8 and W4A4 run the GEMM at the integer or
fp8/fp4 rate the device lists (an unlisted rate is an error, never derived). References for the
structure: Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023, Sec. 2-3 (prefill
compute bound, decode memory bound; TP communication per layer); DeepSeek-V3 Technical Report,
Sec. 3.4 (prefill and decode deployments with EP and DP attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.hardware_db.schema import BYTES_PER_ELEMENT

from .economics import energy_per_token_j, run_cost, usd_per_million_tokens
from .feasibility import FirstBroken
from .layout import Layout
from .machine import Machine
from .memory import kv_cache_bytes_per_device
from .model import TransformerSpec
from .plan import QuantScheme
from .power import PhaseWork, capped_phase, phase_power_w
from .roofline import OpTimes, layer_ops, lm_head_ops, merge, ops_time
from .transformer_pass import stage_handoff_s, tp_all_reduces_s


@dataclass(frozen=True)
class ServePlan:
    tp: object = 1
    pp: object = 1
    ep: object = 1
    dp_attention: object = 1
    batch: object = 1
    weight_precision: object = "bf16"
    activation_precision: object = "a16"
    kv_precision: object = "bf16"
    mtp_draft_tokens: object = 0      # multi-token prediction: draft tokens verified per step
    mtp_acceptance: object = 0.0      # share of draft tokens accepted
    overlap_comm: object = True       # two micro-batches: one's all-to-all under the other's compute
    kv_place: object = "hbm"          # "hbm", or a host tier ("ddr", "cxl", "pooled") holding the KV cache
    weight_place: object = "hbm"      # "hbm", or a tier the weights stream from, layer by layer, each step
    power_cap_w: object = None        # per-device accelerator power limit (W); None: its TDP
    moe_imbalance: object = 0.0       # busiest over mean EP device load; 0: computed (expert_balance)
    expert_balance: str = "eplb"      # with moe_imbalance 0: "eplb", "none" or "balanced" (perfmodel.eplb.BALANCES)
    chunk_tokens: object = 0          # tokens per iteration and attention rank when prompts ride in decode
    #                                   steps as chunks (chunked prefill in mixed batches; pp 1); 0: separate
    backend: str = "trtllm"           # serving engine whose measured GEMM kernels price the GEMMs (trtllm,
    #                                   sglang, vllm; Machine.for_serving): TensorRT-LLM's where the device has no other


def serving_backend(framework: str | None) -> str:
    """The serving engine whose GEMM fits price a deployment on ``framework`` (Dynamo runs vLLM
    workers; perfmodel.exports.serving.ENGINE); TensorRT-LLM's without one."""
    if framework is None:
        return "trtllm"
    from .exports.serving import ENGINE

    return ENGINE[framework]


@dataclass(frozen=True)
class ServeWorkload:
    """Tokens of one request; each field a number or an array that broadcasts with the plan's."""

    input_len: object
    output_len: object
    cached_len: object = 0.0    # prompt tokens whose KV is already cached (a conversation's earlier turns)


@dataclass
class ServeResult:
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    ep_per_token_s: np.ndarray        # the expert exchange's share of TPOT (exposed; all of it without overlap)
    prefill_components: dict[str, np.ndarray]
    decode_components: dict[str, np.ndarray]
    bounds: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    devices_per_instance: np.ndarray
    max_batch: np.ndarray
    prefill_tokens_per_s_per_device: np.ndarray
    decode_tokens_per_s_per_device: np.ndarray
    power_w: np.ndarray
    energy_per_token_j: np.ndarray
    cost_per_million_tokens_usd: np.ndarray
    hbm_used_bytes: np.ndarray
    feasible: np.ndarray
    binding: np.ndarray
    shortfall: np.ndarray
    prefill_operator_times: dict[str, np.ndarray] = field(default_factory=dict)
    decode_operator_times: dict[str, np.ndarray] = field(default_factory=dict)
    prefill_operator_work: dict[str, tuple] = field(default_factory=dict)   # (FLOPs, bytes) per prefill op
    decode_operator_work: dict[str, tuple] = field(default_factory=dict)    # (FLOPs, bytes) per decode step op
    quant: QuantScheme = QuantScheme()
    ttft_range_s: tuple = (0.0, 0.0)      # prediction intervals (Machine.interval)
    tpot_range_s: tuple = (0.0, 0.0)
    weight_stream_s: np.ndarray = 0.0     # per decode step: the weights' stream from their tier (0 in HBM)
    prefill_power_w: np.ndarray = 0.0     # per device during prefill, with its node share (power_w: decode)
    prefill_clock: np.ndarray = 1.0       # core clock share each phase runs at (below 1 under a power cap)
    expert_imbalance: dict = field(default_factory=dict)   # MoE: busiest over mean EP device, per phase
    decode_clock: np.ndarray = 1.0
    # With chunk_tokens (the "mixed" phase): a decode step at full batch that also carries the
    # iteration's prompt chunk (s, per token emitted, as TPOT), the prompt tokens it carries per
    # attention rank, and an unloaded instance's TTFT: ceil(new prompt tokens / chunk) such steps.
    mixed_step_s: np.ndarray = 0.0
    chunk_prompt_tokens: np.ndarray = 0.0
    chunked_ttft_s: np.ndarray = 0.0


def distinct_experts(num_experts: int, top_k: int, tokens):
    """Expected distinct experts hit by ``tokens`` tokens each routed to top_k of num_experts: each
    token misses a given expert with ``collectives.expert_miss`` of a one-expert bin, 1 - k/E."""
    tokens = np.asarray(tokens, dtype=float)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


@dataclass(frozen=True)
class Instance:
    """What a serving plan makes of its devices: layout, formats, rates and per-rank batch."""

    layout: Layout
    quant: QuantScheme
    rates: dict
    kernel: object                 # GEMM kernel model at the GEMM precision (perfmodel.kernels)
    batch: np.ndarray              # sequences per instance
    local_batch: np.ndarray        # sequences per attention data-parallel rank
    layers: np.ndarray             # layers of the last (fullest) stage: ceil(L / pp)
    moe_frac: float
    imbalance: object              # given busiest over mean EP load; 0: computed per pass (``_skew``)
    mtp_drafts: np.ndarray         # draft tokens per step from the multi-token-prediction module
    grouped: object = None         # routed experts' grouped-GEMM kernel fitted on measured MoE layers, or None
    balance: str = "eplb"          # how a computed imbalance places the default routing (perfmodel.eplb.BALANCES)


@dataclass(frozen=True)
class Phase:
    """One pass of the last stage over its layers (s): operators, and each collective as exposed."""

    ops: OpTimes
    tp: np.ndarray
    ep: np.ndarray                 # after two-batch overlap, when the plan overlaps
    pp: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.ops.total + self.tp + self.ep + self.pp


# A phase left out of an estimate (estimate_serving's ``phases``): no operators, 0 s.
IDLE = Phase(OpTimes(0.0, {}, {}, {}, 0.0, {}, 0.0, {}), 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class ServeMemory:
    """Bytes per device of the last stage, and the largest batch its KV cache allows."""

    weights: np.ndarray            # wherever they live
    hbm_weights: np.ndarray        # resident in HBM: all of them, or the streaming buffers
    tier_weights: np.ndarray       # kept in the tier they stream from (0 in HBM); see _memory
    kv: np.ndarray                 # wherever it lives
    hbm_kv: np.ndarray
    workspace: np.ndarray
    reserve: float
    used: np.ndarray               # HBM, with the reserve
    max_batch: np.ndarray


def _instance(spec: TransformerSpec, machine: Machine, plan: ServePlan) -> Instance:
    quant = QuantScheme(str(plan.weight_precision), str(plan.activation_precision), str(plan.kv_precision),
                        machine.math16)
    rates = {"gemm": machine.flops(quant.gemm_precision),
             "attention": machine.flops(quant.attention_precision(machine.supports)), "vector": np.inf}
    tp, pp, ep, dpa = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (plan.tp, plan.pp, plan.ep,
                                                                          plan.dp_attention))
    batch = np.maximum(np.asarray(plan.batch, dtype=float), 1.0)
    given = np.asarray(plan.moe_imbalance, dtype=float)
    return Instance(
        layout=Layout(tp=tp, dp=dpa, pp=pp, ep=ep, etp=tp * dpa / ep), quant=quant, rates=rates,
        kernel=machine.serving_kernel(quant, block=spec.native_precision == "fp8"), batch=batch,
        # Each attention DP rank serves batch / dp_attention sequences; experts see every rank's tokens.
        local_batch=batch / dpa, layers=np.ceil(spec.num_layers / pp),
        moe_frac=spec.moe_fraction,
        imbalance=given if spec.moe else 1.0, balance=str(plan.expert_balance),
        mtp_drafts=np.asarray(plan.mtp_draft_tokens, dtype=float),
        # A checkpoint released in fp8 is block-scaled (DeepSeek-V3's 128 x 128 weight blocks; the
        # catalog's native_precision): its experts run the block-scaled grouped GEMMs.
        grouped=machine.grouped_kernel(quant.gemm_precision, block=spec.native_precision == "fp8",
                                       weight=quant.weight) if spec.moe else None)


def _phase(spec: TransformerSpec, machine: Machine, inst: Instance, tokens_local, context, decode: bool,
           overlap: bool, skew: tuple = (None, None)) -> Phase:
    """Prefill (``decode`` False) or one decode step of the last stage's layers, with its TP
    all-reduces (Pope et al. 2023 Sec. 3), EP dispatch and combine, and the PP hand-over.

    With ``overlap``, an MoE batch may run as two micro-batches, one's dispatch and combine under
    the other's compute (DeepSeek-V3 Technical Report, Sec. 3.4; SGLang's two-batch overlap). Each
    half re-reads the weights and relaunches every kernel, so the pair takes 2 x max(compute,
    exchange) of a half batch; an engine enables it only where that beats the whole batch in turn.
    In prefill the exchange kernels hold ``exchange-sms`` of the device's SMs, so the overlapped
    compute runs on the rest; decode's low-latency kernels hold none."""
    whole_skew, half_skew = skew      # the EP load of the whole batch and of its half (_phase_skews), or None
    if not (spec.moe and overlap):
        inst = inst if whole_skew is None else replace(inst, imbalance=whole_skew)
        return Phase(*_pass(spec, machine, inst, tokens_local, context, decode))
    # The whole batch and its half in one evaluation: every plan's row twice, stacked.
    values = (tokens_local, context, *_instance_arrays(inst))
    n = int(np.broadcast(*values).size)
    tokens = np.broadcast_to(np.asarray(tokens_local, dtype=float), (n,))
    both = _stacked(inst, n, 2)
    if whole_skew is not None:
        both = replace(both, imbalance=np.concatenate([np.broadcast_to(x, (n,)) for x in (whole_skew, half_skew)]))
    stacked = _pass(spec, machine, both, np.concatenate([tokens, tokens / 2.0]),
                    np.tile(np.broadcast_to(np.asarray(context, dtype=float), (n,)), 2), decode)
    # One plan given as scalars comes back as scalars.
    whole, half = (0, 1) if all(np.ndim(x) == 0 for x in values) else (np.arange(n), n + np.arange(n))
    ops, tp, ep, pp = (stacked[0].take(whole), *(_take(x, whole) for x in stacked[1:]))
    half_ops, half_ep = stacked[0].take(half), _take(stacked[2], half)
    held = 0.0 if decode else machine.exchange_sm_share
    paired = 2.0 * np.maximum(half_ops.total / (1.0 - held), half_ep)
    ep = np.maximum(np.minimum(ops.total + ep, paired) - ops.total, 0.0)
    return Phase(ops, tp, ep, pp)


def _instance_arrays(inst: Instance) -> tuple:
    """The per-plan values of an instance (arrays or scalars that broadcast)."""
    lay = inst.layout
    return (inst.batch, inst.local_batch, inst.layers, inst.imbalance, inst.mtp_drafts, lay.tp, lay.cp, lay.dp,
            lay.pp, lay.ep, lay.etp)


def _stacked(inst: Instance, n: int, times: int) -> Instance:
    """The instance with each of its ``n`` plans' rows ``times`` times, one copy after the other."""
    def tile(x):
        return np.tile(np.broadcast_to(np.asarray(x, dtype=float), (n,)), times)
    lay = inst.layout
    return replace(inst, layout=Layout(tp=tile(lay.tp), cp=tile(lay.cp), dp=tile(lay.dp), pp=tile(lay.pp),
                                       ep=tile(lay.ep), etp=tile(lay.etp)),
                   batch=tile(inst.batch), local_batch=tile(inst.local_batch), layers=tile(inst.layers),
                   imbalance=tile(inst.imbalance), mtp_drafts=tile(inst.mtp_drafts))


def _phase_skews(spec: TransformerSpec, machine: Machine, inst: Instance, tokens: dict, overlap: bool) -> dict:
    """Each phase's busiest over mean EP load (``_skew``) for its whole batch and, with ``overlap``, its
    half (else None): {phase: (whole, half)}, every phase's rows placed in one call, so that each EP
    degree's distinct token counts share one EPLB placement. Empty for a dense model."""
    if not spec.moe or not tokens:
        return {}
    shape = np.broadcast(*_instance_arrays(inst), *tokens.values()).shape
    n = int(np.prod(shape, dtype=int))
    parts = [t for whole in tokens.values() for t in ((whole, np.asarray(whole) / 2.0) if overlap else (whole,))]
    values = _skew(spec, machine, _stacked(inst, n, len(parts)),
                   np.concatenate([np.broadcast_to(np.asarray(t, dtype=float), (n,)) for t in parts]))
    rows = np.broadcast_to(values, (len(parts) * n,)).reshape(len(parts), n)
    each = iter(row.reshape(shape) if shape else float(row[0]) for row in rows)
    return {name: (next(each), next(each) if overlap else None) for name in tokens}


def _take(x, rows):
    """Rows ``rows`` of a per-plan value (a scalar stays itself)."""
    return np.asarray(x)[rows] if np.ndim(x) else x


def _skew(spec: TransformerSpec, machine: Machine, inst: Instance, tokens_local) -> np.ndarray:
    """Busiest over mean expert-parallel device load of each plan: the given ratio where one is
    given (``--moe-imbalance``, or a placement of ``--routing`` statistics), else computed from the
    default routing of the tokens the EP group routes in this pass (``perfmodel.eplb``: power law
    ``moe-routing-power-law-alpha``, EPLB with ``moe-redundant-expert-share`` redundant experts)."""
    given = np.asarray(inst.imbalance, dtype=float)
    if not spec.moe or np.all(given > 0):
        return given if spec.moe else np.ones_like(given)
    from .eplb import default_imbalance

    lay = inst.layout
    # The EP group's tokens: each device's rows with balanced routing (top-1) times its ep ranks.
    tokens, ep, given = np.broadcast_arrays(lay.expert_rows(tokens_local, 1) * lay.ep, lay.ep, given)
    todo = given <= 0
    out = given.astype(float).copy()
    out[todo] = default_imbalance(spec.moe.num_experts, spec.moe.top_k, tokens[todo], ep[todo],
                                  machine.constants.moe_routing_power_law_alpha,
                                  machine.constants.moe_redundant_expert_share, inst.balance)
    return out if out.ndim else float(out)


def _stage_ops(spec: TransformerSpec, machine: Machine, inst: Instance, tokens_local, context, decode: bool,
               keep=None) -> OpTimes:
    """Operator times of the last stage's layers over ``tokens_local`` (the LM head apart); ``keep``
    (an Op predicate) selects the operators timed, all by default."""
    lay, q, bw = inst.layout, inst.quant, machine.hbm_bytes_per_s
    kw = dict(sp=True, weight_bytes=q.weight_bytes, act_bytes=q.activation_bytes, flash=True, decode=decode,
              kv_bytes=q.kv_bytes)
    kernels = (inst.kernel, machine.attention_kernel(q.kv if decode else q.attention_precision(machine.supports),
                                                     decode, latent=spec.mla is not None))
    if decode and kernels[1] is None:    # a roofline decode core: at its measured rate where one is given
        inst = replace(inst, rates=dict(inst.rates, attention=machine.decode_attention_flops(
            q.attention_precision(machine.supports))))
    kept = (lambda ops: ops) if keep is None else (lambda ops: [op for op in ops if keep(op)])
    parts = [ops_time(kept(layer_ops(spec, tokens_local, context, lay, **kw)), inst.rates, bw, *kernels,
                      with_backward=False).scaled(inst.layers * (1 - inst.moe_frac))] if spec.dense_layers else []
    if spec.moe:
        # The router runs in 16 bits whatever the weights' format (Layout.sixteen_bit_params_per_device).
        wide = (dict(inst.rates, gemm=machine.flops(machine.math16)), bw, machine.gemm_kernel(machine.math16))
        # Each of an EP rank's experts is hit with the same probability as any expert, by the
        # tokens of its expert data-parallel share of the stage.
        read = lay.expert_slots(spec) * distinct_experts(spec.moe.num_experts, spec.moe.top_k,
                                                          tokens_local * lay.dp / lay.edp) / spec.moe.num_experts
        moe = kept(layer_ops(spec, tokens_local, context, lay, moe_layer=True, imbalance=inst.imbalance,
                             experts_read=read, router_bytes=2.0, **kw))
        parts += [ops_time([op for op in moe if op.name != "router"], inst.rates, bw, *kernels, with_backward=False,
                           grouped=inst.grouped).scaled(inst.layers * inst.moe_frac),
                  ops_time([op for op in moe if op.name == "router"], *wide, with_backward=False)
                  .scaled(inst.layers * inst.moe_frac)]
    return merge(*parts)


def _pass(spec: TransformerSpec, machine: Machine, inst: Instance, tokens_local, context, decode: bool,
          chunk: tuple | None = None) -> tuple:
    """(operator times, TP, EP and PP communication) of the last stage's layers over ``tokens_local``.

    ``chunk`` = (tokens, context): a decode step that also carries that many prompt tokens, as an
    engine's mixed batch does (chunked prefill; Agrawal et al., "Taming Throughput-Latency Tradeoff in
    LLM Inference with Sarathi-Serve", OSDI 2024, Sec. 4): the weight GEMMs, norms, router and experts
    run once over all the tokens (their weights read once), each attention core over its own tokens
    (the decode tokens over their cached context with the decode kernel, the prompt chunk over its
    prefix with the prefill kernel), and the expert exchange moves every token with the kernels the
    engine is set up with, of DeepEP's low-latency and normal ones the faster. An MLA model's decode
    tokens take the prompt's projections, not the absorbed ones (a difference of one small GEMM per head)."""
    tokens_all = tokens_local if chunk is None else tokens_local + chunk[0]
    inst = replace(inst, imbalance=_skew(spec, machine, inst, tokens_all))
    lay, q, topo, h = inst.layout, inst.quant, machine.topology, spec.hidden_size
    if chunk is None:
        layers = _stage_ops(spec, machine, inst, tokens_local, context, decode)
    else:
        def linear(op):
            return op.attention is None

        def core(op):
            return op.attention is not None
        carries = np.asarray(chunk[0], dtype=float) > 0          # an iteration without prompt tokens launches no core
        layers = merge(_stage_ops(spec, machine, inst, tokens_all, chunk[1], False, linear),
                       _stage_ops(spec, machine, inst, tokens_local, context, True, core),
                       _stage_ops(spec, machine, inst, chunk[0], chunk[1], False, core).scaled(carries))
    # Logits of the last position only, on the last stage; the router and the head run in 16 bits.
    wide = (dict(inst.rates, gemm=machine.flops(machine.math16)), machine.hbm_bytes_per_s,
            machine.gemm_kernel(machine.math16))
    head = ops_time(lm_head_ops(spec, inst.local_batch, lay.tp, with_loss=False), *wide,
                    with_backward=False).scaled(1.0 / lay.pp)
    ops = merge(layers, head)
    act = tokens_all * h * 2.0
    tp = tp_all_reduces_s(topo, lay, inst.layers, act, 2.0)
    ep = 0.0
    if spec.moe:
        rows, g = lay.expert_rows(tokens_all, 1) * inst.imbalance, lay.ep_group
        # The dispatch sends fp8 (with one fp32 scale per 128 values) under W8A8, else bf16; the
        # combine returns bf16 (DeepEP, both kernels).
        sent = h * q.activation_bytes + (h / 128.0 * 4.0 if q.activation_bytes == 1 else 0.0)

        def low_latency():   # decode's kernels: each token-expert copy goes straight to its rank
            copies = rows * spec.moe.top_k
            return topo.expert_exchange("dispatch", copies, sent, g.stride, g.size) \
                + topo.expert_exchange("combine", copies, h * 2.0, g.stride, g.size)

        def normal():
            # Prefill's kernels: a token goes once to each rank of its node holding one of its experts,
            # and once to each remote node holding one, which forwards it inside; fitted on measured
            # DeepEP normal kernels where the device has a fit, else the link model.
            return sum(topo.normal_exchange(op, rows, size, spec.moe.top_k, spec.moe.num_experts, g.stride, g.size)
                       for op, size in (("dispatch", sent), ("combine", h * 2.0)))
        # A mixed batch runs whichever of the two the engine is set up with: the faster.
        exchange = (low_latency() if chunk is None else np.minimum(low_latency(), normal())) if decode else normal()
        # EP ranks that already hold their tokens (inside one TP group) exchange nothing: their
        # combine is the TP all-reduce counted in ``tp`` (Layout.ep_holds_tokens).
        ep = inst.layers * inst.moe_frac * np.where(lay.ep_holds_tokens, 0.0, exchange)
    pp = (lay.pp - 1) / lay.pp * stage_handoff_s(topo, lay, act)
    return ops, tp, ep, pp


def _memory(spec: TransformerSpec, machine: Machine, inst: Instance, work: ServeWorkload, kv_tier,
            weight_tier=None) -> ServeMemory:
    """Weights of the last stage (the most layers and the LM head), each sequence's KV cache, the
    prefill workspace and the reserve; the largest batch is what the KV room holds. Weights
    streamed from a tier keep two layers' worth in HBM (the layer computing and the one arriving)."""
    lay, q = inst.layout, inst.quant
    s_in, s_out = (np.asarray(x, dtype=float) for x in (work.input_len, work.output_len))
    # With multi-token prediction the MTP module serves as the draft model and stays resident.
    dense, expert = lay.params_per_device(spec, inst.layers, lay.pp == 1, True, mtp=inst.mtp_drafts > 0)
    if spec.moe and inst.balance == "eplb":
        from .eplb import slots_per_device

        # EPLB's redundant copies are weights too: each EP device holds its slots, not E / ep.
        share = machine.constants.moe_redundant_expert_share
        expert = expert * np.where(lay.ep > 1, slots_per_device(spec.moe.num_experts, lay.ep, share)
                                   / lay.expert_slots(spec), 1.0)
    # The embedding, the head and the routers stay in 16 bits whatever the weights' format.
    wide = lay.sixteen_bit_params_per_device(spec, inst.layers, lay.pp == 1, True)
    weights = (dense + expert) * q.weight_bytes + wide * np.maximum(2.0 - q.weight_bytes, 0.0)
    kv = kv_cache_bytes_per_device(spec, inst.local_batch * (s_in + s_out), q.kv_bytes, lay.tp, lay.pp)
    if spec.sliding_window:
        kv = kv * spec.kv_cache_bytes(s_in + s_out) / (spec.kv_bytes_per_token() * (s_in + s_out))
    # Prefill activations of one layer in flight, for at most the chunk a server prefills at once;
    # bf16, 4 hidden-size tensors live at once (layer input, norm output, attention output, MLP
    # input), split by TP.
    in_flight = np.minimum(inst.local_batch * s_in,
                           np.maximum(s_in, machine.constants.prefill_tokens_in_flight))
    workspace = in_flight * spec.hidden_size * 2.0 * 4.0 / lay.tp
    reserve = machine.hbm_reserve_bytes
    per_seq_kv = kv / inst.local_batch
    hbm_kv = kv if kv_tier is None else np.zeros_like(kv)
    hbm_weights = weights if weight_tier is None else weights * np.minimum(2.0 / inst.layers, 1.0)
    tier_weights = np.zeros_like(weights) if weight_tier is None else weights * _copy_share(machine, weight_tier, lay)
    shared = tier_weights if weight_tier is not None and weight_tier is kv_tier else 0.0
    room = np.maximum(machine.hbm_bytes - hbm_weights - workspace - reserve, 0.0) if kv_tier is None \
        else np.maximum(kv_tier.bytes_per_device - shared, 0.0)
    return ServeMemory(weights, hbm_weights, tier_weights, kv, hbm_kv, workspace, reserve,
                       hbm_weights + hbm_kv + workspace + reserve, np.floor(room / per_seq_kv) * lay.dp)


def _copy_share(machine: Machine, tier, lay: Layout):
    """The share of its own weight shard a device keeps in the tier its weights stream from. A
    pooled tier is one memory its node's devices share: read-only weights are held there once and
    every instance on the node reads the same copy (FengHuang's rack-level shared memory, Li et al.
    2025, arXiv 2511.10753, abstract and Ch. 3; CloudMatrix384's EMS pool caches models for every
    NPU, Zuo et al. 2025, arXiv 2506.12708, Secs. 3-4), so an instance of d devices on a node of D
    keeps d / D of its shards' bytes there (the copy spread over the node); an instance wider than
    a node, or a tier a device reaches alone (DDR, CXL behind its own host), keeps its whole shard."""
    if tier.kind != "pooled":
        return 1.0
    return lay.devices / np.maximum(lay.devices, machine.system.devices_per_node)


def _feasibility(spec: TransformerSpec, machine: Machine, inst: Instance, mem: ServeMemory, kv_place: str, kv_tier,
                 weight_place: str = "hbm", weight_tier=None):
    """(binding, shortfall): the first rule each configuration breaks ("" when it fits)."""
    lay = inst.layout
    rules = FirstBroken(np.shape(mem.used))
    violate = rules.rule
    violate(lay.devices > machine.devices, "devices", lay.devices - machine.devices)
    violate(spec.num_heads % lay.tp != 0, "tp divides heads", lay.tp)
    violate(lay.pp > spec.num_layers, "pp at most the layers", lay.pp)   # uneven splits: the largest stage sets the pace
    if spec.moe:
        # ep above the expert count holds redundant copies of hot experts (one slot per rank).
        violate((lay.tp * lay.dp) % lay.ep != 0, "ep divides the instance's tp x dp_attention ranks", lay.ep)
        violate(spec.moe.expert_ffn_hidden_size % lay.etp != 0,
                "expert tp (tp x dp_attention / ep) divides the expert hidden size", lay.etp)
    else:
        violate(lay.ep > 1, "ep needs an MoE model", lay.ep)
    violate(inst.batch % lay.dp != 0, "dp_attention divides batch", inst.batch)
    violate(mem.used > machine.hbm_bytes, "hbm", mem.used - machine.hbm_bytes)
    if kv_tier is not None or weight_tier is not None:
        for place, tier in {kv_place: kv_tier, weight_place: weight_tier}.items():
            if tier is not None:
                held = (mem.kv if tier is kv_tier else 0.0) + (mem.tier_weights if tier is weight_tier else 0.0)
                violate(held > tier.bytes_per_device, place, held - tier.bytes_per_device)
    return rules.binding, rules.shortfall


def estimate_serving(spec: TransformerSpec, machine: Machine, plan: ServePlan, work: ServeWorkload,
                     phases: tuple[str, ...] = ("prefill", "decode")) -> ServeResult:
    """TTFT, TPOT, memory, throughput, energy and cost of one instance configuration.

    Precisions are scalars per call (the search loops over the few precision combinations);
    parallel degrees and batch broadcast as arrays. ``phases`` names the phases to evaluate (the
    serving search prices the prefill of one set of plans and the decode of another); a phase
    left out takes 0 s, and whatever is derived from its time reads 0.
    """
    return estimate_serving_placed(spec, machine, plan, work, ((plan.kv_place, plan.weight_place),), phases)[0]


def estimate_serving_placed(spec: TransformerSpec, machine: Machine, plan: ServePlan, work: ServeWorkload,
                            places, phases: tuple[str, ...] = ("prefill", "decode")) -> list[ServeResult]:
    """``estimate_serving`` of ``plan`` with its KV cache and weights at each (kv_place,
    weight_place) of ``places``, in that order (the plan's own places are ignored). The phases'
    operator and communication times (and their power-capped clocks) do not depend on where the KV
    cache and the weights live, only the streams from a tier, the memory and the feasibility do:
    the phases are evaluated once for all places. Kernels run at the serving fits' own rates
    (Machine.for_serving: no training framework factor), the GEMMs at the fits of the plan's
    serving engine where the device has them."""
    machine = machine.for_serving(plan.backend)
    inst = _instance(spec, machine, plan)
    pp = inst.layout.pp
    s_in, s_out = (np.asarray(x, dtype=float) for x in (work.input_len, work.output_len))
    overlap = bool(plan.overlap_comm)
    # With a cached prefix (prefix caching; Zheng et al. 2024, SGLang RadixAttention, Sec. 3) only the new
    # tokens are prefilled, attending to the whole prompt: the cached KV plus half the new tokens on average.
    cached = np.minimum(np.maximum(np.asarray(work.cached_len, dtype=float), 0.0), s_in - 1.0)
    # Each phase's tokens in the EP group, the whole batch and (with overlap) its half, placed at once.
    draft = np.asarray(plan.mtp_draft_tokens, dtype=float)
    tokens = {"prefill": inst.local_batch * (s_in - cached), "decode": inst.local_batch / pp * (1.0 + draft)}
    skews = _phase_skews(spec, machine, inst, {k: v for k, v in tokens.items() if k in phases}, overlap)
    prefill = _phase(spec, machine, inst, tokens["prefill"], cached + (s_in - cached) / 2.0, False,
                     overlap, skews.get("prefill", (None, None))) if "prefill" in phases else IDLE
    # Pipeline: a prompt batch passes the pp stages in turn; each stage computes 1/pp of the layers.
    context = s_in + s_out / 2.0
    per_step = 1.0 + draft * np.asarray(plan.mtp_acceptance, dtype=float)   # tokens emitted per sequence per step
    # Decode: pp microbatches of batch/pp in flight; each token passes all pp stages per step.
    # With multi-token prediction a step checks 1 + draft tokens and emits per_step of them
    # (DeepSeek-V3 Technical Report, Sec. 2.2 and 5.4.3).
    decode = _phase(spec, machine, inst, tokens["decode"], context, True, overlap, skews.get("decode", (None, None))) \
        if "decode" in phases else IDLE
    # Mixed batches (an instance without pipeline stages): each step of an attention rank carries its
    # decode tokens and prompt tokens up to chunk_tokens in all.
    chunk = np.maximum(np.asarray(plan.chunk_tokens, dtype=float) - inst.local_batch * (1.0 + draft), 0.0)
    mixed = Phase(*_pass(spec, machine, inst, tokens["decode"], context, True,
                         (chunk, cached + (s_in - cached) / 2.0))) if "mixed" in phases else IDLE
    # Under a power cap each phase runs at the highest clock its power allows (perfmodel.power):
    # compute-bound prefill slows, memory-bound decode rarely does.
    cap = None if plan.power_cap_w is None else np.asarray(plan.power_cap_w, dtype=float)
    works = {name: PhaseWork.of(phase.ops, phase.total, inst.quant.gemm_precision)
             for name, phase in (("prefill", prefill), ("decode", decode), ("mixed", mixed))}
    (pre_capped, _, pre_clock), (dec_capped, _, dec_clock), (mix_capped, _, _) = (
        capped_phase(machine, works[n], cap) for n in ("prefill", "decode", "mixed"))
    # The busiest over mean EP device each phase pays (its whole batch's).
    skew = {name: whole for name, (whole, _) in skews.items()}
    phased = _Phased(inst, prefill, decode, works, pre_capped, pre_clock, dec_capped, dec_clock, per_step, context,
                     skew, mixed.total + mix_capped, chunk, s_in - cached)
    return [_placed(spec, machine, work, phased, str(kv_place), str(weight_place)) for kv_place, weight_place in places]


@dataclass(frozen=True)
class _Phased:
    """What estimate_serving computes before it knows where the KV cache and the weights live."""

    inst: Instance
    prefill: Phase
    decode: Phase
    works: dict
    pre_capped: object
    pre_clock: object
    dec_capped: object
    dec_clock: object
    per_step: object
    context: object
    skew: dict
    mixed_stage: object = 0.0      # a mixed microbatch on the last stage, with its power-cap slowdown (s)
    chunk: object = 0.0            # prompt tokens per mixed iteration and attention rank
    new_prompt: object = 0.0       # prompt tokens to prefill (not cached)


def _placed(spec: TransformerSpec, machine: Machine, work: ServeWorkload, phased: _Phased, kv_place: str,
            weight_place: str) -> ServeResult:
    """The estimate of evaluated phases with the KV cache in ``kv_place`` and the weights in
    ``weight_place``: tier streams, memory, feasibility, throughput, power and cost."""
    f = phased
    inst, prefill, decode, works, per_step, context = f.inst, f.prefill, f.decode, f.works, f.per_step, f.context
    pre_capped, pre_clock, dec_capped, dec_clock = f.pre_capped, f.pre_clock, f.dec_capped, f.dec_clock
    pre_stage, dec_stage = prefill.total + pre_capped, decode.total + dec_capped
    lay, pp = inst.layout, inst.layout.pp
    s_in = np.asarray(work.input_len, dtype=float)
    ttft, step_time = pp * pre_stage, pp * dec_stage
    kv_tier = None if kv_place == "hbm" else machine.tier(kv_place)
    weight_tier = None if weight_place == "hbm" else machine.tier(weight_place)
    mem = _memory(spec, machine, inst, work, kv_tier, weight_tier)
    # Off HBM, KV blocks and weights stream to HBM for each step, prefetched layer by layer under
    # compute (FlexGen, Sheng et al., ICML 2023, Sec. 4.2; weights as FengHuang's active tensor
    # paging, Li et al. 2025, arXiv 2511.10753): the slower of compute and each tier's stream sets
    # the step; streams from one tier share its bandwidth. Every expert of the stage streams (which
    # experts a step routes to is known only at its router). The kernels read the arrived bytes from
    # HBM as before; the staging writes into HBM are not charged (for weights as for the KV cache),
    # which a fabric the kernels read directly (FengHuang's TAB) does not incur.
    streamed = {}
    if kv_tier is not None:
        streamed[kv_place] = kv_cache_bytes_per_device(spec, inst.local_batch * context, inst.quant.kv_bytes,
                                                       lay.tp, pp) * pp
    weight_stream = np.zeros_like(np.asarray(step_time, dtype=float))
    if weight_tier is not None:
        streamed[weight_place] = streamed.get(weight_place, 0.0) + pp * mem.weights
        weight_stream = pp * mem.weights / weight_tier.read_bytes_per_s
        ttft = np.maximum(ttft, weight_stream)
    mixed_step = pp * np.asarray(f.mixed_stage, dtype=float)
    for place, step_bytes in streamed.items():
        step_time = np.maximum(step_time, step_bytes / machine.tier(place).read_bytes_per_s)
        mixed_step = np.maximum(mixed_step, step_bytes / machine.tier(place).read_bytes_per_s)
    tpot = step_time / per_step
    chunked = np.asarray(f.chunk, dtype=float) > 0
    chunked_ttft = np.where(chunked, np.ceil(f.new_prompt / np.where(chunked, f.chunk, 1.0)) * mixed_step, 0.0)
    binding, shortfall = _feasibility(spec, machine, inst, mem, kv_place, kv_tier, weight_place, weight_tier)

    devices = lay.devices
    over = lambda x, seconds: np.where(seconds > 0, x / np.where(seconds > 0, seconds, 1.0), 0.0)  # noqa: E731
    prefill_tps = over(inst.batch * s_in, ttft) / devices
    decode_tps = over(inst.batch, tpot) / devices
    power = phase_power_w(machine, works["decode"], dec_clock, step_time / pp) + machine.overhead_w_per_device
    prefill_power = phase_power_w(machine, works["prefill"], pre_clock, ttft / pp) + machine.overhead_w_per_device
    energy = energy_per_token_j(power, decode_tps, machine.constants.pue)
    cost = usd_per_million_tokens(run_cost(machine, power), decode_tps)
    return ServeResult(
        ttft_s=ttft, tpot_s=tpot, ep_per_token_s=pp * decode.ep / per_step, expert_imbalance=f.skew,
        prefill_components={"compute": pp * prefill.ops.total, "tp communication": pp * prefill.tp,
                            "ep all-to-all": pp * prefill.ep, "pp point-to-point": pp * prefill.pp,
                            "power cap": pp * pre_capped,
                            "streamed from memory tiers (exposed)": ttft - pp * pre_stage},
        decode_components={"compute and memory": pp * decode.ops.total, "tp communication": pp * decode.tp,
                           "ep all-to-all": pp * decode.ep, "pp point-to-point": pp * decode.pp,
                           "power cap": pp * dec_capped,
                           "streamed from memory tiers (exposed)": step_time - pp * dec_stage},
        bounds={**{f"prefill {k}": v for k, v in prefill.ops.compute_bound.items()},
                **{f"decode {k}": v for k, v in decode.ops.compute_bound.items()}},
        memory={"weights": mem.hbm_weights, "kv cache": mem.hbm_kv, "activations": mem.workspace,
                "reserve": np.full_like(mem.used, mem.reserve),
                **({f"kv cache in {kv_place}": mem.kv} if kv_tier is not None else {}),
                **({f"weights in {weight_place}": mem.tier_weights} if weight_tier is not None else {})},
        devices_per_instance=devices, max_batch=mem.max_batch, prefill_tokens_per_s_per_device=prefill_tps,
        decode_tokens_per_s_per_device=decode_tps, power_w=power, energy_per_token_j=energy,
        cost_per_million_tokens_usd=cost, hbm_used_bytes=mem.used, feasible=binding == "", binding=binding,
        shortfall=shortfall, prefill_operator_times=prefill.ops.seconds, decode_operator_times=decode.ops.seconds,
        prefill_operator_work={k: (f, prefill.ops.bytes[k]) for k, f in prefill.ops.flops.items()},
        decode_operator_work={k: (f, decode.ops.bytes[k]) for k, f in decode.ops.flops.items()},
        quant=inst.quant,
        ttft_range_s=machine.interval(ttft, pp * prefill.ops.total, np.maximum(ttft - pp * prefill.ops.total, 0.0),
                                      machine.serving_error),
        weight_stream_s=weight_stream, prefill_power_w=prefill_power, prefill_clock=pre_clock,
        decode_clock=dec_clock, mixed_step_s=mixed_step / per_step, chunk_prompt_tokens=f.chunk,
        chunked_ttft_s=chunked_ttft,
        tpot_range_s=tuple(np.asarray(x) / per_step for x in machine.interval(
            step_time, pp * decode.ops.total, np.maximum(step_time - pp * decode.ops.total, 0.0),
            machine.serving_error)))


def kv_transfer_time(spec: TransformerSpec, prompt_tokens: float, kv_precision: str, prefill: Machine,
                     decode: Machine, same_system: bool, prefill_devices: int, decode_devices: int) -> float:
    """Seconds to move one prompt's KV cache from a prefill instance to a decode instance.

    Over the scale-up fabric when both instances fit one scale-up domain of one system (as on
    CloudMatrix384's Unified Bus; Zuo et al. 2025, Sec. 4), else over the scale-out network, with
    as many parallel streams as the smaller instance has devices: alpha + S / (B x streams).
    """
    size = spec.kv_cache_bytes(prompt_tokens, kv_precision if kv_precision in BYTES_PER_ELEMENT else "bf16")
    if same_system and prefill_devices + decode_devices <= prefill.scale_up_domain:
        idx = int(np.searchsorted(prefill.topology.sizes, prefill.scale_up_domain))
        bw, lat = prefill.topology.bw[min(idx, len(prefill.topology.bw) - 1)], prefill.topology.lat[0]
    else:
        bw = min(prefill.topology.bw[-1], decode.topology.bw[-1])
        lat = max(prefill.topology.lat[-1], decode.topology.lat[-1])
    return float(lat + size / (bw * max(min(prefill_devices, decode_devices), 1)))
