"""Transformer specs (dense and MoE; MHA, GQA, MQA and MLA attention) and what follows from them.

Parameter counts are exact sums over the weight matrices, vectors and embeddings a checkpoint
holds, so they can be checked against a publisher's figure. FLOP counts follow the convention of
Kaplan et al. 2020 (Table 1: 2 FLOP per multiply-accumulate of every weight) and Chowdhery et al.
2022 (PaLM, Appendix B: attention scores add 2 x 2 x layers x context x attention width per token),
training = 3 x forward (Narayanan et al. 2021, Section 5.1).
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfmodel.hardware_db.schema import BYTES_PER_ELEMENT

Positive = Annotated[int, Field(ge=1, le=10_000_000)]
NonNegative = Annotated[int, Field(ge=0, le=10_000_000)]


class _Frozen(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)


class MlaSpec(_Frozen):
    """DeepSeek's multi-head latent attention ranks (DeepSeek-V2 paper, Section 2.1)."""

    q_lora_rank: NonNegative = 0  # 0: queries projected directly (no low-rank q)
    kv_lora_rank: Positive
    qk_nope_head_dim: Positive
    qk_rope_head_dim: Positive
    v_head_dim: Positive


class MoeSpec(_Frozen):
    """Routed experts of an MoE MLP (Shazeer et al. 2017; DeepSeekMoE's shared experts)."""

    num_experts: Positive
    top_k: Positive
    num_shared_experts: NonNegative = 0
    expert_ffn_hidden_size: Positive
    first_dense_layers: NonNegative = 0
    router_bias: bool = False
    expert_bias: bool = False

    @model_validator(mode="after")
    def _top_k_fits(self):
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k needs at most num_experts = {self.num_experts}, has {self.top_k}")
        return self


class Published(_Frozen):
    """The publisher's own parameter counts, and how closely a spec must reproduce them.

    ``tolerance`` is 1% unless the figure is rounded more coarsely than that (e.g. "37B"); a wider
    tolerance says why in ``note``.
    """

    total_params: Annotated[float, Field(ge=1, le=1e15)]     # a count: a parameter at least
    active_params: Annotated[float, Field(ge=1, le=1e15)]
    source: str
    tolerance: Annotated[float, Field(gt=0, le=0.1)] = 0.01
    note: str = ""
    # Publishers differ on whether the input-embedding lookup counts as "active" (gpt-oss: not).
    active_counts_input_embedding: bool = True


class TransformerSpec(_Frozen):
    """A decoder-only transformer, as its config.json or paper describes it."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.\-_]*$", max_length=80)]
    display_name: str = ""
    aliases: tuple[str, ...] = ()
    family: str = "custom"
    hidden_size: Positive
    num_layers: Annotated[int, Field(ge=1, le=10_000)]
    num_heads: Positive
    num_kv_heads: Positive | None = None
    head_dim: Positive | None = None
    ffn_hidden_size: Positive
    mlp: Literal["gated", "plain"] = "gated"
    vocab_size: Positive
    tied_embeddings: bool = False
    position_embedding: Literal["rope", "learned"] = "rope"
    max_seq_len: Positive = 4096
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    linear_bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: Positive | None = None
    sliding_window_every: Positive | None = None
    attention_sinks: bool = False
    dropout: bool = False             # GPT-2/3 and Megatron's GPTs train with dropout; Llama and later do not
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    mtp_layers: NonNegative = 0
    # The weights' format as published (config.json's quantization_config, else torch_dtype): what
    # serving uses by default; lower formats are quantization whose accuracy a user must check.
    native_precision: Literal["bf16", "fp16", "fp8", "int8", "fp4"] = "bf16"
    published: Published | None = None
    sources: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self):
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ValueError(f"num_kv_heads needs to divide num_heads = {self.num_heads}, has {kv}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                             f"{self.num_heads}; give head_dim")
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(f"moe.first_dense_layers needs at most num_layers = {self.num_layers}")
        if (self.sliding_window is None) != (self.sliding_window_every is None):
            raise ValueError("sliding_window and sliding_window_every go together")
        return self

    # --- shape -------------------------------------------------------------------------------

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def attention_kind(self) -> str:
        """``mla``, ``mha`` (one KV head per query head), ``mqa`` (one KV head) or ``gqa``."""
        if self.mla:
            return "mla"
        return "mha" if self.kv_heads == self.num_heads else "mqa" if self.kv_heads == 1 else "gqa"

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.moe.first_dense_layers if self.moe else 0

    @property
    def moe_fraction(self) -> float:
        """Share of the layers with routed experts (0 for a dense model)."""
        return self.moe_layers / self.num_layers if self.moe else 0.0

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def window_layers(self) -> int:
        """Layers with sliding-window attention (every ``sliding_window_every``-th layer)."""
        return self.num_layers // self.sliding_window_every if self.sliding_window_every else 0

    # --- parameters --------------------------------------------------------------------------

    @property
    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @cached_property
    def tp_replicated_params(self) -> int:
        """Weights of one attention block every tensor-parallel rank holds and runs whole: MLA's
        down-projections of q and of the KV latent with its RoPE key (Megatron-Core's MLA spec
        builds linear_q_down_proj and linear_kv_down_proj as duplicated TELinear; SGLang's
        fused_qkv_a_proj_with_mqa is a ReplicatedLinear, as TensorRT-LLM's and vLLM's are) and
        their norms; 0 without MLA."""
        if not self.mla:
            return 0
        m = self.mla
        down = (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        return self.hidden_size * down + (m.q_lora_rank or 0) + m.kv_lora_rank

    @cached_property
    def attention_params(self) -> int:
        """Weights of one attention block (projections, biases, q/k norms, sinks)."""
        h, nh = self.hidden_size, self.num_heads
        if self.mla:
            m = self.mla
            qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * nh * qk_dim) if m.q_lora_rank \
                else h * nh * qk_dim
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
                + m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + nh * m.v_head_dim * h
        q_width, kv_width = nh * self.dim_head, self.kv_heads * self.dim_head
        weights = h * q_width + 2 * h * kv_width + q_width * h
        biases = (q_width + 2 * kv_width) * (self.linear_bias or self.qkv_bias) + h * self.linear_bias
        return weights + biases + 2 * self.dim_head * self.qk_norm + nh * self.attention_sinks

    def _mlp_params(self, ffn: int, bias: bool) -> int:
        h = self.hidden_size
        matrices = 3 if self.mlp == "gated" else 2
        biases = ((matrices - 1) * ffn + h) if bias else 0
        return matrices * h * ffn + biases

    @cached_property
    def dense_mlp_params(self) -> int:
        return self._mlp_params(self.ffn_hidden_size, self.linear_bias)

    @cached_property
    def expert_params(self) -> int:
        """Weights of one routed expert."""
        return self._mlp_params(self.moe.expert_ffn_hidden_size, self.moe.expert_bias) if self.moe else 0

    @cached_property
    def router_params(self) -> int:
        return (self.hidden_size + self.moe.router_bias) * self.moe.num_experts if self.moe else 0

    @cached_property
    def shared_expert_params(self) -> int:
        return self.moe.num_shared_experts * self.expert_params if self.moe else 0

    @cached_property
    def embedding_params(self) -> int:
        """Token embedding, untied LM head and learned positions."""
        emb = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return emb + self.max_seq_len * self.hidden_size * (self.position_embedding == "learned")

    @cached_property
    def _layer_common(self) -> int:
        return self.attention_params + 2 * self._norm_params

    @cached_property
    def total_params(self) -> int:
        """Every parameter of the checkpoint (multi-token-prediction modules excluded)."""
        moe = self.moe_layers * (self.moe.num_experts * self.expert_params + self.router_params
                                 + self.shared_expert_params) if self.moe else 0
        return (self.num_layers * self._layer_common + self.dense_layers * self.dense_mlp_params + moe
                + self.embedding_params + self._norm_params)

    @cached_property
    def mtp_layer_params(self) -> dict[str, int]:
        """One multi-token-prediction depth (DeepSeek-V3 Technical Report, Sec. 2.2): the projection
        of [norm(h); norm(embedding)] (2h x h), its two norms, one transformer block (an MoE block
        in an MoE model) and the shared head's norm; embedding and output head are the main
        model's (DeepSeek's "14B of MTP weights" also counts the checkpoint's copies of those two,
        2 x 0.93B). Split into the dense part and the routed experts."""
        if not self.mtp_layers:
            return {"dense": 0, "experts": 0}
        h, norm = self.hidden_size, self._norm_params
        mlp = self.router_params + self.shared_expert_params if self.moe else self.dense_mlp_params
        return {"dense": 2 * h * h + 3 * norm + self._layer_common + mlp,
                "experts": self.moe.num_experts * self.expert_params if self.moe else 0}

    @property
    def mtp_params(self) -> int:
        """Parameters of every multi-token-prediction depth (not in ``total_params``)."""
        return self.mtp_layers * sum(self.mtp_layer_params.values())

    @cached_property
    def active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to."""
        if not self.moe:
            return self.total_params
        idle = self.moe_layers * (self.moe.num_experts - self.moe.top_k) * self.expert_params
        return self.total_params - idle

    @property
    def input_embedding_params(self) -> int:
        """The token-embedding table when it is not also the LM head (a lookup, not a GEMM)."""
        return self.vocab_size * self.hidden_size * (not self.tied_embeddings)

    @cached_property
    def expert_weight_params(self) -> int:
        """Parameters of all routed experts (the part expert parallelism shards)."""
        return self.moe_layers * self.moe.num_experts * self.expert_params if self.moe else 0

    # --- FLOPs -------------------------------------------------------------------------------

    @property
    def matmul_params_per_token(self) -> int:
        """Weights one token multiplies: active parameters less the input-embedding lookup.

        The LM head is a GEMM and counts (a tied embedding counts once, as the head); learned
        positions are a lookup and do not; nor do the norm weights (two per layer and the final
        one: an elementwise scale, not a multiply-accumulate). Biases count as weights (< 0.1%).
        So this is exactly the weights of the GEMMs the cost model times.
        """
        lookup = self.input_embedding_params \
            + self.max_seq_len * self.hidden_size * (self.position_embedding == "learned")
        norms = (2 * self.num_layers + 1) * self._norm_params
        return self.active_params - lookup - norms

    @property
    def attention_width(self) -> float:
        """Mean of the query-key and value widths summed over heads (scores and context GEMMs)."""
        if self.mla:
            m = self.mla
            return self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2
        return self.num_heads * self.dim_head

    def attended_context(self, seq_len: float, causal: bool = False) -> float:
        """Mean keys a query attends to, summed over layers, divided by layers.

        ``causal=False`` is the PaLM/Megatron accounting (every query sees the whole sequence);
        ``causal=True`` counts the work a causal kernel does (about half). Sliding-window layers
        see at most their window.
        """
        full = seq_len / 2 if causal else seq_len
        if not self.sliding_window:
            return full
        windowed = min(full, self.sliding_window)
        return (full * (self.num_layers - self.window_layers) + windowed * self.window_layers) / self.num_layers

    def forward_flops_per_token(self, seq_len: float, causal: bool = False, mtp: bool = False) -> float:
        """Forward FLOP per token: 2 per weight multiply plus 4 x layers x context x width (PaLM App. B).

        ``mtp`` adds the multi-token-prediction depths trained beside the model (DeepSeek-V3
        Sec. 2.2): each its projection, one block with the tokens' active experts, attention over
        the whole sequence, and the shared output head.
        """
        main = 2.0 * self.matmul_params_per_token \
            + 4.0 * self.num_layers * self.attended_context(seq_len, causal) * self.attention_width
        if not (mtp and self.mtp_layers):
            return main
        h = self.hidden_size
        mlp = self.router_params + self.shared_expert_params + self.moe.top_k * self.expert_params if self.moe \
            else self.dense_mlp_params
        weights = 2 * h * h + self.attention_params + mlp + self.vocab_size * h
        context = seq_len / 2 if causal else seq_len
        return main + self.mtp_layers * (2.0 * weights + 4.0 * context * self.attention_width)

    def training_flops_per_token(self, seq_len: float, causal: bool = False, mtp: bool = False) -> float:
        """Forward + backward = 3 x forward (backward costs twice the forward; Narayanan et al. 2021)."""
        return 3.0 * self.forward_flops_per_token(seq_len, causal, mtp)

    # --- KV cache ----------------------------------------------------------------------------

    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements per token per layer: K and V heads, or MLA's latent plus rope key."""
        if self.mla:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.kv_heads * self.dim_head

    def kv_bytes_per_token(self, precision: str = "bf16") -> float:
        """KV-cache bytes per token over all layers (sliding-window layers counted in full)."""
        return self.num_layers * self.kv_elements_per_token_per_layer() * BYTES_PER_ELEMENT[precision]

    def kv_cache_bytes(self, context_len, precision: str = "bf16"):
        """KV-cache bytes of one sequence of ``context_len`` tokens (a number or an array); windowed
        layers keep their window."""
        per_layer = self.kv_elements_per_token_per_layer() * BYTES_PER_ELEMENT[precision]
        full_layers = self.num_layers - self.window_layers
        windowed = np.minimum(context_len, self.sliding_window) if self.sliding_window else 0
        return per_layer * (full_layers * context_len + self.window_layers * windowed)


KV_PRECISIONS = ("bf16", "fp8", "int4")


def model_summary(spec: TransformerSpec, seq_len: float) -> dict:
    """The spec and its derived quantities (parameters, FLOPs per token, KV cache), as plain data."""
    derived: dict = {
        "attention": spec.attention_kind,
        "total_params": float(spec.total_params),
        "active_params": float(spec.active_params),
        "seq_len": float(seq_len),
        # Both attention counts: every key (PaLM App. B, how papers report MFU) and the causal
        # half a causal kernel computes (what perfmodel times and its MFU counts).
        "forward_flops_per_token": {"all keys": spec.forward_flops_per_token(seq_len),
                                    "causal": spec.forward_flops_per_token(seq_len, causal=True)},
        "training_flops_per_token": {"all keys": spec.training_flops_per_token(seq_len),
                                     "causal": spec.training_flops_per_token(seq_len, causal=True)},
        "kv_bytes_per_token": {p: spec.kv_bytes_per_token(p) for p in KV_PRECISIONS},
        "kv_bytes_per_sequence_at_seq_len": {p: spec.kv_cache_bytes(seq_len, p) for p in KV_PRECISIONS},
    }
    if spec.mtp_layers:
        derived["mtp_params"] = float(spec.mtp_params)
        derived["training_flops_per_token"]["causal, with mtp"] = spec.training_flops_per_token(seq_len, True, True)
    if spec.moe:
        derived["expert_params"] = float(spec.expert_weight_params)
        derived["moe_layers"] = spec.moe_layers
    if spec.published:
        derived["published_total_params"] = spec.published.total_params
        derived["published_active_params"] = spec.published.active_params
        derived["total_params_error"] = spec.total_params / spec.published.total_params - 1
        active = spec.active_params - spec.input_embedding_params * (not spec.published.active_counts_input_embedding)
        derived["active_params_error"] = active / spec.published.active_params - 1
    return {"name": spec.name, "display_name": spec.display_name or spec.name,
            "spec": spec.model_dump(mode="json"), "derived": derived}
