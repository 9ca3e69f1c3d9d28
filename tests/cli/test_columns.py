"""Column specs: one list of columns gives a view's table and its CSV, in step (cli/columns.py).

The views are built on small made-up results: the table and the CSV hold the same records in the
same order, each table cell is the text of the CSV value beside it, and no two CSV rows of a plan
list are the same row."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from types import SimpleNamespace

import pytest

from perfmodel.cli import view_serve, view_train, view_validate
from perfmodel.cli.app import main
from perfmodel.cli.columns import Column, Listed, column, csv_of, csv_only, each_once, listed, table_of, texts
from perfmodel.cli.render import Table, plan_text, seconds_text, time_columns, time_records, times_table, usd_text
from perfmodel.cli.units import joules
from perfmodel.search.rows import TrainRow
from perfmodel.search.serve import Deployment, Pool
from perfmodel.training import TrainPlan


def cells(table) -> list[list[str]]:
    """The table's text by row."""
    columns = [list(c.cells) for c in table.columns]
    return [list(row) for row in zip(*columns)]


def headers(table) -> list[str]:
    return [str(c.header) for c in table.columns]


def test_one_column_list_gives_the_table_and_the_csv_of_the_same_records():
    records = [{"name": "a", "seconds": 0.0125, "note": "x"}, {"name": "b", "seconds": 3.5, "note": "y"}]
    columns = [column("name", "name", justify="left"), column("time", "seconds", seconds_text), csv_only("note"),
               Column("table only", lambda r: r["name"].upper())]
    table = table_of(columns, records, Table())
    rows = csv_of(columns, records)
    assert headers(table) == ["name", "time", "table only"]
    assert rows == [{"name": "a", "seconds": 0.0125, "note": "x"}, {"name": "b", "seconds": 3.5, "note": "y"}]
    assert cells(table) == [["a", seconds_text(0.0125), "A"], ["b", seconds_text(3.5), "B"]]
    assert [texts(columns, r) for r in records] == [dict(zip(headers(table), row)) for row in cells(table)]
    assert headers(table_of(columns, records, Table(), order=("time", "name"))) == ["time", "name"]


def test_each_plan_once_keeps_its_first_role_and_takes_its_rank_from_the_list():
    same = lambda a, b: a == b  # noqa: E731
    items = [Listed(None, "recommended", "c"), Listed(None, "fastest", "a")] + listed(["a", "b", "c"], "top")
    kept = each_once(items, same)
    assert [(k.rank, k.role, k.row) for k in kept] == [(3, "recommended", "c"), (1, "fastest", "a"), (2, "top", "b")]
    # an answer the list does not hold keeps no rank; a plan given twice is listed once
    kept = each_once([Listed(None, "recommended", "z"), Listed(None, "optimum", "a")] + listed(["a", "b"], "top"), same)
    assert [(k.rank, k.role) for k in kept] == [(None, "recommended"), (1, "optimum"), (2, "top")]


def _plan(step: float, tp: int, mfu: float) -> TrainRow:
    plan = TrainPlan(tp=tp, pp=1, dp=8 // tp, cp=1, ep=1, interleave=1, micro_batch=2, zero=1, recompute="none",
                     sp=tp > 1, precision="bf16")
    return TrainRow(system="dgx-h100", devices=8, plan=plan, step_time_s=step, step_time_low_s=0.9 * step,
                    step_time_high_s=1.1 * step, tokens_per_s=1e5 / step, mfu=mfu, hbm_used_bytes=60e9, hbm_fill=0.75,
                    power_w=900.0, energy_per_token_j=0.4 * step, cost_per_million_tokens_usd=2.5 * step,
                    run_cost_usd=None, run_time_s=None)


def test_plan_train_table_and_csv_agree_cell_by_cell():
    plans = [_plan(1.25, 8, 0.5), _plan(1.5, 4, 0.45), _plan(2.0, 2, 0.4)]
    commands = {p: f"tp{p.plan.tp}" for p in plans}
    table = view_train._plans_table("top", plans, "$/M tokens")
    rows = csv_of(view_train._plan_columns(commands=commands), listed(plans, "top"))
    assert len(cells(table)) == len(rows) == 3
    for text, row, plan in zip(cells(table), rows, plans):
        rank, where, plan_cell, step, mfu, cost, energy = text
        assert rank == str(row["rank"]) and row["role"] == "top"
        assert where == f"{row['devices']:,} x {row['system']}"
        assert plan_cell == plan_text({k: row[k] for k in plan.plan_dict()})
        assert step.split("\n")[0] == seconds_text(row["step_time_s"])
        assert mfu == f"{row['mfu']:.1%}" and cost == usd_text(row["cost_per_million_tokens_usd"])
        assert energy == joules(row["energy_per_token_j"]) and row["reproduce"] == commands[plan]


@pytest.mark.parametrize("answer_at,recommended,objective,roles", [
    (0, True, "time", ["recommended", "top", "top"]),
    (0, False, "cost", ["optimum", "top", "top"]),
    (2, True, "time", ["recommended", "fastest", "top"]),
    (2, True, "cost", ["recommended", "optimum", "top"]),
])
def test_plan_train_csv_lists_each_plan_once_with_its_role_and_rank(answer_at, recommended, objective, roles):
    top = [_plan(1.25, 8, 0.5), _plan(1.5, 4, 0.45), _plan(2.0, 2, 0.4)]
    answer = replace(top[answer_at], runs_on=("megatron",))   # the search hands the answer over as its own row
    commands = {p: f"tp{p.plan.tp}" for p in top + [answer]}
    result = SimpleNamespace(best=top[0], top=top, pareto=top[:2], recommended=answer if recommended else None)
    rows = view_train._plans_csv(result, answer, objective, False, commands)
    assert [r["role"] for r in rows] == roles
    assert rows[0]["reproduce"] == commands[answer] and rows[0]["rank"] == answer_at + 1
    assert sorted(r["rank"] for r in rows) == [1, 2, 3]
    assert len({tuple(r.items()) for r in rows}) == len(rows)
    front = view_train._plans_csv(result, answer, objective, True, commands)
    assert [(r["rank"], r["role"]) for r in front] == [(1, "pareto"), (2, "pareto")]


def _deployment(devices: int, tpot: float) -> Deployment:
    pool = Pool(role="colocated", system="dgx-h100", accelerator="h100-sxm", instances=devices,
                devices_per_instance=1, config={}, ttft_p50_s=0.05, ttft_p90_s=0.08, tpot_p50_s=tpot,
                tpot_p90_s=tpot, requests_per_s=1.0, hbm_used_bytes=60e9, power_w=800.0 * devices,
                usd_per_hour=4.0 * devices)
    return Deployment(mode="colocated", pools=(pool,), ttft_p50_s=0.05, ttft_p90_s=0.08, tpot_p50_s=tpot,
                      tpot_p90_s=tpot, devices=devices, power_w=800.0 * devices, usd_per_hour=4.0 * devices,
                      usd_per_million_tokens=0.4 * devices, joules_per_token=0.3 * devices,
                      latency_s=100 * tpot, owned_used={}, owned_saving_usd_per_hour=0.0)


def test_plan_serve_table_and_csv_agree_cell_by_cell():
    top = [_deployment(1, 0.01), _deployment(2, 0.008), _deployment(4, 0.006)]
    table = view_serve._deployments_table("top", top, [False, True, False])
    rows = csv_of(view_serve._deployment_columns(), listed(top, "top", [False, True, False]))
    assert headers(table) == list(view_serve._DEPLOYMENTS_ORDER)
    assert list(rows[0]) == ["rank", "role", "mode", "pools", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s",
                             "devices", "power_w", "usd_per_hour", "usd_per_million_tokens", "joules_per_token",
                             "latency_s", "owned_saving_usd_per_hour"]
    assert len(cells(table)) == len(rows) == 3
    for text, row in zip(cells(table), rows):
        rank, pools, fleet, ttft, tpot, latency, usd, energy = text
        assert rank.split()[0] == str(row["rank"]) and pools == f"colocated {row['devices']}x1"
        assert fleet == f"{row['devices']:,}" and ttft == seconds_text(row["ttft_p90_s"])
        assert tpot == seconds_text(row["tpot_p90_s"]) and latency == seconds_text(row["latency_s"])
        assert usd == usd_text(row["usd_per_million_tokens"]) and energy == joules(row["joules_per_token"])
    assert cells(table)[1][0] == "2 ≈"


@pytest.mark.parametrize("answer_at,any_plan,roles", [
    (0, False, ["recommended", "top", "top"]),
    (0, True, ["optimum", "top", "top"]),
    (1, False, ["recommended", "optimum", "top"]),
])
def test_plan_serve_csv_lists_each_deployment_once_with_its_role_and_rank(answer_at, any_plan, roles):
    top = [_deployment(1, 0.01), _deployment(2, 0.008), _deployment(4, 0.006)]
    result = SimpleNamespace(best=top[0], top=top, pareto=top)
    rows = view_serve._deployments_csv(result, top[answer_at], any_plan, pareto=False)
    assert [r["role"] for r in rows] == roles and rows[0]["rank"] == answer_at + 1
    assert sorted(r["rank"] for r in rows) == [1, 2, 3]
    assert len({tuple(r.items()) for r in rows}) == len(rows)


def test_time_breakdown_table_and_csv_agree():
    components = {"compute": 1.5, "bubble": 0.0, "tp communication": 0.25}
    rows = csv_of(time_columns(), time_records(components))
    assert rows == [{"component": k, "seconds": v} for k, v in components.items()]
    table = times_table("step", components, 1.75, {"tp communication": 0.5})
    shown = [r for r in rows if r["seconds"]]   # the table leaves out what takes no time
    assert headers(table) == ["component", "exposed", "share", "on its link"]
    assert [row[:2] for row in cells(table)] == [[r["component"], seconds_text(r["seconds"])] for r in shown]
    assert [row[3] for row in cells(table)] == ["-", seconds_text(0.5)]


def test_validation_table_and_csv_agree():
    case = {"id": "a-case", "kind": "training", "calibration": True, "system": "dgx-h100", "metric": "step_time_s",
            "published": 2.0, "predicted": 2.2, "error": 0.1, "status": "ok", "source": "paper", "command": "x",
            "infeasible_in_model": None}
    rows = csv_of(view_validate._CASE_COLUMNS, [case])
    assert rows == [case]   # every field, in the case's order
    table = view_validate._validation_table([case])
    assert cells(table) == [["a-case *", "dgx-h100", "step time", seconds_text(2.0), seconds_text(2.2), "+10.0%"]]


@pytest.mark.parametrize("argv", [
    ["plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64", "--csv"],
    ["plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64", "--pareto", "--csv"],
    ["plan", "serve", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--rate", "5", "--csv"],
])
def test_plan_csv_rows_say_what_they_are_and_are_all_distinct(argv, capsys):
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and len({tuple(r.items()) for r in rows}) == len(rows)
    ranks = [r["rank"] for r in rows if r["rank"]]
    assert len(set(ranks)) == len(ranks)
    roles = [r["role"] for r in rows]
    if "--pareto" in argv:
        assert set(roles) == {"pareto"}
    else:
        assert roles[0] in ("recommended", "optimum") and set(roles[1:]) <= {"fastest", "optimum", "top"}
