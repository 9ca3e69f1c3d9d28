"""Each command on its happy path and its error paths, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.cli.app import main


SYNTHETIC_ROUTING = str(Path(__file__).parents[2] / "examples" / "routing" / "gpt-oss-120b-synthetic.npz")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_hardware_list_json(capsys):
    data = run_json(capsys, "hardware", "list")
    assert "h100-sxm" in data["accelerators"] and "frontier" in data["systems"]
    assert set(data) == {"accelerators", "cpus", "memory", "links", "systems", "calibrations", "constants"}


def test_hardware_show_system_resolves_levels(capsys):
    data = run_json(capsys, "hardware", "show", "dgx-h100", "--nodes", "4")
    assert data["devices"] == 32
    assert [lv["group_size"] for lv in data["levels"]] == [8, 32]
    assert data["sources"]


def test_hardware_show_accelerator_in_si(capsys):
    data = run_json(capsys, "hardware", "show", "h100")
    assert data["name"] == "h100-sxm" and data["hbm_bytes"] == 80 * 2**30
    assert "fp4" not in data["peak_flops"]


def test_models_list_and_show_json(capsys):
    rows = run_json(capsys, "models", "list")
    assert {r["name"] for r in rows} >= {"llama-3.1-405b", "deepseek-v3", "gpt-oss-120b"}
    shown = run_json(capsys, "models", "show", "llama-3.1-70b", "--seq-len", "8192")
    derived = shown["derived"]
    assert abs(derived["total_params_error"]) < 0.01
    assert derived["kv_bytes_per_token"]["bf16"] == 2 * 80 * 8 * 128 * 2
    for count in ("all keys", "causal"):
        assert derived["training_flops_per_token"][count] == 3 * derived["forward_flops_per_token"][count]
    # Causal attention computes half the scores: 4 x layers x (s/2) x width less per token.
    fwd = derived["forward_flops_per_token"]
    assert fwd["all keys"] - fwd["causal"] == 4 * 80 * 4096 * 8192


def test_models_show_reads_a_config_json(capsys, request):
    path = request.config.rootpath / "tests" / "data" / "hf" / "mixtral-8x7b.json"
    shown = run_json(capsys, "models", "show", str(path))
    assert shown["derived"]["attention"] == "gqa" and shown["spec"]["moe"]["num_experts"] == 8


def test_compare_json(capsys):
    data = run_json(capsys, "compare", "h100-sxm", "mi300x", "ascend-910c")
    names = [e["name"] for e in data["entries"]]
    assert names == ["h100-sxm", "mi300x", "ascend-910c"]
    h100, mi300x, ascend = data["entries"]
    assert mi300x["hbm_bytes"] > h100["hbm_bytes"]
    assert ascend["peak_fp8_flops"] is None  # not listed, never derived
    assert h100["ridge_bf16_flop_per_byte"] == pytest.approx(h100["peak_bf16_flops"] / h100["hbm_bytes_per_s"])


def test_compare_says_where_each_devices_constants_come_from(capsys):
    """A device without measured GEMM kernels says so, with the wider error its predictions carry."""
    data = run_json(capsys, "compare", "h100-sxm", "mi250x", "v100-sxm2-32gb", "ascend-910b", "mi300x")
    by = {e["name"]: e for e in data["entries"]}
    assert by["h100-sxm"]["gemm_constants"].startswith("fitted on measured GEMMs")
    for name in ("mi250x", "v100-sxm2-32gb", "ascend-910b", "mi300x"):
        assert "fitted" not in by[name]["gemm_constants"], name
        assert by[name]["compute_error"] > by["h100-sxm"]["compute_error"], name
        assert by[name]["step_error"] > by["h100-sxm"]["step_error"], name
    code, out, err = run(capsys, "compare", "mi300x", "ascend-910b")
    assert code == 0 and "GEMM constants from" in out and "not measured" in out, err


def test_compare_tables_highlight_and_systems(capsys):
    code, out, err = run(capsys, "compare", "dgx-h100", "gb200-nvl72", "cloudmatrix384")
    assert code == 0, err
    assert "scale-up domain" in out and "384" in out and "72" in out


def test_compare_default_set(capsys):
    code, out, _ = run(capsys, "compare")
    assert code == 0 and "h100-sxm" in out


@pytest.mark.parametrize("argv, message", [
    (["compare", "h100-sx"], "did you mean h100-sxm"),
    (["hardware", "show", "mi3000x"], "did you mean"),
    (["models", "show", "llama-3.1-4050b"], "did you mean"),
    (["hardware", "list", "--kind", "gpus"], "unknown kind"),
    (["compare", "pcie5-x16"], "compare takes accelerators or systems"),
    (["hardware", "show", "h100-sxm", "--nodes", "2"], "applies to systems"),
    (["hardware", "show", "dgx-h100", "--nodes", "0"], "positive integer"),
    (["models", "show", "missing.json"], "not found"),
    (["models", "show", "llama-3.1-8b", "--seq-len", "abc"], "Invalid value for '--seq-len'"),
    (["nonsense"], "No such command"),
    (["--hardware-db", "/nonexistent-dir", "compare"], "not found"),
    (["compare", "--hardware-db", "/nonexistent-dir"], "not found"),
    (["plan", "train", "--hardware-db"], "--hardware-db needs a directory"),
    (["plan", "train", "--deadline", "1e300"], "--deadline needs a number of days"),
    (["plan", "train", "--deadline", "nan"], "--deadline needs a number of days"),
    (["plan", "train", "--model", "gpt-oss-120b", "--routing", SYNTHETIC_ROUTING,
      "--affinity", "0.3"], "--affinity applies to synthetic routing"),
    (["plan", "serve", "--model", "gpt-oss-120b", "--routing", SYNTHETIC_ROUTING,
      "--affinity", "0.3"], "--affinity applies to synthetic routing"),
])
def test_user_errors_are_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("Error: ") and err.count("\n") == 1 and message in err
    assert "Traceback" not in err


def test_hardware_db_flag_and_env(capsys, tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text(
        "accelerators:\n  - name: my-gpu\n    extends: h100-sxm\n    display_name: Mine\n"
        "    sources: [\"my measurement\"]\n")
    assert "my-gpu" in run_json(capsys, "--hardware-db", str(tmp_path), "hardware", "list")["accelerators"]
    monkeypatch.setenv("PERFMODEL_HARDWARE_DB", str(tmp_path))
    assert "my-gpu" in run_json(capsys, "hardware", "list")["accelerators"]


def test_malformed_user_yaml_names_file_and_field(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("accelerators:\n  - name: my-gpu\n    extends: h100-sxm\n    hbm_gb: -3\n")
    code, _, err = run(capsys, "--hardware-db", str(tmp_path), "hardware", "list")
    assert code == 2 and "bad.yaml:accelerators.my-gpu:hbm_gb: needs 1 to 4096 GB, has -3" in err


def test_help_imports_no_heavy_module():
    # Fast start: the CLI module itself must not pull in numpy, scipy, ortools or pydantic.
    code = ("import sys, cli.app; heavy = [m for m in ('numpy', 'scipy', 'ortools', 'pydantic', 'yaml') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "perfmodel.cli", "hardware", "list", "--kind", "systems", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "dgx-h100" in json.loads(proc.stdout)["systems"]


def test_estimate_train_json(capsys):
    data = run_json(capsys, "estimate", "train", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--devices", "64",
                    "--tp", "8", "--pp", "2", "--global-batch", "256", "--seq-len", "4096", "--tokens", "1e9")
    result = data["result"]
    assert data["plan"]["dp"] == 4
    assert 0 < result["mfu"] <= 1 and result["step_time_s"] > 0
    assert result["memory_tiers"]["hbm"]["used_bytes"] <= result["memory_tiers"]["hbm"]["capacity_bytes"]
    assert result["run"]["time_s"] == pytest.approx(1e9 / result["tokens_per_s"])
    assert {v["bound"] for v in result["operators_s"].values()} <= {"compute", "memory"}


def test_estimate_serve_json(capsys):
    data = run_json(capsys, "estimate", "serve", "--model", "llama-3.1-70b", "--tp", "8", "--batch", "16")
    result = data["result"]
    assert result["ttft_s"] > result["tpot_s"] > 0 and result["max_batch"] >= 16


def test_estimate_tables(capsys):
    code, out, err = run(capsys, "estimate", "train")
    assert code == 0, err
    assert "step time by component" in out and "memory tiers per device" in out
    code, out, err = run(capsys, "estimate", "serve", "--model", "llama-3.1-8b", "--tp", "1")
    assert code == 0, err and "time per output token" in out


def test_infeasible_plan_exits_3(capsys):
    code, _, err = run(capsys, "estimate", "train", "--model", "llama-3.1-405b", "--tp", "8")
    assert code == 3 and err.startswith("Error: plan is infeasible: HBM per device: needs")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["estimate", "train", "--tp", "0"], "--tp needs a positive integer"),
    (["estimate", "train", "--recompute", "most"], "unknown --recompute value"),
    (["estimate", "train", "--zero", "4"], "--zero needs 0, 1, 2 or 3"),
    (["estimate", "train", "--system", "dgx-a100", "--precision", "fp8"], "does not support fp8"),
    (["estimate", "train", "--offload-optimizer", "cxl"], "cxl"),
    (["estimate", "serve", "--weight-precision", "int3"], "unknown --weight-precision value"),
    (["estimate", "train", "--devices", "-4"], "--devices needs a positive integer"),
])
def test_estimate_bad_input(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code in (2, 3) and message in err and err.count("\n") == 1


def test_validate_json(capsys):
    data = run_json(capsys, "validate")
    assert data["summary"]["exact"]["mape"] < 1e-3
    assert len(data["cases"]) >= 25


def test_plan_default_runs_and_proves(capsys):
    code, out, err = run(capsys, "plan")
    assert code == 0, err
    assert "recommended" in out and "OPTIMAL" in out and "step time by component" in out
    assert len(out.splitlines()) <= 60


def test_plan_train_json_is_reproducible(capsys):
    argv = ["plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--system", "mi300x-8x",
            "--devices", "8", "--global-batch", "64", "--seq-len", "4096", "--tokens", "1e10", "--pareto"]
    first = run_json(capsys, *argv)
    code, again, _ = run(capsys, *argv, "--json")
    assert json.loads(again) == first and again == json.dumps(first, sort_keys=True, indent=2) + "\n"
    assert first["evidence"]["status"] == "OPTIMAL" and "seconds" not in first["evidence"]
    assert first["best"]["system"] in ("dgx-h100", "mi300x-8x")
    assert first["pareto"] and first["evidence"]["evaluated"] > 0
    timed = run_json(capsys, *argv, "--timing")
    assert timed["evidence"]["seconds"] > 0


def test_plan_nothing_fits_exits_3_with_the_closest_plan(capsys):
    code, _, err = run(capsys, "plan", "train", "--model", "llama-3.1-405b", "--system", "dgx-h100", "--devices", "8",
                       "--no-offload", "--global-batch", "8")
    assert code == 3 and "closest:" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["plan", "train", "--objective", "fastest"], "unknown --objective value"),
    (["plan", "train", "--devices", "0"], "--devices needs 1 to 1,000,000"),
    (["plan", "train", "--budget", "-5"], "--budget needs a positive number"),
    (["plan", "train", "--budget", "5", "--tokens", "0"], "--budget needs --tokens"),
    (["plan", "train", "--precisions", "fp3"], "unknown --precisions value"),
    (["plan", "train", "--memory-headroom", "1.5"], "--memory-headroom needs a fraction"),
    (["plan", "train", "--system", "dgx-h1000"], "did you mean dgx-h100"),
])
def test_plan_bad_input(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1


def test_plan_serve_runs_on_the_issue_systems(capsys):
    for system in ("cloudmatrix384", "gb200-nvl72", "dgx-h100", "mi300x-8x"):
        data = run_json(capsys, "plan", "serve", "--model", "deepseek-v3", "--system", system, "--rate", "20")
        best = data["best"]
        assert data["evidence"]["status"] == "OPTIMAL", system
        assert best["ttft_p90_s"] <= 2.0 and best["tpot_p90_s"] <= 0.05
        assert all(p["system"] == system for p in best["pools"])


def test_plan_serve_tables_and_heterogeneous_candidates(capsys):
    code, out, err = run(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--system",
                         "mi300x-8x", "--rate", "5", "--input-len", "mean=2048,p50=1500,p90=4096",
                         "--output-len", "256", "--objective", "energy", "--pareto", "--verbose")
    assert code == 0, err
    assert "recommended deployment" in out and "fleet" in out and "Pareto front" in out and "evidence" in out


def test_plan_serve_recommends_a_deployment_a_framework_runs(capsys):
    """The recommended deployment runs on a serving framework as written; it is the optimum or one of
    its ties; --any-plan returns the optimum; the default output is short."""
    args = ("plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--rate", "10")
    doc = run_json(capsys, *args)
    assert any(why is None for why in doc["runs_on"].values())
    assert doc["recommended"] == doc["best"] or doc["recommended"] in [doc["top"][i] for i in doc["top_ties"]]
    assert run_json(capsys, *args, "--any-plan")["recommended"] == doc["best"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and "recommended deployment" in out and "single-configuration deployments" not in out
    assert len(out.splitlines()) <= 60


def test_plan_serve_prints_ranges_and_ties(capsys):
    data = run_json(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--rate", "5")
    pools = data["best"]["pools"]
    assert all(0.0 < max(p["ttft_error"], p["tpot_error"]) < 0.5 for p in pools)
    # a tie is a deployment whose objective, low end of its range, is within the best's high end
    error = lambda d: max(max(p["ttft_error"], p["tpot_error"]) for p in d["pools"])   # noqa: E731
    best = data["best"]["usd_per_hour"] * (1 + error(data["best"]))
    expected = [i for i, d in enumerate(data["top"]) if d != data["best"]
                and d["usd_per_hour"] * (1 - error(d)) <= best]
    assert data["top_ties"] == expected
    code, out, _ = run(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--rate", "5")
    assert code == 0 and "p90 range" in out


@pytest.mark.parametrize("argv, message", [
    (["plan", "serve", "--rate", "-1"], "--rate needs a positive number"),
    (["plan", "serve", "--rate", "1", "--concurrency", "5"], "not both"),
    (["plan", "serve", "--input-len", "p99=5"], "unknown --input-len field"),
    (["plan", "serve", "--input-len", "mean=abc"], "--input-len needs a number"),
    (["plan", "serve", "--output-len", "p50=100,p90=50"], "p90 (50) needs to be at least p50"),
    (["plan", "serve", "--modes", "together"], "unknown --modes value"),
    (["plan", "serve", "--kv-precisions", "fp2"], "unknown --kv-precisions value"),
    (["plan", "serve", "--system", "cloudmatrix384", "--objective", "cost"], "no candidate system has a price"),
])
def test_plan_serve_bad_input(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1


def test_plan_serve_impossible_slo_exits_3(capsys):
    code, _, err = run(capsys, "plan", "serve", "--model", "llama-3.1-70b", "--tpot-p90-ms", "0.01")
    assert code == 3 and "no deployment meets" in err


def test_place_experts_json_map_and_reproducible(capsys, tmp_path):
    argv = ["place-experts", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--devices", "8", "--zipf", "1.2",
            "--replicas", "4", "--time-limit", "2"]
    first = run_json(capsys, *argv)
    code, again, _ = run(capsys, *argv, "--json")
    assert json.loads(again) == first
    mapping = first["placement"]
    assert len(mapping) == 32 and all(len(layer) == 8 for layer in mapping.values())
    assert first["methods"]["affinity"]["imbalance"] <= first["methods"]["round-robin"]["imbalance"]


def test_place_experts_reads_routing_files(capsys, tmp_path):
    import numpy as np

    loads = np.arange(1, 9, dtype=float)[None, :].repeat(32, axis=0)
    (tmp_path / "r.json").write_text(json.dumps({"loads": loads.tolist()}))
    np.savez(tmp_path / "r.npz", loads=loads)
    (tmp_path / "r.csv").write_text("layer,expert,tokens\n" + "".join(
        f"{l},{e},{loads[l, e]}\n" for l in range(32) for e in range(8)))
    results = [run_json(capsys, "place-experts", "--model", "mixtral-8x7b", "--devices", "4", "--routing",
                        str(tmp_path / name), "--replicas", "0", "--time-limit", "1")["methods"]["greedy"]
               for name in ("r.json", "r.npz", "r.csv")]
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("content, name, message", [
    ("{\"loads\": [[1, 2], [3]]}", "r.json", "rows of one length"),
    ("{}", "r.json", "needs a JSON object with 'loads'"),
    ("a,b\n1,2\n", "r.csv", "needs a header 'layer,expert,tokens'"),
    ("x", "r.txt", "needs .json, .csv or .npz"),
    ("{\"loads\": [[1, 2, 3]]}", "r.json", "routing statistics have 3 experts"),
])
def test_bad_routing_files(capsys, tmp_path, content, name, message):
    (tmp_path / name).write_text(content)
    code, _, err = run(capsys, "place-experts", "--model", "mixtral-8x7b", "--devices", "4", "--routing",
                       str(tmp_path / name))
    assert code == 2 and message in err and err.count("\n") == 1


def test_plan_train_with_skewed_routing(capsys):
    data = run_json(capsys, "plan", "train", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--devices", "16",
                    "--global-batch", "64", "--seq-len", "4096", "--zipf", "1.5", "--no-offload")
    assert data["best"]["plan"]["moe_imbalance"] >= 1.0


@pytest.mark.parametrize("case_id", ["megatron-t2-ptdp-174.6b-768", "megatron-t1-1008b", "cloudmatrix-decode-50ms"])
def test_validation_cases_give_the_same_number_at_the_cli(capsys, tmp_path, db, case_id):
    # `validate` predicts each case through the request its flags make; typing them gives the same number.
    import shlex

    import yaml

    from perfmodel.model import TransformerSpec
    from perfmodel.validation import command, load_cases, predict, published_flops

    case = next(c for c in load_cases() if c.id == case_id)
    argv = shlex.split(command(case))[1:]
    if not isinstance(case.model, str):       # an inline spec: written where the command names it
        path = tmp_path / f"{case.id}.yaml"
        path.write_text(yaml.safe_dump(TransformerSpec.model_validate(case.model).model_dump(mode="json")))
        argv[argv.index("--model") + 1] = str(path)
    result = run_json(capsys, *argv)["result"]
    predicted = predict(case, db).predicted
    if case.kind == "training":
        spec = TransformerSpec.model_validate(case.model) if not isinstance(case.model, str) else None
        from perfmodel.catalog import find_model

        flops = published_flops(case, spec or find_model(case.model))
        per_device = flops / result["step_time_s"] / case.devices
        got = per_device / 1e12 if case.measured.metric == "tflops_per_device" else \
            per_device / db.accelerator(db.system(case.system).accelerator).peak(case.plan.get("precision", "bf16"))
    else:
        got = result["decode_tokens_per_s_per_device"] * case.devices_per_unit
    assert got == pytest.approx(predicted, rel=1e-9)


def test_deepseek_int8_on_four_npus_exits_3_naming_hbm(capsys):
    # 671B int8 weights over 4 NPUs at tp 4 x ep 4: 168 GB of weights per device before the KV cache.
    code, out, err = run(capsys, "estimate", "serve", "--model", "deepseek-v3", "--system", "cloudmatrix384",
                         "--devices", "4", "--tp", "4", "--ep", "4", "--batch", "2", "--weight-precision", "int8",
                         "--activation-precision", "a8")
    assert code == 3 and out == ""
    needs = float(err.split("needs ")[1].split(" GB")[0])
    assert "HBM per device" in err and needs >= 168


def test_names_are_case_insensitive_in_every_plan_command(capsys):
    """`plan train --system DGX-H100` once searched and then crashed on the result lookup."""
    code, out, err = run(capsys, "plan", "train", "--model", "llama-3.1-8b", "--system", "DGX-H100",
                         "--global-batch", "64", "--seq-len", "4096", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out)["best"]["system"] == "dgx-h100"
    code, out, err = run(capsys, "plan", "serve", "--model", "Llama-3.1-8B", "--system", "DGX-H100", "--rate", "5",
                         "--json")
    assert code == 0 and "Traceback" not in err, err


def test_version_is_the_installed_package_version(capsys):
    from importlib.metadata import version

    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"perfmodel {version('perfmodel')}"


def test_a_device_without_measured_kernels_says_so_and_widens_its_range(capsys):
    """The same plan on a device with kernel fits and on one without: only the second carries the
    caveat, and its range is wider relative to its prediction."""
    args = ("estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "1", "--pp", "1", "--dp", "8",
            "--global-batch", "64", "--seq-len", "4096")
    fitted = run_json(capsys, *args, "--system", "dgx-h100")["result"]
    unfitted = run_json(capsys, *args, "--system", "mi300x-8x")["result"]
    assert "caveat" not in fitted["constants_from"]
    assert "has no measured kernels" in unfitted["constants_from"]["caveat"]

    def width(r):
        low, high = r["step_time_range_s"]
        return (high - low) / r["step_time_s"]
    assert width(unfitted) > width(fitted)
    code, out, err = run(capsys, *args, "--system", "mi300x-8x")
    assert code == 0 and "mi300x has no measured kernels" in " ".join(out.split()), err


def test_plan_train_recommends_by_its_stated_rule(capsys):
    """The recommendation is a plan within the optimum's range that a framework runs as written,
    without offload, with the fewest parallel dimensions among those; --any-plan returns the optimum;
    --framework keeps to that framework."""
    args = ("plan", "train", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--devices", "64",
            "--global-batch", "512", "--seq-len", "8192")
    doc = run_json(capsys, *args)
    best, answer = doc["best"], doc["recommended"]
    assert answer["runs_on"] and {"megatron", "nemo"} & set(answer["runs_on"])
    assert [name for name, why in doc["runs_on"].items() if why is None] == answer["runs_on"]
    assert best["step_time_s"] <= answer["step_time_s"] <= best["step_time_high_s"]
    assert all(answer["plan"][k] == "hbm" for k in ("optimizer_place", "grad_place", "param_place"))
    assert answer["hbm_fill"] <= 1 - doc["memory_headroom"] + 1e-12 and doc["memory_headroom"] == 0.05
    assert answer["reproduce"].startswith("perfmodel estimate train") and "framework" in doc["recommendation"]
    dimensions = lambda row: sum(row["plan"][k] > 1 for k in ("tp", "pp", "cp", "ep"))  # noqa: E731
    assert dimensions(answer) <= dimensions(best)
    fastest = run_json(capsys, *args, "--any-plan")
    assert fastest["recommended"]["plan"] == fastest["best"]["plan"] == best["plan"]
    only = run_json(capsys, "plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--devices", "8",
                    "--global-batch", "64", "--framework", "torchtitan")
    assert only["recommended"]["runs_on"] == ["torchtitan"]


def test_plan_train_deadline_and_a_run_over_a_year(capsys):
    """--objective cost without --deadline warns when the run takes more than a year; with
    --deadline 90 every listed plan finishes in 90 days, and an impossible deadline exits 3 naming it."""
    args = ("plan", "train", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--global-batch", "512",
            "--seq-len", "8192", "--devices", "64", "--devices", "128", "--devices", "256", "--objective", "cost")
    doc = run_json(capsys, *args, "--tokens", "15e12")
    assert doc["recommended"]["run_time_s"] > 365 * 86400 and "years" in doc["warnings"][0]
    code, out, _ = run(capsys, *args, "--tokens", "15e12")
    assert code == 0 and "--deadline DAYS" in " ".join(out.split())
    args = args[:10] + ("--devices", "32", "--devices", "64", "--objective", "cost")   # 300 and 150 days
    cheapest = run_json(capsys, *args)
    assert any(row["run_time_s"] > 200 * 86400 for row in cheapest["top"]) and not cheapest["warnings"]
    kept = run_json(capsys, *args, "--deadline", "200")
    assert all(row["run_time_s"] <= 200 * 86400 for row in [kept["best"], kept["recommended"]] + kept["top"])
    code, _, err = run(capsys, *args, "--deadline", "1")
    assert code == 3 and "the deadline binds" in err and err.count("\n") == 1


def test_a_large_bubble_names_the_interleave_that_shortens_it(capsys):
    """A pipeline whose bubble takes most of the step without virtual stages gets one line naming the
    interleave that shortens the step most and what it predicts; an interleaved plan gets none."""
    args = ("estimate", "train", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--devices", "64", "--tp", "8",
            "--pp", "8", "--dp", "1", "--zero", "1", "--recompute", "full", "--global-batch", "8", "--seq-len", "4096")
    doc = run_json(capsys, *args)["result"]
    assert "--interleave" in doc["hint"] and doc["time_components_s"]["pipeline bubble"] > 0.25 * doc["step_time_s"]
    faster = float(doc["hint"].split(" predicts ")[1].split(" s")[0])
    assert faster < doc["step_time_s"]
    assert "hint" not in run_json(capsys, *args[:-4], "--interleave", "2", "--global-batch", "8", "--seq-len",
                                  "4096")["result"]


def test_serving_failures_name_what_binds(capsys):
    """A failure names the target that binds and by how much, never one that is met: a TTFT target
    under the fastest prefill, or, with every target met unloaded, the rate under --max-devices."""
    code, _, err = run(capsys, "plan", "serve", "--model", "llama-3.1-8b", "--ttft-p90-ms", "10")
    assert code == 3 and "over the 10 ms target by" in err and "TPOT" not in err and err.count("\n") == 1
    code, _, err = run(capsys, "plan", "serve", "--model", "llama-3.1-8b", "--max-devices", "1", "--rate", "1000")
    assert code == 3 and "the request rate binds" in err and "--max-devices 1" in err and "over the" not in err


def test_a_power_cap_that_destabilizes_the_queue_says_so(capsys):
    """Capped below what keeps the uncapped optimum's prefill queue stable, its TTFT p99 is unbounded:
    said in words (never 'infx'), null in JSON."""
    args = ("plan", "serve", "--power-cap-w", "250")
    laid = run_json(capsys, *args)["power_cap"]["uncapped_optimum_under_cap"]
    assert laid["capped"]["queue_unstable"] and laid["capped"]["ttft_p99_s"] is None
    assert laid["ttft_p99_slowdown"] is None and laid["tpot_p90_slowdown"] > 1
    code, out, _ = run(capsys, *args)
    assert code == 0 and "unbounded" in out and "inf" not in out.replace("information", "")


def test_a_win_resting_on_unmeasured_constants_or_one_price_says_so(capsys):
    """Across systems, a winner without kernel measurements against a measured rival, and any cost
    ranking (one quoted price per system), each get one line."""
    args = ("plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--system", "mi300x-8x",
            "--devices", "8", "--global-batch", "64", "--objective", "cost")
    doc = run_json(capsys, *args)
    code, out, _ = run(capsys, *args)
    text = " ".join(out.split())
    assert code == 0 and "the cost ranking rests on one quoted price per system" in text
    if doc["recommended"]["system"] == "mi300x-8x":
        assert "whose kernels are unmeasured, against measured dgx-h100" in text
    code, out, _ = run(capsys, "plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64")
    assert "rests on" not in out


def test_when_no_framework_runs_the_answer_none_points_to_another(capsys):
    """--any-plan keeps an optimum no framework runs; each framework then says what it lacks, without
    sending the reader to another framework that does not run it either (no circle)."""
    code, out, err = run(capsys, "plan", "train", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--devices", "64",
                         "--global-batch", "512", "--seq-len", "8192", "--any-plan")
    text = " ".join(out.split())
    assert code == 0, err
    if "no framework perfmodel exports runs this plan" in text:
        assert "use --export" not in text and "--framework FRAMEWORK finds the best" in text


def test_several_systems_show_each_ones_best_with_its_price_and_constants(capsys):
    """Over several systems the answer comes with each system's best plan, the price per device-hour
    it pays and whether its kernels are measured; JSON lists them best first."""
    args = ("plan", "train", "--model", "llama-3.1-8b", "--system", "dgx-h100", "--system", "mi300x-8x",
            "--devices", "8", "--global-batch", "64", "--objective", "cost")
    doc = run_json(capsys, *args)
    assert {row["system"] for row in doc["per_system"]} == {"dgx-h100", "mi300x-8x"}
    costs = [row["run_cost_usd"] for row in doc["per_system"]]
    assert costs == sorted(costs) and doc["per_system"][0]["run_cost_usd"] == doc["best"]["run_cost_usd"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and "best plan per system" in out and "$1.85" in out and "$3.99" in out
    assert "unmeasured" in out and "fitted" in out


@pytest.mark.parametrize("argv", [
    ["hardware", "show", "h100", "--json"],
    ["models", "list"],
    ["validate", "--csv"],
    ["plan", "--help"],
    ["plan", "train", "--help"],
    ["plan", "trian"],
    ["estimate"],
    ["estimate", "train", "--model", "llama3.1-8b", "--system", "dgx-a100", "--devices", "8", "--tp", "8",
     "--global-batch", "8", "--seq-len", "2048", "--json"],
    ["--hardware-db", "no-such-dir", "models", "list"],
    ["--help"],
    ["frobnicate"],
])
def test_a_command_built_alone_answers_as_the_whole_app(capsys, monkeypatch, argv):
    """main builds only the command the line names (cli.app.only); its output, errors and exit code
    are those of the whole app, for commands, groups, help, misspelt names and global options."""
    from perfmodel.cli import app as cli_app

    code = main(argv)
    alone = capsys.readouterr()
    monkeypatch.setattr(cli_app, "only", lambda group, args: group)
    assert main(argv) == code
    assert capsys.readouterr() == alone


def test_only_keeps_the_named_path():
    from perfmodel.cli.app import app, only

    pruned = only(app, ["--hardware-db", "x", "plan", "train", "--json"])
    assert [g.name for g in pruned.registered_groups] == ["plan"] and not pruned.registered_commands
    assert [c.name for c in pruned.registered_groups[0].typer_instance.registered_commands] == ["train"]
    assert only(app, ["plan", "--json"]).registered_groups[0].typer_instance is not None
    assert len(only(app, ["plan", "--json"]).registered_groups[0].typer_instance.registered_commands) > 1
    assert only(app, ["--help"]) is app and only(app, ["nonsense"]) is app
