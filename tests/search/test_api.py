"""The Python API (``perfmodel.plan_train`` / ``plan_serve``, search/api.py) used directly, as the README's
"Python API" section documents it: the same answers as the command line, a request as an object or as
keywords, one-line errors, launch files of the recommended plan, progress reports and the power cap."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import perfmodel
from perfmodel.cli.app import main
from perfmodel.exports import SERVING, TRAINING, ExportError, training_frameworks
from perfmodel.hardware_db.errors import InfeasibleError, PerfmodelError, SpecError, UnknownNameError
from perfmodel.search.api import ServePlanning, TrainPlanning, plan_serve, plan_train
from perfmodel.search.requests import PlanServeRequest, PlanTrainRequest
from perfmodel.search.serve import serving_ties

# Small requests (well under a second each): Llama 3.1 8B on one node; Llama 3.1 70B at 10 requests/s,
# whose optimum (fp8 weights, a16 activations) no serving framework runs, so a tie is recommended.
TRAIN = dict(model="llama-3.1-8b", system=("dgx-h100",), devices=(8,), global_batch=64, seq_len=4096)
TRAIN_ARGV = ["--model", "llama-3.1-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch", "64",
              "--seq-len", "4096"]
# 16 devices and long sequences: the recommended plan runs on some training frameworks, not on DeepSpeed.
TRAIN_CP = dict(model="llama-3.1-8b", system=("dgx-h100",), devices=(16,), global_batch=64, seq_len=32768)
SERVE = dict(model="llama-3.1-70b", system=("dgx-h100",), rate=10.0)
SERVE_ARGV = ["--model", "llama-3.1-70b", "--system", "dgx-h100", "--rate", "10"]


def cli_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def cli_files(capsys, tmp_path: Path, *argv) -> dict[str, str]:
    """The files ``--export`` writes, name -> text."""
    out = tmp_path / "export"
    assert main([*argv, "--json", "--out", str(out)]) == 0
    capsys.readouterr()
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def without(row: dict, *keys: str) -> dict:
    return {k: v for k, v in row.items() if k not in keys}


def deployment_doc(d) -> dict:
    """A Deployment as ``plan serve --json`` prints it, without the per-pool reproduce command (which
    the command line fills in)."""
    data = {k: v for k, v in vars(d).items() if k != "pools"}
    data["pools"] = [without({**vars(p), "devices": p.devices}, "reproduce") for p in d.pools]
    return json.loads(json.dumps(data))


def cli_deployment(doc: dict) -> dict:
    return {**doc, "pools": [without(p, "reproduce") for p in doc["pools"]]}


def meets_demand(deployment, demand) -> bool:
    """Within the p90 targets, and the pools that finish requests carry the whole rate."""
    carried = sum(p.requests_per_s for p in deployment.pools if p.role != "prefill")
    return (deployment.ttft_p90_s <= demand.ttft_p90 and deployment.tpot_p90_s <= demand.tpot_p90
            and carried >= demand.rate * (1 - 1e-9))


# --- the same answer as the command line ---------------------------------------------------------

def test_plan_train_answers_what_plan_train_json_prints(db, capsys):
    """The API's optimum, recommended plan, top list, frameworks and evidence are the ones
    ``perfmodel plan train --json`` prints for the same flags (the command renders the API's result)."""
    planning = plan_train(db=db, **TRAIN)
    assert isinstance(planning, TrainPlanning)
    doc = cli_json(capsys, "plan", "train", *TRAIN_ARGV)
    assert without(doc["best"], "reproduce") == planning.best.as_dict()
    assert without(doc["recommended"], "reproduce", "breakdown") == planning.recommended.as_dict()
    assert [without(r, "reproduce") for r in doc["top"]] == [r.as_dict() for r in planning.result.top]
    assert [fw for fw, why in doc["runs_on"].items() if why is None] == sorted(planning.recommended.runs_on)
    for key in ("status", "evaluated", "feasible", "declared_space"):
        assert doc["evidence"][key] == getattr(planning.evidence, key), key
    assert planning.evidence.status == "OPTIMAL"


def test_plan_serve_answers_what_plan_serve_json_prints(db, capsys):
    """The API's optimum, recommended deployment, top list and each framework's answer are the ones
    ``perfmodel plan serve --json`` prints for the same flags."""
    planning = plan_serve(db=db, **SERVE)
    assert isinstance(planning, ServePlanning)
    doc = cli_json(capsys, "plan", "serve", *SERVE_ARGV)
    assert cli_deployment(doc["best"]) == deployment_doc(planning.best)
    assert cli_deployment(doc["recommended"]) == deployment_doc(planning.recommended)
    assert [cli_deployment(d) for d in doc["top"]] == [deployment_doc(d) for d in planning.result.top]
    assert doc["runs_on"] == planning.runs_on
    assert doc["evidence"]["status"] == planning.evidence.status == "OPTIMAL"


# --- a request as an object or as its fields -----------------------------------------------------

def test_train_request_object_and_keywords_are_the_same_search(db):
    """``plan_train(PlanTrainRequest(...))`` and ``plan_train(**fields)`` resolve the same request and
    find the same plans; keywords next to an object override its fields (the object is unchanged)."""
    request = PlanTrainRequest(**TRAIN)
    by_object, by_fields = plan_train(request, db=db), plan_train(db=db, **TRAIN)
    assert by_object.request == by_fields.request == request
    assert by_object.candidates == by_fields.candidates == [("dgx-h100", 8)]
    assert by_object.best == by_fields.best and by_object.result.top == by_fields.result.top
    assert by_object.recommended == by_fields.recommended

    bigger = plan_train(request, db=db, global_batch=128)
    assert bigger.request == replace(request, global_batch=128) and request.global_batch == 64
    assert bigger.work.global_batch == 128
    assert bigger.best == plan_train(db=db, **{**TRAIN, "global_batch": 128}).best


def test_serve_request_object_and_keywords_are_the_same_search(db):
    request = PlanServeRequest(**SERVE)
    by_object, by_fields = plan_serve(request, db=db), plan_serve(db=db, **SERVE)
    assert by_object.request == by_fields.request == request
    assert by_object.best == by_fields.best and by_object.result.top == by_fields.result.top
    assert by_object.recommended == by_fields.recommended and by_object.runs_on == by_fields.runs_on
    slower = plan_serve(request, db=db, rate=5.0)
    assert slower.request.rate == 5.0 and slower.demand.rate == 5.0 and request.rate == 10.0


def test_a_request_of_the_other_command_is_a_type_error(db):
    """A serving request given to plan_train (and the reverse) is a programming error, said as such."""
    with pytest.raises(TypeError, match="expected a PlanTrainRequest, got PlanServeRequest"):
        plan_train(PlanServeRequest(), db=db)
    with pytest.raises(TypeError, match="expected a PlanServeRequest, got PlanTrainRequest"):
        plan_serve(PlanTrainRequest(), db=db)


def test_threads_split_the_work_not_the_answer(db):
    """One evaluating thread finds the same plans as every core."""
    one, every = plan_train(db=db, threads=1, **TRAIN_CP), plan_train(db=db, **TRAIN_CP)
    assert one.options.threads == 1 and every.options.threads is None
    assert one.best == every.best and one.result.top == every.result.top and one.recommended == every.recommended


def test_the_default_database_is_the_built_in_one(db):
    """Without ``db=`` the search loads the built-in database itself and finds the same plan."""
    assert plan_train(**TRAIN).best == plan_train(db=db, **TRAIN).best


# --- one-line errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("fields, error, message", [
    (dict(objective="fastest"), UnknownNameError, "unknown --objective value 'fastest'"),
    (dict(system=("dgx-h1000",)), UnknownNameError, "did you mean dgx-h100"),
    (dict(model="llama-9"), UnknownNameError, "unknown model 'llama-9'"),
    (dict(precisions="fp3"), UnknownNameError, "unknown --precisions value 'fp3'"),
    (dict(baseline="nope"), UnknownNameError, "unknown --baseline value 'nope'"),
    (dict(framework="vllm"), UnknownNameError, "unknown --framework value 'vllm'"),
    (dict(devices=(0,)), SpecError, "--devices needs 1 to 1,000,000, has 0"),
    (dict(global_batch=0), SpecError, "--global-batch needs a positive integer"),
    (dict(budget=-5.0), SpecError, "--budget needs a positive number"),
    (dict(system=()), SpecError, "--system needs at least one system"),
])
def test_plan_train_bad_field_is_a_one_line_error(db, fields, error, message):
    """A bad field raises the project's error type (a PerfmodelError the CLI prints as one line), with
    the message naming the flag, never another exception's traceback."""
    with pytest.raises(error) as caught:
        plan_train(db=db, **{**TRAIN, **fields})
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("fields, error, message", [
    (dict(rate=-1.0), SpecError, "--rate needs a positive number"),
    (dict(rate=1.0, concurrency=5), SpecError, "not both"),
    (dict(modes="together"), UnknownNameError, "unknown --modes value 'together'"),
    (dict(baseline="fsdp"), UnknownNameError, "unknown --baseline value 'fsdp'"),   # a training heuristic only
    (dict(framework="megatron"), UnknownNameError, "unknown --framework value 'megatron'"),
    (dict(system=("dgx-h1000",)), UnknownNameError, "did you mean dgx-h100"),
    (dict(power_cap_w=900.0), SpecError, "--power-cap-w needs more than the h100-sxm's idle"),
    (dict(chunk_tokens="x"), SpecError, "--chunk-tokens needs token counts"),
])
def test_plan_serve_bad_field_is_a_one_line_error(db, fields, error, message):
    with pytest.raises(error) as caught:
        plan_serve(db=db, **{**SERVE, **fields})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_nothing_feasible_raises_infeasible_naming_the_closest_plan(db):
    """As the module says: a request no plan meets raises InfeasibleError (exit code 3), one line."""
    with pytest.raises(InfeasibleError, match="closest:") as caught:
        plan_train(db=db, model="llama-3.1-405b", system=("dgx-h100",), devices=(8,), global_batch=8, offload=False)
    assert caught.value.exit_code == 3 and "\n" not in str(caught.value)
    with pytest.raises(InfeasibleError, match="no deployment meets"):
        plan_serve(db=db, **SERVE, tpot_p90_ms=0.01)


# --- the result objects ---------------------------------------------------------------------------

def test_machine_of_and_estimate_reproduce_each_listed_plan(db):
    """``machine_of`` gives the Machine a listed row was evaluated on, and ``estimate`` re-evaluated
    on its own gives the row's step time and MFU (the search and ``estimate train`` agree)."""
    planning = plan_train(db=db, model="llama-3.1-8b", system=("dgx-h100", "mi300x-8x"), devices=(8, 16),
                          global_batch=64, seq_len=4096)
    assert planning.machine is planning.machine_of(planning.best)
    for row in [planning.best, *planning.result.top]:
        machine = planning.machine_of(row)
        assert (machine.system.name, machine.devices) == (row.system, row.devices)
        again = planning.estimate(row)
        assert float(again.step_time_s) == pytest.approx(row.step_time_s, rel=1e-12)
        assert float(again.mfu) == pytest.approx(row.mfu, rel=1e-12)
    assert float(planning.estimate().step_time_s) == pytest.approx(planning.best.step_time_s, rel=1e-12)
    assert {(r.system, r.devices) for r in planning.result.top} <= set(planning.candidates)


def test_recommended_plan_is_within_the_optimums_range_and_runs_where_it_says(db):
    """The recommended plan's step lies within the optimum's range; its ``runs_on`` lists exactly the
    frameworks whose export accepts it; under ``any_plan`` it is the optimum itself."""
    planning = plan_train(db=db, **TRAIN_CP)
    best, rec = planning.best, planning.recommended
    assert best.step_time_low_s <= rec.step_time_s <= best.step_time_high_s
    assert rec.step_time_s >= best.step_time_s
    answers = training_frameworks(planning.spec, planning.machine_of(rec), rec.plan, planning.work,
                                  "llama-3.1-8b")
    assert list(rec.runs_on) == [fw for fw in TRAINING if answers[fw] is None] and rec.runs_on
    optimum = plan_train(db=db, **TRAIN_CP, any_plan=True)
    assert optimum.recommended is optimum.best and optimum.best == best


# --- launch files ----------------------------------------------------------------------------------

def test_train_export_writes_what_runs_and_refuses_the_rest(db):
    """``export(framework)`` returns launch files (name -> text) for a framework that runs the
    recommended plan, and raises ExportError (a one-line SpecError) with the reason ``runs_on``
    leaves it out for one that does not; serving frameworks and unknown names are refused too."""
    planning = plan_train(db=db, **TRAIN_CP)
    runs_on = planning.recommended.runs_on
    answers = training_frameworks(planning.spec, planning.machine_of(planning.recommended),
                                  planning.recommended.plan, planning.work, "llama-3.1-8b")
    assert set(runs_on) < set(TRAINING)          # this case exercises both branches
    for framework in TRAINING:
        if framework in runs_on:
            files = planning.export(framework)
            assert files and all(isinstance(k, str) and isinstance(v, str) and v for k, v in files.items())
        else:
            with pytest.raises(ExportError) as caught:
                planning.export(framework)
            assert str(caught.value) == answers[framework] and isinstance(caught.value, SpecError)
    with pytest.raises(ExportError, match="writes serving configurations"):
        planning.export("vllm")
    with pytest.raises(UnknownNameError, match="unknown --export framework"):
        planning.export("megatorn")


def test_train_export_matches_the_commands_files(db, capsys, tmp_path):
    """Searching with ``framework=`` and exporting gives the files ``plan train --export`` writes."""
    planning = plan_train(db=db, **TRAIN, framework="megatron")
    assert "megatron" in planning.recommended.runs_on
    files = cli_files(capsys, tmp_path, "plan", "train", *TRAIN_ARGV, "--export", "megatron")
    assert planning.export("megatron") == files and files


def test_framework_search_finds_a_plan_that_framework_exports(db):
    """Llama 3.1 70B on 8 devices: the recommended plan (offloading) runs on no framework, so no export
    accepts it; searching with ``framework=`` gives the best plan Megatron runs, which exports."""
    request = dict(model="llama-3.1-70b", system=("dgx-h100",), devices=(8,), global_batch=16, seq_len=4096)
    anywhere = plan_train(db=db, **request)
    assert anywhere.recommended.runs_on == ()
    for framework in TRAINING:
        with pytest.raises(ExportError):
            anywhere.export(framework)
    megatron = plan_train(db=db, **request, framework="megatron")
    assert megatron.recommended.runs_on == ("megatron",) and megatron.export("megatron")
    assert megatron.best.step_time_s >= anywhere.best.step_time_s * (1 - 1e-12)   # a subset of the space


def test_serve_export_writes_the_recommended_deployment(db):
    """Each serving framework that runs the recommended deployment (``runs_on`` None) exports it; the
    optimum alone (``any_plan``: fp8 weights with a16 activations) is refused by each with the reason
    ``runs_on`` gives; a training framework is refused."""
    planning = plan_serve(db=db, **SERVE)
    for framework in SERVING:
        assert planning.runs_on[framework] is None
        assert planning.export(framework)
    optimum = plan_serve(db=db, **SERVE, any_plan=True)
    assert optimum.recommended is optimum.best
    assert all(why is not None for why in optimum.runs_on.values())
    for framework, why in optimum.runs_on.items():
        with pytest.raises(ExportError) as caught:
            optimum.export(framework)
        assert str(caught.value) == why
    with pytest.raises(ExportError, match="writes training configurations"):
        planning.export("megatron")


def test_serve_export_matches_the_commands_files(db, capsys, tmp_path):
    planning = plan_serve(db=db, **SERVE, framework="vllm")
    assert planning.runs_on == {"vllm": None}
    files = cli_files(capsys, tmp_path, "plan", "serve", *SERVE_ARGV, "--export", "vllm")
    assert planning.export("vllm") == files and files


# --- the recommended deployment ---------------------------------------------------------------------

def test_recommended_deployment_is_a_listed_tie_that_meets_the_targets(db):
    """The optimum runs on no framework here, so the recommendation is another listed deployment,
    a tie of the optimum (its objective's range overlaps), that a framework runs and that meets the
    SLOs at the demanded rate, as the optimum does."""
    planning = plan_serve(db=db, **SERVE)
    best, rec = planning.best, planning.recommended
    assert rec is not best and rec in planning.result.top
    assert serving_ties(best, [rec], planning.options.objective) == [True]
    assert rec.usd_per_hour >= best.usd_per_hour
    assert meets_demand(rec, planning.demand) and meets_demand(best, planning.demand)
    assert any(why is None for why in planning.runs_on.values())
    for d in planning.result.top:
        assert d.usd_per_hour >= best.usd_per_hour * (1 - 1e-12)


def test_a_named_framework_recommends_what_it_runs(db):
    planning = plan_serve(db=db, model="llama-3.1-8b", system=("dgx-h100",), rate=5.0, framework="sglang")
    assert planning.runs_on == {"sglang": None} and meets_demand(planning.recommended, planning.demand)


# --- progress ----------------------------------------------------------------------------------------

def test_train_progress_counts_each_candidate_up_to_the_total(db):
    """``progress`` gets (candidates searched, candidates): 1, 2, ... up to the total, once each."""
    calls = []
    planning = plan_train(db=db, model="llama-3.1-8b", system=("dgx-h100", "mi300x-8x"), devices=(8, 16),
                          global_batch=64, seq_len=4096, progress=lambda done, total: calls.append((done, total)))
    assert len(planning.candidates) == 4
    assert calls == [(k, 4) for k in range(1, 5)]


SERVE_SYSTEMS = dict(model="llama-3.1-8b", system=("dgx-h100", "mi300x-8x", "dgx-a100"), rate=5.0)


def test_serve_progress_counts_rise_within_the_total(db):
    """``progress`` gets (steps done, steps) with steps = systems + 1 (each system, then the fleet):
    the counts rise strictly and never pass the total."""
    calls = []
    plan_serve(db=db, **SERVE_SYSTEMS, progress=lambda done, total: calls.append((done, total)))
    assert calls and {total for _, total in calls} == {4}
    done = [d for d, _ in calls]
    assert done == sorted(set(done)) and 1 <= done[0] and done[-1] <= 4


def test_serve_progress_ends_at_the_total(db):
    """The docstring: each system evaluated, then the fleet solved; the last report is (total, total)."""
    calls = []
    plan_serve(db=db, **SERVE_SYSTEMS, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (4, 4)


# --- the power cap ----------------------------------------------------------------------------------

def test_power_cap_reports_a_consistent_facility(db):
    """Under ``power_cap_w`` the planning carries what the cap costs and gains: the capped optimum's
    devices, a cap below TDP holding more devices per budget, a capped deployment never faster, and a
    facility whose copies of the uncapped optimum cap no more often than the risk allowed. Without
    the cap there is no such report."""
    request = dict(model="llama-3.1-8b", system=("dgx-h100",), rate=20.0)
    capped = plan_serve(db=db, **request, power_cap_w=400.0)
    cap = capped.power_cap
    assert cap["cap_w"] == 400.0 and cap["devices_capped"] == capped.best.devices
    assert cap["devices_per_budget_vs_tdp"]["dgx-h100"] > 1.0
    assert meets_demand(capped.best, capped.demand)
    slow = cap["uncapped_optimum_under_cap"]
    assert slow["ttft_p99_slowdown"] >= 1.0 and slow["tpot_p90_slowdown"] >= 1.0
    facility = cap["facility"]
    assert facility["devices_provisioned"] == 1024 and facility["capping_risk"] == 0.01
    assert facility["budget_w"] == pytest.approx(1024 * facility["tdp_w_per_device"])
    assert facility["devices_held"] == facility["deployment_copies"] * cap["devices_uncapped"]
    assert facility["devices_held_vs_provisioned"] == pytest.approx(facility["devices_held"] / 1024)
    assert facility["capping_probability"] <= 0.01
    assert facility["mean_w_per_device"] < facility["tdp_w_per_device"]
    assert plan_serve(db=db, **request).power_cap is None

    # A smaller risk holds no more copies.
    careful = plan_serve(db=db, **request, power_cap_w=400.0, capping_risk=0.001).power_cap["facility"]
    assert careful["deployment_copies"] <= facility["deployment_copies"]
    assert careful["capping_probability"] <= 0.001


def test_errors_are_perfmodel_errors():
    """The API's documented error types share the base the CLI catches (anything else is a bug)."""
    assert issubclass(UnknownNameError, SpecError) and issubclass(ExportError, PerfmodelError)
    assert issubclass(InfeasibleError, PerfmodelError)
    assert perfmodel.plan_train is plan_train and perfmodel.plan_serve is plan_serve


def test_a_repeatable_field_takes_one_value_as_typed():
    """``system="dgx-h100", devices=8`` is the one-element list (not the string's letters, not a TypeError)."""
    one = plan_train(**{**TRAIN, "system": "dgx-h100", "devices": 8})
    assert one.request.system == ("dgx-h100",) and one.request.devices == (8,)
    assert one.best == plan_train(**TRAIN).best
    assert plan_serve(**{**SERVE, "system": "dgx-h100"}).request.system == ("dgx-h100",)
