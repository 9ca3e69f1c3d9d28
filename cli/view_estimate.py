"""One plan's prediction: ``estimate train`` and ``estimate serve`` as tables, JSON, CSV, charts and launch files."""

from __future__ import annotations

from .columns import csv_of, csv_only
from .deliver import delivered, report_files
from .render import (console, constants_text, estimate_train_tables, fmt, header_line, kv_table, memory_table,
                     ops_table, print_remarks, seconds_text, span_text, time_columns, time_records, times_table,
                     train_doc, train_export, usd_text)
from .units import joules, watts


def _components_csv(report) -> list[dict]:
    """``estimate train --csv``: the step time's components (``time_columns``)."""
    return csv_of(time_columns(), time_records(report["time_components_s"]))


def serve_document(spec, machine, plan, work, report) -> dict:
    """The JSON document of one serving estimate (``estimate serve --json``; charts read it); a
    training estimate's is ``render.train_doc``, which plan train's charts share."""
    return {"model": spec.name, "system": machine.system.name, "devices": machine.devices,
            "plan": vars(plan), "workload": vars(work), "result": report}


def _phases_csv(report) -> list[dict]:
    """``estimate serve --csv``: the prefill's and a decode step's components, each with its phase."""
    records = [r for phase in ("prefill", "decode")
               for r in time_records(report[f"{phase}_components_s"], phase=phase)]
    return csv_of([csv_only("phase")] + time_columns(), records)


def estimate_train(spec, machine, plan, work, output=None, model_ref: str | None = None, db=None) -> None:
    from perfmodel.report import check_feasible, interleave_hint, train_report
    from perfmodel.training import estimate_training

    from .options import EstimateOutput

    output = output or EstimateOutput()
    result = estimate_training(spec, machine, plan, work)
    check_feasible(result, machine)
    report = train_report(result, machine, spec, plan.dispatcher)
    hint = interleave_hint(spec, machine, plan, work, result)
    if hint:
        report["hint"] = hint
    doc = train_doc(spec, machine, plan, work, report)
    from perfmodel.report import host_placements

    placements = host_placements(spec, machine, plan, work)
    if placements:
        doc["host_placements_step_s"] = placements
    export = train_export(spec, machine, plan, work, model_ref or spec.name)
    if delivered(doc, output, lambda: _components_csv(report), dict.fromkeys(("breakdown", "roofline", "memory"),
                 lambda: doc), "breakdown", export):
        return
    estimate_train_tables(spec, machine, plan, work, report, db)
    if placements:
        names = {"ddr": "all in DDR", "cxl": "all in CXL (naive)", "ddr+cxl": "DDR + CXL by bandwidth (CXL-aware)"}
        console.print("the host-memory states placed each way: " + "; ".join(
            f"{names[k]} {seconds_text(v) if v != float('inf') else 'does not fit'}" for k, v in placements.items()),
            markup=False)
    report_files(doc)


def estimate_serve(spec, machine, plan, work, output=None, model_ref: str | None = None, db=None) -> None:
    from perfmodel.report import check_feasible, serve_report
    from perfmodel.serving import estimate_serving

    from .options import EstimateOutput

    output = output or EstimateOutput()
    result = estimate_serving(spec, machine, plan, work,
                              ("prefill", "decode", "mixed") if plan.chunk_tokens else ("prefill", "decode"))
    check_feasible(result, machine)
    report = serve_report(result, machine, spec, plan.backend)
    doc = serve_document(spec, machine, plan, work, report)

    def export(framework: str) -> dict[str, str]:
        from perfmodel.exports import instance_pool, serving_files

        return serving_files(framework, spec, [instance_pool(spec, machine, plan, work)], model_ref or spec.name)
    if delivered(doc, output, lambda: _phases_csv(report), dict.fromkeys(("breakdown", "roofline", "memory"),
                 lambda: doc), "breakdown", export):
        return
    _estimate_serve_tables(spec, machine, plan, work, report, db)
    report_files(doc)


def _estimate_serve_tables(spec, machine, plan, work, report, db=None) -> None:
    console.print(header_line(spec, machine, db), style="bold")
    console.print(f"instance: tp {plan.tp}, pp {plan.pp}, ep {plan.ep}, dp-attention {plan.dp_attention}, "
                  f"batch {plan.batch}; weights {plan.weight_precision}, activations {plan.activation_precision}, "
                  f"kv {plan.kv_precision}", markup=False)
    (tl, th), (pl, ph) = report["ttft_range_s"], report["tpot_range_s"]
    rows = [("time to first token", f"{seconds_text(report['ttft_s'])} (range {span_text(tl, th)})"),
            ("time per output token", f"{seconds_text(report['tpot_s'])} (range {span_text(pl, ph)})"),
            ("constants", constants_text(report)),
            ("devices per instance", fmt(report["devices_per_instance"])),
            ("largest batch the KV cache allows", fmt(report["max_batch"])),
            ("prefill tokens/s per device", fmt(report["prefill_tokens_per_s_per_device"])),
            ("decode tokens/s per device", fmt(report["decode_tokens_per_s_per_device"])),
            *([(f"prefill / decode tokens/s per package ({report['dies_per_package']} dies)",
                f"{fmt(report['prefill_tokens_per_s_per_package'])} / {fmt(report['decode_tokens_per_s_per_package'])}")]
              if "dies_per_package" in report else []),
            ("power per device, prefill / decode (with node share)",
             f"{watts(report['prefill_power_per_device_w'])} / {watts(report['power_per_device_w'])}"),
            ("energy per output token (with PUE)", joules(report["energy_per_token_j"])),
            ("cost per million output tokens", usd_text(report["cost_per_million_tokens_usd"]))]
    if "mixed_steps" in report:
        mixed = report["mixed_steps"]
        rows.insert(2, ("prompts as chunks in decode steps",
                        f"each step at full batch carries {fmt(mixed['chunk_prompt_tokens'])} prompt tokens per "
                        f"attention rank and takes {seconds_text(mixed['mixed_step_s'])}; a prompt's first token "
                        f"after its chunks: {seconds_text(mixed['ttft_s'])} (unloaded; plan serve adds the load)"))
    if plan.power_cap_w is not None:
        from perfmodel.report import oversubscription

        clock = report["clock_share"]
        rows.insert(-3, (f"power cap {watts(plan.power_cap_w)} per {machine.accelerator.name}",
                         f"clock {clock['prefill']:.0%} in prefill, {clock['decode']:.0%} in decode; a facility "
                         f"provisioned at the cap holds {oversubscription(machine, plan.power_cap_w):.2f}x the "
                         "devices provisioned at TDP"))
    if spec.moe and "expert_imbalance" in report:
        skew = report["expert_imbalance"]
        how = ("given by --moe-imbalance or --routing" if float(plan.moe_imbalance) > 0 else
               {"eplb": "EPLB over the default power-law routing", "none": "power-law routing, contiguous experts",
                "balanced": "assumed balanced"}[str(plan.expert_balance)])
        rows.insert(2, ("expert load, busiest / mean EP device",
                        ", ".join(f"{v:.2f} {k}" for k, v in skew.items()) + f" ({how})"))
    if spec.moe:
        rows.insert(2, ("EP all-to-all per output token", f"{seconds_text(report['ep_per_token_s'])} ("
                        + ("exposed: all of it" if not plan.overlap_comm else "exposed under two-batch overlap; "
                           "--overlap none gives all of it") + ")"))
    console.print(kv_table("summary", rows))
    print_remarks([report["constants_from"].get("caveat")])
    console.print(times_table("prefill (time to first token)", report["prefill_components_s"], report["ttft_s"]))
    # A decode step emits 1 + accepted draft tokens per sequence, so shares are of the step, not of TPOT.
    console.print(times_table("decode step", report["decode_components_s"],
                               sum(v for v in report["decode_components_s"].values() if v)))
    console.print(ops_table("operators", report["operators_s"]))
    for t in memory_table(report["memory_per_device_bytes"], report["memory_tiers"]):
        console.print(t)
    console.print(f"cost basis: {report['cost_basis']}", markup=False)
