"""Brute force over a declared training space: the oracle the solvers are checked against.

Every plan of the space, all offload placements included, through the same vectorized cost
model; no pruning, no solver. Slow by design, exact by construction.
"""

from __future__ import annotations

import itertools

import numpy as np

from perfmodel.machine import Machine
from perfmodel.model import TransformerSpec
from perfmodel.training import PLACES, TrainPlan, TrainWorkload, estimate_training

from .space import SpaceOptions, build_space
from .train import PLAN_FIELDS


def brute_force_training(spec: TransformerSpec, machine: Machine, work: TrainWorkload,
                         space: SpaceOptions = SpaceOptions()) -> tuple[float, int]:
    """(fastest feasible step time, plans evaluated); inf when nothing fits."""
    cols, _ = build_space(spec, machine, work, space)
    if not cols:
        return np.inf, 0
    places = ["hbm"] + sorted({t.kind for t in machine.memory_tiers if t.kind in space.offload_places})
    n = len(cols["tp"])
    best, evaluated = np.inf, 0
    for opt, grad, param in itertools.product(places, repeat=3):
        plan = {k: cols[k] for k in PLAN_FIELDS}
        plan.update(optimizer_place=np.full(n, PLACES.index(opt)), grad_place=np.full(n, PLACES.index(grad)),
                    param_place=np.full(n, PLACES.index(param)))
        r = estimate_training(spec, machine, TrainPlan(**plan), work, detail=False)
        evaluated += n
        if r.feasible.any():
            best = min(best, float(r.step_time_s[r.feasible].min()))
    return best, evaluated
