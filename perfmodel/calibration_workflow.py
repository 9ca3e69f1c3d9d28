"""The ``perfmodel calibrate`` workflow: which rows of the measured tables each kernel family's fit
reads (hardware_db.timings reads them; perfmodel.calibration_engines picks the serving engines'
own), running the fits of perfmodel.calibrate on them, and assembling what a run writes: the
calibration blocks (in the YAML file's units), their source lines, the held-out errors and the
provenance, as typed results. No printing and no file writing: the CLI's view prints a run, and
hardware_db.writer writes its entry."""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfmodel.hardware_db.errors import SpecError
from perfmodel.hardware_db.timings import (BLOCK_SCALED, MAX_DECODE_GROUP, WEIGHT_ONLY, aiconfigurator_cast_launch,
                                           aiconfigurator_dispatch_tables, aiconfigurator_moe_table,
                                           aiconfigurator_table, aiconfigurator_weight_only_table,
                                           read_attention_timings, read_dispatch_timings, read_gemm_timings,
                                           read_mla_timings, read_moe_layer_timings, read_moe_timings,
                                           read_normal_dispatch_timings, read_timings)
from perfmodel.hardware_db.writer import file_units

from .calibrate import (FamilyFit, fit_attention_groups, fit_collectives, fit_dispatch, fit_gemm, fit_grouped_recipes,
                        fit_mla, fit_normal_dispatch, score_moe)
from .calibration_engines import (GEMM_BACKENDS, INPUT_BYTES, backend_mla_note, backend_mla_projections,
                                  fit_backend_attention, fit_backend_gemm, fit_backend_moe, fit_module_mla)
from .catalog import load_model
from .machine import BACKEND_NAMES, gemm_kernel


@dataclass(frozen=True)
class Refit:
    """One family's run of ``perfmodel calibrate``: the blocks it writes into the device's
    calibration entry (the YAML file's units; an engine's under ``serving_backends``), their
    source lines, the held-out errors as its JSON reports them (``held_out_p90`` by kernel, and
    a family's further ones), the measurements' provenance, and the fits a view shows (with the
    MLA core's beside attention's)."""

    device: str
    blocks: dict
    notes: tuple[str, ...]
    held_out: dict
    provenance: str
    family: FamilyFit
    mla: FamilyFit | None = None


@dataclass(frozen=True)
class FullRefit:
    """``perfmodel calibrate --from aiconfigurator``: every kernel family the install measured for
    the device, the blocks and source lines written, and the held-out MAPE per family. ``moe`` is
    the fp8 GEMM fit's (MAPE, table) on the wide-EP MoE rows (scored, not refitted); ``mla`` and
    ``grouped`` are None where the install has no such tables."""

    device: str
    blocks: dict
    notes: tuple[str, ...]
    held_out_mape: dict
    gemm: FamilyFit
    attention: FamilyFit
    mla: FamilyFit | None
    collectives: FamilyFit
    dispatch: FamilyFit
    normal: FamilyFit
    moe: tuple[float, str] | None
    grouped: FamilyFit | None

    def sources(self) -> dict:
        """Where each family's timings came from (None: not measured there)."""
        return {"gemm": self.gemm.provenance, "attention": self.attention.provenance,
                "mla": self.mla.provenance if self.mla else None, "collectives": self.collectives.provenance,
                "dispatch": self.dispatch.provenance, "dispatch normal": self.normal.provenance,
                "moe": self.moe[1] if self.moe else None,
                "grouped_gemm": self.grouped.provenance if self.grouped else None}


def calibration_device(db, device: str, table, source: str | None, seed: int):
    """The accelerator, once the shared flags are checked: timings from exactly one of ``table``
    and ``source`` (aiconfigurator), and a seed numpy accepts."""
    acc = db.accelerator(device)
    if (table is None) == (source is None):
        raise SpecError("give the timings with --table FILE or --from aiconfigurator (one of the two)")
    if source is not None and source != "aiconfigurator":
        raise SpecError(f"--from needs aiconfigurator, has {source!r}")
    if not 0 <= seed < 2**32:
        raise SpecError(f"--seed needs 0 to 2**32 - 1, has {seed}")
    return acc


def fit_collectives_family(acc, table, source, seed) -> FamilyFit:
    """The NCCL ops' fit on measured collectives (aiconfigurator's NCCL table, or a table of
    that form) at the device's scale-up link, its source and note."""
    path, provenance = aiconfigurator_table(acc.name) if source else (table, f"the measurements in {table.name}")
    ops, ranks, size, seconds = read_timings(path)
    result = fit_collectives(ops, ranks, size, seconds, acc.scale_up_bytes_per_s, seed=seed)
    mape = ", ".join(f"{op} {v:.1%}" for op, v in result.held_out_mape.items())
    note = (f"collectives: fitted by perfmodel calibrate (seed {seed}) on {provenance}: "
            f"{result.train_rows} rows fitted, {result.test_rows} held out; held-out MAPE {mape}")
    return FamilyFit(result, provenance, note)


def fit_gemm_family(acc, table, source, seed, backend: str = "trtllm") -> FamilyFit:
    """GEMM fits by precision on ``backend``'s measured GEMMs (aiconfigurator's table of that
    serving engine, or a table of that form), their source and note."""
    if backend not in GEMM_BACKENDS:
        raise SpecError(f"--backend needs one of {', '.join(GEMM_BACKENDS)}, has {backend!r}")
    if not acc.compute_units:
        raise SpecError(f"{acc.name} has no compute_units (SMs / CUs) in the database; GEMM tiles need it: add "
                        f"compute_units: N to its entry (in a --hardware-db YAML; the vendor's datasheet gives N)")
    if backend != "trtllm":
        return fit_backend_gemm(acc, table, source, seed, backend)
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
    return FamilyFit(results, provenance, note)


def gemm_blocks(results) -> dict:
    """The ``gemm`` block (by precision) and, when measured, the ``weight_only`` one (by weight
    format) and the ``block_scaled`` one (by math precision)."""
    blocks = {"gemm": {p: r.as_yaml() for p, r in results.items() if p not in WEIGHT_ONLY and p not in BLOCK_SCALED}}
    weight_only = {WEIGHT_ONLY[p][0]: r.as_yaml() for p, r in results.items() if p in WEIGHT_ONLY}
    block = {BLOCK_SCALED[p]: r.as_yaml() for p, r in results.items() if p in BLOCK_SCALED}
    return blocks | ({"weight_only": weight_only} if weight_only else {}) | ({"block_scaled": block} if block else {})


def fit_attention_family(acc, table, source, seed) -> FamilyFit:
    """Prefill fits by attention precision and decode fits by KV precision, their source and note."""
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
    return FamilyFit(results, provenance, note)


def fit_mla_family(acc, gemm, decode_memory, seed) -> FamilyFit | None:
    """MLA core fits by phase on aiconfigurator's SGLang wide-EP MLA module tables (DeepSeek-V3),
    with the device's fitted fp8 ``gemm`` kernel for the module's projections (block-scaled where
    fitted, as serving runs the checkpoint) and, in decode, the
    HBM fraction ``decode_memory`` of its fitted decode attention; their source and note; None
    when the install has no such tables for the device or there is no fp8 GEMM fit."""
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
    return FamilyFit(results, provenance, note)


KERNELS = ("low-latency", "normal")


def fit_dispatch_family(db, acc, table, source, seed, system_name, kernels: str = "low-latency") -> FamilyFit:
    """The dispatch / combine fit of DeepEP's ``kernels`` (low-latency or normal), its source and
    note: aiconfigurator's DeepEP tables with the link bandwidths its system file gives, or a CSV
    with those of ``system_name``'s links. The normal kernels' rows are those on ``exchange-sms``
    SMs, the share prefill's model gives them."""
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
    return FamilyFit(result, provenance, note)


def attention_block(results, mla=None) -> dict:
    """The ``attention`` block: prefill and decode fits by precision, and the MLA core's by phase
    (``mla``, when fitted)."""
    block = {"prefill": {p: r.as_yaml() for (ph, p), r in results.items() if ph == "prefill"},
             "decode": {p: r.as_yaml() for (ph, p), r in results.items() if ph == "decode"}}
    if mla:
        block["mla"] = {ph: r.as_yaml() for ph, r in mla.items()}
    return block


def decode_hbm_fraction(results) -> float | None:
    """HBM fraction of the fitted decode attention kernel over an fp8 KV cache (else bf16), or None."""
    fit = results.get(("decode", "fp8")) or results.get(("decode", "bf16"))
    return fit.kernel.memory_fraction if fit else None


def db_fp8_gemm(db, acc):
    """The device's fp8 GEMM kernel of a block-scaled checkpoint (DeepSeek-V3's), as its
    calibration entry fits it and serving runs it (perfmodel.machine.Machine.serving_kernel), or
    None."""
    if "fp8" not in acc.peak_flops:
        return None
    cal = db.calibration(acc.name)
    if "fp8" in cal.block_scaled:
        return gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0,
                           fit=cal.block_scaled["fp8"])
    if "fp8" not in cal.gemm:
        return None
    return gemm_kernel(acc.peak_flops["fp8"], acc.hbm_bytes_per_s, cal, db.calibration_default(), "fp8", 1.0).fused()


def score_moe_family(acc, gemm) -> tuple[float, str] | None:
    """(MAPE, table) of the fitted fp8 GEMM kernel on aiconfigurator's wide-EP MoE table, or None
    when the install has no such table for the device or no fp8 fit."""
    if "fp8" not in gemm:
        return None
    try:
        path, provenance = aiconfigurator_table(acc.name, "moe/sglang", "wideep_generation_moe_perf.parquet")
    except SpecError:
        return None
    mape, _ = score_moe(gemm["fp8"].kernel.fused(), *read_moe_timings(path))
    return mape, provenance.split(", ", 1)[1]


def fit_moe_family(db, acc, table, source, seed, gemm=None) -> FamilyFit | None:
    """Grouped-GEMM fits by recipe on measured MoE layers (aiconfigurator's TensorRT-LLM
    ``moe_perf`` table, or a table of that form), their source and note; None when an
    aiconfigurator install has no such rows for the device. The full-tile rates are those of the
    ``gemm`` fits refitted in the same run, else of the device's calibration entry."""
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
    return FamilyFit(results, provenance, note)


def refit_gemm(db, device: str, table, source: str | None, seed: int, backend: str = "trtllm") -> Refit:
    """``calibrate gemm``: the ``gemm`` (and ``weight_only`` / ``block_scaled``) blocks by
    precision, of TensorRT-LLM's kernels or under ``serving_backends.<backend>``."""
    acc = calibration_device(db, device, table, source, seed)
    fit = fit_gemm_family(acc, table, source, seed, backend)
    blocks = gemm_blocks(fit.fits)
    if backend != "trtllm":
        blocks = {"serving_backends": {backend: blocks}}
    return Refit(acc.name, blocks, (fit.note,), {"held_out_p90": {p: r.held_out_p90 for p, r in fit.fits.items()}},
                 fit.provenance, fit)


def refit_attention(db, device: str, table, source: str | None, seed: int, backend: str = "trtllm") -> Refit:
    """``calibrate attention``: prefill and decode kernels, and with aiconfigurator's tables the
    MLA core beside them (its projections at the device's block-scaled fp8 GEMM fit)."""
    acc = calibration_device(db, device, table, source, seed)
    if backend == "trtllm":
        fit = fit_attention_family(acc, table, source, seed)
        projections = db_fp8_gemm(db, acc)
    else:
        fit = fit_backend_attention(acc, table, source, seed, backend)
        projections = backend_mla_projections(db, acc, backend)
    memory = decode_hbm_fraction(fit.fits)
    mla = None if not source else fit_mla_family(acc, projections, memory, seed) if backend != "vllm" \
        else fit_module_mla(acc, projections, memory, seed, backend)
    if mla and backend == "sglang":
        mla = replace(mla, note=backend_mla_note(mla.note, backend))
    p90 = {f"{ph} {p}": r.held_out_p90 for (ph, p), r in fit.fits.items()}
    if mla:
        p90.update({f"mla {ph}": r.held_out_p90 for ph, r in mla.fits.items()})
    block = attention_block(fit.fits, mla.fits if mla else None)
    blocks = {"attention": block} if backend == "trtllm" else \
        {"serving_backends": {backend: {"attention": {k: v for k, v in block.items() if v}}}}
    return Refit(acc.name, blocks, (fit.note, mla.note) if mla else (fit.note,), {"held_out_p90": p90},
                 fit.provenance, fit, mla)


def refit_collectives(db, device: str, table, source: str | None, seed: int) -> Refit:
    """``calibrate collectives``: the NCCL ops' ``collectives`` block; held out: the worst error
    per op and the rows each way."""
    acc = calibration_device(db, device, table, source, seed)
    fit = fit_collectives_family(acc, table, source, seed)
    result = fit.fits
    held_out = {"held_out_max": result.held_out_max,
                "rows": {"fitted": result.train_rows, "held_out": result.test_rows}}
    return Refit(acc.name, {"collectives": result.as_yaml()}, (fit.note,), held_out, fit.provenance, fit)


def refit_dispatch(db, device: str, table, source: str | None, system: str, seed: int,
                   kernels: str = "low-latency") -> Refit:
    """``calibrate dispatch``: DeepEP's ``kernels`` (its normal ones under ``dispatch.normal``);
    held out: the p90, the MAPE per op and by the nodes a group spans."""
    acc = calibration_device(db, device, table, source, seed)
    fit = fit_dispatch_family(db, acc, table, source, seed, system, kernels)
    result = fit.fits
    held_out = {"held_out_p90": {"all": result.held_out_p90}, "held_out_mape": result.op_mape,
                "held_out_mape_by_nodes": {str(nodes): mape for nodes, mape in result.domain_mape.items()}}
    block = "dispatch normal" if kernels == "normal" else "dispatch"
    return Refit(acc.name, {block: result.as_yaml()}, (fit.note,), held_out, fit.provenance, fit)


def refit_moe(db, device: str, table, source: str | None, seed: int, backend: str = "trtllm") -> Refit:
    """``calibrate moe``: the routed experts' ``grouped_gemm`` block by recipe, of TensorRT-LLM's
    kernels or under ``serving_backends.<backend>``."""
    acc = calibration_device(db, device, table, source, seed)
    fit = fit_moe_family(db, acc, table, source, seed) if backend == "trtllm" \
        else fit_backend_moe(db, acc, table, source, seed, backend)
    if fit is None:
        raise SpecError(f"this aiconfigurator install has no {BACKEND_NAMES[backend]} MoE rows for {acc.name}")
    block = {p: r.as_yaml() for p, r in fit.fits.items()}
    blocks = {"grouped_gemm": block} if backend == "trtllm" \
        else {"serving_backends": {backend: {"grouped_gemm": block}}}
    return Refit(acc.name, blocks, (fit.note,), {"held_out_p90": {p: r.held_out_p90 for p, r in fit.fits.items()}},
                 fit.provenance, fit)


def refit_all(db, device: str, source: str | None, seed: int) -> FullRefit:
    """Every kernel family aiconfigurator measured for the device: GEMMs, attention and its MLA
    core, NCCL collectives, DeepEP's two exchanges and the routed experts' grouped GEMMs."""
    if source is None:
        raise SpecError("perfmodel calibrate needs --from aiconfigurator, or a family with your own timings: "
                        "perfmodel calibrate gemm|collectives --table FILE")
    acc = calibration_device(db, device, None, source, seed)
    gemm = fit_gemm_family(acc, None, source, seed)
    attention = fit_attention_family(acc, None, source, seed)
    # The MLA module's projections as serving runs DeepSeek-V3's block-scaled checkpoint.
    fits = gemm.fits
    projections = fits["fp8_block"].kernel if "fp8_block" in fits else fits["fp8"].kernel.fused() if "fp8" in fits \
        else None
    mla = fit_mla_family(acc, projections, decode_hbm_fraction(attention.fits), seed)
    coll = fit_collectives_family(acc, None, source, seed)
    dispatch = fit_dispatch_family(db, acc, None, source, seed, None)
    normal = fit_dispatch_family(db, acc, None, source, seed, None, "normal")
    moe = score_moe_family(acc, fits)
    grouped = fit_moe_family(db, acc, None, source, seed, fits)
    blocks = gemm_blocks(fits) | {"attention": attention_block(attention.fits, mla.fits if mla else None),
                                  "collectives": coll.fits.as_yaml(), "dispatch": dispatch.fits.as_yaml(),
                                  "dispatch normal": normal.fits.as_yaml()}
    if grouped:
        blocks["grouped_gemm"] = {p: r.as_yaml() for p, r in grouped.fits.items()}
    notes = [gemm.note, attention.note] + ([mla.note] if mla else []) + [coll.note, dispatch.note, normal.note] \
        + ([grouped.note] if grouped else [])
    families = {f"gemm {p}": r.held_out_mape for p, r in fits.items()}
    families.update({f"attention {ph} {p}": r.held_out_mape for (ph, p), r in attention.fits.items()})
    families.update({f"mla {ph} (module)": r.held_out_mape for ph, r in (mla.fits if mla else {}).items()})
    if moe is not None:
        families["moe fp8 (the fp8 GEMM fit, scored, not refitted)"] = moe[0]
    families.update({f"moe grouped gemm {p}": r.held_out_mape for p, r in (grouped.fits if grouped else {}).items()})
    families.update({f"nccl {op}": v for op, v in coll.fits.held_out_mape.items()})
    families.update({f"deepep low-latency {op}": v for op, v in dispatch.fits.op_mape.items()})
    families.update({f"deepep normal {op}": v for op, v in normal.fits.op_mape.items()})
    return FullRefit(acc.name, blocks, tuple(notes), families, gemm, attention, mla, coll, dispatch, normal, moe,
                     grouped)


def calibration_entry(db, device: str, blocks: dict, notes) -> dict:
    """The device's calibration entry with ``blocks`` replaced (an engine's families under
    ``serving_backends`` each on its own) and ``notes`` replacing those blocks' old source lines;
    the blocks not refitted kept, in the YAML file's units (hardware_db.writer.file_units)."""
    acc = db.accelerator(device)
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
        # Blocks not refitted stay (the loader holds them in SI).
        if own.collectives is not None and "collectives" not in blocks:
            entry["collectives"] = file_units(own.collectives)
        for key in ("gemm", "weight_only", "block_scaled"):
            if getattr(own, key) and "gemm" not in blocks:
                entry[key] = file_units(dict(getattr(own, key)))
        if own.attention is not None and "attention" not in blocks:
            entry["attention"] = file_units(own.attention)
        if own.grouped_gemm and "grouped_gemm" not in blocks:
            entry["grouped_gemm"] = file_units(dict(own.grouped_gemm))
        if own.dispatch is not None and "dispatch" not in blocks:
            entry["dispatch"] = file_units(own.dispatch, exclude_none=True)
        if own.serving_backends:
            # Each serving engine's fits of a family stay unless this run refits that engine's family.
            kept = file_units(dict(own.serving_backends), exclude_defaults=True)
            new = blocks.get("serving_backends", {})
            blocks["serving_backends"] = {b: kept.get(b, {}) | new.get(b, {}) for b in kept | new}
    entry.update(blocks)
    kept = own.dispatch.normal if own is not None and own.dispatch is not None else None
    if normal is None and kept is not None and "normal" not in entry.get("dispatch", {}):
        normal = file_units(kept, exclude_none=True)
    if normal is not None:
        if "dispatch" not in entry:
            raise SpecError(f"{acc.name} has no low-latency dispatch fit for the normal kernels' fit to sit beside; "
                            "fit it first: perfmodel calibrate dispatch --kernels low-latency")
        entry["dispatch"] = {**entry["dispatch"], "normal": normal}
    entry["sources"] = [s for s in (own.sources if own else ()) if not any(s.startswith(f"{b}:") for b in refitted)] \
        + list(notes)
    return entry
