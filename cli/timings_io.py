"""Read measured timings for `perfmodel calibrate` (all file reading is here).

Formats:
- collectives, CSV with a header ``op,ranks,bytes,seconds`` (``#`` lines are comments): one
  measured call a row, ``op`` one of all_reduce, all_gather, reduce_scatter, all_to_all (or NCCL's
  alltoall);
- GEMMs, CSV with a header ``m,n,k,dtype,seconds``: M x K activations by K x N weights, dtype bf16,
  fp16 or fp8 (fp8 rows include the kernel that quantizes the activations, as a framework runs it);
- the tables NVIDIA ships with aiconfigurator (``nccl_perf.parquet``: op_name, nccl_dtype,
  num_gpus, message_size in elements, latency in ms; ``gemm_perf.parquet``: gemm_dtype, m, n, k,
  latency in ms); reading Parquet needs pyarrow.
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
GEMM_COLUMNS = ("m", "n", "k", "dtype", "seconds")
# GEMM dtypes perfmodel models, as aiconfigurator and users spell them: (precision, includes a cast).
# Block-scaled fp8 (fp8_block), nvfp4 and weight-only formats are other kernels, not read here.
GEMM_DTYPES = {"bfloat16": ("bf16", False), "bf16": ("bf16", False), "float16": ("fp16", False),
               "fp16": ("fp16", False), "fp8": ("fp8", True)}


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
    table = _parquet(path, ("op_name", "num_gpus", "message_size", "latency"), "nccl_perf")
    dtypes = table.get("nccl_dtype", ["half"] * len(table["op_name"]))
    out: tuple[list, list, list, list] = ([], [], [], [])
    for op, ranks, elements, ms, dtype in zip(table["op_name"], table["num_gpus"], table["message_size"],
                                              table["latency"], dtypes):
        if dtype in DTYPE_BYTES:
            for column, value in zip(out, (op, int(ranks), float(elements) * DTYPE_BYTES[dtype], float(ms) * 1e-3)):
                column.append(value)
    return out


def read_gemm_timings(path: Path) -> dict[str, tuple]:
    """Per precision: (m, n, k, seconds, cast) lists from a CSV or an aiconfigurator gemm_perf table."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        table = _parquet(path, ("gemm_dtype", "m", "n", "k", "latency"), "gemm_perf")
        rows = zip(table["m"], table["n"], table["k"], table["gemm_dtype"], (x * 1e-3 for x in table["latency"]))
    else:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        reader = csv.DictReader(lines)
        if reader.fieldnames is None or not set(GEMM_COLUMNS) <= {f.strip() for f in reader.fieldnames}:
            raise SpecError(f"{path}: needs a header with the columns {', '.join(GEMM_COLUMNS)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                values = (float(row["m"]), float(row["n"]), float(row["k"]), row["dtype"].strip().lower(),
                          float(row["seconds"]))
            except (TypeError, ValueError, AttributeError):
                raise SpecError(f"{path}:{line}: needs numbers m, n, k and seconds, and a dtype") from None
            if values[3] not in GEMM_DTYPES:
                raise SpecError(f"{path}:{line}: dtype needs one of {', '.join(sorted(GEMM_DTYPES))}, has {values[3]!r}")
            rows.append(values)
    out: dict[str, tuple] = {}
    for m, n, k, dtype, seconds in rows:
        if dtype not in GEMM_DTYPES:
            continue
        precision, cast = GEMM_DTYPES[dtype]
        cols = out.setdefault(precision, ([], [], [], [], cast))
        for column, value in zip(cols, (m, n, k, seconds)):
            column.append(float(value))
    if not out:
        raise SpecError(f"{path}: no GEMM rows in bf16, fp16 or fp8")
    return out


def _parquet(path: Path, needed: tuple, kind: str) -> dict:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError("reading Parquet needs pyarrow: pip install 'perfmodel[calibrate]'") from None
    try:
        table = pq.read_table(path).to_pydict()
    except Exception as exc:  # a broken file: one line, not a traceback
        raise SpecError(f"{path}: not a readable Parquet table ({type(exc).__name__})") from None
    if not all(k in table for k in needed):
        raise SpecError(f"{path}: needs the columns {', '.join(needed)} (aiconfigurator's {kind})")
    return table


def aiconfigurator_table(device: str, family: str = "comm/nccl", name: str = "nccl_perf.parquet") -> tuple[Path, str]:
    """The newest table of ``family`` (its folder, e.g. comm/nccl or gemm/trtllm) the installed
    aiconfigurator-core ships for ``device``, and its provenance."""
    import importlib.util
    from importlib import metadata

    folder = AICONFIGURATOR_DEVICES.get(device)
    if folder is None:
        raise SpecError(f"aiconfigurator has no tables for {device}; it measured "
                        f"{', '.join(sorted(AICONFIGURATOR_DEVICES))}")
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SpecError("aiconfigurator is not installed: pip install aiconfigurator (a calibration-time tool, "
                        "never a run-time dependency), or pass --table FILE")
    root = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data" / folder / family
    tables = sorted(root.glob(f"*/{name}"),
                    key=lambda p: [int(x) if x.isdigit() else x for x in p.parent.name.replace("-", ".").split(".")])
    if not tables:
        raise SpecError(f"{root}: no {name} in this aiconfigurator install")
    version = metadata.version("aiconfigurator-core")
    where = tables[-1].relative_to(root.parents[1 + family.count("/") + 1])
    return tables[-1], f"aiconfigurator-core {version} (Apache-2.0), {where}"


def aiconfigurator_cast_launch(device: str) -> tuple[float, str]:
    """Fixed cost (s) of the fp8 activation cast as aiconfigurator's TensorRT-LLM flow runs it
    (an amax kernel and a quantize kernel): each table's smallest latency; and its provenance."""
    seconds, where = 0.0, []
    for name in ("computescale_perf.parquet", "scale_matrix_perf.parquet"):
        path, provenance = aiconfigurator_table(device, "quantize/trtllm", name)
        table = _parquet(path, ("latency",), name.split(".")[0])
        seconds += min(table["latency"]) * 1e-3
        where.append(provenance.split(", ", 1)[1])
    return seconds, ", ".join(where)
