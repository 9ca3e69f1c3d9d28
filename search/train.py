"""Exact search for the best training plan over a declared space, with its Pareto front and evidence.

1. For each candidate (system, device count), the lattice of parallel degrees, microbatch, ZeRO
   stage and its sharding (the group each state spans, hpZ, quantized collectives), recompute,
   sequence parallelism and precision (search.space) is evaluated in one
   vectorized call of the cost model, with every state in HBM.
2. Offload only helps a plan that does not fit HBM, and never makes a plan faster (it adds
   transfer time): so a memory-bound plan's HBM-only step time is a lower bound of any offloaded
   version. Plans whose bound beats the incumbent are solved, cheapest bound first, as one CP-SAT
   model: a multiple-choice knapsack placing optimizer states, gradients and parameters in HBM,
   DDR, CXL, pooled memory or NVMe under every tier's capacity, minimizing the added exposed time
   (branch and bound in search.offload: it stops once no remaining bound can beat the incumbent).
3. The choice among candidates under a budget and a power cap is a CP-SAT selection over each
   candidate's non-dominated plans.
The optimum is proven over the declared space; the reported gap is the integer rounding of times in
the CP-SAT models (microseconds), re-checked against the cost model.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.hardware_db.errors import InfeasibleError, SpecError
from perfmodel.hardware_db.loader import Database
from perfmodel.hardware_db.schema import PRECISIONS
from perfmodel.machine import Machine, build_machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import CP_COMMS, DISPATCHERS, INTERLEAVED, PLACES, RECOMPUTE
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training, screen_training

from .pareto import pareto_front
from .rows import METRICS, TrainRow
from .offload import PARTS, activation_offload_rows, offload_branch_and_bound, rows_of
from .options import SearchOptions
from .space import LEFT_OUT, PLAN_FIELDS, RULES, build_space, declared_size
from .vocabulary import TRAIN_OBJECTIVES as OBJECTIVES

DAY = 86400.0  # seconds


@dataclass(frozen=True)
class Evidence:
    declared_space: int
    evaluated: int
    feasible: int
    feasible_with_offload: int
    infeasible_by_constraint: dict[str, int]
    solver: str
    status: str
    gap: float
    seconds: float
    cpsat_models: int = 0
    rules: tuple[str, ...] = RULES
    left_out: tuple[str, ...] = LEFT_OUT      # what the declared space does not hold
    check: tuple[str, ...] = ()                      # what the independent check found (empty: nothing)
    dimensions: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class PlanTable:
    """Feasible plans of all candidates as columns (one row per plan)."""

    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["step_time_s"]) if self.columns else 0

    def row(self, i: int) -> dict:
        return {k: v.item(i) for k, v in self.columns.items()}

    def take(self, idx) -> "PlanTable":
        return PlanTable({k: v[idx] for k, v in self.columns.items()})

    @staticmethod
    def concat(tables: list["PlanTable"]) -> "PlanTable":
        tables = [t for t in tables if len(t)]
        if not tables:
            return PlanTable({})
        return PlanTable({k: np.concatenate([t.columns[k] for t in tables]) for k in tables[0].columns})


@dataclass(frozen=True)
class SearchResult:
    best: TrainRow | None
    top: list[TrainRow]
    pareto: list[TrainRow]
    evidence: Evidence
    closest: dict | None = None         # when nothing is feasible: the plan that misses by least
    machines: dict[tuple[str, int], Machine] = field(default_factory=dict)
    ties: list[TrainRow] = field(default_factory=list)   # plans whose predicted range overlaps the best's
    tie_count: int = 0
    limits: dict | None = None          # when plans fit but the budget or power cap excludes all
    recommended: TrainRow | None = None   # the plan RECOMMENDATION picks near the optimum, with ``runs_on``
    per_system: list[TrainRow] = field(default_factory=list)   # each candidate system's best plan, best first
    near_count: int = 0                 # plans whose prediction lies within the optimum's range (the optimum too)


def _objective(table: PlanTable, objective: str) -> np.ndarray:
    c = table.columns
    if objective == "time":
        return c["step_time_s"]
    # Cost and energy break exact ties (a run costs the same on 8 or 64 devices when it scales
    # perfectly) by the faster step: a relative nudge of at most 1e-9, below any real difference.
    faster = 1.0 + 1e-9 * c["step_time_s"] / max(float(c["step_time_s"].max()), 1e-300)
    if objective == "cost":
        return faster * np.nan_to_num(c["run_cost_usd"] if np.any(c["run_cost_usd"] > 0)
                                      else c["cost_per_million_tokens_usd"], nan=np.inf)
    if objective == "energy":
        return faster * c["energy_per_token_j"]
    return c["devices"] + c["step_time_s"] / (1.0 + c["step_time_s"].max())  # fewest devices, then fastest


def _table(result, cols: dict[str, np.ndarray], mask, candidate: int, machine: Machine) -> PlanTable:
    idx = np.flatnonzero(mask)
    out = {k: np.broadcast_to(cols[k], mask.shape)[idx] for k in PLAN_FIELDS}
    for name, value in (("step_time_s", result.step_time_s), ("tokens_per_s", result.tokens_per_s),
                        ("mfu", result.mfu), ("hbm_used_bytes", result.hbm_used_bytes),
                        ("power_w", result.power_w), ("energy_per_token_j", result.energy_per_token_j),
                        ("cost_per_million_tokens_usd", result.cost_per_million_tokens_usd),
                        ("run_cost_usd", result.run_cost_usd), ("run_time_s", result.run_time_s),
                        ("step_time_low_s", result.step_time_low_s), ("step_time_high_s", result.step_time_high_s)):
        out[name] = np.broadcast_to(value, mask.shape)[idx].astype(float)
    out["hbm_fill"] = out["hbm_used_bytes"] / machine.hbm_bytes
    out["candidate"] = np.full(len(idx), candidate)
    out["devices"] = np.full(len(idx), machine.devices)
    return PlanTable(out)


def _constraints(table: PlanTable, options: SearchOptions) -> np.ndarray:
    """Per-row mask of the user's limits on the whole run (budget, power cap, deadline)."""
    c = table.columns
    ok = np.ones(len(table), dtype=bool)
    if options.budget_usd is not None:
        ok &= np.nan_to_num(c["run_cost_usd"], nan=np.inf) <= options.budget_usd
    if options.power_cap_w is not None:
        ok &= c["power_w"] * c["devices"] <= options.power_cap_w
    if options.deadline_s is not None:
        ok &= c["run_time_s"] <= options.deadline_s
    return ok


@dataclass
class _Candidate:
    """What the lattice evaluation of one (system, devices) candidate leaves for the rest."""

    machine: Machine
    table: PlanTable
    declared: dict[str, int]
    evaluated: int = 0
    feasible: int = 0
    offloaded: int = 0
    closest: dict | None = None
    cpsat_models: int = 0
    unresolved: float = np.inf       # smallest offload bound (step time, s) no sub-solve settled


def _evaluate_candidate(spec, db, system, devices, work, options, counter: Counter, progress, k: int) -> _Candidate:
    """Evaluate one candidate's lattice, then add the offloaded plans that can beat its incumbent."""
    machine = build_machine(db, system, devices, options.pricing, options.prices)
    cols, declared = build_space(spec, machine, work, options.space)
    if not cols:
        counter["no valid parallel layout (divisibility rules)"] += 1
        return _Candidate(machine, PlanTable({}), declared)
    n = len(cols["tp"])
    if options.routing is not None and spec.moe:
        from .placement import imbalance_table   # with routing only: placement loads more

        table = imbalance_table(options.routing, cols["ep"])
        cols["moe_imbalance"] = np.vectorize(table.get, otypes=[float])(cols["ep"])
    # Memory and the rules first, on every plan; the step time only of the plans that fit.
    screen = screen_training(spec, machine, TrainPlan(**cols), work, options.threads)
    over_headroom = screen.feasible & (screen.hbm_used_bytes > machine.hbm_bytes * (1 - options.memory_headroom))
    feasible = np.flatnonzero(screen.feasible & ~over_headroom)
    fitting = rows_of(cols, feasible)
    plans = PlanTable({}) if not len(feasible) else _table(
        estimate_training(spec, machine, TrainPlan(**fitting), work, detail=False, threads=options.threads), fitting,
        np.ones(len(feasible), dtype=bool), k, machine)
    if progress:
        progress(n)
    _count_broken(counter, screen)
    if options.memory_headroom:
        counter["memory headroom"] += int(over_headroom.sum())
    out = _Candidate(machine, plans, declared, n, len(feasible))
    memory_bound = np.flatnonzero(_breaks(screen, "hbm"))
    if len(memory_bound):
        j = memory_bound[int(np.argmin(screen.shortfall[memory_bound]))]
        out.closest = {**{f: np.asarray(cols[f])[j].item() for f in PLAN_FIELDS}, "system": machine.system.name,
                       "devices": devices, "hbm_over_bytes": float(screen.shortfall[j]),
                       "hbm_bytes": machine.hbm_bytes}
    kinds = {t.kind for t in machine.memory_tiers}
    places = ["hbm"] + [p for p in PLACES[1:] if p in options.space.offload_places
                        and all(k in kinds for k in INTERLEAVED.get(p, (p,)))]
    if options.offload and (options.space.activation_offload_when == "always" or not len(feasible)):
        cols, memory_bound = _swap_activations(spec, machine, work, cols, screen, over_headroom, memory_bound, out,
                                               options, k)
    if options.offload and len(places) > 1 and len(memory_bound):
        rows, models, out.unresolved = offload_branch_and_bound(spec, machine, work, cols, memory_bound, places,
                                                                 out.table, options)
        out.cpsat_models = models
        if rows:
            stacked = {f: np.array([r[f] for r in rows]) for f in PLAN_FIELDS}
            checked = estimate_training(spec, machine, TrainPlan(**stacked), work, detail=False,
                                        threads=options.threads)
            out.offloaded = int(checked.feasible.sum())
            out.table = PlanTable.concat([out.table, _table(checked, stacked, checked.feasible, k, machine)])
    return out


def _swap_activations(spec, machine, work, cols, screen, over_headroom, memory_bound, out: _Candidate, options,
                      k: int) -> tuple[dict, np.ndarray]:
    """The plans memory binds (HBM, or the headroom), and those recomputing whole layers, with part of
    their activations swapped to host memory
    (search.offload.activation_offload_rows): those that fit and, for the time objective, beat the
    incumbent join the candidate's table; those HBM still binds join ``memory_bound``, for the states'
    offload. Returns the lattice's columns with the swapping plans appended, and the memory-bound rows."""
    time_objective = options.objective == "time"
    incumbent = float(out.table.columns["step_time_s"].min()) if len(out.table) and time_objective else np.inf
    # Memory-bound plans, and fitting ones that recompute whole layers: swapping tokens spares their
    # recomputation, so those may get faster (every other swap only adds time to a plan that fits).
    full = np.asarray(cols["recompute"]) == RECOMPUTE.index("full")
    rows = np.flatnonzero(_breaks(screen, "hbm") | over_headroom | (screen.feasible & full))
    extra = activation_offload_rows(spec, machine, work, cols, rows, incumbent, options)
    if extra is None:
        return cols, memory_bound
    swapping, swap_screen = extra
    cap = machine.hbm_bytes * (1 - options.memory_headroom)
    fit = np.flatnonzero(swap_screen.feasible & (swap_screen.hbm_used_bytes <= cap))
    if len(fit):
        fitting = rows_of(swapping, fit)
        result = estimate_training(spec, machine, TrainPlan(**fitting), work, detail=False, threads=options.threads)
        better = result.step_time_s < incumbent
        if np.any(better):
            out.offloaded += int(better.sum())
            out.table = PlanTable.concat([out.table, _table(result, fitting, better, k, machine)])
    still = np.flatnonzero(_breaks(swap_screen, "hbm"))
    if not len(still):
        return cols, memory_bound
    n = len(cols["tp"])
    joined = {f: np.concatenate([np.broadcast_to(cols[f], (n,)), swapping[f][still]]) for f in PLAN_FIELDS}
    return joined, np.concatenate([memory_bound, n + np.arange(len(still))])


def _count_broken(counter: Counter, screen) -> None:
    """Add to ``counter`` the plans that break each rule, by the first rule each breaks (the
    screen's codes counted, not its names compared row by row)."""
    for code, plans in enumerate(np.bincount(np.ravel(screen.binding_code))):
        if code and plans:
            counter[screen.constraint_names[code - 1]] += int(plans)


def _breaks(screen, rule: str) -> np.ndarray:
    """Per plan, whether ``rule`` is the first rule it breaks (``screen.binding == rule``, by code)."""
    return np.array([False] + [name == rule for name in screen.constraint_names])[screen.binding_code]


def search_training(spec: TransformerSpec, db: Database, candidates: list[tuple[str, int]], work: TrainWorkload,
                    options: SearchOptions = SearchOptions(),
                    progress: Callable[[int], None] | None = None) -> SearchResult:
    """The optimal plan, the top plans, the Pareto front and the evidence, over all candidates."""
    if options.objective not in OBJECTIVES:
        from perfmodel.hardware_db.errors import UnknownNameError

        raise UnknownNameError("objective", options.objective, OBJECTIVES)
    if options.budget_usd is not None and not work.tokens:
        raise SpecError("--budget needs --tokens (the budget caps the cost of the whole run)")
    if options.deadline_s is not None and not work.tokens:
        raise SpecError("--deadline needs --tokens (the deadline caps the time of the whole run)")
    if not 0 <= options.memory_headroom < 1:
        raise SpecError(f"--memory-headroom needs a fraction in [0, 1), has {options.memory_headroom}")
    # Names as the database spells them (lookups are case-insensitive; results are keyed by these).
    candidates = [(db.system(system).name, devices) for system, devices in candidates]
    started = time.perf_counter()
    counter: Counter = Counter()
    outcomes = [_evaluate_candidate(spec, db, system, devices, work, options, counter, progress, k)
                for k, (system, devices) in enumerate(candidates)]
    everything = PlanTable.concat([o.table for o in outcomes])
    limits = None
    if len(everything):
        allowed = _constraints(everything, options)
        counter[LIMITS] += int((~allowed).sum())
        if not allowed.any():
            c = everything.columns
            limits = {"run_cost_usd": float(np.nanmin(c["run_cost_usd"])) if np.isfinite(c["run_cost_usd"]).any()
                      else None, "power_w": float(np.min(c["power_w"] * c["devices"])),
                      "run_time_s": float(np.min(c["run_time_s"]))}
        everything = everything.take(np.flatnonzero(allowed))
        if not counter[LIMITS]:
            del counter[LIMITS]
    evidence = Evidence(
        declared_space=sum(declared_size(o.declared) for o in outcomes),
        evaluated=sum(o.evaluated for o in outcomes), feasible=sum(o.feasible for o in outcomes),
        feasible_with_offload=sum(o.offloaded for o in outcomes),
        infeasible_by_constraint=dict(sorted(counter.items())),
        solver="exhaustive vectorized enumeration of the lattice (memory and the rules on every plan, the step "
               "time on those that fit); CP-SAT branch and bound over offload placements, bounded by each plan's "
               "compute; CP-SAT selection among candidates",
        status="OPTIMAL" if len(everything) else "INFEASIBLE", gap=0.0, seconds=0.0,
        cpsat_models=sum(o.cpsat_models for o in outcomes),
        dimensions={f"{o.machine.system.name} x {o.machine.devices}": o.declared for o in outcomes})
    machines = {(o.machine.system.name, o.machine.devices): o.machine for o in outcomes}
    if not len(everything):
        closest = min((o.closest for o in outcomes if o.closest), key=lambda c: c["hbm_over_bytes"], default=None)
        evidence = replace(evidence, seconds=time.perf_counter() - started)
        return SearchResult(None, [], [], evidence, closest=closest, machines=machines, limits=limits)
    objective = _objective(everything, options.objective)
    best_i = _select(everything, objective)
    order = np.argsort(objective, kind="stable")[: options.top]
    # A plan without a price cannot be shown cheaper than one with a price: unknown cost is worst.
    front = pareto_front(np.stack([everything.columns["step_time_s"],
                                   np.nan_to_num(everything.columns["cost_per_million_tokens_usd"], nan=np.inf),
                                   everything.columns["energy_per_token_j"]], axis=1))
    front = front[np.argsort(everything.columns["step_time_s"][front], kind="stable")]
    ties = _ties(everything, objective, best_i, options.objective)
    status, gap = _proof(outcomes, everything, best_i, options.objective)
    describe = lambda i: _describe(everything.row(int(i)), candidates)  # noqa: E731
    near = _near(everything, objective, best_i)
    result = SearchResult(best=describe(best_i), top=[describe(i) for i in order], pareto=[describe(i) for i in front],
                          evidence=replace(evidence, status=status, gap=gap), machines=machines,
                          ties=[describe(i) for i in ties[:TIES_SHOWN]], tie_count=len(ties),
                          recommended=None if options.recommend_on is None else _recommend(
                              spec, work, machines, everything, objective, near, describe, options.recommend_on),
                          per_system=[describe(i) for i in _best_per_system(everything, objective, candidates)],
                          near_count=len(near))
    problems = check_plans(spec, result, work, options)
    if problems:
        status, gap = "FEASIBLE", None
    return replace(result, evidence=replace(result.evidence, status=status, gap=gap, check=tuple(problems),
                                            seconds=time.perf_counter() - started))


def _proof(outcomes, table: PlanTable, best: int, objective: str) -> tuple[str, float]:
    """(status, gap) of the whole search: OPTIMAL only when every offload sub-solve settled its
    plans; otherwise FEASIBLE, with the gap to the smallest unsettled bound (time objective) or
    unknown (None) for the others."""
    unresolved = min((o.unresolved for o in outcomes), default=np.inf)
    step = float(table.columns["step_time_s"][best])
    if not np.isfinite(unresolved) or (objective == "time" and unresolved >= step):
        return "OPTIMAL", 0.0
    return "FEASIBLE", (step - unresolved) / step if objective == "time" else None


def check_plans(spec: TransformerSpec, result: "SearchResult", work: TrainWorkload, options: SearchOptions) -> list[str]:
    """The independent check of a search's answer: every listed plan (best, top, Pareto front,
    ties) is re-evaluated from its own description alone, as ``perfmodel estimate train`` would
    (the listed plans of one machine in one vectorized call: rows never interact); it must be
    feasible, within the limits, give the same step time, and no listed plan may beat the best on
    the objective. Returns what is wrong."""
    problems = []
    value = {"time": lambda p: p.step_time_s, "cost": lambda p: p.run_cost_usd or np.inf,
             "energy": lambda p: p.energy_per_token_j,
             "devices": lambda p: p.devices + p.step_time_s * 1e-9}[options.objective]
    listed = dict.fromkeys(replace(p, runs_on=None)   # each row once
                           for p in [result.best] + result.top + result.pareto + result.ties
                           + ([result.recommended] if result.recommended else []))
    by_machine: dict[tuple[str, int], list[TrainRow]] = {}
    for p in listed:
        by_machine.setdefault((p.system, p.devices), []).append(p)
    for key, rows in by_machine.items():
        plan = TrainPlan(**{k: np.array([getattr(p.plan, k) for p in rows]) for k in PLAN_FIELDS})
        again = estimate_training(spec, result.machines[key], plan, work, detail=False)
        for i, p in enumerate(rows):
            label = f"{p.system} x {p.devices} {p.plan_dict()}"
            if not bool(again.feasible[i]):
                problems.append(f"{label} is infeasible when evaluated alone ({again.binding[i]})")
            elif abs(float(again.step_time_s[i]) - p.step_time_s) > 1e-9 * p.step_time_s:
                problems.append(f"{label} takes {float(again.step_time_s[i]):.6g} s alone, listed "
                                f"{p.step_time_s:.6g} s")
            if options.budget_usd is not None and (p.run_cost_usd is None or p.run_cost_usd > options.budget_usd):
                problems.append(f"{label} is over the budget")
            if options.power_cap_w is not None and p.power_w * p.devices > options.power_cap_w * (1 + 1e-9):
                problems.append(f"{label} is over the power cap")
            if value(p) < value(result.best) * (1 - 1e-12):
                problems.append(f"{label} beats the reported best on {options.objective}")
    return problems


TIES_SHOWN = 10
# Near plans exported, in RECOMMENDATION's order, for one a framework runs as written (each costs one
# export per framework).
RUNNABLE_SCAN = 200
LIMITS = "budget, power cap or deadline"


# The recommendation among plans the model cannot tell apart (README, "Which plan plan train recommends").
RECOMMENDATION = ("among the plans whose predicted step lies within the optimum's range: one that a framework runs "
                  "as written, then one without offload, then the fewest model-parallel dimensions (tp, pp, cp, ep "
                  "above 1; data parallelism is free), then the faster")
PARALLEL_DIMENSIONS = ("tp", "pp", "cp", "ep")


def _best_per_system(table: PlanTable, objective: np.ndarray, candidates) -> list[int]:
    """Each candidate system's best plan on the objective (over its device counts), best first."""
    system = np.array([candidates[int(c)][0] for c in table.columns["candidate"]])
    firsts = [int(np.flatnonzero(system == s)[np.argmin(objective[system == s])]) for s in dict.fromkeys(system)]
    return sorted(firsts, key=lambda i: objective[i])


def _near(table: PlanTable, objective: np.ndarray, best: int) -> np.ndarray:
    """The plans (the optimum among them) whose objective's prediction lies within the optimum's
    range: the step's upper bound taken as a ratio of the objective, as ``_ties`` does."""
    c = table.columns
    high = objective[best] * c["step_time_high_s"][best] / max(float(c["step_time_s"][best]), 1e-30)
    return np.flatnonzero((objective <= high) & np.isfinite(objective))


def _recommend(spec: TransformerSpec, work: TrainWorkload, machines: dict, table: PlanTable, objective: np.ndarray,
               near: np.ndarray, describe: Callable[[int], TrainRow], frameworks: tuple[str, ...]) -> TrainRow:
    """The plan RECOMMENDATION picks among ``near``, with the frameworks of ``frameworks`` that run it
    (``runs_on``). Plans are ranked by the rule's later criteria first (vectorized), then the first
    RUNNABLE_SCAN of them exported until one runs; when none does, the optimum, with ``runs_on`` empty."""
    from perfmodel.exports import training_frameworks

    c = table.columns
    offloaded = sum(c[k] != PLACES.index("hbm") for k, _ in PARTS) + (c["activation_offload"] > 0)
    dimensions = sum(c[k] > 1 for k in PARALLEL_DIMENSIONS)
    ranked = near[np.lexsort((objective[near], dimensions[near], offloaded[near] > 0))]
    for i in ranked[:RUNNABLE_SCAN]:
        row = describe(i)
        runs = training_frameworks(spec, machines[(row.system, row.devices)], row.plan, work, spec.name, frameworks)
        on = tuple(name for name, why in runs.items() if why is None)
        if on:
            return replace(row, runs_on=on)
    return replace(describe(near[np.argmin(objective[near])]), runs_on=())


def _ties(table: PlanTable, objective: np.ndarray, best: int, name: str) -> np.ndarray:
    """Plans other than the best whose objective's prediction interval overlaps the best's, by
    objective. Time, cost and energy per token scale with the step time, so each takes the step's
    interval as a ratio; the fewest-devices objective has no ties (a device count is exact)."""
    if name == "devices":
        return np.zeros(0, dtype=int)
    c = table.columns
    step = np.maximum(c["step_time_s"], 1e-30)
    low, high = objective * c["step_time_low_s"] / step, objective * c["step_time_high_s"] / step
    tied = np.flatnonzero((low <= high[best]) & np.isfinite(objective))
    tied = tied[tied != best]
    return tied[np.argsort(objective[tied], kind="stable")]


def _select(table: PlanTable, objective: np.ndarray) -> int:
    """The optimum: argmin of the objective, chosen by CP-SAT over each candidate's best plan.

    Equal to a plain argmin (tests check it); the CP-SAT model is where fleet-level constraints
    join in. Plans whose objective is unknown (a cost without a price) cannot be chosen.
    """
    cand = table.columns["candidate"]
    firsts = [int(np.flatnonzero(cand == c)[np.argmin(objective[cand == c])])
              for c in sorted(set(cand.tolist()))]   # not np.unique: it imports numpy.ma
    firsts = [i for i in firsts if np.isfinite(objective[i])]
    if not firsts:
        raise SpecError("no candidate has a price on this basis, so no cost can be minimized; give --price "
                        "SYSTEM=USD_PER_DEVICE_HOUR, or --pricing owned, or use --objective time")
    if len(firsts) == 1:
        return firsts[0]
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    pick = [model.NewBoolVar(f"c{i}") for i in firsts]
    model.AddExactlyOne(pick)
    scale = 1e12 / max(float(np.max(np.abs(objective[firsts]))), 1e-300)   # resolves the 1e-9 tie-breaks
    model.Minimize(sum(int(round(objective[i] * scale)) * v for i, v in zip(firsts, pick)))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.Solve(model)
    return next(i for i, v in zip(firsts, pick) if solver.Value(v))


def _describe(row: dict, candidates) -> TrainRow:
    """A PlanTable row (codes and numpy scalars) as a TrainRow (names, Python values, None for unknown)."""
    system, _ = candidates[int(row["candidate"])]
    plan = {k: row[k] for k in PLAN_FIELDS}
    plan["recompute"] = RECOMPUTE[int(plan["recompute"])]
    plan["precision"] = PRECISIONS[int(plan["precision"])]
    plan["cp_comm"] = CP_COMMS[int(plan["cp_comm"])]
    plan["dispatcher"] = DISPATCHERS[int(plan["dispatcher"])]
    for key in ("sp", "tp_overlap", "ep_overlap", "ends_as_layers"):
        plan[key] = bool(plan[key])
    plan["qwz"], plan["qgz"] = bool(plan["qwz"]), bool(plan["qgz"])
    plan["moe_imbalance"] = float(plan["moe_imbalance"])
    plan["activation_offload"] = float(plan["activation_offload"])
    for key in ("optimizer_place", "grad_place", "param_place"):
        plan[key] = PLACES[int(plan[key])]
    metrics = {k: float(row[k]) for k in METRICS}
    # Unknown values (a cost without a price) are None, never NaN.
    return TrainRow(system=system, devices=int(row["devices"]), plan=TrainPlan(**plan),
                    **{k: (v if np.isfinite(v) else None) for k, v in metrics.items()})


def raise_if_infeasible(result: SearchResult, options: SearchOptions | None = None) -> None:
    """Exit 3 with the closest plan and what it lacks."""
    if result.best is not None:
        return
    if result.limits is not None:
        raise InfeasibleError(_limit_message(result.limits, options))
    counts = ", ".join(f"{k}: {v:,}" for k, v in sorted(result.evidence.infeasible_by_constraint.items(),
                                                        key=lambda kv: -kv[1])[:3])
    if result.closest:
        c = result.closest
        lacks = (f"closest: tp {c['tp']}, pp {c['pp']}, dp {c['dp']}, cp {c['cp']}, ep {c['ep']}, zero {c['zero']}, "
                 f"recompute {RECOMPUTE[int(c['recompute'])]} on {c['devices']} x {c['system']} needs "
                 f"{(c['hbm_bytes'] + c['hbm_over_bytes']) / 1e9:,.1f} GB of HBM per device, has "
                 f"{c['hbm_bytes'] / 1e9:,.1f} GB")
    else:
        lacks = "no plan passes the layout rules; try other device counts or batch sizes"
    raise InfeasibleError(f"no feasible plan among {result.evidence.evaluated:,} evaluated ({counts}); {lacks}")


def _limit_message(limits: dict, options: SearchOptions | None) -> str:
    """Plans fit, but the budget or the power cap excludes all: name it, with what would relax it."""
    parts = []
    cost, power = limits["run_cost_usd"], limits["power_w"]
    if options is not None and options.budget_usd is not None and (cost is None or cost > options.budget_usd):
        parts.append("no plan has a price" if cost is None else
                     f"the budget binds: the cheapest feasible plan costs ${cost:,.0f} for the run, the budget is "
                     f"${options.budget_usd:,.0f}; raise --budget to at least ${cost:,.0f}")
    if options is not None and options.power_cap_w is not None and power > options.power_cap_w:
        parts.append(f"the power cap binds: the lowest-power feasible plan draws {power / 1e3:,.1f} kW, the cap is "
                     f"{options.power_cap_w / 1e3:,.1f} kW; raise --power-cap-kw to at least {power / 1e3:,.1f}")
    days = limits["run_time_s"] / DAY
    if options is not None and options.deadline_s is not None and days > options.deadline_s / DAY:
        parts.append(f"the deadline binds: the fastest feasible plan runs {days:,.1f} days, the deadline is "
                     f"{options.deadline_s / DAY:,.1f}; raise --deadline to at least {math.ceil(days * 10) / 10:,.1f} "
                     "or allow more devices")
    return "no plan within the limits; " + "; ".join(parts or ["the budget, power cap and deadline together bind"])
