"""Fit kernel and collective costs to measured timings: the models ``kernels.GemmKernel`` and
``collectives.FittedCollectives`` evaluate.

Attention: prefill per precision and decode, the fractions, launch and per-wave costs (and, in
decode, the bandwidth saturation) of ``AttentionKernel``, fitted the same way on the FLOPs and
bytes ``roofline.attention_core`` counts for each measured shape.

GEMMs: per precision, the compute and memory fractions, the launch time, the roofline blend and
the tile overhead of ``GemmKernel``, fitted by robust least squares (soft-L1 on the relative
error) on a seeded share of the rows; the rest are held out and scored.

Per collective op, two protocols (NCCL's low-latency and bandwidth protocols), each a launch time
and a fraction of the link's bandwidth, and one hop latency shared by the ops; the cost is the
faster protocol's launch + steps x hop + bytes x volume / (link x fraction). Fitted by least
squares on the log of predicted over measured time (relative errors weigh every message size
alike) on a seeded share of the rows; the rest are held out and their mean absolute percentage
error is reported per op.

MoE grouped GEMMs (the routed experts' two GEMMs, ``roofline.routed_expert_gemms``): per precision
and scaling recipe, the GEMM kernel's terms at the device's full-tile rate, a fixed cost per expert
group and the passes over the GEMMs' inputs of the kernels around them, fitted on measured MoE
layers less the vector work ``layer_ops`` charges beside them; held out by MoE shape.

MoE expert exchanges (DeepEP's low-latency kernels of decode, ``collectives.expert_exchange_time``,
and its normal kernels of prefill, ``collectives.normal_exchange_time``): per op a launch and the
shares of the scale-up and scale-out links, and one latency of leaving the domain, fitted by the
GEMMs' robust least squares on a seeded share; held-out error per op and by the number of scale-up
domains the group spans. Pure functions of arrays: the tables are read by hardware_db.timings, and
perfmodel.calibration_workflow picks their rows and runs these fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.hardware_db.errors import SpecError

from .collectives import (COLLECTIVES, EXCHANGES, FittedCollectives, FittedDispatch, expert_exchange_time,
                          normal_exchange_time)
from .kernels import AttentionKernel, GemmKernel
from .layout import Layout
from .roofline import attention_core, layer_ops

ALIASES = {"alltoall": "all_to_all", "all2all": "all_to_all", "allreduce": "all_reduce",
           "allgather": "all_gather", "reducescatter": "reduce_scatter"}


@dataclass(frozen=True)
class CollectiveCalibration:
    """The fit (SI units), its held-out error per op, and how many rows went each way."""

    fitted: FittedCollectives
    held_out_mape: dict[str, float]
    held_out_max: dict[str, float]
    train_rows: int
    test_rows: int

    def as_yaml(self) -> dict:
        """The ``collectives`` block of a calibration entry, in the database's units (us, GB/s)."""
        f = self.fitted
        return {
            "link_gb_per_s": round(f.link / 1e9, 6), "hop_us": round(f.hop * 1e6, 6),
            "ops": {op: {"ll_launch_us": round(f.ll_launch[op] * 1e6, 4), "ll_fraction": round(f.ll_fraction[op], 4),
                         "launch_us": round(f.launch[op] * 1e6, 4), "fraction": round(f.fraction[op], 4)}
                    for op in COLLECTIVES},
            "held_out_mape": {op: round(v, 4) for op, v in self.held_out_mape.items()},
            "samples": self.train_rows + self.test_rows,
        }


def normalize_ops(names) -> np.ndarray:
    """Op names as perfmodel spells them (``alltoall`` -> ``all_to_all``); unknown names are an error."""
    out = np.array([ALIASES.get(str(n).strip().lower(), str(n).strip().lower()) for n in names], dtype=object)
    unknown = sorted(set(out) - set(COLLECTIVES))
    if unknown:
        raise SpecError(f"unknown collective op {unknown[0]!r}; known: {', '.join(COLLECTIVES)}")
    return out


def fit_collectives(ops, ranks, size_bytes, seconds, link_bytes_per_s: float, seed: int = 0,
                    held_out: float = 0.5) -> CollectiveCalibration:
    """Fit ``FittedCollectives`` to measured rows (op, ranks, bytes, seconds) over one link.

    Every op needs rows; sizes and times must be positive and finite. ``held_out`` of the rows,
    drawn with ``seed``, are left out of the fit and scored.
    """
    from scipy.optimize import least_squares

    ops = normalize_ops(ops)
    n = np.asarray(ranks, dtype=float)
    size = np.asarray(size_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if not (len(ops) == len(n) == len(size) == len(t)) or len(t) < 4 * len(COLLECTIVES):
        raise SpecError(f"collective timings need at least {4 * len(COLLECTIVES)} rows with op, ranks, bytes "
                        f"and seconds, has {len(t)}")
    if not (np.all(np.isfinite(size)) and np.all(np.isfinite(t)) and np.all(size > 0) and np.all(t > 0)
            and np.all(n >= 2)):
        raise SpecError("collective timings need positive finite bytes and seconds and at least 2 ranks per row")
    missing = [op for op in COLLECTIVES if not np.any(ops == op)]
    if missing:
        raise SpecError(f"collective timings have no rows for {missing[0]}; every op of "
                        f"{', '.join(COLLECTIVES)} is needed")
    index = np.array([COLLECTIVES.index(o) for o in ops])
    train = np.random.default_rng(seed).random(len(t)) >= held_out
    for i, op in enumerate(COLLECTIVES):           # every op in both halves (when it has two rows)
        rows = np.flatnonzero(index == i)
        train[rows[0]] = True
        if len(rows) > 1:
            train[rows[-1]] = False
    k = len(COLLECTIVES)

    def unpack(x):
        launch = lambda v: np.exp(v)                                          # noqa: E731  seconds > 0
        share = lambda v: 1.0 / (1.0 + np.exp(-v))                            # noqa: E731  in (0, 1)
        return FittedCollectives(
            link=link_bytes_per_s, hop=float(np.exp(x[4 * k])),
            ll_launch={op: float(launch(x[i])) for i, op in enumerate(COLLECTIVES)},
            ll_fraction={op: float(share(x[k + i])) for i, op in enumerate(COLLECTIVES)},
            launch={op: float(launch(x[2 * k + i])) for i, op in enumerate(COLLECTIVES)},
            fraction={op: float(share(x[3 * k + i])) for i, op in enumerate(COLLECTIVES)})

    def predict(fitted: FittedCollectives, rows) -> np.ndarray:
        out = np.empty(int(np.count_nonzero(rows)))
        for i, op in enumerate(COLLECTIVES):
            mine = index[rows] == i
            out[mine] = fitted.time(op, size[rows][mine], n[rows][mine])
        return out

    def residuals(x):
        return np.log(predict(unpack(x), train) / t[train])

    # Start: 5 us / 25% of the link (low latency), 20 us / 80% (bandwidth), 0.5 us a hop.
    x0 = np.r_[np.log(np.full(k, 5e-6)), np.full(k, np.log(0.25 / 0.75)), np.log(np.full(k, 20e-6)),
               np.full(k, np.log(0.8 / 0.2)), np.log(0.5e-6)]
    fitted = unpack(least_squares(residuals, x0).x)
    test = ~train
    error = np.abs(predict(fitted, test) / t[test] - 1.0)
    ops_test = index[test]
    mape = {op: float(error[ops_test == i].mean()) for i, op in enumerate(COLLECTIVES) if np.any(ops_test == i)}
    worst = {op: float(error[ops_test == i].max()) for i, op in enumerate(COLLECTIVES) if np.any(ops_test == i)}
    return CollectiveCalibration(fitted, mape, worst, int(train.sum()), int(test.sum()))


@dataclass(frozen=True)
class KernelCalibration:
    """A fitted kernel, its held-out error, and the rows each way."""

    kernel: object
    held_out_mape: float
    held_out_p90: float
    train_rows: int
    test_rows: int


@dataclass(frozen=True)
class FamilyFit:
    """One kernel family fitted for a calibration entry: its fits (by precision, by (phase,
    precision), by phase, or one calibration of all ops), the measurements' provenance and the
    entry's source line for them."""

    fits: object
    provenance: str
    note: str


def _fit_held_out(unpack, predict, seconds, x0, seed: int, held_out: float) -> tuple:
    """Robust least squares (soft-L1 on the relative error) on a seeded share of the rows; the
    fitted kernel scored on the rest: (kernel, MAPE, p90, rows fitted, rows held out)."""
    from scipy.optimize import least_squares

    train = split_rows(len(seconds), seed, held_out)
    x = least_squares(lambda v: predict(unpack(v), train) / seconds[train] - 1.0, x0, loss="soft_l1", f_scale=0.1).x
    fitted = unpack(x)
    error = np.abs(predict(fitted, ~train) / seconds[~train] - 1.0)
    return fitted, float(error.mean()), float(np.quantile(error, 0.9)), int(train.sum()), int((~train).sum())


class GemmCalibration(KernelCalibration):
    """The fitted GEMM kernel at one precision."""

    def as_yaml(self) -> dict:
        """One precision of a calibration entry's ``gemm`` block, in the database's units."""
        k = self.kernel
        return {"units": int(k.units), "compute_fraction": round(float(k.compute_fraction), 4),
                "memory_fraction": round(float(k.memory_fraction), 4), "launch_us": round(float(k.launch_s) * 1e6, 3),
                "sharpness": round(float(k.sharpness), 3), "tile_overhead": round(float(k.tile_overhead), 4),
                "cast": bool(k.cast), "cast_launch_us": round(float(k.cast_launch_s) * 1e6, 3),
                "held_out_mape": round(self.held_out_mape, 4),
                "samples": self.train_rows + self.test_rows}


def split_rows(count: int, seed: int, held_out: float) -> np.ndarray:
    """True for the rows to fit on; ``held_out`` of them, drawn with ``seed``, are left out."""
    return np.random.default_rng(seed).random(count) >= held_out


def fit_gemm(m, n, k, seconds, peak: float, bandwidth: float, units: int, element_bytes: float,
             cast: bool = False, cast_launch_s: float = 0.0, seed: int = 0, held_out: float = 0.5,
             weight_bytes: float | None = None) -> GemmCalibration:
    """Fit ``GemmKernel`` to measured GEMMs (M, N, K, seconds) at one precision.

    ``element_bytes`` is the size of an input and weight element (2 for bf16, 1 for fp8), outputs
    are bf16; ``cast`` says the timings include kernels that quantize the activations, whose own
    fixed cost (measured apart) is ``cast_launch_s``. A weight-only format gives its own
    ``weight_bytes`` (1 for int8, 0.5 for int4) over bf16 math: the fitted fractions then carry
    the in-kernel dequantization's cost.
    """
    m, n, k, t = (np.asarray(x, dtype=float) for x in (m, n, k, seconds))
    if not (len(m) == len(n) == len(k) == len(t)) or len(t) < 20:
        raise SpecError(f"GEMM timings need at least 20 rows with m, n, k and seconds, has {len(t)}")
    if not all(np.all(np.isfinite(x)) and np.all(x > 0) for x in (m, n, k, t)):
        raise SpecError("GEMM timings need positive finite m, n, k and seconds")
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))                                  # noqa: E731

    def unpack(x) -> GemmKernel:
        return GemmKernel(peak=peak, bandwidth=bandwidth, compute_fraction=float(sigmoid(x[0])),
                          memory_fraction=float(sigmoid(x[1])), launch_s=float(np.exp(x[2])),
                          sharpness=float(1.0 + np.exp(x[3])), tile_overhead=float(np.exp(x[4])),
                          units=int(units), cast=float(cast), cast_launch_s=float(cast_launch_s) if cast else 0.0,
                          source="fitted")

    def predict(kernel, rows):
        return kernel.time(m[rows], n[rows], k[rows], element_bytes,
                           element_bytes if weight_bytes is None else weight_bytes, 2.0)

    # Start: 80% of the peak and of HBM, 5 us launch, p = 3, tile overhead 8 elements.
    x0 = np.array([np.log(4.0), np.log(4.0), np.log(5e-6), np.log(2.0), np.log(8.0)])
    return GemmCalibration(*_fit_held_out(unpack, predict, t, x0, seed, held_out))


class AttentionCalibration(KernelCalibration):
    """The fitted attention kernel (prefill at one precision, or decode)."""

    def as_yaml(self) -> dict:
        """One kernel of a calibration entry's ``attention`` block, in the database's units."""
        k = self.kernel
        return {"units": int(k.units), "compute_fraction": round(float(k.compute_fraction), 4),
                "memory_fraction": round(float(k.memory_fraction), 4), "launch_us": round(k.launch_s * 1e6, 3),
                "tile_us": round(k.tile_s * 1e6, 4), "sharpness": round(float(k.sharpness), 3),
                "saturation": round(float(k.saturation), 4), "held_out_mape": round(self.held_out_mape, 4),
                "samples": self.train_rows + self.test_rows}


def fit_attention(batch, queries, context, heads, kv_heads, head_dim, act_bytes, kv_bytes, seconds, peak: float,
                  bandwidth: float, units: int, decode: bool, seed: int = 0, held_out: float = 0.5) -> AttentionCalibration:
    """Fit ``AttentionKernel`` to measured attention kernels, one row per call: ``batch``
    sequences of ``queries`` new tokens (1 in decode) attending to ``context`` keys (in prefill,
    the causal mean, queries / 2), with ``heads`` query and ``kv_heads`` KV heads of ``head_dim``."""
    cols = [np.asarray(x, dtype=float) for x in (batch, queries, context, heads, kv_heads, head_dim, act_bytes,
                                                  kv_bytes, seconds)]
    b, q, ctx, h, kv, d, act, kvb, t = np.broadcast_arrays(*cols)
    if t.ndim != 1 or len(t) < 20:
        raise SpecError(f"attention timings need at least 20 rows, has {t.size}")
    if not all(np.all(np.isfinite(x)) and np.all(x > 0) for x in (b, q, ctx, h, kv, d, t)):
        raise SpecError("attention timings need positive finite shapes and seconds")
    op = attention_core(b * q, ctx, h * d, h * d, h * d, 2.0 * kv * d, h, kv, act, kvb, decode, True)
    return _fit_core(op, 0.0, t, peak, bandwidth, units, decode, seed, held_out)


def fit_attention_groups(acc, timings: dict, seed: int = 0) -> dict:
    """``fit_attention`` of each (phase, precision) group of measured attention timings on the
    accelerator ``acc`` (schema entry): decode at its 16-bit peak (the cache's format is read, the
    math stays 16 bits), prefill at the group's precision; a precision the device has no peak for
    is a one-line error."""
    from perfmodel.hardware_db.errors import SpecError

    sixteen = acc.math16
    results = {}
    for (phase, precision), cols in sorted(timings.items()):
        math = sixteen if phase == "decode" else precision
        if math not in acc.peak_flops:
            raise SpecError(f"{acc.name} has no {math} peak; the timings' {phase} {precision} rows cannot be fitted")
        results[(phase, precision)] = fit_attention(*cols, acc.peak_flops[math], acc.hbm_bytes_per_s,
                                                    acc.compute_units, phase == "decode", seed)
    return results


def _fit_core(op, fixed, seconds, peak: float, bandwidth: float, units: int, decode: bool, seed: int,
              held_out: float, memory_fraction: float | None = None, latent: bool = False) -> AttentionCalibration:
    """Fit the ``AttentionKernel`` of the attention-core ``op`` (one row per measurement) so that
    ``fixed`` seconds (other kernels measured with it) plus the core match ``seconds``; a given
    ``memory_fraction`` is kept, not fitted."""
    work = op.attention.padding * op.flops
    flops, moved, tiles, ctx, fixed = (np.broadcast_to(x, seconds.shape) for x in
                                       (work, op.bytes, op.attention.tiles, op.attention.context, fixed))
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))                                  # noqa: E731

    def unpack(x) -> AttentionKernel:
        memory = float(sigmoid(x[1])) if memory_fraction is None else float(memory_fraction)
        return AttentionKernel(peak=peak, bandwidth=bandwidth, compute_fraction=float(sigmoid(x[0])),
                               memory_fraction=memory, launch_s=float(np.exp(x[2])),
                               tile_s=float(np.exp(x[3])), sharpness=1.0 if decode else float(1.0 + np.exp(x[4])),
                               saturation=float(np.exp(x[4])) if decode else 0.0, units=int(units), latent=latent)

    def predict(kernel, rows):
        core = kernel.decode(flops[rows], moved[rows], tiles[rows], ctx[rows]) if decode \
            else kernel.prefill(flops[rows], moved[rows], tiles[rows])
        return fixed[rows] + core

    # Start: 50% of the peak, 80% of HBM, 5 us launch, 0.1 us a wave, p = 2 (prefill) or
    # saturation at one block per SM (decode).
    x0 = np.array([0.0, np.log(4.0), np.log(5e-6), np.log(1e-7), 0.0])
    return AttentionCalibration(*_fit_held_out(unpack, predict, seconds, x0, seed, held_out))


def mla_module_parts(spec, batch, isl, heads, kv_bytes, decode: bool) -> tuple:
    """(GEMMs, attention-core op) of one MLA attention module as ``layer_ops`` runs it, for
    ``batch`` sequences of ``isl`` tokens (decode: one new token over ``isl`` cached ones) with
    ``heads`` of the model's query heads on the rank (tensor parallelism 128 / heads for
    DeepSeek-V3), fp8 projections. The module is what SGLang's MLA layer runs after the fused
    q/kv down-projection: the q up-projection, the kv up-projection (absorbed in decode), the
    attention core and the output projection (aiconfigurator's wide-EP MLA tables)."""
    b, s, hd = (np.asarray(x, dtype=float) for x in (batch, isl, heads))
    tokens, context = (b, s) if decode else (b * s, s / 2.0)
    ops = {op.name: op for op in layer_ops(spec, tokens, context, Layout(tp=spec.num_heads / hd), sp=True,
                                           weight_bytes=1.0, act_bytes=1.0, decode=decode, kv_bytes=kv_bytes)}
    gemms = ops["qkv projection"].gemms[1:] + ops["output projection"].gemms      # [0]: the down-projection
    return gemms, ops["attention core"]


def fit_mla(spec, batch, isl, heads, kv_bytes, seconds, gemm: GemmKernel, peak: float, bandwidth: float,
            units: int, decode: bool, memory_fraction: float | None = None, seed: int = 0,
            held_out: float = 0.5) -> AttentionCalibration:
    """Fit the MLA attention core (``AttentionKernel`` with ``latent`` set) to measured MLA
    modules of ``spec`` (see ``mla_module_parts``): each row's time is the fitted fp8 ``gemm``
    kernel's projections plus the core, whose fractions, launch, per-wave cost and (decode)
    saturation are fitted; the held-out error is that of the whole module. A given
    ``memory_fraction`` is kept, not fitted: absorbed MLA decode over an fp8 cache does about 480
    FLOPs per byte read, compute bound at every measured shape, so the rows cannot tell its
    streaming rate, which a bf16 cache (half the intensity) would need."""
    cols = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (batch, isl, heads, kv_bytes, seconds)))
    b, s, hd, kvb, t = cols
    if spec.mla is None:
        raise SpecError(f"{spec.name} has no multi-head latent attention to fit MLA timings to")
    if t.ndim != 1 or len(t) < 20:
        raise SpecError(f"MLA timings need at least 20 rows, has {t.size}")
    if not all(np.all(np.isfinite(x)) and np.all(x > 0) for x in cols):
        raise SpecError("MLA timings need positive finite shapes and seconds")
    gemms, core = mla_module_parts(spec, b, s, hd, kvb, decode)
    return _fit_core(core, projection_seconds(gemms, gemm), t, peak, bandwidth, units, decode, seed, held_out,
                     memory_fraction, latent=True)


def projection_seconds(gemms, gemm: GemmKernel) -> np.ndarray:
    """Seconds of an MLA module's projection GEMMs (``mla_module_parts``) on the fp8 ``gemm`` kernel."""
    return sum(gemm.time(g.m, g.n, g.k, 1.0, 1.0, 2.0, g.groups) for g in gemms)


@dataclass(frozen=True)
class DispatchCalibration:
    """A fitted expert exchange (DeepEP's low-latency or normal kernels), its held-out error (all
    rows, per op, and per op by the scale-up domains the group spans) and the rows each way."""

    fitted: FittedDispatch
    held_out_mape: float
    held_out_p90: float
    op_mape: dict[str, float]
    train_rows: int
    test_rows: int
    domain_mape: dict[int, dict[str, float]] = field(default_factory=dict)

    def as_yaml(self) -> dict:
        """The ``dispatch`` block (or its ``normal`` sub-block) of a calibration entry, in the
        database's units."""
        f = self.fitted
        block = {"launch_us": {op: round(f.launch[op] * 1e6, 3) for op in EXCHANGES},
                 "remote_us": round(f.remote * 1e6, 3),
                 "scale_up_fraction": {op: round(f.up_fraction[op], 4) for op in EXCHANGES}}
        if f.out_fraction is not None:
            block["scale_out_fraction"] = {op: round(f.out_fraction[op], 4) for op in EXCHANGES}
        return block | {"held_out_mape": round(self.held_out_mape, 4), "samples": self.train_rows + self.test_rows}


def fit_dispatch(ops, ranks, ranks_per_domain, copies, copy_bytes, seconds, scale_up_bytes_per_s: float,
                 scale_out_bytes_per_s: float, seed: int = 0, held_out: float = 0.5) -> DispatchCalibration:
    """Fit the low-latency dispatch and combine (``collectives.expert_exchange_time``) to measured
    kernels: each row one op over ``ranks`` ranks, ``ranks_per_domain`` of them per scale-up
    domain, moving ``copies`` token-expert pairs of ``copy_bytes`` from each rank. The link shares
    are of the per-direction bandwidths the measurements ran on; rows that all stay in one domain
    leave the scale-out share and the remote latency out of the fit."""
    op, n, k, (c, b), t = _exchange_rows(ops, ranks, ranks_per_domain, (copies, copy_bytes), seconds)

    def time(rows, *links):
        return expert_exchange_time(c[rows], b[rows], n[rows], k[rows], *links)

    return _fit_exchange(op, n, k, t, time, scale_up_bytes_per_s, scale_out_bytes_per_s, seed, held_out)


def fit_normal_dispatch(ops, ranks, ranks_per_domain, tokens, top_k, num_experts, token_bytes, seconds,
                        scale_up_bytes_per_s: float, scale_out_bytes_per_s: float, seed: int = 0,
                        held_out: float = 0.5) -> DispatchCalibration:
    """Fit the normal-mode dispatch and combine (``collectives.normal_exchange_time``) to measured
    kernels: each row one op over ``ranks`` ranks, ``ranks_per_domain`` of them per scale-up
    domain, moving ``tokens`` tokens of ``token_bytes`` from each rank to their ``top_k`` of
    ``num_experts`` experts. Fitted like ``fit_dispatch``: per op a launch and the two link
    shares, one remote latency; rows that all stay in one domain leave the scale-out share and the
    remote latency out of the fit."""
    op, n, k, (tok, top, e, b), t = _exchange_rows(ops, ranks, ranks_per_domain,
                                                   (tokens, top_k, num_experts, token_bytes), seconds)
    if np.any(top > e):
        raise SpecError("normal dispatch timings need top_k at most the number of experts")

    def time(rows, *links):
        return normal_exchange_time(tok[rows], b[rows], top[rows], e[rows], n[rows], k[rows], *links)

    return _fit_exchange(op, n, k, t, time, scale_up_bytes_per_s, scale_out_bytes_per_s, seed, held_out)


def _exchange_rows(ops, ranks, ranks_per_domain, shape, seconds) -> tuple:
    """(ops, ranks, ranks per domain, the rows' ``shape`` columns, seconds) as arrays, checked: at
    least 20 rows, every value positive and finite, at least 2 ranks a row."""
    op = normalize_exchanges(ops)
    n, k, t = (np.asarray(x, dtype=float) for x in (ranks, ranks_per_domain, seconds))
    cols = tuple(np.asarray(x, dtype=float) for x in shape)
    if not all(len(x) == len(op) for x in (n, k, t, *cols)) or len(t) < 20:
        raise SpecError(f"dispatch timings need at least 20 rows with op, ranks, ranks per domain, tokens and "
                        f"seconds, has {len(t)}")
    if not all(np.all(np.isfinite(x)) and np.all(x > 0) for x in (n, k, t, *cols)) or np.any(n < 2):
        raise SpecError("dispatch timings need positive finite values and at least 2 ranks")
    return op, n, k, cols, t


def _fit_exchange(op, n, k, t, time, scale_up_bytes_per_s: float, scale_out_bytes_per_s: float, seed: int,
                  held_out: float) -> DispatchCalibration:
    """Fit per op a launch, the scale-up and scale-out link shares, and one remote latency of the
    exchange whose ``time(rows, inner_bw, outer_bw, launch, remote)`` predicts the rows' seconds
    ``t``; held-out error overall, per op, and per op by domains spanned (ranks / ranks per domain)."""
    remote_rows = bool(np.any(n > k))
    combine = op == "combine"
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))                                  # noqa: E731

    def unpack(x) -> FittedDispatch:
        pair = lambda a, z: {"dispatch": float(a), "combine": float(z)}         # noqa: E731
        return FittedDispatch(launch=pair(np.exp(x[0]), np.exp(x[1])), remote=float(np.exp(x[2])) if remote_rows else 0.0,
                              up_fraction=pair(sigmoid(x[3]), sigmoid(x[4])),
                              out_fraction=pair(sigmoid(x[5]), sigmoid(x[6])) if remote_rows else None)

    def predict(fit, rows):
        per_op = lambda d: np.where(combine[rows], d["combine"], d["dispatch"])   # noqa: E731
        out = per_op(fit.out_fraction) if fit.out_fraction else 1.0
        return time(rows, scale_up_bytes_per_s * per_op(fit.up_fraction), scale_out_bytes_per_s * out,
                    per_op(fit.launch), fit.remote)

    # Start: 10 us launches and remote latency, half of each link.
    x0 = np.array([np.log(1e-5), np.log(1e-5), np.log(1e-5), 0.0, 0.0, 0.0, 0.0])
    fitted, mape, p90, fitted_rows, test_rows = _fit_held_out(unpack, predict, t, x0, seed, held_out)
    test = ~split_rows(len(t), seed, held_out)
    error = np.abs(predict(fitted, test) / t[test] - 1.0)
    ops_test, domains = op[test], np.round(n / np.minimum(k, n))[test]
    op_mape = {name: float(error[ops_test == name].mean()) for name in EXCHANGES if np.any(ops_test == name)}
    domain_mape = {int(d): {name: float(error[(ops_test == name) & (domains == d)].mean()) for name in EXCHANGES
                            if np.any((ops_test == name) & (domains == d))} for d in sorted(set(domains))}
    return DispatchCalibration(fitted, mape, p90, op_mape, fitted_rows, test_rows, domain_mape)


def normalize_exchanges(names) -> np.ndarray:
    """Dispatch / combine op names; anything else is an error."""
    ops = np.array([str(x).strip().lower() for x in names], dtype=object)
    bad = sorted(set(ops) - set(EXCHANGES))
    if bad:
        raise SpecError(f"dispatch timings: unknown op {bad[0]!r}; use dispatch or combine")
    return ops


def score_moe(kernel: GemmKernel, tokens, ep, num_experts, top_k, hidden, expert_hidden, seconds) -> tuple[float, float]:
    """(MAPE, p90) of the routed experts' grouped GEMMs as perfmodel.roofline.layer_ops runs them
    (gate-up then down, over the experts a rank's tokens hit, uniform routing) against measured
    MoE layers of ``tokens`` tokens over an EP group of ``ep`` ranks. A check of the GEMM fit on
    MoE shapes, not a fit: nothing is tuned on these rows."""
    from .serving import distinct_experts

    t, n, e, k, h, f, sec = (np.asarray(x, dtype=float) for x in (tokens, ep, num_experts, top_k, hidden,
                                                                 expert_hidden, seconds))
    read = e / n * distinct_experts(e, k, t) / e
    rows = t / n * k / np.maximum(read, 1e-9)
    predicted = kernel.time(rows, 2.0 * f, h, 1.0, 1.0, 2.0, read) + kernel.time(rows, h, f, 1.0, 1.0, 2.0, read)
    error = np.abs(predicted / sec - 1.0)
    return float(error.mean()), float(np.quantile(error, 0.9))


# The largest roofline blend a calibration entry records (hardware_db.schema GemmFit.sharpness): at
# p = 1000 the blend is max(compute, memory) within 0.07% (2 ** (1 / 1000) - 1), so a fit that drifts
# beyond it (SGLang's Triton MoE rows on H200: 2,561 and 28,972) is recorded at 1000.
MAX_SHARPNESS = 1000.0


@dataclass(frozen=True)
class GroupedGemmCalibration(KernelCalibration):
    """The routed experts' grouped-GEMM kernel at one precision, fitted on measured MoE layers,
    with the implementation measured (``backend``); held out by MoE shape."""

    backend: str = ""

    def as_yaml(self) -> dict:
        """One precision of a calibration entry's ``grouped_gemm`` block, in the database's units."""
        k = self.kernel
        return {"units": int(k.units), "compute_fraction": round(float(k.compute_fraction), 4),
                "memory_fraction": round(float(k.memory_fraction), 4), "launch_us": round(float(k.launch_s) * 1e6, 3),
                "sharpness": round(min(float(k.sharpness), MAX_SHARPNESS), 3), "tile_overhead": round(float(k.tile_overhead), 4),
                "group_launch_us": round(float(k.group_launch_s) * 1e6, 4), "input_passes": round(float(k.cast), 4),
                "backend": self.backend, "held_out_mape": round(self.held_out_mape, 4),
                "held_out_p90": round(self.held_out_p90, 4), "samples": self.train_rows + self.test_rows}


def balanced_rank_rows(tokens, num_experts, top_k, ep) -> tuple[np.ndarray, np.ndarray]:
    """(token rows, experts hit) on the EP rank aiconfigurator's balanced MoE rows time: rank 0 of
    ``ep``, holding experts [0, E / ep) (its collector runs one GPU as rank 0 of the mapping,
    ai-dynamo/aiconfigurator ``collector/trtllm/collect_moe.py``, ``run_moe_torch``), routed by its
    ``balanced_logits`` (``collector/helper.py``): token t takes experts (t + i s) mod E, i < top_k,
    s = ceil(E / top_k); with fewer tokens than s, floor(t s / T + i s) mod E. The picks are spread
    evenly, so a few tokens hit min(E, T k) distinct experts, not the fewer distinct experts of
    random routing (``serving.distinct_experts``): at DeepSeek-V3's E 256, top 8, EP 8 and 32 tokens
    all 32 of rank 0's experts (uniform random routing: 20). Vectorized over rows; each distinct
    (tokens, experts, top-k) routing is built once."""
    cols = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (tokens, num_experts, top_k, ep)))
    rows, hit = np.empty(cols[0].shape), np.empty(cols[0].shape)
    keys, inverse = np.unique(np.stack([c.ravel() for c in cols]), axis=1, return_inverse=True)
    counts = {}
    for j, (t, e, k, n) in enumerate(keys.T):
        t, e, k = int(t), int(e), int(k)
        if (t, e, k) not in counts:
            s = -(-e // k)
            token, pick = np.arange(t)[:, None], np.arange(k)[None, :] * s
            expert = (token + pick) % e if t >= s else np.floor(np.mod(token * s / t + pick, e)).astype(int)
            counts[t, e, k] = np.bincount(expert.ravel(), minlength=e)
        local = counts[t, e, k][: max(int(np.ceil(e / n - 1e-9)), 1)]
        mask = inverse.ravel() == j
        rows.ravel()[mask], hit.ravel()[mask] = local.sum(), np.count_nonzero(local)
    return rows, np.maximum(hit, 1.0)


def moe_layer_parts(tokens, ep, etp, num_experts, top_k, hidden, expert_hidden, gated, act_bytes: float,
                    bytes_per_s: float) -> tuple:
    """(GEMM shapes, vector seconds) of one measured MoE layer as ``roofline.layer_ops`` runs it:
    ``tokens`` reach each of ``ep`` x ``etp`` ranks (TensorRT-LLM's MoE op: every rank routes all
    of them to its E / ep experts, each split ``etp`` ways), with the rows and experts the measured
    rank gets under the table's balanced routing (``balanced_rank_rows``); the routed experts' two
    grouped GEMMs (``roofline.routed_expert_gemms``) over the experts hit, and the vector work
    layer_ops charges beside them (the permute and unpermute passes, the activation) at
    ``bytes_per_s``."""
    from .roofline import PERMUTE_ROW_PASSES, PERMUTE_TOKEN_PASSES, routed_expert_gemms

    t, n, tp, e, k, h, f = (np.asarray(x, dtype=float) for x in (tokens, ep, etp, num_experts, top_k, hidden,
                                                                 expert_hidden))
    gated = np.asarray(gated, dtype=bool)
    rows, read = balanced_rank_rows(t, e, k, n)
    f_e = f / tp
    up, down = routed_expert_gemms(rows, read, h, f_e, True)
    up = replace(up, n=np.where(gated, up.n, f_e))
    passes = np.where(gated, 3.0, 2.0)        # activation: read gate and up (or one), write the product
    vector = ((PERMUTE_ROW_PASSES * rows + PERMUTE_TOKEN_PASSES * t) * h * act_bytes
              + rows * f_e * (2.0 * (passes - 1.0) + act_bytes)) / bytes_per_s
    return (up, down), vector


def shape_split(shape_ids, seed: int, held_out: float) -> np.ndarray:
    """True for the rows to fit on: a seeded ``held_out`` share of the distinct shapes (an MoE
    model's hidden, expert width, experts and top-k) is left out whole, with all its token counts
    and parallel layouts (at least one shape each way)."""
    ids = np.unique(shape_ids)
    left = np.random.default_rng(seed).permutation(ids)[:min(max(int(round(len(ids) * held_out)), 1), len(ids) - 1)]
    return ~np.isin(shape_ids, left)


def fit_grouped_recipes(acc, timings: dict, streaming_fraction: float, seed: int, label, dense_fit) -> dict:
    """``fit_grouped_gemm`` of each MoE recipe of measured layer timings (``read_moe_layer_timings``:
    recipe -> (columns, input bytes, weight bytes, kernels)) on the accelerator ``acc`` (schema entry):
    at the math precision's peak (GROUPED_MATH; the 16-bit one for bf16 and weight-only recipes), the
    vector passes at ``streaming_fraction`` of HBM, the full-tile rate of ``dense_fit(math)`` (a dense
    GEMM fit, or None); ``label(kernels)`` names the implementation. A precision the device has no
    peak for is skipped."""
    from .machine import GROUPED_MATH

    sixteen = acc.math16
    hbm = acc.hbm_bytes_per_s
    results = {}
    for recipe, (cols, x, w, kernels) in sorted(timings.items()):
        math = GROUPED_MATH[recipe] or sixteen
        if math not in acc.peak_flops:
            continue
        dense = dense_fit(math)
        results[recipe] = fit_grouped_gemm(*cols, acc.peak_flops[math], hbm, hbm * streaming_fraction, acc.compute_units,
                                           x, w, label(kernels), seed,
                                           compute_fraction=dense.compute_fraction if dense else None)
    return results


def fit_grouped_gemm(tokens, ep, etp, num_experts, top_k, hidden, expert_hidden, gated, seconds, peak: float,
                     bandwidth: float, vector_bytes_per_s: float, units: int, in_bytes: float, weight_bytes: float,
                     backend: str = "", seed: int = 0, held_out: float = 0.5,
                     compute_fraction: float | None = None) -> GroupedGemmCalibration:
    """Fit the routed experts' grouped-GEMM kernel (``GemmKernel`` with its per-group cost and
    input passes) to measured MoE layers at one precision, one row per layer (see
    ``moe_layer_parts``): each row's time is the two grouped GEMMs plus the vector work layer_ops
    runs beside them. Seven terms: the GEMM fit's compute and memory fractions, launch, blend and
    tile overhead, a fixed cost per group, and the passes over the GEMMs' inputs of the permute,
    quantize and activation kernels the vector model leaves out. A given ``compute_fraction``
    (the device's dense GEMM fit's full-tile rate) is kept, not fitted: the grouped kernel runs
    the same tensor cores, and left free the fit drifts to the peak with a larger tile overhead
    (same held-out error on H100). Robust least squares as the GEMM fit; held out by shape
    (``shape_split``): an MoE model's shapes never seen in the fit."""
    from scipy.optimize import least_squares

    cols = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (tokens, ep, etp, num_experts, top_k, hidden,
                                                                      expert_hidden, gated, seconds)))
    t, n, tp, e, k, h, f, g, sec = cols
    if sec.ndim != 1 or len(sec) < 20:
        raise SpecError(f"MoE timings need at least 20 rows, has {sec.size}")
    if not all(np.all(np.isfinite(x)) and np.all(x > 0) for x in (t, n, tp, e, k, h, f, sec)) or np.any(k > e):
        raise SpecError("MoE timings need positive finite shapes and seconds, and top_k at most the experts")
    shapes = np.unique(np.stack([h, f, e, k]), axis=1, return_inverse=True)[1].ravel()
    if len(np.unique(shapes)) < 2:
        raise SpecError("MoE timings need at least two MoE shapes (hidden, expert width, experts, top-k) "
                        "to hold one out")
    (up, down), vector = moe_layer_parts(t, n, tp, e, k, h, f, g > 0, in_bytes, vector_bytes_per_s)
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))                                  # noqa: E731

    def unpack(x) -> GemmKernel:
        rate = float(sigmoid(x[0])) if compute_fraction is None else float(compute_fraction)
        return GemmKernel(peak=peak, bandwidth=bandwidth, compute_fraction=rate,
                          memory_fraction=float(sigmoid(x[1])), launch_s=float(np.exp(x[2])),
                          sharpness=float(1.0 + np.exp(x[3])), tile_overhead=float(np.exp(x[4])),
                          group_launch_s=float(np.exp(x[5])), cast=float(np.exp(x[6])), units=int(units),
                          source="fitted")

    def predict(kernel, rows):
        return sum(kernel.time(x.m[rows], x.n[rows], x.k[rows], in_bytes, weight_bytes, 2.0, x.groups[rows])
                   for x in (up, down)) + vector[rows]

    train = shape_split(shapes, seed, held_out)
    # Start: 80% of the peak and of HBM, 10 us launch, p = 3, tile overhead 8, 0.1 us a group, half a pass.
    x0 = np.array([np.log(4.0), np.log(4.0), np.log(1e-5), np.log(2.0), np.log(8.0), np.log(1e-7), np.log(0.5)])
    x = least_squares(lambda v: predict(unpack(v), train) / sec[train] - 1.0, x0, loss="soft_l1", f_scale=0.1).x
    fitted = unpack(x)
    error = np.abs(predict(fitted, ~train) / sec[~train] - 1.0)
    return GroupedGemmCalibration(fitted, float(error.mean()), float(np.quantile(error, 0.9)), int(train.sum()),
                                  int((~train).sum()), backend)
