"""The search's pick against the plans practitioners published, both predicted by the same model.

For each published configuration of tests/data/practiced_training.yaml (each ran on 80 GB GPUs),
the search plans the same model, system, device count, global batch and sequence length, once over
the full declared space and once restricted to the published plan's precision and the
frameworks' usual choices (no offload), and prints predicted published-plan step time over the
search's pick. A ratio well above 1 says the model believes something practitioners did not
choose: either a real improvement or a model error, to be read case by case.

    python benchmarks/bench_practiced.py
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from perfmodel.hardware_db import load_database
from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training
from perfmodel.search.space import SpaceOptions
from perfmodel.search.train import SearchOptions, search_training

DATA = Path(__file__).parents[1] / "tests" / "data" / "practiced_training.yaml"


def _label(plan: dict) -> str:
    return (f"tp{plan['tp']} pp{plan['pp']}x{plan['interleave']} dp{plan['dp']} cp{plan['cp']} ep{plan['ep']} "
            f"mb{plan['micro_batch']} z{plan['zero']} {plan['recompute']} {plan['precision']}")


def main() -> None:
    db = load_database()
    print(f"{'configuration':34s} {'published plan':46s} {'pred. step':>10s} {'search pick (same precision)':46s}"
          f" {'step':>8s} {'ratio':>6s} {'any precision':>13s} {'s':>5s}")
    for config in yaml.safe_load(DATA.read_text())["configs"]:
        spec = find_model(config["model"])
        work = TrainWorkload(config["global_batch"], config["seq_len"])
        machine = build_machine(db, config["system"], config["devices"])
        published = estimate_training(spec, machine, TrainPlan(**config["plan"]), work)
        started = time.perf_counter()
        same = search_training(spec, db, [(config["system"], config["devices"])], work, SearchOptions(
            offload=False, space=SpaceOptions(precisions=(config["plan"]["precision"],))))
        anyp = search_training(spec, db, [(config["system"], config["devices"])], work, SearchOptions(offload=False))
        seconds = time.perf_counter() - started
        step = float(published.step_time_s)
        fits = "" if str(published.binding) == "" else f" ({published.binding}!)"
        pick = same.best
        ratio = step / pick["step_time_s"] if pick else float("nan")
        ratio_any = step / anyp.best["step_time_s"] if anyp.best else float("nan")
        print(f"{config['id']:34s} {_label(config['plan']) + fits:46s} {step:10.3f} "
              f"{_label(pick['plan']) if pick else '-':46s} {pick['step_time_s'] if pick else float('nan'):8.3f} "
              f"{ratio:6.2f} {ratio_any:13.2f} {seconds:5.1f}")


if __name__ == "__main__":
    main()
