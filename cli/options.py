"""Command-line options built from a request dataclass, so that each command's flags, defaults,
help and choices have one source: the request's fields (``perfmodel.requests.option``).

``command(group, "train", PlanTrainRequest, PlanOutput)`` wraps a body ``(ctx, request, output)``
into a typer command whose options are the fields of both dataclasses: ``model`` becomes
``--model``, a bool ``--sp/--no-sp``, a tuple a repeatable option, and a field with choices lists
them in its help. Only typer is imported here; the request modules themselves load nothing heavy.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Optional

import typer

from perfmodel.exports import FRAMEWORKS
from perfmodel.requests import check_choices, option


def _complete_models(incomplete: str) -> list[str]:
    from perfmodel.catalog import builtin_models

    return [name for name in builtin_models() if name.startswith(incomplete)]


def _complete_systems(incomplete: str) -> list[str]:
    from perfmodel.hardware_db.loader import load_database, user_dirs_from_env

    db = load_database(user_dirs_from_env())
    return [name for name in sorted(db.systems) if name.startswith(incomplete)]


COMPLETERS = {"model": _complete_models, "system": _complete_systems}


METAVARS = {int: "INT", float: "NUMBER", str: "TEXT"}


def _help(f, single: bool) -> str:
    """The field's help; values of a comma-separated list are named (one value shows them in its metavar)."""
    text = f.metadata.get("help", "")
    choices = f.metadata.get("choices") or ()
    if choices and not single:
        text += f" Choices: {', '.join(map(str, choices))}."
    return text


def _parameter(f, hint) -> inspect.Parameter:
    """One typer option for the dataclass field ``f`` of type ``hint``."""
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    default = f.default if f.default is not MISSING else None
    choices = f.metadata.get("choices") or ()
    single = bool(choices) and not f.metadata.get("many")
    kwargs = {"help": _help(f, single)}
    completer = COMPLETERS.get(f.metadata.get("complete"))
    if completer:
        kwargs["autocompletion"] = completer
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    base = next((a for a in args if a is not type(None)), hint) if origin is not tuple else args[0]
    if hint is not bool:
        kwargs["metavar"] = "[" + "|".join(map(str, choices)) + "]" if single else METAVARS.get(base, "TEXT")
    if hint is bool:  # an on-by-default switch can be turned off
        annotation, decls = bool, [f"{flag}/--no-{flag[2:]}" if default else flag]
    elif origin is tuple:  # repeatable: typer gives a list (None when not given)
        annotation, decls = Optional[list[base]], [flag]
        kwargs["show_default"] = ", ".join(map(str, default)) if default else False
        default = None
    else:
        annotation, decls = hint, [flag]
        if isinstance(default, float):
            kwargs["show_default"] = f"{default:g}"
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, typer.Option(*decls, **kwargs)])


def _build(cls, given: dict):
    """The dataclass ``cls`` from typer's values: lists back to tuples, an absent repeatable to its default."""
    values = {}
    for f in fields(cls):
        value = given[f.name]
        if isinstance(value, list) or (value is None and isinstance(f.default, tuple)):
            value = tuple(value) if value else f.default
        values[f.name] = value
    return cls(**values)


def command(group: typer.Typer, name: str, request_cls, output_cls=None):
    """Register ``body(ctx, request, output)`` as ``name`` in ``group`` with the options of both classes."""
    def decorate(body):
        classes = [request_cls] + ([output_cls] if output_cls else [])
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
        for cls in classes:
            hints = typing.get_type_hints(cls)
            params += [_parameter(f, hints[f.name]) for f in fields(cls)]

        def run(ctx: typer.Context, **given):
            request = _build(request_cls, given)
            output = _build(output_cls, given) if output_cls else None
            return body(ctx, request, output)

        run.__signature__ = inspect.Signature(params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        run.__name__, run.__doc__ = body.__name__, body.__doc__
        group.command(name)(run)
        return body
    return decorate


PLOT_HELP = "Write a chart to FILE (.png, .svg or .html; needs matplotlib: pip install 'perfmodel[plot]')."
CHARTS = ("pareto", "breakdown", "roofline", "memory")
EXPORT_HELP = "Write launch files of this framework for the plan into --out (see README)."


@dataclass(frozen=True)
class EstimateOutput:
    """How an estimate is shown: tables, JSON, CSV, a chart, a framework's launch files."""

    json_out: bool = option(False, "Print one JSON document on stdout.", flag="--json")
    csv_out: bool = option(False, "Print the step-time components as CSV on stdout.", flag="--csv")
    plot: str | None = option(None, PLOT_HELP)
    chart: str = option("breakdown", "What --plot draws.", choices=CHARTS[1:])
    export: str | None = option(None, EXPORT_HELP, choices=FRAMEWORKS)
    out: str | None = option(None, "Directory for --export files (created if absent).")

    def __post_init__(self):
        check_choices(self)   # a flag's value is checked even where it is not used (--chart --json)


@dataclass(frozen=True)
class PlanOutput:
    """How a search is shown: tables, the Pareto front, JSON, CSV, a chart, launch files of the best plan."""

    pareto: bool = option(False, "Show the Pareto front.")
    verbose: bool = option(False, "Also print the ties, the top plans, the evidence and the validity rules, and "
                                  "the answer's operators and memory.")
    timing: bool = option(False, "Include seconds spent in --json.")
    json_out: bool = option(False, "Print one JSON document on stdout.", flag="--json")
    csv_out: bool = option(False, "Print the plans table (the Pareto front with --pareto) as CSV on stdout.",
                           flag="--csv")
    plot: str | None = option(None, PLOT_HELP)
    chart: str | None = option(None, "What --plot draws (default: pareto with --pareto, else breakdown).",
                               choices=CHARTS)
    export: str | None = option(None, EXPORT_HELP, choices=FRAMEWORKS)
    out: str | None = option(None, "Directory for --export files (created if absent).")

    def __post_init__(self):
        check_choices(self)   # a flag's value is checked even where it is not used (--chart --json)


@dataclass(frozen=True)
class ChartOutput:
    """How a comparison is shown: rich tables, JSON, CSV or a chart."""

    json_out: bool = False
    csv_out: bool = False
    plot: str | None = None


@dataclass(frozen=True)
class TableOutput:
    """How a table command is shown: rich tables, JSON or CSV."""

    json_out: bool = option(False, "Print one JSON document on stdout.", flag="--json")
    csv_out: bool = option(False, "Print the main table as CSV on stdout.", flag="--csv")
