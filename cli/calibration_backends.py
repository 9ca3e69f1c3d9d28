"""``perfmodel calibrate attention|moe --backend sglang|vllm``: the attention and grouped-GEMM fits
of perfmodel.calibrate (the same models, seeded held-out split and seed as TensorRT-LLM's) on the
tables aiconfigurator measured in another serving engine, written into the calibration entry's
``serving_backends.<engine>`` block (cli.calibration writes it; this module picks each engine's
kernels in its tables)."""

from __future__ import annotations

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
    from perfmodel.hardware_db.errors import SpecError

    if backend not in BACKEND_ATTENTION_KERNELS:
        raise SpecError(f"--backend needs one of trtllm, {', '.join(BACKEND_ATTENTION_KERNELS)}, has {backend!r}")


def fit_backend_attention(acc, table, source, seed, backend: str):
    """Prefill fits by attention precision and decode fits by KV precision on ``backend``'s
    measured attention kernels (its aiconfigurator tables, that engine's default kernels only, or
    a CSV of that form), their source and note."""
    from perfmodel.calibrate import fit_attention
    from perfmodel.hardware_db.errors import SpecError

    from .timings_io import MAX_DECODE_GROUP, aiconfigurator_table, read_attention_timings

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
    sixteen = "bf16" if "bf16" in acc.peak_flops else "fp16"
    results = {}
    for (phase, precision), cols in sorted(timings.items()):
        math = sixteen if phase == "decode" else precision
        if math not in acc.peak_flops:
            raise SpecError(f"{acc.name} has no {math} peak; the timings' {phase} {precision} rows cannot be fitted")
        results[(phase, precision)] = fit_attention(*cols, acc.peak_flops[math], acc.hbm_bytes_per_s,
                                                    acc.compute_units, phase == "decode", seed)
    mape = ", ".join(f"{ph} {p} {r.held_out_mape:.1%}" for (ph, p), r in results.items())
    used = sorted({k for ks in kernels.values() for k in ks})
    note = (f"attention {backend}: fitted by perfmodel calibrate attention --backend {backend} (seed {seed}) on "
            f"{provenance}: "
            + "; ".join(f"{ph} {p} {r.train_rows} rows fitted, {r.test_rows} held out" for (ph, p), r in results.items())
            + f"; held-out MAPE {mape}; {left_out} rows left out (sliding-window kernels, decode groups above "
              f"{MAX_DECODE_GROUP} query heads per KV head, and kernels other than {BACKEND_TITLES[backend]}'s "
              f"default {'/'.join(used)}: Triton / FA4 rows of head_dim 512 or sliding windows only); a precision "
              f"not measured keeps TensorRT-LLM's fit (block serving_backends.{backend}.attention)")
    return results, provenance, note


def fit_backend_mla(db, acc, attention: dict, seed: int, backend: str):
    """SGLang's MLA core fits: the same fit as TensorRT-LLM's entry (aiconfigurator's SGLang wide-EP
    MLA module tables) with SGLang's own block-scaled fp8 GEMM fit for the projections subtracted
    and its own decode attention fit's HBM share; None for another engine (vLLM's MLA tables time
    whole modules under other kernels, FLASHMLA / FLASH_ATTN_MLA, and keep the SGLang-measured
    fit), or without those fits."""
    from perfmodel.machine import gemm_kernel

    from .calibration import _decode_memory, _fit_mla

    own = db.calibration(acc.name).serving_backends.get(backend)
    if backend != "sglang" or own is None or "fp8" not in own.block_scaled or "fp8" not in acc.peak_flops:
        return None
    cal = db.calibration(acc.name)
    projections = gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0,
                              fit=own.block_scaled["fp8"])
    mla = _fit_mla(acc, projections, _decode_memory(attention), seed)
    if mla is None:
        return None
    note = mla[2].replace("attention: MLA core fitted by perfmodel calibrate", f"attention {backend}: MLA core fitted "
                          f"by perfmodel calibrate attention --backend {backend}", 1) \
        + (f"; the projections at SGLang's own block-scaled fp8 GEMM fit (serving_backends.sglang.block_scaled) and "
           f"decode at SGLang's decode attention fit's HBM share")
    return mla[0], mla[1], note


def fit_backend_moe(db, acc, table, source, seed, backend: str):
    """Grouped-GEMM fits by recipe on ``backend``'s measured MoE layers (the balanced rows of its
    aiconfigurator ``moe_perf`` table, of every kernel it measured at a row the fastest, or a CSV
    of that form), at the full-tile rate of the engine's own GEMM fit where it has one; rows of
    the MoE shapes TensorRT-LLM's table measured only non-gated and NONGATED_SHAPES (relu2) fitted
    non-gated. Their
    source and note, or None when the install has no such table."""
    from perfmodel.calibrate import fit_grouped_gemm
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.machine import GROUPED_MATH

    from .timings_io import aiconfigurator_moe_table, aiconfigurator_table, nongated_shapes, read_moe_layer_timings

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
    sixteen = "bf16" if "bf16" in acc.peak_flops else "fp16"
    hbm, streaming = acc.hbm_bytes_per_s, cal.hbm_fraction or 1.0
    version = path.parent.name
    results = {}
    for recipe, (cols, x, w, kernels) in sorted(timings.items()):
        math = GROUPED_MATH[recipe] or sixteen
        if math not in acc.peak_flops:
            continue
        dense = (own.gemm.get(math) if own else None) or cal.gemm.get(math)
        label = f"{BACKEND_TITLES[backend]} {version} {'/'.join(kernels)}" if source else "/".join(kernels)
        results[recipe] = fit_grouped_gemm(*cols, acc.peak_flops[math], hbm, hbm * streaming, acc.compute_units, x, w,
                                           label, seed, compute_fraction=dense.compute_fraction if dense else None)
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
    return results, provenance, note


def calibrate_attention_backend(db, acc, table, source, out, seed: int, json_out: bool, backend: str) -> None:
    """Fit, print and write one engine's attention fits (and SGLang's MLA cores)."""
    from .calibration import _attention_block, _attention_table, _report_fit

    results, provenance, note = fit_backend_attention(acc, table, source, seed, backend)
    mla = fit_backend_mla(db, acc, results, seed, backend) if source else None
    p90 = {f"{ph} {p}": r.held_out_p90 for (ph, p), r in results.items()}
    if mla:
        p90.update({f"mla {ph}": r.held_out_p90 for ph, r in mla[0].items()})
    block = {k: v for k, v in _attention_block(results, mla).items() if v}
    _report_fit(db, acc, {"serving_backends": {backend: {"attention": block}}}, p90, provenance,
                [note, mla[2]] if mla else [note], out, json_out,
                lambda: _attention_table(acc, provenance, results, mla))


def calibrate_moe_backend(db, acc, table, source, out, seed: int, json_out: bool, backend: str) -> None:
    """Fit, print and write one engine's grouped-GEMM fits."""
    from perfmodel.hardware_db.errors import SpecError

    from .calibration import _moe_table, _report_fit

    fitted = fit_backend_moe(db, acc, table, source, seed, backend)
    if fitted is None:
        raise SpecError(f"this aiconfigurator install has no {BACKEND_TITLES[backend]} MoE rows for {acc.name}")
    results, provenance, note = fitted
    _report_fit(db, acc, {"serving_backends": {backend: {"grouped_gemm": {p: r.as_yaml() for p, r in results.items()}}}},
                {p: r.held_out_p90 for p, r in results.items()}, provenance, [note], out, json_out,
                lambda: _moe_table(acc, provenance, results))
