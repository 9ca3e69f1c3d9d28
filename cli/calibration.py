"""``perfmodel calibrate``: fit a device's kernel constants (GEMM, attention and MLA, collectives,
expert dispatch and combine, MoE grouped GEMMs) to measured timings, report the held-out error and
write the calibration entry (perfmodel.calibrate holds the fits; this module reads the tables,
prints the results and writes the YAML)."""

from __future__ import annotations

from . import render
from .deliver import emit_json
from .render import Table

def _calibration_source(db, device: str, table, source: str | None, seed: int):
    """The accelerator, and whether timings come from aiconfigurator (checks of the shared flags)."""
    from perfmodel.hardware_db.errors import SpecError

    acc = db.accelerator(device)
    if (table is None) == (source is None):
        raise SpecError("give the timings with --table FILE or --from aiconfigurator (one of the two)")
    if source is not None and source != "aiconfigurator":
        raise SpecError(f"--from needs aiconfigurator, has {source!r}")
    if not 0 <= seed < 2**32:
        raise SpecError(f"--seed needs 0 to 2**32 - 1, has {seed}")
    return acc


def write_calibration(db, acc, blocks: dict, notes: list[str], out):
    """Write the device's calibration entry with ``blocks`` replaced (gemm, collectives) and the
    fit's source lines replacing the old ones of those blocks; None when ``out`` is None."""
    import yaml

    from perfmodel.hardware_db.errors import SpecError

    if out is None:
        return None
    refitted = [b for b in blocks if b != "serving_backends"] \
        + [f"{family} {backend}" for backend, families in blocks.get("serving_backends", {}).items()
           for family in families]
    blocks = dict(blocks)
    # The normal kernels' fit ("dispatch normal") sits inside the dispatch block, beside the
    # low-latency one; each keeps the other when only one is refitted.
    normal = blocks.pop("dispatch normal", None)
    own = next((c for c in db.calibrations.values() if c.device == acc.name), None)
    entry = {"name": own.name if own else f"{acc.name}-measured",
             "display_name": own.display_name if own else f"{acc.display_name} measured costs",
             "device": acc.name}
    if own is not None:
        for key in ("matmul_fraction", "hbm_fraction", "scale_up_fraction", "scale_out_fraction"):
            value = getattr(own, key)
            if value:
                entry[key] = dict(value) if isinstance(value, dict) else value
        # Blocks not refitted stay, in the file's units (the loader holds them in SI).
        if own.collectives is not None and "collectives" not in blocks:
            entry["collectives"] = _file_units(own.collectives.model_dump(by_alias=True))
        if own.gemm and "gemm" not in blocks:
            entry["gemm"] = {p: _file_units(f.model_dump(by_alias=True)) for p, f in own.gemm.items()}
        if own.weight_only and "gemm" not in blocks:
            entry["weight_only"] = {p: _file_units(f.model_dump(by_alias=True)) for p, f in own.weight_only.items()}
        if own.block_scaled and "gemm" not in blocks:
            entry["block_scaled"] = {p: _file_units(f.model_dump(by_alias=True)) for p, f in own.block_scaled.items()}
        if own.attention is not None and "attention" not in blocks:
            entry["attention"] = _file_units(own.attention.model_dump(by_alias=True))
        if own.grouped_gemm and "grouped_gemm" not in blocks:
            entry["grouped_gemm"] = {p: _file_units(f.model_dump(by_alias=True)) for p, f in own.grouped_gemm.items()}
        if own.dispatch is not None and "dispatch" not in blocks:
            entry["dispatch"] = _file_units(own.dispatch.model_dump(by_alias=True, exclude_none=True))
        if own.serving_backends:
            # Each serving engine's fits of a family stay unless this run refits that engine's family.
            kept = {b: _file_units(f.model_dump(by_alias=True, exclude_defaults=True))
                    for b, f in own.serving_backends.items()}
            new = blocks.get("serving_backends", {})
            blocks["serving_backends"] = {b: kept.get(b, {}) | new.get(b, {}) for b in kept | new}
    entry.update(blocks)
    kept = own.dispatch.normal if own is not None and own.dispatch is not None else None
    if normal is None and kept is not None and "normal" not in entry.get("dispatch", {}):
        normal = _file_units(kept.model_dump(by_alias=True, exclude_none=True))
    if normal is not None:
        if "dispatch" not in entry:
            raise SpecError(f"{acc.name} has no low-latency dispatch fit for the normal kernels' fit to sit beside; "
                            "fit it first: perfmodel calibrate dispatch --kernels low-latency")
        entry["dispatch"] = {**entry["dispatch"], "normal": normal}
    entry["sources"] = [s for s in (own.sources if own else ()) if not any(s.startswith(f"{b}:") for b in refitted)] \
        + notes
    out.mkdir(parents=True, exist_ok=True)
    written = out / f"calibration-{acc.name}.yaml"
    written.write_text(yaml.safe_dump({"calibrations": [entry]}, sort_keys=False, width=110))
    return written


def _file_units(block):
    """A block as loaded (SI) back in the units its YAML keys name (``_us``, ``_gb_per_s``)."""
    def scaled(value, factor):
        # 12 significant digits: the SI round trip leaves 11.254999999999999 for 11.255.
        if isinstance(value, dict):
            return {k: float(f"{x * factor:.12g}") for k, x in value.items()}
        return float(f"{value * factor:.12g}")

    if isinstance(block, dict):
        return {k: (scaled(v, 1e6) if k.endswith("_us") else scaled(v, 1e-9) if k.endswith("_gb_per_s")
                    else _file_units(v)) for k, v in block.items()}
    return block


def _fit_collectives(acc, table, source, seed):
    from perfmodel.calibrate import fit_collectives
    from perfmodel.hardware_db.timings import aiconfigurator_table, read_timings

    path, provenance = aiconfigurator_table(acc.name) if source else (table, f"the measurements in {table.name}")
    ops, ranks, size, seconds = read_timings(path)
    result = fit_collectives(ops, ranks, size, seconds, acc.scale_up_bytes_per_s, seed=seed)
    mape = ", ".join(f"{op} {v:.1%}" for op, v in result.held_out_mape.items())
    note = (f"collectives: fitted by perfmodel calibrate (seed {seed}) on {provenance}: "
            f"{result.train_rows} rows fitted, {result.test_rows} held out; held-out MAPE {mape}")
    return result, provenance, note


def _fit_gemm(acc, table, source, seed, backend: str = "trtllm"):
    """GEMM fits by precision on ``backend``'s measured GEMMs (aiconfigurator's table of that
    serving engine, or a table of that form), their source and note."""
    from perfmodel.calibrate import fit_gemm
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.hardware_db.timings import (BLOCK_SCALED, WEIGHT_ONLY, aiconfigurator_cast_launch,
                                               aiconfigurator_table, aiconfigurator_weight_only_table,
                                               read_gemm_timings)

    if backend not in GEMM_BACKENDS:
        raise SpecError(f"--backend needs one of {', '.join(GEMM_BACKENDS)}, has {backend!r}")
    if not acc.compute_units:
        raise SpecError(f"{acc.name} has no compute_units (SMs / CUs) in the database; GEMM tiles need it: add "
                        f"compute_units: N to its entry (in a --hardware-db YAML; the vendor's datasheet gives N)")
    if backend != "trtllm":
        return _fit_backend_gemm(acc, table, source, seed, backend)
    path, provenance = (aiconfigurator_table(acc.name, "gemm/trtllm", "gemm_perf.parquet") if source
                        else (table, f"the measurements in {table.name}"))
    results = {}
    timings = read_gemm_timings(path)
    if source and not set(timings) & set(WEIGHT_ONLY):
        # Weight-only kernels, where another of aiconfigurator's tables measured them.
        extra = aiconfigurator_weight_only_table(acc.name)
        if extra is not None:
            timings.update({p: cols for p, cols in read_gemm_timings(extra[0]).items() if p in WEIGHT_ONLY})
            provenance += f"; weight-only rows from {extra[1].split(', ', 1)[1]}"
    cast_launch, cast_from = (aiconfigurator_cast_launch(acc.name) if source and "fp8" in timings else (0.0, ""))
    sixteen = acc.math16
    for name, (m, n, k, seconds, cast) in sorted(timings.items()):
        math, weight = (sixteen, WEIGHT_ONLY[name][1]) if name in WEIGHT_ONLY else (BLOCK_SCALED.get(name, name), None)
        if math not in acc.peak_flops:
            raise SpecError(f"{acc.name} has no {math} peak; the timings' {name} rows cannot be fitted")
        results[name] = fit_gemm(m, n, k, seconds, acc.peak_flops[math], acc.hbm_bytes_per_s, acc.compute_units,
                                 INPUT_BYTES.get(math, 2.0), cast, cast_launch if name == "fp8" else 0.0, seed,
                                 weight_bytes=weight)
    mape = ", ".join(f"{p} {r.held_out_mape:.1%}" for p, r in results.items())
    note = (f"gemm: fitted by perfmodel calibrate (seed {seed}) on {provenance}: "
            + "; ".join(f"{p} {r.train_rows} rows fitted, {r.test_rows} held out" for p, r in results.items())
            + f"; held-out MAPE {mape}"
            + (f"; fp8 rows include the activation cast (amax and quantize kernels), whose fixed cost "
               f"{cast_launch * 1e6:.2f} us is the smallest latency of {cast_from}" if cast_launch else "")
            + ("; w8a16 / w4a16: int8 / int4 weights dequantized inside a bf16 GEMM (block weight_only)"
               if set(results) & set(WEIGHT_ONLY) else "")
            + ("; fp8_block: fp8 with 128-element block scales, whose rows include the per-token-group "
               "activation quantization kernel (block block_scaled)" if set(results) & set(BLOCK_SCALED) else "")
            + ("; int8: W8A8 (SmoothQuant), rows including the per-token activation quantization" if "int8" in results
               else "")
            + ("; fp4: W4A4 in NVFP4 (16-element block scales), rows including the activation quantization"
               if "fp4" in results else ""))
    return results, provenance, note


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


def _fit_backend_gemm(acc, table, source, seed, backend: str):
    """bf16, fp8 and fp8_block fits on serving engine ``backend``'s measured GEMMs (weight-only
    rows left to TensorRT-LLM's fit); fp8 rows include the engine's one activation-quantization
    kernel (``cast``, its fixed cost inside the fitted launch)."""
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.calibrate import fit_gemm
    from perfmodel.hardware_db.timings import BLOCK_SCALED, aiconfigurator_table, read_gemm_timings

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
    return results, provenance, note


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


def _gemm_blocks(results) -> dict:
    """The ``gemm`` block (by precision) and, when measured, the ``weight_only`` one (by weight
    format) and the ``block_scaled`` one (by math precision)."""
    from perfmodel.hardware_db.timings import BLOCK_SCALED, WEIGHT_ONLY

    blocks = {"gemm": {p: r.as_yaml() for p, r in results.items() if p not in WEIGHT_ONLY and p not in BLOCK_SCALED}}
    weight_only = {WEIGHT_ONLY[p][0]: r.as_yaml() for p, r in results.items() if p in WEIGHT_ONLY}
    block = {BLOCK_SCALED[p]: r.as_yaml() for p, r in results.items() if p in BLOCK_SCALED}
    return blocks | ({"weight_only": weight_only} if weight_only else {}) | ({"block_scaled": block} if block else {})


def _fit_attention(acc, table, source, seed):
    """Prefill fits by attention precision and decode fits by KV precision, their source and note."""
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.calibrate import fit_attention_groups
    from perfmodel.hardware_db.timings import MAX_DECODE_GROUP, aiconfigurator_table, read_attention_timings

    if not acc.compute_units:
        raise SpecError(f"{acc.name} has no compute_units (SMs / CUs) in the database; attention tiles need it: add "
                        f"compute_units: N to its entry (in a --hardware-db YAML; the vendor's datasheet gives N)")
    if source:
        prefill_path, provenance = aiconfigurator_table(acc.name, "attention/trtllm", "context_attention_perf.parquet")
        decode_path, decode_from = aiconfigurator_table(acc.name, "attention/trtllm", "generation_attention_perf.parquet")
        provenance += f" and {decode_from.split(', ', 1)[1]}"
    else:
        prefill_path, decode_path, provenance = table, None, f"the measurements in {table.name}"
    timings, left_out = read_attention_timings(prefill_path, decode_path)
    results = fit_attention_groups(acc, timings, seed)
    mape = ", ".join(f"{ph} {p} {r.held_out_mape:.1%}" for (ph, p), r in results.items())
    note = (f"attention: fitted by perfmodel calibrate (seed {seed}) on {provenance}: "
            + "; ".join(f"{ph} {p} {r.train_rows} rows fitted, {r.test_rows} held out" for (ph, p), r in results.items())
            + f"; held-out MAPE {mape}; {left_out} rows left out (sliding-window kernels, and decode groups above "
              f"{MAX_DECODE_GROUP} query heads per KV head, which run another kernel)")
    return results, provenance, note


def _fit_mla(acc, gemm, decode_memory, seed):
    """MLA core fits by phase on aiconfigurator's SGLang wide-EP MLA module tables (DeepSeek-V3),
    with the device's fitted fp8 ``gemm`` kernel for the module's projections (block-scaled where
    fitted, as serving runs the checkpoint) and, in decode, the
    HBM fraction ``decode_memory`` of its fitted decode attention; their source and note; None
    when the install has no such tables for the device or there is no fp8 GEMM fit."""
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.calibrate import fit_mla
    from perfmodel.catalog import load_model
    from perfmodel.hardware_db.timings import aiconfigurator_table, read_mla_timings

    if gemm is None or decode_memory is None:
        return None
    spec = load_model("deepseek-v3")
    sixteen = acc.math16
    results, where = {}, []
    for phase, name in (("prefill", "context"), ("decode", "generation")):
        try:
            path, provenance = aiconfigurator_table(acc.name, "mla/sglang", f"wideep_{name}_mla_perf.parquet")
        except SpecError:
            return None
        cols, backend = read_mla_timings(path, name)
        results[phase] = fit_mla(spec, *cols, gemm, acc.peak_flops[sixteen], acc.hbm_bytes_per_s,
                                 acc.compute_units, phase == "decode",
                                 decode_memory if phase == "decode" else None, seed)
        where.append(f"{provenance.split(', ', 1)[1]} ({backend} rows)")
    provenance = f"{provenance.split(', ', 1)[0]}, {' and '.join(where)}"
    note = (f"attention: MLA core fitted by perfmodel calibrate (seed {seed}) on {provenance}, DeepSeek-V3's MLA "
            f"module less the fitted fp8 GEMMs of its projections (block-scaled where fitted), decode at the decode attention fit's HBM share "
            f"{decode_memory:.1%}: "
            + "; ".join(f"{ph} {r.train_rows} rows fitted, {r.test_rows} held out" for ph, r in results.items())
            + "; held-out MAPE of the module " + ", ".join(f"{ph} {r.held_out_mape:.1%}" for ph, r in results.items()))
    return results, provenance, note


KERNELS = ("low-latency", "normal")


def _fit_dispatch(db, acc, table, source, seed, system_name, kernels: str = "low-latency"):
    """The dispatch / combine fit of DeepEP's ``kernels`` (low-latency or normal), its source and
    note: aiconfigurator's DeepEP tables with the link bandwidths its system file gives, or a CSV
    with those of ``system_name``'s links. The normal kernels' rows are those on ``exchange-sms``
    SMs, the share prefill's model gives them."""
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.calibrate import fit_dispatch, fit_normal_dispatch
    from perfmodel.hardware_db.timings import (aiconfigurator_dispatch_tables,
                                               read_dispatch_timings, read_normal_dispatch_timings)

    if kernels not in KERNELS:
        raise SpecError(f"--kernels needs one of {', '.join(KERNELS)}, has {kernels!r}")
    if source:
        paths, per_node, up, out, provenance = aiconfigurator_dispatch_tables(acc.name, kernels)
    else:
        system = db.system(system_name)
        links = {db.link(lv.link).kind: db.link(lv.link).bytes_per_s for lv in reversed(db.levels(system))}
        if "scale-up" not in links or "scale-out" not in links:
            raise SpecError(f"{system_name} needs a scale-up and a scale-out level to scale the measured bandwidths")
        paths, per_node, up, out = [table], system.devices_per_node, links["scale-up"], links["scale-out"]
        provenance = f"the measurements in {table.name} (links of {system_name})"
    if kernels == "normal":
        sms = int(db.constants["exchange-sms"].value)
        result = fit_normal_dispatch(*read_normal_dispatch_timings(paths, per_node, sms), up, out, seed=seed)
        head = "dispatch normal: normal kernels "
        provenance += f", the rows on {sms} SMs (exchange-sms)" if source else ""
    else:
        result = fit_dispatch(*read_dispatch_timings(paths, per_node), up, out, seed=seed)
        head = "dispatch: "
    mape = ", ".join(f"{op} {v:.1%}" for op, v in result.op_mape.items())
    spans = "; ".join(f"{d} " + ", ".join(f"{op} {v:.1%}" for op, v in m.items())
                      for d, m in result.domain_mape.items())
    note = (f"{head}fitted by perfmodel calibrate (seed {seed}) on {provenance}, link shares of "
            f"{up / 1e9:g} GB/s scale-up and {out / 1e9:g} GB/s scale-out per direction: {result.train_rows} rows "
            f"fitted, {result.test_rows} held out; held-out MAPE {mape}"
            + (f" (by nodes of {per_node} GPUs spanned: {spans})" if len(result.domain_mape) > 1 else "")
            + ("" if result.fitted.out_fraction else "; one scale-up domain measured, so the scale-out level keeps "
                                                     "its link model"))
    return result, provenance, note


def _dispatch_table(acc, provenance, result, kernels: str = "low-latency") -> None:
    f = result.fitted
    t = Table(title=f"expert dispatch and combine ({kernels} kernels) on {acc.name}, fitted on {provenance}",
              title_justify="left")
    for col in ("op", "launch", "scale-up share", "scale-out share", "held-out error"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op in ("dispatch", "combine"):
        t.add_row(op, f"{f.launch[op] * 1e6:.2f} us", f"{f.up_fraction[op]:.1%}",
                  f"{f.out_fraction[op]:.1%}" if f.out_fraction else "-", f"{result.op_mape[op]:.1%}")
    render.console.print(t)
    if len(result.domain_mape) > 1:
        t = Table(title="held-out error by the nodes (scale-up domains) the group spans", title_justify="left")
        for col in ("nodes", "dispatch", "combine"):
            t.add_column(col, justify="right")
        for nodes, mape in result.domain_mape.items():
            t.add_row(str(nodes), *(f"{mape[op]:.1%}" if op in mape else "-" for op in ("dispatch", "combine")))
        render.console.print(t)
    if f.out_fraction:
        render.console.print(f"leaving the scale-up domain adds {f.remote * 1e6:.2f} us", style="dim")


def calibrate_dispatch(db, device: str, table, source: str | None, system: str, out, seed: int,
                       json_out: bool, kernels: str = "low-latency") -> None:
    acc = _calibration_source(db, device, table, source, seed)
    result, provenance, note = _fit_dispatch(db, acc, table, source, seed, system, kernels)
    block = "dispatch normal" if kernels == "normal" else "dispatch"
    details = {"held_out_mape": result.op_mape,
               "held_out_mape_by_nodes": {str(nodes): mape for nodes, mape in result.domain_mape.items()}}
    _report_fit(db, acc, {block: result.as_yaml()}, {"all": result.held_out_p90}, provenance, [note], out,
                json_out, lambda: _dispatch_table(acc, provenance, result, kernels), details)


def _attention_block(results, mla=None) -> dict:
    block = {"prefill": {p: r.as_yaml() for (ph, p), r in results.items() if ph == "prefill"},
             "decode": {p: r.as_yaml() for (ph, p), r in results.items() if ph == "decode"}}
    if mla:
        block["mla"] = {ph: r.as_yaml() for ph, r in mla[0].items()}
    return block


def _decode_memory(results) -> float | None:
    """HBM fraction of the fitted decode attention kernel over an fp8 KV cache (else bf16), or None."""
    fit = results.get(("decode", "fp8")) or results.get(("decode", "bf16"))
    return fit.kernel.memory_fraction if fit else None


def _db_fp8_gemm(db, acc):
    """The device's fp8 GEMM kernel of a block-scaled checkpoint (DeepSeek-V3's), as its
    calibration entry fits it and serving runs it (perfmodel.machine.Machine.serving_kernel), or
    None."""
    from perfmodel.machine import gemm_kernel

    if "fp8" not in acc.peak_flops:
        return None
    cal = db.calibration(acc.name)
    if "fp8" in cal.block_scaled:
        return gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0,
                           fit=cal.block_scaled["fp8"])
    if "fp8" not in cal.gemm:
        return None
    return gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0).fused()


def _score_moe(acc, gemm):
    """(MAPE, table) of the fitted fp8 GEMM kernel on aiconfigurator's wide-EP MoE table, or None
    when the install has no such table for the device or no fp8 fit."""
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.calibrate import score_moe
    from perfmodel.hardware_db.timings import aiconfigurator_table, read_moe_timings

    if "fp8" not in gemm:
        return None
    try:
        path, provenance = aiconfigurator_table(acc.name, "moe/sglang", "wideep_generation_moe_perf.parquet")
    except SpecError:
        return None
    mape, _ = score_moe(gemm["fp8"].kernel.fused(), *read_moe_timings(path))
    return mape, provenance.split(", ", 1)[1]


def _fit_moe(db, acc, table, source, seed, gemm=None):
    """Grouped-GEMM fits by recipe on measured MoE layers (aiconfigurator's TensorRT-LLM
    ``moe_perf`` table, or a table of that form), their source and note; None when an
    aiconfigurator install has no such rows for the device. The full-tile rates are those of the
    ``gemm`` fits refitted in the same run, else of the device's calibration entry."""
    from perfmodel.calibrate import fit_grouped_recipes
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.hardware_db.timings import aiconfigurator_moe_table, read_moe_layer_timings

    if not acc.compute_units:
        raise SpecError(f"{acc.name} has no compute_units (SMs / CUs) in the database; GEMM tiles need it: add "
                        f"compute_units: N to its entry (in a --hardware-db YAML; the vendor's datasheet gives N)")
    path, provenance = aiconfigurator_moe_table(acc.name) if source else (table, f"the measurements in {table.name}")
    try:
        timings = read_moe_layer_timings(path)
    except SpecError:
        if source:
            return None
        raise
    streaming = db.calibration(acc.name).hbm_fraction or 1.0   # vector ops' HBM share
    version = path.parent.name
    # The tensor cores' full-tile rate is the device's dense GEMM fit's (the grouped kernel adds costs
    # per group, per input pass and per tile, never a faster core).
    results = fit_grouped_recipes(
        acc, timings, streaming, seed,
        lambda kernels: f"TensorRT-LLM {version} {'/'.join(kernels)}" if source else "/".join(kernels),
        lambda math: gemm[math].kernel if gemm and math in gemm else db.calibration(acc.name).gemm.get(math))
    if not results:
        return None
    note = (f"grouped_gemm: routed experts' grouped GEMMs fitted by perfmodel calibrate moe (seed {seed}) on the "
            f"balanced rows of {provenance} ("
            + "; ".join(f"{p}: {r.backend}" for p, r in results.items())
            + "), less the permute and activation passes layer_ops runs beside them, at the full-tile rate of the "
              "device's GEMM fit where it has one; held out by MoE shape (half of "
              "the hidden / expert width / experts / top-k shapes): "
            + "; ".join(f"{p} {r.train_rows} rows fitted, {r.test_rows} held out, MAPE {r.held_out_mape:.1%} "
                        f"(p90 {r.held_out_p90:.1%})" for p, r in results.items()))
    return results, provenance, note


def _moe_table(acc, provenance, results) -> None:
    t = Table(title=f"MoE grouped GEMMs on {acc.name}, fitted on {provenance}", title_justify="left")
    for col in ("recipe", "compute", "memory", "launch (us)", "per group (us)", "input passes", "tile overhead",
                "held-out error (p90)"):
        t.add_column(col, justify="left" if col == "recipe" else "right",
                     whole=col == "recipe" or (None if col != "held-out error (p90)" else False))
    for p, r in results.items():
        k = r.kernel
        t.add_row(p, f"{k.compute_fraction:.1%}", f"{k.memory_fraction:.1%}", f"{k.launch_s * 1e6:.2f}",
                  f"{k.group_launch_s * 1e6:.3f}", f"{k.cast:.2f}", f"{k.tile_overhead:.2f}",
                  f"{r.held_out_mape:.1%} ({r.held_out_p90:.1%})")
    render.console.print(t)
    render.console.print("kernels: " + "; ".join(f"{p} {r.backend}" for p, r in results.items())
                  + "; held out by MoE shape: the shapes left out were never seen by the fit", style="dim")


def calibrate_moe(db, device: str, table, source: str | None, out, seed: int, json_out: bool,
                  backend: str = "trtllm") -> None:
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.machine import BACKEND_NAMES

    acc = _calibration_source(db, device, table, source, seed)
    if backend == "trtllm":
        fitted = _fit_moe(db, acc, table, source, seed)
    else:
        from .calibration_backends import fit_backend_moe
        fitted = fit_backend_moe(db, acc, table, source, seed, backend)
    if fitted is None:
        raise SpecError(f"this aiconfigurator install has no {BACKEND_NAMES[backend]} MoE rows for {acc.name}")
    results, provenance, note = fitted
    block = {p: r.as_yaml() for p, r in results.items()}
    _report_fit(db, acc, {"grouped_gemm": block} if backend == "trtllm" else
                {"serving_backends": {backend: {"grouped_gemm": block}}},
                {p: r.held_out_p90 for p, r in results.items()}, provenance, [note], out, json_out,
                lambda: _moe_table(acc, provenance, results))


def calibrate_attention(db, device: str, table, source: str | None, out, seed: int, json_out: bool,
                        backend: str = "trtllm") -> None:
    acc = _calibration_source(db, device, table, source, seed)
    if backend == "trtllm":
        results, provenance, note = _fit_attention(acc, table, source, seed)
        projections = _db_fp8_gemm(db, acc)
    else:
        from .calibration_backends import (backend_mla_note, backend_mla_projections, fit_backend_attention,
                                           fit_module_mla)
        results, provenance, note = fit_backend_attention(acc, table, source, seed, backend)
        projections = backend_mla_projections(db, acc, backend)
    mla = None if not source else _fit_mla(acc, projections, _decode_memory(results), seed) if backend != "vllm" \
        else fit_module_mla(acc, projections, _decode_memory(results), seed, backend)
    if mla and backend == "sglang":
        mla = (mla[0], mla[1], backend_mla_note(mla[2], backend))
    p90 = {f"{ph} {p}": r.held_out_p90 for (ph, p), r in results.items()}
    if mla:
        p90.update({f"mla {ph}": r.held_out_p90 for ph, r in mla[0].items()})
    block = _attention_block(results, mla)
    _report_fit(db, acc, {"attention": block} if backend == "trtllm" else
                {"serving_backends": {backend: {"attention": {k: v for k, v in block.items() if v}}}}, p90,
                provenance, [note, mla[2]] if mla else [note], out, json_out,
                lambda: _attention_table(acc, provenance, results, mla))


def _report_fit(db, acc, blocks: dict, p90: dict, provenance: str, notes: list[str], out, json_out: bool,
                print_table, details: dict | None = None) -> None:
    """Write one refitted family's blocks (with ``--out``) and print or emit the fit (with the
    fit's further held-out ``details`` in the JSON)."""
    written = write_calibration(db, acc, blocks, notes, out)
    if json_out:
        block = blocks if len(blocks) > 1 else next(iter(blocks.values()))
        emit_json({"device": acc.name, "source": provenance, "fit": block, "held_out_p90": p90,
                   "written": str(written) if written else None, **(details or {})})
        return
    print_table()
    if written:
        render.console.print(f"wrote {written} (use it with --hardware-db {out})")


def _attention_table(acc, provenance, results, mla=None) -> None:
    t = Table(title=f"attention kernels on {acc.name}, fitted on {provenance}", title_justify="left")
    for col in ("kernel", "compute", "memory", "launch", "per wave", "held-out error", "p90"):
        t.add_column(col, justify="left" if col == "kernel" else "right")
    rows = [(f"{phase} {p}" + (" KV" if phase == "decode" else ""), r) for (phase, p), r in results.items()]
    rows += [(f"mla {phase} (module)", r) for phase, r in (mla[0] if mla else {}).items()]
    for name, r in rows:
        k = r.kernel
        t.add_row(name, f"{k.compute_fraction:.1%}", f"{k.memory_fraction:.1%}", f"{k.launch_s * 1e6:.2f} us",
                  f"{k.tile_s * 1e6:.3f} us", f"{r.held_out_mape:.1%}", f"{r.held_out_p90:.1%}")
    render.console.print(t)
    if mla:
        render.console.print(f"mla: {mla[1]}", style="dim")


def calibrate_collectives(db, device: str, table, source: str | None, out, seed: int, json_out: bool) -> None:
    acc = _calibration_source(db, device, table, source, seed)
    result, provenance, note = _fit_collectives(acc, table, source, seed)
    block = result.as_yaml()
    written = write_calibration(db, acc, {"collectives": block}, [note], out)
    if json_out:
        emit_json({"device": acc.name, "source": provenance, "fit": block, "held_out_max": result.held_out_max,
                   "rows": {"fitted": result.train_rows, "held_out": result.test_rows},
                   "written": str(written) if written else None})
        return
    t = Table(title=f"collectives on {acc.name}, fitted on {provenance}", title_justify="left")
    for col in ("op", "low-latency launch", "its link share", "bandwidth launch", "its link share",
                "held-out error", "worst"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op, p in block["ops"].items():
        t.add_row(op, f"{p['ll_launch_us']:.2f} us", f"{p['ll_fraction']:.1%}", f"{p['launch_us']:.2f} us",
                  f"{p['fraction']:.1%}", f"{result.held_out_mape[op]:.1%}", f"{result.held_out_max[op]:.1%}")
    render.console.print(t)
    render.console.print(f"hop latency {block['hop_us']:.3f} us over {block['link_gb_per_s']:g} GB/s per direction; "
                  f"{result.train_rows} rows fitted, {result.test_rows} held out")
    if written:
        render.console.print(f"wrote {written} (use it with --hardware-db {out})")


def calibrate_gemm(db, device: str, table, source: str | None, out, seed: int, json_out: bool,
                   backend: str = "trtllm") -> None:
    acc = _calibration_source(db, device, table, source, seed)
    results, provenance, note = _fit_gemm(acc, table, source, seed, backend)
    blocks = _gemm_blocks(results)
    if backend != "trtllm":
        blocks = {"serving_backends": {backend: blocks}}
    _report_fit(db, acc, blocks,
                {p: r.held_out_p90 for p, r in results.items()}, provenance, [note], out, json_out,
                lambda: _gemm_table(acc, provenance, results))


def _gemm_table(acc, provenance, results) -> None:
    t = Table(title=f"GEMM kernels on {acc.name}, fitted on {provenance}", title_justify="left")
    for col in ("precision", "compute", "memory", "launch", "blend p", "tile overhead", "held-out error (p90)"):
        t.add_column(col, justify="left" if col == "precision" else "right", whole=col == "precision" or None)
    for p, r in results.items():
        k = r.kernel
        t.add_row(p + (" (cast)" if k.cast else ""), f"{k.compute_fraction:.1%}", f"{k.memory_fraction:.1%}",
                  f"{k.launch_s * 1e6:.2f} us", f"{k.sharpness:.2f}", f"{k.tile_overhead:.2f}",
                  f"{r.held_out_mape:.1%} ({r.held_out_p90:.1%})")
    render.console.print(t)
    if any(r.kernel.cast for r in results.values()):
        render.console.print("(cast): the fit includes the activation cast to the GEMM's input format", style="dim")


def calibrate_all(db, device: str, source: str | None, out, seed: int, json_out: bool) -> None:
    """Every kernel family aiconfigurator measured for the device: GEMMs, attention and NCCL collectives."""
    from perfmodel.hardware_db.errors import SpecError

    if source is None:
        raise SpecError("perfmodel calibrate needs --from aiconfigurator, or a family with your own timings: "
                        "perfmodel calibrate gemm|collectives --table FILE")
    acc = _calibration_source(db, device, None, source, seed)
    gemm, gemm_from, gemm_note = _fit_gemm(acc, None, source, seed)
    attention, attention_from, attention_note = _fit_attention(acc, None, source, seed)
    # The MLA module's projections as serving runs DeepSeek-V3's block-scaled checkpoint.
    projections = gemm["fp8_block"].kernel if "fp8_block" in gemm else gemm["fp8"].kernel.fused() if "fp8" in gemm \
        else None
    mla = _fit_mla(acc, projections, _decode_memory(attention), seed)
    coll, coll_from, coll_note = _fit_collectives(acc, None, source, seed)
    dispatch, dispatch_from, dispatch_note = _fit_dispatch(db, acc, None, source, seed, None)
    normal, normal_from, normal_note = _fit_dispatch(db, acc, None, source, seed, None, "normal")
    moe = _score_moe(acc, gemm)
    grouped = _fit_moe(db, acc, None, source, seed, gemm)
    blocks = _gemm_blocks(gemm) | {"attention": _attention_block(attention, mla), "collectives": coll.as_yaml(),
                                   "dispatch": dispatch.as_yaml(), "dispatch normal": normal.as_yaml()}
    if grouped:
        blocks["grouped_gemm"] = {p: r.as_yaml() for p, r in grouped[0].items()}
    notes = [gemm_note, attention_note] + ([mla[2]] if mla else []) + [coll_note, dispatch_note, normal_note] \
        + ([grouped[2]] if grouped else [])
    written = write_calibration(db, acc, blocks, notes, out)
    families = {f"gemm {p}": r.held_out_mape for p, r in gemm.items()}
    families.update({f"attention {ph} {p}": r.held_out_mape for (ph, p), r in attention.items()})
    families.update({f"mla {ph} (module)": r.held_out_mape for ph, r in (mla[0] if mla else {}).items()})
    if moe is not None:
        families["moe fp8 (the fp8 GEMM fit, scored, not refitted)"] = moe[0]
    families.update({f"moe grouped gemm {p}": r.held_out_mape for p, r in (grouped[0] if grouped else {}).items()})
    families.update({f"nccl {op}": v for op, v in coll.held_out_mape.items()})
    families.update({f"deepep low-latency {op}": v for op, v in dispatch.op_mape.items()})
    families.update({f"deepep normal {op}": v for op, v in normal.op_mape.items()})
    if json_out:
        emit_json({"device": acc.name, "sources": {"gemm": gemm_from, "attention": attention_from,
                                                   "mla": mla[1] if mla else None,
                                                   "collectives": coll_from, "dispatch": dispatch_from,
                                                   "dispatch normal": normal_from, "moe": moe[1] if moe else None,
                                                   "grouped_gemm": grouped[1] if grouped else None},
                   "held_out_mape": families, "fit": blocks, "written": str(written) if written else None})
        return
    _gemm_table(acc, gemm_from, gemm)
    _attention_table(acc, attention_from, attention, mla)
    _dispatch_table(acc, dispatch_from, dispatch)
    _dispatch_table(acc, normal_from, normal, "normal")
    if grouped:
        _moe_table(acc, grouped[1], grouped[0])
    t = Table(title=f"held-out error per kernel family on {acc.name}", title_justify="left")
    t.add_column("family")
    t.add_column("held-out MAPE", justify="right")
    for name, v in families.items():
        t.add_row(name, f"{v:.1%}")
    render.console.print(t)
    if moe is not None:
        render.console.print(f"moe: the uniformly routed rows of {moe[1]}", style="dim")
    if written:
        render.console.print(f"wrote {written} (use it with --hardware-db {out})")
