"""Offloaded training plans by branch and bound (search.train, step 2).

Offload only helps a plan that does not fit HBM, and never makes a plan faster (it adds transfer
time): so a memory-bound plan's HBM-only step time is a lower bound of any offloaded version. Plans
whose bound beats the incumbent are solved, cheapest bound first, as CP-SAT models: a multiple-choice
knapsack placing optimizer states, gradients and parameters in HBM, DDR, CXL, pooled memory or NVMe
under every tier's capacity, minimizing the added exposed time.
"""

from __future__ import annotations

import itertools

import numpy as np

from perfmodel.machine import Machine
from perfmodel.plan import INTERLEAVED, PLACES, TIERS
from perfmodel.training import TrainPlan, estimate_training, screen_training, step_time_floor
from perfmodel.training_memory import interleave_share

from .space import PLAN_FIELDS, SpaceOptions

PARTS = (("optimizer_place", "optimizer states"), ("grad_place", "gradients"), ("param_place", "weights"))
OPTIMIZER, GRADIENTS = 0, 1  # their indices in PARTS
US = 1e6  # CP-SAT works in integer microseconds


def _framework_limits(delta, zero, places, space: SpaceOptions) -> None:
    """Moves a framework cannot make (``SpaceOptions.offload_parts`` / ``offload_zero``) become no option."""
    if space.offload_parts is not None:
        allowed = dict(space.offload_parts)
        for p, (field_name, _) in enumerate(PARTS):
            for t, place in enumerate(places):
                if place != "hbm" and place not in allowed.get(field_name, ()):
                    delta[:, p, t] = np.inf
    delta[~np.isin(zero, space.offload_zero), :, 1:] = np.inf


def _offload_costs(spec, machine, work, cols, rows, places, space: SpaceOptions = SpaceOptions(),
                   threads: int | None = None):
    """Added step time (s) and bytes of each part for each tier, for the given lattice rows.

    Evaluated with the cost model itself: one part moved at a time (the model's offload terms are
    additive: optimizer step, gradient transfer and parameter streaming are separate terms).
    Gradients only move with the optimizer states (the validity rule), so theirs is the time
    added by moving both over moving the optimizer states alone.
    """
    base_cols = {k: np.asarray(cols[k])[rows] for k in PLAN_FIELDS}
    n = len(rows)
    # The plans as they are, then each (part, tier) move, stacked into one vectorized evaluation.
    moves = [(p, t) for p in range(len(PARTS)) for t, place in enumerate(places) if place != "hbm"]
    stacked = {k: np.tile(np.broadcast_to(v, (n,)), len(moves) + 1) for k, v in base_cols.items()}
    for m, (p, t) in enumerate(moves, start=1):
        moved = slice(m * n, (m + 1) * n)
        stacked[PARTS[p][0]][moved] = PLACES.index(places[t])
        if p == GRADIENTS:
            stacked["optimizer_place"][moved] = PLACES.index(places[t])
    every = estimate_training(spec, machine, TrainPlan(**stacked), work, detail=False, threads=threads)
    base_time = every.step_time_s[:n]
    delta = np.zeros((n, len(PARTS), len(places)))
    for m, (p, t) in enumerate(moves, start=1):
        moved = slice(m * n, (m + 1) * n)
        # A move the rules forbid (e.g. gradient offload below ZeRO-2) is no option; capacity
        # (HBM and the tiers) is the knapsack's to decide.
        allowed = np.isin(every.binding[moved], ("", "hbm") + TIERS)
        added = every.step_time_s[moved] - base_time - (delta[:, OPTIMIZER, t] if p == GRADIENTS else 0.0)
        delta[:, p, t] = np.where(allowed & np.isfinite(added), added, np.inf)
    _framework_limits(delta, base_cols["zero"], places, space)
    part_bytes = np.stack([np.broadcast_to(every.memory[name], (len(stacked["tp"]),))[:n] for _, name in PARTS],
                          axis=1)
    fixed = every.hbm_used_bytes[:n] - part_bytes.sum(axis=1)     # activations + reserve
    # What each tier already holds with every state in HBM: the activations a plan swaps to DDR.
    held = {kind: np.broadcast_to(every.tier_bytes[kind], (len(stacked["tp"]),))[:n] for kind in TIERS}
    return base_time, delta, part_bytes, fixed, held


def _solve_offload(base_time, delta, part_bytes, fixed, hbm_cap, tier_caps, incumbent, exclude=(), held=None):
    """One CP-SAT model: pick one plan and a place for each of its parts, minimizing step time
    below ``incumbent``; ``tier_caps`` is [(kind, capacity, share of each place's bytes it holds)] per
    memory kind (an interleaved place puts a share in each of its kinds); ``exclude`` lists
    (plan, places) choices already evaluated; ``held``: bytes each plan already keeps in each kind
    (swapped activations), which its parts share the capacity with."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    n, parts, tiers = delta.shape
    choose = [model.NewBoolVar(f"plan{i}") for i in range(n)]
    model.AddExactlyOne(choose)
    x = {}
    objective = []
    for i in range(n):
        objective.append(int(round(base_time[i] * US)) * choose[i])
        hbm_terms = []
        for p in range(parts):
            options = []
            for t in range(tiers):
                if t > 0 and not np.isfinite(delta[i, p, t]):
                    continue
                x[i, p, t] = model.NewBoolVar(f"x{i}_{p}_{t}")
                options.append(x[i, p, t])
                if t > 0:
                    objective.append(int(round(max(delta[i, p, t], 0.0) * US)) * x[i, p, t])
                else:
                    hbm_terms.append(int(part_bytes[i, p] // 1024) * x[i, p, t])
            model.Add(sum(options) == 1).OnlyEnforceIf(choose[i])
            model.Add(sum(options) == 0).OnlyEnforceIf(choose[i].Not())
        room = int((hbm_cap - fixed[i]) // 1024)
        model.Add(sum(hbm_terms) <= max(room, -1)).OnlyEnforceIf(choose[i])
    for (i, p, t), chosen in x.items():  # gradients leave HBM only with the optimizer states, to their tier
        if p == GRADIENTS and t > 0:
            model.Add(chosen <= x.get((i, OPTIMIZER, t), 0))
    for kind, capacity, share in tier_caps:  # each memory kind's capacity (KiB), its share of each place's bytes
        terms = [int(part_bytes[i, p] * share[t] // 1024 + 1) * x[i, p, t]
                 for i in range(n) for p in range(parts) for t in range(1, tiers) if share[t] > 0 and (i, p, t) in x]
        if terms and held is not None:
            terms += [int(held[kind][i] // 1024 + 1) * choose[i] for i in range(n) if held[kind][i] > 0]
        if terms:
            model.Add(sum(terms) <= int(capacity // 1024))
    for i, tiers_of in exclude:
        model.AddBoolOr([choose[i].Not()] + [x[i, p, t].Not() for p, t in enumerate(tiers_of)])
    model.Minimize(sum(objective))
    if np.isfinite(incumbent):
        model.Add(sum(objective) <= int(incumbent * US) - 1)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = 30.0  # reproducible, unlike wall-clock limits
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, solver.StatusName(status)
    i = next(i for i in range(n) if solver.Value(choose[i]))
    assignment = [next(t for t in range(tiers) if (i, p, t) in x and solver.Value(x[i, p, t])) for p in range(parts)]
    return (i, assignment, solver.ObjectiveValue() / US, solver.BestObjectiveBound() / US), solver.StatusName(status)


def _kind_capacities(machine: Machine, places: list[str]) -> list[tuple[float, list[float]]]:
    """(capacity per device, share of each place's bytes held) of every memory kind a place uses."""
    out = []
    for kind in TIERS:
        share = [1.0 if place == kind else interleave_share(machine, kind) if place in INTERLEAVED else 0.0
                 for place in places]
        share[0] = 0.0
        if any(share):
            out.append((kind, sum(t.bytes_per_device for t in machine.memory_tiers if t.kind == kind), share))
    return out


def _relaxed_bound(base_time, delta, part_bytes, fixed, hbm_cap):
    """Lower bound of each row's best offloaded time: the tiers' capacities relaxed.

    For every subset of parts moved off HBM that leaves the rest fitting in HBM, each moved part
    takes its cheapest tier; the smallest such total is a bound the knapsack can only raise.
    """
    cheapest = np.min(np.where(np.isfinite(delta[:, :, 1:]), delta[:, :, 1:], np.inf), axis=2)  # rows x parts
    bound = np.full(len(base_time), np.inf)
    for moved in itertools.product((False, True), repeat=delta.shape[1]):
        moved = np.array(moved)
        fits = fixed + part_bytes[:, ~moved].sum(axis=1) <= hbm_cap
        cost = cheapest[:, moved].sum(axis=1)
        bound = np.where(fits, np.minimum(bound, base_time + cost), bound)
    return bound


def rows_of(cols: dict, idx: np.ndarray) -> dict:
    """The lattice's rows ``idx`` (every plan field, scalars broadcast)."""
    n = len(cols["tp"])
    return {k: np.broadcast_to(v, (n,))[idx] if np.ndim(v) else v for k, v in cols.items()}


def offload_branch_and_bound(spec, machine, work, cols, memory_bound, places, table, options):
    """Offloaded versions of memory-bound plans that can beat the incumbent, smallest bound first.

    Each part's added time in each tier is evaluated for every memory-bound plan at once. Moved
    together, parts can take longer than the sum of their added times (transfers that share a
    compute window queue on it), never shorter: so the sum is a lower bound, and the CP-SAT
    objective and the capacity-relaxed bound are bounds, not values. The relaxed bound orders the
    plans, 128 per CP-SAT model; each choice the model returns is evaluated by the cost model, its
    true time becomes the incumbent, and the choice is excluded and the model solved again until
    no choice's bound beats the incumbent (for the time objective; for the others every plan with
    a finite bound is a candidate, 4,096 at most).

    Returns (rows, CP-SAT models solved, unresolved): the smallest bound no sub-solve settled
    (inf when every one ended OPTIMAL or proved nothing better exists), so that the search reports
    the worst status of its sub-solves, never OPTIMAL over an unfinished one.
    """
    time_objective = options.objective == "time"
    incumbent = float(table.columns["step_time_s"].min()) if len(table) and time_objective else np.inf
    tier_caps = _kind_capacities(machine, places)
    hbm_cap = machine.hbm_bytes * (1 - options.memory_headroom)
    # Offloading only adds time, so the HBM-only time bounds a plan's, and its compute alone bounds
    # that (step_time_floor): plans either rules out need no further evaluation.
    if np.isfinite(incumbent):
        memory_bound = memory_bound[step_time_floor(spec, machine, TrainPlan(**rows_of(cols, memory_bound)),
                                                    work) < incumbent]
        if len(memory_bound):
            hbm_only = estimate_training(spec, machine, TrainPlan(**rows_of(cols, memory_bound)), work, detail=False,
                                         threads=options.threads)
            memory_bound = memory_bound[hbm_only.step_time_s < incumbent]
    if not len(memory_bound):
        return [], 0, np.inf
    base_time, delta, part_bytes, fixed, held = _offload_costs(spec, machine, work, cols, memory_bound, places,
                                                               options.space, options.threads)
    bound = _relaxed_bound(base_time, delta, part_bytes, fixed, hbm_cap)
    order = np.argsort(bound, kind="stable")
    order = order[np.isfinite(bound[order])]
    # Plans beyond the first 4,096 are not examined: their bound stays unresolved.
    unresolved = float(bound[order[4096]]) if len(order) > 4096 else np.inf
    order = order[:4096]
    rows, models = [], 0
    for start in range(0, len(order), 128):
        batch = order[start:start + 128]
        if bound[batch[0]] >= incumbent:
            break  # no remaining bound beats the incumbent: proven
        evaluated: list = []
        while True:
            solved, status = _solve_offload(base_time[batch], delta[batch], part_bytes[batch], fixed[batch], hbm_cap,
                                            tier_caps, incumbent, evaluated, {k: v[batch] for k, v in held.items()})
            models += 1
            if status not in ("OPTIMAL", "INFEASIBLE"):  # a time limit: this batch is not settled
                unresolved = min(unresolved, float(bound[batch[0]]))
            if solved is None:
                break
            i, assignment, _, _ = solved
            row = {f: np.asarray(cols[f])[memory_bound[batch[i]]] for f in PLAN_FIELDS}
            for (field_name, _), t in zip(PARTS, assignment):
                row[field_name] = PLACES.index(places[t])
            rows.append(row)
            evaluated.append((i, assignment))
            if not time_objective:
                break
            true = estimate_training(spec, machine, TrainPlan(**{f: np.array([v]) for f, v in row.items()}), work,
                                     detail=False)
            if bool(true.feasible[0]):
                incumbent = min(incumbent, float(true.step_time_s[0]) * (1 + 1e-9))
    return rows, models, unresolved


def activation_offload_rows(spec, machine, work, cols, rows, incumbent, options):
    """The lattice's plans ``rows`` (those memory binds) at each activation-offload share the space
    allows (SpaceOptions.activation_offloads), with the plans a swap cannot make beat ``incumbent``
    left out: a swap never makes a step faster than the same plan keeping its activations in HBM,
    and the floor of a plan's compute (step_time_floor, which counts the recomputation the swapped
    tokens skip) bounds it. Returns (plan columns, their Screen), or None when there is nothing to try
    (no shares, no plans, or no host DDR to swap to)."""
    levels = [float(s) for s in options.space.activation_offloads if s > 0]
    if not levels or not len(rows) or not any(t.kind == "ddr" for t in machine.memory_tiers):
        return None
    base = rows_of(cols, rows)
    if np.isfinite(incumbent):
        # The largest share recomputes least: its floor bounds every share's (first the plans, then each share).
        base["activation_offload"] = np.full(len(rows), max(levels))
        base = rows_of(base, np.flatnonzero(step_time_floor(spec, machine, TrainPlan(**base), work) < incumbent))
    n = len(base["tp"])
    out = {k: np.tile(np.broadcast_to(v, (n,)), len(levels)) for k, v in base.items()}
    out["activation_offload"] = np.repeat(np.array(levels), n)
    if np.isfinite(incumbent) and n:
        out = rows_of(out, np.flatnonzero(step_time_floor(spec, machine, TrainPlan(**out), work) < incumbent))
    if not len(out["tp"]):
        return None
    return out, screen_training(spec, machine, TrainPlan(**out), work, options.threads)
