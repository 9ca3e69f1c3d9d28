"""Time of one GEMM kernel from its shape: tiles, waves, a fixed launch cost and a roofline.

A GEMM of M x K by K x N runs as output tiles of tm x tn spread over the device's streaming
multiprocessors (SMs, CUs); the last wave of tiles runs partly empty (wave quantization), a
dimension that is not a multiple of the tile wastes the rest of it (tile quantization), and small
tiles reload their operands more often per FLOP (NVIDIA, "Matrix Multiplication Background User's
Guide", Deep Learning Performance documentation, sections "Tile quantization" and "Wave
quantization"). The library picks the fastest tile of a fixed set, and splits K (at most
``MAX_SPLIT_K`` ways) when too few tiles fill the SMs, as cuBLAS's split-K kernels do. Time:

    launch + (compute^p + memory^p)^(1/p) + cast

    compute = waves x units x tm x tn x 2 K / split / (peak x compute_fraction x tile_efficiency)
    tile_efficiency = 1 / (1 + tile_overhead x (1/tm + 1/tn))     (operand bytes per FLOP of a tile)
    memory  = (M K in_bytes + K N weight_bytes + M N out_bytes) / (bandwidth x memory_fraction)
    cast    = M K x 3 bytes / (bandwidth x memory_fraction) when the plan quantizes its activations
              to 8 bits in a kernel of its own (read bf16, write fp8)

A grouped GEMM (``groups`` experts' GEMMs in one kernel, the routed experts of an MoE layer) adds
``group_launch_s`` per group; its own fit (``perfmodel calibrate moe``, on measured MoE layers)
sets ``cast`` to a fitted number of such passes over the inputs: the permute, quantize and
activation kernels around the grouped GEMMs that the layer's vector operators leave out.

p (``sharpness``) blends the two roofline terms (p -> infinity is Williams et al. 2009's max).
The parameters are fitted per device and precision on measured GEMM timings by ``perfmodel
calibrate gemm``; a device without measurements runs the plain roofline (no launch, no tiles,
p = infinity) at its datasheet-derived fractions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# Output tile shapes (rows x columns) of Ampere/Hopper CUTLASS and cuBLAS GEMM kernels.
TILES = ((128, 256), (256, 128), (128, 128), (64, 256), (64, 128), (128, 64), (64, 64), (128, 32), (64, 32))
# Split-K limits, structural choices scored on the H100 GEMM tables' held-out half: at most 4
# ways fit better than 8 or 16 (bf16 9.7% against 9.9% and 10.0%); no split leaves fewer than
# 256 K elements (two 128-deep main-loop stages).
MAX_SPLIT_K = 4
SPLIT_K_DEPTH = 256
_TILE_ROWS = np.array([tm for tm, _ in TILES], dtype=float)
_TILE_COLS = np.array([tn for _, tn in TILES], dtype=float)
# GemmKernel fields a GEMM's time reads that may hold one value per plan (plans of several
# precisions in one call).
PER_PLAN_FIELDS = ("peak", "bandwidth", "compute_fraction", "memory_fraction", "launch_s", "sharpness",
                   "tile_overhead", "cast", "group_launch_s")


@dataclass(frozen=True)
class GemmKernel:
    """Fitted (or datasheet) GEMM parameters of one device at one precision; fields may be arrays
    (one value per plan) so that plans of different precisions evaluate in one call.

    ``units`` 0 turns tile and wave quantization off (a device whose SM count is not in the fit).
    """

    peak: object                    # dense peak, FLOP/s
    bandwidth: object               # HBM peak, bytes/s
    compute_fraction: object        # of the peak, for full tiles in full waves
    memory_fraction: object         # of the HBM peak
    launch_s: object = 0.0          # fixed cost per kernel, s
    sharpness: object = np.inf      # p of the blended roofline
    tile_overhead: object = 0.0     # tile_efficiency's constant (elements)
    units: int = 0                  # SMs / CUs; 0: no tile or wave quantization
    cast: object = 0.0              # 1: an activation-quantization kernel precedes the GEMM
    cast_launch_s: object = 0.0     # the part of launch_s that is the quantization kernels' own
    group_launch_s: object = 0.0    # fixed cost per group of a grouped GEMM (an expert's setup), s
    source: str = "datasheet"       # "fitted", "datasheet" (peak x the device's measured fraction) or "default"

    def fused(self) -> "GemmKernel":
        """The kernel with its activation quantization fused into the preceding kernel, as serving
        engines run W8A8 with static scales (the norm or activation writes fp8): no cast kernels."""
        return replace(self, launch_s=self.launch_s - self.cast * self.cast_launch_s, cast=0.0)

    def time(self, m, n, k, in_bytes=2.0, weight_bytes=2.0, out_bytes=2.0, groups=1.0):
        """Seconds of ``groups`` independent M x K x N GEMMs launched as one (grouped) kernel.

        Rows ``m`` may be fractional (an average over experts); a group with no rows still reads
        nothing and costs nothing but the launch. Evaluated once per distinct row of the shapes and
        the kernel's per-plan fields (a search's plans share a few dozen shapes per GEMM).
        """
        per_plan = [f for f in PER_PLAN_FIELDS if np.ndim(getattr(self, f))]

        def rows(m, n, k, x, w, y, g, *values):
            kernel = replace(self, **dict(zip(per_plan, values))) if per_plan else self
            return kernel._time(m, n, k, x, w, y, g)

        return on_distinct(rows, m, n, k, in_bytes, weight_bytes, out_bytes, groups,
                            *(getattr(self, f) for f in per_plan))

    def times(self, shapes: list[tuple]) -> list:
        """``time`` of each of several GEMMs over the same plans, (m, n, k, in_bytes, weight_bytes,
        out_bytes, groups) tuples, in one evaluation: the plans are grouped once by every shape's
        values together, and each shape is timed on one plan per group (the same value per row as
        one ``time`` call each)."""
        per_plan = [f for f in PER_PLAN_FIELDS if np.ndim(getattr(self, f))]
        values = [getattr(self, f) for f in per_plan]
        arguments = [x for s in shapes for x in s] + values
        shape = np.broadcast_shapes(*(np.shape(x) for x in arguments))
        if len(shape) != 1 or len(shapes) < 2:
            return [self.time(*s) for s in shapes]
        # Few plans, or a grouping that failed its check: every plan is its own group.
        first, inverse = distinct_rows(*arguments) or (np.arange(shape[0]), np.arange(shape[0]))
        pick = lambda x: np.broadcast_to(x, inverse.shape)[first] if np.ndim(x) else x  # noqa: E731
        columns = [np.empty((len(shapes), len(first))) for _ in range(7)]
        for j, s in enumerate(shapes):
            for column, x in zip(columns, s):
                column[j] = pick(x)
        columns = [c.ravel() for c in columns]
        kernel = replace(self, **{f: np.tile(pick(v), len(shapes)) for f, v in zip(per_plan, values)})
        timed = np.broadcast_to(kernel._time(*columns), (len(shapes) * len(first),))
        return [part[inverse] for part in np.split(timed, len(shapes))]

    def _time(self, m, n, k, in_bytes, weight_bytes, out_bytes, groups):
        m, n, k, g = (np.asarray(x, dtype=float) for x in (m, n, k, groups))
        compute = self._compute(m, n, k, g)
        memory = g * (m * k * in_bytes + k * n * weight_bytes + m * n * out_bytes) \
            / (self.bandwidth * self.memory_fraction)
        p = np.asarray(self.sharpness, dtype=float)
        # Blended roofline; p = inf is the max. Scaled by the larger term so that powers stay finite.
        big = np.maximum(np.maximum(compute, memory), 1e-30)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            blended = np.where(np.isinf(p), big, big * ((compute / big) ** p + (memory / big) ** p) ** (1.0 / p))
        cast = self.cast * g * m * k * 3.0 / (self.bandwidth * self.memory_fraction)
        return self.launch_s + blended + cast + self.group_launch_s * g

    def _compute(self, m, n, k, g):
        rate = self.peak * self.compute_fraction
        if not self.units:
            return 2.0 * g * m * n * k / rate
        return self._tiled_flops(m, n, k, g, self.tile_overhead) / rate

    def _tiled_flops(self, m, n, k, g, tile_overhead):
        """FLOPs the fastest tile executes, waste and small-tile overhead included (every tile of
        TILES at once, on a last axis)."""
        units = float(self.units)
        tm, tn = _TILE_ROWS, _TILE_COLS
        rows = np.ceil(np.maximum(m, 1e-9))[..., None]      # a partly filled row still occupies its tile
        n, k, g = (np.asarray(x, dtype=float)[..., None] for x in (n, k, g))
        tiles = g * np.ceil(rows / tm) * np.ceil(n / tn)
        depth = np.minimum(np.maximum(np.floor(k / SPLIT_K_DEPTH), 1.0), MAX_SPLIT_K)
        split = np.minimum(np.maximum(np.floor(units / tiles), 1.0), depth)
        waves = np.ceil(tiles * split / units)
        efficiency = 1.0 / (1.0 + np.asarray(tile_overhead, dtype=float)[..., None] * (1.0 / tm + 1.0 / tn))
        best = (waves * units * tm * tn * 2.0 * k / split / efficiency).min(axis=-1)
        # Rows below one (an expert that is sometimes hit) cost that share of one row's tile.
        return best * np.where(m < 1.0, np.maximum(m, 0.0), 1.0)


# Query rows of one FlashAttention prefill tile (Dao 2023, FlashAttention-2, Sec. 3.2: one thread
# block per 128-row block of queries of one head), and the keys a decode kernel's block reads before
# the KV is split over more blocks (TensorRT-LLM multi-block mode; FlashDecoding, Dao et al. 2023).
ATTENTION_QUERY_TILE = 128
DECODE_SPLIT_TOKENS = 1024
# MLA decode kernels run a sequence's query heads over its one latent KV head in row blocks
# (FlashMLA, deepseek-ai/FlashMLA: h_q / h_k x s_q query rows per KV head, in tiles of 64): fewer
# heads per rank still cost a block. aiconfigurator's measured SGLang MLA modules (H100 fa3, B200
# trtllm_mla, DeepSeek-V3) take about the same time per cached token from 8 to 128 heads per
# rank, so the block perfmodel uses is 128 rows; fitted with 64, 128 heads ran 20-40% slow.
MLA_QUERY_BLOCK = 128


@dataclass(frozen=True)
class AttentionKernel:
    """Time of the attention core (QK^T, softmax, PV) as FlashAttention-style kernels run it.

    Prefill: query tiles of ``ATTENTION_QUERY_TILE`` rows per head spread over the SMs in waves;

        launch + ((flops / (peak x compute_fraction x wave_efficiency) + waves x tile_s)^p
                  + (bytes / (bandwidth x memory_fraction))^p)^(1/p)

    Decode: one block per sequence and KV head, split further for contexts beyond
    ``DECODE_SPLIT_TOKENS``; memory bound; few blocks cannot draw the full bandwidth (utilization
    1 - exp(-blocks x max(context / DECODE_SPLIT_TOKENS, 1) / (units x saturation))):

        launch + max(flops / (peak x compute_fraction) + waves x tile_s,
                     bytes / (bandwidth x memory_fraction x utilization))

    Fitted per device on measured attention kernels by ``perfmodel calibrate attention``; without a
    fit the attention core is the plain roofline of perfmodel.roofline. MLA's core (absorbed in
    decode) has its own fit, on measured MLA modules, marked ``latent``.
    """

    peak: float                     # dense peak at the attention precision, FLOP/s
    bandwidth: float                # HBM peak, bytes/s
    compute_fraction: float
    memory_fraction: float
    launch_s: float = 0.0
    tile_s: float = 0.0             # fixed cost of one wave of tiles (blocks), s
    sharpness: float = 1.0          # p of the prefill blend
    saturation: float = 0.0         # decode: blocks per SM at which bandwidth is 63% drawn; 0: always full
    units: int = 0
    source: str = "fitted"
    latent: bool = False            # fitted on MLA modules (perfmodel.calibrate.fit_mla), for MLA's core only

    def prefill(self, flops, bytes_moved, tiles):
        """Seconds of a prefill attention kernel of ``tiles`` query tiles (sequences x heads x
        ceil(queries / ATTENTION_QUERY_TILE))."""
        flops, bytes_moved, tiles = (np.asarray(x, dtype=float) for x in (flops, bytes_moved, tiles))
        waves = np.ceil(np.maximum(tiles, 1.0) / self.units)
        efficiency = np.maximum(tiles, 1e-9) / (waves * self.units)
        compute = flops / (self.peak * self.compute_fraction * np.minimum(efficiency, 1.0)) + waves * self.tile_s
        memory = bytes_moved / (self.bandwidth * self.memory_fraction)
        big = np.maximum(np.maximum(compute, memory), 1e-30)
        p = self.sharpness
        return self.launch_s + big * ((compute / big) ** p + (memory / big) ** p) ** (1.0 / p)

    def decode(self, flops, bytes_moved, blocks, context, io_bytes=0.0):
        """Seconds of a decode attention kernel over ``blocks`` (sequences x KV heads) each
        reading ``context`` cached tokens. Splitting a long context over more blocks draws more
        bandwidth for the KV it reads; the ``io_bytes`` of ``bytes_moved`` (Q read, O written)
        stay with the unsplit blocks, so a longer context is never faster."""
        flops, bytes_moved, blocks, context, io_bytes = (np.asarray(x, dtype=float)
                                                         for x in (flops, bytes_moved, blocks, context, io_bytes))
        waves = np.ceil(np.maximum(blocks, 1.0) / self.units)
        split = blocks * np.maximum(context / DECODE_SPLIT_TOKENS, 1.0)

        def utilization(active):
            return 1.0 - np.exp(-active / (self.units * self.saturation)) if self.saturation else 1.0
        compute = flops / (self.peak * self.compute_fraction) + waves * self.tile_s
        memory = (io_bytes / utilization(blocks) + (bytes_moved - io_bytes) / utilization(split)) / (
            self.bandwidth * self.memory_fraction)
        return self.launch_s + np.maximum(compute, memory)


def distinct_rows(*args, least: int = 1024):
    """(first, inverse) such that row i of the broadcast 1-D arguments equals row first[inverse[i]],
    or None when there are fewer than ``least`` rows or the grouping fails its check. A search's
    million plans share a few dozen shapes: evaluating those once is exact and much faster.

    Arguments that come in long runs of one value (a lattice's outer loops: its layouts) are
    grouped by their runs, exactly; the rows are then grouped by a hash of that group and of the
    other arguments that vary (a scalar is the same on every row), and every row is checked equal
    to its representative."""
    arrays = [_comparable(a) for a in args]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if len(shape) != 1 or shape[0] < least:
        return None
    varying = [np.broadcast_to(a, shape) for a in arrays if a.ndim]
    changed = [b[1:] != b[:-1] for b in map(_bits, varying)]   # bit patterns: 0.0 and -0.0 differ
    slow = [i for i, ch in enumerate(changed) if (np.count_nonzero(ch) + 1) * RUN_ROWS <= shape[0]]
    fast = [varying[i] for i in range(len(varying)) if i not in slow]
    if slow:
        runs = _run_groups([varying[i] for i in slow], np.logical_or.reduce([changed[i] for i in slow]))
        if runs is None:
            return None
        if not fast:
            return runs
        fast.append(runs[1])                 # each row's group of the slow arguments
    # np.unique's stable merge sort is 3x slower: any representative of a group will do.
    first, inverse = _group(_row_hash(fast))
    if not all(np.array_equal(c[first].take(inverse), c) for c in fast):
        return None
    return first, inverse


# Rows per run of one value above which an argument is grouped by its runs rather than sorted.
RUN_ROWS = 8
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def _comparable(a) -> np.ndarray:
    """An argument of distinct_rows as an array whose equal values have equal bit patterns: 64-bit
    integers and floats and booleans as they are (integers and booleans compare exactly, as
    plan columns hold them, without a conversion per row), anything else as floats."""
    a = np.asarray(a)
    return a if a.dtype in _EXACT else np.asarray(a, dtype=float)


_EXACT = (np.dtype(bool), np.dtype(np.int64), np.dtype(np.float64))


def _bits(column: np.ndarray) -> np.ndarray:
    """The values' bit patterns as 64-bit integers (equal patterns: identical values)."""
    column = np.ascontiguousarray(column)
    return column.view(np.uint64) if column.dtype.itemsize == 8 else column.astype(np.uint64)


def _row_hash(columns: list) -> np.ndarray:
    """A 64-bit hash of each row's bit patterns (multiply and xor-shift, as splitmix64 mixes)."""
    key = np.zeros(np.shape(columns[0]), dtype=np.uint64)
    for c in columns:
        key = (key ^ _bits(c)) * _HASH_MULTIPLIER
        key ^= key >> np.uint64(29)
    return key


def _group(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse) of equal values of ``key``: groups in ascending order of their key."""
    order = np.argsort(key)
    ordered = key[order]
    starts = np.empty(len(key), dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    inverse = np.empty(len(key), dtype=np.intp)
    inverse[order] = np.cumsum(starts) - 1
    return order[starts], inverse


def _run_groups(columns: list, changed: np.ndarray):
    """distinct_rows' (first, inverse) of ``columns``, whose rows change only where ``changed``
    (row i + 1 differs from row i): each run is one value, so only the runs' first rows are
    grouped (by hash, then checked), or None when the check fails."""
    starts = np.concatenate(([0], np.flatnonzero(changed) + 1))
    heads = [c[starts] for c in columns]
    run_first, run_inverse = _group(_row_hash(heads))
    if not all(np.array_equal(h[run_first][run_inverse], h) for h in heads):
        return None
    return starts[run_first], np.repeat(run_inverse, np.diff(np.append(starts, len(changed) + 1)))


def sorted_distinct(values) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values in ascending order, each value's index among them): ``np.unique`` with
    ``return_inverse``, without the numpy.ma import np.unique brings in (about 10 ms a process)."""
    values = np.asarray(values).ravel()
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.ones(len(ordered), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    inverse = np.empty(len(values), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def on_distinct(fn, *args):
    """``fn(*args)`` evaluated once per distinct row of the broadcast arguments (``fn`` returns an
    array, or a list of arrays)."""
    rows = distinct_rows(*args)
    if rows is None:
        return fn(*args)
    first, inverse = rows
    picked = [np.broadcast_to(a, inverse.shape)[first] if np.ndim(a) else a for a in args]
    out = fn(*picked)
    if isinstance(out, list):   # take: the same rows as indexing with inverse, faster
        return [np.broadcast_to(o, first.shape).take(inverse) for o in out]
    return np.broadcast_to(out, first.shape).take(inverse)
