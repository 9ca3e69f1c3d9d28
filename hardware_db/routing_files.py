"""Read MoE routing counts from a file (JSON, CSV or NumPy .npz), every size checked before it is
allocated; ``perfmodel.routing`` turns them into routing statistics.

Formats (documented in the README):
- JSON: {"loads": [[tokens of expert 0, 1, ...] per MoE layer], "transitions": optional
  [[[tokens from expert i to expert j] ...] per consecutive layer pair]}.
- CSV: a header "layer,expert,tokens" and one row per (layer, expert); no transitions.
- NPZ: arrays "loads" (layers x experts) and optional "transitions" ((layers-1) x experts x
  experts); read without pickles.
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import SpecError
from .files import read_bytes, read_json, read_text
from .limits import MIB

MAX_FILE_BYTES = 64 * MIB          # a DeepSeek-V3 table with every transition is about 30 MB of text


def read_routing_counts(path_text: str, max_layers: int, max_experts: int, max_tokens: float):
    """(loads, transitions or None) from a .json, .csv or .npz file, every size checked before it is
    allocated: at most ``max_layers`` x ``max_experts`` loads (the model's own shape bounds them),
    each count at most ``max_tokens``."""
    if not path_text.strip():
        raise SpecError("--routing needs the path of a .json, .csv or .npz file")
    path = Path(path_text)
    suffix = path.suffix.lower()
    readers = {".json": _from_json, ".csv": _from_csv, ".npz": _from_npz}
    if suffix not in readers:
        raise SpecError(f"routing file {path}: needs .json, .csv or .npz, has '{suffix or 'no suffix'}'")
    return readers[suffix](path, max_layers, max_experts, max_tokens)


def _array(value, what: str, path: Path, max_values: int) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=float)
    except (ValueError, TypeError, OverflowError):
        raise SpecError(f"{path}: '{what}' needs a table of numbers with rows of one length") from None
    if array.size > max_values:
        raise SpecError(f"{path}: '{what}' holds {array.size:,} numbers, more than the model's {max_values:,}")
    return array


def _from_json(path: Path, max_layers: int, max_experts: int, max_tokens: float):
    data = read_json(path, MAX_FILE_BYTES)
    if not isinstance(data, dict) or "loads" not in data:
        raise SpecError(f"{path}: needs a JSON object with 'loads' (and optional 'transitions')")
    loads = _array(data["loads"], "loads", path, max_layers * max_experts)
    transitions = data.get("transitions")
    if transitions is not None:
        transitions = _array(transitions, "transitions", path, max(max_layers - 1, 1) * max_experts ** 2)
    return loads, transitions


def _index(text: str | None, column: str, limit: int, path: Path, line: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise SpecError(f"{path}:{line}: '{column}' needs an integer index") from None
    if not 0 <= value < limit:
        raise SpecError(f"{path}:{line}: '{column}' {value} is outside the model's 0 to {limit - 1}")
    return value


def _from_csv(path: Path, max_layers: int, max_experts: int, max_tokens: float):
    rows = csv.DictReader(io.StringIO(read_text(path, MAX_FILE_BYTES, "routing file"), newline=""))
    if not rows.fieldnames or not {"layer", "expert", "tokens"} <= {f.strip() for f in rows.fieldnames}:
        raise SpecError(f"{path}: needs a header 'layer,expert,tokens' and rows")
    counts: dict[tuple[int, int], float] = {}
    try:
        for line, row in enumerate(rows, start=2):
            row = {str(k).strip(): v for k, v in row.items()}
            key = (_index(row["layer"], "layer", max_layers, path, line),
                   _index(row["expert"], "expert", max_experts, path, line))
            try:
                tokens = float(str(row["tokens"]))
            except ValueError:
                tokens = math.nan
            if not 0 <= tokens <= max_tokens:
                raise SpecError(f"{path}:{line}: 'tokens' needs a count from 0 to {max_tokens:g}, has "
                                f"{str(row['tokens'])[:20]!r}")
            counts[key] = counts.get(key, 0.0) + tokens
    except csv.Error as exc:
        raise SpecError(f"{path}: malformed CSV: {exc}") from None
    if not counts:
        raise SpecError(f"{path}: needs a header 'layer,expert,tokens' and rows")
    loads = np.zeros((1 + max(k[0] for k in counts), 1 + max(k[1] for k in counts)))
    for (layer, expert), tokens in counts.items():
        loads[layer, expert] = tokens
    return loads, None


def _npy(archive: zipfile.ZipFile, name: str, path: Path, max_values: int) -> np.ndarray | None:
    """One array of the archive, its header checked (numeric dtype, size) before its data is read."""
    member = f"{name}.npy"
    if member not in archive.namelist():
        return None
    info = archive.getinfo(member)
    try:
        with archive.open(info) as fh:
            version = np.lib.format.read_magic(fh)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(fh)
        size = math.prod(shape)
        if dtype.kind not in "iuf":
            raise SpecError(f"{path}: '{name}' needs integers or floats, has {dtype.name}")
        if size > max_values or size * dtype.itemsize > info.file_size:
            raise SpecError(f"{path}: '{name}' needs at most {max_values:,} numbers (the model's shape), "
                            f"its header claims {size:,}")
        with archive.open(info) as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)
    except (ValueError, OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error) as exc:
        raise SpecError(f"{path}: '{name}' is not a readable NumPy array ({exc.__class__.__name__})") from None


def _from_npz(path: Path, max_layers: int, max_experts: int, max_tokens: float):
    try:
        archive = zipfile.ZipFile(io.BytesIO(read_bytes(path, MAX_FILE_BYTES, "routing file")))
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise SpecError(f"{path}: not a NumPy .npz archive") from None
    with archive:
        loads = _npy(archive, "loads", path, max_layers * max_experts)
        if loads is None:
            raise SpecError(f"{path}: needs an array named 'loads'")
        return loads, _npy(archive, "transitions", path, max(max_layers - 1, 1) * max_experts ** 2)
