"""MoE expert placement: which device holds each expert of each layer, with replicas of hot experts.

Per layer, in order (the previous layer fixed, so its placement prices the next layer's
affinity, as in ExFlow's integer program, solved here layer by layer: the decomposition is stated
in every result):

1. Replicas: the replica budget goes, one copy at a time, to the expert with the largest tokens per
   copy (water-filling; optimal for the largest per-copy load, and DeepSeek's EPLB rule). Tokens of
   a replicated expert split evenly among its copies.
2. Nodes (CP-SAT): integer copies of each expert in each node (a group of devices inside the fast
   level) under the node's slots, minimizing w_load x (largest node load / devices per node) +
   w_cross x (tokens arriving from another node, per device), the arrivals priced by the previous
   layer's placement and the inter-layer transition counts.
3. Devices: inside a node the devices are alike; copies go to devices longest-first (LPT, Graham
   1969) under the slots, each copy of an expert on a different device.

Baselines in the same result: contiguous round-robin (expert e on device e // (E / D)) and greedy
least-loaded placement with the same replicas. Reported bound: max(total / devices, largest
per-copy load after water-filling), the proven floor of any placement's largest device load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodel.hardware_db.errors import SpecError
from perfmodel.routing import RoutingStats

# The objective, stated in every result: lexicographic, the busiest node's load first, then the
# tokens that change node between layers, each node allowed LOAD_TOLERANCE above its load-first
# value while the second objective is pursued.
OBJECTIVE = "lexicographic: busiest device's tokens, then tokens crossing nodes (node load tolerance 0.5%)"
LOAD_TOLERANCE = 0.005
LAYER_SECONDS = 0.2
NEAR_NODES = 3        # nodes an expert's tokens come from most: where pass (2) may move it   # CP-SAT time per layer at most (the whole call also respects its time limit)


@dataclass
class LayerPlacement:
    devices: list[list[int]]          # expert -> devices holding a copy
    device_load: np.ndarray           # tokens per device
    node_of_copy: list[list[int]]     # expert -> node of each copy (for the next layer's affinity)


@dataclass
class Placement:
    method: str
    layers: list[LayerPlacement]
    max_load: np.ndarray              # per layer, tokens on the busiest device
    mean_load: np.ndarray             # per layer
    cross_tokens: float               # tokens that change node between consecutive layers
    status: str = ""
    bound: np.ndarray | None = None   # per-layer lower bound of the largest device load
    seconds: float = 0.0

    @property
    def imbalance(self) -> float:
        """Largest over mean device load, averaged over layers (1 = perfectly balanced)."""
        return float(np.mean(self.max_load / np.maximum(self.mean_load, 1e-12)))

    @property
    def gap(self) -> float:
        """Relative gap of the largest device load to its proven bound, worst layer."""
        if self.bound is None:
            return float("nan")
        return float(np.max((self.max_load - self.bound) / np.maximum(self.max_load, 1e-12)))

    def as_map(self) -> dict[str, dict[str, list[int]]]:
        """layer -> expert -> device list, the form a serving or training framework reads."""
        return {str(l): {str(e): sorted(devs) for e, devs in enumerate(p.devices)} for l, p in enumerate(self.layers)}


@dataclass(frozen=True)
class PlacementProblem:
    stats: RoutingStats
    devices: int
    devices_per_node: int
    slots: int                        # expert copies one device may hold per layer
    replicas: int                     # extra copies per layer

    def __post_init__(self):
        e = self.stats.experts
        if self.devices < 1 or self.devices_per_node < 1 or self.devices % self.devices_per_node:
            raise SpecError(f"placement needs devices divisible by devices per node, has {self.devices} and "
                            f"{self.devices_per_node}")
        if self.replicas < 0 or self.slots < 1:
            raise SpecError(f"placement needs slots >= 1 and replicas >= 0, has {self.slots} and {self.replicas}")
        if self.slots * self.devices < e + self.replicas:
            raise SpecError(f"{e} experts and {self.replicas} replicas need {e + self.replicas} slots per layer, "
                            f"{self.devices} devices x {self.slots} slots have {self.slots * self.devices}")
        if e + self.replicas > e * self.devices:
            raise SpecError(f"{self.replicas} replicas exceed one copy of every expert on every device")

    @property
    def nodes(self) -> int:
        return self.devices // self.devices_per_node


def water_fill(load: np.ndarray, extra: int, max_copies: int) -> np.ndarray:
    """Copies per expert: one each, then ``extra`` more, each to the largest tokens-per-copy expert."""
    copies = np.ones(len(load), dtype=int)
    for _ in range(extra):
        per_copy = np.where(copies < max_copies, load / copies, -1.0)
        if per_copy.max() < 0:
            break  # every expert already has a copy on every device
        copies[int(np.argmax(per_copy))] += 1
    return copies


def _lower_bound(load: np.ndarray, copies: np.ndarray, devices: int) -> float:
    return max(load.sum() / devices, float(np.max(load / copies)))


def _rebalance(holder: dict[int, list[int]], sizes: dict[int, float], load: dict[int, float]) -> None:
    """Swap copies between the busiest device and the others while that lowers the busiest load
    (a pairwise-interchange pass after LPT; Graham 1969 bounds LPT alone within 4/3 - 1/(3m)).

    Each pass weighs every swap of a copy on the busiest device with a copy elsewhere at once and
    takes the one giving the lowest new peak (the first such, in holder order)."""
    experts = list(holder)
    devices = sorted(load)
    column = {d: i for i, d in enumerate(devices)}
    size = np.array([sizes[e] for e in experts])
    on = np.zeros((len(experts), len(devices)), dtype=bool)
    copy_expert = np.array([i for i, e in enumerate(experts) for _ in holder[e]], dtype=int)
    copy_device = np.array([column[d] for e in experts for d in holder[e]], dtype=int)
    on[copy_expert, copy_device] = True
    device_load = np.array([load[d] for d in devices])
    for _ in range(200):
        hot = max(range(len(devices)), key=lambda i: (device_load[i], devices[i]))
        hot_experts = np.flatnonzero(on[:, hot])
        delta = size[hot_experts][:, None] - size[copy_expert][None, :]
        valid = ((delta > 0) & (copy_device != hot)[None, :] & ~on[copy_expert, hot][None, :]
                 & ~on[hot_experts][:, copy_device])
        peak = np.where(valid, np.maximum(device_load[hot] - delta, device_load[copy_device][None, :] + delta), np.inf)
        if not peak.size or peak.min() >= device_load[hot] - 1e-9:
            break
        i, j = np.unravel_index(int(np.argmin(peak)), peak.shape)
        e_hot, e_cold, cold = int(hot_experts[i]), int(copy_expert[j]), int(copy_device[j])
        on[e_hot, hot], on[e_hot, cold], on[e_cold, cold], on[e_cold, hot] = False, True, False, True
        copy_device[j] = hot
        copy_device[np.flatnonzero((copy_expert == e_hot) & (copy_device == hot))[0]] = cold
        device_load[hot] -= delta[i, j]
        device_load[cold] += delta[i, j]
        holder[experts[e_hot]][holder[experts[e_hot]].index(devices[hot])] = devices[cold]
        holder[experts[e_cold]][holder[experts[e_cold]].index(devices[cold])] = devices[hot]
    for i, d in enumerate(devices):
        load[d] = float(device_load[i])


def _lpt(items: list[tuple[float, int]], devices: list[int], slots: int, start: np.ndarray, rebalance: bool = True):
    """Longest processing time first onto ``devices``: (size, expert) items, distinct devices per expert."""
    load = {d: float(start[d]) for d in devices}
    used = {d: 0 for d in devices}
    holder: dict[int, list[int]] = {}
    for size, expert in sorted(items, key=lambda it: -it[0]):
        taken = holder.setdefault(expert, [])
        options = [d for d in devices if used[d] < slots and d not in taken]
        if not options:
            raise SpecError("no free slot for an expert copy: raise --slots or lower --replicas")
        d = min(options, key=lambda k: (load[k], k))
        load[d] += size
        used[d] += 1
        taken.append(d)
    if rebalance:
        _rebalance(holder, {e: size for size, e in items}, load)
    return holder, load


def _arrivals(stats: RoutingStats, layer: int, prev: LayerPlacement | None, nodes: int) -> np.ndarray:
    """(experts x nodes): tokens of layer ``layer`` expert e arriving from node n (previous layer)."""
    e = stats.experts
    if prev is None or stats.transitions is None or layer == 0:
        return np.zeros((e, nodes))
    trans = np.asarray(stats.transitions[layer - 1])            # (prev experts) x (experts)
    origin = np.zeros((e, nodes))                               # prev expert i -> share of its tokens per node
    for i, copy_nodes in enumerate(prev.node_of_copy):
        for n in copy_nodes:
            origin[i, n] += 1.0 / len(copy_nodes)
    return trans.T @ origin                                     # (experts x nodes)


def _finish_layer(problem: PlacementProblem, load: np.ndarray, copies: np.ndarray,
                  per_node: np.ndarray, rebalance: bool = True) -> LayerPlacement:
    """Devices inside each node by LPT, given copies per expert per node."""
    dpn = problem.devices_per_node
    device_load = np.zeros(problem.devices)
    devices_of: list[list[int]] = [[] for _ in range(len(load))]
    nodes_of: list[list[int]] = [[] for _ in range(len(load))]
    for n in range(problem.nodes):
        items = [(load[e] / copies[e], e) for e in range(len(load)) for _ in range(int(per_node[e, n]))]
        holder, node_load = _lpt(items, list(range(n * dpn, (n + 1) * dpn)), problem.slots, device_load, rebalance)
        for e, devs in holder.items():
            devices_of[e] += devs
            nodes_of[e] += [n] * len(devs)
        for d, v in node_load.items():
            device_load[d] = v
    return LayerPlacement(devices_of, device_load, nodes_of)


def _cross(arrivals: np.ndarray, per_node: np.ndarray, copies: np.ndarray) -> float:
    """Tokens arriving from another node: each copy takes an equal share of its expert's arrivals."""
    share = per_node / copies[:, None]                          # share of expert e's tokens in node n
    same = (arrivals * share).sum()
    return float(arrivals.sum() - same)


def _node_model(problem, load, copies, arrivals, time_limit, hint):
    """Two CP-SAT passes over copies per (expert, node), each started from the previous answer:
    (1) the smallest peak node load; (2) every node held to its load from (1) (within
    LOAD_TOLERANCE), the most arriving tokens kept on their node. Returns the split and the
    status of pass (1) (OPTIMAL: no split has a lower peak node)."""
    from ortools.sat.python import cp_model

    e_count, nodes, dpn = len(load), problem.nodes, problem.devices_per_node
    scale = 1e6 / max(float(load.sum()), 1e-12)                 # tokens -> integer units
    per_copy = np.maximum(np.round(load / copies * scale), 0).astype(int)
    arrive = np.round(arrivals * scale).astype(int)

    def solve(node_caps, objective_is_peak, start, seconds, allowed):
        """``allowed[e]``: the nodes expert e may use (the rest are fixed at zero copies)."""
        model = cp_model.CpModel()
        y = {(e, n): model.NewIntVar(0, min(int(copies[e]), dpn), f"y{e}_{n}") for e in range(e_count)
             for n in allowed[e]}
        by_node: dict[int, list[int]] = {n: [] for n in range(nodes)}
        for e in range(e_count):
            model.Add(sum(y[e, n] for n in allowed[e]) == int(copies[e]))
            for n in allowed[e]:
                by_node[n].append(e)
        peak = model.NewIntVar(0, int(per_copy @ copies) + 1, "peak")
        for n, members in by_node.items():
            if not members:
                continue
            model.Add(sum(y[e, n] for e in members) <= problem.slots * dpn)
            node_load = cp_model.LinearExpr.WeightedSum([y[e, n] for e in members],
                                                        [int(per_copy[e]) for e in members])
            model.Add(node_load <= peak)
            if node_caps is not None:
                model.Add(node_load <= int(node_caps[n]))
        if objective_is_peak:
            model.Minimize(peak)
        else:  # tokens arriving on a copy in their own node (each copy takes an equal share)
            keys = [k for k in y if arrive[k] > 0]
            model.Maximize(cp_model.LinearExpr.WeightedSum([y[k] for k in keys],
                                                           [int(round(arrive[k] / copies[k[0]])) for k in keys]))
        for (e, n), var in y.items():
            model.AddHint(var, int(start[e, n]))
        solver = cp_model.CpSolver()
        # Deterministic time and one worker: the same inputs give the same placement on any machine.
        solver.parameters.max_deterministic_time = max(seconds, 0.05)
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
        status = solver.Solve(model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return start, solver.StatusName(status)
        out = np.zeros_like(start)
        for (e, n), var in y.items():
            out[e, n] = solver.Value(var)
        return out, solver.StatusName(status)

    everywhere = [list(range(nodes))] * e_count
    split, status = hint, "FEASIBLE"
    if dpn == 1:
        # Devices are the nodes: pass (1) is the exact load problem. With several devices per
        # node the node split only bounds the devices' loads, so the load-first split (greedy,
        # then LPT inside nodes) is kept and only pass (2) runs.
        split, status = solve(None, True, hint, time_limit / 2, everywhere)
    if arrivals.sum() > 0 and nodes > 1:
        caps = [per_copy @ split[:, n] * (1 + LOAD_TOLERANCE) + 1 for n in range(nodes)]
        # Pass (2) moves an expert only among its current nodes and the NEAR_NODES its tokens
        # come from most (a neighbourhood: the cross-node count is optimal within it, not proven
        # globally; the load stays within the tolerance either way).
        near = np.argsort(-arrivals, axis=1, kind="stable")[:, :NEAR_NODES]
        allowed = [sorted(set(np.flatnonzero(split[e]).tolist()) | set(near[e].tolist())) for e in range(e_count)]
        split, _ = solve(caps, False, split, time_limit / 2, allowed)
    return split, status


def _greedy_nodes(problem, load, copies):
    """Greedy least-loaded placement at node level (the hint, and the greedy baseline's node split)."""
    nodes, dpn = problem.nodes, problem.devices_per_node
    per_node = np.zeros((len(load), nodes), dtype=int)
    node_load = np.zeros(nodes)
    used = np.zeros(nodes, dtype=int)
    order = sorted(((load[e] / copies[e], e) for e in range(len(load)) for _ in range(int(copies[e]))),
                   key=lambda it: -it[0])
    for size, e in order:
        ok = (used < problem.slots * dpn) & (per_node[e] < dpn)
        n = int(np.argmin(np.where(ok, node_load, np.inf)))
        per_node[e, n] += 1
        node_load[n] += size
        used[n] += 1
    return per_node


METHODS = ("cp-sat", "greedy", "round-robin", "lpt")


def place(problem: PlacementProblem, method: str = "cp-sat", time_limit: float = 30.0,
          progress: Callable[[int], None] | None = None) -> Placement:
    """Place every layer with ``method``: "cp-sat", "greedy" (LPT with interchange), "lpt" (plain
    longest-first, the plan searches' fast estimate) or "round-robin".

    CP-SAT gets a deterministic budget per layer (reproducible) that sums to ``time_limit``; should
    the wall clock pass ``time_limit`` anyway, the remaining layers keep their greedy placement and
    the status says FEASIBLE. ``progress`` is called with the number of layers placed."""
    if method not in METHODS:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError("placement method", method, METHODS)
    started = time.perf_counter()
    stats = problem.stats
    loads = np.asarray(stats.loads, dtype=float)
    layers: list[LayerPlacement] = []
    bounds, statuses, cross = [], [], 0.0
    prev = None
    for layer in range(stats.layers):
        load = loads[layer]
        if method == "round-robin":
            copies = np.ones(len(load), dtype=int)
            block = max(len(load) // problem.devices, 1)
            dev = [[min(e // block, problem.devices - 1) if len(load) >= problem.devices else e % problem.devices]
                   for e in range(len(load))]
            device_load = np.zeros(problem.devices)
            for e, (d,) in enumerate(dev):
                device_load[d] += load[e]
            per_node = np.zeros((len(load), problem.nodes), dtype=int)
            for e, (d,) in enumerate(dev):
                per_node[e, d // problem.devices_per_node] += 1
            placed = LayerPlacement(dev, device_load, [[d // problem.devices_per_node] for (d,) in dev])
        else:
            copies = water_fill(load, problem.replicas, problem.devices)
            per_node = _greedy_nodes(problem, load, copies)
            placed = _finish_layer(problem, load, copies, per_node, rebalance=method != "lpt")
            if method == "cp-sat" and time.perf_counter() - started > time_limit:
                statuses.append("TIME_LIMIT")
            elif method == "cp-sat":
                arrivals = _arrivals(stats, layer, prev, problem.nodes)
                # A fixed deterministic budget per layer (not the wall clock): reproducible results.
                split, status = _node_model(problem, load, copies, arrivals,
                                            min(LAYER_SECONDS, time_limit / stats.layers), per_node)
                statuses.append(status)
                candidate = _finish_layer(problem, load, copies, split)
                # Keep the solver's split unless LPT packs its nodes' devices worse than the
                # tolerance allows (the node model does not see the devices).
                if candidate.device_load.max() <= placed.device_load.max() * (1 + LOAD_TOLERANCE):
                    placed, per_node = candidate, split
        cross += _cross(_arrivals(stats, layer, prev, problem.nodes), per_node, copies) if layer else 0.0
        bounds.append(_lower_bound(load, copies if method != "round-robin" else
                                   water_fill(load, problem.replicas, problem.devices), problem.devices))
        layers.append(placed)
        prev = placed
        if progress is not None:
            progress(layer + 1)
    status = ""
    if method == "cp-sat":
        status = "OPTIMAL" if all(s == "OPTIMAL" for s in statuses) else "FEASIBLE"
    return Placement(method=method, layers=layers,
                     max_load=np.array([p.device_load.max() for p in layers]),
                     mean_load=np.array([p.device_load.mean() for p in layers]), cross_tokens=cross,
                     status=status, bound=np.array(bounds), seconds=time.perf_counter() - started)


def imbalance_for_ep(stats: RoutingStats, ep: int) -> float:
    """Largest over mean expert-parallel device load for an EP degree, with greedy placement and no
    replicas (what the plan searches use in place of perfectly balanced routing)."""
    slots = -(-stats.experts // ep)
    problem = PlacementProblem(stats=RoutingStats(loads=np.asarray(stats.loads)), devices=ep, devices_per_node=1,
                               slots=slots, replicas=0)
    return place(problem, "lpt").imbalance


def imbalance_table(stats: RoutingStats | None, eps) -> dict[int, float]:
    """Imbalance factor for each EP degree (1.0 for every degree when there are no statistics)."""
    return {int(e): (imbalance_for_ep(stats, int(e)) if stats is not None and e > 1 else 1.0)
            for e in np.unique(np.asarray(eps))}


def layer_time(spec, machine, placement: Placement, devices: int) -> float:
    """Predicted seconds of all MoE layers under a placement (see perfmodel.moe)."""
    from perfmodel.moe import moe_layer_time

    total = 0.0
    cross_per_layer = placement.cross_tokens / max(len(placement.layers) - 1, 1)
    for p in placement.layers:
        busiest = int(np.argmax(p.device_load))
        experts_there = sum(busiest in devs for devs in p.devices)
        total += float(moe_layer_time(spec, machine, p.device_load[busiest], experts_there, cross_per_layer,
                                      devices))
    return total
