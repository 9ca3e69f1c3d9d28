"""Training plans as launch files: Megatron-LM flags and Megatron-Bridge (NeMo 2) recipe overrides here,
torchtitan TOML (``train_torchtitan``) and DeepSpeed JSON (``train_deepspeed``) beside, all on the job and
the rules shared here. Each writer maps the plan's degrees and choices one to one onto
its framework's arguments (checked against the vendored version) or raises ``ExportError`` naming
what the framework cannot express."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from .errors import ExportError
from .scripts import command
from .vendored import checked, vendored


@dataclass(frozen=True)
class TrainJob:
    """What a training export reads: the model, the devices and nodes, the plan and the batch."""

    spec: object            # TransformerSpec
    system: str
    devices: int
    devices_per_node: int
    plan: object            # TrainPlan (scalars)
    work: object            # TrainWorkload
    model_ref: str
    vendor: str = "NVIDIA"  # the accelerator's

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.devices / self.devices_per_node))

    @property
    def gpus_per_node(self) -> int:
        return min(self.devices, self.devices_per_node)

    @property
    def steps(self) -> int:
        """Optimizer steps of the run (tokens / tokens per step), at least 1."""
        return max(1, math.ceil(self.work.tokens / (self.work.global_batch * self.work.seq_len)))

    @property
    def etp(self) -> int:
        return int(self.plan.etp) or int(self.plan.tp)

    @property
    def replicas(self) -> int:
        """Ranks holding the same dense weights, dp x cp: the group ZeRO shards over."""
        return int(self.plan.dp) * int(self.plan.cp)

    @property
    def groups(self) -> tuple[int, int, int, int]:
        """(weights, gradients, optimizer states, hpZ secondary) group sizes in replica ranks (1: replicated)."""
        from perfmodel.sharding import Sharding

        p = self.plan
        s = Sharding.of(int(p.zero), self.replicas, int(getattr(p, "shard", 0) or 0),
                        int(getattr(p, "shard_grads", 0) or 0), int(getattr(p, "shard_weights", 0) or 0),
                        int(getattr(p, "hpz", 0) or 0))
        return int(s.weights), int(s.grads), int(s.optimizer), int(s.secondary)

    def sharding(self) -> str:
        """The sharding beyond flat ZeRO in words (empty when flat)."""
        w, g, o, secondary = self.groups
        zero, r, p = int(self.plan.zero), self.replicas, self.plan
        named = [(what, size) for what, size, on in (("weights", w, zero >= 3), ("gradients", g, zero >= 2),
                                                      ("optimizer states", o, zero >= 1)) if on]
        words = [] if all(size == r for _, size in named) else [
            ", ".join(f"{what} over {size}" for what, size in named) + f" of {r} replicas"]
        words += [f"hpZ over {secondary}"] * (secondary < w)
        words += [q for q in ("qwZ", "qgZ") if getattr(p, q.lower(), False)]
        return "; ".join(words)

    def describe(self) -> str:
        p = self.plan
        sharding = self.sharding()
        return (f"{self.spec.name} on {self.devices:,} devices of {self.system} ({self.nodes} node"
                f"{'s' if self.nodes > 1 else ''} of {self.gpus_per_node}): tp {p.tp}, pp {p.pp} x {p.interleave}, "
                f"dp {p.dp}, cp {p.cp}{f' ({cp_comm_type(p)})' if p.cp > 1 and cp_comm_type(p) != 'p2p' else ''}, "
                f"ep {p.ep}, micro-batch {p.micro_batch}, ZeRO {p.zero}"
                + (f" ({sharding})" if sharding else "") + f", recompute "
                f"{p.recompute}, {p.precision}; {self.work.global_batch:,} x {self.work.seq_len:,} tokens per step")


def tp_overlapped(plan) -> bool:
    """Whether the plan overlaps TP communication with the GEMMs: only with sequence parallelism, as
    the model times it (perfmodel.training) and Megatron-LM asserts ('Tensor parallel
    communication/GEMM overlap can happen only when sequence parallelism is enabled', rule
    tp-overlap-needs-sp; Megatron-Bridge turns it off with a warning, comm_overlap.py:441-448 at v0.6.0)."""
    return bool(plan.tp_overlap and plan.sp and plan.tp > 1)


def refuse_zeropp(framework: str, job: TrainJob) -> None:
    """Frameworks without ZeRO++ refuse its secondary partition and quantized collectives in one line."""
    p = job.plan
    asked = [name for name, on in (("hpZ", job.groups[3] < job.groups[0]), ("qwZ", getattr(p, "qwz", False)),
                                   ("qgZ", getattr(p, "qgz", False))) if on]
    if asked:
        raise ExportError(f"{framework} has no ZeRO++ ({', '.join(asked)} in the plan); use --export deepspeed, or "
                          "plan without --sharding hpz,qwz,qgz")


def _hybrid_groups(framework: str, job: TrainJob) -> tuple[int, str] | None:
    """Megatron's hybrid data parallelism for the plan: (distributed-optimizer instances, outer sharding
    strategy), None when flat; one line for what Megatron cannot express. Stage 1 shards the optimizer
    states inside each instance (a partial distributed optimizer); Megatron-FSDP shards weights and
    gradients inside each instance and the optimizer states either there too (outer no_shard: HSDP) or
    also across instances (outer optim: hybrid FSDP)."""
    refuse_zeropp(framework, job)
    w, g, o, _ = job.groups
    zero, r = int(job.plan.zero), job.replicas
    inner = o if zero == 1 else g
    if zero >= 3 and w != g:   # before the flat case: gradients over every replica does not make weights so
        name = "nemo" if framework == "Megatron-Bridge" else "megatron"
        raise ExportError(f"{framework} shards weights and gradients over the same group (Megatron-FSDP); the plan "
                          f"has weights over {w}, gradients over {g} ranks (plan train --export {name} searches only "
                          "what it runs)")
    if zero == 0 or inner == r:
        return None
    if zero >= 2 and o not in (g, r):
        raise ExportError(f"{framework} shards the optimizer states inside each group or across all {r} replicas "
                          f"(--outer-dp-sharding-strategy no_shard or optim); the plan has {o}")
    return r // inner, "optim" if zero >= 2 and o == r else "no_shard"


# Where the framework's upstream release is NVIDIA's (or CUDA-first), the vendors' own ports run it.
PORTS = {("megatron", "amd"): "ROCm/Megatron-LM", ("nemo", "amd"): "ROCm/Megatron-LM",
         ("megatron", "huawei"): "MindSpeed (Ascend)", ("nemo", "huawei"): "MindSpeed (Ascend)",
         ("deepspeed", "huawei"): "DeepSpeed with torch_npu", ("torchtitan", "huawei"): "torchtitan with torch_npu"}


def script_header(framework: str, job: TrainJob, run: str) -> str:
    v = vendored(framework)
    port = PORTS.get((framework, job.vendor.lower()))
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# {job.describe()}",
        f"# Written by perfmodel for {v.citation};",
        "# every argument below exists at that version (perfmodel/exports/flags).",
        *([f"# On {job.vendor} devices this runs through {port}; check its flags against that port."] if port else []),
        f"# {run}",
        "set -euo pipefail", ""])


def torchrun_command(job: TrainJob) -> list[str]:
    """torchrun's own flags (PyTorch's elastic launcher), one process per device."""
    return ["torchrun", "--nproc-per-node", str(job.gpus_per_node), "--nnodes", str(job.nodes),
            "--node-rank", '"${NODE_RANK:-0}"', "--master-addr", '"${MASTER_ADDR:-localhost}"',
            "--master-port", '"${MASTER_PORT:-29500}"']


def _offload_to_ddr_only(framework: str, job: TrainJob, what: str) -> bool:
    """True when the optimizer states go to host DDR; raises for a tier or a part the framework cannot offload."""
    p = job.plan
    if p.grad_place != "hbm" or p.param_place != "hbm":
        raise ExportError(f"{framework} offloads optimizer states only ({what}); the plan also moves "
                          f"{'gradients' if p.grad_place != 'hbm' else 'weights'} to {p.grad_place if p.grad_place != 'hbm' else p.param_place}: "
                          "use --export deepspeed, or plan with --no-offload")
    if p.optimizer_place not in ("hbm", "ddr"):
        raise ExportError(f"{framework} offloads optimizer states to host DDR only ({what}); the plan puts them on "
                          f"{p.optimizer_place}")
    return p.optimizer_place == "ddr"


def _architecture_supported(framework: str, spec) -> None:
    if spec.sliding_window or spec.attention_sinks:
        raise ExportError(f"the {framework} export does not write sliding-window attention or attention sinks "
                          f"({spec.name}); start from the framework's own recipe for this model")


# --- Megatron-LM ---------------------------------------------------------------------------------

def _megatron_model(spec, seq_len: int) -> dict[str, object]:
    """Megatron-LM's architecture flags for ``spec`` (GPT model, pretrain_gpt.py)."""
    kv = spec.num_kv_heads or spec.num_heads
    items: dict[str, object] = {
        "--num-layers": spec.num_layers, "--hidden-size": spec.hidden_size, "--ffn-hidden-size": spec.ffn_hidden_size,
        "--num-attention-heads": spec.num_heads, "--seq-length": seq_len,
        "--max-position-embeddings": max(spec.max_seq_len, seq_len),
        "--normalization": "RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm",
        "--position-embedding-type": "rope" if spec.position_embedding == "rope" else "learned_absolute"}
    if kv != spec.num_heads:
        items.update({"--group-query-attention": True, "--num-query-groups": kv})
    if spec.head_dim and not spec.mla:
        items["--kv-channels"] = spec.head_dim
    if spec.mlp == "gated":
        items["--swiglu"] = True
    if not spec.tied_embeddings:
        items["--untie-embeddings-and-output-weights"] = True
    if not spec.linear_bias:
        items["--disable-bias-linear"] = True
    if spec.qkv_bias:
        items["--add-qkv-bias"] = True
    if spec.qk_norm:
        items["--qk-layernorm"] = True
    if spec.mla:
        m = spec.mla
        items.update({"--multi-latent-attention": True, "--kv-lora-rank": m.kv_lora_rank,
                      "--qk-head-dim": m.qk_nope_head_dim, "--qk-pos-emb-head-dim": m.qk_rope_head_dim,
                      "--v-head-dim": m.v_head_dim})
        if m.q_lora_rank:
            items["--q-lora-rank"] = m.q_lora_rank
    if spec.moe:
        moe = spec.moe
        items.update({"--num-experts": moe.num_experts, "--moe-router-topk": moe.top_k,
                      "--moe-ffn-hidden-size": moe.expert_ffn_hidden_size})
        if moe.num_shared_experts:
            items["--moe-shared-expert-intermediate-size"] = moe.num_shared_experts * moe.expert_ffn_hidden_size
        if moe.first_dense_layers:
            dense = moe.first_dense_layers
            items["--moe-layer-freq"] = f"([0]*{dense}+[1]*{spec.num_layers - dense})"
    if spec.mtp_layers:
        items["--mtp-num-layers"] = spec.mtp_layers
    return items


def chunk_slots(job: TrainJob) -> list[int]:
    """Pipeline slots of each virtual stage (pp x interleave of them) in model order, as the plan
    splits them: stage i holds perfmodel.memory.stage_layers' share (the shorter stages first), and
    its ``interleave`` chunks split that share evenly, the longer chunks last. Chunk k runs on rank
    k mod pp, as Megatron-Core and torchtitan place looped virtual stages. A slot is a layer, or with
    --ends-as-layers also the embedding (first chunk), the loss and each MTP depth (last chunk)."""
    from perfmodel.memory import stage_layers

    p, spec = job.plan, job.spec
    pp, v = int(p.pp), int(p.interleave)
    ends = bool(p.ends_as_layers) and pp > 1
    q, r = (int(x) for x in stage_layers(spec.num_layers, pp, ends, spec.mtp_layers if ends else 0))
    per_rank = [q + (i >= pp - r) for i in range(pp)]
    return [per_rank[k % pp] // v + (k // pp >= v - per_rank[k % pp] % v) for k in range(pp * v)]


def _split_even(job: TrainJob) -> bool:
    """Whether every virtual stage holds the same number of slots (the split Megatron's and
    torchtitan's flags express without a per-stage list)."""
    return len(set(chunk_slots(job))) == 1


def pipeline_layout(job: TrainJob) -> str | None:
    """Megatron-Core's --pipeline-model-parallel-layout for a plan whose split the flags cannot say:
    virtual stages in model order, 'E' the embedding, 't' a layer, 'm' an MTP depth, 'L' the loss,
    as Megatron-Bridge lays out DeepSeek-V3 ('Et|(tt|)*30mL'). Written where the split counts MTP
    depths as slots, or is uneven: without a layout Megatron-LM needs the layers (plus the
    account-for slots) divisible by pp and each rank's by the interleave (rules pipeline-divisible,
    virtual-divisible: 'num_layers=126 should be divisible by pipeline_model_parallel_size=8' for
    Llama 3.1 405B). None when the plain flags say it. An ExportError where a stage would be empty."""
    p, spec = job.plan, job.spec
    ends = bool(p.ends_as_layers) and p.pp > 1
    if p.pp <= 1 or (_split_even(job) and not (ends and spec.mtp_layers)):
        return None
    mtp = spec.mtp_layers if ends else 0
    chunks = chunk_slots(job)
    layers = list(chunks)
    layers[0] -= ends
    layers[-1] -= (1 + mtp) * ends
    if min(layers) < 0 or (len(chunks) > 1 and min(layers[1:-1] or [1]) < 1):
        from .vendored import rule

        raise ExportError(rule("megatron", "layout").refusal(
            f"{spec.num_layers} layers over {len(chunks)} virtual stages", "plan fewer pipeline stages"))
    stages = ["t" * n for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] += "m" * mtp + "L"
    return "|".join(stages)


def cp_comm_type(plan) -> str:
    """The plan's context-parallel communication as Megatron-Core names it (cp_comm_type)."""
    return str(getattr(plan, "cp_comm", "p2p"))


def _megatron_parallel(job: TrainJob) -> dict[str, object]:
    p = job.plan
    items: dict[str, object] = {"--tensor-model-parallel-size": int(p.tp), "--pipeline-model-parallel-size": int(p.pp),
                                "--context-parallel-size": int(p.cp)}
    layout = pipeline_layout(job)
    if layout:
        items["--pipeline-model-parallel-layout"] = layout
    elif p.interleave > 1:
        items["--num-virtual-stages-per-pipeline-rank"] = int(p.interleave)
    if p.ends_as_layers and p.pp > 1 and not layout:
        items.update({"--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True})
    if p.sp and p.tp > 1:
        items["--sequence-parallel"] = True
    if p.cp > 1 and cp_comm_type(p) != "p2p":
        items["--cp-comm-type"] = [cp_comm_type(p)]     # one type for every layer
    if job.spec.moe:
        items.update({"--expert-model-parallel-size": int(p.ep), "--expert-tensor-parallel-size": job.etp})
    items.update({"--micro-batch-size": int(p.micro_batch), "--global-batch-size": int(job.work.global_batch),
                  "--train-iters": job.steps})
    return items


def _megatron_memory(job: TrainJob, framework: str = "Megatron-LM") -> dict[str, object]:
    """ZeRO stage, recompute, overlap and offload as Megatron-LM flags."""
    p = job.plan
    items: dict[str, object] = {}
    hybrid = _hybrid_groups(framework, job)
    if p.zero == 1:
        items["--use-distributed-optimizer"] = True
    elif p.zero >= 2:
        # Megatron-FSDP saves only its own checkpoint format (rule fsdp-ckpt-format).
        items.update({"--use-megatron-fsdp": True, "--data-parallel-sharding-strategy":
                      "optim_grads" if p.zero == 2 else "optim_grads_params", "--ckpt-format": "fsdp_dtensor"})
    if hybrid:
        items["--num-distributed-optimizer-instances"] = hybrid[0]
        if p.zero >= 2:
            items["--outer-dp-sharding-strategy"] = hybrid[1]
    if p.recompute in ("selective", "modules"):
        items["--recompute-granularity"] = "selective"
        if p.recompute == "modules":
            items["--recompute-modules"] = recompute_modules(job.spec)
            if job.spec.moe:
                items["--moe-grouped-gemm"] = True        # moe_act recomputes inside the grouped GEMM path
    elif p.recompute == "full":
        items.update({"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1})
    if p.overlap_dp and p.dp > 1:
        items["--overlap-grad-reduce"] = True
        if p.zero >= 1:
            items["--overlap-param-gather"] = True
    if tp_overlapped(p):
        items.update({"--tp-comm-overlap": True, "--tp-comm-overlap-cfg": "$TP_COMM_OVERLAP_CFG"})
    if _ep_overlapped(framework, job):
        items["--overlap-moe-expert-parallel-comm"] = True
    if job.spec.moe and p.ep > 1:
        items.update(dispatcher_flags(p, "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend"))
    if _offload_to_ddr_only(framework, job, "--optimizer-cpu-offload"):
        if p.zero < 1:
            raise ExportError("Megatron-LM offloads optimizer states with the distributed optimizer only; the plan "
                              "has ZeRO 0")
        # The hybrid device optimizer runs on the precision-aware optimizer's code path (rule offload-precision-aware).
        items.update({"--optimizer-cpu-offload": True, "--optimizer-offload-fraction": 1.0,
                      "--use-precision-aware-optimizer": True})
    # The model keeps 16-bit gradients (memory.WEIGHT_BYTES, GRAD_BYTES), as the NeMo performance
    # recipes run them (grad_reduce_in_fp32 False); Megatron-LM would otherwise accumulate and reduce
    # bf16 models' gradients in fp32 (arguments.py: 'bfloat16 requires gradient accumulation and
    # all-reduce to be done in fp32'), 2 bytes per parameter more than planned.
    items.update({"--bf16": True, "--grad-reduce-in-bf16": True} if p.precision in ("bf16", "fp8")
                 else {"--fp16": True})
    if p.precision == "fp8":
        items.update({"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise"})
    items["--attention-backend"] = "flash" if p.flash else "unfused"
    return items


# Megatron-Core's token dispatcher for expert parallelism: the all-to-all of every token-expert copy
# that training_comm prices (Topology.moe_all_to_all without node deduplication), written whenever
# experts are spread over ranks; TransformerConfig's default, allgather, gathers every rank's tokens
# to every rank instead (core_v0.19.0 transformer_config.py moe_token_dispatcher_type, token_dispatcher.py).
ALLTOALL_DISPATCHER = "alltoall"


def dispatcher_flags(plan, type_key: str, backend_key: str) -> dict[str, str]:
    """The plan's MoE token dispatcher as Megatron-Core's two settings (plan.Dispatcher): alltoall, or
    the flex dispatcher with its backend (core_v0.19.0 moe_token_dispatcher_type 'flex' with
    moe_flex_dispatcher_backend 'deepep' or 'hybridep')."""
    name = str(getattr(plan, "dispatcher", ALLTOALL_DISPATCHER))
    return {type_key: ALLTOALL_DISPATCHER} if name == ALLTOALL_DISPATCHER else {type_key: "flex", backend_key: name}


def recompute_modules(spec) -> list[str]:
    """Megatron-Core's --recompute-modules for Recompute.MODULES: the attention core, the norms,
    and where the model has them MLA's up-projections and the MoE activation (TransformerConfig
    allows mla_up_proj only with MLA and moe_act only with grouped GEMMs, core_v0.19.0)."""
    return ["core_attn", "layernorm"] + (["mla_up_proj"] if spec.mla else []) + (["moe_act"] if spec.moe else [])


def _ep_overlapped(framework: str, job: TrainJob) -> bool:
    """Whether the plan overlaps the MoE exchange; an ExportError where Megatron-Core's own check
    (TransformerConfig.__post_init__, core_v0.15.0 to core_v0.19.0) would refuse it."""
    p = job.plan
    if not (p.ep_overlap and job.spec.moe and p.ep > 1):
        return False
    if p.recompute == "full":
        raise ExportError(f"{framework} overlaps the expert exchange only without full recomputation "
                          "(overlap_moe_expert_parallel_comm); the plan recomputes fully")
    if p.pp > 1 and p.interleave < 2:
        raise ExportError(f"{framework} overlaps the expert exchange with more than one pipeline stage only with a "
                          "virtual pipeline (overlap_moe_expert_parallel_comm); the plan has pp "
                          f"{p.pp} without interleaving")
    return True


def _environment_of(lines: str) -> dict[str, str | None]:
    """The variables a script's ``export NAME=value`` / ``unset NAME`` lines set (None: unset)."""
    out: dict[str, str | None] = {}
    for line in lines.splitlines():
        words = line.split()
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            out[name] = value
        elif words[:1] == ["unset"]:
            out[words[1]] = None
    return out


def refuse_broken(framework: str, broken: list[str], what: str) -> None:
    """One line naming the first broken rule in the framework's words, with its source."""
    from .vendored import rule

    if broken:
        raise ExportError(rule(framework, broken[0]).refusal(what))


def _unset_connections(framework: str) -> str:
    """Shell lines leaving CUDA_DEVICE_MAX_CONNECTIONS unset, as Megatron-FSDP asserts (rule fsdp-max-connections)."""
    from .vendored import rule

    why = rule(framework, "fsdp-max-connections")
    return f"# {why.reason} ({why.source})\nunset CUDA_DEVICE_MAX_CONNECTIONS\n"


def megatron_environment(job: TrainJob, items: dict[str, object]) -> str:
    """The environment validate_args checks, as shell lines: CUDA_DEVICE_MAX_CONNECTIONS=1 with
    tensor or context parallelism (rule tp-cp-max-connections: asserted before Blackwell, and
    harmless after), unset under Megatron-FSDP (rule fsdp-max-connections, asserted on every
    device); with the MoE exchange overlap Megatron only warns and leaves the choice open."""
    from .vendored import rule

    p = job.plan
    if "--use-megatron-fsdp" in items:
        return _unset_connections("megatron")
    if (p.tp > 1 or p.cp > 1) and "--overlap-moe-expert-parallel-comm" not in items:
        why = rule("megatron", "tp-cp-max-connections")
        return f"# {why.reason} ({why.source.split(' (')[0]})\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
    return ""


def megatron_broken_rules(items: dict[str, object], environment: dict[str, str | None], num_layers: int,
                          blackwell: bool = False) -> list[str]:
    """The vendored Megatron-LM rules (flags/megatron-lm.yaml ``rules``) that a launch with these flags
    and environment (name -> value, None: unset) breaks, as validate_args and the model builders at
    core_v0.19.0 check them; empty when Megatron accepts it."""
    broken = []
    connections = environment.get("CUDA_DEVICE_MAX_CONNECTIONS")
    fsdp = "--use-megatron-fsdp" in items
    if "--save" in items and not int(items.get("--save-interval") or 0) > 0:
        broken.append("save-interval")
    if fsdp and connections == "1":
        broken.append("fsdp-max-connections")
    if fsdp and items.get("--ckpt-format") != "fsdp_dtensor":
        broken.append("fsdp-ckpt-format")
    parallel = int(items.get("--tensor-model-parallel-size", 1)) > 1 or int(items.get("--context-parallel-size", 1)) > 1
    if parallel and not (blackwell or fsdp or "--overlap-moe-expert-parallel-comm" in items) and connections != "1":
        broken.append("tp-cp-max-connections")
    if "--tp-comm-overlap" in items and "--sequence-parallel" not in items:
        broken.append("tp-overlap-needs-sp")
    if "--optimizer-cpu-offload" in items and "--use-precision-aware-optimizer" not in items:
        broken.append("offload-precision-aware")
    pp = int(items.get("--pipeline-model-parallel-size", 1))
    layout = items.get("--pipeline-model-parallel-layout")
    if layout:
        stages = str(layout).split("|")
        flat = "".join(stages)
        if (len(stages) % pp or flat[:1] != "E" or flat[-1:] != "L" or flat.count("E") != 1 or flat.count("L") != 1
                or flat.count("t") != num_layers):
            broken.append("layout")
    elif pp > 1:
        slots = num_layers + ("--account-for-embedding-in-pipeline-split" in items) + \
            ("--account-for-loss-in-pipeline-split" in items)
        if slots % pp:
            broken.append("pipeline-divisible")
        elif slots // pp % int(items.get("--num-virtual-stages-per-pipeline-rank", 1)):
            broken.append("virtual-divisible")
    return broken


# Steps between checkpoints: Megatron-Bridge's pretraining recipes' interval (v0.6.0,
# src/megatron/bridge/recipes/common.py:438, cfg.checkpoint.save_interval = 500), or the run's end if sooner.
SAVE_INTERVAL = 500


def megatron(job: TrainJob) -> dict[str, str]:
    """``megatron.sh``: torchrun + pretrain_gpt.py with the plan as Megatron-LM flags."""
    _architecture_supported("Megatron-LM", job.spec)
    items = {**_megatron_model(job.spec, job.work.seq_len), **_megatron_parallel(job), **_megatron_memory(job),
             "--tokenizer-type": "HuggingFaceTokenizer", "--tokenizer-model": "$TOKENIZER",
             "--data-path": "$DATA_PATH", "--save": "$CHECKPOINT_DIR",
             # validate_args asserts a positive --save-interval with --save (rule save-interval).
             "--save-interval": min(job.steps, SAVE_INTERVAL)}
    checked("megatron", items)
    run = (f"Run from a Megatron-LM checkout on each of the {job.nodes} node(s), with NODE_RANK, MASTER_ADDR, "
           "TOKENIZER (a Hugging Face id or path), DATA_PATH and CHECKPOINT_DIR set.")
    script = script_header("megatron", job, run) + ': "${TOKENIZER:?}" "${DATA_PATH:?}" "${CHECKPOINT_DIR:?}"\n'
    environment = megatron_environment(job, items)
    refuse_broken("megatron", megatron_broken_rules(items, _environment_of(environment), job.spec.num_layers),
                   "this launch")
    files = {}
    if "--tp-comm-overlap-cfg" in items:
        checked("megatron", {f"{layer}.{k}": v for layer, cfg in TP_COMM_OVERLAP.items() for k, v in cfg.items()},
                "keys", "userbuffers")
        files[TP_COMM_OVERLAP_FILE] = TP_COMM_OVERLAP_HEADER + "".join(
            f"{layer}: {{{', '.join(f'{k}: {str(v).lower()}' for k, v in cfg.items())}}}\n"
            for layer, cfg in TP_COMM_OVERLAP.items())
        script += f'TP_COMM_OVERLAP_CFG="$(cd "$(dirname "$0")" && pwd)/{TP_COMM_OVERLAP_FILE}"\n'
    script += environment + command(torchrun_command(job) + ["pretrain_gpt.py"], items)
    return {"megatron.sh": script, **files}


# Transformer Engine's userbuffers as perfmodel times TP-communication overlap (training_comm._overlap;
# constant tp-overlap-bulk-sms). Megatron-LM reads it with --tp-comm-overlap-cfg
# (megatron/training/initialize.py, _initialize_tp_communicators) and passes it to
# transformer_engine.pytorch.initialize_ub; the layers it leaves out keep Transformer Engine's
# defaults (v2.9 module/base.py: ring exchange on the copy engines for the all-gathers).
TP_COMM_OVERLAP_FILE = "tp-comm-overlap.yaml"
TP_COMM_OVERLAP_HEADER = """\
# Transformer Engine userbuffers for --tp-comm-overlap, as perfmodel timed the plan: the forward
# reduce-scatters ring-exchange on the copy engines, keeping every SM but one for the GEMM (as
# Megatron-Bridge v0.4.2's fp8 and B200 configurations, training/comm_overlap.py); the backward's
# bulk transfers hold 16 SMs only while they run (set_sm_margin false, as every tuned
# configuration there). Transformer Engine's default would run these six GEMMs on 16 fewer SMs
# throughout (set_sm_margin true), about 7% slower on Llama 3.1 405B's linear layers.
"""
_BULK = {"method": "bulk", "num_sm": 16, "cga_size": 2, "set_sm_margin": False}
TP_COMM_OVERLAP = {"proj_fprop": {"method": "ring_exchange", "num_sm": 1, "set_sm_margin": True},
                   "fc2_fprop": {"method": "ring_exchange", "num_sm": 1, "set_sm_margin": True},
                   "qkv_dgrad": _BULK, "qkv_wgrad": _BULK, "fc1_dgrad": _BULK, "fc1_wgrad": _BULK}


# --- Megatron-Bridge (NeMo 2) --------------------------------------------------------------------

# Catalog model -> the Megatron-Bridge v0.6.0 recipe that builds its architecture (scripts/training/run_recipe.py
# --recipe; src/megatron/bridge/recipes/). The plan's degrees, batch and precision override the recipe's.
BRIDGE_RECIPES = {
    "llama-3.1-8b": "llama31_8b_pretrain_2gpu_h100_bf16_config",
    "llama-3.1-70b": "llama31_70b_pretrain_32gpu_h100_bf16_config",
    "llama-3.1-405b": "llama31_405b_pretrain_256gpu_h100_bf16_config",
    "qwen2.5-72b": "qwen25_72b_pretrain_32gpu_h100_bf16_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config",
    "deepseek-v3": "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config",
    "gpt-oss-120b": "gpt_oss_120b_pretrain_64gpu_h100_bf16_config",
}
NULL = object()   # a recipe override that sets the field to None (written as Hydra's null)
BRIDGE_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp8": "bf16_with_fp8_current_scaling_mixed"}


def nemo(job: TrainJob) -> dict[str, str]:
    """``nemo.sh``: Megatron-Bridge's run_recipe.py with the model's recipe and the plan as overrides."""
    recipe = BRIDGE_RECIPES.get(job.spec.name)
    if recipe is None:
        raise ExportError(f"Megatron-Bridge {vendored('nemo').version} has no recipe for {job.spec.name} (recipes for: "
                          f"{', '.join(BRIDGE_RECIPES)}); use --export megatron")
    p = job.plan
    ep_overlap, layout = _ep_overlapped("Megatron-Bridge", job), pipeline_layout(job)
    items: dict[str, object] = {
        "model.tensor_model_parallel_size": int(p.tp), "model.pipeline_model_parallel_size": int(p.pp),
        "model.virtual_pipeline_model_parallel_size": int(p.interleave) if p.interleave > 1 else NULL,
        "model.context_parallel_size": int(p.cp), "model.sequence_parallel": bool(p.sp and p.tp > 1),
        "model.cp_comm_type": cp_comm_type(p) if p.cp > 1 and cp_comm_type(p) != "p2p" else None,
        "model.seq_length": int(job.work.seq_len), "dataset.seq_length": int(job.work.seq_len),
        "train.micro_batch_size": int(p.micro_batch), "train.global_batch_size": int(job.work.global_batch),
        "train.train_iters": job.steps, "mixed_precision": BRIDGE_PRECISION[p.precision],
        "optimizer.use_distributed_optimizer": p.zero >= 1, "ddp.use_distributed_optimizer": p.zero >= 1,
        "ddp.overlap_grad_reduce": bool(p.overlap_dp and p.dp > 1),
        "ddp.overlap_param_gather": bool(p.overlap_dp and p.dp > 1 and p.zero >= 1),
        "model.tp_comm_overlap": tp_overlapped(p),
        # The exchange the cost model prices (ALLTOALL_DISPATCHER); its overlap, with no shared-expert overlap.
        "model.overlap_moe_expert_parallel_comm": True if ep_overlap else None,
        **(dispatcher_flags(p, "model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend")
           if job.spec.moe and p.ep > 1 else {"model.moe_token_dispatcher_type": None}),
        "model.moe_shared_expert_overlap": False if ep_overlap else None,
        # Every pipeline key is written, so the recipe's own split cannot stay (rule recipe-pipeline).
        "model.pipeline_model_parallel_layout": layout or NULL,
        "model.account_for_embedding_in_pipeline_split": bool(p.ends_as_layers and p.pp > 1 and not layout),
        "model.account_for_loss_in_pipeline_split": bool(p.ends_as_layers and p.pp > 1 and not layout),
        "model.recompute_granularity": {"none": None, "modules": "selective"}.get(p.recompute, p.recompute),
        "model.recompute_modules": recompute_modules(job.spec) if p.recompute == "modules" else None}
    if p.recompute == "full":
        items.update({"model.recompute_method": "uniform", "model.recompute_num_layers": 1})
    if p.zero >= 2:
        items.update({"ddp.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy":
                      "optim_grads" if p.zero == 2 else "optim_grads_params", "checkpoint.ckpt_format": "fsdp_dtensor"})
    hybrid = _hybrid_groups("Megatron-Bridge", job)
    if hybrid:
        items["ddp.num_distributed_optimizer_instances"] = hybrid[0]
        if p.zero >= 2:
            items["ddp.outer_dp_sharding_strategy"] = hybrid[1]
    if job.spec.moe:
        items.update({"model.expert_model_parallel_size": int(p.ep), "model.expert_tensor_parallel_size": job.etp})
    if _offload_to_ddr_only("Megatron-Bridge", job, "optimizer.optimizer_cpu_offload"):
        items.update({"optimizer.optimizer_cpu_offload": True, "optimizer.optimizer_offload_fraction": 1.0,
                      "optimizer.use_precision_aware_optimizer": True})
    overrides = {k: v for k, v in items.items() if v is not None}
    checked("nemo", {k: v for k, v in overrides.items() if v is not NULL}, "keys")
    unknown_nulls = [k for k, v in overrides.items() if v is NULL and k not in vendored("nemo").keys]
    assert not unknown_nulls, f"nemo export: {unknown_nulls} are not keys of {vendored('nemo').citation}"
    environment = _unset_connections("nemo") if p.zero >= 2 else ""
    refuse_broken("nemo", bridge_broken_rules(overrides, _environment_of(environment)), "this launch")
    run = (f"Run from a Megatron-Bridge checkout on each of the {job.nodes} node(s), with NODE_RANK and MASTER_ADDR "
           "set; --dataset mock until you point the recipe at your data.")
    words = torchrun_command(job) + ["scripts/training/run_recipe.py", "--recipe", recipe, "--mode", "pretrain",
                              "--dataset", "mock"]
    lines = [" ".join(words)] + [shlex.quote(f"{k}={_override(v)}") for k, v in overrides.items()]
    return {"nemo.sh": script_header("nemo", job, run) + environment + " \\\n  ".join(lines) + "\n"}


def bridge_broken_rules(overrides: dict[str, object], environment: dict[str, str | None]) -> list[str]:
    """The vendored Megatron-Bridge rules (flags/megatron-bridge.yaml ``rules``) that these recipe
    overrides and environment break, as ConfigContainer.validate and Megatron-Core check them at v0.6.0."""
    broken = []
    if overrides.get("ddp.use_megatron_fsdp"):
        if overrides.get("checkpoint.ckpt_format") != "fsdp_dtensor":
            broken.append("fsdp-ckpt-format")
        if environment.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
            broken.append("fsdp-max-connections")
    pipeline = ("model.pipeline_model_parallel_layout", "model.virtual_pipeline_model_parallel_size",
                "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split")
    if not all(key in overrides for key in pipeline):
        broken.append("recipe-pipeline")
    layout = overrides.get("model.pipeline_model_parallel_layout")
    if isinstance(layout, str):
        vpp = overrides.get("model.virtual_pipeline_model_parallel_size")
        stages = len(layout.split("|")) // int(overrides.get("model.pipeline_model_parallel_size", 1))
        if any(overrides.get(key) is True for key in pipeline[2:]) or (isinstance(vpp, int) and vpp != stages):
            broken.append("layout-conflicts")
    optimizer = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("optimizer.")}
    if optimizer.get("optimizer_cpu_offload") and not optimizer.get("use_precision_aware_optimizer"):
        broken.append("offload-precision-aware")
    return broken


def _override(value) -> str:
    if value is NULL:                             # Hydra's null: the field set to None
        return "null"
    if isinstance(value, (list, tuple)):          # Hydra's list syntax: [a,b]
        return "[" + ",".join(_override(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)
