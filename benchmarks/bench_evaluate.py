"""How many candidate training plans one vectorized call of the cost model evaluates per second.

Prints, measured side by side in one run: plans per second of one vectorized call over N plans
(median of three),
and of the same function called plan by plan (a Python loop over scalars, as a naive planner
would), with their ratio. Target (issue 3): over one million plans per second.

    python benchmarks/bench_evaluate.py [N]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from perfmodel.hardware_db import load_database
from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training


def random_plans(n: int, devices: int, rng: np.random.Generator) -> TrainPlan:
    """n plans over the parallel lattice of ``devices`` (all fields vary; many are infeasible)."""
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 4, 8, 16], n)
    cp = rng.choice([1, 2], n)
    dp = np.maximum(devices // (tp * pp * cp), 1)
    return TrainPlan(tp=tp, pp=pp, dp=dp, cp=cp, interleave=rng.choice([1, 2], n), micro_batch=rng.choice([1, 2], n),
                     zero=rng.integers(0, 4, n), recompute=rng.integers(0, 3, n), sp=rng.integers(0, 2, n),
                     precision=np.full(n, 3), optimizer_place=rng.choice([0, 1], n))


def main(n: int = 1_000_000) -> None:
    db = load_database()
    spec = find_model("llama-3.1-405b")
    machine = build_machine(db, "dgx-h100", 16384)
    work = TrainWorkload(global_batch=2048, seq_len=8192)
    plans = random_plans(n, machine.devices, np.random.default_rng(0))
    estimate_training(spec, machine, random_plans(1000, machine.devices, np.random.default_rng(1)), work)  # warm up
    runs = []
    for _ in range(3):  # the median of three runs: a shared machine is noisy
        t0 = time.perf_counter()
        result = estimate_training(spec, machine, plans, work, detail=False)
        runs.append(time.perf_counter() - t0)
    vector_s = sorted(runs)[1]
    loop_n = 300
    small = random_plans(loop_n, machine.devices, np.random.default_rng(2))
    cols = {k: getattr(small, k) for k in small.__dataclass_fields__}
    t0 = time.perf_counter()
    for i in range(loop_n):
        one = TrainPlan(**{k: (v[i] if isinstance(v, np.ndarray) else v) for k, v in cols.items()})
        estimate_training(spec, machine, one, work)
    loop_s = time.perf_counter() - t0
    vector_rate, loop_rate = n / vector_s, loop_n / loop_s
    t0 = time.perf_counter()
    estimate_training(spec, machine, plans, work, detail=True)
    detail_s = time.perf_counter() - t0
    print(f"plans evaluated in one vectorized call: {n:,} in {vector_s:.3f} s = {vector_rate:,.0f} plans/s "
          f"({int(result.feasible.sum()):,} feasible; totals only, as the search uses it)")
    print(f"  with every per-component breakdown kept: {detail_s:.3f} s = {n / detail_s:,.0f} plans/s")
    print(f"plan by plan (scalar calls):           {loop_n:,} in {loop_s:.3f} s = {loop_rate:,.0f} plans/s")
    print(f"ratio vectorized / scalar: {vector_rate / loop_rate:,.0f}x; target > 1,000,000 plans/s: "
          f"{'met' if vector_rate > 1e6 else 'NOT met'}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
