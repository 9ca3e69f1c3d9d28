"""plan train over hierarchical sharding: exact against brute force, checked independently, and limited to
what a framework runs when it exports."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.model import TransformerSpec
from perfmodel.search.brute import brute_force_training
from perfmodel.search.space import SpaceOptions, build_space, sharding_schemes
from perfmodel.search.vocabulary import SHARDING
from perfmodel.search.train import SearchOptions, check_plans, search_training
from perfmodel.training import TrainWorkload

EVERY = SpaceOptions(micro_batches=(1,), interleaves=(1,), recomputes=("none", "full"), precisions=("bf16",),
                     max_cp=2, sharding=SHARDING)


def _tiny() -> TransformerSpec:
    return TransformerSpec(name="tiny", hidden_size=4096, num_layers=8, num_heads=32, num_kv_heads=32,
                           ffn_hidden_size=16384, vocab_size=32000)


def test_frontier_levels_give_the_sharding_choices(db):
    machine = build_machine(db, "frontier", 384)
    stage3 = sharding_schemes(machine, 1, 384, 3, EVERY)
    # Groups of a GCD pair (2), a node (8) and all (384): weights within gradients within optimizer states.
    assert (0, 8, 2, 0, False, False) in stage3                 # Frontier's three levels
    assert (0, 0, 0, 8, True, True) in stage3                   # flat ZeRO++ with hpZ over a node
    assert (8, 0, 0, 0, False, False) in stage3                 # HSDP / MiCS within a node
    assert stage3[0] == (0, 0, 0, 0, False, False)              # flat ZeRO-3 first
    flat = sharding_schemes(machine, 1, 384, 3, SpaceOptions(sharding=("flat",)))
    assert flat == [(0, 0, 0, 0, False, False)]
    _, declared = build_space(_tiny(), machine, TrainWorkload(384, 2048), EVERY)
    assert declared["sharding (groups, hpZ, quantized collectives)"] == len(stage3)


def test_search_with_sharding_matches_brute_force(db):
    spec, work = _tiny(), TrainWorkload(32, 2048)
    machine = build_machine(db, "frontier", 16)
    expected, evaluated = brute_force_training(spec, machine, work, EVERY)
    result = search_training(spec, db, [("frontier", 16)], work, SearchOptions(space=EVERY))
    assert result.best.step_time_s == pytest.approx(expected, rel=1e-6)
    assert result.evidence.status == "OPTIMAL"
    assert evaluated > result.evidence.evaluated   # brute force also tried every offload placement


def test_checker_catches_a_plan_whose_sharding_was_altered(db):
    spec, work = find_model("gpt-neox-20b"), TrainWorkload(1536, 2048)
    options = SearchOptions(space=SpaceOptions(micro_batches=(1,), interleaves=(1,), recomputes=("full",),
                                               precisions=("bf16",), max_cp=1, sharding=SHARDING), offload=False)
    result = search_training(spec, db, [("frontier", 384)], work, options)
    assert result.evidence.status == "OPTIMAL" and check_plans(spec, result, work, options) == []
    assert result.best.plan.zero == 3 and result.best.plan.shard_weights in (2, 8)
    altered = replace(result, best=replace(result.best, plan=replace(result.best.plan, shard_weights=0, shard_grads=0,
                                                                     hpz=0)))   # flat ZeRO-3 over 384 GCDs
    problems = check_plans(spec, altered, work, options)
    assert problems and "alone" in problems[0]


@pytest.mark.parametrize("framework", ["megatron", "nemo", "torchtitan", "deepspeed"])
def test_plan_for_a_framework_lists_only_sharding_it_writes(db, framework):
    from perfmodel.exports import training_files
    from perfmodel.search.requests import PlanTrainRequest

    request = PlanTrainRequest(model="llama-3.1-8b", system=("frontier",), devices=(64,), global_batch=256,
                               seq_len=4096, framework=framework, sharding="flat,hsdp,levels,hpz,qwz,qgz", top=10)
    spec, pairs, work, options = request.resolve(db)
    result = search_training(spec, db, pairs, work, options)
    machine = result.machines[("frontier", 64)]
    for row in [result.best] + result.top + result.pareto + result.ties:
        plan = row.plan
        assert training_files(framework, spec, machine, plan, work, "llama-3.1-8b")   # never an ExportError


def test_quantized_collectives_are_searched_only_when_named(db):
    machine = build_machine(db, "frontier", 384)
    default = sharding_schemes(machine, 1, 384, 3, SpaceOptions())
    assert not any(qwz or qgz for *_, qwz, qgz in default)
    assert np.any([qwz for *_, qwz, _ in sharding_schemes(machine, 1, 384, 3, EVERY)])


def test_the_command_line_defaults_to_the_searched_families():
    from perfmodel.search.requests import PlanTrainRequest
    from perfmodel.search.space import DEFAULT_SHARDING

    assert tuple(PlanTrainRequest().sharding.split(",")) == DEFAULT_SHARDING
    assert set(DEFAULT_SHARDING) <= set(SHARDING)
