"""Brute force over a declared training space: the oracle the solvers are checked against.

Every plan of the space, all offload placements included, through the same vectorized cost
model; no pruning, no solver. Slow by design, exact by construction.
"""

from __future__ import annotations

import itertools

import numpy as np

from perfmodel.machine import Machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import PLACES
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

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


def brute_force_fleet(spec, demand, options_list: list[dict], machines, options) -> float:
    """The best objective over every fleet the pool options allow: each colocated pool, and each
    prefill pool with every vector of decode instance counts (0 to each option's own count) that
    carries the rate, within the limits. Exponential in the decode options: small fleets only."""
    from .serve import _kv_ok, _option_objective, slo_of

    slo = slo_of(demand)
    objective = [_option_objective(o, options.objective) for o in options_list]
    limit_devices = options.max_devices or np.inf
    best = np.inf
    for i, o in enumerate(options_list):
        if o["role"] == "colocated" and o["devices"] <= limit_devices and np.isfinite(objective[i]):
            if options.power_cap_w is None or o["power_w"] <= options.power_cap_w:
                best = min(best, objective[i])
    need = int(np.ceil(demand.rate * 1e6))
    decode = [i for i, o in enumerate(options_list) if o["role"] == "decode" and np.isfinite(objective[i])]
    for p, o in enumerate(options_list):
        if o["role"] != "prefill" or not np.isfinite(objective[p]):
            continue
        usable = [d for d in decode if _kv_ok(spec, demand, o, options_list[d], machines, slo)[0]]
        for counts in itertools.product(*[range(options_list[d]["instances"] + 1) for d in usable]):
            if sum(int(options_list[d]["capacity"] * 1e6) * n for d, n in zip(usable, counts)) < need:
                continue
            devices = o["devices"] + sum(options_list[d]["devices_per_instance"] * n for d, n in zip(usable, counts))
            power = o["power_w"] + sum(options_list[d]["power_w"] / options_list[d]["instances"] * n
                                       for d, n in zip(usable, counts))
            if devices > limit_devices or (options.power_cap_w is not None and power > options.power_cap_w):
                continue
            value = objective[p] + sum(objective[d] / options_list[d]["instances"] * n for d, n in zip(usable, counts))
            best = min(best, value)
    return best
