"""The ``perfmodel`` command: flags and files in, rich tables or JSON out.

Heavy modules (pydantic, numpy, the database) are imported inside the commands, so that
``perfmodel --help`` answers at once. User errors print one line on stderr and exit 2 (3 when no
plan is feasible); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

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
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
HardwareDb = Annotated[Optional[list[Path]], typer.Option(
    "--hardware-db", help="Directory of YAML entries added over the built-in database (repeatable; "
                          "also PERFMODEL_HARDWARE_DB).")]


@app.callback()
def main_callback(ctx: typer.Context, hardware_db: HardwareDb = None) -> None:
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
    from . import render

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


# --- entry point -----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Run the app; user errors become one line on stderr and exit code 2 (or 3)."""
    from hardware_db.errors import PerfmodelError

    try:
        app(args=argv, prog_name="perfmodel", standalone_mode=False)
    except PerfmodelError as exc:
        print(f"Error: {exc}", file=sys.stderr)
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


def run() -> None:  # console-script entry point
    sys.exit(main())
