"""A plan's device layout: which ranks form each parallel group, and what each device holds and does.

Ranks are numbered with tensor parallelism innermost, then context parallelism, then data
parallelism (attention data parallelism in serving), then pipeline stages, as Megatron-LM orders
them by default (``tp-cp-dp-pp``). The devices of one pipeline stage (tp x cp x dp of them) run
attention as TP groups; the same devices run the MoE experts folded into their own grid, expert
tensor parallelism innermost, then expert parallelism, then expert data parallelism
(etp x ep x edp = tp x cp x dp): Megatron-Core's "MoE parallel folding" (Liu et al., "MoE Parallel
Folding", arXiv:2504.14960, 2025) and the DP-attention + EP deployments of DeepSeek-V3
(Technical Report, Sec. 3.4) and SGLang. A group of ``size`` ranks ``stride`` apart spans
``stride x size`` consecutive ranks and so crosses every topology level smaller than that; its
collective pays the slowest (``Topology.link``).

Every field broadcasts over numpy arrays of plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import TransformerSpec


def _deg(x) -> np.ndarray:
    return np.maximum(np.asarray(x, dtype=float), 1.0)


@dataclass(frozen=True)
class Group:
    """``size`` ranks, ``stride`` ranks apart (a group of one costs nothing)."""

    stride: np.ndarray
    size: np.ndarray


@dataclass(frozen=True)
class Layout:
    """Degrees of one plan (or of many, as arrays). ``etp`` 0 means "the same as tp"."""

    tp: object = 1
    cp: object = 1
    dp: object = 1
    pp: object = 1
    ep: object = 1
    etp: object = 0

    def __post_init__(self):
        for name in ("tp", "cp", "dp", "pp", "ep"):
            object.__setattr__(self, name, _deg(getattr(self, name)))
        etp = np.asarray(self.etp, dtype=float)
        object.__setattr__(self, "etp", np.where(etp > 0, etp, self.tp))

    # --- sizes -------------------------------------------------------------------------------

    @property
    def stage_devices(self) -> np.ndarray:
        """Devices of one pipeline stage: tp x cp x dp (the attention and the expert grids)."""
        return self.tp * self.cp * self.dp

    @property
    def devices(self) -> np.ndarray:
        return self.stage_devices * self.pp

    @property
    def edp(self) -> np.ndarray:
        """Expert data parallelism: replicas of each expert shard within a stage (may be fractional
        for an invalid plan, which ``folds`` rejects)."""
        return self.stage_devices / (self.etp * self.ep)

    @property
    def folds(self) -> np.ndarray:
        """Whether the expert grid etp x ep tiles the stage's devices exactly."""
        return np.mod(self.stage_devices, self.etp * self.ep) == 0

    @property
    def dense_replicas(self) -> np.ndarray:
        """Ranks holding the same dense (non-expert) weights: dp x cp (ZeRO shards over them)."""
        return self.dp * self.cp

    # --- groups ------------------------------------------------------------------------------

    @property
    def tp_group(self) -> Group:
        return Group(np.ones_like(self.tp), self.tp)

    @property
    def cp_group(self) -> Group:
        return Group(self.tp, self.cp)

    @property
    def dp_group(self) -> Group:
        """Attention data parallelism (dp in training, dp_attention in serving)."""
        return Group(self.tp * self.cp, self.dp)

    @property
    def replica_group(self) -> Group:
        """The dense weights' data-parallel group, dp x cp ranks tp apart (gradients, ZeRO)."""
        return Group(self.tp, self.dense_replicas)

    def replica_subgroup(self, size, every=1) -> Group:
        """``size`` replica ranks ``every`` replica ranks apart: a group of a hierarchical sharding
        (``every`` 1: consecutive replicas, e.g. those of one node; ``every`` k: one member in each
        of k-rank blocks, e.g. one per node across nodes)."""
        every = np.maximum(np.asarray(every, dtype=float), 1.0)
        return Group(self.tp * every, np.maximum(np.asarray(size, dtype=float), 1.0))

    @property
    def pp_neighbour_stride(self) -> np.ndarray:
        """Ranks between consecutive pipeline stages."""
        return self.stage_devices

    @property
    def ep_group(self) -> Group:
        """Expert parallelism: ep ranks etp apart (the MoE all-to-all)."""
        return Group(self.etp, self.ep)

    @property
    def ep_holds_tokens(self) -> np.ndarray:
        """Whether every rank of an EP group already holds the tokens it routes: the group (ep ranks
        etp apart, so etp x ep consecutive ranks) lies inside one TP group, whose ranks all hold the
        same tokens after attention's all-reduce. Then nothing is dispatched (each rank takes its own
        experts' rows of the tokens it has) and the combine is the all-reduce of the partial outputs
        that TP already runs after the MoE block: TensorRT-LLM's fused MoE without attention data
        parallelism (no all-to-all; ``reduce_results`` all-reduce), as aiconfigurator prices it on
        Hopper (ai-dynamo/aiconfigurator, ``operators/moe_dispatch.rs``, ``TrtllmAlltoall``: attention
        TP > 1 -> one custom all-reduce before and one after the experts), and vLLM's FusedMoE with
        expert parallelism at data parallelism 1."""
        return self.etp * self.ep <= self.tp

    def _end_params(self, spec: TransformerSpec, first, last):
        """The token embedding (and learned positions) of the first stage, the final norm and LM head
        of the last; with one stage a tied embedding counts once (``params_per_device``)."""
        norm = spec.hidden_size * (2 if spec.norm == "layernorm" else 1)
        table = spec.vocab_size * spec.hidden_size
        positions = spec.embedding_params - table * (1 if spec.tied_embeddings else 2)
        return np.where(self.pp == 1, spec.embedding_params + norm,
                        np.where(first, table + positions, 0.0) + np.where(last, table + norm, 0.0))

    def sixteen_bit_params_per_device(self, spec: TransformerSpec, layers, first, last):
        """Of ``params_per_device``'s dense parameters, those a quantized checkpoint keeps in 16 bits:
        the embedding, the LM head, the final norm and the MoE routers (NVIDIA TensorRT Model
        Optimizer leaves ``*lm_head*``, ``*router*`` and ``*mlp.gate.*`` unquantized in every recipe:
        ``_default_disabled_quantizer_cfg``, modelopt/torch/quantization/config.py; DeepSeek-V3's fp8
        checkpoint keeps its gate and head in bf16)."""
        moe_frac = spec.moe_fraction
        routers = layers * moe_frac * spec.router_params if spec.moe else 0.0
        return (self._end_params(spec, first, last) + routers) / self.tp

    @property
    def edp_group(self) -> Group:
        """Expert data parallelism: the expert weights' gradient reduction and ZeRO group."""
        return Group(self.etp * self.ep, self.edp)

    # --- what one device holds and does -------------------------------------------------------

    def expert_slots(self, spec: TransformerSpec) -> np.ndarray:
        """Routed experts each EP rank holds per MoE layer: E / ep rounded up. With ep above the
        expert count every rank holds one and the extra ranks hold replicas of hot experts (as
        CloudMatrix384's decode runs EP 320 for 256 experts; Zuo et al. 2025, arXiv:2506.12708)."""
        if not spec.moe:
            return np.zeros_like(self.ep)
        return np.ceil(spec.moe.num_experts / self.ep)

    def expert_rows(self, tokens_per_tp_group, top_k: int) -> np.ndarray:
        """Token rows one device's expert GEMMs process, with balanced routing.

        A stage's tp x cp x dp devices hold (cp x dp) distinct shares of ``tokens_per_tp_group``
        tokens; their token-expert pairs spread over the ep x edp expert ranks, each of etp
        devices: rows per device = tokens x top_k x etp / tp. Each row then multiplies 1/etp of
        the expert, so per-device expert FLOPs are 2 x tokens x top_k x expert / tp, whatever ep
        is (EP shards expert weights, not expert work).
        """
        return np.asarray(tokens_per_tp_group, dtype=float) * top_k * self.etp / self.tp

    def params_per_device(self, spec: TransformerSpec, layers, first, last, mtp=1.0):
        """(dense, routed-expert) parameters one device of a pipeline stage of ``layers`` layers holds.

        Dense weights split by TP; each EP rank holds its expert slots, each split by etp. The
        first stage also holds the token embedding (and learned positions), the last the final
        norm and the LM head; with one stage a tied embedding counts once, with several the last stage keeps its
        own copy as the head (as Megatron-LM does). With ``mtp`` (1: held, 0: not), the last stage
        also holds the multi-token-prediction depths and, with several stages, its own copy of the
        embedding they read.
        """
        moe_frac = spec.moe_fraction
        norm = spec.hidden_size * (2 if spec.norm == "layernorm" else 1)
        per_layer_common = spec.attention_params + 2 * norm
        dense_layer = per_layer_common + (1 - moe_frac) * spec.dense_mlp_params + moe_frac * (
            spec.router_params + spec.shared_expert_params)
        table = spec.vocab_size * spec.hidden_size
        ends = self._end_params(spec, first, last)
        slots = self.expert_slots(spec)
        if spec.mtp_layers:
            held = np.asarray(mtp, dtype=float) * np.asarray(last, dtype=float)
            m = spec.mtp_layers * held
            ends = ends + m * spec.mtp_layer_params["dense"] + held * np.where(self.pp > 1, table, 0.0)
        # MLA's down-projections are whole on every TP rank (TransformerSpec.tp_replicated_params).
        dense = (layers * dense_layer + ends) / self.tp + layers * spec.tp_replicated_params * (1.0 - 1.0 / self.tp)
        expert = layers * moe_frac * slots * spec.expert_params / self.etp
        if spec.mtp_layers and spec.moe:
            expert = expert + m * slots * spec.expert_params / self.etp
        return dense, expert
