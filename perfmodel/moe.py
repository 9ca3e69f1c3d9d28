"""Time of one MoE layer on an expert-parallel group, given where the tokens land.

The busiest device sets the pace (every device waits for the slowest at the combine): its expert
GEMMs run as a roofline (2 FLOP per weight per token routed to it; its experts' weights read once),
and the tokens that change node cross the slowest level the group spans, twice (dispatch and
combine), spread over the group's devices (DeepSeek-V3 Technical Report, Sec. 3.2.2).
"""

from __future__ import annotations

import numpy as np

from .machine import Machine
from .model import TransformerSpec
from .roofline import roofline


def moe_layer_time(spec: TransformerSpec, machine: Machine, busiest_tokens, experts_on_busiest,
                   cross_node_tokens, devices: int, precision: str = "bf16", bytes_per_weight: float = 2.0):
    """Seconds for one MoE layer: the busiest device's expert GEMMs plus the cross-node traffic."""
    flops = 2.0 * np.asarray(busiest_tokens, dtype=float) * spec.expert_params
    weights = np.asarray(experts_on_busiest, dtype=float) * spec.expert_params * bytes_per_weight
    activations = np.asarray(busiest_tokens, dtype=float) * spec.hidden_size * 2.0 * 2.0
    compute, _ = roofline(flops, weights + activations, machine.flops(precision), machine.hbm_bytes_per_s)
    slow_bw = machine.topology.bw[machine.topology.level_of(1, devices)]
    traffic = 2.0 * np.asarray(cross_node_tokens, dtype=float) * spec.hidden_size * 2.0 / max(devices, 1) / slow_bw
    return compute + traffic
