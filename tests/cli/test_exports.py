"""Launch files of the frameworks: golden files per framework, every flag and key checked against the
framework version's vendored argument names by reading the written file back, and the plans a
framework cannot run refused in one line. ``UPDATE_GOLDEN=1 pytest tests/cli/test_exports.py``
rewrites the golden files (review the diff)."""

from __future__ import annotations

import json
import math
import shlex
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from perfmodel.cli.app import main
from perfmodel.exports.vendored import vendored
from tests.cli.golden import assert_golden, export

ESTIMATES = {
    "llama-70b-train": (["estimate", "train"], ("megatron", "nemo", "torchtitan")),
    "mixtral-fp8-train": (["estimate", "train", "--model", "mixtral-8x7b", "--system", "dgx-h100", "--devices", "64",
                           "--pp", "4", "--ep", "8", "--etp", "1", "--interleave", "8", "--zero", "1", "--recompute",
                           "none", "--precision", "fp8", "--global-batch", "256", "--seq-len", "4096"], ("megatron",)),
    # Megatron-Bridge's DeepSeek-V3 plan on 1,024 H100 (tests/data/practiced_training.yaml; 2K tokens, where
    # perfmodel's memory model fits it): the layout 'Et|(tt|)*30mL' and the 1F1B all-to-all overlap.
    "deepseek-ep-overlap-train": (["estimate", "train", "--model", "deepseek-v3", "--system", "dgx-h100", "--devices",
                                   "1024", "--tp", "2", "--pp", "8", "--interleave", "4", "--ep", "64", "--etp", "1",
                                   "--sp", "--zero", "1", "--recompute", "selective", "--precision", "fp8",
                                   "--ends-as-layers", "--ep-overlap", "--global-batch", "8192", "--seq-len", "2048"],
                                  ("megatron", "nemo")),
    # Llama 3's context parallelism at long sequences: K and V all-gathered (Megatron's --cp-comm-type).
    "llama-8b-cp-allgather-train": (["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "1",
                                     "--pp", "1", "--cp", "4", "--cp-comm", "all_gather", "--zero", "1", "--recompute",
                                     "full", "--global-batch", "64", "--seq-len", "32768"], ("megatron", "nemo")),
    "llama-8b-offload-train": (["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "1", "--pp",
                                "1", "--zero", "3", "--recompute", "full", "--offload-optimizer", "ddr",
                                "--offload-grads", "ddr", "--offload-params", "nvme", "--global-batch", "64"],
                               ("deepspeed",)),
    "llama-8b-zero2-train": (["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "2", "--pp",
                              "1", "--zero", "2", "--offload-optimizer", "ddr", "--global-batch", "64"],
                             ("deepspeed",)),
    "llama-70b-serve": (["estimate", "serve", "--tp", "8", "--batch", "64", "--weight-precision", "fp8",
                         "--activation-precision", "a8", "--kv-precision", "fp8"], ("vllm", "sglang", "trtllm", "dynamo")),
    "deepseek-wide-ep-serve": (["estimate", "serve", "--model", "deepseek-v3", "--system", "dgx-b200", "--devices", "8",
                                "--tp", "1", "--ep", "8", "--dp-attention", "8", "--batch", "256", "--weight-precision",
                                "fp8", "--activation-precision", "a8", "--kv-precision", "fp8"],
                               ("vllm", "sglang", "dynamo")),
}


CASES = [(case, framework) for case, (_, frameworks) in ESTIMATES.items() for framework in frameworks]


@pytest.mark.parametrize("case,framework", CASES)
def test_golden_files(case, framework, tmp_path, capsys):
    argv, _ = ESTIMATES[case]
    files = export(argv, framework, tmp_path / "out", capsys)
    assert_golden(files, f"{case}-{framework}")
    for f in files:
        assert not unknown_in(framework, f), f.name


# --- reading a written file back -----------------------------------------------------------------

def _flags_after(text: str, entry: str) -> list[str]:
    """The --flags of the command line that starts at ``entry`` in a shell script."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    start = words.index(entry) + 1
    return [w for w in words[start:] if w.startswith("-")]


def _keys(data, prefix: str = "") -> list[str]:
    if isinstance(data, dict):
        return [k for key, value in data.items() for k in _keys(value, f"{prefix}{key}.")]
    return [prefix[:-1]]


def unknown_in(framework: str, path: Path) -> list[str]:
    """Every flag or key of a written file that its framework's vendored version lacks."""
    text = path.read_text()
    v = vendored(framework)
    if framework == "megatron":
        if path.suffix == ".yaml":   # --tp-comm-overlap-cfg: Transformer Engine's userbuffers settings
            return [k for k in _keys(yaml.safe_load(text)) if k not in v.parts["userbuffers"]["keys"]]
        return [f for f in _flags_after(text, "pretrain_gpt.py") if f not in v.names]
    if framework == "nemo":
        words = shlex.split(text.replace("\\\n", " "), comments=True)
        overrides = [w.split("=", 1)[0] for w in words if "=" in w and not w.startswith("-")]
        assert overrides
        return [k for k in overrides if k not in v.keys]
    if framework == "torchtitan":
        if path.suffix == ".toml":
            return [k for k in _keys(tomllib.loads(text)) if k not in v.keys]
        return [f for f in _flags_after(text, "torchtitan.train") if f not in ("--job.config_file",)]
    if framework == "deepspeed":
        if path.suffix == ".json":
            return [k for k in _keys(json.loads(text)) if k not in v.keys]
        return [f for f in _flags_after(text, '$TRAIN_SCRIPT') if f not in v.entries["deepspeed.add_config_arguments"]]
    if framework == "vllm":
        return [f for f in _flags_after(text, "serve") if f not in v.names]
    if framework == "sglang":
        if "launch_router" in text:
            return [f for f in _flags_after(text, "sglang_router.launch_router") if f not in v.parts["router"]["names"]]
        return [f for f in _flags_after(text, "sglang.launch_server") if f not in v.names]
    if framework == "trtllm":
        if path.name == "disagg-config.yml":
            return [k for k in _keys(yaml.safe_load(text)) if k not in v.parts["disaggregated"]["keys"]]
        if path.suffix == ".yml":
            return [k for k in _keys(yaml.safe_load(text)) if k not in v.keys]
        return [f for f in _flags_after(text, "trtllm-serve") if f not in v.names]
    if framework == "dynamo":
        return _dynamo_unknown(yaml.safe_load(text), v)
    raise AssertionError(framework)


def _dynamo_unknown(deployment: dict, v) -> list[str]:
    problems = []
    engine = vendored("vllm").names
    for component in deployment["spec"]["components"]:
        container = component["podTemplate"]["spec"]["containers"][0]
        entry = container["command"][-1]
        own = set(v.entries.get(entry, ()))
        for word in container["args"]:
            if word.startswith("--") and word not in own and word not in engine:
                problems.append(f"{component['name']}: {word}")
    for key in ("apiVersion", "kind"):
        assert key in deployment and deployment[key] in (v.keys[key].get("choices") or [deployment[key]])
    return problems


# --- the cases: plan, then export, for every framework -----------------------------------

@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "deepspeed", "nemo"])
def test_plan_train_exports_what_the_framework_runs(framework, tmp_path, capsys):
    argv = ["plan", "train", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--devices", "64"]
    files = export(argv, framework, tmp_path / "d", capsys)
    for f in files:
        assert not unknown_in(framework, f), f.name


@pytest.mark.parametrize("framework", ["vllm", "sglang", "trtllm", "dynamo"])
def test_plan_serve_exports_every_pool(framework, tmp_path, capsys):
    argv = ["plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--rate", "20"]
    files = export(argv, framework, tmp_path / "d", capsys)
    for f in files:
        assert not unknown_in(framework, f), f.name
    names = {f.name for f in files}
    if framework in ("vllm", "sglang", "trtllm"):  # one script per pool
        assert names & {f"{framework}.sh", f"{framework}-prefill.sh", f"{framework}-decode.sh"}


@pytest.mark.parametrize("framework, flag", [("vllm", "--eplb-config '{\"num_redundant_experts\":32}'"),
                                             ("sglang", "--ep-num-redundant-experts 32")])
def test_expert_parallel_launches_run_the_eplb_the_prediction_counts(framework, flag, tmp_path, capsys):
    """A prediction with EPLB (the default --expert-balance) places 32 redundant experts of DeepSeek-V3's 256
    at ep 8 (36 slots per device, perfmodel.eplb): the launch enables EPLB with them; with --expert-balance
    none the prediction has no copies and neither does the launch."""
    argv = ["estimate", "serve", "--model", "deepseek-v3", "--system", "dgx-b200", "--devices", "8", "--tp", "1",
            "--ep", "8", "--dp-attention", "8", "--batch", "256", "--weight-precision", "fp8"]
    with_eplb = "".join(f.read_text() for f in export(argv, framework, tmp_path / "a", capsys))
    without = "".join(f.read_text() for f in export(argv + ["--expert-balance", "none"], framework, tmp_path / "b",
                                                     capsys))
    assert "--enable-eplb" in with_eplb and flag in with_eplb
    assert "eplb" not in without and "redundant" not in without


@pytest.mark.parametrize("framework, flags", [
    ("vllm", ["--max-num-batched-tokens {c}"]), ("dynamo", ['"--max-num-batched-tokens"', '"{c}"']),
    ("trtllm", ["--max_num_tokens {c}", "--enable_chunked_prefill"]),
    ("sglang", ["--enable-mixed-chunk", "--chunked-prefill-size {c}"])])
def test_a_colocated_pool_launches_the_prompt_chunks_it_is_timed_with(framework, flags, tmp_path, capsys):
    """A colocated pool whose prompts ride in its decode steps launches with that token budget per
    iteration (SGLang divides its chunk among the attention data-parallel ranks: given for all)."""
    argv = ["plan", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--rate", "20", "--modes",
            "colocated", "--chunk-tokens", "2048"]
    files = export(argv, framework, tmp_path / "d", capsys)
    text = "".join(f.read_text() for f in files)
    for flag in flags:
        assert flag.format(c=2048) in text, flag
    for f in files:
        assert not unknown_in(framework, f), f.name


def test_disaggregated_pools_each_get_their_role(tmp_path):
    from perfmodel.catalog import find_model
    from perfmodel.exports import serving_files
    from perfmodel.exports.serving import PoolSpec

    pools = [PoolSpec(role=role, system="dgx-h100", instances=n, devices_per_instance=d, devices_per_node=8, tp=d,
                      pp=1, ep=1, dp_attention=1, batch=b, weight="bf16", activation="a16", kv="fp8", kv_place="hbm",
                      max_len=6144) for role, n, d, b in (("prefill", 3, 4, 2), ("decode", 2, 8, 128))]
    spec = find_model("llama-3.1-70b")
    vllm = serving_files("vllm", spec, pools, "llama-3.1-70b")
    assert '"kv_role":"kv_producer"' in vllm["vllm-prefill.sh"] and '"kv_role":"kv_consumer"' in vllm["vllm-decode.sh"]
    sglang = serving_files("sglang", spec, pools, "llama-3.1-70b")
    assert "--disaggregation-mode prefill" in sglang["sglang-prefill.sh"] and "sglang-router.sh" in sglang
    trt = serving_files("trtllm", spec, pools, "llama-3.1-70b")
    disagg = yaml.safe_load(trt["disagg-config.yml"])
    assert disagg["context_servers"]["num_instances"] == 3 and disagg["generation_servers"]["num_instances"] == 2
    # Context servers run without the overlap scheduler, as TRT-LLM's disaggregated examples set them.
    assert yaml.safe_load(trt["extra-llm-api-config-prefill.yml"])["disable_overlap_scheduler"] is True
    assert "disable_overlap_scheduler" not in yaml.safe_load(trt["extra-llm-api-config-decode.yml"])
    dyn = yaml.safe_load(serving_files("dynamo", spec, pools, "llama-3.1-70b")["dynamo-deployment.yaml"])
    replicas = {c["type"]: c["replicas"] for c in dyn["spec"]["components"]}
    assert replicas == {"frontend": 1, "prefill": 3, "decode": 2}
    # kubectl expands no variables: every container names its image literally, the vendored version's runtime.
    images = {c["podTemplate"]["spec"]["containers"][0]["image"] for c in dyn["spec"]["components"]}
    assert images == {"nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"}
    for framework, files in (("vllm", vllm), ("sglang", sglang), ("trtllm", trt)):
        for name, text in files.items():
            (tmp_path / name).write_text(text)
            assert not unknown_in(framework, tmp_path / name), name
    assert 'BOOTSTRAP_PORT="${BOOTSTRAP_PORT:-8998}"' in sglang["sglang-prefill.sh"]
    assert "--disaggregation-bootstrap-port" not in sglang["sglang-decode.sh"]


def test_the_sglang_router_gets_one_argument_per_instance(tmp_path):
    """sglang-router takes one --prefill URL BOOTSTRAP_PORT per prefill server and one --decode URL
    per decode server: the script builds them from the operator's lists (run here with a stand-in
    for python that records its arguments) and refuses lists of the wrong length."""
    import subprocess

    from perfmodel.catalog import find_model
    from perfmodel.exports import serving_files
    from perfmodel.exports.serving import PoolSpec

    pools = [PoolSpec(role=role, system="dgx-h100", instances=n, devices_per_instance=d, devices_per_node=8, tp=d,
                      pp=1, ep=1, dp_attention=1, batch=b, weight="bf16", activation="a16", kv="fp8", kv_place="hbm",
                      max_len=6144) for role, n, d, b in (("prefill", 3, 2, 2), ("decode", 2, 8, 128))]
    script = tmp_path / "sglang-router.sh"
    script.write_text(serving_files("sglang", find_model("llama-3.1-70b"), pools, "llama-3.1-70b")["sglang-router.sh"])
    stand_in = tmp_path / "bin" / "python"
    stand_in.parent.mkdir()
    stand_in.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    stand_in.chmod(0o755)
    env = {"PATH": f"{stand_in.parent}:/usr/bin:/bin", "ARGS_OUT": str(tmp_path / "args"),
           "PREFILL_URLS": "http://a:30000 http://a:30001 http://b:30000", "PREFILL_BOOTSTRAP_PORTS": "8998 8999 8998",
           "DECODE_URLS": "http://c:30000 http://d:30000"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "args").read_text().split("\n")
    assert args[:2] == ["-m", "sglang_router.launch_router"]
    pairs = [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == "--prefill"]
    assert pairs == [("http://a:30000", "8998"), ("http://a:30001", "8999"), ("http://b:30000", "8998")]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--decode"] == ["http://c:30000", "http://d:30000"]
    assert "--pd-disaggregation" in args
    short = subprocess.run(["bash", str(script)], env={**env, "DECODE_URLS": "http://c:30000"}, capture_output=True,
                           text=True)
    assert short.returncode == 2 and "3 prefill and 2 decode instances" in short.stderr


# --- what a framework cannot run ------------------------------------------------------------------

REFUSED = [
    (["estimate", "train", "--export", "deepspeed"], "DeepSpeed cannot take this plan"),
    (["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "8", "--pp", "1", "--zero", "1",
      "--offload-optimizer", "nvme", "--export", "megatron"], "host DDR only"),
    (["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "8", "--pp", "1", "--precision", "fp16",
      "--export", "torchtitan"], "bf16 or fp32"),
    (["estimate", "train", "--model", "mixtral-8x7b", "--devices", "64", "--pp", "4", "--ep", "8", "--etp", "1",
      "--export", "nemo"],
     "no recipe for mixtral-8x7b"),
    (["estimate", "serve", "--model", "deepseek-v3", "--system", "cloudmatrix384", "--devices", "32", "--tp", "1",
      "--ep", "32", "--dp-attention", "32", "--batch", "1024", "--weight-precision", "int8", "--activation-precision",
      "a8", "--export", "trtllm"], "runs on NVIDIA GPUs"),
    (["estimate", "serve", "--kv-precision", "int4", "--export", "sglang"], "no int4 KV cache"),
    (["estimate", "serve", "--kv-place", "ddr", "--export", "vllm"], "KV cache in HBM"),
    (["estimate", "train", "--model", "mixtral-8x7b", "--devices", "64", "--pp", "1", "--ep", "8", "--etp", "1",
      "--recompute", "full", "--ep-overlap", "--export", "megatron"], "without full recomputation"),
    (["estimate", "train", "--model", "mixtral-8x7b", "--devices", "64", "--pp", "4", "--ep", "8", "--etp", "1",
      "--ep-overlap", "--export", "megatron"], "virtual pipeline"),
    (["estimate", "train", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--devices", "64", "--tp", "1", "--pp",
      "1", "--ep", "8", "--zero", "3", "--seq-len", "2048", "--ep-overlap", "--export", "torchtitan"],
     "MoE exchange overlap"),
    (["estimate", "train", "--ep-overlap"], "needs an MoE model"),
    (["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "1", "--pp", "1", "--cp", "4",
      "--cp-comm", "all_gather", "--zero", "1", "--recompute", "full", "--seq-len", "32768", "--export", "torchtitan"],
     "ring attention"),
    (["estimate", "train", "--cp-comm", "ring"], "--cp-comm"),
    (["estimate", "train", "--model", "mixtral-8x7b", "--devices", "64", "--tp", "2", "--pp", "4", "--ep", "8",
      "--etp", "1", "--sp", "--zero", "1", "--schedule", "dualpipe", "--global-batch", "64", "--export", "megatron"],
     "runs DualPipe"),
    (["estimate", "train", "--model", "gpt-oss-120b", "--system", "dgx-h100", "--devices", "64", "--tp", "1", "--pp",
      "1", "--ep", "8", "--zero", "3", "--seq-len", "2048", "--recompute", "modules", "--export", "torchtitan"],
     "MLA up-projections and MoE activation"),
    (["estimate", "train", "--model", "mixtral-8x7b", "--devices", "64", "--pp", "4", "--ep", "8", "--etp", "1",
      "--precision", "fp8", "--storage", "deepseek", "--export", "megatron"], "low-precision storage"),
    (["estimate", "train", "--storage", "deepseek", "--precision", "bf16"], "needs --precision fp8"),
    (["estimate", "train", "--export", "vllm"], "writes serving configurations"),
    (["estimate", "train", "--export", "megatron"], "--export needs --out"),
    (["estimate", "train", "--out", "somewhere"], "give --export FRAMEWORK too"),
    (["plan", "serve", "--export", "deepspeed"], "writes training configurations"),
    (["plan", "serve", "--modes", "colocated", "--chunk-tokens", "0", "--export", "vllm"], "give a size above 0"),
    (["estimate", "serve", "--chunk-tokens", "2048", "--pp", "2", "--tp", "4"], "without pipeline stages"),
]


@pytest.mark.parametrize("argv,message", REFUSED)
def test_what_a_framework_cannot_run_is_refused_in_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a if a != "somewhere" else str(tmp_path / "x") for a in argv]
    if "--export" in argv and "--out" not in argv and "needs --out" not in message:
        argv += ["--out", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: ") and "\n" not in err and message in err, err
    assert not (tmp_path / "x").exists() or "needs --out" in message


def test_every_vendored_list_names_its_version_and_source():
    from perfmodel.exports import FRAMEWORKS

    for framework in FRAMEWORKS:
        v = vendored(framework)
        assert v.version and v.source.startswith("https://") and (v.names or v.keys), framework


def test_plan_train_says_which_frameworks_run_its_optimum(capsys):
    """Each training framework's answer to the optimum: None when it runs it as written, else one line
    saying why; a framework that refuses finds, with --framework, a plan no faster than the optimum."""
    from perfmodel.cli.app import main

    argv = ["plan", "train", "--model", "llama-3.1-70b", "--devices", "64", "--global-batch", "256", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    runs_on, best = doc["runs_on"], doc["best"]["step_time_s"]
    assert set(runs_on) == {"megatron", "nemo", "torchtitan", "deepspeed"}
    for framework, why in runs_on.items():
        if why is None:
            continue
        assert why and "\n" not in why
        assert main(argv + ["--framework", framework]) == 0
        assert json.loads(capsys.readouterr().out)["best"]["step_time_s"] >= best * (1 - 1e-9)


def test_plan_serve_says_which_frameworks_run_its_deployment(capsys):
    from perfmodel.cli.app import main

    assert main(["plan", "serve", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["runs_on"]) == {"vllm", "sglang", "trtllm", "dynamo"}
    assert main(["plan", "serve", "--model", "llama-3.1-70b", "--system", "fenghuang-h200", "--rate", "2", "--objective",
                 "devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    if any(p["config"]["weight_place"] != "hbm" for p in doc["best"]["pools"]):   # streamed weights: no engine runs them
        assert all(why and "pooled" in why for why in doc["runs_on"].values())


def test_recompute_modules_are_written_as_megatron_names_them(tmp_path, capsys):
    """--recompute modules (DeepSeek-V3's recipe) is Megatron-Core's selective recomputation of the
    named modules, with grouped GEMMs for moe_act; the NeMo override is a Hydra list."""
    argv = ["estimate", "train", "--model", "deepseek-v3", "--system", "dgx-h100", "--devices", "1024", "--tp", "2",
            "--pp", "8", "--interleave", "4", "--ep", "64", "--etp", "1", "--sp", "--zero", "1", "--recompute", "modules",
            "--precision", "fp8", "--global-batch", "8192", "--seq-len", "4096"]
    words = shlex.split(export(argv, "megatron", tmp_path / "m", capsys)[0].read_text().replace("\\\n", " "))
    at = words.index("--recompute-modules")
    assert words[at + 1:at + 5] == ["core_attn", "layernorm", "mla_up_proj", "moe_act"]
    assert words[words.index("--recompute-granularity") + 1] == "selective" and "--moe-grouped-gemm" in words
    nemo = export(argv, "nemo", tmp_path / "n", capsys)[0].read_text()
    assert "model.recompute_modules=[core_attn,layernorm,mla_up_proj,moe_act]" in nemo


# --- the frameworks' own validation rules (issue 32), each vendored with its source -----------------

def _words(path: Path) -> list[str]:
    return shlex.split(path.read_text().replace("\\\n", " "), comments=True)


def _value(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def test_every_vendored_rule_cites_its_source_and_is_checked_by_a_writer():
    """Each rule has the framework's reason and a file:line at the vendored version, and a writer uses it."""
    from perfmodel.exports import train_deepspeed, train_torchtitan, training

    code = "".join(Path(m.__file__).read_text() for m in (training, train_torchtitan, train_deepspeed))
    for framework in ("megatron", "nemo", "torchtitan", "deepspeed"):
        for name, entry in vendored(framework).rules.items():
            assert entry["reason"] and ".py:" in entry["source"], (framework, name)
            assert f'"{name}"' in code, f"{framework} rule {name} is checked by no writer"


MEGATRON_8B = ["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--pp", "1", "--recompute", "full",
               "--global-batch", "64"]


def test_megatron_save_comes_with_a_save_interval(tmp_path, capsys):
    """validate_args asserts a positive --save-interval whenever --save is given (arguments.py:1321-1323)."""
    words = _words(export(MEGATRON_8B + ["--tp", "1", "--zero", "1"], "megatron", tmp_path / "m", capsys)[0])
    assert "--save" in words and int(_value(words, "--save-interval")) > 0


@pytest.mark.parametrize("parallel,expected", [
    (["--tp", "2", "--zero", "1"], "export CUDA_DEVICE_MAX_CONNECTIONS=1"),
    (["--tp", "1", "--cp", "2", "--zero", "1", "--seq-len", "16384"], "export CUDA_DEVICE_MAX_CONNECTIONS=1"),
    (["--tp", "2", "--zero", "3"], "unset CUDA_DEVICE_MAX_CONNECTIONS"),
    (["--tp", "1", "--zero", "1"], None)])
def test_megatron_script_sets_the_connections_validate_args_asserts(parallel, expected, tmp_path, capsys):
    """TP or CP needs CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py:1413-1439); Megatron-FSDP needs it
    unset or above 1 (arguments.py:1143-1144); neither: the script leaves it alone."""
    text = export(MEGATRON_8B + parallel, "megatron", tmp_path / "m", capsys)[0].read_text()
    lines = [line for line in text.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in line and not line.startswith("#")]
    assert lines == ([expected] if expected else [])
    if expected:
        assert text.index(expected) < text.index("torchrun")


def test_megatron_fsdp_writes_its_checkpoint_format(tmp_path, capsys):
    """'Megatron-FSDP requires the `fsdp_dtensor` checkpointing format.' (arguments.py:1146-1147)."""
    words = _words(export(MEGATRON_8B + ["--tp", "1", "--zero", "2"], "megatron", tmp_path / "m", capsys)[0])
    assert "--use-megatron-fsdp" in words and _value(words, "--ckpt-format") == "fsdp_dtensor"
    words = _words(export(MEGATRON_8B + ["--tp", "1", "--zero", "1"], "megatron", tmp_path / "d", capsys)[0])
    assert "--ckpt-format" not in words


def test_megatron_optimizer_offload_uses_the_precision_aware_optimizer(tmp_path, capsys):
    """'The optimizer cpu offload must be used in conjunction with --use-precision-aware-optimizer'
    (arguments.py:1802-1806)."""
    argv = MEGATRON_8B + ["--tp", "1", "--zero", "1", "--offload-optimizer", "ddr"]
    words = _words(export(argv, "megatron", tmp_path / "m", capsys)[0])
    assert "--optimizer-cpu-offload" in words and "--use-precision-aware-optimizer" in words


def _megatron_stages(words: list[str], num_layers: int, pp: int) -> list[int]:
    """Decoder layers per virtual stage as Megatron-Core reads the written flags, with its own checks:
    a layout (pipeline_parallel_layer_layout.py:39-45, 93-109) or the even split (arguments.py:951-964,
    transformer_block.py:141-172)."""
    if "--pipeline-model-parallel-layout" in words:
        stages = _value(words, "--pipeline-model-parallel-layout").split("|")
        flat = "".join(stages)
        assert len(stages) % pp == 0 and flat[0] == "E" and flat[-1] == "L"
        assert flat.count("E") == flat.count("L") == 1 and flat.count("t") == num_layers
        return [stage.count("t") for stage in stages]
    assert "--account-for-embedding-in-pipeline-split" not in words or "--account-for-loss-in-pipeline-split" in words
    ends = 2 * ("--account-for-embedding-in-pipeline-split" in words)
    vp = int(_value(words, "--num-virtual-stages-per-pipeline-rank")) if "--num-virtual-stages-per-pipeline-rank" \
        in words else 1
    assert (num_layers + ends) % pp == 0 and (num_layers + ends) // pp % vp == 0
    chunks = [(num_layers + ends) // (pp * vp)] * (pp * vp)
    chunks[0] -= ends // 2
    chunks[-1] -= ends // 2
    return chunks


@pytest.mark.parametrize("pipeline", [["--pp", "8"], ["--pp", "8", "--interleave", "4"],
                                      ["--pp", "16", "--interleave", "8", "--ends-as-layers"],
                                      ["--pp", "8", "--ends-as-layers"]])
def test_megatron_405b_pipeline_split_is_what_megatron_accepts_and_the_plan_says(pipeline, tmp_path, capsys):
    """126 layers over pp 8: 'num_layers=126 should be divisible by pipeline_model_parallel_size=8'
    (transformer_block.py:150-152) unless the split is written as a layout; each rank then holds the
    layers the plan puts on it (perfmodel.memory.layers_on_stage)."""
    from perfmodel.memory import layers_on_stage

    argv = ["estimate", "train", "--model", "llama-3.1-405b", "--devices", "2048", "--tp", "8", "--zero", "1",
            "--recompute", "full", "--global-batch", "512", *pipeline]
    words = _words(export(argv, "megatron", tmp_path / "m", capsys)[0])
    pp = int(pipeline[1])
    chunks = _megatron_stages(words, 126, pp)
    per_rank = [sum(chunks[rank::pp]) for rank in range(pp)]
    ends = "--ends-as-layers" in pipeline
    assert per_rank == [int(layers_on_stage(126, pp, rank, ends)) for rank in range(pp)]
    overrides = _overrides(export(argv, "nemo", tmp_path / "n", capsys)[0])
    flag = "--pipeline-model-parallel-layout"
    layout = _value(words, flag) if flag in words else "null"
    assert overrides["model.pipeline_model_parallel_layout"] == layout     # the recipe's split never stays
    account = "true" if "--account-for-loss-in-pipeline-split" in words else "false"
    assert overrides["model.account_for_embedding_in_pipeline_split"] == account
    assert overrides["model.account_for_loss_in_pipeline_split"] == account
    vpp = int(pipeline[3]) if "--interleave" in pipeline else None
    assert overrides["model.virtual_pipeline_model_parallel_size"] == (str(vpp) if vpp else "null")


def test_megatron_rules_catch_each_launch_megatron_refuses():
    """Each vendored Megatron-LM rule, broken alone, is caught before a file is written."""
    from perfmodel.exports.training import megatron_broken_rules

    ok = {"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1, "--context-parallel-size": 1,
          "--save": "$CHECKPOINT_DIR", "--save-interval": 10}
    assert megatron_broken_rules(ok, {}, 80) == []
    cases = [({"--save-interval": None}, {}, "save-interval"),
             ({"--tensor-model-parallel-size": 8}, {}, "tp-cp-max-connections"),
             ({"--context-parallel-size": 2}, {}, "tp-cp-max-connections"),
             ({"--use-megatron-fsdp": True, "--ckpt-format": "fsdp_dtensor"}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
              "fsdp-max-connections"),
             ({"--use-megatron-fsdp": True}, {}, "fsdp-ckpt-format"),
             ({"--optimizer-cpu-offload": True}, {}, "offload-precision-aware"),
             ({"--pipeline-model-parallel-size": 8}, {}, "pipeline-divisible"),
             ({"--pipeline-model-parallel-size": 4, "--num-virtual-stages-per-pipeline-rank": 3}, {},
              "virtual-divisible"),
             ({"--pipeline-model-parallel-size": 2, "--pipeline-model-parallel-layout": "Ett|tL"}, {}, "layout")]
    for change, environment, name in cases:
        assert megatron_broken_rules({**ok, **change}, environment, 126 if name == "pipeline-divisible" else 80) \
            == [name], name
    tp8 = {**ok, "--tensor-model-parallel-size": 8}
    assert megatron_broken_rules(tp8, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, 80) == []
    assert megatron_broken_rules(tp8, {}, 80, blackwell=True) == []
    ends = {"--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True}
    assert megatron_broken_rules({**ok, "--pipeline-model-parallel-size": 8, **ends}, {}, 126) == []


def test_a_broken_rule_is_refused_in_one_line_with_the_framework_reason():
    from perfmodel.exports.training import refuse_broken
    from perfmodel.exports import ExportError

    with pytest.raises(ExportError) as info:
        refuse_broken("megatron", ["fsdp-ckpt-format"], "this launch")
    message = str(info.value)
    assert "\n" not in message and "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format." in message
    assert "megatron/training/arguments.py:1146-1147" in message and "core_v0.19.0" in message


NEMO_8B = ["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--pp", "1", "--recompute", "full",
           "--global-batch", "64"]


def _overrides(path: Path) -> dict[str, str]:
    return dict(w.split("=", 1) for w in _words(path) if "=" in w and not w.startswith("-"))


def test_nemo_megatron_fsdp_writes_its_checkpoint_format_and_leaves_connections_unset(tmp_path, capsys):
    """'Megatron-FSDP requires the fsdp_dtensor checkpointing format!' and 'FSDP requires
    CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.' (Megatron-Bridge v0.6.0 config.py:1096-1103)."""
    path = export(NEMO_8B + ["--tp", "1", "--zero", "3"], "nemo", tmp_path / "n", capsys)[0]
    overrides = _overrides(path)
    assert overrides["ddp.use_megatron_fsdp"] == "true" and overrides["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in path.read_text().splitlines()
    plain = export(NEMO_8B + ["--tp", "1", "--zero", "1"], "nemo", tmp_path / "d", capsys)[0]
    assert "checkpoint.ckpt_format" not in _overrides(plain) and "CUDA_DEVICE_MAX" not in plain.read_text()


def test_nemo_optimizer_offload_uses_the_precision_aware_optimizer(tmp_path, capsys):
    """The recipes set use_precision_aware_optimizer=False; the hybrid device optimizer needs it on
    (Megatron-Core arguments.py:1786-1790 at the commit Megatron-Bridge v0.6.0 pins)."""
    argv = NEMO_8B + ["--tp", "1", "--zero", "1", "--offload-optimizer", "ddr"]
    overrides = _overrides(export(argv, "nemo", tmp_path / "n", capsys)[0])
    assert overrides["optimizer.optimizer_cpu_offload"] == "true"
    assert overrides["optimizer.use_precision_aware_optimizer"] == "true"


def test_nemo_rules_catch_each_launch_megatron_bridge_refuses():
    from perfmodel.exports.training import bridge_broken_rules

    from perfmodel.exports.training import NULL

    split = {"model.pipeline_model_parallel_size": 2, "model.pipeline_model_parallel_layout": NULL,
             "model.virtual_pipeline_model_parallel_size": NULL, "model.account_for_embedding_in_pipeline_split": True,
             "model.account_for_loss_in_pipeline_split": True}
    fsdp = {**split, "ddp.use_megatron_fsdp": True, "checkpoint.ckpt_format": "fsdp_dtensor"}
    assert bridge_broken_rules(fsdp, {}) == []
    assert bridge_broken_rules({**split, "ddp.use_megatron_fsdp": True}, {}) == ["fsdp-ckpt-format"]
    assert bridge_broken_rules(fsdp, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}) == ["fsdp-max-connections"]
    assert bridge_broken_rules({**split, "optimizer.optimizer_cpu_offload": True}, {}) == ["offload-precision-aware"]
    assert bridge_broken_rules({**split, "optimizer.optimizer_cpu_offload": True,
                                "optimizer.use_precision_aware_optimizer": True}, {}) == []
    # the recipe's split stays where the export leaves a pipeline key out (llama31_405b's vpp 2, account-for flags)
    assert bridge_broken_rules({"model.pipeline_model_parallel_size": 8}, {}) == ["recipe-pipeline"]
    layout = {**split, "model.pipeline_model_parallel_layout": "Ett|tL"}
    assert bridge_broken_rules(layout, {}) == ["layout-conflicts"]
    plain = {"model.account_for_embedding_in_pipeline_split": False, "model.account_for_loss_in_pipeline_split": False}
    assert bridge_broken_rules({**layout, **plain}, {}) == []
    assert bridge_broken_rules({**layout, **plain, "model.virtual_pipeline_model_parallel_size": 2}, {}) \
        == ["layout-conflicts"]


def _torchtitan_stages(parallelism: dict, num_layers: int) -> list[int]:
    """Transformer layers per virtual stage as torchtitan v0.2.2 builds them from [parallelism], with
    its own checks (pipeline_parallel.py:59-121 and 236-344, re-derived here independently of the writer)."""
    pp = parallelism["pipeline_parallel_degree"]
    multi = parallelism["pipeline_parallel_schedule"] != "1F1B"
    if "module_fqns_per_model_part" in parallelism:
        stages = parallelism["module_fqns_per_model_part"]
        flat = [m for stage in stages for m in stage]
        assert flat == ["tok_embeddings", *[f"layers.{i}" for i in range(num_layers)], "norm", "output"]
        assert all(stages) and len(stages) % pp == 0
        sizes = [sum(m.startswith("layers.") for m in stage) for stage in stages]
    else:
        first = parallelism.get("pipeline_parallel_first_stage_less_layers", 1)
        last = parallelism.get("pipeline_parallel_last_stage_less_layers", 1)
        effective = num_layers + first + last
        per_stage = parallelism.get("pipeline_parallel_layers_per_stage")
        count = math.ceil(effective / per_stage) if per_stage else pp * (2 if multi else 1)
        assert count % pp == 0, f"Number of virtual stages ({count}) must be divisible by pipeline parallel size ({pp})"
        base, extra = divmod(effective, count)
        sizes = [base + (i < extra) for i in range(count)]
        assert min(sizes) >= max(1, first, last)
        sizes[0] -= first
        sizes[-1] -= last
    assert len(sizes) // pp == 1 if not multi else len(sizes) // pp >= 2
    return sizes


@pytest.mark.parametrize("model,layers,pipeline", [
    ("llama-3.1-70b", 80, ["--pp", "4", "--interleave", "2"]),
    ("llama-3.1-70b", 80, ["--pp", "4", "--interleave", "2", "--ends-as-layers"]),
    ("llama-3.1-70b", 80, ["--pp", "4", "--ends-as-layers"]),
    ("llama-3.1-70b", 80, ["--pp", "8"]),
    ("llama-3.1-405b", 126, ["--pp", "8", "--interleave", "8"]),
    ("llama-3.1-405b", 126, ["--pp", "8"]),
    ("llama-3.1-405b", 126, ["--pp", "16", "--interleave", "8", "--ends-as-layers"])])
def test_torchtitan_builds_the_planned_pipeline_stages(model, layers, pipeline, tmp_path, capsys):
    """torchtitan runs pp x interleave virtual stages holding the layers the plan puts on each rank:
    not 'Number of virtual stages (9) must be divisible by pipeline parallel size (4)' (70B, the
    default one-layer allowance for the first and last stage ignored), nor 128 stages for 405B's
    planned 8 per rank."""
    from perfmodel.memory import layers_on_stage

    devices = "2048" if model.endswith("405b") else "1024"
    argv = ["estimate", "train", "--model", model, "--devices", devices, "--tp", "8", "--zero", "1",
            "--recompute", "full", "--global-batch", "512", *pipeline]
    files = {f.name: f for f in export(argv, "torchtitan", tmp_path / "t", capsys)}
    parallelism = tomllib.loads(files["torchtitan.toml"].read_text())["parallelism"]
    pp = int(pipeline[1])
    interleave = int(pipeline[3]) if "--interleave" in pipeline else 1
    sizes = _torchtitan_stages(parallelism, layers)
    assert len(sizes) == pp * interleave
    ends = "--ends-as-layers" in pipeline
    assert [sum(sizes[rank::pp]) for rank in range(pp)] == [int(layers_on_stage(layers, pp, rank, ends))
                                                            for rank in range(pp)]


def test_torchtitan_rules_catch_the_splits_it_would_refuse_or_change():
    """The split the exporter wrote before issue 32 is caught, each rule by name."""
    from perfmodel.exports.train_torchtitan import titan_broken_rules

    old_70b = {"pipeline_parallel_degree": 4, "pipeline_parallel_schedule": "Interleaved1F1B",
               "pipeline_parallel_layers_per_stage": 10}
    assert titan_broken_rules(old_70b, 80, [10] * 8) == ["virtual-stages-divisible"]
    old_405b = {"pipeline_parallel_degree": 8, "pipeline_parallel_schedule": "Interleaved1F1B",
                "pipeline_parallel_layers_per_stage": 1}
    planned = [1] + [2] * 62 + [1]
    assert titan_broken_rules(old_405b, 126, planned) == ["stage-weights"]
    one_f_one_b = {"pipeline_parallel_degree": 4, "pipeline_parallel_schedule": "1F1B",
                   "pipeline_parallel_layers_per_stage": 10}
    assert titan_broken_rules({**one_f_one_b, "pipeline_parallel_first_stage_less_layers": 0,
                               "pipeline_parallel_last_stage_less_layers": 0}, 80, [20] * 4) == ["stages-per-rank"]
    assert titan_broken_rules({"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "1F1B",
                               "module_fqns_per_model_part": [["tok_embeddings"], []]}, 0, [0, 0]) == ["empty-stage"]
    uneven = {"pipeline_parallel_degree": 4, "pipeline_parallel_schedule": "1F1B",
              "pipeline_parallel_first_stage_less_layers": 0, "pipeline_parallel_last_stage_less_layers": 0}
    assert titan_broken_rules(uneven, 82, [20, 20, 21, 21]) == ["even-split"]
    assert titan_broken_rules(uneven, 82, [21, 21, 20, 20]) == []


@pytest.mark.parametrize("tp", [1, 2])
def test_deepspeed_tensor_parallel_script_says_the_mpu_call(tp, tmp_path, capsys):
    """With AutoTP the batch holds over the data-parallel ranks only: DeepSpeedConfig's
    'train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size'
    (deepspeed/runtime/config.py:912-927) unless the training script passes a model-parallel unit
    (config.py:697-715); deepspeed.sh says so and gives the call."""
    argv = ["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", str(tp), "--pp", "1", "--zero",
            "2", "--offload-optimizer", "ddr", "--global-batch", "64"]
    files = {f.name: f for f in export(argv, "deepspeed", tmp_path / "d", capsys)}
    config = json.loads(files["ds_config.json"].read_text())
    script = files["deepspeed.sh"].read_text()
    per_step = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == per_step * 8 // tp
    if tp == 1:
        assert "mpu=" not in script and "model-parallel unit" not in script
        return
    assert config["train_batch_size"] != per_step * 8          # what DeepSpeed checks without the unit
    comments = [line[1:].strip() for line in script.splitlines() if line.startswith("#")]
    assert "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size" in script
    assert f"groups._init_tp_mesh_device(tensor_model_parallel_size={tp})" in comments
    call = " ".join(c for c in comments if c.startswith(("engine,", "config=")))
    assert "deepspeed.initialize(" in call and "mpu=groups" in call and 'config="ds_config.json"' in call
    assert script.index("mpu=groups") < script.index("deepspeed --num_nodes")


def test_deepspeed_rules_catch_a_batch_deepspeed_refuses():
    from perfmodel.exports.train_deepspeed import deepspeed_broken_rules

    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16}
    assert deepspeed_broken_rules(config, 4) == []
    assert deepspeed_broken_rules(config, 8) == ["batch-world-size"]


@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_tp_overlap_is_written_only_with_sequence_parallelism(framework, tmp_path, capsys):
    """'Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
    enabled' (Megatron-LM arguments.py:1401-1402); the model overlaps nothing without it either."""
    from perfmodel.exports.training import megatron_broken_rules

    base = ["estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "8", "--pp", "1", "--tp-overlap"]
    for sp, expected in (("--sp", True), ("--no-sp", False)):
        text = export(base + [sp], framework, tmp_path / sp, capsys)[0].read_text()
        written = "--tp-comm-overlap" in text if framework == "megatron" else "model.tp_comm_overlap=true" in text
        assert written is expected, sp
    ok = {"--tensor-model-parallel-size": 8, "--sequence-parallel": True, "--tp-comm-overlap": True}
    connections = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_broken_rules(ok, connections, 32) == []
    del ok["--sequence-parallel"]
    assert megatron_broken_rules(ok, connections, 32) == ["tp-overlap-needs-sp"]


def test_tp_overlap_launches_the_userbuffers_the_model_times(tmp_path, capsys, db):
    """Megatron-LM's --tp-comm-overlap alone runs Transformer Engine's defaults, which take 16 SMs from
    six GEMMs throughout (set_sm_margin); the export names a settings file instead, read by
    Transformer Engine's initialize_ub (keys vendored at v2.9), in which only the backward's bulk
    transfers hold SMs, and only while they run: the configuration training_comm._overlap times.
    Each such transfer then costs the GEMMs beside it its time x the SMs' share, so the step
    grows by that, no more, over a model without the SMs' cost."""
    from perfmodel.catalog import find_model
    from perfmodel.machine import build_machine
    from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

    argv = ["estimate", "train", "--model", "llama-3.1-70b", "--devices", "64", "--tp", "8", "--pp", "2", "--tp-overlap"]
    files = {f.name: f for f in export(argv, "megatron", tmp_path, capsys)}
    settings = yaml.safe_load(files["tp-comm-overlap.yaml"].read_text())
    assert '--tp-comm-overlap-cfg "$TP_COMM_OVERLAP_CFG"' in files["megatron.sh"].read_text()
    assert not unknown_in("megatron", files["tp-comm-overlap.yaml"])
    held = {name: cfg for name, cfg in settings.items() if cfg["set_sm_margin"]}
    assert all(cfg["method"] == "ring_exchange" and cfg["num_sm"] == 1 for cfg in held.values())
    assert {name for name, cfg in settings.items() if cfg["method"] == "bulk"} == {
        "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"}
    machine = build_machine(db, "dgx-h100", 64)
    plan, work = TrainPlan(tp=8, pp=2, dp=4, sp=True, tp_overlap=True), TrainWorkload(256, 4096)
    spec = find_model("llama-3.1-70b")
    timed = estimate_training(spec, machine, plan, work)
    free = estimate_training(spec, replace(machine, constants=replace(machine.constants, tp_overlap_bulk_sms=0.0)),
                             plan, work)
    share = settings["qkv_wgrad"]["num_sm"] / machine.accelerator.compute_units
    # Hidden: all but 1 / tp of the transfers; bulk: 2 of each layer's 8. Every microbatch pays it, and the
    # bubble's pp - 1 = 1 as long, less what the longer last backward hides of the gradient reduction.
    m = float(timed.num_microbatches)
    bulk = float(free.link_times["tp communication"]) * (1 - 1 / 8) / 4
    added = float(timed.step_time_s) - float(free.step_time_s)
    assert share * bulk * (1 - 1e-9) <= added <= share * bulk * (m + 1) / m * (1 + 1e-9)


def test_a_rack_of_trays_launches_per_host(tmp_path, capsys):
    """A GB200 NVL72 rack is one NVLink domain of 18 hosts (trays) of 4 GPUs: the launch starts 4
    processes on each of 18 hosts, not 72 on one."""
    files = export(["estimate", "train", "--model", "llama-3.1-70b", "--system", "gb200-nvl72", "--devices", "72",
                     "--tp", "8", "--pp", "1", "--dp", "9", "--zero", "1", "--global-batch", "72"], "megatron", tmp_path,
                    capsys)
    text = next(p for p in files if p.name == "megatron.sh").read_text()
    assert "--nproc-per-node 4 --nnodes 18" in " ".join(text.split()), text[:400]


def test_sglang_chunk_is_given_for_every_attention_rank():
    """SGLang divides --chunked-prefill-size among the attention data-parallel ranks (0.5.23,
    _handle_data_parallelism): the launch gives the plan's per-rank chunk times the ranks."""
    from perfmodel.catalog import find_model
    from perfmodel.exports.serving import PoolSpec, _sglang_items

    pool = PoolSpec(role="colocated", system="hgx-h200", instances=1, devices_per_instance=8, devices_per_node=8,
                    tp=2, pp=1, ep=8, dp_attention=4, batch=256, weight="fp8", activation="a8", kv="bf16",
                    kv_place="hbm", max_len=4096, chunk_tokens=2048)
    items = _sglang_items(find_model("deepseek-v3"), pool)
    assert items["--chunked-prefill-size"] == 8192 and items["--enable-mixed-chunk"] is True
