"""Expert placement for DeepSeek-V3 (256 routed experts, 58 MoE layers) on 32, 64 and 320 devices
with Zipf-skewed synthetic routing: seconds, gap to the proven bound, and the improvement over the
round-robin and greedy baselines, measured in one run (target: under 30 s each, gap under 2%).

    python benchmarks/bench_placement.py
"""

from __future__ import annotations

import time

from perfmodel.hardware_db import load_database
from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.routing import zipf_routing
from perfmodel.search.placement import PlacementProblem, layer_time, place


def main() -> None:
    db = load_database()
    spec = find_model("deepseek-v3")
    stats = zipf_routing(spec.moe_layers, spec.moe.num_experts, spec.moe.top_k, 65536, zipf=1.0, affinity=0.5,
                         seed=0)
    # (system, devices, slots per device, replicas per layer): EP32 and EP64 on H100 nodes with
    # room for replicas, and CloudMatrix384's EP320 with one expert copy per device (its 64
    # redundant experts fill the 320 slots).
    for system, devices, slots, replicas in (("dgx-h100", 32, 9, 32), ("dgx-h100", 64, 5, 32),
                                             ("cloudmatrix384", 320, 1, 64)):
        machine = build_machine(db, system, devices)
        problem = PlacementProblem(stats, devices, machine.system.devices_per_node, slots, replicas)
        t0 = time.perf_counter()
        best = place(problem, "cp-sat", time_limit=30)
        seconds = time.perf_counter() - t0
        rr, greedy = place(problem, "round-robin"), place(problem, "greedy")
        t_best, t_rr, t_greedy = (layer_time(spec, machine, p, devices) for p in (best, rr, greedy))
        print(f"{devices:>3} x {system}: {seconds:5.1f} s, {best.status}, gap {best.gap:.2%} "
              f"(target < 2%: {'met' if best.gap < 0.02 else 'NOT met'}; < 30 s: {'met' if seconds < 30 else 'NOT met'}); "
              f"imbalance {best.imbalance:.3f} vs round-robin {rr.imbalance:.3f}, greedy {greedy.imbalance:.3f}; "
              f"cross-node tokens {best.cross_tokens:.3g} vs {rr.cross_tokens:.3g}, {greedy.cross_tokens:.3g} "
              f"({1 - best.cross_tokens / greedy.cross_tokens:.1%} below greedy); MoE time {t_best:.3f} s vs "
              f"{t_rr:.3f} s, {t_greedy:.3f} s")


if __name__ == "__main__":
    main()
