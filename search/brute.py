"""Brute force over a declared training space: the oracle the solvers are checked against.

Every plan of the space, all offload placements included, through the same vectorized cost
model; no pruning, no solver. Slow by design, exact by construction.
"""

from __future__ import annotations

import itertools

import numpy as np

from perfmodel.machine import Machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import INTERLEAVED, PLACES
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

from .space import SpaceOptions, build_space
from .space import PLAN_FIELDS


OBJECTIVE_OF = {"time": "step_time_s", "cost": "cost_per_million_tokens_usd", "energy": "energy_per_token_j"}


def brute_force_training(spec: TransformerSpec, machine: Machine, work: TrainWorkload,
                         space: SpaceOptions = SpaceOptions(), objective: str = "time") -> tuple[float, int]:
    """(best feasible value of the objective: step time, cost per million tokens or energy per
    token; plans evaluated); inf when nothing fits."""
    cols, _ = build_space(spec, machine, work, space)
    if not cols:
        return np.inf, 0
    kinds = {t.kind for t in machine.memory_tiers}
    places = ["hbm"] + [p for p in PLACES[1:] if p in space.offload_places
                        and all(k in kinds for k in INTERLEAVED.get(p, (p,)))]
    n = len(cols["tp"])
    best, evaluated = np.inf, 0
    # Every plan at every activation-offload share too (where the system has host DDR to swap to), or
    # with "needed" only when no plan fits HBM without (SpaceOptions.activation_offload_when).
    shares = (0.0,) + (tuple(space.activation_offloads) if "ddr" in kinds else ())
    if space.activation_offload_when != "always" and len(shares) > 1:
        alone = estimate_training(spec, machine, TrainPlan(**{k: cols[k] for k in PLAN_FIELDS}), work, detail=False)
        shares = shares[:1] if alone.feasible.any() else shares
    for opt, grad, param, share in itertools.product(places, places, places, shares):
        plan = {k: cols[k] for k in PLAN_FIELDS}
        plan.update(optimizer_place=np.full(n, PLACES.index(opt)), grad_place=np.full(n, PLACES.index(grad)),
                    param_place=np.full(n, PLACES.index(param)), activation_offload=np.full(n, share))
        r = estimate_training(spec, machine, TrainPlan(**plan), work, detail=False)
        evaluated += n
        if r.feasible.any():
            value = np.broadcast_to(getattr(r, OBJECTIVE_OF[objective]), r.feasible.shape)
            best = min(best, float(np.nan_to_num(value[r.feasible], nan=np.inf).min()))
    return best, evaluated


def brute_force_fleet(instance) -> float:
    """The best objective over every fleet the instance allows: each colocated pool, and each
    prefill pool with every vector of decode instance counts (0 to each option's own count), each
    judged by the independent checker. Exponential in the decode options: small fleets only."""
    from .fleet import FleetSolution, check, totals

    opts = instance.options
    best = np.inf
    compatible: dict[int, list[int]] = {}
    for p, d, _ in instance.handover:
        compatible.setdefault(p, []).append(d)
    for i, o in enumerate(opts):
        if o.role == "colocated":
            candidates = [FleetSolution(i)]
        elif o.role == "prefill":
            usable = compatible.get(i, [])
            candidates = (FleetSolution(i, tuple((d, n) for d, n in zip(usable, counts) if n))
                          for counts in itertools.product(*[range(opts[d].instances + 1) for d in usable]))
        else:
            continue
        for s in candidates:
            if not check(instance, s):
                best = min(best, totals(instance, s).objective)
    return best
