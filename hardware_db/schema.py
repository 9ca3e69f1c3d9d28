"""Typed, frozen schema of the hardware database.

YAML keys carry their unit (``hbm_gb``, ``hbm_tb_per_s``, ``dense_tflops``, ``tdp_w``,
``gbit_per_s_per_direction``); each value is range-checked in that unit, so that the usual slips
(bits for bytes, GB/s for TB/s, a 2:4-sparse figure for a dense one) are caught with a hint, and is
converted once, here, to SI base units (bytes, bytes/s, FLOP/s, seconds, watts, dollars). Decimal
prefixes throughout (GB = 1e9 bytes), as vendors' datasheets use them, except HBM capacity: DRAM
dies hold a power of two of bits, and an "80 GB" HBM device holds 80 GiB (2^30 bytes each), as the
driver reports it (NVML: H100 80GB 81,559 MiB, A100 80GB 81,920 MiB, H200 141GB 143,771 MiB;
Modal, "Why does an NVIDIA H100 80GB card offer 85.52 GB?", thundergolfer.com/blog/nvidia-gpu-memory-capacity).

Every entry lists its ``sources``. A figure that has none is not data; it belongs with the named
calibration constants.

Validated with the context ``SI`` (``Model.model_validate(data, context=SI)``), values are taken as
already converted (an entry's ``model_dump(by_alias=True)``, changed by a what-if of
``hardware_db.overrides``): each is range-checked in its YAML unit and kept exactly as given.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from .errors import SpecError, UnsupportedPrecisionError

# Precisions a datasheet may list, widest first. A device supports exactly the ones it lists.
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4", "int4")
Precision = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4", "int4"]

# Bytes per element of each precision (tf32 is stored as fp32).
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp64": 8.0, "fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0,
    "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5,
}

GIGA, TERA, GIBI = 1e9, 1e12, 2.0 ** 30
SI = {"si": True}   # validation context: the values are in SI units already (see the module docstring)


def _in_si(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("si"))


def quantity(lo: float, hi: float, unit: str, scale: float, slip: str = "") -> AfterValidator:
    """Check a YAML value lies in the plausible range [lo, hi] of its unit, then scale it to SI
    (under the context ``SI``: check the SI value's range in the YAML unit, and keep it).

    ``slip`` names the likely mistake when the value is out of range (shown as the hint).
    """

    def check(value: float, info: ValidationInfo) -> float:
        si = _in_si(info)
        shown = value / scale if si else value
        if not math.isfinite(value) or not lo <= shown <= hi:
            hint = f"; {slip}" if slip and math.isfinite(value) and not si else ""
            raise ValueError(f"needs {lo:g} to {hi:g} {unit}, has {shown:g}{hint}")
        return value if si else value * scale

    check.scale = scale   # how hardware_db.writer converts an SI value back to the key's unit
    return AfterValidator(check)


# Quantities as written in YAML, with their plausible ranges.
HbmGB = Annotated[float, quantity(1, 4096, "GB", GIBI, "is it in MB or TB?")]     # binary: see the module docstring
HbmTBps = Annotated[float, quantity(0.05, 50, "TB/s", TERA, "is it in GB/s?")]
SramMB = Annotated[float, quantity(0.1, 4096, "MB", 1e6)]
Watts = Annotated[float, quantity(1, 200_000, "W", 1.0, "is it in kW?")]
Dollars = Annotated[float, quantity(1, 1e9, "USD", 1.0)]
DollarsPerHour = Annotated[float, quantity(0.01, 10_000, "USD/h", 1.0)]
LinkGBps = Annotated[float, quantity(0.1, 10_000, "GB/s per direction", GIGA,
                                     "is it in Gbit/s? then use the gbit_per_s_per_direction key")]
LinkGbitps = Annotated[float, quantity(1, 20_000, "Gbit/s per direction", GIGA / 8,
                                       "is it in GB/s? then use the gb_per_s_per_direction key")]
LatencyUs = Annotated[float, quantity(0, 10_000, "us", 1e-6, "is it in ns?")]
LatencyNs = Annotated[float, quantity(1, 10_000_000, "ns", 1e-9, "is it in us?")]
MemGBps = Annotated[float, quantity(0.1, 10_000, "GB/s", GIGA, "is it in Gbit/s or MB/s?")]
CapacityGB = Annotated[float, quantity(1, 10_000_000, "GB", GIGA, "is it in TB?")]
Sources = Annotated[tuple[str, ...], Field(min_length=1)]
Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)]


# defer_build: a model's validator is built on first validation, not at import; a run served from
# the validated-database cache (hardware_db/cache.py) never builds one.
class Entry(BaseModel):
    """Fields every database entry has: a lowercase name, a display name and its sources."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: Name
    display_name: str
    aliases: tuple[Name, ...] = ()
    sources: Sources
    notes: str = ""


def _check_dense_peaks(peaks: dict[str, float], info: ValidationInfo) -> dict[str, float]:
    """Validate dense peak TFLOP/s by precision and convert to FLOP/s.

    Halving the operand width at most doubles the tensor-core rate on every device we know
    (NVIDIA Hopper/Blackwell, AMD CDNA2/3, Ascend DaVinci), so a value more than 2x the next wider
    precision is almost surely the 2:4-sparse figure that datasheets print in their headlines.
    Under the context ``SI`` (a what-if's peaks, FLOP/s, hypothetical by design, not a datasheet's
    transcription) only the range is checked, and the peaks are kept.
    """
    si = _in_si(info)
    for precision, value in peaks.items():
        shown = value / TERA if si else value
        if not math.isfinite(value) or not 0.01 <= shown <= 40_000:
            raise ValueError(f"dense_tflops.{precision} needs 0.01 to 40000 TFLOP/s, has {shown:g}")
    if si:
        return dict(peaks)
    narrower = {"fp8": ("bf16", "fp16"), "int8": ("bf16", "fp16"), "fp4": ("fp8", "int8"),
                "int4": ("int8", "fp8"), "bf16": ("tf32",), "fp16": ("tf32",)}
    for precision, wider in narrower.items():
        for w in wider:
            if precision in peaks and w in peaks and peaks[precision] > 2.05 * peaks[w]:
                raise ValueError(
                    f"dense_tflops.{precision} = {peaks[precision]:g} is more than 2x "
                    f"{w} = {peaks[w]:g}; is it the 2:4 sparse figure? list dense peaks only")
    for a, b in (("bf16", "fp16"), ("fp16", "bf16")):
        if a in peaks and b in peaks and peaks[a] > 1.01 * peaks[b]:
            raise ValueError(f"dense_tflops.{a} = {peaks[a]:g} differs from {b} = {peaks[b]:g}")
    return {p: v * TERA for p, v in peaks.items()}


_check_dense_peaks.scale = TERA   # as quantity's: hardware_db.writer's way back to TFLOP/s
DensePeaks = Annotated[dict[Precision, float], AfterValidator(_check_dense_peaks)]


class Compute(Entry):
    """What accelerators and CPUs share: dense peaks by precision, power and price."""

    vendor: str
    peak_flops: DensePeaks = Field(alias="dense_tflops")
    tdp_w: Watts
    idle_w: Watts | None = None
    price_usd: Dollars | None = None
    cloud_usd_per_hour: DollarsPerHour | None = None

    @model_validator(mode="after")
    def _idle_below_tdp(self):
        if self.idle_w is not None and self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w needs to be below tdp_w = {self.tdp_w:g}, has {self.idle_w:g}")
        return self

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s at ``precision``; an unlisted precision is unsupported, never derived."""
        try:
            return self.peak_flops[precision]  # type: ignore[index]
        except KeyError:
            listed = ", ".join(p for p in PRECISIONS if p in self.peak_flops)
            raise UnsupportedPrecisionError(
                f"{self.name} does not support {precision}: its datasheet lists {listed}") from None

    def supports(self, precision: str) -> bool:
        return precision in self.peak_flops

    @property
    def math16(self) -> str:
        """The 16-bit format the device computes in: bf16, or fp16 where it lists no bf16 (Volta)."""
        return "bf16" if "bf16" in self.peak_flops else "fp16"


class Accelerator(Compute):
    """One accelerator (a GPU, a GCD, an NPU) as the unit that runs one rank."""

    kind: Literal["accelerator"] = "accelerator"
    hbm_bytes: HbmGB = Field(alias="hbm_gb")
    hbm_bytes_per_s: HbmTBps = Field(alias="hbm_tb_per_s")
    sram_bytes: SramMB = Field(alias="l2_mb")
    scale_up_bytes_per_s: LinkGBps = Field(alias="scale_up_gb_per_s_per_direction")
    nic_bytes_per_s: LinkGbitps | None = Field(None, alias="nic_gbit_per_s_per_direction")
    host_link: Name | None = None
    compute_units: Annotated[int, Field(ge=1, le=100_000)] | None = None   # SMs / CUs / cube cores GEMM tiles spread over
    # Devices one package holds, when the device is a die of a multi-die package (Ascend 910C: 2);
    # serving figures are then also given per package, as vendors and papers quote them.
    dies_per_package: Annotated[int, Field(ge=1, le=16)] = 1
    # Same silicon as another entry whose measured kernels apply (a variant with less HBM, or with
    # slower links): its calibration is used when this entry has none of its own, without the
    # collective measurements when the scale-up links differ.
    calibration_from: Name | None = None

    def ridge_point(self, precision: str) -> float:
        """FLOP per byte of HBM traffic above which a kernel is compute bound (Williams et al. 2009)."""
        return self.peak(precision) / self.hbm_bytes_per_s


class Cpu(Compute):
    """One CPU socket (host of the accelerators, or CPU-side optimizer step)."""

    kind: Literal["cpu"] = "cpu"
    cores: Annotated[int, Field(ge=1, le=1024)]
    memory_bytes_per_s: MemGBps = Field(alias="memory_gb_per_s")


class Memory(Entry):
    """A memory tier below HBM: local DDR, a CXL expander card, an NVMe drive or a pooled memory."""

    kind: Literal["ddr", "cxl", "nvme", "pooled"]
    capacity_bytes: CapacityGB = Field(alias="capacity_gb")
    read_bytes_per_s: MemGBps = Field(alias="read_gb_per_s")
    write_bytes_per_s: MemGBps = Field(alias="write_gb_per_s")
    latency_s: LatencyNs = Field(alias="latency_ns")
    interface: Name | None = None
    price_usd: Dollars | None = None


class Link(Entry):
    """A link or network: per-device bandwidth in one direction and one-hop latency."""

    kind: Literal["scale-up", "scale-out", "host", "package"]
    latency_s: LatencyUs = Field(alias="latency_us")
    gb_per_s_per_direction: LinkGBps | None = None
    gbit_per_s_per_direction: LinkGbitps | None = None

    @model_validator(mode="after")
    def _one_bandwidth(self):
        given = [v for v in (self.gb_per_s_per_direction, self.gbit_per_s_per_direction) if v is not None]
        if len(given) != 1:
            raise ValueError("needs exactly one of gb_per_s_per_direction, gbit_per_s_per_direction")
        return self

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth per direction, bytes/s."""
        return self.gb_per_s_per_direction or self.gbit_per_s_per_direction  # type: ignore[return-value]


class Tier(BaseModel):
    """One level of a system's topology: groups of ``group_size`` devices joined by ``link``.

    ``group_size`` counts devices and is None for the outermost level (the whole system). The
    bandwidth is what one device can send in one direction across this level (its share of the
    level's links), and the latency one hop's; both default to the link's own figures.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: Name
    link: Name
    group_size: Annotated[int, Field(ge=2)] | None = None
    gb_per_s_per_direction: LinkGBps | None = None
    gbit_per_s_per_direction: LinkGbitps | None = None
    latency_us: LatencyUs | None = None


class MemoryAttachment(BaseModel):
    """A memory tier of a node: which memory, how many units per node, and the path to it.

    Each unit is shared by ``shared_by`` accelerators; by default the node's units are spread
    evenly over its accelerators (a socket's DDR serves the GPUs under it). A rack-level pool names
    the devices of the rack. The path's per-device bandwidth caps what a device sees.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    memory: Name
    count_per_node: Annotated[int, Field(ge=1, le=4096)] = 1
    shared_by: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    path: Name


class HostAttachment(BaseModel):
    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)

    cpu: Name
    count_per_node: Annotated[int, Field(ge=1, le=64)] = 1


class System(Entry):
    """A system: nodes of identical accelerators, their hosts, memory tiers and topology tiers."""

    kind: Literal["system"] = "system"
    vendor: str
    accelerator: Name
    devices_per_node: Annotated[int, Field(ge=1, le=4096)]
    # The devices one operating-system host drives, where a node is several hosts (a GB200 NVL72
    # rack: 18 trays of 4 GPUs); a launcher (torchrun, deepspeed, sglang --nnodes) starts per host.
    devices_per_host: Annotated[int, Field(ge=1, le=4096)] | None = None
    nodes: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    hosts: tuple[HostAttachment, ...] = ()
    memory_tiers: tuple[MemoryAttachment, ...] = ()
    tiers: Annotated[tuple[Tier, ...], Field(min_length=1)]
    node_overhead_w: Watts | None = None
    node_price_usd: Dollars | None = None
    # Why a basis has no price ("cloud", "owned"): printed where a cost search lists the system.
    unpriced: dict[Literal["cloud", "owned"], Annotated[str, Field(max_length=300)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _hosts_divide_the_node(self):
        if self.devices_per_host is not None and self.devices_per_node % self.devices_per_host:
            raise ValueError(f"devices_per_host ({self.devices_per_host}) must divide devices_per_node "
                             f"({self.devices_per_node})")
        return self

    @property
    def devices_per_launch_host(self) -> int:
        """Devices one launcher process group starts on: a host's, else the node's."""
        return self.devices_per_host or self.devices_per_node

    @model_validator(mode="after")
    def _nested_tiers(self):
        sizes = [t.group_size for t in self.tiers]
        if sizes[-1] is not None:
            raise ValueError(f"the last tier ({self.tiers[-1].name}) spans the system: group_size must be absent")
        inner = [s for s in sizes[:-1]]
        if any(s is None for s in inner):
            raise ValueError("only the last tier may omit group_size")
        for a, b in zip(inner, inner[1:]):
            if b <= a or b % a:
                raise ValueError(f"tier group sizes must grow and nest (each divides the next), has {a} then {b}")
        return self

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes

    def scaled(self, nodes: int) -> "System":
        """The same system with ``nodes`` nodes."""
        if not isinstance(nodes, int) or not 1 <= nodes <= 1_000_000:
            raise SpecError(f"{self.name}: nodes needs a positive integer up to 1,000,000, has {nodes!r}")
        return self.model_copy(update={"nodes": nodes})


Fraction = Annotated[float, Field(gt=0, le=1)]


CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


class ProtocolFit(BaseModel):
    """One collective's fitted cost over the scale-up link, as NCCL picks the faster of a
    low-latency and a bandwidth protocol: min over p of launch_p + steps x hop + bytes x volume /
    (link x fraction_p) (NCCL's own latency-bandwidth model per protocol, src/graph/tuning.cc)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    ll_launch_s: LatencyUs = Field(alias="ll_launch_us")
    ll_fraction: Fraction
    launch_s: LatencyUs = Field(alias="launch_us")
    fraction: Fraction


class CollectiveFit(BaseModel):
    """Collective costs inside the scale-up domain, fitted on measured timings (``perfmodel
    calibrate collectives``); the held-out error is that of the half left out of the fit."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    link_bytes_per_s: LinkGBps = Field(alias="link_gb_per_s")   # the per-direction link the fractions are of
    hop_s: LatencyUs = Field(alias="hop_us")
    ops: dict[CollectiveOp, ProtocolFit]
    held_out_mape: dict[CollectiveOp, Annotated[float, Field(ge=0, le=10)]] = {}
    samples: Annotated[int, Field(ge=1)] = 1


class GemmFit(BaseModel):
    """GEMM kernel time as a function of shape at one precision (perfmodel.kernels), fitted on
    measured GEMM timings by ``perfmodel calibrate gemm``; ``cast`` says that the timings include
    a separate activation-quantization kernel. The held-out error is that of the half left out."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    units: Annotated[int, Field(ge=1, le=100_000)]          # SMs / CUs the tiles spread over
    compute_fraction: Fraction
    memory_fraction: Fraction
    launch_s: LatencyUs = Field(alias="launch_us")
    sharpness: Annotated[float, Field(ge=1, le=1000)]
    tile_overhead: Annotated[float, Field(ge=0, le=10_000)]
    cast: bool = False
    cast_launch_s: LatencyUs = Field(0.0, alias="cast_launch_us")     # of launch_s: the quantization kernels' own
    held_out_mape: Annotated[float, Field(ge=0, le=10)]
    samples: Annotated[int, Field(ge=1)]


# Serving engines whose own measured GEMM kernels a calibration entry may carry (``serving_backends``);
# TensorRT-LLM's are the entry's own ``gemm`` / ``block_scaled`` blocks.
SERVING_BACKENDS = ("trtllm", "sglang", "vllm")


# Grouped-GEMM fits a device may carry: the routed experts' GEMMs at each precision and scaling
# recipe measured (bf16; fp8 with one scale per tensor; fp8 with 128-element block scales, as
# DeepSeek-V3's checkpoint is quantized; fp4 weights over bf16 math; NVFP4 weights and activations).
GroupedPrecision = Literal["bf16", "fp8", "fp8_block", "w4a16", "fp4"]


class GroupedGemmFit(BaseModel):
    """The routed experts' grouped GEMMs (perfmodel.kernels.GemmKernel with ``groups``) at one
    precision, fitted on measured MoE layers by ``perfmodel calibrate moe``: the GEMM fit's terms
    plus a fixed cost per group (``group_launch_s``) and ``input_passes``, the fitted passes over
    the GEMMs' inputs (3 bytes an element each) of the permute, quantize and activation kernels
    around them. ``backend``: the implementation measured (framework, version, kernel); held-out
    errors are those of the MoE shapes left out."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    units: Annotated[int, Field(ge=1, le=100_000)]
    compute_fraction: Fraction
    memory_fraction: Fraction
    launch_s: LatencyUs = Field(alias="launch_us")
    sharpness: Annotated[float, Field(ge=1, le=1000)]
    tile_overhead: Annotated[float, Field(ge=0, le=10_000)]
    group_launch_s: LatencyUs = Field(alias="group_launch_us")
    input_passes: Annotated[float, Field(ge=0, le=1000)]
    backend: str
    held_out_mape: Annotated[float, Field(ge=0, le=10)]
    held_out_p90: Annotated[float, Field(ge=0, le=100)]
    samples: Annotated[int, Field(ge=1)]


class AttentionFit(BaseModel):
    """Attention-core kernel time (perfmodel.kernels.AttentionKernel), prefill at one precision or
    decode, fitted on measured attention kernels by ``perfmodel calibrate attention``."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    units: Annotated[int, Field(ge=1, le=100_000)]
    compute_fraction: Fraction
    memory_fraction: Fraction
    launch_s: LatencyUs = Field(alias="launch_us")
    tile_s: LatencyUs = Field(alias="tile_us")
    sharpness: Annotated[float, Field(ge=1, le=1000)] = 1.0
    saturation: Annotated[float, Field(ge=0, le=1000)] = 0.0
    held_out_mape: Annotated[float, Field(ge=0, le=10)]
    samples: Annotated[int, Field(ge=1)]


class AttentionFits(BaseModel):
    """Prefill kernels by attention precision, decode kernels (bf16 math) by KV-cache precision, and
    the multi-head latent attention core by phase (fitted on MLA modules, bf16 math)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    prefill: dict[Precision, AttentionFit] = {}
    decode: dict[Precision, AttentionFit] = {}
    mla: dict[Literal["prefill", "decode"], AttentionFit] = {}


class EngineKernelFits(BaseModel):
    """One serving engine's kernel fits on the tables aiconfigurator measured in that engine: GEMMs
    (``perfmodel calibrate gemm --backend``; the fields of the entry's ``gemm`` and
    ``block_scaled`` blocks), attention (``calibrate attention --backend``; the entry's
    ``attention`` block) and the routed experts' grouped GEMMs (``calibrate moe --backend``; the
    entry's ``grouped_gemm`` block). A family or precision it lacks keeps TensorRT-LLM's fit."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    gemm: dict[Precision, GemmFit] = {}
    block_scaled: dict[Literal["fp8"], GemmFit] = {}
    attention: AttentionFits | None = None
    grouped_gemm: dict[GroupedPrecision, GroupedGemmFit] = {}


ExchangeOp = Literal["dispatch", "combine"]


class ExchangeFit(BaseModel):
    """One of DeepEP's expert exchanges fitted on measured kernels by ``perfmodel calibrate
    dispatch``: per op a launch and the share of the scale-up and scale-out link bandwidth
    reached, and the latency of leaving the domain. ``scale_out_fraction`` is absent when only one
    scale-up domain was measured."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", allow_inf_nan=False)
    launch_s: dict[ExchangeOp, LatencyUs] = Field(alias="launch_us")
    remote_s: LatencyUs = Field(0.0, alias="remote_us")
    scale_up_fraction: dict[ExchangeOp, Fraction]
    scale_out_fraction: dict[ExchangeOp, Fraction] | None = None
    held_out_mape: Annotated[float, Field(ge=0, le=10)]
    samples: Annotated[int, Field(ge=1)]


class DispatchFit(ExchangeFit):
    """DeepEP low-latency expert dispatch and combine as decode runs them
    (perfmodel.collectives.expert_exchange_time), and under ``normal`` the normal kernels prefill
    runs (perfmodel.collectives.normal_exchange_time, ``--kernels normal``), each fitted alike."""

    normal: ExchangeFit | None = None


class Calibration(Entry):
    """Achievable fractions of a device's peaks, each from a named measurement in ``sources``.

    ``device`` is None for the entry named ``default``, used for devices without a measurement;
    its ``vendor_matmul_fraction`` gives a vendor with measured devices its own prior, and its
    ``matmul_fraction`` is the prior of a vendor with none.
    ``matmul_fraction``: large-GEMM throughput / dense peak per precision (max-achievable FLOPS);
    ``hbm_fraction``: streaming bandwidth / HBM peak; ``scale_up_fraction`` and
    ``scale_out_fraction``: collective bus bandwidth / per-direction link bandwidth.
    """

    kind: Literal["calibration"] = "calibration"
    device: Name | None = None
    matmul_fraction: dict[Precision, Fraction] = {}
    vendor_matmul_fraction: dict[Annotated[str, Field(max_length=64)], dict[Precision, Fraction]] = {}  # by vendor
    hbm_fraction: Fraction | None = None
    scale_up_fraction: Fraction | None = None
    scale_out_fraction: Fraction | None = None
    collectives: CollectiveFit | None = None   # measured collective costs inside the scale-up domain
    gemm: dict[Precision, GemmFit] = {}        # measured GEMM kernel costs by precision
    weight_only: dict[Literal["int8", "int4"], GemmFit] = {}   # int8 / int4 weights in bf16 GEMMs
    block_scaled: dict[Literal["fp8"], GemmFit] = {}   # GEMMs with 128-element block scales (serving's fp8 checkpoints)
    grouped_gemm: dict[GroupedPrecision, GroupedGemmFit] = {}  # measured MoE expert GEMMs by precision
    attention: AttentionFits | None = None     # measured attention kernel costs
    # Without decode attention fits: the decode attention kernel's measured share of the dense peak
    # at its compute-bound best, by precision (one published measurement, no shape-aware fit).
    decode_attention_fraction: dict[Precision, Fraction] = {}
    dispatch: DispatchFit | None = None        # measured MoE dispatch / combine (DeepEP low-latency, normal)
    # Serving engines' own GEMM fits (sglang, vllm), where their measured kernels differ from
    # TensorRT-LLM's (whose fits are ``gemm`` and ``block_scaled``).
    serving_backends: dict[Literal["sglang", "vllm"], EngineKernelFits] = {}


# Every constant the model reads: the value it takes where a database holds no entry of that name (a
# neutral one: no reserve, no overlap, no error; the shipped database has them all) and the range it
# can take and stay meaningful, in the unit its entry states (a user's override outside it is refused
# when the database loads, not found as a division by zero). perfmodel.constants builds the typed
# object the model reads from these and the database's entries.
CONSTANT_TERMS: dict[str, tuple[float, float, float]] = {
    "hbm-reserve-fraction": (0.0, 0.0, 0.9), "hbm-headroom-fraction": (0.0, 0.0, 0.9),
    "idle-power-fraction": (0.0, 0.0, 1.0), "pue": (1.0, 1.0, 3.0), "power-memory-weight": (0.0, 0.0, 1.0),
    "electricity-usd-per-kwh": (0.0, 0.0, 10.0), "depreciation-years": (5.0, 0.5, 30.0),
    "server-price-multiplier": (1.0, 1.0, 10.0), "facility-usd-per-kw-month": (0.0, 0.0, 10_000.0),
    "network-capex-fraction": (0.0, 0.0, 0.9),
    "moe-load-imbalance": (1.0, 1.0, 1000.0), "moe-routing-power-law-alpha": (1.2, 0.0, 10.0),
    "moe-redundant-expert-share": (0.125, 0.0, 8.0),
    "dp-overlap-fraction": (0.0, 0.0, 1.0), "framework-gemm-efficiency": (1.0, 0.05, 1.0),
    "prefill-tokens-in-flight": (float("inf"), 1.0, 1e6), "unfitted-kernel-launch-us": (0.0, 0.0, 10_000.0),
    "unfitted-collective-launch-us": (0.0, 0.0, 10_000.0), "exchange-sms": (0.0, 0.0, 200.0),
    "tp-overlap-bulk-sms": (0.0, 0.0, 200.0), "collective-sms": (0.0, 0.0, 200.0),
    "four-bit-gemm-speedup": (2.88, 1.0, 8.0),
    "attention-backward-slowdown": (1.0, 1.0, 10.0), "attention-backward-slowdown-1k": (0.0, 0.0, 10.0),
    "unfitted-gemm-error": (0.0, 0.0, 10.0), "unfitted-collective-error": (0.0, 0.0, 10.0),
    "framework-fit-error": (0.0, 0.0, 10.0), "unmeasured-kernels-error": (0.0, 0.0, 10.0),
    "serving-error": (0.0, 0.0, 10.0), "unmeasured-serving-error": (0.0, 0.0, 10.0),
    "moe-training-error": (0.0, 0.0, 10.0),
}
CONSTANT_RANGES: dict[str, tuple[float, float]] = {name: (low, high) for name, (_, low, high) in CONSTANT_TERMS.items()}


class Constant(Entry):
    """A named model constant (a reserve, an overlap, a fitted efficiency) with its provenance."""

    kind: Literal["constant"] = "constant"
    value: Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]
    unit: str

    @model_validator(mode="after")
    def _in_range(self) -> "Constant":
        lo, hi = CONSTANT_RANGES.get(self.name, (0.0, 1e6))
        if not lo <= self.value <= hi:
            raise ValueError(f"value needs {lo:g} to {hi:g} ({self.unit}), has {self.value:g}")
        return self


ENTRY_KINDS: dict[str, type[Entry]] = {
    "accelerators": Accelerator,
    "cpus": Cpu,
    "memory": Memory,
    "links": Link,
    "systems": System,
    "calibrations": Calibration,
    "constants": Constant,
}


def file_schema() -> dict:
    """The JSON schema (pydantic's own) of one user hardware YAML file: a mapping of entry kinds to
    lists of entries. An entry with ``extends`` may leave out what it inherits (checked after merging)."""
    from pydantic import ConfigDict, create_model

    kinds = {kind: (list[model] | None, None) for kind, model in ENTRY_KINDS.items()}
    model = create_model("HardwareFile", __config__=ConfigDict(extra="forbid"), **kinds)
    schema = model.model_json_schema()
    schema["description"] = file_schema.__doc__.split("\n\n")[0].replace("\n   ", "").strip()
    return schema
