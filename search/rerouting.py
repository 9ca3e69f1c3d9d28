"""Least-loaded rerouting (LLEP, ``perfmodel.llep``) over a static placement, compared with it:
the busiest device per layer, the predicted MoE time and the memory each way pays.

Standard EP is the contiguous placement (``placement`` method "round-robin": one copy per expert,
no replicas; LLEP's baseline). Each layer's statistics are taken as one batch's routing, so the
static placements are evaluated on the statistics they were fitted to (EPLB-style replicas then
see no drift between batches: their balance is the best case for static placement).

Memory per device, beyond the weights of the experts it owns (bytes, the peak over layers):

- standard EP and static replicas: the busiest device's token-expert rows x ``row_bytes``, plus,
  with replicas, the replica weights held for every layer (extra copies on the device x
  ``expert_weight_bytes``, all layers);
- LLEP: each device's rows x ``row_bytes`` plus the foreign experts' weights it receives for the
  layer being computed (freed after it: one layer's at a time).

Time per layer: the later of two devices, the busiest and the one receiving the most weights, each
``perfmodel.moe.moe_layer_time`` of its rows over the experts it computes (own and foreign) with the
static placement's exchange, plus its weight transfer (foreign experts x ``expert_weight_bytes``
over the slowest level the group spans), not overlapped. Weights and rows in 16 bits, as
``placement.layer_time`` prices every method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.llep import LlepRule, Rerouted, expert_weight_bytes, reroute_least_loaded, row_bytes

from .placement import Placement, PlacementProblem


@dataclass(frozen=True, eq=False)
class Rerouting:
    """LLEP over a static one-copy placement, layer by layer (the statistics as one batch each)."""

    rule: LlepRule
    layers: tuple[Rerouted, ...]
    static_max_load: np.ndarray       # per layer, the static placement's busiest device, tokens

    @property
    def max_load(self) -> np.ndarray:
        return np.array([r.device_load.max() for r in self.layers])

    @property
    def mean_load(self) -> np.ndarray:
        return np.array([r.device_load.mean() for r in self.layers])

    @property
    def imbalance(self) -> float:
        return float(np.mean(self.max_load / np.maximum(self.mean_load, 1e-12)))

    @property
    def layers_rerouted(self) -> int:
        return sum(r.rerouted for r in self.layers)

    @property
    def moved_tokens(self) -> float:
        return float(sum(r.moved_tokens for r in self.layers))

    @property
    def foreign_max(self) -> int:
        """The most foreign experts one device receives in one layer."""
        return int(max(int(r.foreign.max()) for r in self.layers))


def reroute(problem: PlacementProblem, static: Placement, rule: LlepRule) -> Rerouting:
    """LLEP on every layer of ``static`` (one copy per expert: its homes)."""
    loads = np.asarray(problem.stats.loads, dtype=float)
    layers = []
    for l, p in enumerate(static.layers):
        home = np.empty(problem.stats.experts, dtype=int)
        home[p.expert] = p.device
        layers.append(reroute_least_loaded(loads[l], home, problem.devices, rule))
    return Rerouting(rule, tuple(layers), static.max_load)


def _transfer_bytes_per_s(machine, devices: int) -> float:
    """What one device receives per second across the slowest level ``devices`` span."""
    topo = machine.topology
    level = int(np.searchsorted(np.asarray(topo.sizes), devices)) if devices > 1 else 0
    return float(np.asarray(topo.bw)[min(level, len(topo.bw) - 1)])


def rerouted_time(spec, machine, static: Placement, rerouting: Rerouting, devices: int) -> float:
    """Predicted seconds of all MoE layers under LLEP (module docstring)."""
    from perfmodel.moe import moe_layer_time

    serving = machine.for_serving()
    gaps = max(len(static.layers) - 1, 1)
    across = (static.cross_node_tokens or 0.0) / gaps / max(devices, 1)
    inside = max((static.cross_device_tokens or 0.0) / gaps / max(devices, 1) - across, 0.0)
    weight = expert_weight_bytes(spec)
    link = _transfer_bytes_per_s(machine, devices)
    total = 0.0
    for p, r in zip(static.layers, rerouting.layers):
        def finish(d: int) -> float:
            experts_there = int(np.count_nonzero(p.device == d)) + int(r.foreign[d])
            return (moe_layer_time(spec, serving, float(r.device_load[d]), float(np.mean(r.device_load)),
                                   experts_there, inside, across, devices) + float(r.foreign[d]) * weight / link)

        # The layer ends with its slowest device: the busiest one or the one receiving the most weights.
        total += max(finish(int(np.argmax(r.device_load))), finish(int(np.argmax(r.foreign))))
    return total


@dataclass(frozen=True)
class ExpertMemory:
    """Peak memory per device beyond its own experts' weights, bytes (module docstring)."""

    standard_ep: float                # contiguous experts: the busiest device's rows
    replicas: float                   # the static placement with replicas: its busiest rows + replica weights
    least_loaded: float               # LLEP: rows + one layer's foreign weights, the worst device and layer

    def as_dict(self) -> dict[str, float]:
        return {"standard_ep_bytes": self.standard_ep, "replicas_bytes": self.replicas,
                "least_loaded_bytes": self.least_loaded}


def expert_memory(spec, problem: PlacementProblem, standard: Placement, replicated: Placement,
                  rerouting: Rerouting) -> ExpertMemory:
    """The three placements' peak memory per device (module docstring)."""
    row, weight = row_bytes(spec), expert_weight_bytes(spec)
    homes = -(-problem.stats.experts // problem.devices)
    extra = sum(max(int(np.bincount(p.device, minlength=problem.devices).max()) - homes, 0)
                for p in replicated.layers)
    llep = max(float(np.max(r.device_load * row + r.foreign * weight)) for r in rerouting.layers)
    return ExpertMemory(standard_ep=float(standard.max_load.max()) * row,
                        replicas=float(replicated.max_load.max()) * row + extra * weight, least_loaded=llep)
