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


def test_dynamo_multinode_pods_get_the_operators_flags(bench):
    """backend_vllm.go: data parallelism over pods -> hybrid LB with GPUs/(TP x PP) local engines per pod;
    an engine wider than a pod -> the multiprocessing launch, --headless on the workers."""
    from conformance_multinode import operator_roles

    dp = ["--tensor-parallel-size", "2", "--data-parallel-size", "8"]
    (_, leader), (_, worker) = operator_roles(dp, 8, 2)
    assert leader[leader.index("--data-parallel-size-local") + 1] == "4"
    assert leader[leader.index("--data-parallel-start-rank") + 1] == "0"
    assert worker[worker.index("--data-parallel-start-rank") + 1] == "4"
    (_, leader), (_, worker) = operator_roles(["--tensor-parallel-size", "16"], 8, 2)
    assert leader[-2:] == ["--node-rank", "0"] and worker[-3:] == ["--node-rank", "1", "--headless"]
    assert operator_roles(dp, 8, 1) == [("", dp)]


def test_multi_host_scripts_launch_as_the_first_and_the_last_host(bench, tmp_path):
    from conformance_multinode import node_ranks

    script = tmp_path / "vllm.sh"
    script.write_text('vllm serve "$MODEL" \\\n  --nnodes 4 \\\n  --node-rank "$NODE_RANK"\n')
    assert node_ranks(script) == ["0", "3"]
    script.write_text('vllm serve "$MODEL" --tensor-parallel-size 8\n')
    assert node_ranks(script) == ["0"]


@pytest.mark.parametrize("tasks,verdict", [("8", "source"), ("4", "fail")])
def test_trtllm_launch_checked_against_its_vendored_rules(bench, tmp_path, tasks, verdict):
    from conformance_multinode import trtllm_verdict

    (tmp_path / "x.yml").write_text("enable_attention_dp: true\nmoe_config:\n  load_balancer:\n    num_slots: 288\n"
                                    "    layer_updates_per_iter: 1\n")
    argv = ["-N", "2", "--ntasks-per-node", tasks, "--mpi=pmix", "trtllm-llmapi-launch", "trtllm-serve", "m",
            "--tp_size", "16", "--pp_size", "1", "--ep_size", "16", "--extra_llm_api_options", "x.yml"]
    got, message = trtllm_verdict({"launcher": "srun", "argv": argv}, tmp_path, 256, 8)
    assert got == verdict, message
    assert ("18 per EP rank of 16" in message) if verdict == "source" else ("8 MPI ranks" in message)
