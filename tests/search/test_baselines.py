"""The named heuristics of ``--baseline`` (search/baselines.py): each restriction admits only plans of
its family, its best is the best plan of that family, and never better than the unrestricted optimum
of the same request (whose space holds the family's); unknown names are one-line errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from perfmodel.catalog import find_model
from perfmodel.cli.app import main
from perfmodel.hardware_db.errors import UnknownNameError
from perfmodel.machine import build_machine
from perfmodel.model import TransformerSpec
from perfmodel.plan import PLACES, RECOMPUTE
from perfmodel.search.api import plan_serve, plan_train
from perfmodel.search.baselines import (BASELINES, SERVE_BASELINES, TRAIN_BASELINES, serve_layout_ok, serve_options,
                                        train_options)
from perfmodel.search.brute import brute_force_training
from perfmodel.search.options import SearchOptions, ServeSearchOptions
from perfmodel.search.space import PLAN_FIELDS, build_space
from perfmodel.search.train import search_training
from perfmodel.training import TrainWorkload

FLAT = ("shard", "shard_grads", "shard_weights", "hpz")     # 0: no sub-group sharding, no hpZ


def in_family(name: str, plan: dict, per_node: int) -> bool:
    """Whether a plan (a row's ``plan`` or one lattice row) belongs to the training heuristic ``name``:
    the family its description states, with every state in HBM and flat sharding."""
    hbm = PLACES.index("hbm")
    places = [plan[k] for k in ("optimizer_place", "grad_place", "param_place")]
    common = (plan["cp"] == 1 and all(plan[k] == 0 for k in FLAT) and not plan["qwz"] and not plan["qgz"]
              and all(p in (hbm, "hbm") for p in places))
    recompute = plan["recompute"] if isinstance(plan["recompute"], str) else RECOMPUTE[plan["recompute"]]
    if name == "tp-node":
        return common and plan["tp"] == per_node and plan["zero"] == 1 and recompute == "selective" \
            and plan["micro_batch"] == 1 and plan["interleave"] == 1
    if name == "fsdp":
        return common and plan["tp"] == 1 and plan["pp"] == 1 and plan["zero"] == 3
    raise AssertionError(name)


def rows(cols: dict) -> list[dict]:
    return [{k: cols[k][i] for k in PLAN_FIELDS} for i in range(len(cols["tp"]))]


def test_names_are_the_train_and_serve_heuristics_once_each():
    """``BASELINES`` (the CLI's list) is every training and serving heuristic, each named once, and
    each has the description the output prints."""
    assert set(BASELINES) == set(TRAIN_BASELINES) | set(SERVE_BASELINES) and len(set(BASELINES)) == len(BASELINES)
    assert all(text for text in (*TRAIN_BASELINES.values(), *SERVE_BASELINES.values()))


# --- training -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TRAIN_BASELINES))
@pytest.mark.parametrize("system, devices", [("dgx-h100", 16), ("dgx-2", 32)])
def test_train_restriction_admits_only_its_family_within_the_full_space(db, name, system, devices):
    """Every plan of the restricted lattice is of the heuristic's family (tp-node: TP over the node's
    devices, 16 on a DGX-2, not a fixed 8), the family is not empty, and each of its plans is also a
    plan of the unrestricted space (so the optimum's search covers it)."""
    spec, work = find_model("llama-3.1-8b"), TrainWorkload(64, 4096)
    machine = build_machine(db, system, devices)
    per_node = machine.system.devices_per_node
    options = SearchOptions(space=replace(SearchOptions().space, precisions=("bf16", "fp16")))
    restricted = train_options(name, options, per_node)
    assert restricted.offload is False and options.offload is True
    family, _ = build_space(spec, machine, work, restricted.space)
    everything, _ = build_space(spec, machine, work, options.space)
    family_rows = rows(family)
    assert family_rows and all(in_family(name, r, per_node) for r in family_rows)
    key = lambda r: tuple(np.asarray(r[k]).item() for k in PLAN_FIELDS)  # noqa: E731
    assert {key(r) for r in family_rows} <= {key(r) for r in rows(everything)}
    # The lattice rows outside the family are many: the restriction is a real one.
    assert len(family_rows) < len(everything["tp"]) / 10


def test_train_restriction_keeps_the_rest_of_the_request():
    """Only the plan family changes: the objective, limits and precisions stay; tp-node leaves the
    pipeline depth free ("pipeline stages as needed"), fsdp fixes it to 1."""
    options = SearchOptions(objective="cost", budget_usd=1e6, deadline_s=1e6, pricing="owned", top=7,
                            space=replace(SearchOptions().space, precisions=("bf16", "fp8"), max_pp=4))
    for name in TRAIN_BASELINES:
        restricted = train_options(name, options, 8)
        assert (restricted.objective, restricted.budget_usd, restricted.deadline_s, restricted.pricing,
                restricted.top) == ("cost", 1e6, 1e6, "owned", 7)
        assert restricted.space.precisions == ("bf16", "fp8") and restricted.space.offload_parts == ()
    assert train_options("tp-node", options, 8).space.max_pp == 4
    assert train_options("fsdp", options, 8).space.max_pp == 1


def tiny_model() -> TransformerSpec:
    return TransformerSpec(name="tiny", hidden_size=2048, num_layers=8, num_heads=32, num_kv_heads=32,
                           ffn_hidden_size=8192, vocab_size=32000)


@pytest.mark.parametrize("name", sorted(TRAIN_BASELINES))
def test_train_heuristic_best_is_the_familys_best_and_never_beats_the_optimum(db, name):
    """On two nodes, the search under the restriction lists only family plans; its best equals brute
    force over the family (all states in HBM), and is never faster than the unrestricted optimum."""
    spec, work, candidate = tiny_model(), TrainWorkload(32, 2048), ("dgx-h100", 16)
    machine = build_machine(db, *candidate)
    space = replace(SearchOptions().space, precisions=("bf16",), max_cp=2)
    options = SearchOptions(space=space, top=50)
    restricted = train_options(name, options, 8)
    found = search_training(spec, db, [candidate], work, restricted)
    assert found.best is not None and found.evidence.status == "OPTIMAL"
    assert all(in_family(name, r.plan_dict(), 8) for r in [found.best, *found.top])
    expected, _ = brute_force_training(spec, machine, work, replace(restricted.space, offload_places=("hbm",)))
    assert found.best.step_time_s == pytest.approx(expected, rel=1e-9)
    optimum = search_training(spec, db, [candidate], work, options)
    assert found.best.step_time_s >= optimum.best.step_time_s * (1 - 1e-12)


@pytest.mark.parametrize("name", sorted(TRAIN_BASELINES))
@pytest.mark.parametrize("objective, key", [("time", "step_time_s"), ("cost", "cost_per_million_tokens_usd")])
def test_plan_train_baseline_is_searched_on_the_optimums_system(db, name, objective, key):
    """``plan_train(baseline=...)``: the heuristic's best, on the optimum's system and device count,
    is of its family and never better than the optimum over every candidate."""
    planning = plan_train(db=db, model="llama-3.1-8b", system=("dgx-h100", "mi300x-8x"), devices=(8, 16),
                          global_batch=64, seq_len=4096, objective=objective, baseline=name)
    best, found = planning.best, planning.baseline
    assert found is not None and found.best is not None
    for row in [found.best, *found.top]:
        assert (row.system, row.devices) == (best.system, best.devices)
        assert in_family(name, row.plan_dict(), 8)
    assert getattr(found.best, key) >= getattr(best, key) * (1 - 1e-12)
    assert plan_train(db=db, model="llama-3.1-8b", devices=(8,), global_batch=64, seq_len=4096).baseline is None


def test_cli_speedup_is_the_apis_ratio(db, capsys):
    """``plan train --baseline tp-node --json`` reports the heuristic's step over the optimum's: the
    ratio of the API's two bests, at least 1."""
    import json

    argv = ["plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch",
            "64", "--seq-len", "4096", "--baseline", "tp-node", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)["baseline"]
    planning = plan_train(db=db, model="llama-3.1-8b", system=("dgx-h100",), devices=(8,), global_batch=64,
                          seq_len=4096, baseline="tp-node")
    ratio = planning.baseline.best.step_time_s / planning.best.step_time_s
    assert doc["name"] == "tp-node" and doc["speedup"] == pytest.approx(ratio, rel=1e-12) and ratio >= 1.0


# --- serving ------------------------------------------------------------------------------------

def test_serve_layout_belongs_to_tp_node_only_as_one_node_of_plain_tp():
    """tp-node: tensor parallel over exactly the node's devices, no pipeline, no attention data
    parallelism, no expert parallelism."""
    assert serve_layout_ok("tp-node", 8, tp=8, pp=1, dp_attention=1, ep=1)
    assert serve_layout_ok("tp-node", 16, tp=16, pp=1, dp_attention=1, ep=1)
    for tp, pp, dpa, ep in [(4, 1, 1, 1), (16, 1, 1, 1), (8, 2, 1, 1), (8, 1, 2, 1), (8, 1, 1, 8), (4, 2, 1, 1)]:
        assert not serve_layout_ok("tp-node", 8, tp, pp, dpa, ep), (tp, pp, dpa, ep)


@pytest.mark.parametrize("native, activation", [("bf16", "a16"), ("fp8", "a8"), ("int8", "a8")])
def test_serve_restriction_is_colocated_native_formats_in_hbm(native, activation):
    """serve_options keeps the request's objective and limits, and restricts the rest to the
    frameworks' defaults: colocated, the model's own weights, bf16 KV, nothing offloaded."""
    options = ServeSearchOptions(objective="energy", max_devices=24, top=3)
    restricted = serve_options("tp-node", options, native)
    assert restricted.baseline == "tp-node" and restricted.modes == ("colocated",)
    assert restricted.weight_precisions == (native,) and restricted.activation_precisions == (activation,)
    assert restricted.kv_precisions == ("bf16",)
    assert restricted.kv_offload is False and restricted.weight_offload is False
    assert (restricted.objective, restricted.max_devices, restricted.top) == ("energy", 24, 3)
    assert restricted.batches == options.batches and options.baseline is None


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b"])
def test_plan_serve_baseline_lists_only_its_family_and_never_beats_the_optimum(db, model):
    """Every deployment the tp-node search lists is colocated instances of one node each, plain TP
    (no expert parallelism even for Mixtral's experts), in bf16 with bf16 KV in HBM; its best meets
    the targets and costs no less than the optimum, whose space holds it."""
    planning = plan_serve(db=db, model=model, system=("dgx-h100",), rate=5.0, baseline="tp-node")
    found = planning.baseline
    assert found is not None and found.best is not None
    for d in [found.best, *found.top, *found.pareto]:
        assert d.mode == "colocated"
        for pool in d.pools:
            c = pool.config
            assert pool.devices_per_instance == 8
            assert (c["tp"], c["pp"], c["ep"], c["dp_attention"]) == (8, 1, 1, 1)
            assert (c["weight_precision"], c["activation_precision"], c["kv_precision"]) == ("bf16", "a16", "bf16")
            assert (c["kv_place"], c["weight_place"]) == ("hbm", "hbm")
    b = found.best
    assert b.ttft_p90_s <= planning.demand.ttft_p90 and b.tpot_p90_s <= planning.demand.tpot_p90
    assert b.usd_per_hour >= planning.best.usd_per_hour * (1 - 1e-12)
    assert plan_serve(db=db, model=model, system=("dgx-h100",), rate=5.0).baseline is None


# --- unknown names ------------------------------------------------------------------------------

def test_unknown_heuristics_are_one_line_errors(db, capsys):
    """A misspelt heuristic, or a training one asked of the serving search, is an UnknownNameError
    naming the flag and the known names; on the command line, exit 2 with one line."""
    with pytest.raises(UnknownNameError, match="unknown --baseline value 'tp-nodes'; did you mean tp-node") as caught:
        plan_train(db=db, model="llama-3.1-8b", devices=(8,), baseline="tp-nodes")
    assert "\n" not in str(caught.value)
    with pytest.raises(UnknownNameError, match="unknown --baseline value 'fsdp'; known: tp-node"):
        plan_serve(db=db, model="llama-3.1-8b", system=("dgx-h100",), baseline="fsdp")
    assert main(["plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--baseline", "megatron"]) == 2
    err = capsys.readouterr().err
    assert "unknown --baseline value 'megatron'" in err and err.count("\n") == 1


def test_the_heuristic_functions_refuse_a_name_they_do_not_hold():
    """Called directly (not through a request), a misspelt or wrong-kind heuristic is the same one-line
    error, never a silent unrestricted search."""
    with pytest.raises(UnknownNameError, match="unknown training baseline 'tp-nodes'; did you mean tp-node"):
        train_options("tp-nodes", SearchOptions(), 8)
    with pytest.raises(UnknownNameError, match="unknown serving baseline 'fsdp'"):
        serve_options("fsdp", ServeSearchOptions(), "bf16")
    with pytest.raises(UnknownNameError, match="unknown serving baseline 'fsdp'"):
        serve_layout_ok("fsdp", 8, 8, 1, 1, 1)


def test_tp_node_spans_a_host_where_the_scale_up_domain_spans_several(db):
    """On GB200 NVL72 the NVLink domain is 72 GPUs but a host (a compute tray) holds 4: the engines'
    default tensor parallelism is the host's, so tp-node instances are TP4 (TP72 divides no model's
    heads, which left the heuristic with no plan)."""
    planning = plan_serve(db=db, model="llama-3.1-70b", system=("gb200-nvl72",), rate=10.0, baseline="tp-node")
    pools = [p for d in [planning.baseline.best, *planning.baseline.top] for p in d.pools]
    assert pools and {p.config["tp"] for p in pools} == {db.system("gb200-nvl72").devices_per_launch_host} == {4}
