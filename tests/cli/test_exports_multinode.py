"""Serving instances that span hosts (issue 32, item 2), and TensorRT-LLM's MoE load balancer: golden files
for a DeepSeek-V3 instance over two dgx-h100 nodes and over two GB200 NVL72 trays, the launch each
script makes on each host (run under bash with recording launchers), and each vendored rule refusing in
one line with the framework's reason. ``UPDATE_GOLDEN=1`` rewrites the golden files, as in test_exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from perfmodel.cli.app import main
from perfmodel.exports.vendored import vendored
from tests.cli.golden import assert_golden, export

DEEPSEEK = ["estimate", "serve", "--model", "deepseek-v3", "--tp", "1", "--weight-precision", "fp8",
            "--activation-precision", "a8"]
CASES = {
    # 16 GPUs over two 8-GPU hosts: wide expert parallelism with attention data parallelism, EPLB's 32 copies.
    "deepseek-two-node-serve": (DEEPSEEK + ["--system", "dgx-h100", "--devices", "16", "--ep", "16", "--dp-attention",
                                            "16", "--batch", "512"], ("trtllm", "dynamo", "vllm", "sglang")),
    # 8 GPUs of a GB200 NVL72 are two 4-GPU trays: two launch hosts in one NVLink domain.
    "deepseek-gb200-trays-serve": (DEEPSEEK + ["--system", "gb200-nvl72", "--devices", "8", "--ep", "8",
                                               "--dp-attention", "8", "--batch", "256"], ("trtllm", "dynamo")),
}


@pytest.mark.parametrize("case,framework", [(c, f) for c, (_, fws) in CASES.items() for f in fws])
def test_golden_files(case, framework, tmp_path, capsys):
    files = export(CASES[case][0], framework, tmp_path / "out", capsys)
    assert_golden(files, f"{case}-{framework}")


RECORDER = '''#!{python}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
'''


def _launches(script: Path, env: dict[str, str], tmp_path: Path) -> list[list[str]]:
    """The commands ``script`` runs, with srun, mpirun, vllm, trtllm-serve and python recorded, not run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "mpirun", "vllm", "trtllm-serve", "trtllm-llmapi-launch", "python"):
        (bin_dir / name).write_text(RECORDER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record.jsonl"
    record.unlink(missing_ok=True)
    done = subprocess.run(["bash", script.name], cwd=script.parent, capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), **env})
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def _value(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


@pytest.mark.parametrize("env,launcher", [({"SLURM_JOB_ID": "1"}, "srun"),
                                          ({"HOSTS": "h0:8,h1:8"}, "mpirun")])
def test_trtllm_runs_one_mpi_rank_per_gpu_of_its_hosts(env, launcher, tmp_path, capsys):
    """llm_mgmn_trtllm_serve.sh:17-19: as many MPI processes as the model's world size (tp x pp, attention DP
    counted in tp), each running trtllm-llmapi-launch trtllm-serve."""
    out = tmp_path / "out"
    export(CASES["deepseek-two-node-serve"][0], "trtllm", out, capsys)
    [words] = _launches(out / "trtllm.sh", env, tmp_path)
    assert words[0] == launcher
    ranks = int(_value(words, "-N")) * int(_value(words, "--ntasks-per-node")) if launcher == "srun" \
        else int(_value(words, "-n"))
    serve = words[words.index("trtllm-llmapi-launch") + 1:]
    assert serve[0] == "trtllm-serve"
    assert ranks == int(_value(serve, "--tp_size")) * int(_value(serve, "--pp_size")) == 16
    assert int(_value(serve, "--gpus_per_node")) == 8


def test_trtllm_without_hosts_says_what_it_needs(tmp_path, capsys):
    out = tmp_path / "out"
    export(CASES["deepseek-two-node-serve"][0], "trtllm", out, capsys)
    done = subprocess.run(["bash", "trtllm.sh"], cwd=out, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0 and "2 hosts of this instance" in done.stderr


def test_trtllm_load_balancer_holds_the_predicted_redundant_experts(tmp_path, capsys):
    """MoeLoadBalancerConfig: num_slots = 256 experts + EPLB's 32 copies, a whole number per EP rank, online."""
    out = tmp_path / "out"
    export(CASES["deepseek-two-node-serve"][0], "trtllm", out, capsys)
    options = yaml.safe_load((out / "extra-llm-api-config.yml").read_text())
    assert options["moe_config"]["load_balancer"] == {"num_slots": 288, "layer_updates_per_iter": 1}
    keys = vendored("trtllm").keys
    assert {"moe_config.load_balancer.num_slots", "moe_config.load_balancer.layer_updates_per_iter"} <= set(keys)


def test_trtllm_without_eplb_writes_no_load_balancer(tmp_path, capsys):
    out = tmp_path / "out"
    export(CASES["deepseek-two-node-serve"][0] + ["--expert-balance", "none"], "trtllm", out, capsys)
    assert "moe_config" not in yaml.safe_load((out / "extra-llm-api-config.yml").read_text())


@pytest.mark.parametrize("experts,redundant,ep,reason", [(256, 3, 16, "must be divisible by `ep_size`"),
                                                        (256, -16, 16, "Must be >= total experts")])
def test_trtllm_load_balancer_rules_refuse_in_one_line(experts, redundant, ep, reason):
    from perfmodel.exports import ExportError
    from perfmodel.exports.serving import load_balancer

    with pytest.raises(ExportError) as err:
        load_balancer(experts, redundant, ep)
    assert reason in str(err.value) and "\n" not in str(err.value) and "TensorRT-LLM" in str(err.value)


@pytest.mark.parametrize("node_rank,headless", [("0", False), ("1", True)])
def test_vllm_runs_headless_on_every_host_but_the_first(node_rank, headless, tmp_path, capsys):
    """vLLM 0.33.0: remote engines must use --headless (v1/engine/utils.py:1502-1514)."""
    out = tmp_path / "out"
    export(CASES["deepseek-two-node-serve"][0], "vllm", out, capsys)
    [words] = _launches(out / "vllm.sh", {"NODE_RANK": node_rank, "MASTER_ADDR": "h0"}, tmp_path)
    assert words[:2] == ["vllm", "serve"] and ("--headless" in words) == headless
    assert _value(words, "--nnodes") == "2" and _value(words, "--node-rank") == node_rank


def test_sglang_runs_the_same_command_on_every_host(tmp_path, capsys):
    out = tmp_path / "out"
    export(CASES["deepseek-two-node-serve"][0], "sglang", out, capsys)
    [words] = _launches(out / "sglang.sh", {"NODE_RANK": "1", "MASTER_ADDR": "h0"}, tmp_path)
    assert _value(words, "--nnodes") == "2" and _value(words, "--dist-init-addr") == "h0:5000"


@pytest.mark.parametrize("case,gpus", [("deepseek-two-node-serve", "8"), ("deepseek-gb200-trays-serve", "4")])
def test_dynamo_worker_spans_hosts_with_one_pod_per_host(case, gpus, tmp_path, capsys):
    """A GB200 tray has 4 GPUs: an 8-GPU worker is two pods of 4 (multinode.nodeCount 2), never one pod of 8;
    the operator injects the per-host launch flags, so the args carry none."""
    out = tmp_path / "out"
    [file] = export(CASES[case][0], "dynamo", out, capsys)
    worker = yaml.safe_load(file.read_text())["spec"]["components"][1]
    container = worker["podTemplate"]["spec"]["containers"][0]
    assert worker["multinode"] == {"nodeCount": 2}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(container["args"])


@pytest.mark.parametrize("engine,dp,devices,per_host,rule", [
    (1, 16, 16, 8, None), (16, 1, 16, 8, None), (2, 8, 16, 8, None), (8, 1, 8, 8, None), (2, 2, 4, 4, None),
    (12, 1, 12, 8, "multinode-gpus-per-pod"), (16, 2, 32, 8, "multinode-tp-precedes-dp"),
    (3, 8, 24, 8, "multinode-dp-engines-per-node")])
def test_dynamo_multinode_rules(engine, dp, devices, per_host, rule):
    from perfmodel.exports.serving import dynamo_multinode_problem

    problem = dynamo_multinode_problem(engine, dp, devices, per_host)
    if rule is None:
        assert problem is None
    else:
        assert vendored("dynamo").rules[rule]["reason"] in problem and "\n" not in problem


def test_a_dynamo_worker_that_does_not_fill_its_hosts_is_refused_in_one_line(tmp_path, capsys):
    code = main(["estimate", "serve", "--model", "llama-3.1-70b", "--system", "dgx-h100", "--devices", "12",
                 "--tp", "4", "--dp-attention", "3", "--batch", "48", "--export", "dynamo",
                 "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "containerGPUs" in err, err


@pytest.mark.parametrize("framework", ["trtllm", "dynamo"])
def test_plan_serve_exports_deepseek_across_dgx_h100_nodes(framework, tmp_path, capsys):
    """The served DeepSeek-V3 plan on dgx-h100 spans two nodes per instance; both frameworks now write it."""
    out = tmp_path / "out"
    files = export(["plan", "serve", "--model", "deepseek-v3", "--system", "dgx-h100", "--rate", "20"], framework,
                    out, capsys)
    text = "\n".join(f.read_text() for f in files)
    assert ("trtllm-llmapi-launch" in text and "srun -N 2" in text) if framework == "trtllm" else "nodeCount: 2" in text


def test_every_serving_rule_cites_its_source_and_is_checked_by_a_writer():
    from perfmodel.exports import serving

    code = Path(serving.__file__).read_text()
    for framework in ("vllm", "trtllm", "dynamo"):
        rules = vendored(framework).rules
        assert rules, framework
        for name, entry in rules.items():
            assert entry["reason"] and any(s in entry["source"] for s in (".py", ".go", ".sh:", ".md")), name
            assert f'"{name}"' in code, f"{framework} rule {name} is checked by no writer"


def test_the_serving_search_for_dynamo_skips_layouts_its_operator_cannot_place():
    """plan serve --export dynamo searches only what Dynamo runs: layout_problem knows the launch host."""
    from perfmodel.exports.serving import layout_problem

    assert "needsTensorParallelMultinodeLaunch" in layout_problem("dynamo", 8, 1, 2, 16, 4)
    assert layout_problem("dynamo", 8, 1, 2, 16, 8) is None      # 16 GPUs: two 8-GPU engines, one per host
    assert layout_problem("vllm", 8, 1, 2, 16, 4) is None        # vLLM runs it with --nnodes
