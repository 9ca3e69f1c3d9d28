"""``perfmodel calibrate``'s view: runs a family's refit (perfmodel.calibration_workflow fits the
measured tables), writes its calibration entry with ``--out`` (hardware_db.writer, in the file's
units) and prints the fit as tables or one JSON document."""

from __future__ import annotations

from . import render
from .deliver import emit_json
from .render import Table


def write_calibration(db, device: str, blocks: dict, notes, out):
    """Write ``out``/calibration-<device>.yaml: the device's calibration entry with ``blocks``
    refitted and ``notes`` as their source lines; the path, or None when ``out`` is None."""
    from perfmodel.calibration_workflow import calibration_entry
    from perfmodel.hardware_db.writer import write_entries

    if out is None:
        return None
    entry = calibration_entry(db, device, blocks, notes)
    return write_entries(out, f"calibration-{device}.yaml", "calibrations", [entry])


def _report(db, refit, out, json_out: bool, print_table) -> None:
    """Write one family's refit (with ``--out``) and print or emit it."""
    written = write_calibration(db, refit.device, refit.blocks, refit.notes, out)
    if json_out:
        blocks = refit.blocks
        emit_json({"device": refit.device, "source": refit.provenance,
                   "fit": blocks if len(blocks) > 1 else next(iter(blocks.values())),
                   "written": str(written) if written else None, **refit.held_out})
        return
    print_table()
    _wrote(written, out)


def _wrote(written, out) -> None:
    if written:
        render.console.print(f"wrote {written} (use it with --hardware-db {out})")


def calibrate_gemm(db, device: str, table, source: str | None, out, seed: int, json_out: bool,
                   backend: str = "trtllm") -> None:
    from perfmodel.calibration_workflow import refit_gemm

    refit = refit_gemm(db, device, table, source, seed, backend)
    _report(db, refit, out, json_out, lambda: _gemm_table(refit.device, refit.family))


def calibrate_attention(db, device: str, table, source: str | None, out, seed: int, json_out: bool,
                        backend: str = "trtllm") -> None:
    from perfmodel.calibration_workflow import refit_attention

    refit = refit_attention(db, device, table, source, seed, backend)
    _report(db, refit, out, json_out, lambda: _attention_table(refit.device, refit.family, refit.mla))


def calibrate_dispatch(db, device: str, table, source: str | None, system: str, out, seed: int,
                       json_out: bool, kernels: str = "low-latency") -> None:
    from perfmodel.calibration_workflow import refit_dispatch

    refit = refit_dispatch(db, device, table, source, system, seed, kernels)
    _report(db, refit, out, json_out, lambda: _dispatch_table(refit.device, refit.family, kernels))


def calibrate_moe(db, device: str, table, source: str | None, out, seed: int, json_out: bool,
                  backend: str = "trtllm") -> None:
    from perfmodel.calibration_workflow import refit_moe

    refit = refit_moe(db, device, table, source, seed, backend)
    _report(db, refit, out, json_out, lambda: _moe_table(refit.device, refit.family))


def calibrate_collectives(db, device: str, table, source: str | None, out, seed: int, json_out: bool) -> None:
    from perfmodel.calibration_workflow import refit_collectives

    refit = refit_collectives(db, device, table, source, seed)
    _report(db, refit, out, json_out,
            lambda: _collectives_table(refit.device, refit.family, refit.blocks["collectives"]))


def calibrate_all(db, device: str, source: str | None, out, seed: int, json_out: bool) -> None:
    """Every kernel family aiconfigurator measured for the device: GEMMs, attention and NCCL collectives."""
    from perfmodel.calibration_workflow import refit_all

    refit = refit_all(db, device, source, seed)
    written = write_calibration(db, refit.device, refit.blocks, refit.notes, out)
    if json_out:
        emit_json({"device": refit.device, "sources": refit.sources(), "held_out_mape": refit.held_out_mape,
                   "fit": refit.blocks, "written": str(written) if written else None})
        return
    _gemm_table(refit.device, refit.gemm)
    _attention_table(refit.device, refit.attention, refit.mla)
    _dispatch_table(refit.device, refit.dispatch)
    _dispatch_table(refit.device, refit.normal, "normal")
    if refit.grouped:
        _moe_table(refit.device, refit.grouped)
    t = Table(title=f"held-out error per kernel family on {refit.device}", title_justify="left")
    t.add_column("family")
    t.add_column("held-out MAPE", justify="right")
    for name, v in refit.held_out_mape.items():
        t.add_row(name, f"{v:.1%}")
    render.console.print(t)
    if refit.moe is not None:
        render.console.print(f"moe: the uniformly routed rows of {refit.moe[1]}", style="dim")
    _wrote(written, out)


def _gemm_table(device: str, fit) -> None:
    t = Table(title=f"GEMM kernels on {device}, fitted on {fit.provenance}", title_justify="left")
    for col in ("precision", "compute", "memory", "launch", "blend p", "tile overhead", "held-out error (p90)"):
        t.add_column(col, justify="left" if col == "precision" else "right", whole=col == "precision" or None)
    for p, r in fit.fits.items():
        k = r.kernel
        t.add_row(p + (" (cast)" if k.cast else ""), f"{k.compute_fraction:.1%}", f"{k.memory_fraction:.1%}",
                  f"{k.launch_s * 1e6:.2f} us", f"{k.sharpness:.2f}", f"{k.tile_overhead:.2f}",
                  f"{r.held_out_mape:.1%} ({r.held_out_p90:.1%})")
    render.console.print(t)
    if any(r.kernel.cast for r in fit.fits.values()):
        render.console.print("(cast): the fit includes the activation cast to the GEMM's input format", style="dim")


def _attention_table(device: str, fit, mla=None) -> None:
    t = Table(title=f"attention kernels on {device}, fitted on {fit.provenance}", title_justify="left")
    for col in ("kernel", "compute", "memory", "launch", "per wave", "held-out error", "p90"):
        t.add_column(col, justify="left" if col == "kernel" else "right")
    rows = [(f"{phase} {p}" + (" KV" if phase == "decode" else ""), r) for (phase, p), r in fit.fits.items()]
    rows += [(f"mla {phase} (module)", r) for phase, r in (mla.fits if mla else {}).items()]
    for name, r in rows:
        k = r.kernel
        t.add_row(name, f"{k.compute_fraction:.1%}", f"{k.memory_fraction:.1%}", f"{k.launch_s * 1e6:.2f} us",
                  f"{k.tile_s * 1e6:.3f} us", f"{r.held_out_mape:.1%}", f"{r.held_out_p90:.1%}")
    render.console.print(t)
    if mla:
        render.console.print(f"mla: {mla.provenance}", style="dim")


def _collectives_table(device: str, fit, block: dict) -> None:
    result = fit.fits
    t = Table(title=f"collectives on {device}, fitted on {fit.provenance}", title_justify="left")
    for col in ("op", "low-latency launch", "its link share", "bandwidth launch", "its link share",
                "held-out error", "worst"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op, p in block["ops"].items():
        t.add_row(op, f"{p['ll_launch_us']:.2f} us", f"{p['ll_fraction']:.1%}", f"{p['launch_us']:.2f} us",
                  f"{p['fraction']:.1%}", f"{result.held_out_mape[op]:.1%}", f"{result.held_out_max[op]:.1%}")
    render.console.print(t)
    render.console.print(f"hop latency {block['hop_us']:.3f} us over {block['link_gb_per_s']:g} GB/s per direction; "
                         f"{result.train_rows} rows fitted, {result.test_rows} held out")


def _dispatch_table(device: str, fit, kernels: str = "low-latency") -> None:
    result, f = fit.fits, fit.fits.fitted
    t = Table(title=f"expert dispatch and combine ({kernels} kernels) on {device}, fitted on {fit.provenance}",
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


def _moe_table(device: str, fit) -> None:
    t = Table(title=f"MoE grouped GEMMs on {device}, fitted on {fit.provenance}", title_justify="left")
    for col in ("recipe", "compute", "memory", "launch (us)", "per group (us)", "input passes", "tile overhead",
                "held-out error (p90)"):
        t.add_column(col, justify="left" if col == "recipe" else "right",
                     whole=col == "recipe" or (None if col != "held-out error (p90)" else False))
    for p, r in fit.fits.items():
        k = r.kernel
        t.add_row(p, f"{k.compute_fraction:.1%}", f"{k.memory_fraction:.1%}", f"{k.launch_s * 1e6:.2f}",
                  f"{k.group_launch_s * 1e6:.3f}", f"{k.cast:.2f}", f"{k.tile_overhead:.2f}",
                  f"{r.held_out_mape:.1%} ({r.held_out_p90:.1%})")
    render.console.print(t)
    render.console.print("kernels: " + "; ".join(f"{p} {r.backend}" for p, r in fit.fits.items())
                         + "; held out by MoE shape: the shapes left out were never seen by the fit", style="dim")
