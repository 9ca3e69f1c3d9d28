"""Every file perfmodel reads goes through here: sizes checked before reading, trees bounded after parsing.

A user's file is untrusted. YAML is parsed by a safe loader (libyaml's parser when present, for speed)
whose composer refuses nesting deeper than ``MAX_DEPTH`` and more than ``MAX_NODES`` values, aliases
expanded (a "billion laughs" is refused before anything walks it); what libyaml refuses is read again
by PyYAML's pure-Python parser, so every message is the same on every build; JSON refuses NaN and
Infinity literals, integers longer than ``MAX_INT_DIGITS`` digits and numbers that overflow a float.
Every failure is one-line :class:`SpecError`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import SpecError
from .limits import MAX_DEPTH, MAX_INT_DIGITS, MAX_JSON_BYTES, MAX_YAML_BYTES, MIB



def read_bytes(path: Path, limit: int, what: str = "file") -> bytes:
    """The bytes of ``path``, refused with one line when it is missing, unreadable or over ``limit``."""
    try:
        if not path.is_file():
            raise SpecError(f"{what} not found: {path}")
        size = path.stat().st_size
        if size > limit:
            raise SpecError(f"{path}: {size / MIB:,.1f} MiB is over the {limit / MIB:g} MiB limit for a {what}")
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}") from None
    if len(data) > limit:
        raise SpecError(f"{path}: over the {limit / MIB:g} MiB limit for a {what}")
    return data


def read_text(path: Path, limit: int, what: str = "file") -> str:
    """UTF-8 text (a byte-order mark is dropped) of at most ``limit`` bytes."""
    try:
        return read_bytes(path, limit, what).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def __getattr__(name: str):
    """The YAML loaders (``BoundedSafeLoader``, ``PURE_LOADER``) live in :mod:`hardware_db.yaml_loader`,
    imported on first use: a run whose data comes from the cache never imports PyYAML."""
    if name in ("BoundedSafeLoader", "PURE_LOADER"):
        from . import yaml_loader

        return getattr(yaml_loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text; a syntax error, an unsafe tag, an over-deep or over-expanding tree is one line.

    libyaml's events are composed under the project's limits. Where libyaml refuses the text, the
    pure-Python parser reads it again and its verdict stands: libyaml's own limits and messages
    differ between builds (0.2.6 stops at 1,000 levels of nesting before any event reaches the
    composer), so a refusal reads the same on every machine."""
    import yaml

    from .yaml_loader import PURE_LOADER, BoundedSafeLoader, LimitError, load_with

    try:
        try:
            return load_with(BoundedSafeLoader, text)
        except LimitError:
            raise
        except yaml.YAMLError:
            if BoundedSafeLoader is PURE_LOADER:
                raise
            return load_with(PURE_LOADER, text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"malformed YAML ({where}{at}): {problem}") from None
    except (ValueError, OverflowError):  # an integer of over 4,300 digits
        raise SpecError(f"malformed YAML ({where}): a number too long to read") from None
    except RecursionError:
        raise SpecError(f"malformed YAML ({where}): aliases nest deeper than {MAX_DEPTH} levels") from None


def read_yaml(path: Path) -> Any:
    """A YAML file of at most ``MAX_YAML_BYTES``, parsed by :func:`parse_yaml`."""
    return parse_yaml(read_text(path, MAX_YAML_BYTES, "YAML file"), str(path))


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a 64-bit float")
    return value


def _no_constant(text: str):
    raise ValueError(f"{text} is not a number JSON allows")


def parse_json(text: str, where: str) -> Any:
    """Parse JSON text with finite numbers of bounded size and nesting of at most ``MAX_DEPTH``."""
    try:
        data = json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(f"malformed JSON ({where}:{exc.lineno}): {exc.msg}") from None
    except ValueError as exc:
        raise SpecError(f"malformed JSON ({where}): {exc}") from None
    except RecursionError:
        raise SpecError(f"malformed JSON ({where}): nested deeper than {MAX_DEPTH} levels") from None
    if _depth(data) > MAX_DEPTH:
        raise SpecError(f"malformed JSON ({where}): nested deeper than {MAX_DEPTH} levels")
    return data


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file of at most ``limit`` bytes, parsed by :func:`parse_json`."""
    return parse_json(read_text(path, limit, "JSON file"), str(path))


def _depth(data: Any) -> int:
    """Nesting depth of plain data, without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(node, dict):
            stack += [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]
    return deepest


def short(value: Any, width: int = 40) -> str:
    """A value as it may appear in a one-line message: its repr, cut to ``width`` characters."""
    text = value if isinstance(value, str) else type(value).__name__
    text = repr(text)
    return text if len(text) <= width else text[: width - 4] + "...'"
