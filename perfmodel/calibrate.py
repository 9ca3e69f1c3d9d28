"""Fit collective costs to measured timings: the model ``collectives.FittedCollectives`` evaluates.

Per collective op, two protocols (NCCL's low-latency and bandwidth protocols), each a launch time
and a fraction of the link's bandwidth, and one hop latency shared by the ops; the cost is the
faster protocol's launch + steps x hop + bytes x volume / (link x fraction). Fitted by least
squares on the log of predicted over measured time (relative errors weigh every message size
alike) on a seeded share of the rows; the rest are held out and their mean absolute percentage
error is reported per op. Pure functions of arrays: file reading lives in the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware_db.errors import SpecError

from .collectives import COLLECTIVES, FittedCollectives

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
