"""Issue "Honest answers": prices on a stated basis for every system, checked optima, safe
defaults, plans reproduced by the printed ``estimate`` command, failures naming what binds."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

from tests.cli.test_commands import run, run_json


def estimate(capsys, command: str) -> dict:
    argv = shlex.split(command)
    assert argv[:2] == ["perfmodel", "estimate"]
    return run_json(capsys, *argv[1:])["result"]


# --- prices and cost basis ------------------------------------------------------------------

PRICED = {"cloud": ["dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8x", "dgx-2"],
          "owned": ["dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8x", "frontier",
                    "ascend-910b-8x", "cloudmatrix384", "cloudmatrix384-die", "dgx-2"]}


@pytest.mark.parametrize("pricing", ["cloud", "owned"])
def test_every_system_is_priced_or_says_why(db, pricing):
    from perfmodel.machine import build_machine
    from perfmodel.economics import cost_basis, run_cost

    for system in db.systems:
        machine = build_machine(db, system, None, pricing)
        usd = float(run_cost(machine, machine.tdp_w))
        line = cost_basis(machine)
        if system in PRICED[pricing]:
            assert np.isfinite(usd) and usd > 0, (system, pricing)
            assert "unpriced" not in line
        else:
            assert np.isnan(usd)
            assert "unpriced" in line and "--price" in line


def test_owned_cost_adds_network_facility_and_energy(db):
    from perfmodel.machine import build_machine
    from perfmodel.economics import HOURS_PER_YEAR, run_cost

    m = build_machine(db, "dgx-h100", 8, "owned")
    k = m.constants
    capital = 270_000 / 8 / (1 - k.network_capex_fraction) / (k.depreciation_years * HOURS_PER_YEAR)
    facility = (m.tdp_w + m.overhead_w_per_device) / 1e3 * k.facility_usd_per_kw_month * 12 / HOURS_PER_YEAR
    energy = 1.0 * k.pue * k.electricity_usd_per_kwh
    assert float(run_cost(m, 1000.0)) == pytest.approx(capital + facility + energy)


def test_cost_search_lists_both_systems_on_one_basis(capsys):
    """The issue's case: MI300X and H100 both answer under one stated basis, either basis."""
    for pricing in ("cloud", "owned"):
        data = run_json(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--system", "mi300x-8x", "--system",
                        "dgx-h100", "--rate", "20", "--tpot-p90-ms", "50", "--objective", "cost", "--pricing", pricing)
        assert data["pricing"] == pricing and set(data["cost_basis"]) == {"mi300x-8x", "dgx-h100"}
        assert {p["system"] for d in data["top"] for p in d["pools"]} >= {"mi300x-8x"} or \
            {p["system"] for p in data["best"]["pools"]} == {"mi300x-8x"}
        assert data["best"]["usd_per_hour"] > 0


def test_unpriced_systems_are_listed_not_dropped(capsys):
    code, out, _ = run(capsys, "plan", "serve", "--model", "llama-3.1-8b", "--system", "ascend-910b-8x", "--system",
                       "dgx-h100", "--rate", "5", "--objective", "cost")
    assert code == 0
    assert "ascend-910b-8x: unpriced on the cloud basis" in " ".join(out.split())
    # A user's price puts it in the cost search.
    data = run_json(capsys, "plan", "serve", "--model", "llama-3.1-8b", "--system", "ascend-910b-8x", "--rate", "5",
                    "--objective", "cost", "--price", "ASCEND-910B-8X=0.5")
    assert "--price 0.5" not in data["cost_basis"]["ascend-910b-8x"]
    assert data["best"]["usd_per_hour"] == pytest.approx(0.5 * data["best"]["devices"])


def test_bad_price_flags_exit_2(capsys):
    for value in ("dgx-h100", "dgx-h100=-1", "dgx-h100=nan", "nosuch=3"):
        code, _, err = run(capsys, "estimate", "serve", "--price", value)
        assert code == 2 and err.count("\n") == 1, value
    code, _, err = run(capsys, "estimate", "serve", "--pricing", "rented")
    assert code == 2 and "--pricing" in err


# --- defaults ---------------------------------------------------------------------------------

def test_plan_and_estimate_share_their_defaults():
    from dataclasses import fields

    import typer.main

    from perfmodel.cli.app import app
    from perfmodel.defaults import SERVE_DEFAULTS, TRAIN_DEFAULTS
    from perfmodel.requests import ServeRequest, TrainRequest
    from perfmodel.search.requests import PlanServeRequest, PlanTrainRequest

    train = {f.name: f.default for f in fields(TrainRequest)}
    serve = {f.name: f.default for f in fields(ServeRequest)}
    assert all(train[k] == v for k, v in TRAIN_DEFAULTS.items())
    assert all(serve[k] == v for k, v in SERVE_DEFAULTS.items())
    plan = PlanTrainRequest()
    assert plan.model == TRAIN_DEFAULTS["model"] and plan.system == (TRAIN_DEFAULTS["system"],)
    assert (plan.global_batch, plan.seq_len, plan.tokens) == tuple(TRAIN_DEFAULTS[k] for k in ("global_batch", "seq_len",
                                                                                               "tokens"))
    assert PlanServeRequest().model == SERVE_DEFAULTS["model"]
    command = typer.main.get_command(app)
    for group, name, table in (("estimate", "train", TRAIN_DEFAULTS), ("plan", "train", TRAIN_DEFAULTS),
                               ("estimate", "serve", SERVE_DEFAULTS), ("plan", "serve", SERVE_DEFAULTS)):
        params = {p.name: p.default for p in command.commands[group].commands[name].params}
        for key, value in table.items():
            if key in params and params[key] is not None and key != "devices":
                assert str(params[key]) == str(value), (group, name, key)


def test_training_is_bf16_unless_fp8_is_named(capsys):
    data = run_json(capsys, "plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64",
                    "--seq-len", "4096")
    assert {p["plan"]["precision"] for p in [data["best"]] + data["top"]} == {"bf16"}
    data = run_json(capsys, "plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64",
                    "--seq-len", "4096", "--precisions", "bf16,fp8")
    assert data["best"]["plan"]["precision"] == "fp8"


def test_serving_keeps_the_models_own_format_and_fp8_unless_asked(capsys):
    from perfmodel.catalog import find_model
    from perfmodel.search.options import default_weight_precisions

    assert default_weight_precisions(find_model("llama-3.1-70b")) == ("bf16", "fp8")
    assert default_weight_precisions(find_model("deepseek-v3")) == ("fp8",)
    assert default_weight_precisions(find_model("gpt-oss-120b")) == ("fp4", "fp8")
    data = run_json(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--rate", "5")
    formats = {p["config"]["weight_precision"] for d in [data["best"]] + data["top"] for p in d["pools"]}
    assert formats <= {"bf16", "fp8"}
    assert data["quantization"] is None or "fp8" in data["quantization"]
    data = run_json(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--rate", "5", "--weight-precisions", "int4",
                    "--activation-precisions", "a16", "--objective", "energy")
    assert {p["config"]["weight_precision"] for p in data["best"]["pools"]} == {"int4"}
    assert "int4" in data["quantization"] and "accuracy" in data["quantization"]


# --- reproducible plans -----------------------------------------------------------------------

def test_every_printed_training_plan_reproduces_with_its_estimate_command(capsys):
    data = run_json(capsys, "plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64",
                    "--seq-len", "4096", "--top", "3")
    answer = data["recommended"]
    assert answer["breakdown"]["step_time_s"] == pytest.approx(answer["step_time_s"], rel=1e-12)
    for row in [answer, data["best"]] + data["top"] + data["ties"][:3]:
        again = estimate(capsys, row["reproduce"])
        # The same number to the last printed digit (four significant figures), and in fact exactly.
        assert f"{again['step_time_s']:.4g}" == f"{row['step_time_s']:.4g}"
        assert again["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9)
        assert again["mfu"] == pytest.approx(row["mfu"], rel=1e-9)


def test_the_default_plan_reproduces(capsys):
    data = run_json(capsys, "plan")
    again = estimate(capsys, data["best"]["reproduce"])
    assert again["step_time_s"] == pytest.approx(data["best"]["step_time_s"], rel=1e-9)


def test_every_serving_pool_reproduces_with_its_estimate_command(capsys):
    data = run_json(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--system", "mi300x-8x", "--system",
                    "dgx-h100", "--rate", "20", "--tpot-p90-ms", "50", "--pricing", "owned")
    for deployment in [data["best"]] + data["top"][:3]:
        for pool in deployment["pools"]:
            again = estimate(capsys, pool["reproduce"])
            if pool["role"] == "prefill":
                assert again["ttft_s"] == pytest.approx(pool["prefill_p90_s"], rel=1e-9)
            else:
                assert again["tpot_s"] == pytest.approx(pool["step_p90_s"], rel=1e-9)
            if pool["role"] == "decode":       # a decode pool's TPOT is its unloaded step
                assert pool["tpot_p90_s"] == pytest.approx(pool["step_p90_s"], rel=1e-12)


# --- checked optima ---------------------------------------------------------------------------

def test_the_training_checker_catches_a_tampered_answer(db):
    from dataclasses import replace

    from perfmodel.catalog import find_model
    from perfmodel.training import TrainWorkload
    from perfmodel.search.train import SearchOptions, check_plans, search_training

    spec, work = find_model("llama-3.1-8b"), TrainWorkload(64, 4096)
    result = search_training(spec, db, [("dgx-h100", 8)], work, SearchOptions(top=5))
    assert result.evidence.status == "OPTIMAL" and check_plans(spec, result, work, SearchOptions()) == []
    worse = result.top[-1]
    tampered = replace(result, best=worse, top=[result.top[0]])
    assert any("beats the reported best" in p for p in check_plans(spec, tampered, work, SearchOptions()))
    tampered = replace(tampered, best=replace(worse, step_time_s=worse.step_time_s / 2))
    assert any("alone" in p for p in check_plans(spec, tampered, work, SearchOptions()))


def test_an_unsettled_offload_solve_is_not_optimal():
    from types import SimpleNamespace

    from perfmodel.search.train import PlanTable, _proof

    table = PlanTable({"step_time_s": np.array([10.0, 12.0])})
    settled, unsettled = SimpleNamespace(unresolved=np.inf), SimpleNamespace(unresolved=8.0)
    assert _proof([settled], table, 0, "time") == ("OPTIMAL", 0.0)
    assert _proof([settled, SimpleNamespace(unresolved=11.0)], table, 0, "time") == ("OPTIMAL", 0.0)
    assert _proof([settled, unsettled], table, 0, "time") == ("FEASIBLE", pytest.approx(0.2))
    assert _proof([unsettled], table, 0, "cost") == ("FEASIBLE", None)


# --- failures that name what binds ------------------------------------------------------------

def test_a_device_limit_failure_names_the_minimum(capsys):
    code, _, err = run(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--system", "mi300x-8x", "--system",
                       "dgx-h100", "--rate", "28", "--tpot-p90-ms", "50", "--max-devices", "8")
    assert code == 3 and err.count("\n") == 1
    assert "needs at least 11 devices, --max-devices allows 8" in err


def test_a_serving_budget_failure_names_the_cheapest_fleet(capsys):
    code, _, err = run(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--rate", "20", "--budget-usd-per-hour", "5")
    assert code == 3 and "the budget binds: the cheapest fleet meeting the targets costs $" in err


def test_a_training_budget_failure_names_the_budget_not_memory(capsys):
    code, _, err = run(capsys, "plan", "train", "--budget", "100")
    assert code == 3 and err.count("\n") == 1
    assert "the budget binds" in err and "HBM" not in err
    code, _, err = run(capsys, "plan", "train", "--power-cap-kw", "1")
    assert code == 3 and "the power cap binds" in err


def test_upper_case_system_names_run_every_plan_command(capsys):
    data = run_json(capsys, "plan", "train", "--model", "llama-3.1-8b", "--system", "DGX-H100", "--devices", "8",
                    "--global-batch", "64", "--seq-len", "4096")
    assert data["best"]["system"] == "dgx-h100"
    assert estimate(capsys, data["best"]["reproduce"])["step_time_s"] == pytest.approx(data["best"]["step_time_s"])
