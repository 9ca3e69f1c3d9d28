"""Hostile input: whatever a user types or feeds, the tool answers with exit 0, 2 or 3 and one line.

Never a traceback, a hang, NaN or inf. YAML is only ever read with a safe loader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.app import main

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

hostile_numbers = st.sampled_from(["0", "-1", "-0.5", "1e12", "1000000", "999999999999999999999", "nan", "inf",
                                   "-inf", "1e-30", "abc", "", "80GB", "3.35TB/s", "0x10", "1,000", "2.5", "7"])
hostile_names = st.sampled_from(["h100", "H100-SXM", "dgx-h1000", "", "../../etc/passwd", "llama-3.1-8b",
                                 "deepseek-v3", "gpt-5", "mi300x", "cloudmatrix384", "pcie5-x16", "🙂", "a" * 300,
                                 "frontier", "ddr5-4800-8ch", "nvme-gen5"])

TEMPLATES = [
    ["hardware", "show", "{name}"],
    ["hardware", "show", "{name}", "--nodes", "{num}"],
    ["hardware", "list", "--kind", "{name}"],
    ["models", "show", "{name}", "--seq-len", "{num}"],
    ["compare", "{name}", "{name}"],
    ["estimate", "train", "--model", "{name}", "--tp", "{num}"],
    ["estimate", "train", "--devices", "{num}", "--global-batch", "{num}"],
    ["estimate", "train", "--seq-len", "{num}", "--tokens", "{num}", "--zero", "{num}"],
    ["estimate", "train", "--precision", "{name}", "--recompute", "{name}"],
    ["estimate", "serve", "--model", "{name}", "--batch", "{num}", "--tp", "{num}"],
    ["estimate", "serve", "--input-len", "{num}", "--output-len", "{num}", "--weight-precision", "{name}"],
    ["plan", "train", "--model", "llama-3.1-8b", "--devices", "{num}", "--global-batch", "{num}", "--no-offload"],
    ["plan", "train", "--model", "{name}", "--system", "{name}", "--devices", "8", "--budget", "{num}"],
    ["plan", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tokens", "{num}", "--objective", "{name}"],
    ["plan", "serve", "--model", "llama-3.1-8b", "--rate", "{num}", "--input-len", "{num}", "--modes", "colocated"],
    ["plan", "serve", "--model", "llama-3.1-8b", "--tpot-p90-ms", "{num}", "--system", "{name}", "--modes",
     "colocated"],
    ["place-experts", "--model", "{name}", "--devices", "{num}", "--time-limit", "1"],
    ["place-experts", "--model", "mixtral-8x7b", "--devices", "8", "--replicas", "{num}", "--zipf", "{num}",
     "--time-limit", "1"],
    ["{name}"],
    ["plan", "train", "--{name}", "{num}"],
]


def fill(template, names, nums):
    out = []
    for part in template:
        if "{name}" in part:
            out.append(part.replace("{name}", names.pop()))
        elif "{num}" in part:
            out.append(part.replace("{num}", nums.pop()))
        else:
            out.append(part)
    return out


def assert_clean(code, out, err, argv):
    assert code in (0, 2, 3), (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, argv
    if code:
        assert err.startswith("Error: ") and err.count("\n") == 1, (argv, err)
    assert not re.search(r"(?<![A-Za-z])(nan|inf)(?![A-Za-z])", out, flags=re.IGNORECASE), (argv, out[:500])


@FAST
@given(template=st.sampled_from(TEMPLATES), names=st.lists(hostile_names, min_size=4, max_size=4),
       nums=st.lists(hostile_numbers, min_size=4, max_size=4), json_flag=st.booleans())
def test_cli_survives_hostile_arguments(capsys, template, names, nums, json_flag):
    argv = fill(template, list(names), list(nums)) + (["--json"] if json_flag else [])
    code = main(argv)
    out, err = capsys.readouterr()
    assert_clean(code, out, err, argv)


builtin = sorted((Path(__file__).parents[2] / "hardware_db" / "data").glob("*.yaml"))


@FAST
@given(source=st.sampled_from(builtin), cut=st.floats(0, 1), garbage=st.binary(max_size=64),
       mode=st.sampled_from(["truncate", "garbage", "both", "swap-units", "drop-field", "extra-field"]))
def test_yaml_loaders_survive_broken_files(tmp_path_factory, capsys, source, cut, garbage, mode):
    text = source.read_text()
    if mode in ("truncate", "both"):
        text = text[: int(len(text) * cut)]
    if mode in ("garbage", "both"):
        text = text + garbage.decode("latin-1")
    if mode == "swap-units":
        text = text.replace("hbm_tb_per_s: ", "hbm_tb_per_s: 1000").replace("_gb:", "_tb:")
    if mode == "drop-field":
        text = re.sub(r"\n\s+sources:.*", "\n", text, count=1)
    if mode == "extra-field":
        text = text.replace("display_name:", "colour: blue\n    display_name:", 1)
    folder = tmp_path_factory.mktemp("db")
    (folder / "broken.yaml").write_bytes(text.encode("utf-8", errors="replace"))
    code = main(["--hardware-db", str(folder), "hardware", "list", "--json"])
    out, err = capsys.readouterr()
    assert_clean(code, out, err, mode)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
                           | st.text(max_size=10), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=6), max_leaves=20)
config_keys = st.sampled_from(["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
                               "num_local_experts", "num_experts_per_tok", "layer_types", "sliding_window"])


@FAST
@given(config=st.dictionaries(config_keys, json_values, max_size=10),
       model_type=st.sampled_from(["llama", "qwen2", "mixtral", "deepseek_v3", "gpt_oss", "qwen3_moe", "bert", None]))
def test_config_json_reader_survives_garbage(tmp_path_factory, capsys, config, model_type):
    if model_type is not None:
        config["model_type"] = model_type
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(config))
    code = main(["models", "show", str(path), "--json"])
    out, err = capsys.readouterr()
    assert_clean(code, out, err, config)


def test_absurd_scales_answer_quickly(capsys):
    for argv in (["plan", "train", "--devices", "1000000", "--no-offload"],
                 ["plan", "train", "--tokens", "1e12", "--global-batch", "1", "--devices", "8"],
                 ["estimate", "train", "--devices", "1000000", "--tp", "8"],
                 ["estimate", "serve", "--batch", "100000000"],
                 ["hardware", "show", "frontier", "--nodes", "1000000"],
                 ["place-experts", "--devices", "1000000"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert_clean(code, out, err, argv)


def test_yaml_is_only_read_with_a_safe_loader():
    root = Path(__file__).parents[2]
    for path in list(root.glob("*/**/*.py")):
        if "tests" in path.parts or ".venv" in path.parts:
            continue
        text = path.read_text()
        assert not re.search(r"yaml\.(load|unsafe_load|full_load)\(", text), path
        assert "Loader=" not in text, path
