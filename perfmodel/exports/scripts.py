"""What every writer shares: a shell command with one ``--flag value`` per line, and nested config
mappings as the dotted keys the vendored lists name."""

from __future__ import annotations

import json
import shlex


def command(words: list[str], items: dict[str, object]) -> str:
    """``words``, then each item as ``--flag value`` on its own line: ``True`` is a bare flag, a list its
    values, a mapping compact JSON, ``"$NAME"`` a quoted shell variable, anything else a quoted word."""
    lines = [" ".join(words)]
    for name, value in items.items():
        if value is True:
            lines.append(name)
        elif isinstance(value, (list, tuple)):
            lines.append(f"{name} " + " ".join(_word(v) for v in value))
        else:
            lines.append(f"{name} {_word(value)}")
    return " \\\n  ".join(lines) + "\n"


def _word(value) -> str:
    if isinstance(value, dict):
        return shlex.quote(json.dumps(value, separators=(",", ":")))
    if isinstance(value, str) and value.startswith("$"):
        return f'"{value}"'
    return shlex.quote(value if isinstance(value, str) else json.dumps(value))


def flatten(config: dict, prefix: str = ""):
    """(dotted key, value) of every leaf of a nested mapping."""
    for key, value in config.items():
        if isinstance(value, dict):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
