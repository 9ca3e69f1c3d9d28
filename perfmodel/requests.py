"""One typed request per ``estimate`` command: what the flags say, checked and turned into a plan.

The CLI builds these from its flags and ``validate`` builds them from each published case, so a
case's number is what typing its flags at the CLI prints (``cli_args`` gives those flags).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from perfmodel.hardware_db.errors import SpecError, UnknownNameError

from .defaults import SERVE_DEFAULTS, TRAIN_DEFAULTS
from .exports import SERVING as SERVING_FRAMEWORKS
from .plan import (ACTIVATION_PRECISIONS, ATTENTION, CP_COMMS, EXPERT_BALANCES, INTERLEAVED, KV_PRECISIONS, OVERLAP,
                   PLACES, RECOMPUTE, SCHEDULES, STORAGES, WEIGHT_PRECISIONS, DISPATCHERS, QuantScheme)

PRICING = ("cloud", "owned")
KV_PLACES = ("hbm", "ddr", "cxl", "pooled")
MODEL_HELP = "Catalog name, spec YAML, Hugging Face config.json or model directory."
PRICING_HELP = ("Cost basis: cloud (on-demand rent per device-hour) or owned (price over its depreciation life, "
                "network, facility and energy).")
PRICE_HELP = "Your all-in price for a system, SYSTEM=USD_PER_DEVICE_HOUR (repeatable; either basis)."
MOE_IMBALANCE_HELP = "Busiest over mean expert-parallel device load (0: the named constant moe-load-imbalance)."
SERVE_IMBALANCE_HELP = ("Busiest over mean expert-parallel device load (0: computed from the default routing as "
                        "--expert-balance places it; 1: perfectly balanced).")
EXPERT_BALANCE_HELP = ("How expert load is balanced when serving MoE: eplb (DeepSeek's EPLB with redundant experts, "
                       "moe-redundant-expert-share, over the routing statistics or the default power-law routing "
                       "moe-routing-power-law-alpha), none (experts in contiguous blocks, no replicas) or balanced "
                       "(every device equal).")


def option(default, help: str, *, choices=(), many: bool = False, complete: str | None = None,
           flag: str | None = None):
    """A request field that is also a command-line option: its default, its help, its allowed values
    (listed in --help and checked by the request; ``many``: a comma-separated list of them) and what
    the shell completes it with (``model``, ``system``). The command line is built from these fields
    (``perfmodel.cli.options``)."""
    return field(default=default, metadata={"help": help, "choices": tuple(choices), "many": many,
                                            "complete": complete, "flag": flag})


def positive(name: str, value) -> None:
    """A positive integer flag (None: not given), else a one-line error naming the flag."""
    if value is not None and value < 1:
        raise SpecError(f"--{name.replace('_', '-')} needs a positive integer, has {value}")


def one_of(name: str, value, allowed) -> None:
    """A flag whose value is one of ``allowed``, else a one-line error listing them."""
    if value not in allowed:
        raise UnknownNameError(f"--{name.replace('_', '-')} value", str(value), allowed)


def check_choices(request) -> None:
    """Every single-valued field declared with ``choices`` holds one of them (None: not given);
    one-line errors. Comma-separated lists (``many``) are checked where they are split."""
    for f in fields(request):
        allowed = f.metadata.get("choices")
        value = getattr(request, f.name)
        if allowed and not f.metadata.get("many") and value is not None and value not in allowed:
            if f.type in ("int", int) or isinstance(value, int):
                raise SpecError(f"--{f.name.replace('_', '-')} needs {', '.join(map(str, allowed[:-1]))} or "
                                f"{allowed[-1]}, has {value}")
            one_of(f.name, value, allowed)


def _positive(request, *names: str) -> None:
    for name in names:
        positive(name, getattr(request, name))


def _flags(request, skip=(), keep=()) -> list[str]:
    """The command-line flags that reproduce ``request`` (booleans as --x / --no-x); fields at their
    default are left out unless named in ``keep``."""
    out = []
    for f in fields(request):
        value = getattr(request, f.name)
        if f.name in skip or value is None or (f.name not in keep and value == f.default):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, tuple):
            for item in value:
                out += [flag, str(item)]
        elif isinstance(value, bool):
            out.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


@dataclass(frozen=True)
class TrainRequest:
    """``perfmodel estimate train``: one training plan of a model on a system."""

    model: str = option(TRAIN_DEFAULTS["model"], MODEL_HELP, complete="model")
    system: str = option(TRAIN_DEFAULTS["system"], "System name from the hardware database.", complete="system")
    devices: int | None = option(TRAIN_DEFAULTS["devices"], "Devices.")
    tp: int = option(8, "Tensor-parallel degree.")
    pp: int = option(2, "Pipeline stages.")
    dp: int | None = option(None, "Data-parallel degree (default: fills the devices).")
    cp: int = option(1, "Context-parallel degree.")
    ep: int = option(1, "Expert-parallel degree (MoE; experts folded over tp x cp x dp).")
    etp: int | None = option(None, "Expert tensor-parallel degree (default: tp).")
    interleave: int = option(1, "Virtual pipeline stages per device.")
    ends_as_layers: bool = option(False, "The embedding and the loss each take one layer's slot in the pipeline "
                                         "split (Megatron's --account-for-embedding-in-pipeline-split and "
                                         "--account-for-loss-in-pipeline-split; Llama 3's first and last stages).")
    micro_batch: int = option(1, "Sequences per microbatch.")
    zero: int = option(1, "ZeRO stage.", choices=(0, 1, 2, 3))
    shard: int | None = option(None, "Shard the ZeRO stage's states over groups of this many dp x cp ranks and "
                                     "replicate across groups (HSDP, MiCS, Megatron's partial distributed optimizer; "
                                     "default: all of them).")
    shard_grads: int | None = option(None, "Shard the gradients over groups of this many ranks (zero >= 2; default: "
                                           "as --shard).")
    shard_weights: int | None = option(None, "Shard the weights over groups of this many ranks (zero 3; default: as "
                                             "--shard-grads). With --shard-grads: a group per state, as Frontier's "
                                             "GCD / GPU / node partitioning.")
    hpz: int | None = option(None, "ZeRO++ hpZ: keep a secondary weight partition over this many ranks for the "
                                   "backward gathers (zero 3).")
    qwz: bool = option(False, "ZeRO++ qwZ: int8 weight all-gathers (zero 3).")
    qgz: bool = option(False, "ZeRO++ qgZ: int4 gradient reduce-scatter as two all-to-alls (zero 3).")
    prefetch: int = option(1, "ZeRO-3: layers whose weights are gathered ahead of the one computing (FSDP's default "
                              "1; 0: every gather blocks). Each holds one more whole layer in HBM.")
    recompute: str = option("selective", "Activation recomputation: the attention core (selective), every layer "
                                          "(full), or the attention core, norms, MLA up-projections and MoE "
                                          "activation (modules: DeepSeek-V3's recipe).", choices=RECOMPUTE)
    sp: bool = option(True, "Sequence parallelism.")
    precision: str = option(TRAIN_DEFAULTS["precision"], "GEMM precision.", choices=("bf16", "fp16", "fp8"))
    offload_optimizer: str = option("hbm", "Where optimizer states live (ddr+cxl: interleaved over both, each "
                                           "one's share in proportion to its bandwidth).", choices=PLACES)
    offload_grads: str = option("hbm", "Where gradients live (off HBM only with the optimizer states).",
                                choices=PLACES)
    offload_params: str = option("hbm", "Where parameters live.", choices=PLACES)
    activation_offload: float = option(0.0, "Share of each layer's saved activations swapped to host DDR after its "
                                            "forward and fetched back for its backward, under the neighbouring "
                                            "layers' compute (MEMO); with --recompute full, every layer's input is "
                                            "swapped and this share of the tokens keeps its whole activations in "
                                            "host memory instead of being recomputed. 0: off.")
    attention: str = option("flash", "flash (causal FlashAttention) or standard (s x s scores written, as 2021 "
                                     "Megatron-LM).", choices=ATTENTION)
    dp_overlap: bool = option(True, "Overlap the gradient reduction with the backward pass.")
    overlap: str = option("framework", "none (every transfer exposed), framework (as Megatron-LM and DeepSpeed "
                                       "schedule them) or ideal (all under compute).", choices=OVERLAP)
    tp_overlap: bool = option(False, "Megatron's TP-communication overlap with the GEMMs (needs --sp).")
    schedule: str = option("1f1b", "Pipeline schedule: 1f1b (interleaved with --interleave) or dualpipe "
                                   "(DeepSeek's bidirectional schedule: a smaller bubble, two copies of the "
                                   "parameters).", choices=SCHEDULES)
    cp_comm: str = option("p2p", "How context parallelism moves K and V (Megatron's --cp-comm-type): p2p (a ring "
                                 "under the attention), all_gather (gathered before it, exposed: Llama 3's 128K "
                                 "runs) or a2a (DeepSpeed-Ulysses head split, exposed).", choices=CP_COMMS)
    ep_overlap: bool = option(False, "The MoE dispatch and combine under another microbatch's compute (Megatron's "
                                     "--overlap-moe-expert-parallel-comm, DeepSeek's DualPipe; needs --ep 2 or more).")
    dispatcher: str = option("alltoall", "The MoE token dispatcher: alltoall (Megatron-Core's NCCL all-to-all of every "
                                         "token-expert copy), deepep or hybridep (the flex dispatcher's backends: a "
                                         "token crosses the network once per node holding its experts; NVIDIA GPUs).",
                             choices=DISPATCHERS)
    storage: str = option("mixed", "How states and cached activations are stored: mixed (mixed-precision Adam, 2 + 2 "
                                   "+ 12 bytes per parameter) or deepseek (DeepSeek-V3's low-precision storage: "
                                   "fp32 gradients, BF16 Adam moments, FP8-cached activations; needs --precision "
                                   "fp8).", choices=STORAGES)
    moe_imbalance: float = option(0.0, MOE_IMBALANCE_HELP)
    pricing: str = option("cloud", PRICING_HELP, choices=PRICING)
    price: tuple[str, ...] = option((), PRICE_HELP)
    global_batch: int = option(TRAIN_DEFAULTS["global_batch"], "Sequences per optimizer step.")
    seq_len: int = option(TRAIN_DEFAULTS["seq_len"], "Tokens per sequence.")
    tokens: float = option(TRAIN_DEFAULTS["tokens"], "Training tokens of the run (for run time, energy, cost).")

    def resolve(self, db, spec=None):
        """(spec, machine, plan, workload), or a one-line SpecError naming the bad value."""
        from .catalog import load_model
        from .machine import build_machine
        from .training import TrainPlan, TrainWorkload

        _positive(self, "devices", "tp", "pp", "dp", "cp", "ep", "etp", "interleave", "micro_batch",
                  "global_batch", "seq_len", "shard", "shard_grads", "shard_weights", "hpz")
        check_choices(self)
        if not 0 <= self.tokens < 1e18:
            raise SpecError(f"--tokens needs 0 to 1e18, has {self.tokens:g}")
        _imbalance(self.moe_imbalance)
        if not 0 <= self.prefetch <= 64:
            raise SpecError(f"--prefetch needs 0 to 64 layers, has {self.prefetch}")
        spec = spec or load_model(self.model)
        machine = build_machine(db, self.system, self.devices, self.pricing, parse_prices(db, self.price))
        machine.flops(self.precision)  # unsupported precision: one clear error
        if self.tp_overlap and self.tp > 1 and not machine.overlaps_tp_communication:
            raise SpecError(f"--tp-overlap needs Transformer Engine's userbuffers, built for NVIDIA GPUs; "
                            f"{machine.accelerator.name} is {machine.accelerator.vendor}'s")
        if self.storage == "deepseek" and self.precision != "fp8":
            raise SpecError(f"--storage deepseek caches FP8 activations: it needs --precision fp8, has "
                            f"{self.precision}")
        if self.dispatcher != "alltoall" and (not spec.moe or self.ep < 2):
            raise SpecError(f"--dispatcher {self.dispatcher} dispatches tokens to experts on other ranks: it needs an "
                            "MoE model and --ep 2 or more" + ("" if spec.moe else f"; {spec.name} has no experts"))
        if self.dispatcher != "alltoall" and not machine.runs_flex_dispatcher:
            raise SpecError(f"--dispatcher {self.dispatcher} is a CUDA library (NVSHMEM / NVLink); "
                            f"{machine.accelerator.name} is {machine.accelerator.vendor}'s")
        if self.ep_overlap and (not spec.moe or self.ep < 2):
            raise SpecError("--ep-overlap overlaps the expert exchange: it needs an MoE model and --ep 2 or more"
                            + ("" if spec.moe else f"; {spec.name} has no experts"))
        if not 0.0 <= self.activation_offload <= 1.0:
            raise SpecError(f"--activation-offload needs a share from 0 to 1, has {self.activation_offload:g}")
        if self.activation_offload > 0:
            machine.tier("ddr")             # swapped activations live in host DDR: one clear error without it
        for name in ("offload_optimizer", "offload_grads", "offload_params"):
            if getattr(self, name) != "hbm":
                for kind in INTERLEAVED.get(getattr(self, name), (getattr(self, name),)):
                    machine.tier(kind)      # a tier the system lacks: one clear error
        dp = self.dp or max(machine.devices // (self.tp * self.pp * self.cp), 1)
        plan = TrainPlan(tp=self.tp, pp=self.pp, dp=dp, cp=self.cp, cp_comm=self.cp_comm, ep=self.ep,
                         etp=self.etp or 0,
                         interleave=self.interleave, ends_as_layers=self.ends_as_layers and self.pp > 1,
                         micro_batch=self.micro_batch, zero=self.zero,
                         recompute=self.recompute, sp=self.sp and self.tp > 1, precision=self.precision,
                         optimizer_place=self.offload_optimizer, grad_place=self.offload_grads,
                         param_place=self.offload_params, flash=self.attention == "flash",
                         overlap_dp=self.dp_overlap, overlap=self.overlap, tp_overlap=self.tp_overlap,
                         ep_overlap=self.ep_overlap, dispatcher=self.dispatcher, schedule=self.schedule,
                         storage=self.storage,
                         moe_imbalance=self.moe_imbalance, shard=self.shard or 0, shard_grads=self.shard_grads or 0,
                         shard_weights=self.shard_weights or 0, hpz=self.hpz or 0, qwz=self.qwz, qgz=self.qgz,
                         prefetch=self.prefetch, activation_offload=float(self.activation_offload))
        self._check_sharding(dp * self.cp)
        return spec, machine, plan, TrainWorkload(self.global_batch, self.seq_len, self.tokens)

    def _check_sharding(self, replicas: int) -> None:
        """The sharding flags fit the ZeRO stage and nest inside the dp x cp replicas, else one line."""
        from .sharding import Sharding

        s = Sharding.of(self.zero, replicas, self.shard or 0, self.shard_grads or 0, self.shard_weights or 0,
                        self.hpz or 0, self.qwz, self.qgz)
        flags = {"shard needs": "--shard needs --zero 1 or more", "shard-grads needs": "--shard-grads needs --zero 2 "
                 "or 3", "shard-weights needs": "--shard-weights needs --zero 3",
                 "hpz, qwz": "--hpz, --qwz and --qgz need --zero 3 (ZeRO++ builds on ZeRO-3)"}
        sizes = {"shard divides": f"--shard needs a divisor of dp x cp = {replicas}, has {int(s.optimizer)}",
                 "shard-grads divides": f"--shard-grads needs a divisor of the optimizer states' group "
                                        f"({int(s.optimizer)} ranks), has {int(s.grads)}",
                 "shard-weights divides": f"--shard-weights needs a divisor of the gradients' group ({int(s.grads)} "
                                          f"ranks), has {int(s.weights)}",
                 "hpz divides": f"--hpz needs a divisor of the weights' group ({int(s.weights)} ranks) smaller than "
                                f"it, has {self.hpz}"}
        for mask, name, _ in s.rules(self.zero, self.shard or 0, self.shard_grads or 0, self.shard_weights or 0,
                                     self.hpz or 0, self.qwz, self.qgz):
            if bool(mask):
                raise SpecError(next(text for key, text in {**flags, **sizes}.items() if name.startswith(key)))

    def cli_args(self) -> list[str]:
        return ["estimate", "train"] + _flags(self, keep=("model", "system", "devices", "tp", "pp", "dp"))

    @staticmethod
    def of_plan(model: str, system: str, devices: int, plan, work) -> "TrainRequest":
        """The request that evaluates a searched plan (a ``TrainPlan`` of scalars, as a
        ``search.rows.TrainRow`` holds it) on its own."""
        return TrainRequest(
            model=model, system=system, devices=devices, tp=plan.tp, pp=plan.pp, dp=plan.dp, cp=plan.cp,
            cp_comm=plan.cp_comm, ep=plan.ep, etp=plan.etp or None, interleave=plan.interleave,
            ends_as_layers=bool(plan.ends_as_layers), micro_batch=plan.micro_batch,
            zero=plan.zero, recompute=plan.recompute, sp=plan.sp or plan.tp == 1,
            tp_overlap=bool(plan.tp_overlap), ep_overlap=bool(plan.ep_overlap), dispatcher=plan.dispatcher,
            schedule=plan.schedule, storage=plan.storage, precision=plan.precision,
            offload_optimizer=plan.optimizer_place, offload_grads=plan.grad_place,
            offload_params=plan.param_place, activation_offload=float(plan.activation_offload),
            moe_imbalance=plan.moe_imbalance,
            shard=plan.shard or None, shard_grads=plan.shard_grads or None,
            shard_weights=plan.shard_weights or None, hpz=plan.hpz or None,
            qwz=bool(plan.qwz), qgz=bool(plan.qgz),
            global_batch=work.global_batch, seq_len=work.seq_len, tokens=float(work.tokens))


@dataclass(frozen=True)
class ServeRequest:
    """``perfmodel estimate serve``: one serving instance of a model on a system."""

    model: str = option(SERVE_DEFAULTS["model"], MODEL_HELP, complete="model")
    system: str = option(SERVE_DEFAULTS["system"], "System name from the hardware database.", complete="system")
    devices: int | None = option(None, "Devices (default: one node of the system).")
    tp: int = option(8, "Tensor-parallel degree per instance.")
    pp: int = option(1, "Pipeline stages per instance.")
    ep: int = option(1, "Expert-parallel degree (MoE; experts folded over tp x dp-attention devices; above the "
                        "expert count, redundant copies).")
    dp_attention: int = option(1, "Attention data-parallel ranks (MLA models).")
    batch: int = option(32, "Concurrent sequences per instance.")
    input_len: int = option(SERVE_DEFAULTS["input_len"], "Prompt tokens.")
    output_len: int = option(SERVE_DEFAULTS["output_len"], "Generated tokens.")
    cached_len: int = option(0, "Prompt tokens whose KV is already cached (prefix caching): only the rest are "
                                "prefilled.")
    weight_precision: str = option("bf16", "Weight format.", choices=WEIGHT_PRECISIONS)
    activation_precision: str = option("a16", "Activation format: a16 (bf16 math), a8 (W8A8) or a4 (W4A4).",
                                       choices=ACTIVATION_PRECISIONS)
    kv_precision: str = option("bf16", "KV-cache format.", choices=KV_PRECISIONS)
    kv_place: str = option("hbm", "Where the KV cache lives: hbm, or a host tier.", choices=KV_PLACES)
    weight_place: str = option("hbm", "Where the weights live: hbm, or a tier they stream from layer by layer each "
                                      "step (pooled, cxl, ddr).", choices=KV_PLACES)
    power_cap_w: float | None = option(None, "Power limit per accelerator, W (default: its TDP): each phase runs at "
                                             "the highest clock the limit allows.")
    mtp_draft_tokens: int = option(0, "Multi-token prediction: draft tokens per step (0-16).")
    mtp_acceptance: float = option(0.0, "Share of draft tokens accepted (0-1).")
    chunk_tokens: int = option(0, "Prompts as chunks inside the decode steps: tokens per iteration and attention rank "
                                  "(its decode batch and prompt tokens; vLLM's --max-num-batched-tokens); 0: prompts "
                                  "in batches of their own.")
    overlap: str = option("framework", "MoE exchange: framework (two micro-batches, one's all-to-all under the "
                                       "other's compute, where that pays) or none (every exchange exposed: the "
                                       "raw all-to-all time).", choices=("none", "framework"))
    moe_imbalance: float = option(0.0, SERVE_IMBALANCE_HELP)
    routing: str | None = option(None, "Routing statistics file (.json, .csv or .npz; see README): the busiest EP "
                                       "device of their placement (--expert-balance) replaces the default routing's.")
    expert_balance: str = option("eplb", EXPERT_BALANCE_HELP, choices=EXPERT_BALANCES)
    framework: str | None = option(None, "Serving framework whose measured GEMM kernels price the GEMMs: vllm, "
                                         "sglang, trtllm, dynamo (vLLM workers): that engine's fits where the "
                                         "device has them (calibration serving_backends), else TensorRT-LLM's. "
                                         "Default: TensorRT-LLM's kernels.", choices=SERVING_FRAMEWORKS)
    pricing: str = option("cloud", PRICING_HELP, choices=PRICING)
    price: tuple[str, ...] = option((), PRICE_HELP)

    def resolve(self, db, spec=None):
        from .catalog import load_model
        from .machine import build_machine
        from .serving import ServePlan, ServeWorkload, serving_backend

        _positive(self, "devices", "tp", "pp", "ep", "dp_attention", "batch", "input_len", "output_len")
        check_choices(self)
        if not 0 <= self.mtp_draft_tokens <= 16:
            raise SpecError(f"--mtp-draft-tokens needs 0 to 16, has {self.mtp_draft_tokens}")
        if not 0.0 <= self.mtp_acceptance <= 1.0:
            raise SpecError(f"--mtp-acceptance needs a share from 0 to 1, has {self.mtp_acceptance:g}")
        QuantScheme(self.weight_precision, self.activation_precision, self.kv_precision)  # the pairing rule
        _imbalance(self.moe_imbalance)
        spec = spec or load_model(self.model)
        machine = build_machine(db, self.system, self.devices, self.pricing, parse_prices(db, self.price))
        check_power_cap(machine, self.power_cap_w)
        imbalance = self.moe_imbalance
        if self.routing is not None:
            from .eplb import routing_imbalance
            from .routing import routing_for

            if self.moe_imbalance > 0:
                raise SpecError("give --routing or --moe-imbalance, not both")
            stats = routing_for(spec, self.routing)
            share = machine.constants.moe_redundant_expert_share
            imbalance = routing_imbalance(stats.loads, self.ep, share, self.expert_balance)
        plan = ServePlan(tp=self.tp, pp=self.pp, ep=self.ep, dp_attention=self.dp_attention, batch=self.batch,
                         weight_precision=self.weight_precision, activation_precision=self.activation_precision,
                         kv_precision=self.kv_precision, kv_place=self.kv_place, weight_place=self.weight_place,
                         power_cap_w=self.power_cap_w,
                         mtp_draft_tokens=self.mtp_draft_tokens, mtp_acceptance=self.mtp_acceptance,
                         overlap_comm=self.overlap != "none", moe_imbalance=imbalance,
                         expert_balance=self.expert_balance, chunk_tokens=self.chunk_tokens,
                         backend=serving_backend(self.framework))
        if not 0 <= self.chunk_tokens <= 1 << 20:
            raise SpecError(f"--chunk-tokens needs 0 to 1,048,576, has {self.chunk_tokens}")
        if self.chunk_tokens and self.pp > 1:
            raise SpecError("--chunk-tokens models an instance without pipeline stages (--pp 1)")
        if self.chunk_tokens and self.chunk_tokens <= self.batch // self.dp_attention * (1 + self.mtp_draft_tokens):
            raise SpecError(f"--chunk-tokens {self.chunk_tokens:,} leaves no prompt tokens beside an attention rank's "
                            f"decode batch of {self.batch // self.dp_attention * (1 + self.mtp_draft_tokens):,}")
        if not 0 <= self.cached_len < self.input_len:
            raise SpecError(f"--cached-len needs 0 to --input-len - 1 ({self.input_len - 1:,}), has {self.cached_len:,}")
        return spec, machine, plan, ServeWorkload(self.input_len, self.output_len, self.cached_len)

    def cli_args(self) -> list[str]:
        return ["estimate", "serve"] + _flags(self, keep=("model", "system", "devices", "tp", "batch"))


def check_power_cap(machine, cap_w: float | None) -> None:
    """A per-device power limit between the accelerator's idle power and its TDP, or a one-line error."""
    if cap_w is not None and not machine.idle_w < cap_w <= machine.tdp_w:
        raise SpecError(f"--power-cap-w needs more than the {machine.accelerator.name}'s idle {machine.idle_w:,.0f} W "
                        f"and at most its TDP {machine.tdp_w:,.0f} W, has {cap_w:g}")


def parse_prices(db, texts) -> dict[str, float]:
    """``SYSTEM=USD`` flags (all-in USD per device-hour) as {system name: price}; one-line errors."""
    import math

    prices = {}
    for text in texts or ():
        name, sep, value = str(text).partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = float("nan")
        if not sep or not math.isfinite(usd) or not 0 < usd < 1e6:
            raise SpecError(f"--price needs SYSTEM=USD_PER_DEVICE_HOUR with a positive price, has {text!r}")
        prices[db.system(name.strip()).name] = usd
    return prices


def _imbalance(value: float) -> None:
    if value != 0 and not 1.0 <= value <= 1e3:
        raise SpecError(f"--moe-imbalance needs 0 (the named constant) or a ratio from 1 to 1,000, has {value:g}")


def command(request) -> str:
    """The shell command that reproduces ``request``: ``perfmodel estimate ...``."""
    import shlex

    return " ".join(["perfmodel"] + [shlex.quote(a) for a in request.cli_args()])
