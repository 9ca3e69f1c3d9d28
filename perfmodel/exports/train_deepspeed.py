"""DeepSpeed launch files of a training plan: ``ds_config.json`` and ``deepspeed.sh`` (perfmodel.exports.training's
TrainJob and shared rules; the version and keys vendored in flags/deepspeed.yaml)."""

from __future__ import annotations

import json

from .errors import ExportError
from .scripts import command, flatten
from .training import TrainJob, refuse_broken, script_header, tp_overlapped
from .vendored import checked


DEEPSPEED_DEVICES = {"hbm": "none", "ddr": "cpu", "nvme": "nvme"}


def _deepspeed_sharding(job: TrainJob) -> dict[str, object]:
    """ZeRO++ (hpZ, qwZ, qgZ) and MiCS as zero_optimization keys; one line for what DeepSpeed lacks."""
    p = job.plan
    w, g, o, secondary = job.groups
    r, zero = job.replicas, int(p.zero)
    states = [size for size, on in ((w, zero >= 3), (g, zero >= 2), (o, zero >= 1)) if on]
    keys: dict[str, object] = {}
    if any(size != r for size in states):
        if len(set(states)) > 1:
            raise ExportError("DeepSpeed shards every state over one group (ZeRO, or MiCS's partition group); a group "
                              f"per state (weights over {w}, gradients over {g}, optimizer states over {o}) is not in "
                              "its config; use --export megatron for weights and gradients within a group")
        if zero < 3:
            raise ExportError(f"DeepSpeed's MiCS (mics_shard_size) shards with stage 3 only; the plan shards ZeRO "
                              f"{zero} over groups of {o}; use --export megatron (partial distributed optimizer)")
        if secondary < w or getattr(p, "qwz", False) or getattr(p, "qgz", False):
            raise ExportError("the DeepSpeed export writes MiCS or ZeRO++, not both in one config")
        keys["mics_shard_size"] = w
    if secondary < w:
        keys["zero_hpz_partition_size"] = secondary
    if getattr(p, "qwz", False):
        keys["zero_quantized_weights"] = True
    if getattr(p, "qgz", False):
        keys["zero_quantized_gradients"] = True
    return keys


def deepspeed(job: TrainJob) -> dict[str, str]:
    """``ds_config.json`` and ``deepspeed.sh``: ZeRO stage, offload, precision and batch as DeepSpeed config."""
    p = job.plan
    for degree, what in ((p.pp, "pipeline stages are set in the model code (PipelineModule(num_stages=...))"),
                         (p.cp, "its sequence parallelism (Ulysses, all-to-all) is not the plan's ring context "
                                "parallelism"),
                         (p.ep, "expert parallelism is set in the model code (deepspeed.moe.layer.MoE(ep_size=...))")):
        if degree > 1:
            raise ExportError(f"DeepSpeed cannot take this plan from ds_config.json: {what}; use --export megatron")
    if p.precision == "fp8":
        raise ExportError("DeepSpeed's config has no fp8 training; use --export megatron or torchtitan")
    if tp_overlapped(p):
        raise ExportError("DeepSpeed has no TP-communication overlap (the plan overlaps TP collectives with the "
                          "GEMMs); use --export megatron or nemo")
    for place in (p.optimizer_place, p.grad_place, p.param_place):
        if place not in DEEPSPEED_DEVICES:
            raise ExportError(f"DeepSpeed offloads to cpu or nvme; the plan uses {place}")
    if p.param_place != "hbm" and p.zero < 3:
        raise ExportError("DeepSpeed offloads weights (offload_param) only with ZeRO stage 3")
    if p.optimizer_place != "hbm" and p.zero < 1:
        raise ExportError("DeepSpeed offloads optimizer states only with ZeRO stage 1 or more")
    zero: dict[str, object] = {"stage": int(p.zero), "overlap_comm": bool(p.overlap_dp), "contiguous_gradients": True,
                               **_deepspeed_sharding(job)}
    for part, place in (("offload_optimizer", p.optimizer_place), ("offload_param", p.param_place)):
        if place != "hbm":
            zero[part] = {"device": DEEPSPEED_DEVICES[place], "pin_memory": True,
                          **({"nvme_path": "/local_nvme"} if place == "nvme" else {})}
    accumulation = job.work.global_batch // (p.micro_batch * p.dp)
    config: dict[str, object] = {
        "train_batch_size": int(job.work.global_batch), "train_micro_batch_size_per_gpu": int(p.micro_batch),
        "gradient_accumulation_steps": int(accumulation), "gradient_clipping": 1.0,
        "bf16" if p.precision == "bf16" else "fp16": {"enabled": True}, "zero_optimization": zero,
        "steps_per_print": 10, "wall_clock_breakdown": False}
    if p.tp > 1:
        config["tensor_parallel"] = {"autotp_size": int(p.tp)}
    if p.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": bool(p.tp > 1), "cpu_checkpointing": False}
    checked("deepspeed", dict(flatten(config)), "keys")
    # With AutoTP the training script passes the model-parallel unit, so DeepSpeedConfig counts dp ranks.
    refuse_broken("deepspeed", deepspeed_broken_rules(config, job.devices // int(p.tp)), "this config")
    mics = (" Build the model under deepspeed.zero.MiCS_Init(config_dict_or_path=ds_config.json) for mics_shard_size."
            if "mics_shard_size" in zero else "")
    run = (f"Run with your DeepSpeed training script (TRAIN_SCRIPT) over a hostfile of {job.nodes} node(s);{mics} "
           + ("activations are recomputed in your model code (deepspeed.checkpointing.checkpoint), "
              f"{p.recompute} as planned." if p.recompute != "none" else "no activation recomputation."))
    script = script_header("deepspeed", job, run) + deepspeed_mpu_note(job, config) + \
        ': "${TRAIN_SCRIPT:?your DeepSpeed training script}"\n' + command(
        ["deepspeed", "--num_nodes", str(job.nodes), "--num_gpus", str(job.gpus_per_node), "--hostfile",
         '"${HOSTFILE:-hostfile}"', '"$TRAIN_SCRIPT"'], {"--deepspeed": True, "--deepspeed_config": "ds_config.json"})
    return {"ds_config.json": json.dumps(config, indent=2) + "\n", "deepspeed.sh": script}


def deepspeed_broken_rules(config: dict[str, object], world_size: int) -> list[str]:
    """The vendored DeepSpeed rules (flags/deepspeed.yaml ``rules``) a ds_config breaks when
    DeepSpeedConfig sees ``world_size`` data-parallel ranks (rule batch-world-size)."""
    batch = int(config["train_batch_size"])
    per_step = int(config["train_micro_batch_size_per_gpu"]) * int(config["gradient_accumulation_steps"])
    return [] if batch == per_step * world_size else ["batch-world-size"]


def deepspeed_mpu_note(job: TrainJob, config: dict[str, object]) -> str:
    """Comment lines for a tensor-parallel config: without a model-parallel unit DeepSpeedConfig
    counts every rank as data-parallel and refuses the batch (rule batch-world-size); the exact
    calls the training script makes so that it counts the dp ranks."""
    from .vendored import rule

    tp = int(job.plan.tp)
    if tp <= 1:
        return ""
    why = rule("deepspeed", "batch-world-size")
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    return "\n".join([
        f"# Tensor parallelism (autotp_size {tp}): train_batch_size {config['train_batch_size']} = {micro} x {steps} x "
        f"{job.devices // tp} data-parallel ranks, not x {job.devices} ranks. Without a model-parallel unit",
        f"# DeepSpeed counts every rank and refuses the config: \"{why.reason}\"",
        f"# ({why.source.split(' (')[0]}). TRAIN_SCRIPT must build the TP groups and pass them as mpu, as",
        "# DeepSpeed's engine does for AutoTP (deepspeed/runtime/engine.py:653-654):",
        "#   import deepspeed",
        "#   from deepspeed.utils import groups",
        "#   deepspeed.init_distributed()",
        f"#   groups._init_tp_mesh_device(tensor_model_parallel_size={tp})",
        "#   engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),",
        "#                                                  config=\"ds_config.json\", mpu=groups)", ""])


