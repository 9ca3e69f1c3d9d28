"""Fuzz the CLI at scale: generated hostile command lines and files, every run held to the contract.

Runs ``--cases`` cases (default 10,000; a third of them commands reading one hostile file, the rest
command lines drawn from the typer app's own options, some of them with hostile files too) on a
process pool, each worker in its own scratch folder (removed after) with an address-space limit, so that a
memory bomb fails instead of swapping and a hang is cut off at the case's time limit plus a minute.
Prints the counts by exit code, the slowest case, the workers' peak memory and every failure
(grouped by what broke, with one command line to reproduce each group).

    python benchmarks/bench_fuzz.py [--cases 10000] [--workers 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ADDRESS_SPACE_BYTES = 8 << 30   # a worker that asks for more fails with MemoryError: a finding


class Hang(BaseException):
    """Raised by the alarm when one case outlives its time limit by a minute."""


def _alarm(signum, frame):
    raise Hang()


def _worker(task: tuple[int, int, int, bool]) -> list[tuple]:
    """Run ``count`` cases drawn with ``seed``; return (argv text, exit code, problems, seconds) per case."""
    seed, count, index, file_cases = task
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from tests import fuzzing

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    scratch = Path(tempfile.mkdtemp(prefix=f"fuzz{index}-"))
    os.chdir(scratch)
    signal.signal(signal.SIGALRM, _alarm)
    files = fuzzing.file_source(scratch / "files")
    strategy = fuzzing.file_command_lines(files) if file_cases else fuzzing.command_lines(files)
    results = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(argv=strategy)
    def case(argv):
        started = time.perf_counter()
        signal.alarm(int(fuzzing.time_limit(argv)) + 60)
        try:
            outcome = fuzzing.run(argv)
            problems = fuzzing.problems(outcome) + fuzzing.overtime(outcome)
            code = outcome.code
        except Hang:
            code, problems = None, [f"hang: cut off after {time.perf_counter() - started:.0f} s"]
        except MemoryError:
            code, problems = None, ["raised MemoryError (over the address-space limit)"]
        finally:
            signal.alarm(0)
        results.append((fuzzing.describe(fuzzing.Outcome(tuple(argv), code, "", "", 0.0)), code, problems,
                        time.perf_counter() - started))

    try:
        case()
    finally:
        os.chdir(tempfile.gettempdir())
        shutil.rmtree(scratch, ignore_errors=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return [r + (peak_mib,) for r in results]


def _kind(problem: str) -> str:
    """A failure's class: its text without the numbers and quoted values that vary between cases."""
    return re.sub(r"'[^']*'|\d+(\.\d+)?", "_", problem)[:140]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=250, help="cases per task (a fresh worker per task)")
    args = parser.parse_args()
    tasks, done = [], 0
    while done < args.cases:
        count = min(args.chunk, args.cases - done)
        tasks.append((args.seed * 1_000_003 + len(tasks), count, len(tasks), len(tasks) % 3 == 2))
        done += count
    started = time.perf_counter()
    results = []
    with multiprocessing.get_context("spawn").Pool(args.workers, maxtasksperchild=1) as pool:
        for chunk in pool.imap_unordered(_worker, tasks):
            results += chunk
            print(f"  {len(results):,} cases, {time.perf_counter() - started:,.0f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    codes = collections.Counter("raised" if code is None else code for _, code, _, _, _ in results)
    failures = collections.defaultdict(list)
    for argv, _, problems, _, _ in results:
        for problem in problems[:1]:
            failures[_kind(problem)].append((argv, problem))
    slowest = max(results, key=lambda r: r[3])
    print(f"{len(results):,} cases in {elapsed:,.0f} s on {args.workers} workers (seed {args.seed})")
    print("exit codes: " + ", ".join(f"{code}: {n:,}" for code, n in sorted(codes.items(), key=str)))
    print(f"slowest case: {slowest[3]:.1f} s: {slowest[0][:200]}")
    print(f"peak memory of a worker: {max(r[4] for r in results):,.0f} MiB")
    print(f"failures: {sum(len(v) for v in failures.values()):,} in {len(failures)} classes")
    for kind, cases in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        argv, problem = cases[0]
        print(f"  {len(cases):>5} x {problem[:300]}\n          {argv[:400]}")


if __name__ == "__main__":
    main()
