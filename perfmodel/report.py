"""One evaluated plan as plain data (SI units): what ``estimate`` prints and ``--json`` emits.

Values that do not exist (a cost without a price) are None with a status, never NaN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.hardware_db.errors import InfeasibleError

from .machine import BACKEND_NAMES, Machine
from .economics import cost_basis
from .plan import PLACES

if TYPE_CHECKING:   # the training reports need not load the serving model, nor the serving ones the training model
    from .serving import ServeResult
    from .training import TrainResult


def _f(x) -> float | None:
    value = float(np.asarray(x).reshape(-1)[0]) if np.size(x) else float("nan")
    return value if math.isfinite(value) else None


def _b(x) -> bool:
    return bool(np.asarray(x).reshape(-1)[0])


def describe_binding(binding: str, shortfall: float, machine: Machine, used: float | None = None) -> str:
    """One sentence: which constraint binds and by how much."""
    if binding == "hbm":
        return (f"HBM per device: needs {used / 1e9:,.1f} GB, has {machine.hbm_bytes / 1e9:,.1f} GB "
                f"(over by {shortfall / 1e9:,.1f} GB); shard more (tp, pp, zero), recompute, or offload")
    if binding in PLACES:
        return f"{binding} tier per device: over capacity by {shortfall / 1e9:,.1f} GB (or the system has none)"
    if binding == "devices":
        return (f"the parallel degrees use {machine.devices + shortfall:,.0f} devices, the system has "
                f"{machine.devices:,}; make tp x pp x dp x cp equal the devices")
    from .training_memory import GRADS_WITH_OPTIMIZER

    if binding == GRADS_WITH_OPTIMIZER:
        return (f"{binding} (DeepSpeed moves the gradient partitions with the optimizer states); give "
                "--offload-optimizer the tier of --offload-grads")
    return f"{binding}: fails at {shortfall:,.6g}"


def check_feasible(result, machine: Machine) -> None:
    """Raise InfeasibleError (exit 3) naming the binding constraint of a one-plan result."""
    binding = str(np.asarray(result.binding).reshape(-1)[0])
    if binding:
        used = _f(result.hbm_used_bytes)
        raise InfeasibleError("plan is infeasible: " + describe_binding(binding, _f(result.shortfall) or 0.0,
                                                                         machine, used))


def device_roof(machine: Machine) -> dict[str, Any]:
    """The device's roofline: datasheet peak FLOP/s per precision it lists, and HBM bandwidth (the
    datasheet's, and the achievable streaming rate the model uses)."""
    acc = machine.accelerator
    return {"name": acc.name, "peak_flops_per_s": {p: float(v) for p, v in acc.peak_flops.items()},
            "hbm_bytes_per_s": float(acc.hbm_bytes_per_s), "achievable_hbm_bytes_per_s": float(machine.hbm_bytes_per_s)}


def train_report(result: TrainResult, machine: Machine, spec=None, dispatcher: str = "alltoall") -> dict[str, Any]:
    """The estimate of one training plan as a document (SI units); ``dispatcher`` the plan's MoE token
    dispatcher (plan.Dispatcher), for where its exchange's constants come from."""
    times = {k: _f(v) for k, v in result.components.items()}
    ops = {k: {"seconds": _f(v), "bound": "compute" if _b(result.bounds[k]) else "memory",
               "flops": _f(result.operator_flops.get(k)), "bytes": _f(result.operator_bytes.get(k))}
           for k, v in result.operator_times.items()}
    memory = {k: _f(v) for k, v in result.memory.items()}
    tiers = {"hbm": {"used_bytes": _f(result.hbm_used_bytes), "capacity_bytes": machine.hbm_bytes}}
    for t in machine.memory_tiers:
        used = _f(result.tier_bytes.get(t.kind, 0.0)) or 0.0
        entry = tiers.setdefault(t.kind, {"used_bytes": used, "capacity_bytes": 0.0, "name": t.name})
        entry["capacity_bytes"] += t.bytes_per_device
    return {
        "step_time_s": _f(result.step_time_s),
        "step_time_range_s": [_f(result.step_time_low_s), _f(result.step_time_high_s)],
        "constants_from": constants_from(machine, spec, dispatcher=dispatcher),
        "tokens_per_s": _f(result.tokens_per_s), "mfu": _f(result.mfu),
        "hfu": _f(result.hfu), "microbatches": _f(result.num_microbatches),
        "time_components_s": times, "time_on_link_s": {k: _f(v) for k, v in result.link_times.items()},
        "operators_s": ops, "device": device_roof(machine), "memory_per_device_bytes": memory, "memory_tiers": tiers,
        "power_per_device_w": _f(result.power_w), "energy_per_token_j": _f(result.energy_per_token_j),
        "cost_per_hour_usd": _f(result.cost_per_hour_usd),
        "cost_per_million_tokens_usd": _f(result.cost_per_million_tokens_usd), "cost_basis": cost_basis(machine),
        "run": {"time_s": _f(result.run_time_s), "energy_kwh": _f(result.run_energy_kwh),
                "cost_usd": _f(result.run_cost_usd)},
    }


def _per_package(result, machine: Machine) -> dict[str, Any]:
    """Throughput per package where the device is one die of several (CloudMatrix384's 910C: figures
    per NPU are two dies' worth, as Zuo et al. 2025 quote them)."""
    dies = machine.accelerator.dies_per_package
    if dies <= 1:
        return {}
    return {"dies_per_package": dies,
            "prefill_tokens_per_s_per_package": _f(result.prefill_tokens_per_s_per_device * dies),
            "decode_tokens_per_s_per_package": _f(result.decode_tokens_per_s_per_device * dies)}


def serve_report(result: ServeResult, machine: Machine, spec=None, backend: str = "trtllm") -> dict[str, Any]:
    """The serving estimate's document; ``backend``: the serving engine whose GEMM fits priced it."""
    return {
        "ttft_s": _f(result.ttft_s), "tpot_s": _f(result.tpot_s), "ep_per_token_s": _f(result.ep_per_token_s),
        **({"expert_imbalance": {k: _f(v) for k, v in result.expert_imbalance.items()}}
           if result.expert_imbalance else {}),
        "ttft_range_s": [_f(x) for x in result.ttft_range_s], "tpot_range_s": [_f(x) for x in result.tpot_range_s],
        "constants_from": constants_from(machine, spec, serving=True, backend=backend),
        "devices_per_instance": _f(result.devices_per_instance), "max_batch": _f(result.max_batch),
        "prefill_tokens_per_s_per_device": _f(result.prefill_tokens_per_s_per_device),
        "decode_tokens_per_s_per_device": _f(result.decode_tokens_per_s_per_device),
        **_per_package(result, machine),
        "prefill_components_s": {k: _f(v) for k, v in result.prefill_components.items()},
        "decode_components_s": {k: _f(v) for k, v in result.decode_components.items()},
        "operators_s": {
            **{f"{phase} {k}": {"seconds": _f(v), "bound": "compute" if _b(result.bounds[f'{phase} {k}']) else "memory",
                                "flops": _f(work[k][0]), "bytes": _f(work[k][1])}
               for phase, times, work in (("prefill", result.prefill_operator_times, result.prefill_operator_work),
                                          ("decode", result.decode_operator_times, result.decode_operator_work))
               for k, v in times.items()}},
        "device": device_roof(machine),
        "memory_per_device_bytes": {k: _f(v) for k, v in result.memory.items()},
        "memory_tiers": {"hbm": {"used_bytes": _f(result.hbm_used_bytes), "capacity_bytes": machine.hbm_bytes}},
        "precisions": {"weights": result.quant.weight, "activations": result.quant.activation,
                       "kv": result.quant.kv},
        "power_per_device_w": _f(result.power_w), "prefill_power_per_device_w": _f(result.prefill_power_w),
        "clock_share": {"prefill": _f(result.prefill_clock), "decode": _f(result.decode_clock)},
        "energy_per_token_j": _f(result.energy_per_token_j),
        "cost_per_million_tokens_usd": _f(result.cost_per_million_tokens_usd), "cost_basis": cost_basis(machine),
        **({"mixed_steps": {"chunk_prompt_tokens": _f(result.chunk_prompt_tokens),
                            "mixed_step_s": _f(result.mixed_step_s), "ttft_s": _f(result.chunked_ttft_s)}}
           if _f(result.mixed_step_s) > 0 else {}),
    }


HOST_PLACES = ("ddr", "cxl", "ddr+cxl")


def host_placements(spec, machine: Machine, plan, work) -> dict[str, float]:
    """Step time (s) of the same plan with its states in host memory placed each way the system
    allows: all in DDR, all in CXL (the naive extension) and interleaved over both by bandwidth
    (CXL-aware); {} when the plan keeps no state in host memory or the system lacks DDR or CXL."""
    from dataclasses import replace

    from .training import estimate_training

    fields = ("optimizer_place", "grad_place", "param_place")
    kinds = {t.kind for t in machine.memory_tiers}
    if not {"ddr", "cxl"} <= kinds or not any(str(getattr(plan, f)) in HOST_PLACES for f in fields):
        return {}
    out = {}
    for place in HOST_PLACES:
        moved = replace(plan, **{f: place for f in fields if str(getattr(plan, f)) in HOST_PLACES})
        r = estimate_training(spec, machine, moved, work, detail=False)
        out[place] = float(r.step_time_s) if bool(r.feasible) else float("inf")
    return out


def oversubscription(machine: Machine, cap_w: float) -> float:
    """How many more devices a facility's power budget holds when each is provisioned at a power cap
    instead of its TDP, with its share of the node in both: (TDP + node share) / (cap + node share)
    (power oversubscription with capping; Patel et al. 2024, POLCA, arXiv 2308.12908)."""
    share = machine.overhead_w_per_device
    return (machine.tdp_w + share) / (min(cap_w, machine.tdp_w) + share)


def _source(machine: Machine) -> str:
    """Where the GEMM constants come from: fitted on measured kernels, measured large-GEMM
    fractions (datasheet peak x measurement), or the default an unmeasured device takes."""
    sources = {k.source for k in (machine.gemm_kernels or {}).values()}
    return next((s for s in ("fitted", "datasheet", "default") if s in sources), "default")


def constants_from(machine: Machine, spec=None, serving: bool = False, backend: str | None = None,
                   dispatcher: str = "alltoall") -> dict:
    """Where the GEMM, attention and collective constants of an estimate came from, and for an
    MoE ``spec`` those of its expert exchange (serving an MLA model uses the MLA module fit;
    serving's exchange DeepEP's kernel fits, training's the all-to-all of the collectives, or with a
    flex ``dispatcher`` DeepEP's normal kernels, fitted where the device has them). A
    serving estimate on fitted GEMMs also names the engine whose measured GEMM tables they come
    from (``gemm_tables``; ``backend`` the one asked, TensorRT-LLM's where the device has no other)."""
    mla = serving and spec is not None and spec.mla is not None and bool(machine.mla_attention)
    measured = "roofline (decode at one measured kernel's rate)" if serving and machine.decode_attention_fraction \
        else "roofline"
    attention = measured if not machine.attention_kernels else "fitted (MLA on measured modules)" if mla else "fitted"
    found = {"gemm": _source(machine), "attention": attention,
             "collectives": "fitted" if machine.topology.fitted else "datasheet"}
    if serving and machine.engine_kernels:
        found["gemm_tables"] = gemm_tables(machine, backend or "trtllm")
        found["kernel_tables"] = kernel_tables(machine, backend or "trtllm")
    if spec is not None and spec.moe:
        found["expert_exchange"] = _exchange_source(machine.topology) if serving else \
            "all-to-all as collectives (Megatron-Core's dispatcher)" if str(dispatcher) == "alltoall" else \
            f"{dispatcher}, a token across nodes once per node: " + \
            ("fitted (DeepEP normal kernels)" if machine.topology.dispatch_normal else "link model")
        # The routed experts' grouped GEMMs: their own fit on measured MoE layers, else the GEMM kernel.
        found["expert_gemm"] = "fitted (measured MoE layers)" if machine.grouped_kernels else "as the GEMMs"
    caveat = unmeasured_caveat(machine, serving)
    if caveat:
        found["caveat"] = caveat
    return found


def gemm_tables(machine: Machine, backend: str) -> str:
    """The serving engine whose measured GEMM tables price a serving estimate asked of ``backend``,
    and, where the device has no fits of that engine, that it falls back to TensorRT-LLM's."""
    used = machine.for_serving(backend).gemm_backend
    if used == backend:
        return f"{BACKEND_NAMES[used]} kernels"
    return f"{BACKEND_NAMES[used]} kernels: the device has no {BACKEND_NAMES.get(backend, backend)} GEMM fits"


def kernel_tables(machine: Machine, backend: str) -> dict:
    """The serving engine whose measured tables price each kernel family (gemm, attention,
    grouped_gemm) of a serving estimate asked of ``backend``: that engine's where the device has its
    fits of the family, else TensorRT-LLM's."""
    served = machine.for_serving(backend)
    families = dict(served.kernel_backends) or {"gemm": served.gemm_backend}
    return {family: BACKEND_NAMES[families.get(family, "trtllm")] for family in ("gemm", "attention", "grouped_gemm")}


def _exchange_source(topology) -> str:
    """Where serving's expert-exchange constants come from: DeepEP's fitted low-latency (decode) and
    normal (prefill) kernels, each where the device has its fit, else the link model."""
    fitted = [name for name, fit in (("low-latency", topology.dispatch), ("normal", topology.dispatch_normal)) if fit]
    if not fitted:
        return "link model"
    if len(fitted) == 2:
        return "fitted (DeepEP low-latency and normal kernels)"
    return f"fitted (DeepEP {fitted[0]} kernels), " + ("prefill" if fitted[0] == "low-latency" else "decode") \
        + " link model"


def quantization_remark(formats, native: str) -> str | None:
    """The accuracy remark every quantized plan carries: the formats below the model's own."""
    # An fp8 (or int8) model computes in 8 bits as published (DeepSeek-V3's W8A8 fp8 recipe).
    own = (native, "bf16", "fp16", "a16") + (("a8",) if native in ("fp8", "int8") else ())
    lower = sorted({f for f in formats if f not in own})
    if not lower:
        return None
    return (f"quantized: {', '.join(lower)} (the model is published in {native}); check the model's accuracy in "
            "these formats before deploying")


def unmeasured_caveat(machine: Machine, serving: bool = False) -> str | None:
    """For a device without measured GEMM kernels, one sentence of what its numbers rest on and
    what its range does not cover (``serving``: of a serving estimate, whose GEMMs run without the
    training framework factor); None for a device with a fit."""
    if machine.kernels_measured:
        return None
    if serving:
        machine = machine.for_serving()
    kernels = machine.gemm_kernels or {}
    precision = "bf16" if "bf16" in kernels else "fp16" if "fp16" in kernels else next(iter(kernels), None)
    measured = precision is not None and kernels[precision].source == "datasheet"
    gemm = (f"GEMMs run at {float(kernels[precision].compute_fraction):.0%} of the {precision} peak "
            f"({'one large-GEMM measurement' if measured else 'the default fraction for a device without one'}"
            f"{'' if serving else ' times the framework efficiency fitted on NVIDIA A100 runs'}, no shape-aware fit)") \
        if precision else "GEMMs by roofline"
    attention = "attention fitted" if machine.attention_kernels else "attention by roofline" + (
        " (decode at one measured kernel's rate)" if serving and machine.decode_attention_fraction else "")
    collectives = "collectives by the link model" if machine.topology.fitted is None else "collectives fitted"
    return (f"{machine.accelerator.name} has no measured kernels: {gemm}, {attention}, {collectives}; the range "
            f"adds +-{machine.step_error:.1%} of the step (the error measured with the fits removed on NVIDIA "
            "devices) and does not cover another vendor's software stack")


def winner_caveats(answer_system: str, machines: list[Machine], objective: str) -> list[str]:
    """When systems compete, what the winner's lead rests on that the range does not show: constants
    without kernel measurements against a measured rival, and, on cost, one quoted price per system."""
    systems = {m.system.name: m for m in machines}
    if len(systems) < 2:
        return []
    out = []
    answer = systems[answer_system]
    measured = sorted(name for name, m in systems.items() if m.kernels_measured and name != answer_system)
    if not answer.kernels_measured and measured:
        out.append(f"the answer runs on {answer_system}, whose kernels are unmeasured, against measured "
                   f"{', '.join(measured)}: its lead rests on constants no kernel on it has checked")
    if objective == "cost":
        out.append("the cost ranking rests on one quoted price per system (the cost basis below names each); "
                   "--price SYSTEM=USD_PER_DEVICE_HOUR ranks them at yours")
    return out


# A pipeline bubble above this share of the step is worth a line: Narayanan et al. 2021 (Sec. 2.2.2)
# introduce the interleaved schedule for it, and every practiced large pipeline here runs one.
BUBBLE_WORTH_A_HINT = 0.25


def interleave_hint(spec, machine: Machine, plan, work, result: TrainResult) -> str | None:
    """For a plan whose pipeline bubble takes more than BUBBLE_WORTH_A_HINT of the step without
    virtual stages, one line naming the interleave that shortens the step most (Megatron's virtual
    pipeline: the bubble divides by the interleave, Narayanan et al. 2021 Eq. 2) and the step it
    predicts; None otherwise or when no interleave is valid and faster."""
    from dataclasses import replace

    from .training import estimate_training

    step = float(result.step_time_s)
    bubble = float(result.components.get("pipeline bubble", 0.0))
    if int(plan.pp) < 2 or int(plan.interleave) > 1 or not step or bubble / step <= BUBBLE_WORTH_A_HINT:
        return None
    options = []
    for v in (2, 4, 8):
        trial = estimate_training(spec, machine, replace(plan, interleave=v), work)
        if str(trial.binding) == "":
            options.append((float(trial.step_time_s), v))
    if not options or min(options)[0] >= step:
        return None
    faster, v = min(options)
    return (f"the pipeline bubble is {bubble / step:.0%} of the step: --interleave {v} (a virtual pipeline, Narayanan "
            f"et al. 2021 Sec. 2.2.2) predicts {faster:.3g} s instead of {step:.3g} s")
