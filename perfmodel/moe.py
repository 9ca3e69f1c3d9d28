"""Time of one MoE layer on an expert-parallel group, given where its tokens land (place-experts).

Priced as ``plan`` prices an MoE layer: the busiest device's routed experts and their permutes are
``perfmodel.roofline.layer_ops``' "experts" and "expert permute" operators on the device's GEMM and
grouped-GEMM fits (every device waits for the slowest at the combine), and the dispatch and combine
are DeepEP's normal kernels (``Topology.placed_exchange``), with the tokens a placement sends inside
and across nodes in place of uniform routing's (DeepSeek-V3 Technical Report, Sec. 3.2.2).
"""

from __future__ import annotations

import numpy as np

from .layout import Layout
from .machine import Machine
from .model import TransformerSpec
from .roofline import layer_ops, ops_time

# The operators of an MoE layer a placement changes (layer_ops' names).
PLACED_OPS = ("experts", "expert permute")


def moe_layer_time(spec: TransformerSpec, machine: Machine, busiest_rows: float, mean_rows: float,
                   experts_on_busiest: int, nvlink_tokens: float, rdma_tokens: float, devices: int,
                   precision: str = "bf16") -> float:
    """Seconds of one MoE layer over ``devices`` expert-parallel devices (one expert shard each, no
    expert TP): its busiest device's ``busiest_rows`` token-expert rows (the mean device's
    ``mean_rows``) through the ``experts_on_busiest`` experts it holds, and the dispatch plus combine
    of the tokens each device sends inside its node (``nvlink_tokens``) and across nodes
    (``rdma_tokens``), per device, in 16 bits."""
    lay = Layout(tp=1.0, cp=1.0, dp=float(devices), pp=1.0, ep=float(devices), etp=1.0)
    k = spec.moe.top_k
    mean = max(float(mean_rows), 1e-9)
    width = 2.0 if precision in ("bf16", "fp16") else 1.0
    ops = [op for op in layer_ops(spec, mean / k, 1.0, lay, sp=False, weight_bytes=width, act_bytes=width,
                                  moe_layer=True, imbalance=float(busiest_rows) / mean,
                                  experts_read=float(experts_on_busiest)) if op.name in PLACED_OPS]
    compute = ops_time(ops, {"gemm": machine.flops(precision), "vector": np.inf}, machine.hbm_bytes_per_s,
                       machine.gemm_kernel(precision), with_backward=False,
                       grouped=machine.grouped_kernel(precision)).total
    token_bytes = spec.hidden_size * 2.0
    exchange = sum(machine.topology.placed_exchange(op, nvlink_tokens * token_bytes, rdma_tokens * token_bytes,
                                                    1, devices) for op in ("dispatch", "combine"))
    return float(compute + exchange)
