"""Start-up of the command line, measured side by side in one run against ``python -c "import numpy"``.

Each command runs as a fresh process (as a user types it), once per round for REPEAT rounds; the
median wall time is printed with its ratio to the numpy import, and checked against its target:
issue 27's as ratios (the DeepSeek-V3 serving plan over three systems within 10x; the Megatron 1T
plan's 4x is its search's, in process: see below), issue 14's in seconds (``perfmodel --help``
0.2 s, ``hardware list`` 0.3 s). Python writes its bytecode cache as on a user's machine
(PYTHONDONTWRITEBYTECODE is unset; a first run warms it). The validated database is cached by
content hash (the first run warms it; ``PERFMODEL_CACHE_DIR=off`` measures without it, reported on
its own line), and a user database of 8,000 accelerators (3 MB) is listed without the cache.

Issue 27's speed item asks for the searches themselves in process: the Megatron 1T training search
under 0.3 s (4x the numpy import; the whole command adds the fixed cost the 8B row shows, about
3.5x by itself) and the serving search, each timed as the first call of the Python API in a fresh
process whose modules and database are already loaded (so the interpreter, imports and argument
parsing the wall rows include are left out, and no cache of an earlier call helps it).

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
SERVE = ["plan", "serve", "--model", "deepseek-v3", "--system", "gb200-nvl72", "--system", "dgx-h100", "--system",
         "mi300x-8x", "--rate", "50"]
# (name, command, target: "4x" a multiple of the numpy import, "0.3s" seconds, or None)
CASES = [
    ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"], None),
    ("perfmodel --help", PERFMODEL + ["--help"], "0.2s"),
    ("perfmodel hardware list", PERFMODEL + ["hardware", "list"], "0.3s"),
    ("perfmodel hardware list --json", PERFMODEL + ["hardware", "list", "--json"], None),
    # The command's fixed cost (interpreter, numpy, pydantic, typer, rich, the database, the report)
    # beside a search of a few hundred plans: what the 1T plan's search adds is the difference.
    ("perfmodel plan train (Llama 3.1 8B, 8 A100)",
     PERFMODEL + ["plan", "train", "--model", "llama3.1-8b", "--system", "dgx-a100", "--devices", "8",
                  "--global-batch", "8", "--seq-len", "2048"], None),
    ("perfmodel plan train (Megatron 1T, 3,072 A100)",
     PERFMODEL + ["plan", "train", "--model", "megatron-1t", "--system", "dgx-a100", "--devices", "3072",
                  "--global-batch", "3072", "--seq-len", "2048"], None),
    ("  the same, --json", PERFMODEL + ["plan", "train", "--model", "megatron-1t", "--system", "dgx-a100", "--devices",
                                       "3072", "--global-batch", "3072", "--seq-len", "2048", "--json"], None),
    ("perfmodel plan serve (DeepSeek-V3, 3 systems)", PERFMODEL + SERVE, "10x"),
]
# (name, Python API call, target): the search alone, in process (see the module docstring).
IN_PROCESS = [
    ("in process: the Megatron 1T training search",
     "perfmodel.plan_train(model='megatron-1t', system='dgx-a100', devices=3072, global_batch=3072, seq_len=2048, db=db)",
     "4x"),
    ("in process: the DeepSeek-V3 serving search",
     "perfmodel.plan_serve(model='deepseek-v3', system=('gb200-nvl72', 'dgx-h100', 'mi300x-8x'), rate=50, db=db)", None),
]
TIMER = """import time
import perfmodel, perfmodel.search.serve, perfmodel.search.train
from perfmodel.hardware_db import load_database
db = load_database()
start = time.perf_counter()
{call}
print(time.perf_counter() - start)
"""


def in_process(call: str, env: dict) -> float:
    """Seconds of ``call`` (a first call, in a fresh process with its modules and database loaded)."""
    out = subprocess.run([sys.executable, "-c", TIMER.format(call=call)], capture_output=True, text=True, env=env,
                         check=True)
    return float(out.stdout.split()[-1])


def big_database(folder: str) -> str:
    """A user database of 8,000 accelerators, about 3 MB (issue 27's case)."""
    entry = ("  - {{name: acc{i}, display_name: Acc {i}, vendor: X, dense_tflops: {{bf16: {bf16}, fp8: {fp8}}}, "
             "hbm_gb: 80, hbm_tb_per_s: 2, tdp_w: 500, l2_mb: 50, scale_up_gb_per_s_per_direction: 300, "
             "nic_gbit_per_s_per_direction: 200, host_link: pcie4-x16, sources: [https://example.com/{i}], "
             "notes: 'a user entry, long enough for three megabytes in all'}}\n")
    with open(os.path.join(folder, "big.yaml"), "w") as fh:
        fh.write("accelerators:\n" + "".join(entry.format(i=i, bf16=100 + i, fp8=200 + 2 * i) for i in range(8000)))
    return folder


def wall(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - start


def main(repeat: int = 7) -> int:
    cache = tempfile.mkdtemp(prefix="perfmodel-bench-cache-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PERFMODEL_CACHE_DIR=cache, COLUMNS="100")
    for _, argv, _ in CASES:                                       # warm the database and bytecode caches
        wall(argv, env)
    # Interleaved rounds (every command once per round), so a slow spell of the machine falls on all
    # of them alike rather than on one command's runs, and the ratios stay paired.
    times = {name: [] for name, _, _ in CASES}
    for _ in range(repeat):
        for name, argv, _ in CASES:
            times[name].append(wall(argv, env))
    for _ in range(repeat):
        for name, call, _ in IN_PROCESS:
            times.setdefault(name, []).append(in_process(call, env))
    rows, baseline, missed = [], None, 0
    for name, _, target in CASES + IN_PROCESS:
        seconds = statistics.median(times[name])
        baseline = baseline or seconds
        ratio = seconds / baseline
        over = target is not None and (ratio > float(target[:-1]) if target.endswith("x") else seconds > float(target[:-1]))
        verdict = "" if target is None else ("  OVER" if over else "  ok") + f" (target {target})"
        missed += over
        rows.append(f"{name:50s} {seconds:6.3f} s  {ratio:5.1f} x numpy{verdict}")
    off = {**env, "PERFMODEL_CACHE_DIR": "off"}
    cold = statistics.median(wall(PERFMODEL + ["hardware", "list"], off) for _ in range(repeat))
    rows.append(f"{'perfmodel hardware list, database cache off':50s} {cold:6.3f} s  {cold / baseline:5.1f} x numpy")
    big = ["--hardware-db", big_database(tempfile.mkdtemp(prefix="perfmodel-bench-db-"))]
    for name, argv in (("8,000 user accelerators, hardware list --json", PERFMODEL + big + ["hardware", "list", "--json"]),
                       ("8,000 user accelerators, hardware list", PERFMODEL + big + ["hardware", "list"])):
        seconds = statistics.median(wall(argv, off) for _ in range(min(repeat, 3)))
        rows.append(f"{name + ', cache off':50s} {seconds:6.3f} s  {seconds / baseline:5.1f} x numpy")
    print(f"median of {repeat} interleaved rounds, {os.cpu_count()} cores")
    print("\n".join(rows))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 7))
