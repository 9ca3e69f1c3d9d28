"""Activation offload to host memory: what a layer swaps out, what stays in HBM, and what the swap exposes.

A plan's ``activation_offload`` (share s in [0, 1], 0: off) swaps saved activations to the host's DDR
after each layer's forward and fetches them back before its backward, over the device's host path,
under the compute of the neighbouring layers (Zhao et al., "MEMO: Fine-grained Tensor Management For
Ultra-long Context LLM Training", arXiv:2407.12117, SIGMOD 2025, abstract: "we offload
memory-consuming activations to CPU memory after each layer's forward pass and fetch them during the
backward pass ... a token-wise activation recomputation and swapping mechanism").

- Recompute none, selective or modules: a share s of each layer's saved activations is swapped.
- Recompute full (MEMO's token-wise recomputation and swapping, as perfmodel reads it): every layer's
  input, the recomputation's checkpoint, is swapped, and a share s of the tokens also swaps its whole
  activations (what recompute none keeps) and is not recomputed; the other tokens are recomputed from
  their input. The paper's own split of skeletal and transient tensors is not in the stored sources.

HBM keeps the rest plus two layers' swapped bytes of one microbatch as staging buffers (the layer whose
copy is in flight and the one computing, or being fetched ahead in the backward). All functions
broadcast over plan columns and return bytes or seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerSwap:
    """One layer's activations of one microbatch on one device (bytes), by where they live."""

    hbm: np.ndarray        # kept in HBM (the staging buffers not included)
    host: np.ndarray       # swapped to host memory

    @property
    def total(self) -> np.ndarray:
        """The activations the plan saves for the layer (conservation: hbm + host)."""
        return self.hbm + self.host


def layer_swap(kept, whole, share, full) -> LayerSwap:
    """Where one layer's activations live. ``kept``: what the plan's recompute saves per layer and
    microbatch (bytes); ``whole``: what recompute none saves; ``share``: the plan's activation offload
    (0 to 1); ``full``: whether the plan recomputes whole layers (then the swapped tokens keep
    ``whole`` and every token's input, ``kept``, is swapped; see the module)."""
    share = np.asarray(share, dtype=float)
    token_wise = np.asarray(full, dtype=bool) & (share > 0)
    host = np.where(token_wise, share * whole + (1.0 - share) * kept, share * kept)
    return LayerSwap(np.where(token_wise, 0.0, (1.0 - share) * kept), host)


def swap_buffers(host_per_layer, layers_in_flight) -> np.ndarray:
    """HBM staging of the swap (bytes): two layers' swapped bytes of one microbatch, never more than
    the stage swaps in all (``layers_in_flight`` layer-microbatches)."""
    host_per_layer = np.asarray(host_per_layer, dtype=float)
    return np.minimum(2.0 * host_per_layer, host_per_layer * np.asarray(layers_in_flight, dtype=float))


def recompute_kept(share, full) -> np.ndarray:
    """Share of the full recomputation that still runs: the tokens not swapped (1 - s) under full
    recomputation, all of it otherwise (the swap does not change what other modes recompute)."""
    return 1.0 - np.asarray(share, dtype=float) * np.asarray(full, dtype=bool)


def swap_seconds(host_bytes, bytes_per_s) -> np.ndarray:
    """Time of a swap on the host path (s): never faster than its bytes over the link's bandwidth."""
    return np.asarray(host_bytes, dtype=float) / np.asarray(bytes_per_s, dtype=float)


def layer_lag(phase_s, layers, swapped) -> np.ndarray:
    """The part of a phase (forward or backward of one microbatch, s) no swap can hide under: one
    layer's share, since each layer's copy runs under the next layer's compute (the forward's first
    layer has nothing to send yet; the backward waits for its first layer's fetch). 0 without a swap."""
    return np.where(np.asarray(swapped) > 0, np.asarray(phase_s) / np.maximum(np.asarray(layers, dtype=float), 1.0),
                    0.0)
