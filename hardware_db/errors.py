"""The one family of user-facing errors.

Every mistake a user can make (an unknown name, a malformed file, an impossible request) raises a
subclass of :class:`PerfmodelError`; the CLI prints its one-line message and exits with
``exit_code``. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PerfmodelError(Exception):
    """Base of all expected, user-facing errors (exit code 2: bad input)."""

    exit_code = 2


class SpecError(PerfmodelError):
    """A file, a field or a flag holds a value the tool cannot accept."""


class UnknownNameError(SpecError):
    """A name that is in no catalog; the message suggests the closest known names."""

    def __init__(self, what: str, name: str, known: Iterable[str]):
        known = sorted(known)
        close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known[:12])}"
        if not close and len(known) > 12:
            hint += ", ..."
        super().__init__(f"unknown {what} '{name}'{hint}")
        self.name = name
        self.suggestions = close


class UnsupportedPrecisionError(SpecError):
    """A precision the device's datasheet does not list (never derived from another one)."""


class InfeasibleError(PerfmodelError):
    """No plan satisfies the constraints (exit code 3); the message names the binding one."""

    exit_code = 3
