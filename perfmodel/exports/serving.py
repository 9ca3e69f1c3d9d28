"""Serving deployments as launch files: vLLM and SGLang server commands, TensorRT-LLM's trtllm-serve
with its YAML, and an NVIDIA Dynamo DynamoGraphDeployment, one set per pool (a colocated pool, or a
prefill pool and a decode pool). Each pool's parallel layout and formats map one to one onto the
framework's arguments (checked against the vendored version), or ``ExportError`` says what the
framework cannot run. ``layout_problem`` and ``format_problem`` are the same rules as predicates, so
that ``plan serve --export`` searches only deployments the framework runs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .errors import ExportError
from .scripts import command, flatten
from .vendored import checked, rule, vendored

# Catalog models -> their Hugging Face repositories (the checkpoint a server loads by default).
HF_REPOS = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct", "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B", "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-oss-120b": "openai/gpt-oss-120b",
}


@dataclass(frozen=True)
class PoolSpec:
    """One pool as a serving framework sees it: the instance's layout and formats, and how many."""

    role: str                 # colocated, prefill or decode
    system: str
    instances: int
    devices_per_instance: int
    devices_per_node: int
    tp: int
    pp: int
    ep: int
    dp_attention: int
    batch: int
    weight: str
    activation: str
    kv: str
    kv_place: str
    max_len: int              # prompt + output tokens a sequence may reach (p90s)
    mtp_draft_tokens: int = 0
    vendor: str = "NVIDIA"    # the accelerator's
    weight_place: str = "hbm"
    redundant_experts: int = 0   # EPLB's copies of hot experts, as the prediction places them (perfmodel.eplb)
    # Colocated: tokens per iteration and attention rank of mixed steps; 0: prompts in batches of their own;
    # None: not part of the prediction (an unloaded estimate), the engine's default.
    chunk_tokens: int | None = 0

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.devices_per_instance / self.devices_per_node))

    @staticmethod
    def of_instance(spec, machine, plan, work) -> "PoolSpec":
        return PoolSpec(role="colocated", system=machine.system.name, instances=1,
                        devices_per_instance=int(plan.tp * plan.pp * plan.dp_attention),
                        devices_per_node=int(machine.system.devices_per_launch_host), tp=int(plan.tp), pp=int(plan.pp),
                        ep=int(plan.ep), dp_attention=int(plan.dp_attention), batch=int(plan.batch),
                        weight=str(plan.weight_precision), activation=str(plan.activation_precision),
                        kv=str(plan.kv_precision), kv_place=str(plan.kv_place),
                        max_len=int(work.input_len + work.output_len), mtp_draft_tokens=int(plan.mtp_draft_tokens),
                        vendor=str(machine.accelerator.vendor), weight_place=str(plan.weight_place),
                        redundant_experts=redundant_experts_of(spec, machine, int(plan.ep), str(plan.expert_balance)),
                        chunk_tokens=int(plan.chunk_tokens) or None)

    @staticmethod
    def of_pool(spec, pool, machine, demand, expert_balance: str) -> "PoolSpec":
        c = pool.config
        return PoolSpec(role=pool.role, system=pool.system, instances=int(pool.instances),
                        devices_per_instance=int(pool.devices_per_instance),
                        devices_per_node=int(machine.system.devices_per_launch_host), tp=int(c["tp"]), pp=int(c["pp"]),
                        ep=int(c["ep"]), dp_attention=int(c["dp_attention"]), batch=int(c["batch"]),
                        weight=str(c["weight_precision"]), activation=str(c["activation_precision"]),
                        kv=str(c["kv_precision"]), kv_place=str(c.get("kv_place", "hbm")),
                        max_len=int(math.ceil(demand.input_len.p90 + demand.output_len.p90)),
                        vendor=str(machine.accelerator.vendor), weight_place=str(c.get("weight_place", "hbm")),
                        redundant_experts=redundant_experts_of(spec, machine, int(c["ep"]), expert_balance),
                        chunk_tokens=int(c.get("chunk_tokens", 0)))

    def describe(self) -> str:
        return (f"{self.role} pool: {self.instances} instance{'s' if self.instances > 1 else ''} of "
                f"{self.devices_per_instance} device{'s' if self.devices_per_instance > 1 else ''} of {self.system} "
                f"(tp {self.tp}, pp {self.pp}, dp-attention "
                f"{self.dp_attention}, ep {self.ep}), batch {self.batch}, weights {self.weight} {self.activation}, "
                f"kv {self.kv}")


def redundant_experts_of(spec, machine, ep: int, balance: str) -> int:
    """The redundant experts an instance runs with, as its prediction counts them: with ``--expert-balance
    eplb`` and expert parallelism, EPLB's ceil(E x (1 + share) / ep) slots per device filled with copies of
    hot experts (perfmodel.eplb.redundant_experts, ``moe-redundant-expert-share``); none otherwise."""
    if not spec.moe or ep <= 1 or balance != "eplb":
        return 0
    from perfmodel.eplb import redundant_experts

    return redundant_experts(spec.moe.num_experts, ep, machine.constants.moe_redundant_expert_share)


# --- what each framework runs --------------------------------------------------------------------

ENGINE = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "dynamo": "vllm"}   # Dynamo: vLLM workers


def layout_problem(framework: str, tp: int, pp: int, dp_attention: int, ep: int, per_host: int = 0) -> str | None:
    """Why ``framework`` cannot run this instance layout (on launch hosts of ``per_host`` devices, when
    given), or None."""
    engine = ENGINE[framework]
    if framework == "dynamo" and per_host:
        problem = dynamo_multinode_problem(tp * pp, dp_attention, tp * pp * dp_attention, per_host)
        if problem:
            return problem
    if engine == "vllm" and ep > 1 and ep != tp * dp_attention:
        return (f"vLLM's expert parallelism spans every tensor x data parallel rank (ep {tp * dp_attention}); "
                f"the plan has ep {ep}")
    if engine == "trtllm" and dp_attention > 1 and tp > 1:
        return "TensorRT-LLM's attention data parallelism runs attention on one device per rank (tp 1)"
    return None


# (weight, activation) -> the quantization a server applies, for weights other than the checkpoint's own.
# None: the framework has no such mode. "checkpoint": a pre-quantized checkpoint carries it.
QUANTIZATION = {
    "vllm": {("fp8", "a8"): "fp8", ("int8", "a8"): "compressed-tensors", ("int8", "a16"): "int8_per_channel_weight_only",
             ("int4", "a16"): "awq", ("fp4", "a4"): "modelopt_fp4"},
    "sglang": {("fp8", "a8"): "fp8", ("int8", "a8"): "w8a8_int8", ("int4", "a16"): "awq", ("fp4", "a4"): "modelopt_fp4"},
    "trtllm": {("fp8", "a8"): "checkpoint", ("int4", "a16"): "checkpoint", ("fp4", "a4"): "checkpoint"},
}
PRE_QUANTIZED = {"compressed-tensors", "awq", "modelopt_fp4", "w8a8_int8", "checkpoint"}
KV_DTYPES = {"vllm": {"bf16": "auto", "fp8": "fp8"}, "sglang": {"bf16": "auto", "fp8": "fp8_e4m3"},
             "trtllm": {"bf16": "auto", "fp8": "fp8"}}


def format_problem(framework: str, weight: str, activation: str, kv: str, native: str) -> str | None:
    """Why ``framework`` cannot serve these formats, or None."""
    engine = ENGINE[framework]
    if kv not in KV_DTYPES[engine]:
        return f"{vendored(engine).framework} has no {kv} KV cache"
    if weight != native and QUANTIZATION[engine].get((weight, activation)) is None:
        return f"{vendored(engine).framework} has no {weight} weights with {activation} activations"
    return None


NVIDIA_ONLY = ("trtllm", "dynamo")   # TensorRT-LLM kernels; Dynamo's deployment asks for nvidia.com/gpu


def pool_problem(framework: str, pool: PoolSpec, native: str) -> str | None:
    if framework in NVIDIA_ONLY and pool.vendor.lower() != "nvidia":
        return f"{vendored(framework).framework} runs on NVIDIA GPUs; this pool runs on {pool.vendor} {pool.system}"
    if pool.kv_place != "hbm":
        return (f"{vendored(ENGINE[framework]).framework} serves from a KV cache in HBM; the plan reads it from "
                f"{pool.kv_place} every step (re-plan with --no-kv-offload)")
    if pool.weight_place != "hbm":
        return (f"{vendored(ENGINE[framework]).framework} keeps the weights in HBM; the plan streams them from "
                f"{pool.weight_place} every step (re-plan with --no-weight-offload)")
    return (layout_problem(framework, pool.tp, pool.pp, pool.dp_attention, pool.ep, pool.devices_per_node)
            or format_problem(framework, pool.weight, pool.activation, pool.kv, native)
            or scheduling_problem(framework, pool.role, pool.chunk_tokens, pool.mtp_draft_tokens))


# Engines whose colocated instances always put prompts into their decode steps: vLLM V1's scheduler
# (chunked prefill is always on) and TensorRT-LLM's in-flight batching (context and generation
# requests in one batch).
MIXES_ALWAYS = ("vllm", "trtllm")


def scheduling_problem(framework: str, role: str, chunk_tokens: int, mtp_draft_tokens: int = 0) -> str | None:
    """Why ``framework`` cannot schedule a colocated instance's prompts as the plan does (in batches of
    their own with ``chunk_tokens`` 0, else as chunks in the decode steps), or None."""
    if role != "colocated":
        return None
    engine = vendored(ENGINE[framework]).framework
    if chunk_tokens == 0 and ENGINE[framework] in MIXES_ALWAYS:
        return (f"{engine} puts prompts into its decode steps; the plan runs them in batches of their own "
                f"(re-plan with --chunk-tokens above 0)")
    if chunk_tokens and mtp_draft_tokens:
        return f"{engine} does not mix prompt chunks into multi-token-prediction decode steps"
    return None


def _native(spec) -> str:
    return "bf16" if spec.native_precision == "fp16" else spec.native_precision


def _checked_pools(framework: str, spec, pools: list[PoolSpec]) -> None:
    for pool in pools:
        problem = pool_problem(framework, pool, _native(spec))
        if problem:
            raise ExportError(f"--export {framework}: {problem}")


# --- shell scripts --------------------------------------------------------------------------------

def _model(spec, model_ref: str) -> str:
    """The checkpoint a server loads: the Hugging Face directory given, else the model's repository."""
    from pathlib import Path

    path = Path(model_ref)
    if path.is_dir():
        return str(path)
    if path.suffix.lower() == ".json" and path.is_file():
        return str(path.parent)
    return HF_REPOS.get(spec.name, "")


def _quantization(engine: str, spec, pool: PoolSpec) -> str | None:
    return None if pool.weight == _native(spec) else QUANTIZATION[engine][(pool.weight, pool.activation)]


def _script(framework: str, spec, pool: PoolSpec, model: str, run: str, body: str, quantized: str | None) -> str:
    v = vendored(framework)
    need = ""
    if quantized in PRE_QUANTIZED:
        kind = "a ModelOpt checkpoint" if quantized == "checkpoint" else f"--quantization {quantized}"
        need = (f"# MODEL must be a checkpoint already quantized to {pool.weight} weights / {pool.activation} "
                f"activations ({kind}).\n")
        model = ""
    default = f'MODEL="${{MODEL:-{model}}}"' if model else 'MODEL="${MODEL:?the checkpoint to serve}"'
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# {spec.name}, {pool.describe()}",
        f"# Written by perfmodel for {v.citation};",
        "# every argument below exists at that version (perfmodel/exports/flags).",
        f"# {run}",
        "set -euo pipefail", need + default, body])




def _run(pool: PoolSpec) -> str:
    where = (f"on {pool.nodes} nodes (NODE_RANK 0-{pool.nodes - 1}, MASTER_ADDR the first)" if pool.nodes > 1
             else f"on {pool.devices_per_instance} device{'s' if pool.devices_per_instance > 1 else ''} of one node")
    return f"Run once per instance ({pool.instances} of them), {where}; PORT defaults to 8000."


def _name(framework: str, pool: PoolSpec, suffix: str = ".sh") -> str:
    return f"{framework}{'' if pool.role == 'colocated' else '-' + pool.role}{suffix}"


# --- vLLM ---------------------------------------------------------------------------------------

def _vllm_items(spec, pool: PoolSpec) -> dict[str, object]:
    items: dict[str, object] = {"--tensor-parallel-size": pool.tp, "--pipeline-parallel-size": pool.pp}
    if pool.dp_attention > 1:
        items["--data-parallel-size"] = pool.dp_attention
    if pool.ep > 1:
        items["--enable-expert-parallel"] = True
    if pool.redundant_experts:   # EPLB with the redundant experts the prediction places (ParallelConfig.eplb_config)
        items.update({"--enable-eplb": True, "--eplb-config": {"num_redundant_experts": pool.redundant_experts}})
    # Each data-parallel rank is its own vLLM engine with its own scheduler: the instance's batch splits.
    items.update({"--max-num-seqs": max(1, pool.batch // pool.dp_attention), "--max-model-len": pool.max_len})
    if pool.chunk_tokens:   # each engine's iteration: its decode batch and prompt chunks up to this many tokens
        items["--max-num-batched-tokens"] = pool.chunk_tokens
    quantization = _quantization("vllm", spec, pool)
    if quantization:
        items["--quantization"] = quantization
    if pool.kv != "bf16":
        items["--kv-cache-dtype"] = KV_DTYPES["vllm"][pool.kv]
    if pool.role != "colocated":
        items["--kv-transfer-config"] = {"kv_connector": "NixlConnector",
                                         "kv_role": "kv_producer" if pool.role == "prefill" else "kv_consumer"}
    if pool.mtp_draft_tokens:
        items["--speculative-config"] = {"method": "mtp", "num_speculative_tokens": pool.mtp_draft_tokens}
    if pool.nodes > 1:
        items.update({"--nnodes": pool.nodes, "--node-rank": "$NODE_RANK", "--master-addr": "$MASTER_ADDR"})
    items["--port"] = "$PORT"
    return items


def vllm(spec, pools: list[PoolSpec], model_ref: str) -> dict[str, str]:
    """``vllm[-prefill|-decode].sh`` per pool: ``vllm serve`` with the pool's layout and formats."""
    _checked_pools("vllm", spec, pools)
    files = {}
    for pool in pools:
        items = checked("vllm", _vllm_items(spec, pool))
        for flag, field in (("--kv-transfer-config", "kv_transfer_config"), ("--eplb-config", "eplb_config")):
            for key, value in (items.get(flag) or {}).items():
                checked("vllm", {f"{field}.{key}": value}, "keys")
        run = _run(pool) + (" Disaggregated: the NIXL connector moves the KV cache from prefill to decode "
                            "instances; route requests with a prefill/decode proxy (or --export dynamo)."
                            if pool.role != "colocated" else "")
        body = 'PORT="${PORT:-8000}"\n' + _vllm_command(pool, items)
        files[_name("vllm", pool)] = _script("vllm", spec, pool, _model(spec, model_ref), run, body,
                                             _quantization("vllm", spec, pool))
    return files


def _vllm_command(pool: PoolSpec, items: dict[str, object]) -> str:
    """``vllm serve``; across hosts every node but node 0 runs it with ``--headless`` (vLLM's vendored rule
    headless-secondary-nodes: remote engines and TP/PP workers start only headless)."""
    if pool.nodes == 1:
        return command(["vllm", "serve", '"$MODEL"'], items)
    checked("vllm", {"--headless": True})
    why = rule("vllm", "headless-secondary-nodes")
    return (f"# NODE_RANK > 0: --headless ({why.source.split(' ')[0]})\n"
            'headless=(); if [ "${NODE_RANK:?the rank of this host}" -gt 0 ]; then headless=(--headless); fi\n'
            + command(["vllm", "serve", '"$MODEL"', '${headless[@]+"${headless[@]}"}'], items))


# --- SGLang -------------------------------------------------------------------------------------

def _sglang_items(spec, pool: PoolSpec) -> dict[str, object]:
    # SGLang's --tp-size counts every device of a pipeline stage; --attn-dp-size splits attention among
    # them (the successor of --dp-size with --enable-dp-attention, deprecated at this version).
    items: dict[str, object] = {"--model-path": "$MODEL", "--tp-size": pool.tp * pool.dp_attention,
                                "--pp-size": pool.pp}
    if pool.dp_attention > 1:
        items["--attn-dp-size"] = pool.dp_attention
    if pool.ep > 1:
        items["--ep-size"] = pool.ep
    if pool.redundant_experts:   # EPLB with the redundant experts the prediction places
        items.update({"--enable-eplb": True, "--ep-num-redundant-experts": pool.redundant_experts})
    items.update({"--max-running-requests": pool.batch, "--context-length": pool.max_len})
    if pool.chunk_tokens:
        # Prompt chunks inside the decode batches; SGLang divides the chunk among the attention
        # data-parallel ranks (server_args' _handle_data_parallelism, 0.5.23), so it is given for all of them.
        items.update({"--enable-mixed-chunk": True, "--chunked-prefill-size": pool.chunk_tokens * pool.dp_attention})
    quantization = _quantization("sglang", spec, pool)
    if quantization:
        items["--quantization"] = quantization
    if pool.kv != "bf16":
        items["--kv-cache-dtype"] = KV_DTYPES["sglang"][pool.kv]
    if pool.role != "colocated":
        items.update({"--disaggregation-mode": pool.role, "--disaggregation-transfer-backend": "nixl"})
    if pool.role == "prefill":
        # Each prefill server listens for the decode side's KV requests on its own bootstrap port
        # (default 8998): servers sharing a node need distinct ones, which the router is given.
        items["--disaggregation-bootstrap-port"] = "$BOOTSTRAP_PORT"
    if pool.mtp_draft_tokens:
        items.update({"--speculative-algorithm": "EAGLE", "--speculative-num-draft-tokens": pool.mtp_draft_tokens + 1})
    if pool.nodes > 1:
        items.update({"--nnodes": pool.nodes, "--node-rank": "$NODE_RANK", "--dist-init-addr": "$MASTER_ADDR:5000"})
    if pool.vendor.lower() == "huawei":
        items["--device"] = "npu"          # SGLang's Ascend backend
    items.update({"--host": "0.0.0.0", "--port": "$PORT"})
    return items


def sglang(spec, pools: list[PoolSpec], model_ref: str) -> dict[str, str]:
    """``sglang[-prefill|-decode].sh`` per pool, and ``sglang-router.sh`` for a disaggregated deployment."""
    _checked_pools("sglang", spec, pools)
    files = {}
    for pool in pools:
        items = checked("sglang", _sglang_items(spec, pool))
        ports = 'PORT="${PORT:-8000}"\n' \
            + ('BOOTSTRAP_PORT="${BOOTSTRAP_PORT:-8998}"\n' if pool.role == "prefill" else "")
        body = ports + command(["python", "-m", "sglang.launch_server"], items)
        run = _run(pool) + (" Instances sharing a node each take their own PORT and BOOTSTRAP_PORT (default 8998), "
                            "which sglang-router.sh is given." if pool.role == "prefill" else "")
        files[_name("sglang", pool)] = _script("sglang", spec, pool, _model(spec, model_ref), run, body,
                                               _quantization("sglang", spec, pool))
    if any(p.role == "prefill" for p in pools):
        files["sglang-router.sh"] = _sglang_router(spec, pools)
    return files


def _sglang_router(spec, pools: list[PoolSpec]) -> str:
    """``sglang-router.sh``: one ``--prefill URL BOOTSTRAP_PORT`` per prefill instance and one
    ``--decode URL`` per decode instance (sglang-router's RouterArgs: both repeat, one server each),
    built from the URL lists the operator gives, whose lengths it checks against the plan's."""
    counts = {role: sum(p.instances for p in pools if p.role == role) for role in ("prefill", "decode")}
    router = checked("sglang", {"--pd-disaggregation": True, "--prefill": ["$URL", "$BOOTSTRAP_PORT"],
                                "--decode": "$URL", "--host": "0.0.0.0", "--port": 8000}, part="router")
    fixed = {k: v for k, v in router.items() if k not in ("--prefill", "--decode")}
    v = vendored("sglang")
    return "\n".join([
        "#!/usr/bin/env bash", f"# The prefill/decode router of {spec.name}'s disaggregated deployment.",
        f"# Written by perfmodel for {v.citation}'s router ({v.parts and 'sglang-router'}).",
        f"# PREFILL_URLS: the {counts['prefill']} prefill instances' http://host:port; PREFILL_BOOTSTRAP_PORTS: "
        "their --disaggregation-bootstrap-port, in the same order (distinct on one node); DECODE_URLS: the "
        f"{counts['decode']} decode instances' http://host:port. Space separated.",
        "set -euo pipefail",
        'read -ra prefill <<< "${PREFILL_URLS:?}"; read -ra ports <<< "${PREFILL_BOOTSTRAP_PORTS:?}"; '
        'read -ra decode <<< "${DECODE_URLS:?}"',
        f'[ "${{#prefill[@]}}" -eq {counts["prefill"]} ] && [ "${{#ports[@]}}" -eq {counts["prefill"]} ] '
        f'&& [ "${{#decode[@]}}" -eq {counts["decode"]} ] || {{ echo "the plan runs {counts["prefill"]} prefill '
        f'and {counts["decode"]} decode instances: give as many URLs (and bootstrap ports)" >&2; exit 2; }}',
        "servers=()",
        'for i in "${!prefill[@]}"; do servers+=(--prefill "${prefill[$i]}" "${ports[$i]}"); done',
        'for url in "${decode[@]}"; do servers+=(--decode "$url"); done',
        command(["python", "-m", "sglang_router.launch_router", '"${servers[@]}"'], fixed)])


# --- TensorRT-LLM -------------------------------------------------------------------------------

def _yaml(data: dict, indent: int = 0) -> str:
    """Block-style YAML of nested dicts, lists and scalars (scalars as JSON, which YAML reads)."""
    out = []
    pad = " " * indent
    for key, value in data.items():
        if isinstance(value, dict):
            out += [f"{pad}{key}:", _yaml(value, indent + 2)]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            out.append(f"{pad}{key}:")
            for item in value:
                block = _yaml(item, indent + 4).splitlines()
                out.append(f"{pad}  - " + block[0].lstrip())
                out += block[1:]
        elif isinstance(value, list):
            out.append(f"{pad}{key}:")
            out += [f"{pad}  - {json.dumps(v)}" for v in value]
        else:
            out.append(f"{pad}{key}: {json.dumps(value)}")
    return "\n".join(out)




def _trtllm_options(spec, pool: PoolSpec) -> dict[str, object]:
    options: dict[str, object] = {"enable_attention_dp": pool.dp_attention > 1,
                                  "kv_cache_config": {"dtype": KV_DTYPES["trtllm"][pool.kv]}}
    if pool.role != "colocated":
        options["cache_transceiver_config"] = {"backend": "DEFAULT"}
    if pool.role == "prefill":   # context servers run without the overlap scheduler (TRT-LLM's disaggregated examples)
        options["disable_overlap_scheduler"] = True
    if pool.mtp_draft_tokens:
        options["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": pool.mtp_draft_tokens}
    if pool.redundant_experts:
        options["moe_config"] = {"load_balancer": load_balancer(spec.moe.num_experts, pool.redundant_experts, pool.ep)}
    return options


def load_balancer(experts: int, redundant: int, ep: int) -> dict[str, int]:
    """TensorRT-LLM's MoeLoadBalancerConfig for the EPLB the prediction counts: ``num_slots`` = experts +
    redundant copies over the ``ep`` ranks, placed online (``layer_updates_per_iter`` 1, one layer
    re-placed per iteration, as vLLM's and SGLang's --enable-eplb rebalance while serving); refused with
    TRT-LLM's reason when the slots do not divide among the EP ranks or fall short of the experts."""
    slots = experts + redundant
    for name, broken in (("load-balancer-slots-divide-ep", slots % ep != 0),
                         ("load-balancer-slots-cover-experts", slots < experts)):
        if broken:
            raise ExportError(rule("trtllm", name).refusal(f"{slots} expert slots for {experts} experts on ep {ep}"))
    return {"num_slots": slots, "layer_updates_per_iter": 1}


def _mpi_launch(pool: PoolSpec) -> str:
    """The MPI launch of one instance spanning hosts (TensorRT-LLM's vendored rule mpi-world-size: one rank
    per GPU, tp x pp ranks): srun inside a Slurm allocation, else mpirun over the operator's HOSTS."""
    ranks, per_host = pool.devices_per_instance, pool.devices_per_node
    why = rule("trtllm", "mpi-world-size")
    if ranks != pool.tp * pool.dp_attention * pool.pp:
        raise ExportError(why.refusal(f"{ranks} ranks for tp {pool.tp * pool.dp_attention} x pp {pool.pp}"))
    even = ranks % per_host == 0
    srun = checked("trtllm", {"-N": pool.nodes, **({"--ntasks-per-node": per_host} if even else {"--ntasks": ranks}),
                              "--mpi": "pmix"}, part="srun")
    mpirun = checked("trtllm", {"-n": ranks, "--host": "$HOSTS"}, part="mpirun")
    checked("trtllm", {"trtllm-llmapi-launch": True}, part="launch")
    srun_words = " ".join(f"{k}={v}" if k == "--mpi" else f"{k} {v}" for k, v in srun.items())
    hosts = ",".join(f"host{i}:{min(per_host, ranks - i * per_host)}" for i in range(pool.nodes))
    return "\n".join([
        f"# {why.source}: {ranks} MPI ranks, one per GPU, {per_host} per host.",
        'if [ -n "${SLURM_JOB_ID:-}" ]; then',
        f"  launch=(srun {srun_words})",
        "else",
        f'  HOSTS="${{HOSTS:?the {pool.nodes} hosts of this instance with their GPUs, e.g. {hosts}}}"',
        f'  launch=(mpirun -n {mpirun["-n"]} --host "$HOSTS")',
        "fi"])


def _trtllm_items(pool: PoolSpec, config: str) -> dict[str, object]:
    items: dict[str, object] = {"--backend": "pytorch", "--tp_size": pool.tp * pool.dp_attention, "--pp_size": pool.pp,
                                "--ep_size": pool.ep,
                                # with attention DP, each rank schedules its own batch
                                "--max_batch_size": max(1, pool.batch // pool.dp_attention),
                                "--max_seq_len": pool.max_len, "--extra_llm_api_options": config}
    if pool.chunk_tokens:    # prompts split into chunks that fill each iteration up to this many tokens
        items.update({"--max_num_tokens": pool.chunk_tokens, "--enable_chunked_prefill": True})
    if pool.nodes > 1:   # ranks map to the GPUs of their host (a GB200 tray's 4)
        items["--gpus_per_node"] = pool.devices_per_node
    items.update({"--host": "0.0.0.0", "--port": "$PORT"})
    return checked("trtllm", items)


def _trtllm_run(pool: PoolSpec) -> str:
    if pool.nodes == 1:
        return _run(pool)
    return (f"Run once per instance ({pool.instances} of them), on one host of its {pool.nodes} (in a Slurm allocation "
            "of them, or with HOSTS for mpirun): trtllm-llmapi-launch starts trtllm-serve on every rank; the server "
            "answers on the first rank's host; PORT defaults to 8000.")


LOAD_BALANCER_NOTE = ("# moe_config.load_balancer: TensorRT-LLM's online EP load balancer reads the experts' load from "
                      "host-accessible device memory (Grace's NVLink-C2C, or GDRCopy's gdrdrv on x86 hosts).\n")


def trtllm(spec, pools: list[PoolSpec], model_ref: str) -> dict[str, str]:
    """``trtllm[-prefill|-decode].sh`` and ``extra-llm-api-config[-role].yml`` per pool; ``disagg-config.yml``
    for ``trtllm-serve disaggregated``. An instance spanning hosts is one MPI job (srun or mpirun with
    ``trtllm-llmapi-launch``, one rank per GPU)."""
    _checked_pools("trtllm", spec, pools)
    files = {}
    for pool in pools:
        config = _name("extra-llm-api-config", pool, ".yml")
        options = _trtllm_options(spec, pool)
        checked("trtllm", dict(flatten(options)), "keys")
        items = _trtllm_items(pool, config)
        words = ["trtllm-serve", '"$MODEL"']
        body = 'PORT="${PORT:-8000}"\n'
        if pool.nodes > 1:
            body += _mpi_launch(pool) + "\n"
            words = ['"${launch[@]}"', "trtllm-llmapi-launch", *words]
        body += command(words, items)
        files[_name("trtllm", pool)] = _script("trtllm", spec, pool, _model(spec, model_ref), _trtllm_run(pool), body,
                                               _quantization("trtllm", spec, pool))
        files[config] = (f"# {spec.name}, {pool.describe()}\n" + (LOAD_BALANCER_NOTE if "moe_config" in options else "")
                         + _yaml(options) + "\n")
    if any(p.role == "prefill" for p in pools):
        files["disagg-config.yml"] = _disagg_config(spec, pools)
    return files


def _disagg_config(spec, pools: list[PoolSpec]) -> str:
    """``disagg-config.yml``: one URL per context and generation instance (each instance's first host)."""
    by_role = {p.role: p for p in pools}
    disagg = {"hostname": "localhost", "port": 8000,
              "context_servers": {"num_instances": by_role["prefill"].instances,
                                  "urls": [f"localhost:{8001 + i}" for i in range(by_role["prefill"].instances)]},
              "generation_servers": {"num_instances": by_role["decode"].instances,
                                     "urls": [f"localhost:{9001 + i}" for i in range(by_role["decode"].instances)]}}
    checked("trtllm", {k: v for k, v in flatten(disagg)}, "keys", part="disaggregated")
    return (f"# {spec.name}: trtllm-serve disaggregated -c disagg-config.yml; replace the "
            "urls with each instance's host:port (a multi-host instance's first host).\n" + _yaml(disagg) + "\n")


# --- NVIDIA Dynamo ------------------------------------------------------------------------------

def dynamo_image() -> str:
    """The vLLM runtime image of the vendored Dynamo version, written literally (kubectl expands no
    environment variables in a manifest): Dynamo's manifests and docs name it
    ``nvcr.io/nvidia/ai-dynamo/vllm-runtime:<version>``."""
    return f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{vendored('dynamo').version.lstrip('v')}"


OPERATOR_INJECTS = ("--port", "--nnodes", "--node-rank", "--master-addr")


def dynamo_multinode_problem(engine_devices: int, dp: int, devices: int, per_host: int) -> str | None:
    """Why Dynamo's operator cannot launch a vLLM worker of ``devices`` GPUs (engines of ``engine_devices`` =
    TP x PP, ``dp`` of them) over hosts of ``per_host`` GPUs, or None: one pod per host, each holding the
    host's GPUs; an engine wider than a host only without data parallelism; else TP x PP divides a host."""
    if devices <= per_host:
        return None
    what = f"a worker of {devices} GPUs (TP x PP {engine_devices}, data parallel {dp}) on hosts of {per_host}"
    if devices % per_host:
        return rule("dynamo", "multinode-gpus-per-pod").refusal(what, "plan instances that fill their hosts")
    if engine_devices > per_host and dp > 1:
        return rule("dynamo", "multinode-tp-precedes-dp").refusal(what)
    if engine_devices <= per_host and per_host % engine_devices:
        return rule("dynamo", "multinode-dp-engines-per-node").refusal(what)
    return None


def dynamo(spec, pools: list[PoolSpec], model_ref: str) -> dict[str, str]:
    """``dynamo-deployment.yaml``: a DynamoGraphDeployment (nvidia.com/v1beta1) with the frontend and
    one vLLM worker component per pool: replicas = instances, GPUs = devices per instance, or for an
    instance spanning hosts ``multinode.nodeCount`` = hosts with each host's GPUs per pod."""
    _checked_pools("dynamo", spec, pools)
    model = _model(spec, model_ref) or "MODEL"
    image = dynamo_image()
    components = [{"name": "frontend", "type": "frontend", "replicas": 1, "podTemplate": {"spec": {"containers": [
        {"name": "main", "image": image, "command": ["python3", "-m", "dynamo.frontend"],
         "args": ["--http-port", "8000"]}]}}}]
    for pool in pools:   # _checked_pools refused the layouts its operator cannot place (dynamo_multinode_problem)
        # Across hosts the operator injects the per-node launch flags (--nnodes ..., or the data-parallel ones).
        engine = {k: v for k, v in _vllm_items(spec, pool).items() if k not in OPERATOR_INJECTS}
        checked("vllm", engine)
        own = {"--model": model}
        if pool.role != "colocated":
            own["--disaggregation-mode"] = pool.role
        checked("dynamo", own)
        args = [x if isinstance(x, str) else json.dumps(x, separators=(",", ":")) if isinstance(x, dict) else str(x)
                for k, v in {**own, **engine}.items() for x in ((k,) if v is True else (k, v))]
        role = {"colocated": "worker"}.get(pool.role, pool.role)
        gpus = pool.devices_per_instance if pool.nodes == 1 else pool.devices_per_node   # per pod: one pod per host
        component = {"name": role, "type": role, "replicas": pool.instances}
        if pool.nodes > 1:
            component["multinode"] = {"nodeCount": pool.nodes}
        components.append({**component, "podTemplate": {"spec": {"containers": [
                               {"name": "main", "image": image, "command": ["python3", "-m", "dynamo.vllm"],
                                "args": args, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}})
    deployment = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment",
                  "metadata": {"name": spec.name.replace(".", "-") + "-" + ("disagg" if len(pools) > 1 else "agg")},
                  "spec": {"backendFramework": "vllm", "components": components}}
    checked("dynamo", {"apiVersion": deployment["apiVersion"], "kind": deployment["kind"],
                       "metadata.name": deployment["metadata"]["name"], "spec.backendFramework": "vllm"}, "keys")
    for c in components:
        container = c["podTemplate"]["spec"]["containers"][0]
        checked("dynamo", {"spec.components[].name": c["name"], "spec.components[].type": c["type"],
                           "spec.components[].replicas": c["replicas"],
                           "spec.components[].podTemplate.spec.containers[].name": container["name"],
                           "spec.components[].podTemplate.spec.containers[].image": container["image"],
                           "spec.components[].podTemplate.spec.containers[].command": container["command"],
                           "spec.components[].podTemplate.spec.containers[].args": container["args"]}, "keys")
        if "resources" in container:
            checked("dynamo", {'spec.components[].podTemplate.spec.containers[].resources.limits["nvidia.com/gpu"]':
                               container["resources"]["limits"]["nvidia.com/gpu"]}, "keys")
        if "multinode" in c:
            checked("dynamo", {"spec.components[].multinode.nodeCount": c["multinode"]["nodeCount"]}, "keys")
    v, engine_v = vendored("dynamo"), vendored("vllm")
    header = (f"# {spec.name}: " + "; ".join(p.describe() for p in pools) + "\n"
              f"# Written by perfmodel for {v.citation},\n# with vLLM workers (engine flags checked against "
              f"{engine_v.framework} {engine_v.version}; Dynamo {v.version} pins vLLM "
              f"{v.engine_versions.get('vllm', '?')}).\n# Apply with kubectl (the image is the version's vLLM runtime; "
              "kubectl expands no variables).\n"
              + ("# Multinode workers: the operator launches one pod per host through its multinode deployer "
                 "(Grove or LeaderWorkerSet in the cluster) and injects each host's launch flags.\n"
                 if any(p.nodes > 1 for p in pools) else ""))
    return {"dynamo-deployment.yaml": header + _yaml(deployment) + "\n"}


WRITERS = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm, "dynamo": dynamo}
