"""The argument names of each framework at one named version, vendored with their source
(``flags/<framework>.yaml``), the check that an export uses only those names and values, and the
cross-field rules of the framework's own validators (``rules:``: each with the framework's reason
and the file and line it comes from at that version) that the writers check before they write."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

FLAGS_DIR = Path(__file__).parent / "flags"
FILES = {"megatron": "megatron-lm", "nemo": "megatron-bridge", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
         "vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "dynamo": "dynamo"}


@dataclass(frozen=True)
class Vendored:
    """One framework version's argument names: command-line ``names`` and config ``keys`` (dotted paths),
    each with its type and, where the source declares them, its choices."""

    framework: str
    version: str
    commit: str
    released: str
    source: str
    names: dict[str, dict]
    keys: dict[str, dict]
    entries: dict[str, list[str]]
    parts: dict[str, dict]          # a companion command's own names and keys (SGLang's router, ...)
    engine_versions: dict[str, str]  # the engines a wrapper (Dynamo) pins
    rules: dict[str, dict]          # rule id -> {reason, source, ...}: the framework's own validation rules

    @property
    def citation(self) -> str:
        commit = f"commit {self.commit[:12]}" if self.commit not in ("", "None") else "no commit recorded"
        released = f", {self.released}" if self.released not in ("", "None") else ""
        return f"{self.framework} {self.version} ({commit}{released}; {self.source})"


@lru_cache(maxsize=None)
def vendored(framework: str) -> Vendored:
    """The framework's vendored argument table, parsed once per change of its file (hardware_db.cache)."""
    from perfmodel.hardware_db.cache import cached

    path = FLAGS_DIR / f"{FILES[framework]}.yaml"
    return cached(f"flags-{FILES[framework]}", [Path(__file__)], [path], lambda: _parse(path), Vendored)


def _parse(path: Path) -> Vendored:
    from perfmodel.hardware_db.files import read_yaml

    data = read_yaml(path)
    table = {"names": data.get("names") or {}, "keys": data.get("keys") or {}}
    if data.get("kind") == "keys":  # a config-file framework lists its dotted keys under names
        table = {"names": {}, "keys": {**table["names"], **table["keys"]}}
    parts = {name: {"names": part.get("names") or {}, "keys": part.get("keys") or {}}
             for name, part in data.items() if isinstance(part, dict) and ("names" in part or "keys" in part)}
    return Vendored(framework=str(data["framework"]), version=str(data["version"]), commit=str(data["commit"]),
                    released=str(data["released"]), source=str(data["source"]), names=table["names"],
                    keys=table["keys"], entries=data.get("entries") or {}, parts=parts,
                    engine_versions={k: str(v) for k, v in (data.get("engine_versions") or {}).items()},
                    rules=data.get("rules") or {})


@dataclass(frozen=True)
class Rule:
    """One validation rule of a framework version: ``reason`` in the framework's own words and
    ``source``, the file and lines at the vendored version that enforce it."""

    framework: str
    name: str
    reason: str
    source: str

    def refusal(self, what: str, hint: str = "") -> str:
        """One line: the plan ``what`` refused with the framework's reason and where it says so."""
        v = vendored(self.framework)
        return (f"{v.framework} {v.version} cannot run {what}: \"{self.reason}\" ({self.source})"
                + (f"; {hint}" if hint else ""))


def rule(framework: str, name: str) -> Rule:
    """The vendored rule ``name`` of ``framework`` (a KeyError is a writer bug: every rule a writer
    checks is vendored with its source)."""
    entry = vendored(framework).rules[name]
    return Rule(framework=framework, name=name, reason=str(entry["reason"]), source=str(entry["source"]))


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "flag":
        return value is True
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "list":
        return isinstance(value, (list, tuple))
    if kind == "dict":
        return isinstance(value, dict)
    return isinstance(value, str)


def unknown(framework: str, items: dict[str, Any], table: str = "names", part: str | None = None) -> list[str]:
    """What in ``items`` (flag or dotted key -> value) the framework's vendored version does not
    accept: an unknown name, a value of the wrong type, or a value outside its declared choices.
    Values that are shell variables ("$DATA_PATH") are checked by name only. ``part`` names a
    companion command's table (SGLang's ``router``, TensorRT-LLM's ``disaggregated``)."""
    v = vendored(framework)
    allowed = v.parts[part][table] if part else getattr(v, table)
    problems = []
    for name, value in items.items():
        spec = allowed.get(name)
        if spec is None:
            problems.append(f"{name} is not an argument of {vendored(framework).citation}")
            continue
        if isinstance(value, str) and value.startswith("$"):
            continue
        kind = spec.get("type", "str")
        if not _type_ok(kind, value) and not (kind in ("str", "float") and isinstance(value, (int, float, str))):
            problems.append(f"{name} takes {kind}, the export gives {value!r}")
        choices = spec.get("choices")
        if choices and value not in choices and str(value) not in map(str, choices):
            problems.append(f"{name} takes one of {', '.join(map(str, choices))}, the export gives {value!r}")
    return problems


def checked(framework: str, items: dict[str, Any], table: str = "names", part: str | None = None) -> dict[str, Any]:
    """``items`` unchanged when the framework accepts every one; else an AssertionError (a bug of the
    writer, which golden tests catch before a user does)."""
    problems = unknown(framework, items, table, part)
    if problems:
        raise AssertionError(f"{framework} export: " + "; ".join(problems))
    return items
