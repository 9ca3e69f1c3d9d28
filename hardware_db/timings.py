"""Read measured timings for `perfmodel calibrate` (all file reading is here).

Formats:
- collectives, CSV with a header ``op,ranks,bytes,seconds`` (``#`` lines are comments): one
  measured call a row, ``op`` one of all_reduce, all_gather, reduce_scatter, all_to_all (or NCCL's
  alltoall);
- GEMMs, CSV with a header ``m,n,k,dtype,seconds``: M x K activations by K x N weights, dtype bf16,
  fp16, fp8, int8 (W8A8) or fp4 (NVFP4 W4A4) (their rows include the kernel that quantizes the
  activations, as a framework runs it), or w8a16 / w4a16 (int8 or int4 weights dequantized inside
  a bf16 GEMM);
- attention kernels, CSV with a header ``phase,batch,seq_len,heads,kv_heads,head_dim,dtype,kv_dtype,seconds``:
  phase prefill (a causal prompt of seq_len tokens per sequence) or decode (one new token per
  sequence over seq_len cached tokens); dtype the attention math (bf16 or fp8), kv_dtype the cache's;
- expert dispatch and combine (DeepEP low-latency kernels), CSV with a header
  ``op,ranks,ranks_per_node,tokens,top_k,hidden,dtype,seconds``: op dispatch or combine, ``tokens``
  each rank sends to its ``top_k`` experts over ``ranks`` ranks, ``ranks_per_node`` of them in one
  scale-up domain; dtype the payload's (fp8 adds one 4-byte scale per 128 values, as DeepEP sends it);
- the same for DeepEP's normal kernels (prefill), CSV with a header
  ``op,ranks,ranks_per_node,tokens,top_k,experts,hidden,dtype,seconds``: ``tokens`` each rank sends to
  their ``top_k`` of ``experts`` experts (a token crosses to each rank and node holding one once);
- the tables NVIDIA ships with aiconfigurator (``nccl_perf.parquet``: op_name, nccl_dtype,
  num_gpus, message_size in elements, latency in ms; ``gemm_perf.parquet``: gemm_dtype, m, n, k,
  latency in ms; ``context_attention_perf.parquet`` and ``generation_attention_perf.parquet``:
  batch_size, isl, step, num_heads, num_key_value_heads, head_dim, window_size, attn_dtype,
  kv_cache_dtype, latency in ms; ``wideep_deepep_ll_perf.parquet``: node_num, hidden_size, num_token,
  num_topk, dispatch_avg_t_us and combine_avg_t_us, fp8 dispatch and bf16 combine;
  ``wideep_deepep_normal_perf.parquet``: the same shape columns and num_experts, and per op the SMs it
  ran on and its transmit and notify times in us; ``moe_perf.parquet``, or a CSV with its columns:
  kernel_source, moe_dtype, distribution, num_tokens, hidden_size, inter_size, topk, num_experts,
  moe_tp_size, moe_ep_size and latency in ms, one measured MoE layer a row); reading Parquet needs pyarrow.
"""

from __future__ import annotations

import csv
from pathlib import Path

from perfmodel.hardware_db.errors import SpecError

# aiconfigurator's folder name for each accelerator it measured.
AICONFIGURATOR_DEVICES = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-sxm-80gb": "a100_sxm",
                          "b200": "b200_sxm", "gb200": "gb200"}
MAX_TABLE_BYTES = 64 << 20   # about 1.5 M rows; aiconfigurator's largest table has 260 k
# Plausible range of each numeric CSV column: wider than any kernel measured, narrow enough that a
# fit never meets an overflow, a zero or a denormal.
RANGES = {"seconds": (1e-9, 1e3), "bytes": (1.0, 1e13), "ranks": (1.0, 1e6), "ranks_per_node": (1.0, 1e4),
          "m": (1.0, 1e8), "n": (1.0, 1e8), "k": (1.0, 1e8), "batch": (1.0, 1e7), "seq_len": (1.0, 1e8),
          "heads": (1.0, 1e5), "kv_heads": (1.0, 1e5), "head_dim": (1.0, 1e5), "tokens": (1.0, 1e8),
          "top_k": (1.0, 1e4), "experts": (1.0, 1e6), "hidden": (1.0, 1e7),
          # aiconfigurator's MoE table as CSV (latency in ms)
          "num_tokens": (1.0, 1e8), "hidden_size": (1.0, 1e7), "inter_size": (1.0, 1e7), "topk": (1.0, 1e4),
          "num_experts": (1.0, 1e6), "moe_tp_size": (1.0, 1e6), "moe_ep_size": (1.0, 1e6), "latency": (1e-6, 1e6)}
PARQUET_RANGES = {"latency": (1e-6, 1e6), "m": RANGES["m"], "n": RANGES["n"], "k": RANGES["k"],
                  "num_gpus": RANGES["ranks"], "message_size": (1.0, 1e13), "batch_size": RANGES["batch"],
                  "isl": RANGES["seq_len"], "num_heads": RANGES["heads"], "num_key_value_heads": RANGES["kv_heads"],
                  "head_dim": RANGES["head_dim"], "node_num": (1.0, 1e5), "hidden_size": RANGES["hidden"],
                  "num_token": RANGES["tokens"], "num_topk": RANGES["top_k"], "dispatch_avg_t_us": (1e-3, 1e9),
                  "combine_avg_t_us": (1e-3, 1e9), "num_experts": RANGES["experts"],
                  "dispatch_sms": (1.0, 1e4), "combine_sms": (1.0, 1e4),
                  "dispatch_transmit_us": (1e-3, 1e9), "combine_transmit_us": (1e-3, 1e9),
                  "dispatch_notify_us": (0.0, 1e9), "combine_notify_us": (0.0, 1e9),
                  "num_tokens": RANGES["num_tokens"], "inter_size": RANGES["inter_size"], "topk": RANGES["topk"],
                  "moe_tp_size": RANGES["moe_tp_size"], "moe_ep_size": RANGES["moe_ep_size"]}
DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "bf16": 2, "fp16": 2, "int8": 1, "fp8": 1, "float": 4}
COLUMNS = ("op", "ranks", "bytes", "seconds")
GEMM_COLUMNS = ("m", "n", "k", "dtype", "seconds")
# GEMM dtypes perfmodel models, as aiconfigurator and users spell them: (precision, includes a cast).
GEMM_DTYPES = {"bfloat16": ("bf16", False), "bf16": ("bf16", False), "float16": ("fp16", False),
               "fp16": ("fp16", False), "fp8": ("fp8", True),
               # W8A8 with int8 weights and activations (SmoothQuant, aiconfigurator's "sq": per-token
               # activation scales), and W4A4 in NVFP4 (fp4 weights and activations in 16-element
               # blocks): both rows include the kernel that quantizes the activations.
               "sq": ("int8", True), "int8": ("int8", True), "nvfp4": ("fp4", True), "fp4": ("fp4", True),
               # fp8 with 128-element block scales (DeepSeek-V3's checkpoint recipe): the rows
               # include its per-token-group activation quantization, a kernel of its own.
               "fp8_block": ("fp8_block", True),
               # Weight-only formats: int8 / int4 weights dequantized inside a bf16 GEMM.
               "int8_wo": ("w8a16", False), "w8a16": ("w8a16", False), "int4_wo": ("w4a16", False),
               "w4a16": ("w4a16", False)}
# The stored weight format and bytes per weight of each weight-only GEMM.
WEIGHT_ONLY = {"w8a16": ("int8", 1.0), "w4a16": ("int4", 0.5)}
# The math precision of each block-scaled GEMM.
BLOCK_SCALED = {"fp8_block": "fp8"}


def read_timings(path: Path) -> tuple[list, list, list, list]:
    """(ops, ranks, bytes, seconds) from a CSV or an aiconfigurator Parquet table."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    out: tuple[list, list, list, list] = ([], [], [], [])
    for line, row in _csv_rows(path, COLUMNS):
        ranks, size, seconds = _numbers(row, ("ranks", "bytes", "seconds"), path, line)
        if ranks != int(ranks):
            raise SpecError(f"{path}:{line}: 'ranks' needs an integer, has {row['ranks']!r}")
        values = (str(row["op"]).strip(), int(ranks), size, seconds)
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


def read_gemm_timings(path: Path, fastest: bool = False) -> dict[str, tuple]:
    """Per precision: (m, n, k, seconds, cast) lists from a CSV or an aiconfigurator gemm_perf table.
    ``fastest``: where a table measured several kernels (``kernel_source``) of one dtype, the
    fastest at each shape (m, n, k), as an engine that picks its kernel per shape runs it."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        table = _parquet(path, ("gemm_dtype", "m", "n", "k", "latency"), "gemm_perf")
        rows = zip(table["m"], table["n"], table["k"], table["gemm_dtype"], (x * 1e-3 for x in table["latency"]))
        if fastest and "kernel_source" in table:
            rows = fastest_kernels(list(rows), table["kernel_source"])
    else:
        rows = []
        for line, row in _csv_rows(path, GEMM_COLUMNS):
            m, n, k, seconds = _numbers(row, ("m", "n", "k", "seconds"), path, line)
            values = (m, n, k, str(row["dtype"]).strip().lower(), seconds)
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
        raise SpecError(f"{path}: no GEMM rows in bf16, fp16, fp8, fp8_block, int8, fp4, w8a16 or w4a16")
    return out


def fastest_kernels(rows: list, sources: list) -> list:
    """``rows`` (m, n, k, dtype, seconds) with, for each dtype several kernels (``sources``, one per
    row) measured, only the fastest row at each shape; dtypes of one kernel keep every row."""
    kernels: dict[str, set] = {}
    for row, source in zip(rows, sources):
        kernels.setdefault(row[3], set()).add(source)
    best: dict[tuple, tuple] = {}
    kept = []
    for row in rows:
        if len(kernels[row[3]]) < 2:
            kept.append(row)
        elif row[:4] not in best or row[4] < best[row[:4]][4]:
            best[row[:4]] = row
    return kept + list(best.values())


ATTENTION_COLUMNS = ("phase", "batch", "seq_len", "heads", "kv_heads", "head_dim", "dtype", "kv_dtype", "seconds")
ATTENTION_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "fp8": "fp8"}
# Decode rows with more query heads per KV head than this run a kernel ~3x slower than the rest at
# every shape in TensorRT-LLM's tables; no model in the catalog has such groups, so they are left out.
MAX_DECODE_GROUP = 32


def read_attention_timings(path: Path, decode_path: Path | None = None,
                           kernels: dict | None = None) -> tuple[dict, int]:
    """({(phase, precision): (batch, queries, context, heads, kv_heads, head_dim, act_bytes,
    kv_bytes, seconds)}, rows left out) from a CSV, or from aiconfigurator's context (``path``) and
    generation (``decode_path``) attention tables. Prefill is keyed by the attention precision,
    decode by the KV cache's; in prefill the context is the causal mean, queries / 2. Sliding-window
    rows, decode groups above MAX_DECODE_GROUP and, given ``kernels`` ({phase: kernel_source names}),
    a table's rows of any other kernel are left out."""
    rows = []   # (phase, batch, seq_len, step, heads, kv_heads, head_dim, dtype, kv_dtype, seconds, window)
    for file, phase in ((path, None), (decode_path, "decode")):
        if file is None:
            continue
        if not file.is_file():
            raise SpecError(f"{file}: no such file")
        if file.suffix.lower() == ".parquet":
            t = _parquet(file, ("batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype",
                                "kv_cache_dtype", "latency"), "context/generation_attention_perf")
            n = len(t["latency"])
            step, window = t.get("step", [0] * n), list(t.get("window_size", [0] * n))
            wanted = (kernels or {}).get(phase or "prefill")
            if wanted and "kernel_source" in t:    # another kernel's rows: as a sliding window, left out
                window = [w if k in wanted else -1 for w, k in zip(window, t["kernel_source"])]
            rows += [(phase or "prefill", *r) for r in zip(t["batch_size"], t["isl"], step, t["num_heads"],
                                                           t["num_key_value_heads"], t["head_dim"], t["attn_dtype"],
                                                           t["kv_cache_dtype"], (x * 1e-3 for x in t["latency"]), window)]
            continue
        for line, row in _csv_rows(file, ATTENTION_COLUMNS):
            shape = _numbers(row, ("batch", "seq_len", "heads", "kv_heads", "head_dim", "seconds"), file, line)
            phase_, dtype, kv_dtype = (str(row[k]).strip().lower() for k in ("phase", "dtype", "kv_dtype"))
            if phase_ not in ("prefill", "decode") or dtype not in ATTENTION_DTYPES or kv_dtype not in ATTENTION_DTYPES:
                raise SpecError(f"{file}:{line}: phase needs prefill or decode and dtype, kv_dtype one of "
                                f"{', '.join(sorted(ATTENTION_DTYPES))}")
            rows.append((phase_, shape[0], shape[1], 0, *shape[2:5], dtype, kv_dtype, shape[5], 0))
    out: dict = {}
    left_out = 0
    for phase, b, s, step, h, kv, d, dtype, kv_dtype, seconds, window in rows:
        if window or dtype not in ATTENTION_DTYPES or kv_dtype not in ATTENTION_DTYPES or \
                (phase == "decode" and h > MAX_DECODE_GROUP * kv):
            left_out += 1
            continue
        decode = phase == "decode"
        key = (phase, ATTENTION_DTYPES[kv_dtype] if decode else ATTENTION_DTYPES[dtype])
        values = (b, 1.0 if decode else s, s + step if decode else s / 2.0, h, kv, d,
                  DTYPE_BYTES[dtype], DTYPE_BYTES[kv_dtype], seconds)
        cols = out.setdefault(key, tuple([] for _ in values))
        for column, value in zip(cols, values):
            column.append(float(value))
    if not out:
        raise SpecError(f"{path}: no attention rows in bf16, fp16 or fp8")
    return out, left_out


# SGLang's default MLA attention backend per GPU generation (fa3 on Hopper, trtllm_mla on
# Blackwell); aiconfigurator measured the MLA module under each backend it ran.
MLA_BACKENDS = ("fa3", "trtllm_mla", "flashinfer")


def read_mla_timings(path: Path, phase: str) -> tuple[tuple, str]:
    """((batch, isl, heads, kv_bytes, seconds), backend) of aiconfigurator's wide-EP MLA module
    table (``wideep_context_mla_perf`` or ``wideep_generation_mla_perf``, DeepSeek-V3, SGLang),
    the rows of the first of MLA_BACKENDS it measured. ``heads`` are the query heads on one rank."""
    t = _parquet(path, ("kernel_source", "batch_size", "isl", "num_heads", "kv_cache_dtype", "latency"),
                 f"wideep_{phase}_mla_perf")
    measured = set(t["kernel_source"])
    backend = next((b for b in MLA_BACKENDS if b in measured), None)
    if backend is None:
        raise SpecError(f"{path}: no MLA rows from {', '.join(MLA_BACKENDS)} (has {', '.join(sorted(measured))})")
    keep = [i for i, (b, kv) in enumerate(zip(t["kernel_source"], t["kv_cache_dtype"]))
            if b == backend and kv in DTYPE_BYTES]
    cols = ([float(t["batch_size"][i]) for i in keep], [float(t["isl"][i]) for i in keep],
            [float(t["num_heads"][i]) for i in keep], [float(DTYPE_BYTES[t["kv_cache_dtype"][i]]) for i in keep],
            [t["latency"][i] * 1e-3 for i in keep])
    return cols, backend


def read_mla_module_timings(path: Path, phase: str) -> tuple[tuple, str]:
    """((batch, context, heads, kv_bytes, seconds), kernels) of aiconfigurator's MLA module table of
    vLLM (``mla_context_module_perf`` or ``mla_generation_module_perf``, DeepSeek-V3): the rows over
    an fp8 KV cache with block-scaled fp8 projections (as the checkpoint serves), of the kernels it
    measured at a shape the fastest (vLLM picks its MLA backend per GPU); in decode the context is
    isl + step (the cached tokens), in prefill isl."""
    t = _parquet(path, ("kernel_source", "batch_size", "isl", "step", "num_heads", "kv_cache_dtype", "gemm_type",
                        "latency"), f"mla_{phase}_module_perf")
    keep = [i for i, (kv, g) in enumerate(zip(t["kv_cache_dtype"], t["gemm_type"])) if kv == "fp8" and g == "fp8_block"]
    if not keep:
        raise SpecError(f"{path}: no MLA module rows over an fp8 KV cache with fp8_block projections")
    context = [t["isl"][i] + (t["step"][i] if phase == "generation" else 0) for i in keep]
    keys = [(t["batch_size"][i], c, t["num_heads"][i]) for i, c in zip(keep, context)]
    best = fastest_rows(keep, keys, t["latency"])
    cols = ([float(t["batch_size"][i]) for i in best],
            [float(t["isl"][i] + (t["step"][i] if phase == "generation" else 0)) for i in best],
            [float(t["num_heads"][i]) for i in best], [1.0] * len(best), [t["latency"][i] * 1e-3 for i in best])
    return cols, "/".join(sorted({t["kernel_source"][i] for i in best}))


def read_moe_timings(path: Path) -> tuple:
    """(tokens, ep, num_experts, top_k, hidden, expert_hidden, seconds) of the uniformly routed fp8
    rows of aiconfigurator's wide-EP MoE table (SGLang DeepEP, ``wideep_generation_moe_perf``)."""
    t = _parquet(path, ("num_tokens", "moe_ep_size", "num_experts", "topk", "hidden_size", "inter_size",
                        "distribution", "moe_dtype", "latency"), "wideep_generation_moe_perf")
    keep = [i for i, (d, q) in enumerate(zip(t["distribution"], t["moe_dtype"])) if d == "uniform" and "fp8" in q]
    if not keep:
        raise SpecError(f"{path}: no uniformly routed fp8 MoE rows")
    cols = ("num_tokens", "moe_ep_size", "num_experts", "topk", "hidden_size", "inter_size")
    return tuple([float(t[c][i]) for i in keep] for c in cols) + ([t["latency"][i] * 1e-3 for i in keep],)


# TensorRT-LLM's MoE kernels in aiconfigurator's ``moe_perf`` tables, by kernel_source: gated
# (SwiGLU) or not. CUTLASS grouped GEMMs, DeepGEMM's for block-scaled fp8 on Blackwell, and the
# torch flow of the MXFP4 weight-only kernels; the min-latency NVFP4 twin is another kernel.
MOE_KERNELS = {"moe_torch_flow_cutlass": True, "moe_torch_flow_nongated": False, "deepgemm": True,
               "moe_torch_flow": True}
# aiconfigurator's moe_dtype -> (perfmodel's grouped-GEMM recipe, input bytes, weight bytes).
MOE_DTYPES = {"bfloat16": ("bf16", 2.0, 2.0), "fp8": ("fp8", 1.0, 1.0), "fp8_block": ("fp8_block", 1.0, 1.0),
              "w4a16_mxfp4": ("w4a16", 2.0, 0.5), "nvfp4": ("fp4", 0.5, 0.5)}
MOE_COLUMNS = ("kernel_source", "moe_dtype", "distribution", "num_tokens", "hidden_size", "inter_size", "topk",
               "num_experts", "moe_tp_size", "moe_ep_size", "latency")


def read_moe_layer_timings(path: Path, kernels=None, nongated: frozenset = frozenset()) -> dict[str, tuple]:
    """Per grouped-GEMM recipe, ((tokens, ep, etp, experts, top_k, hidden, expert_hidden, gated,
    seconds), in_bytes, weight_bytes, kernels) of the balanced rows of aiconfigurator's MoE table
    (``moe_perf.parquet``, TensorRT-LLM, or a CSV with its columns) that ran one of MOE_KERNELS.
    An engine's ``kernels`` (a predicate on kernel_source) keep, of several kernels measured at
    one row, the fastest (the one the engine's per-shape selection keeps); its rows are gated
    except the MoE shapes (hidden, expert width, experts, top-k) in ``nongated``."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        t = _parquet(path, MOE_COLUMNS, "moe_perf")
    else:
        t = {c: [] for c in MOE_COLUMNS}
        numeric = MOE_COLUMNS[3:]
        for line, row in _csv_rows(path, MOE_COLUMNS):
            for c in MOE_COLUMNS[:3]:
                t[c].append(str(row[c]).strip())
            for c, value in zip(numeric, _numbers(row, numeric, path, line)):
                t[c].append(value)
    out: dict[str, tuple] = {}
    rows: dict[str, list] = {}
    measured = (lambda k: k in MOE_KERNELS) if kernels is None else kernels
    for i, (kernel, dtype, dist) in enumerate(zip(t["kernel_source"], t["moe_dtype"], t["distribution"])):
        if dist == "balanced" and measured(kernel) and dtype in MOE_DTYPES:
            rows.setdefault(dtype, []).append(i)
    shape = ("num_tokens", "moe_ep_size", "moe_tp_size", "num_experts", "topk", "hidden_size", "inter_size")
    if kernels is not None:
        rows = {d: fastest_rows(keep, [tuple(t[c][i] for c in shape) for i in keep], t["latency"])
                for d, keep in rows.items()}
    for dtype, keep in rows.items():
        recipe, x, w = MOE_DTYPES[dtype]
        cols = [[float(t[c][i]) for i in keep] for c in shape]
        gated = [float(MOE_KERNELS[t["kernel_source"][i]]) if kernels is None else
                 float((t["hidden_size"][i], t["inter_size"][i], t["num_experts"][i], t["topk"][i]) not in nongated)
                 for i in keep]
        kernels = sorted({t["kernel_source"][i] for i in keep})
        out[recipe] = (tuple(cols) + (gated, [t["latency"][i] * 1e-3 for i in keep]), x, w, kernels)
    if not out:
        raise SpecError(f"{path}: no balanced rows of {', '.join(MOE_KERNELS)}")
    return out


def fastest_rows(index: list, keys: list, seconds) -> list:
    """Of the row numbers ``index`` (one key each), the fastest row of each key, in first-seen order."""
    best: dict = {}
    for i, key in zip(index, keys):
        if key not in best or seconds[i] < seconds[best[key]]:
            best[key] = i
    return list(best.values())


def nongated_shapes(path: Path) -> frozenset:
    """MoE shapes (hidden, expert width, experts, top-k) an aiconfigurator TensorRT-LLM MoE table
    measured with its non-gated kernel (``moe_torch_flow_nongated``: relu2 experts, Nemotron-H)
    and no gated one; the engines' tables do not name the activation."""
    t = _parquet(path, MOE_COLUMNS, "moe_perf")
    shapes = {False: set(), True: set()}
    for i, kernel in enumerate(t["kernel_source"]):
        if kernel in MOE_KERNELS:
            shapes[MOE_KERNELS[kernel]].add((t["hidden_size"][i], t["inter_size"][i], t["num_experts"][i], t["topk"][i]))
    return frozenset(shapes[False] - shapes[True])


def aiconfigurator_moe_table(device: str) -> tuple[Path, str]:
    """The TensorRT-LLM MoE table aiconfigurator-core ships for ``device`` with the most balanced
    rows of MOE_KERNELS (a later version may hold only a few re-measured shapes), and its provenance."""
    newest, provenance = aiconfigurator_table(device, "moe/trtllm", "moe_perf.parquet")
    root = newest.parents[1]

    def balanced(path):
        t = _parquet(path, ("kernel_source", "distribution"), "moe_perf")
        return sum(k in MOE_KERNELS and d == "balanced" for k, d in zip(t["kernel_source"], t["distribution"]))
    best = max(sorted(root.glob("*/moe_perf.parquet")), key=balanced)
    return best, f"{provenance.split(', ', 1)[0]}, {best.relative_to(root.parents[2])}"


DISPATCH_COLUMNS = ("op", "ranks", "ranks_per_node", "tokens", "top_k", "hidden", "dtype", "seconds")


def copy_bytes(hidden: float, dtype: str) -> float:
    """Bytes of one token-expert copy: fp8 carries one fp32 scale per 128 values (DeepEP's format)."""
    size = DTYPE_BYTES[dtype]
    return hidden * size + (hidden / 128.0 * 4.0 if size == 1 else 0.0)


def read_dispatch_timings(paths: list[Path], ranks_per_node: int = 8) -> tuple:
    """(ops, ranks, ranks per domain, copies, copy bytes, seconds) from CSVs, or from aiconfigurator's
    low-latency DeepEP tables (``ranks_per_node`` GPUs a node, as its system file says)."""
    cols = tuple([] for _ in range(6))

    def add(op, ranks, per_node, tokens, top_k, hidden, dtype, seconds):
        for column, value in zip(cols, (op, ranks, min(per_node, ranks), tokens * top_k,
                                        copy_bytes(hidden, dtype), seconds)):
            column.append(value)

    for path in paths:
        if _is_parquet(path):
            t = _parquet(path, ("node_num", "hidden_size", "num_token", "num_topk", "dispatch_avg_t_us",
                                "combine_avg_t_us"), "wideep_deepep_ll_perf")
            for nodes, h, tokens, k, disp, comb in zip(*(t[c] for c in ("node_num", "hidden_size", "num_token",
                                                                        "num_topk", "dispatch_avg_t_us",
                                                                        "combine_avg_t_us"))):
                add("dispatch", nodes * ranks_per_node, ranks_per_node, tokens, k, h, "fp8", disp * 1e-6)
                add("combine", nodes * ranks_per_node, ranks_per_node, tokens, k, h, "bf16", comb * 1e-6)
            continue
        for op, dtype, (n, per, tokens, k, h, sec) in _dispatch_csv_rows(path, DISPATCH_COLUMNS):
            add(op, n, per, tokens, k, h, dtype, sec)
    return cols


NORMAL_DISPATCH_COLUMNS = ("op", "ranks", "ranks_per_node", "tokens", "top_k", "experts", "hidden", "dtype", "seconds")


def read_normal_dispatch_timings(paths: list[Path], ranks_per_node: int = 8, sms: int = 20) -> tuple:
    """(ops, ranks, ranks per domain, tokens, top_k, experts, token bytes, seconds) of DeepEP's normal
    kernels from CSVs, or from aiconfigurator's tables (``wideep_deepep_normal_perf``: the rows run
    on ``sms`` SMs, seconds = transmit + notify; fp8 dispatch, bf16 combine; ``ranks_per_node`` GPUs
    a node, as its system file says)."""
    cols = tuple([] for _ in range(8))

    def add(op, ranks, per_node, tokens, top_k, experts, hidden, dtype, seconds):
        for column, value in zip(cols, (op, ranks, min(per_node, ranks), tokens, top_k, experts,
                                        copy_bytes(hidden, dtype), seconds)):
            column.append(value)

    for path in paths:
        if _is_parquet(path):
            names = ("node_num", "hidden_size", "num_token", "num_topk", "num_experts")
            t = _parquet(path, names + tuple(f"{op}_{c}" for op in ("dispatch", "combine")
                                             for c in ("sms", "transmit_us", "notify_us")),
                         "wideep_deepep_normal_perf")
            kept = 0
            for i, (nodes, h, tokens, k, e) in enumerate(zip(*(t[c] for c in names))):
                for op, dtype in (("dispatch", "fp8"), ("combine", "bf16")):
                    if t[f"{op}_sms"][i] == sms:
                        add(op, nodes * ranks_per_node, ranks_per_node, tokens, k, e, h, dtype,
                            (t[f"{op}_transmit_us"][i] + t[f"{op}_notify_us"][i]) * 1e-6)
                        kept += 1
            if not kept:
                measured = ", ".join(str(x) for x in sorted(set(t["dispatch_sms"])))
                raise SpecError(f"{path}: no rows on {sms} SMs (exchange-sms); it measured {measured}")
            continue
        for op, dtype, (n, per, tokens, k, e, h, sec) in _dispatch_csv_rows(path, NORMAL_DISPATCH_COLUMNS):
            add(op, n, per, tokens, k, e, h, dtype, sec)
    return cols


def _is_parquet(path: Path) -> bool:
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    return path.suffix.lower() == ".parquet"


def _dispatch_csv_rows(path: Path, columns: tuple):
    """(op, dtype, numbers) of each row of a dispatch CSV: the numbers of its other columns in
    order, ``seconds`` last."""
    numeric = tuple(c for c in columns if c not in ("op", "dtype", "seconds")) + ("seconds",)
    for line, row in _csv_rows(path, columns):
        numbers = _numbers(row, numeric, path, line)
        op, dtype = str(row["op"]).strip().lower(), str(row["dtype"]).strip().lower()
        if dtype not in DTYPE_BYTES:
            raise SpecError(f"{path}:{line}: dtype needs one of {', '.join(sorted(DTYPE_BYTES))}")
        yield op, dtype, numbers


def _csv_rows(path: Path, needed: tuple):
    """(line number, row dict) of a CSV with a header holding ``needed``; ``#`` lines are comments."""
    from perfmodel.hardware_db.files import read_text

    lines = [line for line in read_text(path, MAX_TABLE_BYTES, "timing table").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    try:
        header = reader.fieldnames
    except csv.Error as exc:
        raise SpecError(f"{path}: malformed CSV ({exc})") from None
    if header is None or not set(needed) <= {f.strip() for f in header}:
        raise SpecError(f"{path}: needs a header with the columns {', '.join(needed)}")

    def rows():
        try:
            for line, row in enumerate(reader, start=2):
                yield line, {str(k).strip(): v for k, v in row.items()}
        except csv.Error as exc:
            raise SpecError(f"{path}: malformed CSV ({exc})") from None

    return rows()


def _numbers(row: dict, columns: tuple[str, ...], path: Path, line: int) -> tuple[float, ...]:
    """The row's numbers in ``columns``, each finite and inside its column's plausible range."""
    out = []
    for column in columns:
        lo, hi = RANGES[column]
        text = row.get(column)
        try:
            value = float(str(text).strip())
        except (ValueError, OverflowError):
            raise SpecError(f"{path}:{line}: '{column}' needs a number, has {str(text)[:20]!r}") from None
        if not lo <= value <= hi:
            raise SpecError(f"{path}:{line}: '{column}' needs {lo:g} to {hi:g}, has {value:g}")
        out.append(value)
    return tuple(out)


def _check_columns(path: Path, table: dict) -> None:
    """Every numeric column of an aiconfigurator table inside its plausible range (ranges as in RANGES)."""
    import numpy as np

    for column, (lo, hi) in PARQUET_RANGES.items():
        if column in table:
            values = np.asarray(table[column], dtype=float)
            bad = ~((values >= lo) & (values <= hi))
            if bad.any():
                raise SpecError(f"{path}: '{column}' needs {lo:g} to {hi:g}, has {values[bad][0]:g} "
                                f"(row {int(np.argmax(bad)) + 1})")


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
    _check_columns(path, table)
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


DISPATCH_TABLES = {"low-latency": "wideep_deepep_ll_perf.parquet", "normal": "wideep_deepep_normal_perf.parquet"}


def aiconfigurator_dispatch_tables(device: str, kernels: str = "low-latency") -> tuple[list[Path], int, float, float,
                                                                                      str]:
    """Every DeepEP table of ``kernels`` (low-latency or normal) aiconfigurator-core ships for
    ``device`` (its SGLang versions measured different node counts), the GPUs per node and the
    per-direction intra- and inter-node bandwidths (bytes/s) its system file gives for the
    machines measured, and their provenance."""
    from perfmodel.hardware_db.files import read_yaml

    name = DISPATCH_TABLES[kernels]
    newest, provenance = aiconfigurator_table(device, "comm/sglang", name)
    root = newest.parents[1]
    tables = sorted(root.glob(f"*/{name}"))
    system = root.parents[3] / f"{AICONFIGURATOR_DEVICES[device]}.yaml"
    try:
        node = read_yaml(system)["node"]
        facts = int(node["num_gpus_per_node"]), float(node["intra_node_bw"]), float(node["inter_node_bw"])
    except (SpecError, KeyError, TypeError, ValueError):
        raise SpecError(f"{system}: no node facts (num_gpus_per_node, intra_node_bw, inter_node_bw)") from None
    where = ", ".join(str(t.relative_to(root.parents[2])) for t in tables)
    return tables, *facts, f"{provenance.split(', ', 1)[0]}, {where} (node facts from {system.name})"


def aiconfigurator_weight_only_table(device: str) -> tuple[Path, str] | None:
    """The newest GEMM table aiconfigurator-core ships for ``device`` with weight-only rows
    (int8_wo / int4_wo; TensorRT-LLM's first, then any framework's), or None."""
    newest, provenance = aiconfigurator_table(device, "gemm/trtllm", "gemm_perf.parquet")
    root = newest.parents[2]
    for framework in ("trtllm", *sorted(p.name for p in root.iterdir() if p.name != "trtllm")):
        for path in sorted(root.glob(f"{framework}/*/gemm_perf.parquet"), reverse=True,
                           key=lambda p: [int(x) if x.isdigit() else x for x in p.parent.name.replace("-", ".").split(".")]):
            dtypes = set(_parquet(path, ("gemm_dtype",), "gemm_perf")["gemm_dtype"])
            if dtypes & {"int8_wo", "int4_wo"}:
                return path, f"{provenance.split(', ', 1)[0]}, {path.relative_to(root.parents[1])}"
    return None


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
