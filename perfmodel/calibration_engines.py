"""The serving engines' own kernels in aiconfigurator's tables (SGLang, vLLM): which rows of their
GEMM, attention, MLA and MoE tables each engine's fits read (its default kernels, the fastest per
shape, the host-bound rows left out), and those fits (perfmodel.calibrate's models, seeded held-out
split and seed as TensorRT-LLM's), written into the calibration entry's ``serving_backends.<engine>``
block by perfmodel.calibration_workflow."""

from __future__ import annotations

from perfmodel.hardware_db.errors import SpecError
from perfmodel.hardware_db.timings import (BLOCK_SCALED, MAX_DECODE_GROUP, aiconfigurator_moe_table,
                                           aiconfigurator_table, nongated_shapes, read_attention_timings,
                                           read_gemm_timings, read_mla_module_timings, read_moe_layer_timings)

from .calibrate import FamilyFit, fit_attention_groups, fit_gemm, fit_grouped_recipes, fit_mla
from .catalog import load_model
from .machine import gemm_kernel

# Bytes of a GEMM input element at each math precision (bf16 and fp16: 2).
INPUT_BYTES = {"fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5}


# Serving engines whose GEMM tables aiconfigurator ships (its folders gemm/<backend>/<version>).
GEMM_BACKENDS = ("trtllm", "sglang", "vllm")
# What each engine's fp8 rows run besides the GEMM, as aiconfigurator's collectors time them
# (collector/<engine>/collect_gemm.py): one activation-quantization kernel fused per token, whose
# fixed cost the fitted launch carries (no separately measured cast launch).
BACKEND_FP8_CAST = {
    "sglang": "fp8 rows include SGLang's per-token activation quantization (sgl_per_token_quant_fp8, one kernel) "
              "before sgl_kernel's fp8_scaled_mm; fp8_block rows DeepGEMM's gemm_nt_f8f8bf16 after the per-token-"
              "group quantization",
    "vllm": "fp8 rows run vLLM's CutlassFP8ScaledMMLinearKernel, whose apply quantizes the activation (one kernel) "
            "before the GEMM; fp8_block rows: per shape the fastest of the kernels vLLM measured (Cutlass, DeepGEMM, "
            "FlashInfer block-scaled), the one its kernel selection would keep at that shape, each with its "
            "per-token-group quantization",
}


def fit_backend_gemm(acc, table, source, seed, backend: str) -> FamilyFit:
    """bf16, fp8 and fp8_block fits on serving engine ``backend``'s measured GEMMs (weight-only
    rows left to TensorRT-LLM's fit); fp8 rows include the engine's one activation-quantization
    kernel (``cast``, its fixed cost inside the fitted launch)."""
    path, provenance = (aiconfigurator_table(acc.name, f"gemm/{backend}", "gemm_perf.parquet") if source
                        else (table, f"the measurements in {table.name}"))
    timings = {p: cols for p, cols in read_gemm_timings(path, fastest=True).items() if p in ("bf16", "fp16", "fp8")
               or p in BLOCK_SCALED}
    timings, host_bound = kernel_timed(timings)
    results = {}
    for name, (m, n, k, seconds, cast) in sorted(timings.items()):
        math = BLOCK_SCALED.get(name, name)
        if math not in acc.peak_flops:
            raise SpecError(f"{acc.name} has no {math} peak; the timings' {name} rows cannot be fitted")
        results[name] = fit_gemm(m, n, k, seconds, acc.peak_flops[math], acc.hbm_bytes_per_s, acc.compute_units,
                                 INPUT_BYTES.get(math, 2.0), cast, 0.0, seed)
    if not results:
        raise SpecError(f"{path}: no bf16, fp16, fp8 or fp8_block rows to fit")
    mape = ", ".join(f"{p} {r.held_out_mape:.1%}" for p, r in results.items())
    note = (f"gemm {backend}: fitted by perfmodel calibrate gemm --backend {backend} (seed {seed}) on {provenance}: "
            + "; ".join(f"{p} {r.train_rows} rows fitted, {r.test_rows} held out" for p, r in results.items())
            + f"; held-out MAPE {mape}"
            + (f"; {BACKEND_FP8_CAST.get(backend, 'fp8 rows include the activation quantization')}"
               if {"fp8", *BLOCK_SCALED} & set(timings) | set(host_bound) else "")
            + f" (block serving_backends.{backend})"
            + "".join(f"; {p} left out: its fastest row takes {floor * 1e6:.1f} us, {ratio:.0f}x the fastest 16-bit "
                      f"GEMM's, at every small shape alike (host time of the op run eagerly, not its kernel; "
                      f"serving runs decode in CUDA graphs), so these GEMMs keep TensorRT-LLM's fit"
                      for p, (floor, ratio) in host_bound.items()))
    return FamilyFit(results, provenance, note)


# A GEMM's fastest measured row is its fixed cost (launch, and an activation-quantization kernel).
# Rows whose fastest is more than this many times the same table's fastest 16-bit GEMM time the
# host's eager path, not the kernel (aiconfigurator's vLLM 0.24.0 fp8_block rows: 55 us on H100 at
# every shape up to M = 16, the bf16 rows 2.5 us; TensorRT-LLM's fp8 rows with their two cast
# kernels 12.1 us, 4.8x).
HOST_BOUND_FLOOR = 10.0


def kernel_timed(timings: dict) -> tuple[dict, dict]:
    """(timings whose fastest row is within HOST_BOUND_FLOOR of the 16-bit GEMM's fastest, and
    {precision: (its fastest seconds, the ratio)} of those left out); all kept without 16-bit rows."""
    sixteen = timings.get("bf16") or timings.get("fp16")
    if sixteen is None:
        return timings, {}
    least = min(sixteen[3])
    out = {p: (min(cols[3]), min(cols[3]) / least) for p, cols in timings.items()}
    left = {p: v for p, v in out.items() if v[1] > HOST_BOUND_FLOOR}
    return {p: cols for p, cols in timings.items() if p not in left}, left


# Each engine's attention kernels in aiconfigurator's context / generation attention tables
# (kernel_source): its default FlashAttention-style kernel per GPU generation (SGLang fa3 on
# Hopper, trtllm_mha on Blackwell; vLLM FA3 on Hopper, FlashInfer's TensorRT-LLM kernels on
# Blackwell). The others (Triton, FA4) measured only head_dim 512 or sliding-window shapes.
BACKEND_ATTENTION_KERNELS = {
    "sglang": {"prefill": ("fa3", "trtllm_mha"), "decode": ("fa3", "trtllm_mha")},
    "vllm": {"prefill": ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmprefill"),
             "decode": ("vllm_flash_attn_fa3", "vllm_flashinfer_trtllmdecode")},
}
BACKEND_TITLES = {"sglang": "SGLang", "vllm": "vLLM"}


# MoE shapes (hidden, expert width, experts, top-k) whose experts are not gated (relu2) beyond those
# TensorRT-LLM's table measures with its non-gated kernel: Nemotron-3 Super's, appended to the SGLang
# 0.5.14 and vLLM 0.24.0 tables (their collection_meta.yaml), which aiconfigurator's collectors run
# with relu2 (collector/sglang/collect_moe.py, _NON_GATED_MOE_MODEL_PATTERNS "Nemotron-3").
NONGATED_SHAPES = frozenset({(1024, 2688, 512, 22)})


def backend_moe_kernel(kernel: str) -> bool:
    """Whether an engine's MoE-table row (its ``kernel_source``) times a grouped-GEMM kernel fitted
    here: every kernel but the approximations aiconfigurator labels ``situ_as_silu`` (a SiLU
    epilogue standing in for Kimi's SiTU activation, per its collection_meta.yaml)."""
    return not kernel.endswith("situ_as_silu")


def _check_backend(backend: str) -> None:
    if backend not in BACKEND_ATTENTION_KERNELS:
        raise SpecError(f"--backend needs one of trtllm, {', '.join(BACKEND_ATTENTION_KERNELS)}, has {backend!r}")


def fit_backend_attention(acc, table, source, seed, backend: str) -> FamilyFit:
    """Prefill fits by attention precision and decode fits by KV precision on ``backend``'s
    measured attention kernels (its aiconfigurator tables, that engine's default kernels only, or
    a CSV of that form), their source and note."""
    _check_backend(backend)
    if not acc.compute_units:
        raise SpecError(f"{acc.name} has no compute_units (SMs / CUs) in the database; attention tiles need it")
    kernels = BACKEND_ATTENTION_KERNELS[backend]
    if source:
        prefill_path, provenance = aiconfigurator_table(acc.name, f"attention/{backend}", "context_attention_perf.parquet")
        decode_path, decode_from = aiconfigurator_table(acc.name, f"attention/{backend}",
                                                        "generation_attention_perf.parquet")
        provenance += f" and {decode_from.split(', ', 1)[1]}"
    else:
        prefill_path, decode_path, provenance = table, None, f"the measurements in {table.name}"
    timings, left_out = read_attention_timings(prefill_path, decode_path, kernels)
    results = fit_attention_groups(acc, timings, seed)
    mape = ", ".join(f"{ph} {p} {r.held_out_mape:.1%}" for (ph, p), r in results.items())
    used = sorted({k for ks in kernels.values() for k in ks})
    note = (f"attention {backend}: fitted by perfmodel calibrate attention --backend {backend} (seed {seed}) on "
            f"{provenance}: "
            + "; ".join(f"{ph} {p} {r.train_rows} rows fitted, {r.test_rows} held out" for (ph, p), r in results.items())
            + f"; held-out MAPE {mape}; {left_out} rows left out (sliding-window kernels, decode groups above "
              f"{MAX_DECODE_GROUP} query heads per KV head, and kernels other than {BACKEND_TITLES[backend]}'s "
              f"default {'/'.join(used)}: Triton / FA4 rows of head_dim 512 or sliding windows only); a precision "
              f"not measured keeps TensorRT-LLM's fit (block serving_backends.{backend}.attention)")
    return FamilyFit(results, provenance, note)


def backend_mla_projections(db, acc, backend: str):
    """The GEMM kernel of the MLA module's projections for ``backend``'s MLA core fit: SGLang's own
    block-scaled fp8 GEMM fit (the MLA tables are SGLang's wide-EP DeepSeek-V3 modules, as the
    entry's own MLA fit reads them), else the block-scaled fit the engine serves them with (vLLM:
    TensorRT-LLM's, its own rows timing the host); None without one."""
    cal = db.calibration(acc.name)
    own = cal.serving_backends.get(backend)
    fit = (own.block_scaled.get("fp8") if own else None) or cal.block_scaled.get("fp8")
    if fit is None or "fp8" not in acc.peak_flops:
        return None
    return gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0, fit=fit)


def fit_module_mla(acc, projections, decode_memory, seed: int, backend: str) -> FamilyFit | None:
    """MLA core fits by phase on ``backend``'s own MLA module tables (vLLM's ``mla_*_module_perf``,
    DeepSeek-V3: fp8 KV cache, block-scaled projections, the fastest kernel per shape), less the
    ``projections`` GEMM kernel, decode at ``decode_memory`` (the engine's decode attention fit's
    HBM share); their source and note, or None without those tables or fits."""
    if projections is None or decode_memory is None:
        return None
    spec, sixteen = load_model("deepseek-v3"), acc.math16
    results, where = {}, []
    for phase, name in (("prefill", "context"), ("decode", "generation")):
        try:
            path, provenance = aiconfigurator_table(acc.name, f"mla/{backend}", f"mla_{name}_module_perf.parquet")
        except SpecError:
            return None
        cols, kernels = read_mla_module_timings(path, name)
        results[phase] = fit_mla(spec, *cols, projections, acc.peak_flops[sixteen], acc.hbm_bytes_per_s,
                                 acc.compute_units, phase == "decode", decode_memory if phase == "decode" else None,
                                 seed)
        where.append(f"{provenance.split(', ', 1)[1]} ({kernels}, the fastest per shape)")
    provenance = f"{provenance.split(', ', 1)[0]}, {' and '.join(where)}"
    note = (f"attention {backend}: MLA core fitted by perfmodel calibrate attention --backend {backend} (seed {seed}) "
            f"on {provenance}, DeepSeek-V3's MLA module over an fp8 KV cache less its block-scaled fp8 projections at "
            f"the GEMM fit {BACKEND_TITLES[backend]} serves them with, decode at {BACKEND_TITLES[backend]}'s decode "
            f"attention fit's HBM share {decode_memory:.1%}: "
            + "; ".join(f"{ph} {r.train_rows} rows fitted, {r.test_rows} held out" for ph, r in results.items())
            + "; held-out MAPE of the module " + ", ".join(f"{ph} {r.held_out_mape:.1%}" for ph, r in results.items()))
    return FamilyFit(results, provenance, note)


def backend_mla_note(note: str, backend: str) -> str:
    """The MLA fit's source line as that engine's (its block and the GEMM fit subtracted)."""
    return note.replace("attention: MLA core fitted by perfmodel calibrate", f"attention {backend}: MLA core fitted "
                        f"by perfmodel calibrate attention --backend {backend}", 1) \
        + (f"; the projections at {BACKEND_TITLES[backend]}'s own block-scaled fp8 GEMM fit (serving_backends."
           f"{backend}.block_scaled) and decode at {BACKEND_TITLES[backend]}'s decode attention fit's HBM share")


def fit_backend_moe(db, acc, table, source, seed, backend: str) -> FamilyFit | None:
    """Grouped-GEMM fits by recipe on ``backend``'s measured MoE layers (the balanced rows of its
    aiconfigurator ``moe_perf`` table, of every kernel it measured at a row the fastest, or a CSV
    of that form), at the full-tile rate of the engine's own GEMM fit where it has one; rows of
    the MoE shapes TensorRT-LLM's table measured only non-gated and NONGATED_SHAPES (relu2) fitted
    non-gated. Their
    source and note, or None when the install has no such table."""
    _check_backend(backend)
    if not acc.compute_units:
        raise SpecError(f"{acc.name} has no compute_units (SMs / CUs) in the database; GEMM tiles need it")
    if source:
        path, provenance = aiconfigurator_table(acc.name, f"moe/{backend}", "moe_perf.parquet")
        nongated = nongated_shapes(aiconfigurator_moe_table(acc.name)[0]) | NONGATED_SHAPES
    else:
        path, provenance, nongated = table, f"the measurements in {table.name}", frozenset()
    timings = read_moe_layer_timings(path, backend_moe_kernel, nongated)
    cal = db.calibration(acc.name)
    own = cal.serving_backends.get(backend)
    version = path.parent.name
    results = fit_grouped_recipes(
        acc, timings, cal.hbm_fraction or 1.0, seed,
        lambda kernels: f"{BACKEND_TITLES[backend]} {version} {'/'.join(kernels)}" if source else "/".join(kernels),
        lambda math: (own.gemm.get(math) if own else None) or cal.gemm.get(math))
    if not results:
        return None
    note = (f"grouped_gemm {backend}: routed experts' grouped GEMMs fitted by perfmodel calibrate moe --backend "
            f"{backend} (seed {seed}) on the balanced rows of {provenance} ("
            + "; ".join(f"{p}: {r.backend}" for p, r in results.items())
            + "; where several kernels measured one row, the fastest, as the engine's per-shape selection keeps it; "
              f"{len(nongated)} MoE shapes fitted non-gated (relu2): those TensorRT-LLM's table measured only with its "
              "non-gated kernel, and Nemotron-3 Super's, which aiconfigurator's collectors run with relu2), less the "
              "permute and activation passes layer_ops runs beside them, at the full-tile rate of "
              f"{BACKEND_TITLES[backend]}'s GEMM fit (TensorRT-LLM's where it has none); held out by MoE shape as "
              "TensorRT-LLM's: "
            + "; ".join(f"{p} {r.train_rows} rows fitted, {r.test_rows} held out, MAPE {r.held_out_mape:.1%} "
                        f"(p90 {r.held_out_p90:.1%})" for p, r in results.items())
            + f"; a recipe not measured keeps TensorRT-LLM's fit (block serving_backends.{backend}.grouped_gemm)")
    return FamilyFit(results, provenance, note)
