"""MoE expert placement: which device holds each expert of each layer, with replicas of hot experts.

The objective, stated in every result (``Placement.objective``), is lexicographic:

1. the busiest device's tokens (the device every all-to-all and expert GEMM of the layer waits for);
2. the tokens that cross devices plus the tokens that cross nodes between consecutive MoE layers
   (ExFlow's inter-layer expert affinity: Yao et al., "Exploiting Inter-Layer Expert Affinity for
   Accelerating Mixture-of-Experts Model Inference", IPDPS 2024, arXiv 2401.08383, Sec. IV), every
   device allowed up to ``max((1 + load_tolerance) x bound, load-first peak)`` while (2) is pursued.
   The tolerance applies to the busiest device, not per node: lightly loaded devices keep their room,
   so skewed routing still lets experts move.

Default tolerance 1% (LOAD_TOLERANCE): the busiest device sets the layer's expert GEMM time and every
other device's wait in the all-to-all, so 1% costs at most 1% of the expert compute, while it buys
20-30% fewer cross-GPU tokens on DeepSeek-V3 with Zipf 1.0 routing (benchmarks/bench_placement.py);
and the busiest device then stays within 1% of its proven bound wherever the load-first placement
reaches it (issue 15's gap target). A larger tolerance buys more locality (``--load-tolerance``).

``bound`` is max(tokens / devices, largest tokens per copy after water-filling), a floor of every
placement's busiest device with the same replica budget (water-filling minimises the largest
tokens per copy).

Traffic assumption: a replicated expert's tokens split evenly over its copies, and a token leaving
a copy of expert i for expert j reaches each copy of j with equal probability, wherever it comes
from. Tokens crossing devices (nodes) between layer l and l + 1 are then
sum_ij T_l[i, j] (1 - sum_d A_l[i, d] A_l+1[j, d]), A[e, d] = 1 / copies(e) where e has a copy on d
(node sums of A for nodes), T_l the transition counts of ``RoutingStats``.

Per layer, in order (the previous layer fixed, so its placement prices the next layer's affinity:
ExFlow's integer program solved layer by layer; the decomposition is stated in every result):

1. Replicas by water-filling: one copy at a time to the expert with the most tokens per copy
   (optimal for the largest per-copy load; DeepSeek's EPLB rule).
2. Load first: longest processing time first (LPT, Graham 1969) under the slots, each copy of an
   expert on its own device, then swaps off the busiest device while they lower it. Where that
   leaves a gap to the bound and the layer is small (experts x devices <= EXACT_PEAK_PAIRS),
   CP-SAT minimises the busiest device within a deterministic budget and proves it.
3. Locality under the allowed peak: with one slot per device every assignment has the same peak,
   and the gain of each (copy, device) is linear, so a linear assignment (SciPy's
   ``linear_sum_assignment``: Crouse, IEEE TAES 52(4), 2016) is exact for the layer. With several
   slots: a copy at a time, largest first, onto the allowed device its tokens come from most (a GAP
   greedy in the manner of Martello and Toth 1981), swaps off the busiest device back under the
   allowed peak (least tokens lost first), then rounds of best-improvement pairwise swaps (copies
   and free slots) while the allowed peak holds; if the greedy cannot be brought under the allowed
   peak, the swaps start from the load-first placement instead. (Beyond ASSIGN_CELLS and
   SWAP_ITEMS, memory guards keep the greedy's answer.)

Baselines in the same result: contiguous round-robin (expert e on device floor(e x D / E), no
replicas; ExFlow's comparison) and greedy (step 2 without CP-SAT, same replicas).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodel.hardware_db.errors import SpecError
from perfmodel.routing import RoutingStats

LOAD_TOLERANCE = 0.01      # default: the busiest device may exceed its bound by 1% while locality is pursued
EXACT_PEAK_PAIRS = 256     # CP-SAT proves the busiest device only on layers with experts x devices up to this
LAYER_SECONDS = 0.1        # CP-SAT deterministic time per such layer (the whole call also respects its time limit)
# The deterministic clock of ``place`` (``_Work``): array elements its heavy steps process (swap and
# gain matrices, assignment costs) at ELEMENTS_PER_SECOND, plus STEP_SECONDS per Python-level step
# (a copy placed, a batch of swaps, a CP-SAT variable built), plus CP-SAT's deterministic time.
# Least squares of wall time on the counts of 10 placements (DeepSeek-V3, Qwen3-235B, Mixtral; 4 to
# 320 devices) on the development machine (one core of a 2-core x86-64 VM): within 25% of the wall
# time on the placements over 0.1 s (benchmarks/bench_placement.py prints both). A budget in these
# units is a count, never the wall clock: the same on an idle or a busy machine.
ELEMENTS_PER_SECOND = 6.5e7
STEP_SECONDS = 1.0e-5
SWAP_ROUNDS = 200          # batches of pairwise swaps per layer at most (a local optimum comes first in practice)
PEAK_SWAPS = 512           # swaps off the busiest device per layer at most (DeepSeek-V3 on 64 GPUs needs ~400)
PEAK_WORK = 5_000_000      # (swaps x pairs weighed) off the busiest device per layer at most
SWAP_ITEMS = 1536          # copies + free-slot items above which the swap search (items^2 memory) is skipped
ROOM_ITEMS = 512           # free-slot items at most: the least loaded devices with room
ASSIGN_CELLS = 4_000_000   # copies x devices above which one slot per device uses the greedy, not the assignment
SPLIT_ASSUMPTION = ("a replicated expert's tokens split evenly over its copies, and reach the next layer's copies "
                    "evenly, wherever they come from")
METHODS = ("affinity", "greedy", "round-robin", "lpt")
DECOMPOSITION = ("per layer in order, the previous layer fixed for affinity; per layer: replicas by water-filling, "
                 "load first by LPT with interchange (CP-SAT proves small layers), then locality under the allowed "
                 "peak by linear assignment (one slot per device: exact for the layer) or an affinity greedy with "
                 "pairwise swaps")


@dataclass
class _Work:
    """What one ``place`` call has done so far, in deterministic seconds: elements processed and
    Python-level steps taken at the rates above, plus CP-SAT's deterministic time (a budget that is
    the same on an idle or a busy machine)."""

    elements: float = 0.0
    steps: int = 0
    solver_s: float = 0.0

    def add(self, elements: float, steps: int = 1) -> None:
        self.elements += float(elements)
        self.steps += steps

    @property
    def seconds(self) -> float:
        return self.elements / ELEMENTS_PER_SECOND + self.steps * STEP_SECONDS + self.solver_s


def objective_text(load_tolerance: float = LOAD_TOLERANCE) -> str:
    """The lexicographic objective in words, with its tolerance."""
    return (f"lexicographic: busiest device's tokens, then tokens crossing devices + tokens crossing nodes between "
            f"consecutive layers, every device at most max((1 + {load_tolerance:.2%}) x bound, load-first peak)")


OBJECTIVE = objective_text()


@dataclass(frozen=True, eq=False)
class LayerPlacement:
    expert: np.ndarray                # copy -> expert (copies grouped by expert)
    device: np.ndarray                # copy -> device
    device_load: np.ndarray           # tokens per device

    @property
    def devices(self) -> list[list[int]]:
        """expert -> devices holding a copy."""
        out: list[list[int]] = [[] for _ in range(int(self.expert.max()) + 1)]
        for e, d in zip(self.expert.tolist(), self.device.tolist()):
            out[e].append(d)
        return out

    def share(self, experts: int, devices: int):
        """(experts x devices), sparse: the share of an expert's tokens each device holds (1 / copies
        per copy; SciPy CSR, one entry per copy)."""
        from scipy.sparse import csr_matrix

        copies = np.bincount(self.expert, minlength=experts)
        return csr_matrix((1.0 / copies[self.expert], (self.expert, self.device)), shape=(experts, devices))


@dataclass(frozen=True)
class Traffic:
    """Tokens between consecutive MoE layers (all layer pairs summed), under ``SPLIT_ASSUMPTION``."""

    between_layers: float             # every token moving from one MoE layer's expert to the next's
    cross_device: float               # of them, arriving on another device
    cross_node: float                 # of them, arriving in another node


@dataclass(frozen=True, eq=False)
class Placement:
    method: str
    layers: tuple[LayerPlacement, ...]
    max_load: np.ndarray              # per layer, tokens on the busiest device
    mean_load: np.ndarray             # per layer
    bound: np.ndarray                 # per layer, floor of the busiest device's tokens
    traffic: Traffic | None           # None without transition counts
    status: str = ""
    seconds: float = 0.0
    load_tolerance: float = LOAD_TOLERANCE
    allowed_peak: np.ndarray | None = None   # per layer, the busiest device allowed while locality is pursued
    peak_proven: np.ndarray | None = None    # per layer, the load-first peak is proven minimal (bound or CP-SAT)
    note: str = ""                    # what the status leaves out (time limit reached, layers skipped)
    work_s: float = 0.0               # deterministic seconds used (``_Work``), what ``time_limit`` bounds

    @property
    def objective(self) -> str:
        return objective_text(self.load_tolerance)

    @property
    def imbalance(self) -> float:
        """Largest over mean device load, averaged over layers (1 = perfectly balanced)."""
        return float(np.mean(self.max_load / np.maximum(self.mean_load, 1e-12)))

    @property
    def gap(self) -> float:
        """Relative gap of the busiest device's tokens to their bound, worst layer."""
        return float(np.max((self.max_load - self.bound) / np.maximum(self.max_load, 1e-12)))

    @property
    def over_bound(self) -> float:
        """Share by which the busiest device exceeds its bound, worst layer (compare with the tolerance)."""
        return float(np.max(self.max_load / np.maximum(self.bound, 1e-12))) - 1.0

    @property
    def cross_device_tokens(self) -> float | None:
        return None if self.traffic is None else self.traffic.cross_device

    @property
    def cross_node_tokens(self) -> float | None:
        return None if self.traffic is None else self.traffic.cross_node

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
    load_tolerance: float = LOAD_TOLERANCE

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
        if not 0 <= self.load_tolerance <= 1:
            raise SpecError(f"--load-tolerance needs a share from 0 to 1, has {self.load_tolerance:g}")

    @property
    def nodes(self) -> int:
        return self.devices // self.devices_per_node


# --- replicas and the load-first placement ---------------------------------------------------------

def water_fill(load: np.ndarray, extra: int, max_copies: int) -> np.ndarray:
    """Copies per expert: one each, then ``extra`` more, each to the largest tokens-per-copy expert
    (the lowest index on ties), at most ``max_copies`` each.

    One step at a time, expert e's (k + 1)-th copy goes when load_e / k is the largest of the current
    per-copy loads; since each expert's load / k falls with k, the steps are the ``extra`` largest
    load_e / k over all (e, k < max_copies), taken in that order: one sort instead of a loop."""
    load = np.asarray(load, dtype=float)
    steps = min(extra, max_copies - 1)
    copies = np.ones(len(load), dtype=int)
    if steps <= 0:
        return copies
    k = np.arange(1, steps + 1)
    value = (load[:, None] / k[None, :]).ravel()                   # expert-major: e, then k
    expert = np.repeat(np.arange(len(load)), steps)
    chosen = np.lexsort((expert, -value))[:extra]
    return copies + np.bincount(expert[chosen], minlength=len(load))


def lower_bound(load: np.ndarray, copies: np.ndarray, devices: int) -> float:
    """Floor of the busiest device's tokens: the mean device, or the largest copy."""
    return max(float(load.sum()) / devices, float(np.max(load / copies)))


def _copy_table(load: np.ndarray, copies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    expert = np.repeat(np.arange(len(load)), copies)
    return expert, load[expert] / copies[expert]


def _lpt(expert: np.ndarray, size: np.ndarray, problem: PlacementProblem) -> np.ndarray:
    """Longest first onto the least-loaded device with a free slot and no copy of that expert."""
    d_count, e_count = problem.devices, problem.stats.experts
    device = np.empty(len(expert), dtype=int)
    load = np.zeros(d_count)
    used = np.zeros(d_count, dtype=int)
    held = np.zeros((e_count, d_count), dtype=bool)
    for k in np.lexsort((expert, -size)):
        open_ = (used < problem.slots) & ~held[expert[k]]
        if not open_.any():
            raise SpecError("no free slot for an expert copy: raise --slots or lower --replicas")
        d = int(np.argmin(np.where(open_, load, np.inf)))
        device[k], held[expert[k], d] = d, True
        load[d] += size[k]
        used[d] += 1
    return device


class _Items:
    """The copies of one layer plus one free-slot item (expert = experts, size 0) per device with
    room: a swap with a free-slot item is a move. Rebuilt after each batch of swaps."""

    def __init__(self, expert, size, device, problem):
        self.copies = len(expert)
        self.e_count, self.d_count = problem.stats.experts, problem.devices
        used = np.bincount(device, minlength=self.d_count)
        room = np.flatnonzero(used < problem.slots)
        if len(room) > ROOM_ITEMS:
            load = np.bincount(device, size, self.d_count)[room]
            room = np.sort(room[np.lexsort((room, load))[:ROOM_ITEMS]])
        self.expert = np.concatenate([expert, np.full(len(room), self.e_count)])
        self.size = np.concatenate([size, np.zeros(len(room))])
        self.device = np.concatenate([device, room])
        self.load = np.bincount(self.device, self.size, self.d_count)
        self.held = np.zeros((self.e_count + 1, self.d_count), dtype=bool)
        self.held[expert, device] = True             # row e_count (free slots) stays False: no conflict

    def swap(self, a: int, b: int) -> None:
        da, db = self.device[a], self.device[b]
        self.held[self.expert[a], da] = False
        self.held[self.expert[b], db] = False
        self.held[self.expert[a], db] = self.expert[a] < self.e_count
        self.held[self.expert[b], da] = self.expert[b] < self.e_count
        self.device[a], self.device[b] = db, da
        self.load[da] += self.size[b] - self.size[a]
        self.load[db] += self.size[a] - self.size[b]

    def allowed(self, rows: np.ndarray) -> np.ndarray:
        """(rows x items): swapping keeps each expert's copies on distinct devices, and moves something."""
        ex, dv = self.expert, self.device
        return (~self.held[ex[rows][:, None], dv[None, :]] & ~self.held[ex[None, :], dv[rows][:, None]]
                & (dv[rows][:, None] != dv[None, :]) & (ex[rows][:, None] != ex[None, :]))


def _lower_peak(expert, size, device, problem, work: _Work, gain=None, cap=None) -> np.ndarray:
    """Swaps between the busiest device and another (a free slot included) while they lower the
    busiest device (after LPT: a pairwise interchange; Graham 1969 bounds LPT alone within
    4/3 - 1/(3m)). With ``cap`` it stops once the busiest device is under it, and with ``gain``
    ((experts x devices) tokens kept local per copy) it takes, among swaps that end under ``cap``,
    the one losing the fewest local tokens; otherwise the lowest new peak."""
    items = _Items(expert, size, device, problem)
    g = None if gain is None else np.vstack([gain, np.zeros((1, problem.devices))])   # free slots gain nothing
    # At most PEAK_SWAPS swaps, fewer on huge layers (each weighs slots x items pairs).
    for _ in range(min(PEAK_SWAPS, max(16, PEAK_WORK // (problem.slots * len(items.expert))))):
        hot = int(np.argmax(items.load))
        if cap is not None and items.load[hot] <= cap:
            break
        mine = np.flatnonzero((items.device == hot) & (items.expert < items.e_count))
        work.add(len(mine) * len(items.expert))
        delta = items.size[mine][:, None] - items.size[None, :]
        valid = items.allowed(mine) & (delta > 0)
        peak = np.maximum(items.load[hot] - delta, items.load[items.device][None, :] + delta)
        peak = np.where(valid, peak, np.inf)
        if not peak.size or peak.min() >= items.load[hot] * (1 - 1e-12):
            break
        score = peak
        if g is not None and cap is not None and (peak <= cap).any():
            ex, dv = items.expert, items.device
            lost = (g[ex[mine], hot][:, None] + g[ex, dv][None, :]) - (g[ex[mine]][:, dv] + g[ex, hot][None, :])
            score = np.where(peak <= cap, lost, np.inf)
        i, j = np.unravel_index(int(np.argmin(score)), score.shape)
        items.swap(int(mine[i]), int(j))
    return items.device[:items.copies].copy()


def _exact_peak(expert, size, load, copies, problem, seconds, hint, work: _Work):
    """CP-SAT: copies per (expert, device) in {0, 1} under the slots, minimising the busiest device.
    Returns (device per copy, proven). Deterministic: one worker, deterministic time."""
    from ortools.sat.python import cp_model

    e_count, d_count = len(load), problem.devices
    scale = 1e9 / max(float(load.sum()), 1e-12)                  # tokens -> integers
    per_copy = np.round(load / copies * scale).astype(np.int64)
    model = cp_model.CpModel()
    y = [[model.NewBoolVar(f"y{e}_{d}") for d in range(d_count)] for e in range(e_count)]
    peak = model.NewIntVar(0, int(per_copy @ copies) + 1, "peak")
    for e in range(e_count):
        model.Add(sum(y[e]) == int(copies[e]))
    for d in range(d_count):
        model.Add(sum(y[e][d] for e in range(e_count)) <= problem.slots)
        model.Add(cp_model.LinearExpr.WeightedSum([y[e][d] for e in range(e_count)],
                                                  [int(per_copy[e]) for e in range(e_count)]) <= peak)
    on = np.zeros((e_count, d_count), dtype=bool)
    on[expert, hint] = True
    for e in range(e_count):
        for d in range(d_count):
            model.AddHint(y[e][d], bool(on[e, d]))
    model.Minimize(peak)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = max(seconds, 0.01)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.Solve(model)
    work.solver_s += solver.deterministic_time
    work.add(0, e_count * d_count)                               # building the model
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return hint, False
    device = np.array([d for e in range(e_count) for d in range(d_count) if solver.Value(y[e][d])])
    return device, status == cp_model.OPTIMAL


# --- locality ---------------------------------------------------------------------------------------

def _affinity_gain(stats: RoutingStats, layer: int, prev: LayerPlacement | None, copies: np.ndarray,
                   problem: PlacementProblem) -> np.ndarray | None:
    """(experts x devices): tokens kept on the device plus tokens kept in the node if one copy of
    expert e sits on device d, given the previous layer's placement (None: nothing to gain)."""
    if prev is None or stats.transitions is None or layer == 0:
        return None
    e_count, d_count, per_node = stats.experts, problem.devices, problem.devices_per_node
    # arriving[j, d] = sum_i T[i, j] share[i, d]: (share^T T)^T, sparse times dense.
    arriving = np.asarray((prev.share(e_count, d_count).T @ np.asarray(stats.transitions[layer - 1], dtype=float)).T)
    in_node = arriving.reshape(e_count, problem.nodes, per_node).sum(axis=2)
    return (arriving + np.repeat(in_node, per_node, axis=1)) / copies[:, None]


def _assign(expert: np.ndarray, gain: np.ndarray, work: _Work) -> np.ndarray:
    """One slot per device: every assignment has the same busiest device, and the locality is a
    linear assignment, solved exactly (SciPy's shortest augmenting path: Crouse 2016)."""
    from scipy.optimize import linear_sum_assignment

    work.add(len(expert) * gain.shape[1])
    rows, cols = linear_sum_assignment(gain[expert], maximize=True)
    device = np.empty(len(expert), dtype=int)
    device[rows] = cols
    return device


def _greedy_affinity(expert, size, gain, cap, problem, work: _Work) -> np.ndarray | None:
    """Largest copy first onto the device it gains most on among those it fits under ``cap`` (a free
    slot, no copy of its expert); the least loaded open device when it fits nowhere; None when a
    copy finds no open device at all."""
    d_count = problem.devices
    device = np.empty(len(expert), dtype=int)
    load = np.zeros(d_count)
    used = np.zeros(d_count, dtype=int)
    held = np.zeros((problem.stats.experts, d_count), dtype=bool)
    work.add(len(expert) * d_count, len(expert))
    for k in np.lexsort((expert, -size)):
        e = expert[k]
        open_ = (used < problem.slots) & ~held[e]
        if not open_.any():
            return None
        fits = np.flatnonzero(open_ & (load + size[k] <= cap))
        if len(fits):
            top = fits[gain[e, fits] == gain[e, fits].max()]
            d = int(top[np.argmin(load[top])])       # ties: the least loaded, then the lowest index
        else:
            d = int(np.argmin(np.where(open_, load, np.inf)))
        device[k], held[e, d] = d, True
        load[d] += size[k]
        used[d] += 1
    return device


def _swap_local_search(expert, size, device, gain, cap, problem, work: _Work) -> np.ndarray:
    """Best-improvement pairwise swaps (a free slot counts as an item of size 0) that raise the local
    tokens and keep both devices under ``cap``: each round finds every item's best swap, then applies
    them best first, each re-checked against the loads and copies as they stand (an item moves at
    most once a round, so its gain is still exact)."""
    g = np.vstack([gain, np.zeros((1, problem.devices))])
    tiny = 1e-12 * max(float(np.abs(gain).sum()), 1.0)
    for _ in range(SWAP_ROUNDS):
        items = _Items(expert, size, device, problem)
        ex, dv, sz, load, held = items.expert, items.device, items.size, items.load, items.held
        everyone = np.arange(len(ex))
        work.add(len(ex) ** 2)
        here = g[ex, dv]
        there = g[ex][:, dv]                                      # item a on item b's device
        better = there + there.T - here[:, None] - here[None, :]
        diff = sz[:, None] - sz[None, :]
        fits = (load[dv][:, None] - diff <= cap) & (load[dv][None, :] + diff <= cap)
        better = np.where(fits & items.allowed(everyone), better, -np.inf)
        best = np.argmax(better, axis=1)
        value = better[everyone, best]
        order = np.flatnonzero(value > tiny)
        if not len(order):
            break
        moved = np.zeros(len(ex), dtype=bool)
        for a in order[np.argsort(-value[order], kind="stable")].tolist():
            b = int(best[a])
            da, db = dv[a], dv[b]
            if (moved[a] or moved[b] or held[ex[a], db] or held[ex[b], da]
                    or load[da] - sz[a] + sz[b] > cap or load[db] - sz[b] + sz[a] > cap):
                continue
            items.swap(a, b)
            moved[a] = moved[b] = True
        device = items.device[:items.copies].copy()
    return device


def _locality(expert, size, load_first, gain, cap, problem, work: _Work) -> np.ndarray:
    """The most local placement found with every device at most ``cap`` (load_first is one such)."""
    if problem.slots == 1 and len(expert) * problem.devices <= ASSIGN_CELLS:
        return _assign(expert, gain, work)
    device = _greedy_affinity(expert, size, gain, cap, problem, work)
    if device is not None:
        device = _lower_peak(expert, size, device, problem, work, gain, cap)
    if device is None or np.bincount(device, size, problem.devices).max() > cap:
        device = load_first
    if len(expert) + min(problem.devices, ROOM_ITEMS) > SWAP_ITEMS:
        return device
    return _swap_local_search(expert, size, device, gain, cap, problem, work)


# --- baselines, traffic and the checker ------------------------------------------------------------

def _round_robin(load: np.ndarray, problem: PlacementProblem) -> LayerPlacement:
    """Contiguous blocks, no replicas: expert e on device floor(e x D / E) (e itself when E < D)."""
    e_count, d_count = len(load), problem.devices
    expert = np.arange(e_count)
    device = expert * d_count // e_count if e_count >= d_count else expert
    return LayerPlacement(expert, device, np.bincount(device, load, d_count))


def traffic(stats: RoutingStats, layers, problem: PlacementProblem) -> Traffic | None:
    """Tokens crossing devices and nodes between consecutive layers (None without transitions)."""
    if stats.transitions is None or len(layers) < 2:
        return None
    from scipy.sparse import csr_matrix

    e_count, d_count = stats.experts, problem.devices
    node_of = csr_matrix((np.ones(d_count), (np.arange(d_count), np.arange(d_count) // problem.devices_per_node)),
                         shape=(d_count, problem.nodes))
    total = same_device = same_node = 0.0
    shares = [p.share(e_count, d_count) for p in layers]
    for l in range(len(layers) - 1):
        t = np.asarray(stats.transitions[l], dtype=float)
        a, b = shares[l], shares[l + 1]
        total += float(t.sum())
        same_device += float((a @ b.T).multiply(t).sum())
        same_node += float(((a @ node_of) @ (b @ node_of).T).multiply(t).sum())
    return Traffic(total, max(total - same_device, 0.0), max(total - same_node, 0.0))


def check(problem: PlacementProblem, placement: Placement) -> None:
    """Re-derive a placement's figures from the instance alone; AssertionError names what breaks.

    Every expert placed, copies on distinct devices, slots and replica budget respected, device
    loads conserved (their sum is the layer's tokens), the busiest device and the bound as reported,
    the allowed peak held, and the traffic recomputed pair by pair of copies."""
    loads = np.asarray(problem.stats.loads, dtype=float)
    e_count, d_count = problem.stats.experts, problem.devices
    extra = 0 if placement.method == "round-robin" else problem.replicas
    rel = 1e-9
    for l, p in enumerate(placement.layers):
        copies = np.bincount(p.expert, minlength=e_count)
        assert copies.min() >= 1, f"layer {l}: an expert has no copy"
        assert copies.sum() <= e_count + extra, f"layer {l}: more copies than the replica budget"
        assert len(set(zip(p.expert.tolist(), p.device.tolist()))) == len(p.expert), f"layer {l}: copies share a device"
        assert np.bincount(p.device, minlength=d_count).max() <= problem.slots, f"layer {l}: a device over its slots"
        device_load, tokens, count = [0.0] * d_count, loads[l].tolist(), copies.tolist()
        for e, d in zip(p.expert.tolist(), p.device.tolist()):
            device_load[d] += tokens[e] / count[e]
        device_load = np.array(device_load)
        total = loads[l].sum()
        assert abs(device_load.sum() - total) <= rel * total, f"layer {l}: device loads do not sum to its tokens"
        assert np.allclose(device_load, p.device_load, rtol=rel, atol=rel * total), f"layer {l}: device loads differ"
        assert abs(device_load.max() - placement.max_load[l]) <= rel * total, f"layer {l}: busiest device differs"
        best_copies = water_fill(loads[l], problem.replicas, d_count)
        assert abs(lower_bound(loads[l], best_copies, d_count) - placement.bound[l]) <= rel * total
        assert placement.max_load[l] >= placement.bound[l] * (1 - rel), f"layer {l}: below its bound"
        if placement.allowed_peak is not None:
            assert placement.max_load[l] <= placement.allowed_peak[l] * (1 + rel), f"layer {l}: over the allowed peak"
    if placement.traffic is None:
        assert problem.stats.transitions is None or len(placement.layers) < 2
        return
    # Independently of ``traffic``: every pair of copies sharing a device (node) in consecutive layers,
    # found by a sorted join, adds T[i, j] / (copies_i x copies_j).
    def same(t, first, second, group) -> float:
        at, bt = first.device // group, second.device // group
        order = np.argsort(bt, kind="stable")
        low = np.searchsorted(bt[order], at, "left")
        count = np.searchsorted(bt[order], at, "right") - low
        a_copy = np.repeat(np.arange(len(at)), count)
        b_copy = order[np.repeat(low, count) + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)]
        i, j = first.expert[a_copy], second.expert[b_copy]
        ci, cj = np.bincount(first.expert), np.bincount(second.expert)
        return float((t[i, j] / (ci[i] * cj[j])).sum())

    total = cross_device = cross_node = 0.0
    for l in range(len(placement.layers) - 1):
        t = np.asarray(problem.stats.transitions[l], dtype=float)
        first, second = placement.layers[l], placement.layers[l + 1]
        total += float(t.sum())
        cross_device += float(t.sum()) - same(t, first, second, 1)
        cross_node += float(t.sum()) - same(t, first, second, problem.devices_per_node)
    got = placement.traffic
    for name, value, reported in (("moving", total, got.between_layers),
                                  ("cross-device", cross_device, got.cross_device),
                                  ("cross-node", cross_node, got.cross_node)):
        assert abs(value - reported) <= 1e-6 * max(total, 1.0), f"{name} tokens differ: {value} vs {reported}"


# --- the search ---------------------------------------------------------------------------------------

def place(problem: PlacementProblem, method: str = "affinity", time_limit: float = 30.0,
          progress: Callable[[int], None] | None = None) -> Placement:
    """Place every layer with ``method``: "affinity" (the lexicographic objective: load first, then
    locality under the allowed peak; CP-SAT proves the load on small layers), "greedy" (LPT with
    interchange), "lpt" (plain longest-first, the plan searches' fast estimate) or "round-robin".

    Deterministic: the same problem gives the same placement on any machine and under any load.
    ``time_limit`` is in deterministic seconds (``_Work``: elements processed and CP-SAT's
    deterministic time), never the wall clock; once the layers placed so far have used it, the
    remaining layers keep their load-first placement (``note`` says so). ``progress`` is called
    with the number of layers placed."""
    if method not in METHODS:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError("placement method", method, METHODS)
    started = time.perf_counter()
    work = _Work()
    stats, d_count, tol = problem.stats, problem.devices, problem.load_tolerance
    loads = np.asarray(stats.loads, dtype=float)
    layers: list[LayerPlacement] = []
    bounds, allowed, proven = [], [], []
    prev, stopped = None, None
    for layer in range(stats.layers):
        load = loads[layer]
        copies = water_fill(load, problem.replicas, d_count)
        bound = lower_bound(load, copies, d_count)
        bounds.append(bound)
        if method == "round-robin":
            placed = _round_robin(load, problem)
        else:
            expert, size = _copy_table(load, copies)
            device = _lpt(expert, size, problem)
            work.add(len(expert) * d_count, len(expert))
            in_budget = work.seconds <= time_limit
            if not in_budget and stopped is None:
                stopped = layer
            if method != "lpt":
                device = _lower_peak(expert, size, device, problem, work)
            if method == "affinity":
                peak = np.bincount(device, size, d_count).max()
                exact = peak <= bound * (1 + 1e-12)
                if not exact and in_budget and len(load) * d_count <= EXACT_PEAK_PAIRS:
                    budget = min(LAYER_SECONDS, time_limit / stats.layers)
                    found, exact = _exact_peak(expert, size, load, copies, problem, budget, device, work)
                    if np.bincount(found, size, d_count).max() < peak:
                        device, peak = found, np.bincount(found, size, d_count).max()
                cap = max(peak, (1 + tol) * bound)
                gain = _affinity_gain(stats, layer, prev, copies, problem)
                if gain is not None and in_budget:
                    device = _locality(expert, size, device, gain, cap, problem, work)
                allowed.append(cap)
                proven.append(exact)
            placed = LayerPlacement(expert, device, np.bincount(device, size, d_count))
        layers.append(placed)
        prev = placed
        if progress is not None:
            progress(layer + 1)
    max_load = np.array([p.device_load.max() for p in layers])
    status, note = "", ""
    if method == "affinity":
        # OPTIMAL only when the busiest device is proven on every layer and there is no traffic to
        # weigh: the crossing tokens are never proven (layer by layer, heuristic with several slots).
        traffic_to_weigh = stats.transitions is not None and stats.layers > 1
        status = "OPTIMAL" if all(proven) and not traffic_to_weigh else "FEASIBLE"
        if stopped is not None:
            note = (f"time limit {time_limit:g} s (deterministic) reached: layers {stopped} to {stats.layers - 1} "
                    "keep their load-first placement (no CP-SAT, no locality)")
    result = Placement(method=method, layers=tuple(layers), max_load=max_load,
                       mean_load=np.array([p.device_load.mean() for p in layers]), bound=np.array(bounds),
                       traffic=traffic(stats, layers, problem), status=status,
                       seconds=time.perf_counter() - started, load_tolerance=tol,
                       allowed_peak=np.array(allowed) if method == "affinity" else None,
                       peak_proven=np.array(proven, dtype=bool) if method == "affinity" else None, note=note,
                       work_s=work.seconds)
    return result


def imbalance_for_ep(stats: RoutingStats, ep: int, redundant_share: float = 0.0, balance: str = "eplb") -> float:
    """Largest over mean expert-parallel device load for an EP degree, averaged over layers: the
    statistics placed by EPLB with ``redundant_experts(E, ep, redundant_share)`` redundant experts
    (``perfmodel.eplb.routing_imbalance``), the one rule plan and estimate use in place of perfectly
    balanced routing."""
    from perfmodel.eplb import routing_imbalance

    return routing_imbalance(stats.loads, ep, redundant_share, balance)


def imbalance_table(stats: RoutingStats | None, eps, redundant_share: float = 0.0,
                    balance: str = "eplb") -> dict[int, float]:
    """Imbalance factor for each EP degree (1.0 for every degree when there are no statistics)."""
    return {int(e): (imbalance_for_ep(stats, int(e), redundant_share, balance) if stats is not None and e > 1 else 1.0)
            for e in sorted(set(np.asarray(eps).ravel().tolist()))}   # not np.unique: it imports numpy.ma


def layer_time(spec, machine, placement: Placement, devices: int) -> float:
    """Predicted seconds of all MoE layers under a placement (perfmodel.moe, as ``plan`` prices an MoE
    layer): the busiest device's experts and permutes, and the exchange of the tokens that leave
    their device, inside and across nodes, per device (none counted without transition counts)."""
    from perfmodel.moe import moe_layer_time

    serving = machine.for_serving()       # kernels at the serving fits' own rates, as plan serve prices them
    gaps = max(len(placement.layers) - 1, 1)
    across = (placement.cross_node_tokens or 0.0) / gaps / max(devices, 1)
    inside = max((placement.cross_device_tokens or 0.0) / gaps / max(devices, 1) - across, 0.0)
    total = 0.0
    for p in placement.layers:
        busiest = int(np.argmax(p.device_load))
        experts_there = int(np.count_nonzero(p.device == busiest))
        total += moe_layer_time(spec, serving, float(p.device_load[busiest]), float(np.mean(p.device_load)),
                                experts_there, inside, across, devices)
    return total
