"""benchmarks/bench_export_conformance.py without the frameworks: it skips cleanly when the scratch
environments are absent, and its pure helpers read the launch lines as the frameworks would get them."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_export_conformance.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_export_conformance", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_skips_without_scratch_environments(bench, tmp_path, capsys):
    assert bench.main(["--envs", str(tmp_path / "none")]) == 0
    assert "no scratch environments" in capsys.readouterr().out


def test_torchrun_world_size_and_program_arguments(bench):
    argv = ["--nproc-per-node", "4", "--nnodes", "18", "--node-rank", "0", "pretrain_gpt.py", "--num-layers", "80"]
    assert bench.torchrun_split(argv) == (72, ["--num-layers", "80"])
    assert bench.torchrun_split(["--nproc-per-node", "8", "-m", "torchtitan.train", "--job.config_file", "t.toml"]) \
        == (8, ["--job.config_file", "t.toml"])


def test_router_gets_one_url_per_instance(bench, tmp_path):
    script = tmp_path / "sglang-router.sh"
    script.write_text('[ "${#prefill[@]}" -eq 6 ] && [ "${#ports[@]}" -eq 6 ] && [ "${#decode[@]}" -eq 3 ] || exit 2\n')
    env = bench.router_env(script)
    assert len(env["PREFILL_URLS"].split()) == 6 and len(env["DECODE_URLS"].split()) == 3
    assert len(set(env["PREFILL_BOOTSTRAP_PORTS"].split())) == 6


def test_recorded_launch_has_the_scripts_environment(bench, tmp_path):
    bin_dir = bench.recorder_bin(tmp_path / "bin")
    script = tmp_path / "run.sh"
    script.write_text('export CUDA_DEVICE_MAX_CONNECTIONS=1\ntorchrun --nproc-per-node 8 pretrain_gpt.py --save "$CHECKPOINT_DIR"\n')
    [launch] = bench.record(script, bin_dir, {})
    assert launch["launcher"] == "torchrun"
    assert launch["argv"] == ["--nproc-per-node", "8", "pretrain_gpt.py", "--save", "checkpoints"]
    assert launch["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_dynamo_worker_commands(bench):
    doc = {"spec": {"components": [{"name": "decode", "podTemplate": {"spec": {"containers": [
        {"command": ["python3", "-m", "dynamo.vllm"], "args": ["--model", "m", "--tensor-parallel-size", "2"]}]}}}]}}
    assert bench.dynamo_commands(doc) == [("decode", ["python3", "-m", "dynamo.vllm", "--model", "m",
                                                      "--tensor-parallel-size", "2"])]


def test_framework_message_is_the_frameworks_words(bench):
    stderr = "Traceback (most recent call last):\n  File \"x.py\", line 1\n    assert a\nAssertionError: num_layers=126 " \
             "should be divisible by pipeline_model_parallel_size=8\n"
    assert "num_layers=126 should be divisible" in bench.framework_message(stderr)
    assert bench.framework_message("usage: x\nx: error: unrecognized arguments: --foo\n") \
        == "x: error: unrecognized arguments: --foo"
