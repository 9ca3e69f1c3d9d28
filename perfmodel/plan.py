"""Value objects for the choices a plan makes: recompute, where a state lives, and quantization.

Plans are columns of numbers (so a million of them evaluate in one call); these enums give the
numbers their names, and ``QuantScheme`` owns the one rule that pairs weight, activation and KV
formats with the rate their GEMMs run at.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from perfmodel.hardware_db.errors import SpecError, UnknownNameError


class Recompute(IntEnum):
    """Activation recomputation (Korthikanti et al. 2022, Sec. 5): nothing, the attention core, or
    every layer from its input; or MODULES, the attention core with the norms, MLA's
    up-projections and the MoE activation (DeepSeek-V3 report Sec. 3.2.3 and 3.3.2; Megatron-Core's
    selective --recompute-modules core_attn layernorm mla_up_proj moe_act)."""

    NONE = 0
    SELECTIVE = 1
    FULL = 2
    MODULES = 3


class Place(IntEnum):
    """Where an offloadable state (optimizer states, gradients, parameters, KV cache) lives."""

    HBM = 0
    DDR = 1
    CXL = 2
    POOLED = 3
    NVME = 4
    DDR_CXL = 5    # interleaved over host DDR and CXL memory, each one's share in proportion to its bandwidth


class Overlap(IntEnum):
    """How communication hides under compute: not at all (every transfer on the critical path), as
    the frameworks schedule it (each transfer under the compute window it can use, transfers
    sharing a window queue on it), or ideally (every transfer under the whole step's compute)."""

    NONE = 0
    FRAMEWORK = 1
    IDEAL = 2


class Schedule(IntEnum):
    """The pipeline schedule: one-forward-one-backward (Narayanan et al. 2021, Sec. 2.2; interleaved
    when the plan has virtual stages), or DeepSeek's bidirectional DualPipe (DeepSeek-V3 report,
    Sec. 3.2.1 and Table 2), whose bubble shrinks to (PP/2 - 1)(F&B + B - 3W) chunks at the price
    of two copies of the parameters and PP + 1 microbatches of activations in flight."""

    ONE_F_ONE_B = 0
    DUALPIPE = 1


class Storage(IntEnum):
    """The formats model states and cached activations are stored in. MIXED: mixed-precision Adam,
    2 + 2 + 12 bytes per parameter (16-bit weights and gradients; fp32 master weights, momentum
    and variance; Rajbhandari et al. 2020, Sec. 3.1), activations as the GEMMs keep them.
    DEEPSEEK: DeepSeek-V3's low-precision storage (DeepSeek-V3 report, Sec. 3.3.3): BF16 Adam
    moments with fp32 master weights and fp32 gradients for accumulation (2 + 4 + 8 bytes), one
    E5M6 copy of the attention output (it feeds both the attention's backward and the output
    projection), and the MoE SwiGLU inputs cached in FP8 with its output recomputed; with fp8 GEMMs.
    The gradient reduction is priced in bf16 under both (the report does not give its format)."""

    MIXED = 0
    DEEPSEEK = 1


RECOMPUTE = tuple(r.name.lower() for r in Recompute)
SCHEDULES = ("1f1b", "dualpipe")


class CpComm(IntEnum):
    """How context parallelism moves K and V (Megatron-Core's cp_comm_type; Megatron-Bridge
    performance guide, 'Context-parallel (CP) communication'). P2P: K and V chunks pass around a
    ring of cp ranks under the attention of the previous chunk (Liu et al. 2023, Ring Attention),
    one attention kernel per step. ALL_GATHER: K and V all-gathered before one attention over the
    local queries, exposed (Llama 3, Dubey et al. 2024, Sec. 3.3.2, its 128K runs: small with GQA's
    few KV heads); their gradients reduce-scattered in the backward. A2A: DeepSpeed-Ulysses
    (Jacobs et al. 2023): all-to-alls before and after attention trade the sequence split for a
    head split, exposed; the KV heads of a TP rank must divide by cp."""

    P2P = 0
    ALL_GATHER = 1
    A2A = 2


CP_COMMS = tuple(c.name.lower() for c in CpComm)


class Dispatcher(IntEnum):
    """How the MoE layer sends tokens to their experts' ranks and back (Megatron-Core core_v0.19.0
    moe_token_dispatcher_type, moe_flex_dispatcher_backend). ALLTOALL: NCCL all-to-alls of every
    token-expert copy (MoEAlltoAllTokenDispatcher). DEEPEP: DeepSeek's DeepEP normal kernels, which
    send a token across the network once per node holding one of its experts and forward it inside
    the node over NVLink (DeepSeek-V3 report, Sec. 3.2.2; the flex dispatcher's deepep backend).
    HYBRIDEP: NVIDIA's HybridEP, the flex dispatcher's backend with the same node deduplication, and
    the one that spans a multi-node NVLink domain (transformer_config.py: 'Currently only
    "hybridep" backend supports the MNNVL case'). Both flex backends are CUDA libraries. HybridEP is
    priced as DeepEP's normal kernels: no HybridEP kernel timings are in the calibration data."""

    ALLTOALL = 0
    DEEPEP = 1
    HYBRIDEP = 2


DISPATCHERS = tuple(d.name.lower() for d in Dispatcher)
STORAGES = tuple(s.name.lower() for s in Storage)
OVERLAP = tuple(o.name.lower() for o in Overlap)
PLACES = tuple(p.name.lower().replace("_", "+") for p in Place)
TIERS = ("ddr", "cxl", "pooled", "nvme")          # the memory kinds below HBM a place may use
INTERLEAVED = {"ddr+cxl": ("ddr", "cxl")}         # a place split over several kinds

WEIGHT_PRECISIONS = ("bf16", "fp8", "int8", "int4", "fp4")
KV_PRECISIONS = ("bf16", "fp8", "int4")
# Activation (GEMM input) precision: "a16" keeps bf16 math; "a8" and "a4" run at the weight's rate.
ACTIVATION_PRECISIONS = ("a16", "a8", "a4")
# How a serving plan balances expert load (perfmodel.eplb): DeepSeek's EPLB with redundant experts, experts
# in contiguous blocks without replicas, or every device equal.
EXPERT_BALANCES = ("eplb", "none", "balanced")
ATTENTION = ("flash", "standard")   # fused causal FlashAttention, or the 2021 kernels writing the s x s scores
# The weight formats each activation width pairs with, and the rate the GEMM runs at: W8A8 (fp8 or
# int8), W4A4 (int4 or fp4), and W4A8, 4-bit weights widened to 8 bits inside an 8-bit GEMM
# (QServe's and COMET's W4A8 kernels on int8 tensor cores: Lin et al., arXiv:2405.04532; Liu et al.,
# arXiv:2410.12168; TensorRT-LLM's W4A8 with fp8 activations), priced as the 8-bit kernel reading
# 4-bit weights.
_GEMM_RATE = {("a8", "fp8"): "fp8", ("a8", "int8"): "int8", ("a4", "int4"): "int4", ("a4", "fp4"): "fp4",
              ("a8", "int4"): "int8", ("a8", "fp4"): "fp8"}
_ACTIVATION_BYTES = {"a16": 2.0, "a8": 1.0, "a4": 0.5}


@dataclass(frozen=True)
class QuantScheme:
    """Weight, activation and KV-cache formats of a serving instance, and what follows from them.

    W16A16 and weight-only formats (W8A16, W4A16) run bf16 GEMMs with the weights dequantized in
    the kernel; W8A8 and W4A4 run at the integer or fp8/fp4 rate the device lists (never derived),
    W4A8 at the 8-bit rate with 4-bit weights.
    """

    weight: str = "bf16"
    activation: str = "a16"
    kv: str = "bf16"
    # The 16-bit format the device computes in: fp16 where it has no bf16 (Volta), as frameworks
    # run a bf16 checkpoint there (vLLM casts it to float16 below compute capability 8.0).
    math16: str = "bf16"

    def __post_init__(self):
        for value, allowed, what in ((self.weight, WEIGHT_PRECISIONS, "weight"),
                                     (self.activation, ACTIVATION_PRECISIONS, "activation"),
                                     (self.kv, KV_PRECISIONS, "KV-cache")):
            if value not in allowed:
                raise UnknownNameError(f"{what} precision", value, allowed)
        if self.activation != "a16" and (self.activation, self.weight) not in _GEMM_RATE:
            raise SpecError(f"activation precision {self.activation} needs weights it pairs with "
                            f"(W8A8: fp8 or int8; W4A8: int4 or fp4; W4A4: int4 or fp4), has {self.weight}")

    @classmethod
    def for_weights(cls, weight: str, kv: str = "bf16", quantized_activations: bool = True) -> "QuantScheme":
        """The scheme a deployment of ``weight`` weights runs: W8A8 / W4A4 when it quantizes its
        activations to the weights' width, else weight-only (bf16 math)."""
        act = {"fp8": "a8", "int8": "a8", "int4": "a4", "fp4": "a4"}.get(weight, "a16")
        return cls(weight, act if quantized_activations else "a16", kv)

    @property
    def gemm_precision(self) -> str:
        """The precision the weight GEMMs run at."""
        return _GEMM_RATE.get((self.activation, self.weight), self.math16)

    @property
    def weight_bytes(self) -> float:
        from perfmodel.hardware_db.schema import BYTES_PER_ELEMENT  # pydantic: not at start-up

        return BYTES_PER_ELEMENT[self.weight]

    @property
    def activation_bytes(self) -> float:
        return _ACTIVATION_BYTES[self.activation]

    @property
    def kv_bytes(self) -> float:
        from perfmodel.hardware_db.schema import BYTES_PER_ELEMENT

        return BYTES_PER_ELEMENT[self.kv]

    def attention_precision(self, supports) -> str:
        """Attention (QK^T, PV) runs in bf16, or fp8 over an fp8 KV cache where the device has fp8."""
        return "fp8" if self.kv == "fp8" and supports("fp8") else self.math16

    def runs_on(self, supports) -> bool:
        """Whether a device (``supports(precision) -> bool``) lists every rate this scheme needs."""
        return supports(self.gemm_precision) and (self.kv != "fp8" or supports("fp8"))

    def label(self) -> str:
        return f"W:{self.weight} A:{self.activation} KV:{self.kv}"
