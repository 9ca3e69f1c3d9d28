"""The declared search space of training plans, and its validity rules, stated once.

A space is the cartesian product of the options below, filtered by the rules; it is returned as
plan columns (numpy arrays) ready for one vectorized call of the cost model. Offload placements
are not in the lattice: the solver adds them only where memory binds (see search.train).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from perfmodel.hardware_db.schema import PRECISIONS
from perfmodel.machine import Machine
from perfmodel.plan import RECOMPUTE
from perfmodel.model import TransformerSpec
from perfmodel.plan import PLACES
from perfmodel.training import TrainWorkload

RULES = (
    "tp x pp x dp x cp = devices",
    "tp within the scale-up domain, dividing the heads, and dividing or divided by the KV heads",
    "pp x interleave at most the layers (uneven splits allowed); interleave > 1 only with pp > 1 and "
    "microbatches divisible by pp",
    "ep divides the routed experts; experts fold over each stage's tp x cp x dp devices with expert tensor "
    "parallelism etp = tp (ep divides dp x cp) or etp = 1 (ep divides tp x cp x dp) (MoE models only)",
    "cp divides the sequence length",
    "global batch divisible by micro-batch x dp",
    "sequence parallelism only with tp > 1",
    "precision listed by the device",
)


@dataclass(frozen=True)
class SpaceOptions:
    """What the search may choose from (defaults: everything sensible)."""

    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    interleaves: tuple[int, ...] = (1, 2, 4, 8)
    max_cp: int = 16
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recomputes: tuple[str, ...] = RECOMPUTE
    precisions: tuple[str, ...] = ("bf16", "fp8")
    offload_places: tuple[str, ...] = PLACES
    tps: tuple[int, ...] | None = None             # the tensor-parallel degrees allowed (None: every valid one)
    max_pp: int | None = None                      # a framework's limits (perfmodel.exports.Capabilities)
    max_ep: int | None = None
    offload_parts: tuple[tuple[str, tuple[str, ...]], ...] | None = None   # None: every part to every tier
    offload_zero: tuple[int, ...] = (0, 1, 2, 3)   # ZeRO stages offloading is searched with
    dimensions: dict = field(default_factory=dict)  # filled by build_space for the report


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def build_space(spec: TransformerSpec, machine: Machine, work: TrainWorkload,
                options: SpaceOptions = SpaceOptions()) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Plan columns of every valid lattice point, and the declared size of each dimension."""
    n = machine.devices
    domain = machine.scale_up_domain
    kv = spec.kv_heads
    tps = [t for t in _divisors(n) if t <= domain and spec.num_heads % t == 0 and (kv % t == 0 or t % kv == 0)
           and (options.tps is None or t in options.tps)]
    cps = [c for c in _divisors(n) if c <= options.max_cp and work.seq_len % c == 0]
    pps = [p for p in _divisors(n) if p <= spec.num_layers and p <= (options.max_pp or n)]
    eps = ([e for e in _divisors(n) if spec.moe.num_experts % e == 0 and e <= (options.max_ep or n)]
           if spec.moe else [1])
    precisions = [p for p in options.precisions if machine.supports(p)]
    etps = (0, 1) if spec.moe else (0,)          # 0: expert TP = tp (Megatron's default); 1: experts unsplit
    declared = {"tp": len(tps), "pp": len(pps), "cp": len(cps), "ep": len(eps), "etp": len(etps),
                "interleave": len(options.interleaves),
                "micro_batch": len(options.micro_batches), "zero": len(options.zero_stages),
                "recompute": len(options.recomputes), "sp": 2, "precision": len(precisions),
                "offload (optimizer x gradients x parameters)": len(options.offload_places) ** 3}
    rows = []
    for tp, cp, pp in itertools.product(tps, cps, pps):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        for mb in options.micro_batches:
            if work.global_batch % (mb * dp):
                continue
            micro = work.global_batch // (mb * dp)
            for v in options.interleaves:
                if v > 1 and (pp == 1 or micro % pp or pp * v > spec.num_layers):
                    continue
                if pp * v > spec.num_layers:
                    continue
                for ep, etp in itertools.product(eps, etps):
                    if (etp == 0 and (dp * cp) % ep) or (etp == 1 and (tp == 1 or (tp * dp * cp) % ep)):
                        continue
                    rows.append((tp, pp, dp, cp, ep, etp, v, mb))
    if not rows or not precisions:
        return {}, declared
    base = np.array(rows, dtype=np.int64)
    cheap = list(itertools.product(options.zero_stages, [RECOMPUTE.index(r) for r in options.recomputes],
                                   (0, 1), [PRECISIONS.index(p) for p in precisions]))
    cheap_arr = np.array(cheap, dtype=np.int64)
    rep_base = np.repeat(base, len(cheap_arr), axis=0)
    rep_cheap = np.tile(cheap_arr, (len(base), 1))
    cols = {name: rep_base[:, i] for i, name in enumerate(("tp", "pp", "dp", "cp", "ep", "etp", "interleave",
                                                             "micro_batch"))}
    cols.update(zero=rep_cheap[:, 0], recompute=rep_cheap[:, 1], sp=rep_cheap[:, 2].astype(bool),
                precision=rep_cheap[:, 3])
    keep = ~(cols["sp"] & (cols["tp"] == 1))          # sequence parallelism needs tp > 1
    cols = {k: v[keep] for k, v in cols.items()}
    zeros = np.zeros(len(cols["tp"]), dtype=np.int64)
    cols.update(optimizer_place=zeros, grad_place=zeros, param_place=zeros, moe_imbalance=np.zeros(len(zeros)))
    return cols, declared


def declared_size(declared: dict[str, int]) -> int:
    """The size of the full cartesian product the space declares (before the validity rules)."""
    return int(np.prod(list(declared.values()), dtype=float))
