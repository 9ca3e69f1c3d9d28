"""Serving-plan speed: DeepSeek-V3 over three candidate systems (target: under two seconds).

Prints, in one run, the time to plan DeepSeek-V3 serving over CloudMatrix384, GB200 NVL72 and
8x H100 nodes (after a warm-up that imports OR-Tools and SciPy), the size of what was searched, and
the same problem solved with the fleet program against the brute-force oracle on a small fleet.

    python benchmarks/bench_serve.py
"""

from __future__ import annotations

import time

from perfmodel.hardware_db import load_database
from perfmodel.catalog import find_model
from perfmodel.search.brute import brute_force_fleet
from perfmodel.search import fleet
from perfmodel.search.options import Demand, Lengths, ServeSearchOptions
from perfmodel.search.serve import fleet_instance, search_serving
from perfmodel.search.serve_pools import pool_options, slo_of


def main() -> None:
    db = load_database()
    spec = find_model("deepseek-v3")
    demand = Demand(rate=50.0, input_len=Lengths.of(2048, 1500, 4096), output_len=Lengths.of(512, 400, 1024),
                    ttft_p90=2.0, tpot_p90=0.05)
    systems = ["cloudmatrix384", "gb200-nvl72", "dgx-h100"]
    search_serving(spec, db, systems[:1], demand, ServeSearchOptions(objective="energy"))  # warm up imports
    t0 = time.perf_counter()
    r = search_serving(spec, db, systems, demand, ServeSearchOptions(objective="energy"))
    seconds = time.perf_counter() - t0
    pools = "; ".join(f"{p.role} {p.instances} x {p.devices_per_instance} {p.system}" for p in r.best.pools)
    print(f"DeepSeek-V3 at 50 req/s over {', '.join(systems)}: {seconds:.2f} s "
          f"({r.evidence.configurations:,} instance configurations, {r.evidence.pool_options} pool options, "
          f"{r.evidence.pairs_checked:,} pairs), {r.evidence.status}: {r.best.mode}, {pools}; "
          f"target < 2 s: {'met' if seconds < 2 else 'NOT met'}")
    small = ServeSearchOptions(objective="energy", weight_precisions=("fp8",), activation_precisions=("a8",),
                               kv_precisions=("fp8",), kv_offload=False, batches=(8, 32, 128), max_instance_devices=8)
    spec = find_model("llama-3.1-8b")
    demand = Demand(rate=8.0, input_len=Lengths.of(1024), output_len=Lengths.of(256), ttft_p90=1.0, tpot_p90=0.03)
    pools = pool_options(spec, db, ["dgx-h100", "mi300x-8x"], demand, small)
    instance, _ = fleet_instance(spec, demand, pools.options, pools.machines, slo_of(demand), small)
    t0 = time.perf_counter()
    best = fleet.solve(instance)
    ip_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    oracle = brute_force_fleet(instance)
    brute_s = time.perf_counter() - t0
    power = fleet.totals(instance, best).power_w
    print(f"small fleet ({len(pools.options)} pool options): CP-SAT {ip_s:.3f} s ({best.status}, {power:,.0f} W) vs "
          f"brute force {brute_s:.3f} s ({oracle:,.0f} W): same optimum: "
          f"{'yes' if abs(power - oracle) <= 1e-6 * oracle else 'NO'}")


if __name__ == "__main__":
    main()
