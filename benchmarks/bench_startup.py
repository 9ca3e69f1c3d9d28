"""Start-up of the command line, measured side by side in one run against ``python -c "import numpy"``.

Each command runs as a fresh process (as a user types it), REPEAT times; the median wall time is
printed with its ratio to the numpy import, and checked against the targets of issue 14:
``perfmodel --help`` <= 0.2 s, ``perfmodel hardware list`` <= 0.3 s and the Megatron 1T plan on
3,072 A100s end to end <= 0.5 s. The validated database is cached by content hash (first run
warms it; ``PERFMODEL_CACHE_DIR=off`` measures without it, reported on its own line).

    python benchmarks/bench_startup.py [REPEAT]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

PERFMODEL = [sys.executable, "-m", "perfmodel.cli"]
CASES = [
    ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"], None),
    ("perfmodel --help", PERFMODEL + ["--help"], 0.2),
    ("perfmodel hardware list", PERFMODEL + ["hardware", "list"], 0.3),
    ("perfmodel hardware list --json", PERFMODEL + ["hardware", "list", "--json"], None),
    ("perfmodel plan train (Megatron 1T, 3,072 A100)",
     PERFMODEL + ["plan", "train", "--model", "megatron-1t", "--system", "dgx-a100", "--devices", "3072",
                  "--global-batch", "3072", "--seq-len", "2048"], 0.5),
    ("  the same, --json", PERFMODEL + ["plan", "train", "--model", "megatron-1t", "--system", "dgx-a100", "--devices",
                                       "3072", "--global-batch", "3072", "--seq-len", "2048", "--json"], None),
]


def wall(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main(repeat: int = 7) -> int:
    cache = tempfile.mkdtemp(prefix="perfmodel-bench-cache-")
    env = {**os.environ, "PERFMODEL_CACHE_DIR": cache, "COLUMNS": "100"}
    wall(PERFMODEL + ["hardware", "list", "--json"], env)          # warm the database cache
    rows, baseline, missed = [], None, 0
    for name, argv, target in CASES:
        seconds = statistics.median(wall(argv, env) for _ in range(repeat))
        baseline = baseline or seconds
        verdict = "" if target is None else ("  ok" if seconds <= target else "  OVER") + f" (target {target:g} s)"
        missed += target is not None and seconds > target
        rows.append(f"{name:50s} {seconds:6.3f} s  {seconds / baseline:5.1f} x numpy{verdict}")
    cold = statistics.median(wall(PERFMODEL + ["hardware", "list"], {**env, "PERFMODEL_CACHE_DIR": "off"})
                             for _ in range(repeat))
    rows.append(f"{'perfmodel hardware list, database cache off':50s} {cold:6.3f} s  {cold / baseline:5.1f} x numpy")
    print(f"median of {repeat} runs each, {os.cpu_count()} cores")
    print("\n".join(rows))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 7))
