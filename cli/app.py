"""The ``perfmodel`` command: flags and files in, rich tables or JSON out.

Heavy modules (pydantic, numpy, the database) are imported inside the commands, so that
``perfmodel --help`` answers at once. User errors print one line on stderr and exit 2 (3 when no
plan is feasible); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfmodel.defaults import SERVE_DEFAULTS, TRAIN_DEFAULTS

app = typer.Typer(
    name="perfmodel",
    help="Predict how large transformer models train and serve on real hardware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
hardware_app = typer.Typer(help="The hardware database: accelerators, CPUs, memory, links, systems.",
                           no_args_is_help=True)
models_app = typer.Typer(help="The model catalog.", no_args_is_help=True)
estimate_app = typer.Typer(help="Evaluate one given plan: time, memory, energy and cost breakdowns.",
                           no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(estimate_app, name="estimate")
plan_app = typer.Typer(help="Search for the best plan: the optimum, the Pareto front and the proof. "
                            "With no subcommand, runs a built-in example.", invoke_without_command=True)
app.add_typer(plan_app, name="plan")
calibrate_app = typer.Typer(help="Fit the cost model's constants to measured timings and write them as hardware "
                                 "database YAML.")
app.add_typer(calibrate_app, name="calibrate")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
Timing = Annotated[bool, typer.Option("--timing", help="Include seconds spent in --json.")]
Routing = Annotated[Optional[str], typer.Option(
    "--routing", help="Routing statistics file (.json, .csv or .npz; see README).")]
Zipf = Annotated[Optional[float], typer.Option(help="Synthetic routing: Zipf exponent of expert popularity.")]
Affinity = Annotated[float, typer.Option(help="Synthetic routing: share of tokens keeping their affine expert.")]
Seed = Annotated[int, typer.Option(help="Synthetic routing: random seed.")]
MoeImbalance = Annotated[float, typer.Option(help="Busiest over mean expert-parallel device load (0: the named "
                                                "constant moe-load-imbalance).")]
Pricing = Annotated[str, typer.Option(help="Cost basis: cloud (on-demand rent per device-hour) or owned (price over "
                                           "its depreciation life, network, facility and energy).")]
Price = Annotated[Optional[list[str]], typer.Option(
    "--price", help="Your all-in price for a system, SYSTEM=USD_PER_DEVICE_HOUR (repeatable; either basis).")]
HardwareDb = Annotated[Optional[list[Path]], typer.Option(
    "--hardware-db", help="Directory of YAML entries added over the built-in database (repeatable; "
                          "also PERFMODEL_HARDWARE_DB).")]


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"perfmodel {version('perfmodel')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("perfmodel (not installed)")
        raise typer.Exit()


@app.callback()
def main_callback(ctx: typer.Context, hardware_db: HardwareDb = None,
                  show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                             help="Print the version and exit.")] = False) -> None:
    ctx.obj = {"hardware_db": list(hardware_db or [])}


def database(ctx: typer.Context):
    """The database, with the user's directories from the environment and then the flag."""
    from hardware_db.loader import load_database, user_dirs_from_env

    root = ctx.find_root()
    dirs = user_dirs_from_env() + [str(d) for d in (root.obj or {}).get("hardware_db", [])]
    return load_database(dirs)


# --- hardware --------------------------------------------------------------------------------

@hardware_app.command("list")
def hardware_list(ctx: typer.Context, json_out: JsonFlag = False,
                  kind: Annotated[Optional[str], typer.Option(
                      help="Only this kind: accelerators, cpus, memory, links or systems.")] = None) -> None:
    """List the database's entries by kind."""
    from . import render

    db = database(ctx)
    render.hardware_list(db, kind, json_out)


@hardware_app.command("show")
def hardware_show(ctx: typer.Context, name: str, json_out: JsonFlag = False,
                  nodes: Annotated[Optional[int], typer.Option(help="Scale a system to this many nodes.")] = None
                  ) -> None:
    """Show one entry with its figures (SI units in JSON) and sources."""
    from . import render

    render.hardware_show(database(ctx), name, nodes, json_out)


# --- models ----------------------------------------------------------------------------------

@models_app.command("list")
def models_list(json_out: JsonFlag = False) -> None:
    """List the built-in models with their parameter counts."""
    from . import render

    render.models_list(json_out)


@models_app.command("show")
def models_show(name: Annotated[str, typer.Argument(help="Catalog name, spec YAML or config.json path.")],
                json_out: JsonFlag = False,
                seq_len: Annotated[int, typer.Option(help="Sequence length for FLOPs per token.")] = 4096
                ) -> None:
    """Show a model's spec and derived quantities (parameters, FLOPs per token, KV cache)."""
    from hardware_db.errors import SpecError

    from . import render

    if not 1 <= seq_len <= 100_000_000:
        raise SpecError(f"--seq-len needs 1 to 100,000,000, has {seq_len}")
    render.models_show(name, seq_len, json_out)


# --- compare ---------------------------------------------------------------------------------

DEFAULT_COMPARE = ("h100-sxm", "b200", "mi300x", "ascend-910c")


@app.command()
def compare(ctx: typer.Context,
            names: Annotated[Optional[list[str]], typer.Argument(
                help=f"Accelerators or systems (default: {' '.join(DEFAULT_COMPARE)}).")] = None,
            json_out: JsonFlag = False) -> None:
    """Compare accelerators or systems side by side; the best value of each row is highlighted."""
    from . import render

    render.compare(database(ctx), list(names or DEFAULT_COMPARE), json_out)


# --- estimate --------------------------------------------------------------------------------

Model = Annotated[str, typer.Option("--model", help="Catalog name, spec YAML or config.json path.")]
SystemOpt = Annotated[str, typer.Option("--system", help="System name from the hardware database.")]
Devices = Annotated[Optional[int], typer.Option("--devices", help="Devices (default: one node of the system).")]


@estimate_app.command("train")
def estimate_train(
    ctx: typer.Context,
    model: Model = TRAIN_DEFAULTS["model"],
    system: SystemOpt = TRAIN_DEFAULTS["system"],
    devices: Annotated[int, typer.Option("--devices", help="Devices.")] = TRAIN_DEFAULTS["devices"],
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline stages.")] = 2,
    dp: Annotated[Optional[int], typer.Option(help="Data-parallel degree (default: fills the devices).")] = None,
    cp: Annotated[int, typer.Option(help="Context-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option(help="Expert-parallel degree (MoE; experts folded over tp x cp x dp).")] = 1,
    etp: Annotated[Optional[int], typer.Option(help="Expert tensor-parallel degree (default: tp).")] = None,
    interleave: Annotated[int, typer.Option(help="Virtual pipeline stages per device.")] = 1,
    micro_batch: Annotated[int, typer.Option(help="Sequences per microbatch.")] = 1,
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3.")] = 1,
    recompute: Annotated[str, typer.Option(help="none, selective or full.")] = "selective",
    sp: Annotated[bool, typer.Option("--sp/--no-sp", help="Sequence parallelism.")] = True,
    precision: Annotated[str, typer.Option(help="GEMM precision: bf16, fp16 or fp8.")] = TRAIN_DEFAULTS["precision"],
    offload_optimizer: Annotated[str, typer.Option(help="Where optimizer states live: hbm, ddr, cxl, pooled, nvme.")] = "hbm",
    offload_grads: Annotated[str, typer.Option(help="Where gradients live.")] = "hbm",
    offload_params: Annotated[str, typer.Option(help="Where parameters live.")] = "hbm",
    attention: Annotated[str, typer.Option(help="flash (causal FlashAttention) or standard (s x s scores "
                                                "written, as 2021 Megatron-LM).")] = "flash",
    dp_overlap: Annotated[bool, typer.Option("--dp-overlap/--no-dp-overlap", help="Overlap the gradient "
                                             "reduction with the backward pass.")] = True,
    overlap: Annotated[str, typer.Option(help="none (every transfer exposed), framework (as Megatron-LM and "
                                              "DeepSpeed schedule them) or ideal (all under compute).")] = "framework",
    tp_overlap: Annotated[bool, typer.Option("--tp-overlap/--no-tp-overlap", help="Megatron's TP-communication "
                                             "overlap with the GEMMs (needs --sp).")] = False,
    moe_imbalance: MoeImbalance = 0.0,
    pricing: Pricing = "cloud",
    price: Price = None,
    global_batch: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = TRAIN_DEFAULTS["global_batch"],
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = TRAIN_DEFAULTS["seq_len"],
    tokens: Annotated[float, typer.Option(help="Training tokens of the run (for run time, energy, cost).")] =
        TRAIN_DEFAULTS["tokens"],
    json_out: JsonFlag = False,
) -> None:
    """Evaluate one training plan: step time by component, MFU, memory per tier, energy and cost."""
    from . import render
    from .inputs import train_inputs

    spec, machine, plan, work = train_inputs(database(ctx), locals())
    render.estimate_train(spec, machine, plan, work, json_out)


@estimate_app.command("serve")
def estimate_serve(
    ctx: typer.Context,
    model: Model = SERVE_DEFAULTS["model"],
    system: SystemOpt = SERVE_DEFAULTS["system"],
    devices: Devices = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree per instance.")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline stages per instance.")] = 1,
    ep: Annotated[int, typer.Option(help="Expert-parallel degree (MoE; experts folded over tp x dp-attention "
                                         "devices; above the expert count, redundant copies).")] = 1,
    dp_attention: Annotated[int, typer.Option(help="Attention data-parallel ranks (MLA models).")] = 1,
    batch: Annotated[int, typer.Option(help="Concurrent sequences per instance.")] = 32,
    input_len: Annotated[int, typer.Option(help="Prompt tokens.")] = SERVE_DEFAULTS["input_len"],
    output_len: Annotated[int, typer.Option(help="Generated tokens.")] = SERVE_DEFAULTS["output_len"],
    weight_precision: Annotated[str, typer.Option(help="bf16, fp8, int8, int4 or fp4.")] = "bf16",
    activation_precision: Annotated[str, typer.Option(help="a16 (bf16 math), a8 (W8A8) or a4 (W4A4).")] = "a16",
    kv_precision: Annotated[str, typer.Option(help="bf16, fp8 or int4.")] = "bf16",
    kv_place: Annotated[str, typer.Option(help="Where the KV cache lives: hbm, or a host tier (ddr, cxl, "
                                               "pooled).")] = "hbm",
    mtp_draft_tokens: Annotated[int, typer.Option(help="Multi-token prediction: draft tokens per step.")] = 0,
    mtp_acceptance: Annotated[float, typer.Option(help="Share of draft tokens accepted (0-1).")] = 0.0,
    moe_imbalance: MoeImbalance = 0.0,
    pricing: Pricing = "cloud",
    price: Price = None,
    json_out: JsonFlag = False,
) -> None:
    """Evaluate one serving instance: TTFT, TPOT, throughput, memory, energy and cost."""
    from . import render
    from .inputs import serve_inputs

    spec, machine, plan, work = serve_inputs(database(ctx), locals())
    render.estimate_serve(spec, machine, plan, work, json_out)


# --- plan ------------------------------------------------------------------------------------

DEFAULT_PLAN = {"model": TRAIN_DEFAULTS["model"], "system": [TRAIN_DEFAULTS["system"]],
                "devices": [TRAIN_DEFAULTS["devices"]], "global_batch": TRAIN_DEFAULTS["global_batch"],
                "seq_len": TRAIN_DEFAULTS["seq_len"], "tokens": TRAIN_DEFAULTS["tokens"]}


@plan_app.callback()
def plan_default(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Run the built-in example: Llama 3.1 70B on 64 H100s, 512 x 8K-token batches, 1T tokens."""
    if ctx.invoked_subcommand is not None:
        return
    from . import render
    from .inputs import plan_train_inputs

    flags = {**DEFAULT_PLAN, "max_devices": None, "objective": "time", "budget": None, "power_cap_kw": None,
             "memory_headroom": 0.0, "precisions": TRAIN_DEFAULTS["precision"], "pricing": "cloud", "price": None,
             "offload": True, "top": 5, "pareto": False,
             "timing": False, "routing": None, "zipf": None, "affinity": 0.5, "seed": 0}
    db = database(ctx)
    render.plan_train(db, *plan_train_inputs(db, flags), json_out=json_out, pareto=False, timing=False,
                      model_ref=flags["model"])


@plan_app.command("train")
def plan_train(
    ctx: typer.Context,
    model: Model = DEFAULT_PLAN["model"],
    system: Annotated[Optional[list[str]], typer.Option(
        "--system", help="Candidate system (repeatable: the search also chooses among them).")] = None,
    devices: Annotated[Optional[list[int]], typer.Option(
        "--devices", help=f"Candidate device count (repeatable; default: {TRAIN_DEFAULTS['devices']}, or the node "
                          "multiples up to --max-devices).")] = None,
    max_devices: Annotated[Optional[int], typer.Option(help="Largest device count to consider.")] = None,
    global_batch: Annotated[int, typer.Option(help="Sequences per optimizer step.")] = DEFAULT_PLAN["global_batch"],
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = DEFAULT_PLAN["seq_len"],
    tokens: Annotated[float, typer.Option(help="Training tokens of the run.")] = DEFAULT_PLAN["tokens"],
    objective: Annotated[str, typer.Option(help="time, cost, energy or devices.")] = "time",
    budget: Annotated[Optional[float], typer.Option(help="Largest cost of the whole run, USD.")] = None,
    pricing: Pricing = "cloud",
    price: Price = None,
    power_cap_kw: Annotated[Optional[float], typer.Option(help="Largest IT power of all devices, kW.")] = None,
    memory_headroom: Annotated[float, typer.Option(help="Share of HBM to keep free beyond the reserve.")] = 0.0,
    precisions: Annotated[str, typer.Option(help="Allowed GEMM precisions, comma separated (fp8 only when "
                                                 "named here).")] = TRAIN_DEFAULTS["precision"],
    offload: Annotated[bool, typer.Option("--offload/--no-offload", help="Consider offloading state.")] = True,
    top: Annotated[int, typer.Option(help="How many of the best plans to list.")] = 5,
    pareto: Annotated[bool, typer.Option("--pareto", help="Show the Pareto front over time, cost, energy.")] = False,
    timing: Timing = False,
    routing: Routing = None,
    zipf: Zipf = None,
    affinity: Affinity = 0.5,
    seed: Seed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Find the optimal training plan over the whole declared space, with its proof.

    With --routing or --zipf, expert parallelism pays the load imbalance of a placement of that
    routing at each EP degree instead of assuming balance."""
    from . import render
    from .inputs import plan_train_inputs

    flags = dict(locals())
    flags["system"] = system or DEFAULT_PLAN["system"]
    if devices is None and max_devices is None:
        flags["devices"] = DEFAULT_PLAN["devices"]
    db = database(ctx)
    render.plan_train(db, *plan_train_inputs(db, flags), json_out=json_out, pareto=pareto, timing=timing,
                      model_ref=model)


@plan_app.command("serve")
def plan_serve(
    ctx: typer.Context,
    model: Model = SERVE_DEFAULTS["model"],
    system: Annotated[Optional[list[str]], typer.Option(
        "--system", help="Candidate system (repeatable; pools may use different ones).")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Requests per second.")] = None,
    concurrency: Annotated[Optional[int], typer.Option(
        help="Concurrent users instead of --rate (rate = users / (TTFT + output x TPOT targets)).")] = None,
    input_len: Annotated[str, typer.Option(help="Prompt tokens: a mean, or mean=,p50=,p90=.")] =
        str(SERVE_DEFAULTS["input_len"]),
    output_len: Annotated[str, typer.Option(help="Generated tokens: a mean, or mean=,p50=,p90=.")] =
        str(SERVE_DEFAULTS["output_len"]),
    ttft_p50_ms: Annotated[Optional[float], typer.Option(help="Time-to-first-token target at p50, ms.")] = None,
    ttft_p90_ms: Annotated[Optional[float], typer.Option(help="Time-to-first-token target at p90, ms.")] = 2000.0,
    tpot_p50_ms: Annotated[Optional[float], typer.Option(help="Time-per-output-token target at p50, ms.")] = None,
    tpot_p90_ms: Annotated[Optional[float], typer.Option(help="Time-per-output-token target at p90, ms.")] = 50.0,
    objective: Annotated[Optional[str], typer.Option(
        help="cost, energy or devices (default: cost where the systems have prices, else energy).")] = None,
    budget_usd_per_hour: Annotated[Optional[float], typer.Option(help="Largest fleet cost, USD per hour.")] = None,
    pricing: Pricing = "cloud",
    price: Price = None,
    power_cap_kw: Annotated[Optional[float], typer.Option(help="Largest fleet IT power, kW.")] = None,
    max_devices: Annotated[Optional[int], typer.Option(help="Largest fleet, devices.")] = None,
    modes: Annotated[str, typer.Option(help="colocated and/or disaggregated, comma separated.")] =
        "colocated,disaggregated",
    weight_precisions: Annotated[Optional[str], typer.Option(
        help="Allowed weight precisions (default: the model's own and fp8; int8, int4 and fp4 only when named "
             "here).")] = None,
    activation_precisions: Annotated[str, typer.Option(help="Allowed activation precisions (a16, a8, a4).")] =
        "a16,a8",
    kv_precisions: Annotated[str, typer.Option(help="Allowed KV-cache precisions.")] = "bf16,fp8",
    kv_offload: Annotated[bool, typer.Option("--kv-offload/--no-kv-offload",
                                             help="Consider KV cache in host memory.")] = True,
    top: Annotated[int, typer.Option(help="How many of the best deployments to list.")] = 5,
    pareto: Annotated[bool, typer.Option("--pareto", help="Show the Pareto front over cost, latency, energy.")] = False,
    timing: Timing = False,
    routing: Routing = None,
    zipf: Zipf = None,
    affinity: Affinity = 0.5,
    seed: Seed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Find the cheapest serving deployment meeting a request rate within latency targets."""
    from . import render
    from .inputs import plan_serve_inputs

    flags = dict(locals())
    flags["system"] = system or [SERVE_DEFAULTS["system"]]
    db = database(ctx)
    render.plan_serve(db, *plan_serve_inputs(db, flags), json_out=json_out, pareto=pareto, timing=timing,
                      model_ref=model)


# --- place-experts ---------------------------------------------------------------------------



@app.command("place-experts")
def place_experts(
    ctx: typer.Context,
    model: Model = "deepseek-v3",
    system: SystemOpt = "dgx-h100",
    devices: Annotated[int, typer.Option(help="Devices of the expert-parallel group.")] = 64,
    routing: Routing = None,
    zipf: Zipf = None,
    affinity: Affinity = 0.5,
    seed: Seed = 0,
    tokens_per_layer: Annotated[float, typer.Option(help="Synthetic routing: tokens per batch.")] = 65536.0,
    replicas: Annotated[int, typer.Option(help="Redundant expert copies per layer.")] = 32,
    slots: Annotated[Optional[int], typer.Option(
        help="Expert copies one device holds per layer (default: what the copies need).")] = None,
    time_limit: Annotated[float, typer.Option(help="CP-SAT seconds for the whole model.")] = 30.0,
    json_out: JsonFlag = False,
) -> None:
    """Place MoE experts (with replicas of hot ones) on devices; compare with round-robin and greedy."""
    from . import render
    from .inputs import place_inputs

    db = database(ctx)
    render.place_experts(*place_inputs(db, dict(locals())), json_out=json_out)


# --- validate --------------------------------------------------------------------------------

@app.command()
def validate(ctx: typer.Context, json_out: JsonFlag = False,
             calibrate: Annotated[bool, typer.Option(help="Also refit the one calibrated constant on its set.")] = False
             ) -> None:
    """Predict every published measurement of the validation set and report the error."""
    from . import render

    render.validate(database(ctx), calibrate, json_out)


# --- entry point -----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the app; user errors become one line on stderr and exit code 2 (or 3)."""
    from hardware_db.errors import PerfmodelError

    try:
        app(args=argv, prog_name="perfmodel", standalone_mode=False)
    except PerfmodelError as exc:
        print(f"Error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("Error: aborted", file=sys.stderr)
        return 130
    except typer.TyperException as exc:  # click's usage errors: bad flags, values, commands
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help is the answer
            print(message)
            return 0
        print("Error: " + " ".join(message.split()), file=sys.stderr)
        return 2
    return 0


def one_line(text: str) -> str:
    """A message on one line: control characters a user typed (a newline in a value) shown escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text.strip())


def run() -> None:  # console-script entry point
    sys.exit(main())


# --- calibrate ---------------------------------------------------------------------------------

MeasuredOn = Annotated[str, typer.Option("--device", help="Accelerator the timings were measured on.")]
CalibrationOut = Annotated[Optional[Path], typer.Option("--out", help="Directory to write calibration-<device>.yaml "
                                                                      "to (use it with --hardware-db).")]
SplitSeed = Annotated[int, typer.Option("--seed", help="Seed of the fitted / held-out split.")]

@calibrate_app.callback(invoke_without_command=True)
def calibrate_all(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: every table the installed "
                                                               "aiconfigurator-core ships for the device.")] = None,
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit kernel and collective costs to measured timings. Without a family: every family that
    aiconfigurator measured for the device (--from aiconfigurator); print the held-out error of each."""
    if ctx.invoked_subcommand is not None:
        return
    from . import render

    render.calibrate_all(database(ctx), device, source, out, seed, json_out)


@calibrate_app.command("gemm")
def calibrate_gemm(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured GEMMs: CSV (m,n,k,dtype,seconds) or "
                                                       "aiconfigurator's gemm_perf.parquet.")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the TensorRT-LLM GEMM table the "
                                                               "installed aiconfigurator-core ships.")] = None,
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit GEMM kernel costs (compute and memory fractions, launch, tiles) per precision to measured
    timings; print the held-out error; write a calibration entry."""
    from . import render

    render.calibrate_gemm(database(ctx), device, table, source, out, seed, json_out)


@calibrate_app.command("attention")
def calibrate_attention(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured attention kernels: CSV (phase,batch,seq_len,heads,"
                                                       "kv_heads,head_dim,dtype,kv_dtype,seconds).")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the TensorRT-LLM context and "
                                                               "generation attention tables it ships.")] = None,
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit attention kernel costs (prefill per precision, decode per KV precision) to measured
    timings; print the held-out error; write a calibration entry."""
    from . import render

    render.calibrate_attention(database(ctx), device, table, source, out, seed, json_out)


@calibrate_app.command("dispatch")
def calibrate_dispatch(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured DeepEP low-latency kernels: CSV (op,ranks,"
                                                       "ranks_per_node,tokens,top_k,hidden,dtype,seconds).")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the SGLang DeepEP low-latency "
                                                               "tables it ships (every version).")] = None,
    system: Annotated[str, typer.Option(help="With --table: the system the measurements ran on (its scale-up and "
                                             "scale-out links scale the fitted shares).")] = "dgx-h100",
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit the MoE expert dispatch and combine of decode (DeepEP low-latency kernels: launch and
    link shares) to measured timings; print the held-out error; write a calibration entry."""
    from . import render

    render.calibrate_dispatch(database(ctx), device, table, source, system, out, seed, json_out)


@calibrate_app.command("collectives")
def calibrate_collectives(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured timings: CSV (op,ranks,bytes,seconds) or "
                                                       "aiconfigurator's nccl_perf.parquet.")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the NCCL table the installed "
                                                               "aiconfigurator-core ships for the device.")] = None,
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit collective costs (launch, hop, bandwidth per protocol) inside the scale-up domain to measured
    timings; print the held-out error per op; write a calibration entry."""
    from . import render

    render.calibrate_collectives(database(ctx), device, table, source, out, seed, json_out)
