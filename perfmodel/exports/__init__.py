"""Launch configurations of the frameworks that run a plan: a plan in, the files a framework reads out.

Each writer targets one named version of its framework; every flag and key it emits is checked
against that version's argument names, vendored with their source in ``flags/*.yaml``. A plan the
framework cannot express (an offload tier it lacks) raises ``ExportError`` instead of being
approximated. Importing this package loads nothing heavy (the command line lists ``FRAMEWORKS``).
"""

from dataclasses import dataclass

from .errors import ExportError  # noqa: F401 (the package's error, raised by its writers)

TRAINING = ("megatron", "nemo", "torchtitan", "deepspeed")
SERVING = ("vllm", "sglang", "trtllm", "dynamo")
FRAMEWORKS = TRAINING + SERVING


@dataclass(frozen=True)
class Capabilities:
    """What a training framework can run, as limits on the plan space: ``plan train --export`` searches
    only plans the framework expresses (and ``estimate --export`` refuses the others, saying why)."""

    max_pp: int | None = None                 # None: any degree
    max_cp: int | None = None
    max_ep: int | None = None
    precisions: tuple[str, ...] = ("bf16", "fp16", "fp8")
    offload: tuple[tuple[str, tuple[str, ...]], ...] = ()   # (plan field, tiers it may move to)
    offload_zero: tuple[int, ...] = (1, 2, 3)  # ZeRO stages offloading works with
    sharding: tuple[str, ...] = ("flat",)      # sharding families it runs (search.vocabulary.SHARDING)
    hsdp_zero: tuple[int, ...] = (1, 2, 3)     # ZeRO stages its sub-group sharding works with
    shard_whole_cp: bool = False               # sub-groups hold whole context-parallel groups (torchtitan's mesh)
    zeropp_with_groups: bool = True            # ZeRO++ with sub-group sharding too (DeepSpeed's: not with MiCS)
    tp_overlap: bool = True                    # TP communication overlapped with the GEMMs (Megatron's userbuffers)
    ep_overlap: bool = True                    # the MoE exchange under compute (Megatron's 1F1B all-to-all overlap)
    recomputes: tuple[str, ...] = ("none", "selective", "full", "modules")   # the recomputation it expresses
    cp_comms: tuple[str, ...] = ("p2p", "all_gather", "a2a")   # context-parallel exchanges (Megatron's cp_comm_type)
    dispatchers: tuple[str, ...] = ("alltoall", "deepep", "hybridep")   # MoE token dispatchers (plan.Dispatcher)
    activation_offload: bool = False           # swaps activations as perfmodel.activation_offload does (none yet)


# Megatron-LM / Megatron-Bridge: --optimizer-cpu-offload moves optimizer states to host DDR, with the
# distributed optimizer (ZeRO 1). torchtitan: FSDP2's CPU offload moves weights, gradients and optimizer
# states together (not searched: the search moves parts one by one). DeepSpeed: ZeRO-Offload to cpu or
# nvme; weights only with stage 3; pipeline, context and expert parallelism live in the model code.
# Sharding: Megatron's partial distributed optimizer (--num-distributed-optimizer-instances) and
# Megatron-FSDP's HSDP / hybrid FSDP (--outer-dp-sharding-strategy no_shard / optim); torchtitan's HSDP
# (data_parallel_replicate_degree x data_parallel_shard_degree); DeepSpeed's MiCS (stage 3) and ZeRO++.
CAPABILITIES = {
    "megatron": Capabilities(offload=(("optimizer_place", ("ddr",)),), offload_zero=(1,),
                             sharding=("flat", "hsdp", "hfsdp")),
    "nemo": Capabilities(offload=(("optimizer_place", ("ddr",)),), offload_zero=(1,),
                         sharding=("flat", "hsdp", "hfsdp")),
    "torchtitan": Capabilities(precisions=("bf16", "fp8"), sharding=("flat", "hsdp"), shard_whole_cp=True,
                               tp_overlap=False, ep_overlap=False, recomputes=("none", "selective", "full"),
                               cp_comms=("p2p",), dispatchers=("alltoall", "deepep")),
    "deepspeed": Capabilities(max_pp=1, max_cp=1, max_ep=1, precisions=("bf16", "fp16"),
                              offload=(("optimizer_place", ("ddr", "nvme")), ("grad_place", ("ddr", "nvme")),
                                       ("param_place", ("ddr", "nvme"))),
                              sharding=("flat", "hsdp", "hpz", "qwz", "qgz"), hsdp_zero=(3,), zeropp_with_groups=False,
                              tp_overlap=False, ep_overlap=False, dispatchers=("alltoall",)),
}


# Why no exported framework runs a plan's activation offload (perfmodel.activation_offload: a share of
# every layer's saved activations, or under full recomputation MEMO's token-wise swap), one line each.
# Megatron-Core core_v0.19.0 has --fine-grained-activation-offloading (TransformerConfig
# fine_grained_activation_offloading, offload_modules, activation_offload_fraction) but it swaps the
# inputs of named modules (attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, and MoE experts'
# expert_fc1, moe_act, fused_group_mlp: not a dense MLP's), the fraction counts offload groups in
# forward order, not bytes, and nothing recomputes by token.
ACTIVATION_OFFLOAD_REFUSAL = {
    framework: f"{name} cannot swap the plan's share of every layer's activations to host memory{why}; plan "
               "--activation-offload 0 to export"
    for framework, name, why in (
        ("megatron", "Megatron-LM", " (core_v0.19.0 --fine-grained-activation-offloading swaps named modules' inputs, "
                                    "not a dense MLP's, a fraction of offload groups, with no token-wise "
                                    "recomputation)"),
        ("nemo", "Megatron-Bridge", " (Megatron-Core's fine-grained activation offloading swaps named modules' "
                                    "inputs, not a dense MLP's, with no token-wise recomputation)"),
        ("torchtitan", "torchtitan", " (its job config has no activation offload)"),
        ("deepspeed", "DeepSpeed", " (activation_checkpointing.cpu_checkpointing moves only the checkpoints of full "
                                   "recomputation, and every one of them)"))}


def check_framework(framework: str, kind: str) -> None:
    """``framework`` writes launch files for a ``kind`` ("training" or "serving") plan, else one line."""
    from perfmodel.hardware_db.errors import UnknownNameError

    allowed = TRAINING if kind == "training" else SERVING
    if framework not in FRAMEWORKS:
        raise UnknownNameError("--export framework", framework, FRAMEWORKS)
    if framework not in allowed:
        raise ExportError(f"--export {framework} writes {'serving' if kind == 'training' else 'training'} "
                          f"configurations; for a {kind} plan use one of {', '.join(allowed)}")


def training_files(framework: str, spec, machine, plan, work, model_ref: str) -> dict[str, str]:
    """The launch files (name -> text) of a training plan for ``framework``."""
    from .train_deepspeed import deepspeed
    from .train_torchtitan import torchtitan
    from .training import TrainJob, megatron, nemo

    writers = {"megatron": megatron, "nemo": nemo, "torchtitan": torchtitan, "deepspeed": deepspeed}

    check_framework(framework, "training")
    if str(getattr(plan, "schedule", "1f1b")) == "dualpipe":
        raise ExportError("no framework perfmodel exports to runs DualPipe (DeepSeek's schedule, deepseek-ai/DualPipe, "
                          "is a library to build a trainer on); plan the 1f1b schedule to export")
    if float(getattr(plan, "activation_offload", 0.0) or 0.0) > 0:
        raise ExportError(ACTIVATION_OFFLOAD_REFUSAL[framework])
    if str(getattr(plan, "storage", "mixed")) == "deepseek":
        raise ExportError("no framework perfmodel exports to caches activations as DeepSeek-V3's low-precision storage "
                          "does (FP8 SwiGLU inputs, an E5M6 attention output); plan --storage mixed to export")
    ranks = int(plan.tp) * int(plan.pp) * int(plan.dp) * int(plan.cp)
    if ranks != int(machine.devices):
        raise ExportError(f"the plan's tp x pp x dp x cp is {ranks:,} ranks, the machine has {int(machine.devices):,} "
                          "devices: a launcher starts one rank per device")
    job = TrainJob(spec=spec, system=machine.system.name, devices=int(machine.devices),
                   devices_per_node=int(machine.system.devices_per_launch_host), plan=plan, work=work,
                   model_ref=model_ref,
                   vendor=str(machine.accelerator.vendor))
    return writers[framework](job)


def training_frameworks(spec, machine, plan, work, model_ref: str,
                        frameworks: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """Each training framework's answer (of ``frameworks``, default all) to the plan: None when it
    runs it as written, else why not (the one line ``--export`` would print)."""
    return _answers(frameworks or TRAINING,
                    lambda framework: training_files(framework, spec, machine, plan, work, model_ref))


def serving_frameworks(spec, pools, model_ref: str, frameworks: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """Each serving framework's answer (of ``frameworks``, default all) to a deployment's pools, as
    ``training_frameworks``."""
    return _answers(frameworks or SERVING, lambda framework: serving_files(framework, spec, pools, model_ref))


def _answers(frameworks, write) -> dict[str, str | None]:
    out = {}
    for framework in frameworks:
        try:
            write(framework)
            out[framework] = None
        except ExportError as exc:
            out[framework] = str(exc)
    return out


def serving_files(framework: str, spec, pools, model_ref: str) -> dict[str, str]:
    """The launch files (name -> text) of a serving deployment's pools for ``framework``."""
    from .serving import WRITERS

    check_framework(framework, "serving")
    return WRITERS[framework](spec, pools, model_ref)


def instance_pool(spec, machine, plan, work):
    """One colocated instance (``estimate serve``) as a pool of one."""
    from .serving import PoolSpec

    return PoolSpec.of_instance(spec, machine, plan, work)


def deployment_pools(spec, deployment, machines, demand, mtp_draft_tokens: int = 0, expert_balance: str = "eplb"):
    """The pools of a searched deployment (``plan serve``); decode pools draft ``mtp_draft_tokens``; expert
    parallel pools run EPLB as ``expert_balance`` places the experts."""
    from dataclasses import replace

    from .serving import PoolSpec

    pools = [PoolSpec.of_pool(spec, pool, machines[pool.system], demand, expert_balance) for pool in deployment.pools]
    return [replace(p, mtp_draft_tokens=mtp_draft_tokens if p.role != "prefill" else 0) for p in pools]
