"""What a serious CLI does beside its answers: the JSON schema of a hardware file, a Hugging Face model
directory wherever a config.json goes, the validated database cached by content, CSV beside JSON,
shell completion of model and system names, choices in --help, and nothing generic installed."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.cli.app import main

DATA = Path(__file__).parents[1] / "data"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_hardware_schema_validates_the_readme_example(capsys, tmp_path):
    import yaml

    code, out, _ = run(capsys, "hardware", "schema")
    schema = json.loads(out)
    assert code == 0 and set(schema["properties"]) >= {"accelerators", "systems", "memory", "links"}
    assert schema["additionalProperties"] is False
    accelerator = schema["$defs"]["Accelerator"]
    assert "hbm_gb" in accelerator["properties"] and "sources" in accelerator["properties"]
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = yaml.safe_load(readme.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert set(example) <= set(schema["properties"])


def test_a_hugging_face_model_directory_is_a_model(capsys, tmp_path):
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    shutil.copy(DATA / "hf" / "llama-3.1-8b.json", folder / "config.json")
    code, out, err = run(capsys, "models", "show", str(folder), "--json")
    assert code == 0, err
    code, direct, _ = run(capsys, "models", "show", str(folder / "config.json"), "--json")
    assert json.loads(out)["derived"] == json.loads(direct)["derived"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "estimate", "train", "--model", str(empty))
    assert code == 2 and "has no config.json" in err


def test_the_validated_database_is_cached_by_content(tmp_path, monkeypatch):
    from perfmodel.hardware_db import loader

    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path / "cache"))
    user = tmp_path / "db"
    user.mkdir()
    (user / "gpu.yaml").write_text("accelerators:\n  - name: h100-sxm\n    extends: h100-sxm\n    tdp_w: 650\n")
    first = loader.load_database([user])
    assert len(list((tmp_path / "cache").glob("db-*.pickle"))) == 1
    calls = []
    monkeypatch.setattr(loader, "_validated", lambda files: calls.append(files) or first)
    again = loader.load_database([user])
    assert calls == [] and again.accelerator("h100-sxm").tdp_w == 650          # from the cache
    (user / "gpu.yaml").write_text("accelerators:\n  - name: h100-sxm\n    extends: h100-sxm\n    tdp_w: 600\n")
    loader.load_database([user])
    assert len(calls) == 1                                                        # an edit is a new key
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", "off")
    calls.clear()
    loader.load_database([user])
    assert len(calls) == 1


def test_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    from perfmodel.hardware_db import loader

    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    loader.load_database()
    for f in tmp_path.glob("db-*.pickle"):
        f.write_bytes(b"not a pickle")
    assert loader.load_database().accelerator("h100-sxm").hbm_bytes == 80 * 2**30


@pytest.mark.parametrize("argv,column", [
    (["estimate", "train", "--csv"], "component"),
    (["estimate", "serve", "--csv"], "phase"),
    (["plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64", "--csv"], "step_time_s"),
    (["compare", "--csv"], "peak_bf16_flops"),
    (["hardware", "list", "--csv"], "display_name"),
    (["validate", "--csv"], "predicted"),
])
def test_csv_beside_json(argv, column, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and column in rows[0]
    assert not any(cell.lower() in ("nan", "inf", "-inf") for row in rows for cell in row.values())


def test_options_list_their_choices_in_help(capsys):
    code, out, _ = run(capsys, "plan", "train", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "[time|cost|energy|devices]" in text and "megatron|nemo|torchtitan|deepspeed" in text
    code, out, _ = run(capsys, "estimate", "train", "--help")
    assert "[none|selective|full|modules]" in " ".join(out.split())


def test_shell_completion_names_models_and_systems(tmp_path):
    env = {**os.environ, "_PERFMODEL_COMPLETE": "complete_bash", "COMP_WORDS": "perfmodel plan train --model llama-3.1",
           "COMP_CWORD": "4", "PERFMODEL_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "perfmodel.cli"], env=env, capture_output=True, text=True, timeout=60)
    assert "llama-3.1-70b" in out.stdout.split()
    env["COMP_WORDS"] = "perfmodel estimate serve --system dgx"
    out = subprocess.run([sys.executable, "-m", "perfmodel.cli"], env=env, capture_output=True, text=True, timeout=60)
    assert {"dgx-h100", "dgx-b200"} <= set(out.stdout.split())


def test_installed_modules_live_under_the_perfmodel_namespace():
    import tomllib

    config = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    assert all(p == "perfmodel" or p.startswith("perfmodel.") for p in packages)
    assert config["project"]["scripts"]["perfmodel"].startswith("perfmodel.")
    import importlib

    for module in ("perfmodel.cli.app", "perfmodel.hardware_db.loader", "perfmodel.search.train"):
        importlib.import_module(module)
    assert "cli" not in sys.modules and "search" not in sys.modules and "hardware_db" not in sys.modules


def test_the_search_api_returns_what_the_cli_prints(capsys):
    import perfmodel

    planning = perfmodel.plan_train(model="llama-3.1-8b", devices=(8,), global_batch=64)
    code, out, _ = run(capsys, "plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--global-batch", "64",
                       "--json")
    assert code == 0 and json.loads(out)["best"]["plan"] == planning.best.plan_dict()
    from perfmodel.hardware_db.errors import UnknownNameError

    with pytest.raises(UnknownNameError):
        perfmodel.plan_train(model="no-such-model")
