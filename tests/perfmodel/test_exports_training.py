"""Training launch files of Megatron-LM and Megatron-Bridge (perfmodel.exports.training), called
directly: each written file is parsed back (the shell command's flags, the recipe's overrides, the
userbuffers YAML) and every choice of the plan is found there with its value; the launch's world
size is the plan's degrees' product; the framework's own rules (as the module vendors them) accept
what is written; plans a framework cannot run are refused with ExportError saying why; the same
plan writes the same files.
"""

from __future__ import annotations

import math
import shlex

import pytest
import yaml

from perfmodel.catalog import find_model
from perfmodel.exports import ExportError, training_files, training_frameworks
from perfmodel.exports import training as tr
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

TOKENS = 1e10

# name: (model, devices of dgx-h100, plan, (global batch, sequence length)); every plan is feasible
# (estimate_training), so its degrees fill the devices.
PLANS = {
    "8b-tp2-full": ("llama-3.1-8b", 8, dict(tp=2, dp=4, zero=1, recompute="full", sp=True), (64, 8192)),
    "70b-interleave-tp-overlap-fp8": ("llama-3.1-70b", 64, dict(tp=8, pp=4, dp=2, interleave=5, zero=1,
                                                                 recompute="selective", sp=True, tp_overlap=True,
                                                                 precision="fp8"), (256, 8192)),
    "mixtral-ep8-fp8": ("mixtral-8x7b", 64, dict(tp=1, pp=4, dp=16, ep=8, etp=1, interleave=8, zero=1,
                                                 precision="fp8"), (256, 4096)),
    "deepseek-layout-ep-overlap": ("deepseek-v3", 1024, dict(tp=2, pp=8, dp=64, interleave=4, ep=64, etp=1, sp=True,
                                                             zero=1, recompute="selective", precision="fp8",
                                                             ends_as_layers=True, ep_overlap=True), (8192, 2048)),
    "8b-cp4-all-gather": ("llama-3.1-8b", 8, dict(tp=1, dp=2, cp=4, cp_comm="all_gather", zero=1, recompute="full"),
                          (64, 32768)),
    "8b-zero0-tp8": ("llama-3.1-8b", 8, dict(tp=8, dp=1, zero=0, sp=True), (64, 8192)),
    "8b-zero2": ("llama-3.1-8b", 8, dict(dp=8, zero=2, recompute="full"), (64, 8192)),
    "8b-zero3-modules": ("llama-3.1-8b", 8, dict(dp=8, zero=3, recompute="modules"), (64, 8192)),
    "8b-offload": ("llama-3.1-8b", 8, dict(dp=8, zero=1, optimizer_place="ddr", recompute="full"), (64, 8192)),
    "8b-partial-distributed-optimizer": ("llama-3.1-8b", 16, dict(dp=16, zero=1, shard=8, recompute="full"),
                                         (64, 8192)),
    "8b-hsdp-zero3": ("llama-3.1-8b", 16, dict(dp=16, zero=3, shard=8, recompute="full"), (64, 8192)),
    "8b-hybrid-fsdp-zero2": ("llama-3.1-8b", 16, dict(dp=16, zero=2, shard_grads=8, recompute="full"), (64, 8192)),
    "405b-uneven-pipeline": ("llama-3.1-405b", 1024, dict(tp=8, pp=8, dp=16, zero=1, sp=True, recompute="full"),
                             (1024, 8192)),
    "8b-tp4-without-sp": ("llama-3.1-8b", 8, dict(tp=4, dp=2, zero=1, recompute="selective"), (64, 8192)),
    "8b-fp16": ("llama-3.1-8b", 8, dict(dp=8, zero=1, recompute="full", precision="fp16"), (64, 8192)),
}


def _case(db, name):
    model, devices, plan, (global_batch, seq_len) = PLANS[name]
    return (find_model(model), build_machine(db, "dgx-h100", devices), TrainPlan(**plan),
            TrainWorkload(global_batch, seq_len, TOKENS), model)


# --- reading the written files back ---------------------------------------------------------------

def _words(script: str) -> list[str]:
    return shlex.split(script.replace("\\\n", " "), comments=True)


def _flags(words: list[str]) -> dict[str, list[str]]:
    """``--flag value ...`` words as flag -> its values ([] for a bare flag); each flag once."""
    out: dict[str, list[str]] = {}
    name = None
    for word in words:
        if word.startswith("--"):
            assert word not in out, f"{word} written twice"
            name, out[word] = word, []
        else:
            out[name].append(word)
    return out


def _megatron(script: str) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, str | None]]:
    """(torchrun's flags, pretrain_gpt.py's flags, the environment the script sets) of megatron.sh."""
    words = _words(script)
    launcher, entry = words.index("torchrun"), words.index("pretrain_gpt.py")
    return _flags(words[launcher + 1:entry]), _flags(words[entry + 1:]), tr._environment_of(script)


def _value(text: str):
    """A Hydra override's value as Python: true / false, null (tr.NULL), an int, or the text."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return tr.NULL
    try:
        return int(text)
    except ValueError:
        return text


def _nemo(script: str) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, object]]:
    """(torchrun's flags, run_recipe.py's flags, the recipe overrides) of nemo.sh."""
    words = _words(script)
    launcher, entry = words.index("torchrun"), words.index("scripts/training/run_recipe.py")
    rest = words[entry + 1:]
    overrides = [w for w in rest if "=" in w and not w.startswith("-")]
    return (_flags(words[launcher + 1:entry]), _flags([w for w in rest if w not in overrides]),
            {k: _value(v) for k, v in (w.split("=", 1) for w in overrides)})


def _world(launcher: dict[str, list[str]]) -> int:
    return int(launcher["--nproc-per-node"][0]) * int(launcher["--nnodes"][0])


# --- every plan's choices, flag by flag -----------------------------------------------------------

def _one(flags, name):
    (value,) = flags[name]
    return value


def test_the_plans_are_feasible(db):
    """The cases are plans the model accepts: their degrees fill the devices, the batch divides."""
    for name in PLANS:
        spec, machine, plan, work, _ = _case(db, name)
        assert bool(estimate_training(spec, machine, plan, work, detail=False).feasible), name


@pytest.mark.parametrize("name", [n for n in PLANS if not n.startswith("mixtral")])
def test_megatron_writes_every_choice_of_the_plan(db, name):
    spec, machine, plan, work, ref = _case(db, name)
    files = training_files("megatron", spec, machine, plan, work, ref)
    launcher, flags, environment = _megatron(files["megatron.sh"])
    _check_megatron(spec, machine, plan, work, launcher, flags, environment)
    assert set(files) == {"megatron.sh"} | ({tr.TP_COMM_OVERLAP_FILE} if "--tp-comm-overlap" in flags else set())


def test_mixtral_megatron_writes_the_expert_degrees(db):
    spec, machine, plan, work, ref = _case(db, "mixtral-ep8-fp8")
    launcher, flags, environment = _megatron(training_files("megatron", spec, machine, plan, work, ref)["megatron.sh"])
    _check_megatron(spec, machine, plan, work, launcher, flags, environment)
    assert (_one(flags, "--num-experts"), _one(flags, "--moe-router-topk")) == ("8", "2")
    # The exchange the cost model prices (training_comm): the all-to-all dispatcher, not the allgather
    # default, here without the overlap.
    assert flags["--moe-token-dispatcher-type"] == ["alltoall"] and "--overlap-moe-expert-parallel-comm" not in flags


@pytest.mark.parametrize("dispatcher", ["deepep", "hybridep"])
def test_a_flex_dispatcher_is_written_as_megatron_core_names_it(db, dispatcher):
    """plan.Dispatcher's flex backends as core_v0.19.0's two settings, in Megatron-LM's flags and in
    Megatron-Bridge's overrides (checked against Megatron's own parse_args + validate_args by
    benchmarks/bench_export_conformance.py's checker)."""
    spec, machine, plan, work, ref = _case(db, "mixtral-ep8-fp8")
    plan = TrainPlan(**{**vars(plan), "dispatcher": dispatcher})
    _, flags, _ = _megatron(training_files("megatron", spec, machine, plan, work, ref)["megatron.sh"])
    assert flags["--moe-token-dispatcher-type"] == ["flex"] and flags["--moe-flex-dispatcher-backend"] == [dispatcher]
    spec, machine = find_model("gpt-oss-120b"), build_machine(db, "dgx-h100", 64)
    plan, work = TrainPlan(dp=64, ep=16, recompute="full", dispatcher=dispatcher), TrainWorkload(1024, 4096, TOKENS)
    *_, overrides = _nemo(training_files("nemo", spec, machine, plan, work, "gpt-oss-120b")["nemo.sh"])
    assert overrides["model.moe_token_dispatcher_type"] == "flex"
    assert overrides["model.moe_flex_dispatcher_backend"] == dispatcher
    if dispatcher == "deepep":
        toml = training_files("torchtitan", spec, machine, plan, work, "gpt-oss-120b")["torchtitan.toml"]
        assert 'expert_parallel_comm_backend = "deepep"' in toml
    else:
        with pytest.raises(ExportError, match="not HybridEP"):
            training_files("torchtitan", spec, machine, plan, work, "gpt-oss-120b")


def _check_megatron(spec, machine, plan, work, launcher, flags, environment):
    p = plan
    # The launch: one process per device, nodes x GPUs per node = the devices = the degrees' product.
    per_node = machine.system.devices_per_launch_host
    assert int(_one(launcher, "--nproc-per-node")) == min(machine.devices, per_node)
    assert int(_one(launcher, "--nnodes")) == math.ceil(machine.devices / per_node)
    assert _world(launcher) == machine.devices == p.tp * p.pp * p.dp * p.cp
    # Parallel degrees.
    assert int(_one(flags, "--tensor-model-parallel-size")) == p.tp
    assert int(_one(flags, "--pipeline-model-parallel-size")) == p.pp
    assert int(_one(flags, "--context-parallel-size")) == p.cp
    assert ("--sequence-parallel" in flags) == bool(p.sp and p.tp > 1)
    assert flags.get("--cp-comm-type") == ([p.cp_comm] if p.cp > 1 and p.cp_comm != "p2p" else None)
    if spec.moe:
        assert int(_one(flags, "--expert-model-parallel-size")) == p.ep
        assert int(_one(flags, "--expert-tensor-parallel-size")) == (p.etp or p.tp)
        assert (p.tp * p.cp * p.dp) % (p.ep * (p.etp or p.tp)) == 0
    else:
        assert "--expert-model-parallel-size" not in flags
    # Virtual stages: a flag, or a layout of pp x interleave stages holding every layer.
    layout = flags.get("--pipeline-model-parallel-layout")
    if layout:
        stages = _one(flags, "--pipeline-model-parallel-layout").split("|")
        assert len(stages) == p.pp * p.interleave and "--num-virtual-stages-per-pipeline-rank" not in flags
        assert "".join(stages).count("t") == spec.num_layers
        assert "".join(stages).count("m") == (spec.mtp_layers if p.ends_as_layers else 0)
    else:
        assert flags.get("--num-virtual-stages-per-pipeline-rank") == ([str(p.interleave)] if p.interleave > 1
                                                                        else None)
    # Batch, sequence, steps.
    assert int(_one(flags, "--micro-batch-size")) == p.micro_batch
    assert int(_one(flags, "--global-batch-size")) == work.global_batch
    assert work.global_batch % (p.micro_batch * p.dp) == 0
    assert int(_one(flags, "--seq-length")) == work.seq_len
    assert int(_one(flags, "--train-iters")) == math.ceil(TOKENS / (work.global_batch * work.seq_len))
    # Recompute.
    granularity = {"none": None, "selective": ["selective"], "modules": ["selective"], "full": ["full"]}[p.recompute]
    assert flags.get("--recompute-granularity") == granularity
    assert flags.get("--recompute-method") == (["uniform"] if p.recompute == "full" else None)
    assert flags.get("--recompute-modules") == (tr.recompute_modules(spec) if p.recompute == "modules" else None)
    # Precision.
    assert ("--bf16" in flags, "--fp16" in flags) == (p.precision in ("bf16", "fp8"), p.precision == "fp16")
    assert flags.get("--fp8-format") == (["hybrid"] if p.precision == "fp8" else None)
    assert flags.get("--fp8-recipe") == (["tensorwise"] if p.precision == "fp8" else None)
    # ZeRO: the distributed optimizer at stage 1, Megatron-FSDP at 2 and 3.
    assert ("--use-distributed-optimizer" in flags) == (p.zero == 1)
    assert ("--use-megatron-fsdp" in flags) == (p.zero >= 2)
    assert flags.get("--data-parallel-sharding-strategy") == (
        {2: ["optim_grads"], 3: ["optim_grads_params"]}.get(p.zero))
    assert flags.get("--ckpt-format") == (["fsdp_dtensor"] if p.zero >= 2 else None)
    w, g, o, _ = (int(x) for x in tr.TrainJob(spec, "dgx-h100", machine.devices, 8, p, work, "").groups)
    inner = o if p.zero == 1 else g
    replicas = p.dp * p.cp
    assert flags.get("--num-distributed-optimizer-instances") == (
        [str(replicas // inner)] if p.zero >= 1 and inner < replicas else None)
    # Overlaps and offload.
    assert ("--overlap-grad-reduce" in flags) == bool(p.overlap_dp and p.dp > 1)
    assert ("--tp-comm-overlap" in flags) == bool(p.tp_overlap and p.sp and p.tp > 1)
    assert ("--overlap-moe-expert-parallel-comm" in flags) == bool(p.ep_overlap and spec.moe and p.ep > 1)
    offload = p.optimizer_place == "ddr"
    assert ("--optimizer-cpu-offload" in flags, "--use-precision-aware-optimizer" in flags) == (offload, offload)
    # The environment Megatron asserts, and its own rules accept the launch as written.
    if p.zero >= 2:
        assert environment == {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    elif (p.tp > 1 or p.cp > 1) and not p.ep_overlap:
        assert environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    items = {k: (v[0] if len(v) == 1 else (True if not v else v)) for k, v in flags.items()}
    assert tr.megatron_broken_rules(items, environment, spec.num_layers) == []
    # The architecture.
    assert [int(_one(flags, f)) for f in ("--num-layers", "--hidden-size", "--num-attention-heads")] == \
        [spec.num_layers, spec.hidden_size, spec.num_heads]


RECIPE_PREFIX = {"llama-3.1-8b": "llama31_8b_", "llama-3.1-70b": "llama31_70b_", "llama-3.1-405b": "llama31_405b_",
                 "deepseek-v3": "deepseek_v3_"}


@pytest.mark.parametrize("name", [n for n in PLANS if not n.startswith("mixtral")])
def test_megatron_bridge_overrides_every_choice_of_the_plan(db, name):
    spec, machine, plan, work, ref = _case(db, name)
    p = plan
    files = training_files("nemo", spec, machine, plan, work, ref)
    assert set(files) == {"nemo.sh"}
    launcher, flags, o = _nemo(files["nemo.sh"])
    assert _world(launcher) == machine.devices == p.tp * p.pp * p.dp * p.cp
    recipe = _one(flags, "--recipe")   # the model's own pretraining recipe of Megatron-Bridge
    assert recipe.startswith(RECIPE_PREFIX[spec.name]) and "_pretrain_" in recipe and recipe.endswith("_config")
    assert flags["--mode"] == ["pretrain"] and flags["--dataset"] == ["mock"]
    assert (o["model.tensor_model_parallel_size"], o["model.pipeline_model_parallel_size"],
            o["model.context_parallel_size"]) == (p.tp, p.pp, p.cp)
    assert o["model.sequence_parallel"] is bool(p.sp and p.tp > 1)
    assert o.get("model.cp_comm_type") == (p.cp_comm if p.cp > 1 and p.cp_comm != "p2p" else None)
    if spec.moe:
        assert (o["model.expert_model_parallel_size"], o["model.expert_tensor_parallel_size"]) == (p.ep, p.etp or p.tp)
        # The exchange the cost model prices: the all-to-all dispatcher, never the allgather default.
        assert o.get("model.moe_token_dispatcher_type") == ("alltoall" if p.ep > 1 else None)
    layout = o["model.pipeline_model_parallel_layout"]
    if layout is tr.NULL:
        assert o["model.virtual_pipeline_model_parallel_size"] == (p.interleave if p.interleave > 1 else tr.NULL)
    else:
        assert len(layout.split("|")) == p.pp * p.interleave and layout.count("t") == spec.num_layers
        assert o["model.virtual_pipeline_model_parallel_size"] in (tr.NULL, p.interleave)
    assert (o["model.seq_length"], o["dataset.seq_length"]) == (work.seq_len, work.seq_len)
    assert (o["train.micro_batch_size"], o["train.global_batch_size"]) == (p.micro_batch, work.global_batch)
    assert o["train.train_iters"] == math.ceil(TOKENS / (work.global_batch * work.seq_len))
    assert o["mixed_precision"] == {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                                    "fp8": "bf16_with_fp8_current_scaling_mixed"}[p.precision]
    assert o["optimizer.use_distributed_optimizer"] is o["ddp.use_distributed_optimizer"] is (p.zero >= 1)
    assert o.get("ddp.use_megatron_fsdp", False) is (p.zero >= 2)
    assert o.get("ddp.data_parallel_sharding_strategy") == {2: "optim_grads", 3: "optim_grads_params"}.get(p.zero)
    assert o.get("model.recompute_granularity") == {"none": None, "selective": "selective", "modules": "selective",
                                                    "full": "full"}[p.recompute]
    assert o["model.tp_comm_overlap"] is bool(p.tp_overlap and p.sp and p.tp > 1)
    assert o.get("model.overlap_moe_expert_parallel_comm", False) is bool(p.ep_overlap and spec.moe and p.ep > 1)
    assert o.get("optimizer.optimizer_cpu_offload", False) is (p.optimizer_place == "ddr")
    assert tr.bridge_broken_rules(o, tr._environment_of(files["nemo.sh"])) == []


def test_the_userbuffers_file_is_the_overlap_the_model_times(db):
    """The forward reduce-scatters ring-exchange on one SM; the backward's bulk transfers hold the
    model's constant tp-overlap-bulk-sms (the SM share perfmodel.machine times them with), only while
    they run (set_sm_margin false); written only with sequence parallelism."""
    spec, machine, plan, work, ref = _case(db, "70b-interleave-tp-overlap-fp8")
    files = training_files("megatron", spec, machine, plan, work, ref)
    userbuffers = yaml.safe_load(files[tr.TP_COMM_OVERLAP_FILE])
    ring = {"method": "ring_exchange", "num_sm": 1, "set_sm_margin": True}
    bulk = {"method": "bulk", "num_sm": machine.constants.tp_overlap_bulk_sms, "cga_size": 2, "set_sm_margin": False}
    assert userbuffers == {"proj_fprop": ring, "fc2_fprop": ring, "qkv_dgrad": bulk, "qkv_wgrad": bulk,
                           "fc1_dgrad": bulk, "fc1_wgrad": bulk}
    _, flags, _ = _megatron(files["megatron.sh"])
    assert flags["--tp-comm-overlap-cfg"] == ["$TP_COMM_OVERLAP_CFG"]
    assert f'TP_COMM_OVERLAP_CFG="$(cd "$(dirname "$0")" && pwd)/{tr.TP_COMM_OVERLAP_FILE}"' in files["megatron.sh"]
    without_sp = TrainPlan(**{**PLANS["70b-interleave-tp-overlap-fp8"][2], "sp": False})
    assert not tr.tp_overlapped(without_sp)
    assert set(training_files("megatron", spec, machine, without_sp, work, ref)) == {"megatron.sh"}


def test_the_deepseek_layout_places_the_embedding_mtp_and_loss(db):
    """Megatron-Bridge's DeepSeek-V3 split: 61 layers over 8 x 4 virtual stages with the embedding, the
    MTP depth and the loss as slots ('Et|(tt|)*30mL'), the same in both frameworks."""
    spec, machine, plan, work, ref = _case(db, "deepseek-layout-ep-overlap")
    _, flags, environment = _megatron(training_files("megatron", spec, machine, plan, work, ref)["megatron.sh"])
    _, _, overrides = _nemo(training_files("nemo", spec, machine, plan, work, ref)["nemo.sh"])
    expected = "Et|" + "tt|" * 30 + "mL"
    assert _one(flags, "--pipeline-model-parallel-layout") == overrides["model.pipeline_model_parallel_layout"] \
        == expected
    assert flags["--moe-token-dispatcher-type"] == ["alltoall"] and "CUDA_DEVICE_MAX_CONNECTIONS" not in environment


# --- the module's helpers -------------------------------------------------------------------------

@pytest.mark.parametrize("model, pp, interleave, ends, expected", [
    ("llama-3.1-70b", 4, 5, False, [4] * 20),
    ("llama-3.1-405b", 8, 1, False, [15, 15, 16, 16, 16, 16, 16, 16]),   # 126 layers: the shorter stages first
    ("llama-3.1-405b", 8, 1, True, [16] * 8),                            # 126 + embedding + loss
    ("deepseek-v3", 8, 4, True, [2] * 32),                               # 61 + embedding + MTP + loss
    ("llama-3.1-8b", 1, 1, False, [32]),
])
def test_chunk_slots_split_the_layers_as_the_plan_does(db, model, pp, interleave, ends, expected):
    spec = find_model(model)
    job = tr.TrainJob(spec, "dgx-h100", 8 * pp, 8, TrainPlan(tp=8, pp=pp, interleave=interleave,
                                                             ends_as_layers=ends), TrainWorkload(64, 4096), model)
    slots = tr.chunk_slots(job)
    assert slots == expected
    assert sum(slots) == spec.num_layers + (2 + spec.mtp_layers) * (ends and pp > 1)


def test_train_job_counts_nodes_steps_and_groups(db):
    spec, machine, plan, work, ref = _case(db, "8b-hybrid-fsdp-zero2")
    job = tr.TrainJob(spec, machine.system.name, machine.devices, 8, plan, work, ref)
    assert (job.nodes, job.gpus_per_node, job.replicas, job.etp) == (2, 8, 16, 1)
    assert job.steps == math.ceil(TOKENS / (64 * 8192))
    assert job.groups == (1, 8, 16, 1)   # weights unsharded at stage 2, gradients over 8, optimizer over 16; no hpZ
    assert "gradients over 8, optimizer states over 16 of 16 replicas" in job.describe()
    small = tr.TrainJob(spec, "dgx-h100", 4, 8, TrainPlan(dp=4), TrainWorkload(8, 1024, 1.0), ref)
    assert (small.nodes, small.gpus_per_node, small.steps) == (1, 4, 1)


# --- what a framework cannot run ------------------------------------------------------------------

REFUSED = [
    ("megatron", "llama-3.1-8b", 8, dict(dp=8, zero=1, optimizer_place="ddr", grad_place="ddr"),
     "offloads optimizer states only"),
    ("nemo", "llama-3.1-8b", 8, dict(dp=8, zero=1, optimizer_place="ddr", param_place="ddr"),
     "offloads optimizer states only"),
    ("megatron", "llama-3.1-8b", 8, dict(dp=8, zero=1, optimizer_place="nvme"), "to host DDR only"),
    ("megatron", "llama-3.1-8b", 8, dict(dp=8, zero=0, optimizer_place="ddr"), "with the distributed optimizer only"),
    ("megatron", "llama-3.1-8b", 8, dict(dp=8, zero=3, hpz=2), "has no ZeRO++ (hpZ in the plan)"),
    ("nemo", "llama-3.1-8b", 8, dict(dp=8, zero=3, qwz=True), "has no ZeRO++ (qwZ in the plan)"),
    ("megatron", "llama-3.1-8b", 16, dict(dp=16, zero=2, shard=4, shard_grads=8),
     "shards the optimizer states inside each group or across all 16 replicas"),
    ("megatron", "llama-3.1-8b", 16, dict(dp=16, zero=3, shard=16, shard_grads=8, shard_weights=4),
     "shards weights and gradients over the same group"),
    ("megatron", "mixtral-8x7b", 64, dict(pp=4, dp=16, ep=8, etp=1, interleave=2, ep_overlap=True, recompute="full"),
     "only without full recomputation"),
    ("nemo", "deepseek-v3", 1024, dict(tp=2, pp=8, dp=64, ep=64, etp=1, ep_overlap=True), "with a virtual pipeline"),
    ("nemo", "mixtral-8x7b", 64, dict(pp=4, dp=16, ep=8, etp=1), "has no recipe for mixtral-8x7b"),
    ("megatron", "gpt-oss-120b", 64, dict(dp=64, ep=8), "sliding-window attention"),
    ("megatron", "mixtral-8x7b", 64, dict(pp=4, dp=16, ep=8, etp=1, schedule="dualpipe"), "runs DualPipe"),
    ("nemo", "llama-3.1-8b", 8, dict(dp=8, precision="fp8", storage="deepseek"), "low-precision storage"),
    ("megatron", "deepseek-v3", 1024, dict(pp=32, dp=32, interleave=2, ep=64, etp=1, ends_as_layers=True),
     "cannot run 61 layers over 64 virtual stages"),
    ("vllm", "llama-3.1-8b", 8, dict(dp=8), "writes serving configurations"),
]


@pytest.mark.parametrize("framework, model, devices, plan, message", REFUSED)
def test_what_a_framework_cannot_run_is_refused_saying_why(db, framework, model, devices, plan, message):
    """ExportError (a SpecError: the command line's exit 2), one line, naming the reason; the
    frameworks' answers say the same line for that framework."""
    spec, machine = find_model(model), build_machine(db, "dgx-h100", devices)
    plan, work = TrainPlan(**plan), TrainWorkload(1024, 4096, TOKENS)
    with pytest.raises(ExportError) as info:
        training_files(framework, spec, machine, plan, work, model)
    assert message in str(info.value) and "\n" not in str(info.value)
    if framework in ("megatron", "nemo"):
        assert training_frameworks(spec, machine, plan, work, model, (framework,)) == {framework: str(info.value)}


def test_an_unknown_framework_is_an_unknown_name(db):
    from perfmodel.hardware_db.errors import UnknownNameError

    spec, machine, plan, work, ref = _case(db, "8b-zero2")
    with pytest.raises(UnknownNameError):
        training_files("megatronn", spec, machine, plan, work, ref)


def test_training_frameworks_answer_none_for_what_they_run(db):
    spec, machine, plan, work, ref = _case(db, "mixtral-ep8-fp8")
    answers = training_frameworks(spec, machine, plan, work, ref)
    assert list(answers) == ["megatron", "nemo", "torchtitan", "deepspeed"]
    assert answers["megatron"] is None and "has no recipe for mixtral-8x7b" in answers["nemo"]


@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_weights_sharded_in_smaller_groups_than_gradients_are_refused(db, framework):
    spec, machine = find_model("llama-3.1-8b"), build_machine(db, "dgx-h100", 16)
    plan, work = TrainPlan(dp=16, zero=3, shard_weights=8, recompute="full"), TrainWorkload(64, 8192, TOKENS)
    assert bool(estimate_training(spec, machine, plan, work, detail=False).feasible)
    with pytest.raises(ExportError, match="shards weights and gradients over the same group"):
        training_files(framework, spec, machine, plan, work, "llama-3.1-8b")


@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_degrees_that_do_not_fill_the_devices_are_refused(db, framework):
    spec, machine = find_model("llama-3.1-8b"), build_machine(db, "dgx-h100", 8)
    plan, work = TrainPlan(tp=4, dp=4, zero=1), TrainWorkload(64, 8192, TOKENS)
    with pytest.raises(ExportError, match="16 ranks, the machine has 8 devices"):
        training_files(framework, spec, machine, plan, work, "llama-3.1-8b")


# --- determinism ----------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["megatron", "nemo"])
def test_the_same_plan_writes_the_same_files(db, framework):
    for name in ("70b-interleave-tp-overlap-fp8", "deepseek-layout-ep-overlap", "8b-hsdp-zero3"):
        first = training_files(framework, *_case(db, name))
        assert training_files(framework, *_case(db, name)) == first   # an equal plan built anew
