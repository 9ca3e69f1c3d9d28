"""The collectives of one transformer pass that training and serving share, over a layout's groups.

- Tensor parallelism all-reduces each layer's activation twice a pass, after the attention block and
  after the MLP (Shoeybi et al., "Megatron-LM", 2019, Sec. 3; with sequence parallelism the pair
  becomes a reduce-scatter and an all-gather of the same bytes, Korthikanti et al. 2022, Sec. 4).
- Pipeline stages hand each microbatch's activation to the next stage, each tensor-parallel rank
  sending its 1/t share (the scatter-gather of Narayanan et al. 2021, Sec. 4.1).
The operators of a pass are perfmodel.roofline.layer_ops; the expert exchange differs by framework
(training: Megatron-Core's dispatcher over NCCL; serving: DeepEP's kernels) and stays with each.
"""

from __future__ import annotations

from .layout import Layout


def tp_all_reduces_s(topology, layout: Layout, layers, activation_bytes, per_layer):
    """Seconds of ``layers`` layers' tensor-parallel all-reduces of ``activation_bytes`` (one
    layer's activation on one TP group), ``per_layer`` of them a layer (2 a forward pass)."""
    return layers * per_layer * topology.all_reduce(activation_bytes, layout.tp_group.stride, layout.tp_group.size)


def stage_handoff_s(topology, layout: Layout, activation_bytes):
    """Seconds to hand one microbatch's activation (``activation_bytes`` on one TP group) to the
    next pipeline stage, each TP rank sending 1/t; 0 without pipeline stages."""
    return topology.p2p(activation_bytes / layout.tp, layout.pp_neighbour_stride) * (layout.pp > 1)
