"""The search's pick against the plans practitioners published, both predicted by the same model.

For each published configuration of tests/data/practiced_training.yaml (each ran on 80 GB GPUs),
the search plans the same model, system, device count, global batch and sequence length (with every
MoE token dispatcher, as practitioners can install DeepEP), once over
the full declared space and once restricted to the published plan's precision and the
frameworks' usual choices (no offload), and prints predicted published-plan step time over the
search's pick; and over the plan ``plan train`` recommends at its defaults (the memory headroom, a
plan a framework runs, search.train.RECOMMENDATION), at the published precision without offload. A ratio well above 1 says the model believes something practitioners did not
choose: either a real improvement or a model error, to be read case by case. Each case then names
the step-time terms (compute, each exposed transfer, the pipeline bubble, the optimizer) that
separate the two plans most, published minus pick, so that the mechanism to check is explicit.

The published plan's step over the any-precision pick is then split into three factors, each a
search of its own: the layout (the pick within the software the publisher's framework had, the
file's ``software`` sets, at its precision: what the search itself changes, and where a ratio
well above 1 points at the model), the software (every option the search has, same precision:
the features the publisher did not have) and the precision.

    python benchmarks/bench_practiced.py [ID-SUBSTRING ...]     (only the cases whose id contains one)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

from perfmodel.hardware_db import load_database
from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training
from perfmodel.plan import DISPATCHERS
from perfmodel.search.space import SpaceOptions
from perfmodel.exports import TRAINING
from perfmodel.search.train import SearchOptions, search_training

DATA = Path(__file__).parents[1] / "tests" / "data" / "practiced_training.yaml"


def _label(plan: dict) -> str:
    ends = ("e" if plan.get("ends_as_layers") else "") + (" dualpipe" if plan.get("schedule") == "dualpipe" else "") \
        + (" ds-storage" if plan.get("storage") == "deepseek" else "")
    overlap = "+o" if plan.get("tp_overlap") else ""
    ends += "" if plan.get("flash", True) else " no-flash"
    ep_overlap = ("+o" if plan.get("ep_overlap") else "") + ("/" + str(plan["dispatcher"])
                                                            if plan.get("dispatcher", "alltoall") != "alltoall" else "")
    cp = f"cp{plan['cp']}" + (f"/{plan['cp_comm']}" if plan.get("cp_comm", "p2p") != "p2p" else "")
    return (f"tp{plan['tp']}{overlap} pp{plan['pp']}x{plan['interleave']}{ends} dp{plan['dp']} {cp} "
            f"ep{plan['ep']}{ep_overlap} mb{plan['micro_batch']} z{plan['zero']} {plan['recompute']} {plan['precision']}")


COMPUTE = "compute (fwd+bwd+recompute)"


def _largest(a: dict, b: dict, terms: int) -> list[tuple[str, float]]:
    """The keys whose values differ most, a minus b, largest magnitude first (above 1 ms)."""
    diff = {k: float(a[k]) - float(b.get(k, 0.0)) for k in a}
    return [(k, v) for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:terms] if abs(v) > 1e-3]


def _separating(published, pick, terms: int = 2) -> str:
    """The step-time components that differ most between the two plans (published minus pick), in s;
    the compute term split into the operators of each plan's busiest stage that differ most (a
    pipeline stage that also holds the output layer and the loss, say)."""
    parts = []
    for k, v in _largest(published.components, pick.components, terms):
        ops = _largest(published.operator_times, pick.operator_times, terms) if k == COMPUTE else []
        parts.append(f"{k} {v:+.2f}" + (f" ({', '.join(f'{o} {d:+.2f}' for o, d in ops)})" if ops else ""))
    return ", ".join(parts)


def main(only: list[str]) -> None:
    db = load_database()
    print(f"{'configuration':34s} {'published plan':46s} {'pred. step':>10s} {'search pick (same precision)':46s}"
          f" {'step':>8s} {'ratio':>6s} {'any precision':>13s} {'recommended':>11s} {'s':>5s}")
    ratios, recommended, layouts = [], [], []
    data = yaml.safe_load(DATA.read_text())
    for config in data["configs"]:
        if only and not any(part in config["id"] for part in only):
            continue
        spec = find_model(config["model"])
        work = TrainWorkload(config["global_batch"], config["seq_len"])
        machine = build_machine(db, config["system"], config["devices"])
        as_run = {**config["plan"], **config.get("as_run", {})}     # the schedule the source describes
        published = estimate_training(spec, machine, TrainPlan(**as_run), work)
        started = time.perf_counter()
        same = search_training(spec, db, [(config["system"], config["devices"])], work, SearchOptions(
            offload=False, space=SpaceOptions(precisions=(config["plan"]["precision"],), dispatchers=DISPATCHERS)))
        anyp = search_training(spec, db, [(config["system"], config["devices"])], work, SearchOptions(
            offload=False, space=SpaceOptions(dispatchers=DISPATCHERS)))
        software = data["software"][config["software"]]["options"] if "software" in config else None
        had = same if software is None else search_training(
            spec, db, [(config["system"], config["devices"])], work, SearchOptions(offload=False, space=SpaceOptions(
                precisions=(config["plan"]["precision"],), **{k: tuple(v) if isinstance(v, list) else v
                                                               for k, v in software.items()})))
        advice = search_training(spec, db, [(config["system"], config["devices"])], work, SearchOptions(
            offload=False, space=SpaceOptions(precisions=(config["plan"]["precision"],), dispatchers=DISPATCHERS),
            recommend_on=TRAINING,
            memory_headroom=db.constant("hbm-headroom-fraction"))).recommended
        seconds = time.perf_counter() - started
        step = float(published.step_time_s)
        fits = "" if str(published.binding) == "" else f" ({published.binding}!)"
        pick = same.best
        ratio = step / pick.step_time_s if pick else float("nan")
        ratio_any = step / anyp.best.step_time_s if anyp.best else float("nan")
        ratio_advice = step / advice.step_time_s if advice else float("nan")
        print(f"{config['id']:34s} {_label(as_run) + fits:46s} {step:10.3f} "
              f"{_label(pick.plan_dict()) if pick else '-':46s} {pick.step_time_s if pick else float('nan'):8.3f} "
              f"{ratio:6.2f} {ratio_any:13.2f} {ratio_advice:11.2f} {seconds:5.1f}")
        if advice:
            print(f"{'':34s} recommended {_label(advice.plan_dict())} (runs on {', '.join(advice.runs_on) or 'none'})")
        if anyp.best:
            best = estimate_training(spec, machine, anyp.best.plan, work)
            print(f"{'':34s} any-precision pick {_label(anyp.best.plan_dict())}; separating terms "
                  "(s, published - pick): "
                  f"{_separating(published, best)}")
        if had.best and pick and anyp.best:
            layout = step / had.best.step_time_s
            within = estimate_training(spec, machine, had.best.plan, work)
            print(f"{'':34s} = layout {layout:.2f} x software {had.best.step_time_s / pick.step_time_s:.2f}"
                  f" x precision {pick.step_time_s / anyp.best.step_time_s:.2f}; layout pick "
                  f"({config.get('software', 'current software')}) {_label(had.best.plan_dict())}, separating terms: "
                  f"{_separating(published, within)}")
            layouts.append(layout)
        ratios.append(ratio_any)
        recommended.append(ratio_advice)
    for name, values in (("layout, the publisher's software", layouts), ("any precision", ratios),
                         ("recommended", recommended)):
        finite = sorted(r for r in values if r == r)
        if not finite:
            print(f"ratios ({name}): no case")
            continue
        print(f"ratios ({name}): median {finite[len(finite) // 2]:.2f}, max {finite[-1]:.2f}, "
              f"above 1.15: {sum(r > 1.15 for r in finite)} of {len(finite)}")


if __name__ == "__main__":
    main(sys.argv[1:])
