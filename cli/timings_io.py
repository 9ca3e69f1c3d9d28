"""Read measured collective timings for `perfmodel calibrate collectives` (all file reading is here).

Formats:
- CSV with a header ``op,ranks,bytes,seconds`` (``#`` lines are comments): one measured call a row,
  ``op`` one of all_reduce, all_gather, reduce_scatter, all_to_all (or NCCL's alltoall);
- the NCCL tables NVIDIA ships with aiconfigurator (``nccl_perf.parquet``: op_name, nccl_dtype,
  num_gpus, message_size in elements, latency in ms); reading Parquet needs pyarrow.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from hardware_db.errors import SpecError

# aiconfigurator's folder name for each accelerator it measured.
AICONFIGURATOR_DEVICES = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-sxm-80gb": "a100_sxm",
                          "b200": "b200_sxm", "gb200": "gb200"}
DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "bf16": 2, "fp16": 2, "int8": 1, "fp8": 1, "float": 4}
COLUMNS = ("op", "ranks", "bytes", "seconds")


def read_timings(path: Path) -> tuple[list, list, list, list]:
    """(ops, ranks, bytes, seconds) from a CSV or an aiconfigurator Parquet table."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    rows = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(rows)
    if reader.fieldnames is None or not set(COLUMNS) <= {f.strip() for f in reader.fieldnames}:
        raise SpecError(f"{path}: needs a header with the columns {', '.join(COLUMNS)}")
    out: tuple[list, list, list, list] = ([], [], [], [])
    for line, row in enumerate(reader, start=2):
        try:
            values = (row["op"].strip(), int(row["ranks"]), float(row["bytes"]), float(row["seconds"]))
        except (TypeError, ValueError, AttributeError):
            raise SpecError(f"{path}:{line}: needs op, integer ranks, bytes and seconds") from None
        if not all(math.isfinite(v) for v in values[1:]):
            raise SpecError(f"{path}:{line}: bytes and seconds need finite numbers")
        for column, value in zip(out, values):
            column.append(value)
    return out


def _read_parquet(path: Path) -> tuple[list, list, list, list]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError("reading Parquet needs pyarrow: pip install 'perfmodel[calibrate]'") from None
    try:
        table = pq.read_table(path).to_pydict()
    except Exception as exc:  # a broken file: one line, not a traceback
        raise SpecError(f"{path}: not a readable Parquet table ({type(exc).__name__})") from None
    needed = ("op_name", "num_gpus", "message_size", "latency")
    if not all(k in table for k in needed):
        raise SpecError(f"{path}: needs the columns {', '.join(needed)} (aiconfigurator's nccl_perf)")
    dtypes = table.get("nccl_dtype", ["half"] * len(table["op_name"]))
    out: tuple[list, list, list, list] = ([], [], [], [])
    for op, ranks, elements, ms, dtype in zip(table["op_name"], table["num_gpus"], table["message_size"],
                                              table["latency"], dtypes):
        if dtype in DTYPE_BYTES:
            for column, value in zip(out, (op, int(ranks), float(elements) * DTYPE_BYTES[dtype], float(ms) * 1e-3)):
                column.append(value)
    return out


def aiconfigurator_table(device: str) -> tuple[Path, str]:
    """The newest NCCL table the installed aiconfigurator-core ships for ``device``, and its provenance."""
    import importlib.util
    from importlib import metadata

    folder = AICONFIGURATOR_DEVICES.get(device)
    if folder is None:
        raise SpecError(f"aiconfigurator has no NCCL table for {device}; it measured "
                        f"{', '.join(sorted(AICONFIGURATOR_DEVICES))}")
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SpecError("aiconfigurator is not installed: pip install aiconfigurator (a calibration-time tool, "
                        "never a run-time dependency), or pass --table FILE")
    root = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data" / folder / "comm" / "nccl"
    tables = sorted(root.glob("*/nccl_perf.parquet"),
                    key=lambda p: [int(x) if x.isdigit() else x for x in p.parent.name.replace("-", ".").split(".")])
    if not tables:
        raise SpecError(f"{root}: no nccl_perf.parquet in this aiconfigurator install")
    version = metadata.version("aiconfigurator-core")
    where = tables[-1].relative_to(root.parents[3])
    return tables[-1], f"aiconfigurator-core {version} (Apache-2.0), {where}"
