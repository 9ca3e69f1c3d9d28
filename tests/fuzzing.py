"""Generated hostile command lines and the contract every run of the CLI keeps.

The command lines come from the typer app itself (every command, every option, its type), so a new
option is fuzzed the day it lands. Values mix the real vocabulary (names from the database and the
catalog, every choice a flag accepts), near-miss typos of it, boundary and absurd numbers, text no
flag expects, and paths to hostile files (``tests/hostile_files.py``).

The contract (``check``): exit code 0, 2 or 3; a failure writes one line on stderr (plus an optional
"did you mean" line) and no traceback or warning; ``--json`` output parses with no NaN, Infinity or
negative time or size; no Python warning escapes. How long a run takes depends on the machine, so
it is not part of the contract tests assert: ``benchmarks/bench_fuzz.py`` reports runs over
``time_limit`` (``overtime``) as findings of its own.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hypothesis import strategies as st

FileSource = Callable[[tuple[str, ...]], st.SearchStrategy[str]]
GENERAL_LIMIT_S = 120.0   # every command but place-experts, which states its own
SLACK_S = 15.0            # start-up, database load and rendering beyond a stated solver limit


@dataclass(frozen=True)
class Param:
    """One parameter of one command, as the typer app declares it."""

    flag: str | None          # None: a positional argument
    kind: str                 # int, float, str, path, bool
    secondary: str | None = None   # the --no-x of a boolean pair


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    code: int | None          # None: the run raised
    out: str
    err: str
    seconds: float
    error: str = ""           # the exception's type, where it was raised and its message, when the run raised
    warnings: tuple[str, ...] = ()


def _kind(annotation) -> str:
    text = str(annotation)
    for kind in ("bool", "int", "float", "Path", "str"):
        if kind in text:
            return "path" if kind == "Path" else kind
    return "str"


@lru_cache(maxsize=1)
def commands() -> dict[tuple[str, ...], tuple[Param, ...]]:
    """Every leaf command of the app (and every group callback that runs on its own) with its parameters."""
    import typer.main

    from perfmodel.cli.app import app

    out: dict[tuple[str, ...], tuple[Param, ...]] = {}

    def walk(cmd, path: tuple[str, ...]) -> None:
        params = tuple(Param(p.opts[0] if p.param_type_name == "option" else None, _kind(p.type_descriptor.annotation),
                             (p.secondary_opts or [None])[0] if p.param_type_name == "option" else None)
                       for p in cmd.params)
        subs = getattr(cmd, "commands", None) or {}
        if path and (not subs or getattr(cmd, "invoke_without_command", False)):
            out[path] = params
        for name, sub in subs.items():
            walk(sub, path + (name,))

    root = typer.main.get_command(app)
    walk(root, ())
    return out


@lru_cache(maxsize=1)
def vocabulary() -> dict[str, tuple[str, ...]]:
    """Real values per flag (names from the database and catalog, every accepted choice)."""
    from perfmodel.hardware_db.loader import load_database
    from perfmodel.catalog import builtin_models
    from perfmodel.exports import FRAMEWORKS
    from perfmodel.plan import (ACTIVATION_PRECISIONS, ATTENTION, KV_PRECISIONS, OVERLAP, PLACES, RECOMPUTE,
                                WEIGHT_PRECISIONS)
    from perfmodel.search.vocabulary import SERVE_MODES as MODES
    from perfmodel.search.vocabulary import SERVE_OBJECTIVES
    from perfmodel.search.vocabulary import TRAIN_OBJECTIVES as OBJECTIVES
    from perfmodel.cli.options import CHARTS

    db = load_database()
    systems = tuple(db.systems)
    models = tuple(builtin_models())
    return {
        "--model": models, "--system": systems, "--device": tuple(db.accelerators), "name": tuple(db.names()) + models,
        "names": tuple(db.accelerators) + systems, "--kind": ("accelerators", "cpus", "memory", "links", "systems"),
        "--objective": tuple(dict.fromkeys(OBJECTIVES + SERVE_OBJECTIVES)), "--recompute": RECOMPUTE,
        "--precision": ("bf16", "fp16", "fp8"), "--precisions": ("bf16", "fp8", "bf16,fp8", "fp16,bf16"),
        "--offload-optimizer": PLACES, "--offload-grads": PLACES, "--offload-params": PLACES, "--kv-place": PLACES,
        "--attention": ATTENTION, "--overlap": OVERLAP, "--pricing": ("cloud", "owned"),
        "--weight-precision": WEIGHT_PRECISIONS, "--weight-precisions": WEIGHT_PRECISIONS + ("bf16,fp8", "fp4,int4"),
        "--activation-precision": ACTIVATION_PRECISIONS, "--activation-precisions": ("a16", "a8", "a16,a8", "a4"),
        "--kv-precision": KV_PRECISIONS, "--kv-precisions": KV_PRECISIONS + ("bf16,fp8",),
        "--modes": MODES + ("colocated,disaggregated",), "--from": ("aiconfigurator",),
        "--export": FRAMEWORKS, "--chart": CHARTS, "--framework": FRAMEWORKS,
        "--input-len": ("2048", "mean=2048,p50=1500,p90=4096", "p90=100,p50=200"),
        "--output-len": ("512", "mean=512,p90=2000"),
        "--price": tuple(f"{s}={p}" for s in systems[:4] for p in ("2.5", "0", "-1", "nan", "x")),
    }


_SCRATCH = Path(tempfile.gettempdir()) / "perfmodel-fuzz-written"
WRITTEN = {"--out": tuple(str(_SCRATCH / name) for name in ("export", "deep/er/export", "plot.png")),
           "--plot": tuple(str(_SCRATCH / name) for name in ("a.png", "a.svg", "a.html", "a.txt", "a", "no/dir/a.png",
                                                            "export"))}

HOSTILE_TEXT = ("", " ", "\n", "a\nb", "\t", "🙂", "x" * 1000, "../../etc/passwd", "-", "--", "--json", "None",
                "null", "0", "-1", "nan", "1e999", "=", ",", ",,", "a=b=c", "\x00", "\\", "'", '"', "$HOME", "*")
HOSTILE_INTS = ("0", "-1", "1", "2", "3", "7", "8", "16", "64", "1000", "4096", "65537", "2147483648",
                "9223372036854775808", "-35184372088832", "10000000", "1" + "0" * 30, "1.5", "0x10", "1e3", "", "nan",
                "eight", " 8", "8 ")
HOSTILE_FLOATS = ("0", "-0", "-1", "1e-300", "5e-324", "0.5", "1", "2", "10", "1e6", "1e12", "1e18", "1e308", "1e309",
                  "-1e308", "nan", "NaN", "inf", "-inf", "Infinity", "", "1,5", "1_000", "0x1p3", "abc")


def _typos(words: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Near misses of real words: a dropped, doubled or swapped character, a digit, the wrong case."""
    def mutate(word: str, how: int, at: int) -> str:
        if not word:
            return "x"
        i = at % len(word)
        return (word[:i] + word[i + 1:], word[:i] + word[i] * 2 + word[i:], word.upper(), "1" + word,
                word[:i] + word[i:][::-1][:1] + word[i + 1:] + word[i:i + 1], word.replace("-", "_"), f" {word} ")[how]
    return st.builds(mutate, st.sampled_from(words), st.integers(0, 6), st.integers(0, 50))


# Which hostile files (tests/hostile_files.py targets) each path-taking parameter reads.
FILE_TARGETS = {"--model": ("model-yaml", "config-json"), "name": ("model-yaml", "config-json"),
                "--routing": ("routing",), "--hardware-db": ("hardware-db",),
                "--table": ("gemm-table", "attention-table", "collectives-table", "dispatch-table")}


def value_strategy(param: Param, files: FileSource | None) -> st.SearchStrategy[str]:
    """Text for one parameter: real values, typos, boundary and absurd values, or a hostile file's path.
    Flags that write files (--out, --plot) get paths inside one scratch folder only."""
    if param.flag in WRITTEN:
        return st.sampled_from(WRITTEN[param.flag])
    if param.kind == "int":
        return st.sampled_from(HOSTILE_INTS) | st.integers(-3, 300).map(str)
    if param.kind == "float":
        return (st.sampled_from(HOSTILE_FLOATS) | st.floats(-10, 1e4, allow_nan=False).map(repr)
                | st.floats(allow_nan=True, allow_infinity=True).map(repr))
    real = vocabulary().get(param.flag or "name", ())
    options = [st.sampled_from(HOSTILE_TEXT)]
    if real:
        options = [st.sampled_from(real), st.sampled_from(real), _typos(real)] + options
    if files is not None and (param.flag or "name") in FILE_TARGETS:
        options += [files(FILE_TARGETS[param.flag or "name"])] * 2
    return st.one_of(options)


@st.composite
def command_lines(draw, files: FileSource | None = None) -> list[str]:
    """One command line over the app's own commands and options (and, rarely, an unknown flag);
    ``files(targets)`` draws the path of a hostile file of one of those targets, written to disk."""
    table = commands()
    path = draw(st.sampled_from(sorted(table)))
    params = table[path]
    argv: list[str] = []
    if files is not None and draw(st.integers(0, 9)) == 0:
        argv += ["--hardware-db", draw(files(FILE_TARGETS["--hardware-db"]))]
    argv += list(path)
    chosen = draw(st.lists(st.sampled_from(params), max_size=5)) if params else []
    for param in chosen:
        if param.kind == "bool":
            argv.append(param.secondary if param.secondary and draw(st.booleans()) else param.flag)
            continue
        value = draw(value_strategy(param, files))
        argv += [value] if param.flag is None else [param.flag, value]
    if draw(st.integers(0, 19)) == 0:
        argv += [draw(st.sampled_from(("--nonsense", "--tp", "-x", "extra", "--json=1", "--help")))]
    if any(p.flag == "--json" for p in params) and draw(st.booleans()):
        argv.append("--json")
    if path == ("place-experts",) and "--time-limit" not in argv and draw(st.integers(0, 3)):
        argv += ["--time-limit", "2"]
    return argv


# Commands that read each kind of hostile file ("{}" is the file's path).
READERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "hardware-db": (("--hardware-db", "{}", "hardware", "list", "--json"),
                    ("--hardware-db", "{}", "compare", "h100-sxm", "mi300x"),
                    ("--hardware-db", "{}", "estimate", "train", "--model", "llama-3.1-8b", "--devices", "8", "--tp", "8",
                     "--pp", "1", "--json"),
                    ("--hardware-db", "{}", "estimate", "serve", "--model", "llama-3.1-8b", "--tp", "8",
                     "--pricing", "owned", "--json")),
    "model-yaml": (("models", "show", "{}", "--json"),
                   ("estimate", "train", "--model", "{}", "--devices", "8", "--tp", "8", "--pp", "1", "--json"),
                   ("estimate", "serve", "--model", "{}", "--tp", "8", "--json")),
    "routing": (("place-experts", "--model", "mixtral-8x7b", "--devices", "8", "--routing", "{}", "--time-limit", "2"),
                ("place-experts", "--model", "deepseek-v3", "--devices", "16", "--routing", "{}", "--time-limit", "2",
                 "--json"),
                ("plan", "train", "--model", "mixtral-8x7b", "--devices", "16", "--global-batch", "64", "--seq-len",
                 "4096", "--routing", "{}", "--no-offload", "--json")),
    **{f"{family}-table": (("calibrate", family, "--table", "{}", "--json"),)
       for family in ("gemm", "attention", "collectives", "dispatch")},
}
READERS["config-json"] = READERS["model-yaml"]


def file_source(root: Path) -> FileSource:
    """Hostile files of the given targets written under ``root`` (a fresh folder each), as paths."""
    from tests.hostile_files import hostile_files, write

    counter = itertools.count()

    def written(f) -> str:
        folder = root / f"f{next(counter)}"
        folder.mkdir(parents=True)
        return str(write(f, folder))

    return lambda targets: st.one_of([hostile_files(t) for t in targets]).map(written)


@st.composite
def file_command_lines(draw, files: FileSource) -> list[str]:
    """A command that reads one hostile file: a database folder, a model, routing or a timing table."""
    target = draw(st.sampled_from(sorted(READERS)))
    template = draw(st.sampled_from(READERS[target]))
    path = draw(files((target,)))
    return [path if part == "{}" else part for part in template]


def time_limit(argv: list[str] | tuple[str, ...]) -> float:
    """The time a run may take: place-experts' stated solver limit (its default too) plus slack, else a general bound."""
    if "place-experts" in argv:
        stated = 30.0
        for i, a in enumerate(argv[:-1]):
            if a == "--time-limit":
                try:
                    stated = float(argv[i + 1])
                except ValueError:
                    pass
        return (stated if 0 < stated <= 3600 else 0.0) + SLACK_S
    return GENERAL_LIMIT_S


def run(argv: list[str]) -> Outcome:
    """Run the CLI in this process, capturing its output, its warnings and any escaping exception."""
    from perfmodel.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        try:
            code, error = main(list(argv)), ""
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - an escaping exception is the finding
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            code, error = None, f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}: {exc}"[:300]
    return Outcome(tuple(argv), code, out.getvalue(), err.getvalue(), time.perf_counter() - start, error,
                   tuple(f"{w.category.__name__}: {w.message}" for w in caught))


_TIME_OR_SIZE = re.compile(r"(^|_)(s|ms|us|seconds|bytes|time|latency|memory)$")
DID_YOU_MEAN = re.compile(r"^(Did you mean|did you mean|Possible options)")


def _negative_times(node, key: str = "") -> list[str]:
    if isinstance(node, dict):
        return [bad for k, v in node.items() for bad in _negative_times(v, str(k))]
    if isinstance(node, list):
        return [bad for v in node for bad in _negative_times(v, key)]
    if isinstance(node, (int, float)) and not isinstance(node, bool) and node < 0 and _TIME_OR_SIZE.search(key):
        return [f"{key}={node}"]
    return []


def _json_requested(argv: tuple[str, ...]) -> bool:
    """Whether ``--json`` stands as the flag (not as the value of an option that takes one)."""
    takes_value = {p.flag for params in commands().values() for p in params if p.flag and p.kind != "bool"}
    return any(a == "--json" and (i == 0 or argv[i - 1] not in takes_value) for i, a in enumerate(argv))


def _reject_constant(name: str):
    raise ValueError(f"non-finite JSON number {name}")


def problems(outcome: Outcome) -> list[str]:
    """Every way the run broke the contract (empty: it kept it)."""
    found = []
    if outcome.code is None:
        return [f"raised {' '.join(outcome.error.split())}"]
    if outcome.code not in (0, 2, 3):
        found.append(f"exit code {outcome.code}")
    for stream in (outcome.out, outcome.err):
        if "Traceback" in stream:
            found.append("traceback printed")
        if re.search(r"\b\w*Warning\b", stream):
            found.append("warning text printed")
    if outcome.warnings:
        found.append(f"python warning: {outcome.warnings[0]}")
    if outcome.code:
        lines = outcome.err.rstrip("\n").split("\n")
        if not lines[0].startswith("Error: ") or len(lines) > 2 or (len(lines) == 2 and not DID_YOU_MEAN.match(lines[1])):
            found.append(f"failure message not one line: {outcome.err[:200]!r}")
    elif _json_requested(outcome.argv) and "--help" not in outcome.argv and outcome.out.strip():
        try:
            doc = json.loads(outcome.out, parse_constant=_reject_constant)
        except ValueError as exc:
            found.append(f"--json output is not finite JSON: {exc}"[:200])
        else:
            found += [f"negative time or size {bad}" for bad in _negative_times(doc)[:3]]
    if not outcome.code and re.search(r"(?<!\w)(nan|inf)(?![\w…])", outcome.out, re.IGNORECASE):
        found.append("nan or inf printed")
    return found


def overtime(outcome: Outcome) -> list[str]:
    """The run outlived its stated time limit (a benchmark finding, measured on one machine)."""
    limit = time_limit(outcome.argv)
    return [f"took {outcome.seconds:.0f} s over its {limit:.0f} s limit"] if outcome.seconds > limit else []


def check(outcome: Outcome) -> None:
    """Assert the contract, naming the command line and what broke."""
    broken = problems(outcome)
    assert not broken, (list(outcome.argv), broken, outcome.err[-800:])


def describe(outcome: Outcome) -> str:
    """One line to reproduce a failing case."""
    import shlex

    return "perfmodel " + " ".join(shlex.quote(a) for a in outcome.argv)

