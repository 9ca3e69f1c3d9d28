"""DeepSeek-V3's measured training kernels beside the model's, operator family by family.

DeepSeek's profile of one DualPipe pair of a forward and a backward chunk (4 MoE layers each; EP64,
TP1, 4K sequence, balanced routing, H800; ``train.json`` of the public repository
deepseek-ai/profile-data) lists every kernel with its stream and duration. This script sums them by
family (GEMMs, attention, FP8 casts and transposes, norms and other elementwise kernels on the
compute streams; the DeepEP dispatch and combine on the communication stream) and prints the
model's time for the same work: 4 MoE layers' forward and backward at fp8 on hgx-h800, with the
recomputation DeepSeek states (RMSNorm and the MLA up-projections, Sec. 3.2.3), no pipeline
messages (the profile leaves them out). The trace is kernel data: a fit may use it, and this
script says where the model's constants stand against it. It is not shipped; give its path.

    python benchmarks/bench_deepseek_trace.py PATH/TO/train.json
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

import numpy as np

from perfmodel.catalog import find_model
from perfmodel.hardware_db import load_database
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, _layer_times, _mla_up_share, _shape

LAYERS = 4
# Kernel name -> family, first match wins (DeepSeek's kernel names in train.json).
FAMILIES = (("exchange (DeepEP)", r"dpsk::ep::"), ("GEMM", r"gemm|Gemm"), ("attention", r"[Ff]lash"),
            ("fp8 cast and transpose", r"cast|transpose|quant|scale"), ("norms", r"layer_norm|rms"),
            ("other elementwise", r"."))
# The model's operators in the same families.
MODEL_FAMILIES = {"qkv projection": "GEMM", "output projection": "GEMM", "router": "GEMM", "experts": "GEMM",
                  "attention core": "attention", "norms and activations": "norms",
                  "expert permute": "other elementwise"}


def measured(path: str) -> dict[str, float]:
    """Milliseconds of kernel time per family in the trace (every stream)."""
    with open(path) as fh:
        trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            family = next(f for f, pattern in FAMILIES if re.search(pattern, e["name"]))
            out[family] += e["dur"] / 1e3
    return dict(out)


def modelled() -> dict[str, float]:
    """Milliseconds of the model's kernels for 4 MoE layers' forward and backward, by family."""
    db = load_database()
    spec = find_model("deepseek-v3")
    machine = build_machine(db, "hgx-h800", 2048)
    plan = TrainPlan(tp=1, pp=16, dp=128, ep=64, zero=1, precision="fp8", moe_imbalance=1.0)
    c = {k: np.atleast_1d(v) for k, v in plan.columns().items()}
    sh = _shape(spec, machine, c, TrainWorkload(15360, 4096))
    _, moe, _, _ = _layer_times(spec, machine, c["precision"], c["sp"].astype(bool), c["flash"].astype(bool),
                                sh.tokens, sh.context, sh.gemm_input_bytes, sh.imbalance, sh.layout.tp,
                                sh.layout.cp, sh.layout.dp, sh.layout.ep, sh.layout.etp)
    out: dict[str, float] = defaultdict(float)
    for op, seconds in moe.seconds.items():
        out[MODEL_FAMILIES.get(op, "other elementwise")] += LAYERS * float(seconds[0] + moe.backward[op][0]) * 1e3
    # Recomputed in the backward (Sec. 3.2.3): the RMSNorms and the MLA up-projections.
    out["norms"] += LAYERS * float(moe.seconds["norms and activations"][0]) * 1e3
    out["GEMM"] += LAYERS * _mla_up_share(spec) * float(moe.seconds["qkv projection"][0]) * 1e3
    return dict(out)


def main(path: str) -> None:
    got, model = measured(path), modelled()
    print(f"{'family':26s} {'trace (ms)':>11s} {'model (ms)':>11s} {'model / trace':>14s}")
    for family, _ in FAMILIES:
        t, m = got.get(family, 0.0), model.get(family, 0.0)
        print(f"{family:26s} {t:11.1f} {m:11.1f} {m / t if t else float('nan'):14.2f}")
    compute_t = sum(v for k, v in got.items() if not k.startswith("exchange"))
    compute_m = sum(model.values())
    print(f"{'compute kernels':26s} {compute_t:11.1f} {compute_m:11.1f} {compute_m / compute_t:14.2f}")
    print("(the model prices the exchange per transfer, not as kernels; fp8 casts sit inside its GEMM times)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
