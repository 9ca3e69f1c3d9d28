"""Hostile input: whatever a user types or a file holds, every run keeps the contract of ``tests/fuzzing.py``.

Exit 0, 2 or 3; a failure is one line; never a traceback, a warning, a hang, NaN or inf. A test
for each hostile input found so far, then a seeded profile of generated command lines and files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzzing

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

builtin = sorted((Path(__file__).parents[2] / "hardware_db" / "data").glob("*.yaml"))


@FAST
@given(source=st.sampled_from(builtin), cut=st.floats(0, 1), garbage=st.binary(max_size=64),
       mode=st.sampled_from(["truncate", "garbage", "both", "swap-units", "drop-field", "extra-field"]))
def test_yaml_loaders_survive_broken_files(tmp_path_factory, source, cut, garbage, mode):
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
    fuzzing.check(fuzzing.run(["--hardware-db", str(folder), "hardware", "list", "--json"]))


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False)
                           | st.text(max_size=10), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=6), max_leaves=20)
config_keys = st.sampled_from(["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
                               "num_local_experts", "num_experts_per_tok", "layer_types", "sliding_window"])


@FAST
@given(config=st.dictionaries(config_keys, json_values, max_size=10),
       model_type=st.sampled_from(["llama", "qwen2", "mixtral", "deepseek_v3", "gpt_oss", "qwen3_moe", "bert", None]))
def test_config_json_reader_survives_garbage(tmp_path_factory, config, model_type):
    if model_type is not None:
        config["model_type"] = model_type
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(config))
    fuzzing.check(fuzzing.run(["models", "show", str(path), "--json"]))


def test_absurd_scales_answer_quickly():
    for argv in (["plan", "train", "--devices", "1000000", "--no-offload"],
                 ["plan", "train", "--tokens", "1e12", "--global-batch", "1", "--devices", "8"],
                 ["estimate", "train", "--devices", "1000000", "--tp", "8"],
                 ["estimate", "serve", "--batch", "100000000"],
                 ["hardware", "show", "frontier", "--nodes", "1000000"],
                 ["place-experts", "--devices", "1000000"]):
        fuzzing.check(fuzzing.run(argv))


def test_yaml_is_only_read_with_a_safe_loader():
    # One parser for every YAML file, built on PyYAML's SafeConstructor: plain data only.
    import yaml

    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.hardware_db.files import BoundedSafeLoader, parse_yaml

    root = Path(__file__).parents[2]
    for path in [p for package in ("cli", "hardware_db", "perfmodel", "search") for p in (root / package).rglob("*.py")]:
        if path.name == "files.py":
            continue
        text = path.read_text()
        assert not re.search(r"yaml\.(load|unsafe_load|full_load|safe_load)\(", text), path
        assert "Loader=" not in text, path
    assert issubclass(BoundedSafeLoader, yaml.constructor.SafeConstructor)
    assert not issubclass(BoundedSafeLoader, yaml.constructor.FullConstructor)
    with pytest.raises(SpecError, match="could not determine a constructor"):
        parse_yaml("x: !!python/object/apply:os.system ['true']", "t")


# --- every reproducer of issue 13: exit 2 (or 3) with one line, quickly, in bounded memory -----------

MIXTRAX = ["place-experts", "--model", "mixtral-8x7b", "--devices", "8", "--time-limit", "1"]


def outcome_of(argv, max_mib=300.0):
    """Run the CLI in-process under the contract, with its traced peak memory bounded (how long it
    takes depends on the machine: benchmarks/ measure that)."""
    import tracemalloc

    tracemalloc.start()
    try:
        outcome = fuzzing.run(argv)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    fuzzing.check(outcome)
    assert peak < max_mib, (argv, peak)
    return outcome


@pytest.mark.parametrize("argv, code, message", [
    (["place-experts", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--devices", "8", "--time-limit", "1",
      "--seed", "-35184372088832", "--json"], 2, "--seed needs 0 to 2^63 - 1"),
    (MIXTRAX + ["--system", "cloudmatrix384", "--replicas", "32", "--routing", ""], 2, "--routing needs the path"),
    (["plan", "train", "--model", "llama-3.1-8b", "--system", "cloudmatrix384", "--devices", "8", "--global-batch",
      "64", "--seq-len", "4096", "--objective", "energy", "--precisions", "fp8", "--max-devices", "16",
      "--power-cap-kw", "1", "--json"], 2, "none is listed in the datasheet of cloudmatrix384 (ascend-910c)"),
    (["plan", "train", "--devices", "10000000"], 2, "--devices needs 1 to 1,000,000"),
    (["plan", "train", "--objective", "ti\nme"], 2, "'ti\\nme'; did you mean time?"),
    (["plan", "train", "--objective", "1time"], 2, "did you mean time?"),
    (["place-experts", "--tokens-per-layer", "0", "--zipf", "1"], 2, "1 to 1e+15 tokens"),
    # Found by benchmarks/bench_fuzz.py: an int64 overflow inside CP-SAT, and users that overflow a rate.
    (["plan", "serve", "--max-devices", "9223372036854775808", "--json"], 2, "--max-devices needs 1 to 1,000,000"),
    (["plan", "serve", "--concurrency", "99999999999999"], 2, "--concurrency needs 1 to 1,000,000,000 users"),
    # Found by the generated profile: a chart into a folder that cannot be made, or onto a folder.
    (["estimate", "serve", "--plot", "/proc/no-such/a.png"], 2, "--plot /proc/no-such/a.png: cannot write"),
    (["estimate", "train", "--export", "megatron", "--out", "/proc/no-such"], 2, "--out /proc/no-such: cannot write"),
    (["estimate", "train", "--zero", "3", "--prefetch", "-1"], 2, "--prefetch needs 0 to 64 layers, has -1"),
])
def test_reproducers_on_the_command_line(argv, code, message):
    outcome = outcome_of(argv)
    assert outcome.code == code and message in outcome.err, outcome.err


def test_a_system_name_in_any_case_is_the_system():
    argv = ["plan", "train", "--model", "llama-3.1-8b", "--system", "DGX-H100", "--devices", "8", "--global-batch",
            "64", "--seq-len", "4096", "--no-offload", "--json"]
    outcome = outcome_of(argv)
    assert outcome.code == 0 and json.loads(outcome.out)["best"]["system"] == "dgx-h100"


def _npz(**arrays) -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def _npz_claiming(shape) -> bytes:
    """An archive whose 'loads' header claims ``shape`` but holds 16 bytes of data."""
    import io
    import zipfile

    import numpy as np

    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": shape})
    member.write(b"\0" * 16)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("loads.npy", member.getvalue())
    return buffer.getvalue()


def _deflate_bomb() -> bytes:
    """'loads' of 1,000 x 100,000 zeros (800 MB) compressed to about 0.8 MB."""
    import io
    import zipfile

    import numpy as np

    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False, "shape": (1000, 100_000)})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("loads.npy", "w",
                                                                                     force_zip64=True) as fh:
        fh.write(member.getvalue())
        zeros = bytes(8 << 20)
        for _ in range(100):
            fh.write(zeros)
    return buffer.getvalue()


LAUGHS = "".join(f"- &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" if i else "- &l0 [lol, lol, lol, lol, lol]\n"
                 for i in range(12))
DEEP_FLOW = "[" * 100_000 + "]" * 100_000

ROUTING_CASES = {
    "empty expert axis": ("r.json", b'{"loads": [[]]}', "(layers x experts) table"),
    "truncated zip": ("r.npz", _npz(loads=[[1.0] * 8] * 32)[:200], "not a NumPy .npz archive"),
    "empty npz": ("r.npz", b"", "not a NumPy .npz archive"),
    "all-zero loads": ("r.npz", _npz(loads=[[0.0] * 8] * 32), "tokens in every layer"),
    "10^6 x 10^6 header": ("r.npz", _npz_claiming((10**6, 10**6)), "its header claims 1,000,000,000,000"),
    "pickled object array": ("r.npz", _npz(loads=[[None] * 8] * 32), "'loads' needs integers or floats, has object"),
    "1e308 tokens twice": ("r.csv", b"layer,expert,tokens\n0,0,1e308\n0,0,1e308\n", "'tokens' needs a count"),
    "400-digit integer": ("r.json", b'{"loads": [[1' + b"0" * 400 + b"]]}", "an integer of 401 digits"),
    "row 100000,100000": ("r.csv", b"layer,expert,tokens\n100000,100000,1\n", "'layer' 100000 is outside"),
    "layer 10,000,000": ("r.csv", b"layer,expert,tokens\n10000000,0,1\n", "'layer' 10000000 is outside"),
    "one layer for 32": ("r.json", b'{"loads": [[1, 2, 3, 4, 5, 6, 7, 8]]}', "have 1 MoE layers, mixtral-8x7b has 32"),
    "deep JSON": ("r.json", b"[" * 1000 + b"]" * 1000, "nested deeper than 32 levels"),
    "NaN literal": ("r.json", b'{"loads": [[NaN]]}', "NaN is not a number JSON allows"),
}


@pytest.mark.parametrize("case", sorted(ROUTING_CASES))
def test_hostile_routing_files(tmp_path, case):
    name, data, message = ROUTING_CASES[case]
    (tmp_path / name).write_bytes(data)
    outcome = outcome_of(MIXTRAX + ["--routing", str(tmp_path / name)])
    assert outcome.code == 2 and message in outcome.err, outcome.err


def test_a_deflate_bomb_is_refused_before_it_inflates(tmp_path):
    (tmp_path / "r.npz").write_bytes(_deflate_bomb())
    outcome = outcome_of(MIXTRAX + ["--routing", str(tmp_path / "r.npz")], max_mib=150)
    assert outcome.code == 2 and "'loads' needs at most 256 numbers (the model's shape)" in outcome.err


HARDWARE_CASES = {
    "extends a mapping": ("accelerators:\n  - name: h100-mine\n    extends: {a: 1}\n", "extends: needs the name of an entry"),
    "depreciation-years 0": ("constants:\n  - name: depreciation-years\n    extends: depreciation-years\n    value: 0\n",
                             "value needs 0.5 to 30 (years), has 0"),
    "framework-gemm-efficiency 0": ("constants:\n  - name: framework-gemm-efficiency\n    extends: "
                                    "framework-gemm-efficiency\n    value: 0\n", "value needs 0.05 to 1 (ratio), has 0"),
    "deep flow": ("accelerators: " + DEEP_FLOW, "nested deeper than 32 levels"),
    "billion laughs in extends": ("accelerators:\n  - name: x\n    extends:\n" +
                                  "".join("      " + line + "\n" for line in LAUGHS.splitlines()),
                                  "aliases expand to more than 1,000,000 values"),
    "cyclic extends": ("accelerators:\n  - name: a1\n    extends: a2\n  - name: a2\n    extends: a1\n", "cycle through"),
    "python tag": ("accelerators: !!python/object/apply:os.system ['true']\n", "could not determine a constructor"),
    "5,000-digit integer": ("constants:\n  - name: pue\n    extends: pue\n    value: 1" + "0" * 5000 + "\n",
                            "a number too long to read"),
}


@pytest.mark.parametrize("case", sorted(HARDWARE_CASES))
def test_hostile_hardware_files(tmp_path, case):
    text, message = HARDWARE_CASES[case]
    (tmp_path / "mine.yaml").write_text(text)
    outcome = outcome_of(["--hardware-db", str(tmp_path), "estimate", "train", "--json"])
    assert outcome.code == 2 and message in outcome.err, outcome.err


MODEL_CASES = {
    "billion laughs as name": ("m.yaml", "laughs:\n" + "".join("  " + line + "\n" for line in LAUGHS.splitlines())
                               + "name: *l11\n", "aliases expand to more than 1,000,000 values"),
    "YAML 1,000 levels deep": ("m.yaml", "name: " + "[" * 1000 + "]" * 1000, "nested deeper than 32 levels"),
    "config.json 1,000 levels deep": ("config.json", '{"model_type": ' + "[" * 1000 + "]" * 1000 + "}",
                                      "nested deeper than 32 levels"),
    "config.json 5,000-digit integer": ("config.json", '{"model_type": "llama", "hidden_size": 1' + "0" * 5000 + "}",
                                        "an integer of 5001 digits"),
    "YAML over 4 MiB": ("m.yaml", "# " + "x" * (5 << 20), "over the 4 MiB limit"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_hostile_model_files(tmp_path, case):
    name, text, message = MODEL_CASES[case]
    (tmp_path / name).write_text(text)
    outcome = outcome_of(["models", "show", str(tmp_path / name), "--json"])
    assert outcome.code == 2 and message in outcome.err, outcome.err


def test_a_large_user_database_loads(tmp_path):
    # About 3.3 MB of valid entries (1,100 accelerators): read by libyaml, validated once.
    base = (Path(__file__).parents[2] / "hardware_db" / "data" / "nvidia.yaml").read_text()
    entry = re.sub(r"\n    aliases: .*", "", base.split("\n  - name: ", 2)[1])
    (tmp_path / "big.yaml").write_text("accelerators:\n" + "".join(f"  - name: copy{i}-" + entry for i in range(1100)))
    assert 3e6 < (tmp_path / "big.yaml").stat().st_size < 4 << 20
    outcome = outcome_of(["--hardware-db", str(tmp_path), "hardware", "list", "--json"], max_mib=2000)
    assert outcome.code == 0 and "copy1099-a100-sxm-80gb" in json.loads(outcome.out)["accelerators"]


@pytest.mark.parametrize("limit", [None, 0.5])
def test_place_experts_states_and_honours_its_time_limit(limit):
    # The case: DeepSeek-V3 on 7 devices with the defaults. The limit is deterministic work,
    # so a small one stops the locality pass at the same layer on any machine, and says so.
    argv = ["place-experts", "--devices", "7", "--json"] + (["--time-limit", str(limit)] if limit else [])
    outcome = outcome_of(argv)
    evidence = json.loads(outcome.out)["evidence"]
    assert outcome.code == 0 and evidence["time_limit_s"] == (limit or 30)
    if limit:
        assert re.search(r"time limit 0.5 s \(deterministic\) reached: layers \d+ to 57 keep", evidence["note"])
    else:
        assert evidence["note"] == "" and evidence["deterministic_seconds"] < 30


# --- issue 27: the hostile inputs a fresh, busy machine found ----------------------------------------

@pytest.mark.parametrize("command", [["estimate", "train"], ["plan", "train", "--devices", "8", "--model", "llama-3.1-8b",
                                                                  "--global-batch", "64", "--no-offload"],
                                     ["estimate", "serve"]])
def test_json_is_never_the_value_of_chart(command):
    # "--chart --json" once made --json the chart's value and printed tables: a flag's value is checked
    # even where the flag is not used, and --json with a valid --chart (and --csv) prints JSON.
    refused = outcome_of(command + ["--chart", "--json"])
    assert refused.code == 2 and "unknown --chart value '--json'" in refused.err
    chart = "pareto" if "plan" in command else "memory"
    assert json.loads(outcome_of(command + ["--chart", chart, "--csv", "--json"]).out)


def test_an_over_long_path_is_one_line(tmp_path):
    long_name = "a" * 300
    for argv in (["sweep", f"{long_name}.yaml"],
                 ["sweep", str(Path(__file__).parents[2] / "examples" / "hbm_vs_scaleup.yaml"), "--out",
                  str(tmp_path / long_name)]):
        outcome = outcome_of(argv)
        assert outcome.code == 2 and outcome.err.startswith("Error: File name too long"), outcome.err


def test_a_published_count_below_one_parameter_is_refused(tmp_path):
    import yaml

    text = (Path(__file__).parents[2] / "perfmodel" / "catalog" / "models.yaml").read_text()
    spec = next(m for m in yaml.safe_load(text)["models"] if m["name"] == "llama-3.1-8b")
    spec["published"]["total_params"] = spec["published"]["active_params"] = 1e-300
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(spec))
    outcome = outcome_of(["models", "show", str(tmp_path / "m.yaml"), "--json"])
    assert outcome.code == 2 and "published.total_params: Input should be greater than or equal to 1" in outcome.err


@pytest.mark.parametrize("loads, code", [([[5e-324] * 8] * 32, 2), ([[5e-324] * 7 + [1.0]] * 32, 0),
                                         ([[1e-300] * 8] * 32, 2), ([[1e-9] * 8] * 32, 0)])
def test_subnormal_routing_counts_read_as_zero(tmp_path, loads, code):
    # Counts below a billionth of a token are 0: a layer of only those has no tokens (one line), one
    # with a real expert places (and passes the checker, which once failed on subnormal sums).
    (tmp_path / "r.json").write_text(json.dumps({"loads": loads}))
    outcome = outcome_of(MIXTRAX + ["--routing", str(tmp_path / "r.json"), "--json"])
    assert outcome.code == code, outcome.err
    if code:
        assert "routing loads need tokens in every layer; layer 0 has none" in outcome.err


def test_a_database_of_8000_accelerators_lists(tmp_path):
    # The case: 8,000 accelerators in about 3 MB (hardware list timed in benchmarks/bench_startup.py).
    entry = ("  - {{name: acc{i}, display_name: Acc {i}, vendor: X, dense_tflops: {{bf16: {bf16}, fp8: {fp8}}}, "
             "hbm_gb: 80, hbm_tb_per_s: 2, tdp_w: 500, l2_mb: 50, scale_up_gb_per_s_per_direction: 300, "
             "nic_gbit_per_s_per_direction: 200, host_link: pcie4-x16, sources: [https://example.com/{i}], "
             "notes: 'a user entry, long enough for three megabytes in all'}}\n")
    text = "accelerators:\n" + "".join(entry.format(i=i, bf16=100 + i, fp8=200 + 2 * i) for i in range(8000))
    (tmp_path / "big.yaml").write_text(text)
    assert 2.5e6 < len(text) < 4 << 20
    outcome = outcome_of(["--hardware-db", str(tmp_path), "hardware", "list", "--json"], max_mib=2000)
    assert outcome.code == 0 and len(json.loads(outcome.out)["accelerators"]) > 8000


def test_zero_components_are_exactly_zero():
    # No power cap: the "power cap" term is 0.0, not rounding noise of either sign (-3.5e-18 once).
    outcome = outcome_of(["estimate", "serve", "--batch", "1024", "--input-len", "1", "--output-len", "1", "--json"])
    result = json.loads(outcome.out)["result"]
    parts = [result["prefill_components_s"], result["decode_components_s"]]
    assert all(part["power cap"] == 0.0 and part["streamed from memory tiers (exposed)"] == 0.0 for part in parts)


# --- generated: the app's own options and hostile files, a seeded bounded profile -------------------

@pytest.fixture(scope="module")
def hostile_paths(tmp_path_factory):
    return fuzzing.file_source(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize("lines", [fuzzing.command_lines, fuzzing.file_command_lines],
                         ids=["app-options", "hostile-files"])
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_input_keeps_the_contract(hostile_paths, monkeypatch, tmp_path_factory, lines, data):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    fuzzing.check(fuzzing.run(data.draw(lines(hostile_paths))))
