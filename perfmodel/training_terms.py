"""The named terms of a training estimate (perfmodel.training): the plan's columns, the workload, and one
frozen dataclass per term (shape, compute, communication, the step's tail, exposure, memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.hardware_db.schema import PRECISIONS

from .layout import Layout
from .plan import CP_COMMS, DISPATCHERS, OVERLAP, PLACES, RECOMPUTE, SCHEDULES, STORAGES
from .roofline import OpTimes
from .sharding import Sharding


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
    dispatcher: object = "alltoall"   # plan.Dispatcher: the MoE token dispatcher (node-deduplicating or not)
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
    activation_offload: object = 0.0  # share of saved activations swapped to host memory (activation_offload)

    def columns(self) -> dict[str, np.ndarray]:
        """Every field as a numpy array, names turned into codes (numeric columns pass through)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = np.asarray(getattr(self, name))
            codes = {"recompute": RECOMPUTE, "precision": PRECISIONS, "optimizer_place": PLACES,
                     "grad_place": PLACES, "param_place": PLACES, "overlap": OVERLAP,
                     "schedule": SCHEDULES, "storage": STORAGES, "cp_comm": CP_COMMS,
                     "dispatcher": DISPATCHERS}.get(name)
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
    zero3_reduce: np.ndarray       # ... and the gradient reduce-scatters of ZeRO-2 and 3, on the same replicas' link
    param_fetch: np.ndarray        # parameters streamed from their tier (ZeRO-Infinity)
    swap_out: object = 0.0         # activations to host memory in the forward, over the host path (activation_offload)
    swap_in: object = 0.0          # ... and back in the backward

    @property
    def swap(self):
        """Both directions of the activation swap (s)."""
        return self.swap_out + self.swap_in


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


SHARDING_FIELDS = ("shard", "shard_grads", "shard_weights", "hpz", "qwz", "qgz")
