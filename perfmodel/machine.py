"""A sized system reduced to the floats the cost model needs (SI units, achievable figures).

Built once from the database and passed to every cost function, so the vectorized formulas never
touch pydantic objects. Achievable = datasheet peak x the device's measured fraction
(``calibrations`` in the database, each with its measurement); GEMMs use the device's fitted
kernel model where it has one (perfmodel.kernels), and collectives inside the scale-up domain
its fitted NCCL costs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from perfmodel.hardware_db.errors import SpecError, UnknownNameError, UnsupportedPrecisionError  # noqa: F401
from perfmodel.hardware_db.loader import Database, MemoryTier
from perfmodel.hardware_db.schema import PRECISIONS, Accelerator, System

from .collectives import COLLECTIVES, FittedCollectives, FittedDispatch, Topology
from .constants import ModelConstants
from .kernels import PER_PLAN_FIELDS, AttentionKernel, GemmKernel, sorted_distinct


@dataclass(frozen=True)
class Kernels:
    """A device's compute models at one GEMM efficiency: the large-GEMM rates by precision and the
    GEMM and attention kernels (the Machine fields of the same names)."""

    achievable_flops: dict
    gemm_kernels: dict
    attention_kernels: dict
    decode_attention: dict
    mla_attention: dict
    weight_only_kernels: dict


# Serving engines whose measured GEMM tables a device's fits may come from, as their projects name them.
BACKEND_NAMES = {"trtllm": "TensorRT-LLM", "sglang": "SGLang", "vllm": "vLLM"}


@dataclass(frozen=True)
class EngineKernels:
    """One serving engine's kernels on a device, at the serving fits' own rates: GEMMs by
    precision, their large-GEMM rates, the block-scaled kernels by math precision, the largest
    held-out MAPE of the GEMM fits (the relative error of compute time), the attention kernels
    (prefill by precision, decode by KV precision, MLA by phase) and the routed experts' grouped
    GEMMs by recipe; ``families``: the engine whose tables each family's fits come from (gemm,
    attention, grouped_gemm; TensorRT-LLM's where the engine's were not measured)."""

    gemm_kernels: dict
    achievable_flops: dict
    block_kernels: dict
    gemm_error: float
    attention_kernels: dict | None = None
    decode_attention: dict | None = None
    mla_attention: dict | None = None
    grouped_kernels: dict | None = None
    families: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Machine:
    """One system of ``devices`` accelerators, with achievable rates and the cost inputs."""

    system: System
    accelerator: Accelerator
    devices: int
    topology: Topology
    memory_tiers: tuple[MemoryTier, ...]
    peak_flops: dict[str, float]          # datasheet dense peak by precision
    achievable_flops: dict[str, float]    # large-GEMM achievable by precision
    hbm_bytes: float
    hbm_bytes_per_s: float                # achievable streaming bandwidth
    host_bytes_per_s: float               # device <-> host path, one direction
    tdp_w: float
    idle_w: float
    overhead_w_per_device: float          # host CPUs, NICs, fans: node power beyond the accelerators
    price_usd_per_device: float | None    # capital cost of one device with its share of the node
    cloud_usd_per_hour: float | None
    constants: ModelConstants
    pricing: str = "cloud"                # cost basis: "cloud" (rent per device-hour) or "owned" (TCO)
    price_override: float | None = None   # the user's all-in USD per device-hour (--price), either basis
    unpriced: dict[str, str] | None = None   # why the database has no price, by basis
    scale_up_domain: int = 1              # devices joined by the largest scale-up (or in-package) level
    gemm_kernels: dict[str, GemmKernel] | None = None   # GEMM cost by precision (fitted or datasheet)
    attention_kernels: dict[str, AttentionKernel] | None = None   # prefill, by precision (fitted only)
    decode_attention: dict[str, AttentionKernel] | None = None     # decode, by KV precision (fitted only)
    mla_attention: dict[str, AttentionKernel] | None = None        # MLA core: "prefill", "decode" (fitted only)
    weight_only_kernels: dict[str, GemmKernel] | None = None   # int8 / int4 weights in bf16 GEMMs (fitted only)
    grouped_kernels: dict[str, GemmKernel] | None = None   # routed experts' grouped GEMMs by recipe (fitted only)
    block_kernels: dict[str, GemmKernel] | None = None     # GEMMs with 128-element block scales by math precision (fitted only)
    gemm_error: float = 0.0               # relative error of compute time: the GEMM fit's held-out MAPE
    collective_error: float = 0.0         # relative error of a collective's time: its fit's held-out MAPE
    step_error: float = 0.0               # relative error of the whole step left after the parts' errors
    serving_error: float = 0.0            # held-out error of serving predictions: a serving range's least half-width
    serving_kernels: Kernels | None = None  # the same kernels at the serving fits' own rates (no framework factor)
    decode_attention_fraction: dict[str, float] | None = None   # one measurement, where no decode fit exists
    engine_kernels: dict[str, "EngineKernels"] | None = None   # serving kernels by engine whose tables the device has
    gemm_backend: str = "trtllm"          # the serving engine whose measured GEMM tables the GEMM fits come from
    kernel_backends: tuple[tuple[str, str], ...] = ()   # (family, engine) of each family's fits once served

    def for_serving(self, backend: str | None = None) -> "Machine":
        """The machine as a serving engine runs it: GEMMs and attention at the rates fitted on
        measured serving kernels (aiconfigurator's TensorRT-LLM tables), without
        framework-gemm-efficiency, which was fitted on training steps (Narayanan et al. 2021
        Table 1) and stays in training. With a ``backend`` (trtllm, sglang, vllm) whose fits
        the device has (calibration.yaml ``serving_backends``), its GEMMs, block-scaled GEMMs,
        attention kernels and grouped GEMMs run at that engine's fits, each family where the
        engine's table measured it, else at TensorRT-LLM's (``gemm_backend`` and
        ``kernel_backends`` say which). Idempotent."""
        served = self
        if self.serving_kernels is not None:
            served = replace(self, serving_kernels=None,
                             **{f.name: getattr(self.serving_kernels, f.name) for f in fields(Kernels)})
        own = (served.engine_kernels or {}).get(backend) if backend else None
        if own is None or backend == served.gemm_backend:
            return served
        return replace(served, gemm_kernels=own.gemm_kernels, achievable_flops=own.achievable_flops,
                       block_kernels=own.block_kernels, gemm_error=own.gemm_error, gemm_backend=backend,
                       attention_kernels=own.attention_kernels, decode_attention=own.decode_attention,
                       mla_attention=own.mla_attention, grouped_kernels=own.grouped_kernels,
                       kernel_backends=own.families)

    def interval(self, total, compute, communication, least: float = 0.0):
        """(low, high) of a predicted time ``total`` (s) of which ``compute`` and ``communication``
        are parts: each part +- its family's held-out error, and the whole +- the step error measured
        for the device's kind of constants (framework-fit-error with kernel fits,
        unmeasured-kernels-error without), added (errors taken as fully correlated: a conservative
        range). ``least``: the smallest half-width, as a share of ``total`` (a family's measured
        end-to-end error, e.g. serving_error)."""
        half = np.maximum(compute * self.gemm_error + communication * self.collective_error + total * self.step_error,
                          total * least)
        return np.maximum(total - half, 0.0), total + half

    @property
    def kernels_measured(self) -> bool:
        """Whether the device's GEMMs are priced by a fit on its own measured kernels."""
        return any(k.source == "fitted" for k in (self.gemm_kernels or {}).values())

    def gemm_kernel(self, precision) -> GemmKernel:
        """The GEMM kernel model at ``precision``, a name or an array of PRECISIONS codes (one per
        plan: the parameters become arrays that broadcast with the plan's shapes)."""
        if isinstance(precision, str):
            self.flops(precision)
            return self.gemm_kernels[precision]
        code = np.asarray(precision)
        table = [self.gemm_kernels.get(p) for p in PRECISIONS]
        have = [k for k in table if k is not None]
        if np.ndim(code) == 0 or code.min() == code.max():
            return self.gemm_kernel(PRECISIONS[int(np.ravel(code)[0])])

        def column(field):
            return np.array([getattr(k, field) if k is not None else np.nan for k in table], dtype=float)[code]
        first = have[0]
        return GemmKernel(peak=column("peak"), bandwidth=first.bandwidth, compute_fraction=column("compute_fraction"),
                          memory_fraction=column("memory_fraction"), launch_s=column("launch_s"),
                          sharpness=column("sharpness"), tile_overhead=column("tile_overhead"),
                          units=first.units, cast=column("cast"), cast_launch_s=column("cast_launch_s"),
                          source=first.source)

    def serving_kernel(self, quant, block: bool = False) -> GemmKernel:
        """The weight GEMMs' kernel for a serving scheme: the fitted weight-only kernel for int8 or
        int4 weights over bf16 math (its dequantization cost measured), else the kernel at the
        scheme's GEMM precision. A width without its own fit keeps the bf16 kernel: one
        framework's int8 kernel says nothing of another's int4 one.

        An 8-bit GEMM of a model quantized per tensor runs as the fp8 fit measured it, with its
        activation quantization (TensorRT-LLM's fp8 Linear: amax and quantize kernels before the
        GEMM; without them the fit ran 0.52x the measured H100 rows at M <= 16). A checkpoint
        released in fp8 with 128-element weight blocks (``block``) runs the block-scaled fit
        (its per-token-group quantization measured with it) where the device has one, else the
        per-tensor kernel without its casts."""
        fitted = (self.weight_only_kernels or {}).get(quant.weight) if quant.activation == "a16" else None
        if block and fitted is None and quant.gemm_precision in (self.block_kernels or {}):
            return self.block_kernels[quant.gemm_precision]
        kernel = fitted or self.gemm_kernel(quant.gemm_precision)
        return kernel.fused() if block else kernel

    def grouped_kernel(self, precision, block: bool = False, weight: str | None = None,
                       in_framework: bool = False) -> GemmKernel | None:
        """The routed experts' grouped-GEMM kernel fitted on measured MoE layers at ``precision``
        (a name, or PRECISIONS codes, one per plan), or None (the routed experts then run on the
        GEMM kernel, as before the fit). fp8 takes the block-scaled fit when ``block`` (a model
        whose checkpoint is fp8 with 128 x 128 weight blocks) and the device has one, else the
        per-tensor one; bf16 math over int4 / fp4 ``weight`` takes the 4-bit weight-only fit.
        ``in_framework``: the compute rate scaled by framework-gemm-efficiency, as training's
        GEMMs are (the fit is on serving kernels, which that factor does not describe)."""
        fits = self.grouped_kernels or {}
        if not fits:
            return None
        if not isinstance(precision, str):
            codes = sorted_distinct(precision)[0]
            if len(codes) != 1:
                return self._grouped_per_plan(np.asarray(precision), block, weight, in_framework)
            precision = PRECISIONS[int(codes[0])]
        if weight in ("int4", "fp4") and precision == self.math16:
            key = "w4a16"
        elif weight in ("int8",) and precision == self.math16:
            return None                           # int8 weight-only experts: not measured
        else:
            key = "fp8_block" if precision == "fp8" and block and "fp8_block" in fits else precision
        kernel = fits.get(key)
        if kernel is None or not in_framework:
            return kernel
        return replace(kernel, compute_fraction=kernel.compute_fraction * self.constants.framework_gemm_efficiency)

    def _grouped_per_plan(self, code: np.ndarray, block: bool, weight: str | None,
                          in_framework: bool) -> GemmKernel | None:
        """``grouped_kernel`` of plans of several precisions (PRECISIONS codes, one per plan): each
        plan's own fit, as it would get alone; a precision without one takes the GEMM kernel its
        routed experts would otherwise run on (tiled over the fit's SM count). None when no plan's
        precision has a fit."""
        used = [int(c) for c in sorted_distinct(code)[0]]
        own = {c: self.grouped_kernel(PRECISIONS[c], block, weight, in_framework) for c in used}
        if all(k is None for k in own.values()):
            return None
        table = {c: k if k is not None else self.gemm_kernel(PRECISIONS[c]) for c, k in own.items()}
        first = next(k for k in own.values() if k is not None)
        index = np.zeros(len(PRECISIONS), dtype=int)
        index[used] = np.arange(len(used))

        def column(name: str) -> np.ndarray:
            return np.array([float(getattr(table[c], name)) for c in used])[index[code]]
        return replace(first, **{name: column(name) for name in PER_PLAN_FIELDS})

    def attention_kernel(self, precision: str, decode: bool = False, latent: bool = False) -> AttentionKernel | None:
        """The fitted attention kernel for prefill at attention ``precision``, or for decode over
        a KV cache of ``precision`` (that precision's fit or its nearest fitted one); for MLA
        (``latent``) the fit on MLA modules first; None without a fit (the attention core is then
        a roofline)."""
        mla = (self.mla_attention or {}).get("decode" if decode else "prefill")
        if latent and mla is not None:
            return mla
        fits = (self.decode_attention if decode else self.attention_kernels) or {}
        for p in (precision, *NEAREST.get(precision, ("bf16",))):
            if p in fits:
                return fits[p]
        return None

    def flops(self, precision: str) -> float:
        """Achievable FLOP/s at ``precision`` (an unsupported precision is an error)."""
        if precision not in self.achievable_flops:
            self.accelerator.peak(precision)  # raises UnsupportedPrecisionError with the listed ones
        return self.achievable_flops[precision]

    def flops_table(self) -> np.ndarray:
        """Achievable FLOP/s indexed by position in PRECISIONS (NaN where unsupported)."""
        return np.array([self.achievable_flops.get(p, np.nan) for p in PRECISIONS])

    def supports(self, precision: str) -> bool:
        return precision in self.achievable_flops

    @property
    def math16(self) -> str:
        """The 16-bit format this device computes in: bf16, or fp16 where it has no bf16 (Volta)."""
        return "fp16" if not self.supports("bf16") and self.supports("fp16") else "bf16"

    @property
    def hbm_reserve_bytes(self) -> float:
        """HBM a plan may not use (bytes): the runtime's context, allocator fragmentation and
        framework buffers, the constant ``hbm-reserve-fraction`` of the device's HBM."""
        return self.constants.hbm_reserve_fraction * self.hbm_bytes

    def decode_attention_flops(self, precision: str) -> float:
        """Achievable FLOP/s of a roofline decode attention core (a device without decode attention
        fits): the measured decode kernel's share of the peak where the calibration gives one
        (decode_attention_fraction), else the large-GEMM rate."""
        fraction = (self.decode_attention_fraction or {}).get(precision)
        return fraction * self.peak_flops[precision] if fraction else self.flops(precision)

    @property
    def overlaps_tp_communication(self) -> bool:
        """Whether TP all-gathers and reduce-scatters can run under the GEMMs (Megatron's
        --tp-comm-overlap): Transformer Engine's userbuffers, which it builds for NVIDIA GPUs
        (CUDA IPC / NVLink multicast; Transformer Engine docs, 'Overlapping communication with
        GEMM'). Elsewhere the collectives block, as in the frameworks' default."""
        return self.accelerator.vendor == "NVIDIA"

    @property
    def runs_flex_dispatcher(self) -> bool:
        """Whether Megatron-Core's flex token dispatcher backends (DeepEP, HybridEP) run here: CUDA
        libraries over NVSHMEM and NVLink (deepseek-ai/DeepEP README: Hopper GPUs; NVIDIA's HybridEP
        for Hopper and Blackwell), so NVIDIA GPUs only."""
        return self.accelerator.vendor == "NVIDIA"

    def _sm_share(self, sms: float) -> float:
        """``sms`` SMs (CUs) as a share of the device's, at most half; 0 without a unit count."""
        units = float(self.accelerator.compute_units or 0)
        return min(sms, units / 2.0) / units if units > 0 else 0.0

    @property
    def exchange_sm_share(self) -> float:
        """Share of the SMs the MoE exchange kernels hold while they overlap compute (``exchange-sms``)."""
        return self._sm_share(self.constants.exchange_sms)

    @property
    def tp_overlap_sm_share(self) -> float:
        """Share of the SMs a bulk TP-communication overlap (Transformer Engine's userbuffers) holds
        while its transfer runs (``tp-overlap-bulk-sms``)."""
        return self._sm_share(self.constants.tp_overlap_bulk_sms)

    @property
    def collective_sm_share(self) -> float:
        """Share of the SMs an NCCL collective or ring transfer holds while it runs beside compute:
        the ZeRO-3 gathers and scatters, the data-parallel reduction, the CP ring (``collective-sms``)."""
        return self._sm_share(self.constants.collective_sms)

    def tier(self, kind_or_name: str) -> MemoryTier:
        """A memory tier below HBM by its kind (ddr, cxl, nvme, pooled) or memory name."""
        for t in self.memory_tiers:
            if kind_or_name in (t.kind, t.name):
                return t
        have = ", ".join(f"{t.kind} ({t.name})" for t in self.memory_tiers) or "none"
        raise SpecError(f"{self.system.name} has no '{kind_or_name}' memory tier; it has {have}")


PRICING = ("cloud", "owned")


MAX_DEVICES = 1_000_000  # an input bound, not a figure: several times any cluster announced by 2026


def build_machine(db: Database, system_name: str, devices: int | None = None, pricing: str = "cloud",
                  prices: dict[str, float] | None = None) -> Machine:
    """The system ``system_name`` sized to ``devices`` (default: one node), resolved for the cost
    model, priced on the ``pricing`` basis (``prices``: the user's USD per device-hour by system)."""
    if pricing not in PRICING:
        raise UnknownNameError("--pricing value", pricing, PRICING)
    base = db.system(system_name)
    per_node = base.devices_per_node
    if devices is None:
        devices = per_node
    if not isinstance(devices, (int, np.integer)) or devices < 1:
        raise SpecError(f"--devices needs a positive integer, has {devices!r}")
    if devices > MAX_DEVICES:
        raise SpecError(f"--devices needs at most {MAX_DEVICES:,}, has {devices:,}")
    nodes = -(-int(devices) // per_node)
    system = base.scaled(nodes)
    acc = db.accelerator(system.accelerator)
    cal = db.calibration(acc.name)
    levels = db.levels(system)
    fractions = []
    domain = 1
    for level in levels:
        kind = db.link(level.link).kind
        fractions.append(cal.scale_out_fraction if kind == "scale-out" else cal.scale_up_fraction)
        if kind in ("scale-up", "package"):
            domain = max(domain, min(level.group_size, int(devices)))
    sizes = np.array([min(lv.group_size, devices) for lv in levels], dtype=float)
    sizes[-1] = max(devices, 1)
    kinds = [db.link(level.link).kind for level in levels]
    fit = cal.collectives
    constants = ModelConstants.of({name: c.value for name, c in db.constants.items()})
    topology = Topology(
        names=tuple(lv.name for lv in levels), sizes=sizes,
        bw=np.array([lv.bytes_per_s * (f or 1.0) for lv, f in zip(levels, fractions)]),
        lat=np.array([lv.latency_s for lv in levels]),
        # Measured collective costs (calibration.yaml, fitted by `perfmodel calibrate collectives`)
        # replace the link model inside the scale-up domain they were measured in.
        fitted=FittedCollectives(
            link=fit.link_bytes_per_s, hop=fit.hop_s,
            ll_launch={op: p.ll_launch_s for op, p in fit.ops.items()},
            ll_fraction={op: p.ll_fraction for op, p in fit.ops.items()},
            launch={op: p.launch_s for op, p in fit.ops.items()},
            fraction={op: p.fraction for op, p in fit.ops.items()})
        if fit is not None and "scale-up" in kinds and len(fit.ops) == len(COLLECTIVES) else None,
        fitted_level=kinds.index("scale-up") if "scale-up" in kinds else 0,
        launch=constants.unfitted_collective_launch_us * 1e-6,
        link_bw=np.array([lv.bytes_per_s for lv in levels]), kinds=tuple(kinds),
        dispatch=fitted_dispatch(cal.dispatch), dispatch_normal=fitted_dispatch(cal.dispatch and cal.dispatch.normal))
    default = db.calibration_default(acc.vendor)
    # Large-GEMM microbenchmarks overstate what GEMMs reach inside a framework's step (launch
    # gaps, shapes, power capping): one factor, fitted on Narayanan et al. 2021 Table 1 only.
    # Serving runs at the serving kernel fits' own rates (Machine.for_serving).
    launch = constants.unfitted_kernel_launch_us * 1e-6
    four = constants.four_bit_gemm_speedup
    training = device_kernels(acc, cal, default, constants.framework_gemm_efficiency, launch, four)
    serving = device_kernels(acc, cal, default, 1.0, launch, four)
    grouped = grouped_kernels(acc, cal.grouped_gemm)
    block = {p: gemm_kernel(acc.peak_flops[p], acc.hbm_bytes_per_s, cal, default, p, 1.0, fit=f)
             for p, f in cal.block_scaled.items() if p in acc.peak_flops}
    backends = serving_engine_kernels(acc, cal, default, launch, serving, block, grouped, four)
    host_link = db.link(acc.host_link).bytes_per_s if acc.host_link else 0.0
    idle = acc.idle_w if acc.idle_w is not None else acc.tdp_w * constants.idle_power_fraction
    overhead = (system.node_overhead_w or 0.0) / per_node
    if system.node_price_usd:
        price = system.node_price_usd / per_node
    elif acc.price_usd:
        price = acc.price_usd * constants.server_price_multiplier
    else:
        price = None
    return Machine(
        system=system, accelerator=acc, devices=int(devices), topology=topology,
        memory_tiers=db.memory_tiers(system, int(devices)), peak_flops=dict(acc.peak_flops),
        hbm_bytes=acc.hbm_bytes, hbm_bytes_per_s=acc.hbm_bytes_per_s * (cal.hbm_fraction or 1.0),
        host_bytes_per_s=host_link, tdp_w=acc.tdp_w, idle_w=idle, overhead_w_per_device=overhead,
        price_usd_per_device=price, cloud_usd_per_hour=acc.cloud_usd_per_hour, constants=constants,
        pricing=pricing, price_override={k.lower(): v for k, v in (prices or {}).items()}.get(system.name.lower()),
        unpriced=dict(system.unpriced),
        scale_up_domain=domain, **{f.name: getattr(training, f.name) for f in fields(Kernels)},
        serving_kernels=serving, grouped_kernels=grouped, block_kernels=block, engine_kernels=backends,
        decode_attention_fraction=dict(cal.decode_attention_fraction),
        gemm_error=max([f.held_out_mape for f in cal.gemm.values()] or [constants.unfitted_gemm_error]),
        step_error=(constants.framework_fit_error if cal.gemm else constants.unmeasured_kernels_error),
        serving_error=(constants.serving_error if cal.gemm else constants.unmeasured_serving_error),
        # Communication is +- the larger of the NCCL fit's and the expert-exchange fits' errors.
        collective_error=max([constants.unfitted_collective_error]
                             + ([float(np.mean(list(fit.held_out_mape.values())))] if fit and fit.held_out_mape else [])
                             + ([cal.dispatch.held_out_mape] if cal.dispatch else [])
                             + ([cal.dispatch.normal.held_out_mape] if cal.dispatch and cal.dispatch.normal else [])))


def serving_engine_kernels(acc, cal, default, launch_s: float, serving: Kernels, block: dict,
                          grouped: dict | None = None, four_bit_speedup: float = 1.0) -> dict:
    """Serving kernels by engine: TensorRT-LLM's (the entry's ``gemm``, ``block_scaled``,
    ``attention`` and ``grouped_gemm`` fits: ``serving``, ``block`` and ``grouped``) and each
    engine's of ``serving_backends`` (a family, precision or phase it did not measure keeps
    TensorRT-LLM's fit); empty without GEMM fits."""
    if not cal.gemm:
        return {}
    grouped = grouped or {}
    trtllm = EngineKernels(serving.gemm_kernels, serving.achievable_flops, block,
                          max(f.held_out_mape for f in cal.gemm.values()), serving.attention_kernels,
                          serving.decode_attention, serving.mla_attention, grouped)
    out = {"trtllm": trtllm}
    for name, fits in cal.serving_backends.items():
        own = cal.model_copy(update={"gemm": {**cal.gemm, **fits.gemm},
                                     "attention": merged_attention(cal.attention, fits.attention)})
        kernels = device_kernels(acc, own, default, 1.0, launch_s, four_bit_speedup)
        blocks = {**block, **{p: gemm_kernel(acc.peak_flops[p], acc.hbm_bytes_per_s, own, default, p, 1.0, fit=f)
                              for p, f in fits.block_scaled.items() if p in acc.peak_flops}}
        families = (("gemm", name if fits.gemm or fits.block_scaled else "trtllm"),
                    ("attention", name if fits.attention is not None else "trtllm"),
                    ("grouped_gemm", name if fits.grouped_gemm else "trtllm"))
        out[name] = EngineKernels(kernels.gemm_kernels, kernels.achievable_flops, blocks,
                                 max(f.held_out_mape for f in own.gemm.values()), kernels.attention_kernels,
                                 kernels.decode_attention, kernels.mla_attention,
                                 {**grouped, **grouped_kernels(acc, fits.grouped_gemm)}, families)
    return out


def merged_attention(base, engine):
    """An entry's attention fits (``base``, TensorRT-LLM's) with an engine's prefill, decode and MLA
    fits replacing those of the same precision or phase; ``base`` without the engine's."""
    if engine is None:
        return base
    if base is None:
        return engine
    return base.model_copy(update={part: {**getattr(base, part), **getattr(engine, part)}
                                   for part in ("prefill", "decode", "mla")})


def grouped_kernels(acc, fits: dict) -> dict:
    """The grouped-GEMM kernels of calibration.yaml ``grouped_gemm`` fits by recipe, at the peak of
    each recipe's math precision (a recipe the device has no peak for is left out)."""
    sixteen = acc.math16
    return {p: grouped_kernel(acc.peak_flops[GROUPED_MATH[p] or sixteen], acc.hbm_bytes_per_s, f)
            for p, f in fits.items() if (GROUPED_MATH[p] or sixteen) in acc.peak_flops}


def device_kernels(acc, cal, default, in_framework: float, launch_s: float, four_bit_speedup: float = 1.0) -> Kernels:
    """The device's GEMM and attention kernels and large-GEMM rates with their compute rates
    scaled by ``in_framework`` (framework-gemm-efficiency for training, 1 for serving);
    ``launch_s``: the fixed cost of a GEMM on a device without GEMM fits; ``four_bit_speedup``:
    a 4-bit GEMM without a fit of its own over the 16-bit kernel (four_bit_kernel)."""
    kernels = {p: gemm_kernel(acc.peak_flops[p], acc.hbm_bytes_per_s, cal, default, p, in_framework, launch_s)
               for p in acc.peak_flops}
    prefill, decode, mla = attention_kernels(acc, cal, in_framework)
    sixteen = acc.math16
    if sixteen in kernels:
        kernels.update({p: four_bit_kernel(kernels[sixteen], acc.peak_flops[sixteen], acc.peak_flops[p],
                                           four_bit_speedup)
                        for p in FOUR_BIT if p in kernels and p not in cal.gemm})
    weight_only = {w: gemm_kernel(acc.peak_flops[sixteen], acc.hbm_bytes_per_s, cal, default, sixteen, in_framework,
                                  launch_s, fit=f) for w, f in cal.weight_only.items()}
    # Full-tile GEMM rate: the fitted kernel's, else the measured large-GEMM fraction's.
    achievable = {p: acc.peak_flops[p] * k.compute_fraction for p, k in kernels.items()}
    return Kernels(achievable_flops=achievable, gemm_kernels=kernels, attention_kernels=prefill,
                   decode_attention=decode, mla_attention=mla, weight_only_kernels=weight_only)


# Precisions whose GEMMs read 4-bit inputs: without a fit of their own they take four_bit_kernel, never
# the nearest 8-bit fit's fraction of their own peak.
FOUR_BIT = ("int4", "fp4")


def four_bit_kernel(sixteen: GemmKernel, peak16: float, peak: float, speedup: float) -> GemmKernel:
    """A 4-bit GEMM where no 4-bit kernel was measured: the device's 16-bit kernel (its launch,
    tiles and memory terms) computing ``speedup`` times as fast (four-bit-gemm-speedup, COMET's
    kernel-level measurement), at most at the 4-bit peak times the 16-bit kernel's fraction."""
    fraction = min(sixteen.compute_fraction * speedup * peak16 / peak, sixteen.compute_fraction)
    return replace(sixteen, peak=peak, compute_fraction=fraction)


NEAREST = {"fp16": ("bf16",), "bf16": ("fp16",), "int8": ("fp8", "bf16"), "fp8": ("int8", "bf16"),
           "fp4": ("fp8", "int8", "bf16"), "int4": ("int8", "fp8", "bf16"), "tf32": ("bf16",),
           "fp32": ("tf32", "bf16"), "fp64": ("fp32", "bf16")}


def matmul_fraction(own: dict, default: dict, precision: str) -> float:
    """Achievable fraction of the dense peak at ``precision``: the device's own measurement, else
    its nearest measured precision (fp16 <- bf16, int8 <- fp8, ...), else the default's for the
    precision or its nearest. Always a fraction of this precision's own peak, never another peak."""
    for table in (own, default):
        for p in (precision, *NEAREST.get(precision, ("bf16",))):
            if p in table:
                return table[p]
    raise UnsupportedPrecisionError(f"no matmul_fraction for {precision} in the calibration data")


# The math precision of each grouped-GEMM recipe (calibration.yaml ``grouped_gemm`` keys); None:
# the device's 16-bit format.
GROUPED_MATH = {"bf16": None, "fp8": "fp8", "fp8_block": "fp8", "w4a16": None, "fp4": "fp4"}


def grouped_kernel(peak: float, hbm_bytes_per_s: float, fit) -> GemmKernel:
    """The grouped-GEMM kernel of a fit on measured MoE layers (calibration.yaml ``grouped_gemm``)
    at the ``peak`` of its math precision: the GEMM kernel's terms, its fixed cost per group, and
    its passes over the inputs (perfmodel.kernels)."""
    return GemmKernel(peak=peak, bandwidth=hbm_bytes_per_s, compute_fraction=fit.compute_fraction,
                      memory_fraction=fit.memory_fraction, launch_s=fit.launch_s, sharpness=fit.sharpness,
                      tile_overhead=fit.tile_overhead, units=fit.units, cast=fit.input_passes,
                      group_launch_s=fit.group_launch_s, source="fitted")


def fitted_dispatch(fit) -> FittedDispatch | None:
    """A measured expert dispatch / combine (calibration.yaml ``dispatch``, the low-latency kernels,
    or its ``normal`` sub-entry), or None."""
    if fit is None:
        return None
    return FittedDispatch(launch=dict(fit.launch_s), remote=fit.remote_s, up_fraction=dict(fit.scale_up_fraction),
                          out_fraction=dict(fit.scale_out_fraction) if fit.scale_out_fraction else None)


def attention_kernels(acc, cal, in_framework: float) -> tuple[dict, dict, dict]:
    """(prefill kernels by precision, decode kernels by KV precision, MLA cores by phase) fitted on
    measured attention kernels (calibration.yaml ``attention``); the compute rate scaled by
    ``in_framework`` like the GEMMs'."""
    fits = cal.attention
    if fits is None:
        return {}, {}, {}

    def kernel(fit, precision):
        return AttentionKernel(peak=acc.peak_flops[precision], bandwidth=acc.hbm_bytes_per_s,
                               compute_fraction=fit.compute_fraction * in_framework,
                               memory_fraction=fit.memory_fraction, launch_s=fit.launch_s, tile_s=fit.tile_s,
                               sharpness=fit.sharpness, saturation=fit.saturation, units=fit.units)
    prefill = {p: kernel(f, p) for p, f in fits.prefill.items() if p in acc.peak_flops}
    sixteen = acc.math16
    mla = {phase: replace(kernel(f, sixteen), latent=True) for phase, f in fits.mla.items()}
    return prefill, {p: kernel(f, sixteen) for p, f in fits.decode.items()}, mla


def gemm_kernel(peak: float, hbm_bytes_per_s: float, cal, default, precision: str, in_framework: float,
                launch_s: float = 0.0, fit=None) -> GemmKernel:
    """The GEMM kernel model of a device at ``precision``: fitted on measured GEMMs at this
    precision or its nearest fitted one (calibration.yaml ``gemm``), else the plain roofline at
    the measured large-GEMM and HBM fractions plus ``launch_s`` per kernel. ``in_framework``
    scales the compute rate either way (framework-gemm-efficiency, fitted on Narayanan et al.
    2021 Table 1). A given ``fit`` (a weight-only kernel's) is used as is."""
    for p in (precision, *NEAREST.get(precision, ("bf16",))):
        fit = fit or cal.gemm.get(p)
        if fit is not None:
            return GemmKernel(peak=peak, bandwidth=hbm_bytes_per_s, compute_fraction=fit.compute_fraction * in_framework,
                              memory_fraction=fit.memory_fraction, launch_s=fit.launch_s, sharpness=fit.sharpness,
                              tile_overhead=fit.tile_overhead, units=fit.units, cast=float(fit.cast),
                              cast_launch_s=fit.cast_launch_s, source="fitted")
    measured = any(p in cal.matmul_fraction for p in (precision, *NEAREST.get(precision, ("bf16",))))
    return GemmKernel(peak=peak, bandwidth=hbm_bytes_per_s,
                      compute_fraction=matmul_fraction(cal.matmul_fraction, default.matmul_fraction, precision)
                      * in_framework, memory_fraction=cal.hbm_fraction or 1.0, launch_s=launch_s,
                      source="datasheet" if measured else "default")
