"""Listed training plans as typed rows (search.rows.TrainRow): ``as_dict`` is the JSON document
``plan train --json`` prints, and a row read back from that JSON is the same row."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, fields, replace

import pytest

from perfmodel.cli.app import main
from perfmodel.search.api import plan_train
from perfmodel.search.rows import METRICS, TrainRow
from perfmodel.search.space import PLAN_FIELDS
from perfmodel.training import TrainPlan

ARGV = ["plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch", "64",
        "--seq-len", "4096", "--json"]


def _row(data: dict) -> TrainRow:
    """A TrainRow read back from its JSON document."""
    data = {k: v for k, v in data.items() if k not in ("reproduce", "breakdown")}
    runs_on = data.pop("runs_on", None)
    return TrainRow(**{**data, "plan": TrainPlan(**data["plan"])},
                    runs_on=None if runs_on is None else tuple(runs_on))


def test_as_dict_round_trips_the_json_of_plan_train(db, capsys):
    assert main(ARGV) == 0
    text = capsys.readouterr().out
    doc = json.loads(text)
    planning = plan_train(db=db, model="llama-3.1-8b", system=("dgx-h100",), devices=(8,), global_batch=64,
                          seq_len=4096)
    listed = {"best": planning.best, "recommended": planning.recommended}
    for key, row in listed.items():
        assert _row(doc[key]) == row, key
        printed = {k: v for k, v in doc[key].items() if k not in ("reproduce", "breakdown")}
        assert json.dumps(row.as_dict(), sort_keys=True) == json.dumps(printed, sort_keys=True), key
    assert [_row(r) for r in doc["top"]] == planning.result.top
    assert [_row(r) for r in doc["per_system"]] == planning.result.per_system


def test_the_row_holds_the_plan_and_metrics_by_name(db):
    planning = plan_train(db=db, model="llama-3.1-8b", system=("dgx-h100",), devices=(8,), global_batch=64,
                          seq_len=4096)
    best = planning.best
    # Activation offload is listed only when on (the documents of plans without it are as before it existed).
    assert best.plan.activation_offload == 0
    assert isinstance(best.plan, TrainPlan) and list(best.plan_dict()) == [f for f in PLAN_FIELDS
                                                                          if f != "activation_offload"]
    swapping = replace(best, plan=replace(best.plan, activation_offload=0.25))
    assert list(swapping.plan_dict()) == list(PLAN_FIELDS) and swapping.plan_dict()["activation_offload"] == 0.25
    assert list(best.as_dict()) == ["system", "devices", "plan", *METRICS]      # runs_on only on the recommendation
    assert planning.recommended.runs_on and "runs_on" in planning.recommended.as_dict()
    assert {f.name for f in fields(TrainRow)} == {"system", "devices", "plan", "runs_on", *METRICS}
    with pytest.raises(FrozenInstanceError):
        best.step_time_s = 0.0
