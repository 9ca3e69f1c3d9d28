"""The ``perfmodel`` command: flags and files in, rich tables or JSON out.

Heavy modules (pydantic, numpy, the database) are imported inside the commands, so that
``perfmodel --help`` answers at once. User errors print one line on stderr and exit 2 (3 when no
plan is feasible); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import copy
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfmodel.requests import ServeRequest, TrainRequest
from perfmodel.search.requests import PlaceExpertsRequest, PlanServeRequest, PlanTrainRequest

from .options import PLOT_HELP, ChartOutput, EstimateOutput, PlanOutput, TableOutput, command

app = typer.Typer(
    name="perfmodel",
    help="Predict how large transformer models train and serve on real hardware.",
    no_args_is_help=True,
    add_completion=True,
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
CsvFlag = Annotated[bool, typer.Option("--csv", help="Print the main table as CSV on stdout.")]
PlotFile = Annotated[Optional[str], typer.Option("--plot", metavar="FILE", help=PLOT_HELP)]
HardwareDb = Annotated[Optional[list[Path]], typer.Option(
    "--hardware-db", metavar="DIR", help="Directory of YAML entries added over the built-in database (repeatable; "
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
    from perfmodel.hardware_db.loader import load_database, user_dirs_from_env

    root = ctx.find_root()
    dirs = user_dirs_from_env() + [str(d) for d in (root.obj or {}).get("hardware_db", [])]
    return load_database(dirs)


# --- hardware --------------------------------------------------------------------------------

@hardware_app.command("list")
def hardware_list(ctx: typer.Context, json_out: JsonFlag = False, csv_out: CsvFlag = False,
                  kind: Annotated[Optional[str], typer.Option(
                      help="This kind only (accelerators, cpus, memory, links, systems, calibrations, constants), or "
                           "all; the tables default to accelerators and systems, --json and --csv to all.")] = None
                  ) -> None:
    """List the database's entries by kind."""
    from . import view_catalog

    db = database(ctx)
    view_catalog.hardware_list(db, kind, json_out, csv_out)


@hardware_app.command("show")
def hardware_show(ctx: typer.Context, name: str, json_out: JsonFlag = False,
                  nodes: Annotated[Optional[int], typer.Option(help="Scale a system to this many nodes.")] = None
                  ) -> None:
    """Show one entry with its figures (SI units in JSON) and sources."""
    from . import view_catalog

    view_catalog.hardware_show(database(ctx), name, nodes, json_out)


@hardware_app.command("schema")
def hardware_schema() -> None:
    """Print the JSON schema of a user hardware YAML file (for editors and validators)."""
    from perfmodel.hardware_db.schema import file_schema

    from .deliver import emit_json

    emit_json(file_schema())


# --- models ----------------------------------------------------------------------------------

@models_app.command("list")
def models_list(json_out: JsonFlag = False) -> None:
    """List the built-in models with their parameter counts."""
    from . import view_catalog

    view_catalog.models_list(json_out)


@models_app.command("show")
def models_show(name: Annotated[str, typer.Argument(help="Catalog name, spec YAML or config.json path.")],
                json_out: JsonFlag = False,
                seq_len: Annotated[int, typer.Option(help="Sequence length for FLOPs per token.")] = 4096
                ) -> None:
    """Show a model's spec and derived quantities (parameters, FLOPs per token, KV cache)."""
    from perfmodel.hardware_db.errors import SpecError

    from . import view_catalog

    if not 1 <= seq_len <= 100_000_000:
        raise SpecError(f"--seq-len needs 1 to 100,000,000, has {seq_len}")
    view_catalog.models_show(name, seq_len, json_out)


# --- compare ---------------------------------------------------------------------------------

DEFAULT_COMPARE = ("h100-sxm", "b200", "mi300x", "ascend-910c")


@app.command()
def compare(ctx: typer.Context,
            names: Annotated[Optional[list[str]], typer.Argument(
                help=f"Accelerators or systems (default: {' '.join(DEFAULT_COMPARE)}).")] = None,
            json_out: JsonFlag = False, csv_out: CsvFlag = False, plot: PlotFile = None) -> None:
    """Compare accelerators or systems side by side; the best value of each row is highlighted.
    --plot draws their rooflines."""
    from . import view_catalog

    view_catalog.compare(database(ctx), list(names or DEFAULT_COMPARE), ChartOutput(json_out, csv_out, plot))


# --- estimate --------------------------------------------------------------------------------

@command(estimate_app, "train", TrainRequest, EstimateOutput)
def estimate_train(ctx: typer.Context, request: TrainRequest, output: EstimateOutput) -> None:
    """Evaluate one training plan: step time by component, MFU, memory per tier, energy and cost."""
    from . import view_estimate

    db = database(ctx)
    view_estimate.estimate_train(*request.resolve(db), output=output, model_ref=request.model, db=db)


@command(estimate_app, "serve", ServeRequest, EstimateOutput)
def estimate_serve(ctx: typer.Context, request: ServeRequest, output: EstimateOutput) -> None:
    """Evaluate one serving instance: TTFT, TPOT, throughput, memory, energy and cost."""
    from . import view_estimate

    db = database(ctx)
    view_estimate.estimate_serve(*request.resolve(db), output=output, model_ref=request.model, db=db)


# --- plan ------------------------------------------------------------------------------------

@plan_app.callback()
def plan_default(ctx: typer.Context, json_out: Annotated[bool, typer.Option(
        "--json", help="Print one JSON document on stdout.")] = False, verbose: Annotated[bool, typer.Option(
        "--verbose", help="Also print the ties, the top plans, the evidence and the answer's details.")] = False
                 ) -> None:
    """Run the built-in example: Llama 3.1 70B on 64 H100s, 512 x 8K-token batches, 1T tokens."""
    if ctx.invoked_subcommand is not None:
        return
    from . import view_train

    view_train.plan_train(database(ctx), PlanTrainRequest(), PlanOutput(json_out=json_out, verbose=verbose))


@command(plan_app, "train", PlanTrainRequest, PlanOutput)
def plan_train(ctx: typer.Context, request: PlanTrainRequest, output: PlanOutput) -> None:
    """Find the optimal training plan over the whole declared space, with its proof.

    With --routing or --zipf, expert parallelism pays the load imbalance of a placement of that
    routing at each EP degree instead of assuming balance."""
    from . import view_train

    view_train.plan_train(database(ctx), request, output)


@command(plan_app, "serve", PlanServeRequest, PlanOutput)
def plan_serve(ctx: typer.Context, request: PlanServeRequest, output: PlanOutput) -> None:
    """Find the cheapest serving deployment meeting a request rate within latency targets."""
    from . import view_serve

    view_serve.plan_serve(database(ctx), request, output)


# --- place-experts ---------------------------------------------------------------------------

@command(app, "place-experts", PlaceExpertsRequest, TableOutput)
def place_experts(ctx: typer.Context, request: PlaceExpertsRequest, output: TableOutput) -> None:
    """Place MoE experts (with replicas of hot ones) on devices; compare with round-robin and greedy."""
    from . import view_serve

    view_serve.place_experts(database(ctx), request, output)


# --- sweep -----------------------------------------------------------------------------------

@app.command()
def sweep(ctx: typer.Context,
          target: Annotated[list[str], typer.Argument(help="SPEC.yaml to run, or: report DIR.", metavar="SPEC|report DIR")],
          out: Annotated[str, typer.Option(help="Directory of the table (CSV, Parquet with pyarrow); an existing "
                                                "one is resumed.")] = "sweep-out",
          engine: Annotated[str, typer.Option(help="process (a local process pool) or ray.")] = "process",
          workers: Annotated[Optional[int], typer.Option(help="Processes (default: all cores) or Ray CPUs.")] = None,
          address: Annotated[Optional[str], typer.Option(help="Ray cluster address (default: a local Ray "
                                                              "instance).")] = None,
          metric: Annotated[str, typer.Option(help="The metric to rank the parameters by and to map.")]
          = "tokens_per_usd",
          heatmap: Annotated[Optional[str], typer.Option(help="Two parameters X,Y to map the metric over (with "
                                                              "--plot FILE: drawn).")] = None,
          workload: Annotated[Optional[str], typer.Option(help="One workload to report (default: all; the first "
                                                               "for --heatmap).")] = None,
          pareto: Annotated[bool, typer.Option("--pareto", help="Print (and with --plot, draw) the Pareto front "
                                                                 "over the points: time against cost.")] = False,
          plot: PlotFile = None, json_out: JsonFlag = False) -> None:
    """Sweep a hardware design space: every point's optimal plan (perfmodel sweep SPEC.yaml), and what
    moves each metric (perfmodel sweep report DIR: elasticities, heat maps)."""
    from perfmodel.hardware_db.errors import SpecError

    from . import sweep as sweeping

    if target[0] == "report":
        if len(target) != 2:
            raise SpecError("perfmodel sweep report needs one directory: perfmodel sweep report DIR")
        sweeping.report(target[1], metric, heatmap, plot, workload, json_out, pareto)
        return
    if len(target) != 1:
        raise SpecError("perfmodel sweep needs one spec: perfmodel sweep SPEC.yaml (or: perfmodel sweep report DIR)")
    root = ctx.find_root()
    from perfmodel.hardware_db.loader import user_dirs_from_env

    dirs = user_dirs_from_env() + [str(d) for d in (root.obj or {}).get("hardware_db", [])]
    sweeping.run(target[0], out, engine, workers, address, dirs, json_out, metric, heatmap, plot, workload, pareto)


# --- validate --------------------------------------------------------------------------------

@app.command()
def validate(ctx: typer.Context, json_out: JsonFlag = False, csv_out: CsvFlag = False,
             calibrate: Annotated[bool, typer.Option(help="Also refit the one calibrated constant on its set.")] = False
             ) -> None:
    """Predict every published measurement of the validation set and report the error."""
    from . import view_validate

    view_validate.validate(database(ctx), calibrate, json_out, csv_out)


# --- entry point -----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the app; user errors become one line on stderr and exit code 2 (or 3)."""
    from perfmodel.hardware_db.errors import PerfmodelError

    try:
        args = global_options_first(sys.argv[1:] if argv is None else list(argv))
        only(app, args)(args=args, prog_name="perfmodel", standalone_mode=False)
    except PerfmodelError as exc:
        print(f"Error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except OSError as exc:  # the file system's answer on a path the user named: too long, no access, disk full
        path = str(exc.filename) if exc.filename is not None else ""
        path = f": {path[:60]}...{path[-20:]}" if len(path) > 80 else (f": {path}" if path else "")
        print(f"Error: {one_line((exc.strerror or type(exc).__name__) + path)}", file=sys.stderr)
        return 2
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


def only(group: typer.Typer, args: list[str]) -> typer.Typer:
    """``group`` with only the command path ``args`` names, when it names one (typer builds every
    registered command's parameters on each run, 25-30 ms for this app; a command builds its own).
    Anything else (no command, a misspelt one, shell completion) gets the whole app, so that help
    and error messages list every command."""
    words = iter(args)
    for word in words:
        if word == "--hardware-db":
            next(words, None)
        elif not word.startswith("-"):
            break
    else:
        return group
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return group
    commands = [c for c in group.registered_commands if _name(c) == word]
    groups = [g for g in group.registered_groups if g.name == word]
    if not commands and not groups:
        return group
    pruned = copy.copy(group)
    pruned.registered_commands = commands
    pruned.registered_groups = [copy.copy(g) for g in groups]
    for g in pruned.registered_groups:   # the group's next word, when it names one of its commands
        rest = list(words)
        g.typer_instance = only(g.typer_instance, rest) if rest and not rest[0].startswith("-") else g.typer_instance
    return pruned


def _name(info) -> str:
    """A registered command's name as typer spells it (the function's, with dashes)."""
    return info.name or info.callback.__name__.lower().replace("_", "-")


def global_options_first(argv: list[str]) -> list[str]:
    """``--hardware-db DIR`` (or ``--hardware-db=DIR``) wherever it stands on the line, moved before the
    command, where the app reads it: ``perfmodel plan train --hardware-db mine`` works as typed."""
    front, rest, i = [], [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest += argv[i:]
            break
        if word == "--hardware-db":
            if i + 1 == len(argv):
                from perfmodel.hardware_db.errors import SpecError

                raise SpecError("--hardware-db needs a directory of YAML files")
            front += argv[i:i + 2]
            i += 2
            continue
        (front if word.startswith("--hardware-db=") else rest).append(word)
        i += 1
    return front + rest


def one_line(text: str) -> str:
    """A message on one line: control characters a user typed (a newline in a value) shown escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], text.strip())


def run() -> None:  # the process entry point, after perfmodel.cli.__main__ has loaded this module
    code = main()
    # The process ends here: keep the interpreter's exit from running full garbage collections over
    # every module, class and function the command imported (they are all freed with the process;
    # 0.08-0.1 s of a 0.8 s ``plan serve``, measured against os._exit). Files are closed where they
    # are written; reference counting still finalizes everything that is not in a cycle.
    import gc

    gc.freeze()
    sys.exit(code)


# --- calibrate ---------------------------------------------------------------------------------

MeasuredOn = Annotated[str, typer.Option("--device", help="Accelerator the timings were measured on.")]
CalibrationOut = Annotated[Optional[Path], typer.Option("--out", help="Directory to write calibration-<device>.yaml "
                                                                      "to (use it with --hardware-db).")]
SplitSeed = Annotated[int, typer.Option("--seed", help="Seed of the fitted / held-out split.")]
ServingEngine = Annotated[str, typer.Option(metavar="[trtllm|sglang|vllm]", help="Serving engine whose kernels the "
                                            "timings measured: trtllm (the default: the entry's own block) or sglang "
                                            "/ vllm (its serving_backends block, used by estimate serve --framework).")]

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
    from . import view_calibrate

    view_calibrate.calibrate_all(database(ctx), device, source, out, seed, json_out)


@calibrate_app.command("gemm")
def calibrate_gemm(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured GEMMs: CSV (m,n,k,dtype,seconds) or "
                                                       "aiconfigurator's gemm_perf.parquet.")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the GEMM table of --backend the "
                                                               "installed aiconfigurator-core ships.")] = None,
    backend: Annotated[str, typer.Option(metavar="[trtllm|sglang|vllm]", help="Serving engine whose GEMM kernels the "
                                         "timings measured: trtllm (the default: the entry's gemm and block_scaled "
                                         "blocks) or sglang / vllm (its serving_backends block, used by estimate "
                                         "serve --framework).")] = "trtllm",
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit GEMM kernel costs (compute and memory fractions, launch, tiles) per precision to measured
    timings; print the held-out error; write a calibration entry."""
    from . import view_calibrate

    view_calibrate.calibrate_gemm(database(ctx), device, table, source, out, seed, json_out, backend)


@calibrate_app.command("attention")
def calibrate_attention(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured attention kernels: CSV (phase,batch,seq_len,heads,"
                                                       "kv_heads,head_dim,dtype,kv_dtype,seconds).")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the context and generation "
                                                               "attention tables of --backend it ships.")] = None,
    backend: ServingEngine = "trtllm",
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit attention kernel costs (prefill per precision, decode per KV precision) to measured
    timings; print the held-out error; write a calibration entry."""
    from . import view_calibrate

    view_calibrate.calibrate_attention(database(ctx), device, table, source, out, seed, json_out, backend)


@calibrate_app.command("dispatch")
def calibrate_dispatch(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    kernels: Annotated[str, typer.Option(metavar="[low-latency|normal]", help="DeepEP's kernels: low-latency "
                                         "(decode) or normal (prefill: NVLink, and RDMA once per node with NVLink "
                                         "forwarding).")] = "low-latency",
    table: Annotated[Optional[Path], typer.Option(help="Measured DeepEP kernels: CSV (op,ranks,ranks_per_node,tokens,"
                                                       "top_k,hidden,dtype,seconds; normal kernels also experts "
                                                       "before hidden).")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the SGLang DeepEP tables it ships "
                                                               "for those kernels (every version).")] = None,
    system: Annotated[str, typer.Option(help="With --table: the system the measurements ran on (its scale-up and "
                                             "scale-out links scale the fitted shares).")] = "dgx-h100",
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit the MoE expert dispatch and combine (DeepEP's low-latency kernels of decode, or with
    --kernels normal those of prefill: launch, link shares and the latency of leaving the node) to
    measured timings; print the held-out error; write a calibration entry."""
    from . import view_calibrate

    view_calibrate.calibrate_dispatch(database(ctx), device, table, source, system, out, seed, json_out, kernels)


@calibrate_app.command("moe")
def calibrate_moe(
    ctx: typer.Context,
    device: MeasuredOn = "h100-sxm",
    table: Annotated[Optional[Path], typer.Option(help="Measured MoE layers: a table in the form of aiconfigurator's "
                                                       "moe_perf.parquet.")] = None,
    source: Annotated[Optional[str], typer.Option("--from", help="aiconfigurator: the MoE table of --backend the "
                                                               "installed aiconfigurator-core ships.")] = None,
    backend: ServingEngine = "trtllm",
    out: CalibrationOut = None,
    seed: SplitSeed = 0,
    json_out: JsonFlag = False,
) -> None:
    """Fit the routed experts' grouped GEMMs (the GEMM kernel's terms, a cost per expert group and
    the passes over their inputs) per precision to measured MoE layers; print the error on the MoE
    shapes held out; write a calibration entry."""
    from . import view_calibrate

    view_calibrate.calibrate_moe(database(ctx), device, table, source, out, seed, json_out, backend)


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
    from . import view_calibrate

    view_calibrate.calibrate_collectives(database(ctx), device, table, source, out, seed, json_out)
