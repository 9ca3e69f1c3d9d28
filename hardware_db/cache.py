"""Validated data cached by content: the hardware database and the model catalog are parsed and
validated once per change of their files (or of the code that validates them), then unpickled.

The cache is the user's own folder (``PERFMODEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/perfmodel``
or ``~/.cache/perfmodel``; ``off`` keeps none). It holds only what ``cached`` wrote, each file
named by the SHA-256 of its inputs; anything unreadable is ignored and rebuilt, and a folder that
cannot be written is simply not used.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from .files import read_bytes
from .limits import MAX_YAML_BYTES

CACHE_ENV = "PERFMODEL_CACHE_DIR"
CACHE_ENTRIES = 20       # files kept per kind, the least recently used evicted first

T = TypeVar("T")


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    value = environ.get(CACHE_ENV, "").strip()
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfmodel"


def content_key(code: list[Path], files: list[Path]) -> str:
    """SHA-256 of pydantic's version, the validating code's source and every data file's path and bytes."""
    import pydantic

    digest = hashlib.sha256(pydantic.VERSION.encode())
    for path in code:
        digest.update(path.read_bytes())
    for path in files:
        digest.update(str(path).encode() + b"\0" + read_bytes(path, MAX_YAML_BYTES, "YAML file") + b"\0")
    return digest.hexdigest()


def cached(kind: str, code: list[Path], files: list[Path], build: Callable[[], T], expected: type) -> T:
    """What ``build()`` returned for these exact files and code before, else ``build()`` (stored)."""
    import pickle

    folder = cache_dir()
    if folder is None:
        return build()
    path = folder / f"{kind}-{content_key(code, files)}.pickle"
    try:
        value = pickle.loads(path.read_bytes())
        if isinstance(value, expected):
            os.utime(path)            # recently used: the last to be evicted
            return value
    except Exception:  # noqa: BLE001 - absent, stale or damaged: build again
        pass
    value = build()
    _store(folder, kind, path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    return value


def _store(folder: Path, kind: str, path: Path, data: bytes) -> None:
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        kept = sorted(folder.glob(f"{kind}-*.pickle"), key=lambda f: f.stat().st_mtime)
        for old in kept[:-CACHE_ENTRIES]:
            old.unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".tmp") as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    except OSError:  # a read-only home, a folder removed meanwhile: run without the cache
        pass
