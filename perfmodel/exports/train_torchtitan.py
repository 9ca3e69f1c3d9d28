"""torchtitan launch files of a training plan: ``torchtitan.toml`` and ``torchtitan.sh`` (perfmodel.exports.training's
TrainJob and shared rules; the version and flags vendored in flags/torchtitan.yaml)."""

from __future__ import annotations

import json

from .errors import ExportError
from .scripts import command
from .training import (TrainJob, chunk_slots, cp_comm_type, refuse_broken, refuse_zeropp, script_header,
                       torchrun_command, tp_overlapped)
from .vendored import checked, vendored


# Catalog model -> torchtitan v0.2.2 model name and flavor (torchtitan/models/*/__init__.py).
TITAN_MODELS = {"llama-3.1-8b": ("llama3", "8B"), "llama-3.1-70b": ("llama3", "70B"),
                "llama-3.1-405b": ("llama3", "405B"), "deepseek-v3": ("deepseek_v3", "671B"),
                "gpt-oss-120b": ("gpt_oss", "120b")}


def _toml(sections: dict[str, dict[str, object]]) -> str:
    out = []
    for section, values in sections.items():
        out.append(f"[{section}]")
        out += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        out.append("")
    return "\n".join(out)


def _titan_shard(job: TrainJob) -> int:
    """torchtitan's data_parallel_shard_degree: FSDP shards over dp_shard x cp ranks and replicates over
    dp_replicate (HSDP); every sharded state over the same group, a whole number of cp groups."""
    refuse_zeropp("torchtitan", job)
    p = job.plan
    if not p.zero:
        return 1
    w, g, o, _ = job.groups
    group = {size for size, on in ((w, p.zero >= 3), (g, p.zero >= 2), (o, True)) if on}
    if len(group) > 1:
        raise ExportError(f"torchtitan shards every state over one group (FSDP or HSDP); the plan has groups of "
                          f"{', '.join(map(str, sorted(group)))} ranks; plan train --export torchtitan searches only what it runs")
    size = group.pop()
    if size % int(p.cp):
        raise ExportError(f"torchtitan's FSDP group holds whole context-parallel groups (dp_shard x cp); the plan "
                          f"shards over {size} ranks with cp {p.cp}")
    return size // int(p.cp)


def titan_even_split(effective_layers: int, stages: int) -> list[int]:
    """Effective layers per stage as torchtitan splits them by itself (rule even-split): the same
    share each, the remainder one each to the first stages."""
    q, extra = divmod(effective_layers, stages)
    return [q + (i < extra) for i in range(stages)]


def titan_stage_count(effective_layers: int, pp: int, layers_per_stage: int | None, multi_stage: bool) -> int:
    """The virtual stages torchtitan builds from its flags (rules virtual-stages-divisible,
    stages-per-rank): ceil(effective / layers_per_stage), or 1 (2 for a multi-stage schedule) per rank."""
    if layers_per_stage is None:
        return pp * (2 if multi_stage else 1)
    return -(-effective_layers // layers_per_stage)


def titan_planned_layers(job: TrainJob) -> list[int]:
    """Transformer layers of each virtual stage under the plan (chunk_slots without the embedding,
    loss and MTP slots; torchtitan builds no MTP module)."""
    ends = int(bool(job.plan.ends_as_layers) and job.plan.pp > 1)
    layers = chunk_slots(job)
    layers[0] -= ends
    layers[-1] -= ends * (1 + job.spec.mtp_layers)
    return layers


def titan_pipeline_split(job: TrainJob) -> dict[str, object]:
    """torchtitan's [parallelism] keys that build the plan's virtual stages (titan_planned_layers):
    the embedding and output weights (rule stage-weights: 1 each by default, the plan's
    --ends-as-layers here) and pipeline_parallel_layers_per_stage where torchtitan's own split is the
    plan's; else (an uneven split, whose longer stages torchtitan would put first, or stages its
    layers_per_stage cannot count) each stage's modules as module_fqns_per_model_part."""
    p, spec = job.plan, job.spec
    ends, multi = int(bool(p.ends_as_layers)), int(p.interleave) > 1
    planned = titan_planned_layers(job)
    keys: dict[str, object] = {"pipeline_parallel_first_stage_less_layers": ends,
                               "pipeline_parallel_last_stage_less_layers": ends}
    if multi:
        keys["pipeline_parallel_layers_per_stage"] = -(-(spec.num_layers + 2 * ends) // len(planned))
    if titan_stage_layers({**keys, "pipeline_parallel_degree": int(p.pp)}, spec.num_layers, multi) == planned:
        return keys
    if min(planned[1:-1] or [1]) < 1 or min(planned) < 0:
        return {"module_fqns_per_model_part": [[] for _ in planned]}     # refused by titan_broken_rules
    starts = [sum(planned[:k]) for k in range(len(planned))]
    modules = [[f"layers.{i}" for i in range(start, start + n)] for start, n in zip(starts, planned)]
    modules[0].insert(0, "tok_embeddings")
    modules[-1] += ["norm", "output"]
    return {"module_fqns_per_model_part": modules}


def titan_stage_layers(parallelism: dict[str, object], num_layers: int, multi_stage: bool) -> list[int] | str:
    """Transformer layers of each virtual stage as torchtitan v0.2.2 builds them from these
    [parallelism] keys (pipeline_parallel.py:59-121, 236-344, 456-458), or the name of the rule it
    raises on (virtual-stages-divisible, empty-stage)."""
    pp = int(parallelism.get("pipeline_parallel_degree", 1))
    listed = parallelism.get("module_fqns_per_model_part")
    if listed:
        if not all(listed):
            return "empty-stage"
        return [sum(str(m).startswith("layers.") for m in stage) for stage in listed] if len(listed) % pp == 0 \
            else "virtual-stages-divisible"
    first = int(parallelism.get("pipeline_parallel_first_stage_less_layers", 1))
    last = int(parallelism.get("pipeline_parallel_last_stage_less_layers", 1))
    effective = num_layers + first + last
    per_stage = parallelism.get("pipeline_parallel_layers_per_stage")
    stages = titan_stage_count(effective, pp, int(per_stage) if per_stage else None, multi_stage)
    if stages % pp:
        return "virtual-stages-divisible"
    split = titan_even_split(effective, stages)
    if min(split) < max(1, first, last):
        return "empty-stage"
    split[0] -= first
    split[-1] -= last
    return split


def titan_broken_rules(parallelism: dict[str, object], num_layers: int, planned: list[int]) -> list[str]:
    """The vendored torchtitan rules (flags/torchtitan.yaml ``rules``) these [parallelism] keys break
    for a plan with ``planned`` layers per virtual stage: what torchtitan raises on, and a split
    other than the plan's."""
    pp = int(parallelism.get("pipeline_parallel_degree", 1))
    multi = parallelism.get("pipeline_parallel_schedule", "1F1B") != "1F1B"
    if pp <= 1:
        return []
    built = titan_stage_layers(parallelism, num_layers, multi)
    if isinstance(built, str):
        return [built]
    if (len(built) // pp < 2) if multi else (len(built) // pp != 1):
        return ["stages-per-rank"]
    if built != planned:
        defaults = not ({"pipeline_parallel_first_stage_less_layers", "module_fqns_per_model_part"} & set(parallelism))
        return ["stage-weights" if defaults else "even-split"]
    return []


def torchtitan(job: TrainJob) -> dict[str, str]:
    """``torchtitan.toml`` and ``torchtitan.sh``: the plan as a torchtitan job config."""
    model = TITAN_MODELS.get(job.spec.name)
    if model is None:
        raise ExportError(f"torchtitan {vendored('torchtitan').version} has no flavor for {job.spec.name} (flavors "
                          f"for: {', '.join(TITAN_MODELS)}); use --export megatron")
    p = job.plan
    if p.precision == "fp16":
        raise ExportError("torchtitan trains in bf16 or fp32 (training.mixed_precision_param); the plan uses fp16")
    if tp_overlapped(p):
        raise ExportError("the torchtitan export does not write TP-communication overlap (the plan overlaps TP "
                          "collectives with the GEMMs); use --export megatron or nemo")
    if p.recompute == "modules":
        raise ExportError("torchtitan's activation checkpointing recomputes whole layers or chosen ops, not the "
                          "norms, MLA up-projections and MoE activation of --recompute modules; use --export "
                          "megatron or nemo")
    if p.ep_overlap and p.ep > 1:
        raise ExportError("the torchtitan export does not write the MoE exchange overlap (the plan overlaps the "
                          "expert dispatch and combine with compute); use --export megatron or nemo")
    if str(getattr(p, "dispatcher", "alltoall")) == "hybridep" and p.ep > 1:
        raise ExportError("torchtitan's expert exchange is its standard all-to-all or DeepEP "
                          "(parallelism.expert_parallel_comm_backend), not HybridEP; use --export megatron or nemo")
    if p.cp > 1 and cp_comm_type(p) != "p2p":
        raise ExportError(f"torchtitan's context parallelism is PyTorch's ring attention, not --cp-comm {cp_comm_type(p)}; "
                          "use --export megatron or nemo")
    offloaded = {p.optimizer_place, p.grad_place, p.param_place} - {"hbm"}
    if offloaded and (offloaded != {"ddr"} or "hbm" in (p.optimizer_place, p.grad_place, p.param_place)):
        raise ExportError("torchtitan offloads weights, gradients and optimizer states together to host DDR "
                          "(training.enable_cpu_offload); the plan offloads "
                          + ", ".join(f"{k.split('_')[0]}:{v}" for k, v in (("optimizer_place", p.optimizer_place),
                                      ("grad_place", p.grad_place), ("param_place", p.param_place)) if v != "hbm"))
    pp = int(p.pp)
    local = int(job.work.global_batch // p.dp) if pp > 1 else int(p.micro_batch)
    shard = _titan_shard(job)
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": int(p.dp) // shard, "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "always" if p.zero == 3 else "never",
        "tensor_parallel_degree": int(p.tp), "context_parallel_degree": int(p.cp), "pipeline_parallel_degree": pp}
    if pp > 1:
        parallelism.update({"pipeline_parallel_schedule": "Interleaved1F1B" if p.interleave > 1 else "1F1B",
                            "pipeline_parallel_microbatch_size": int(p.micro_batch), **titan_pipeline_split(job)})
    if job.spec.moe:
        parallelism.update({"expert_parallel_degree": int(p.ep), "expert_tensor_parallel_degree": job.etp})
        if str(getattr(p, "dispatcher", "alltoall")) == "deepep" and p.ep > 1:
            parallelism["expert_parallel_comm_backend"] = "deepep"   # standard: the all-to-all of every copy
    refuse_broken("torchtitan", titan_broken_rules(parallelism, job.spec.num_layers, titan_planned_layers(job)),
                   f"the plan's {pp} x {int(p.interleave)} pipeline stages")
    name, flavor = model
    sections: dict[str, dict[str, object]] = {
        "job": {"description": job.describe()[:200], "dump_folder": "./outputs"},
        "model": {"name": name, "flavor": flavor, "hf_assets_path": "./assets/hf/" + job.spec.name},
        "training": {"local_batch_size": local, "global_batch_size": int(job.work.global_batch),
                     "seq_len": int(job.work.seq_len), "steps": job.steps, "mixed_precision_param": "bfloat16",
                     "enable_cpu_offload": bool(offloaded)},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": str(p.recompute), **({"selective_ac_option": "op"}
                                                               if p.recompute == "selective" else {})}}
    if p.precision == "fp8":
        sections["model"]["converters"] = ["quantize.linear.float8"]
        sections["quantize.linear.float8"] = {"recipe_name": "tensorwise"}
    checked("torchtitan", {f"{s}.{k}": v for s, values in sections.items() for k, v in values.items()}, "keys")
    v = vendored("torchtitan")
    toml = (f"# {job.describe()}\n# Written by perfmodel for {v.citation};\n# every key below exists at that version."
            "\n\n" + _toml(sections))
    run = f"Run from a torchtitan checkout on each of the {job.nodes} node(s), with NODE_RANK and MASTER_ADDR set."
    script = script_header("torchtitan", job, run) + command(
        torchrun_command(job) + ["-m", "torchtitan.train"], {"--job.config_file": "torchtitan.toml"})
    return {"torchtitan.toml": toml, "torchtitan.sh": script}


