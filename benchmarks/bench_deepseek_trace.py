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

A second table takes the MoE layer apart: the routed experts' grouped GEMM kernels (forward and
data gradient, DeepSeek's m_grouped kernels) against the fitted grouped kernel at the same rows
per expert, with and without the fit's input passes; the token kernels (permute, unpermute,
routing map, top-k, router GEMM) against the model's expert permute and router; and every cast
and transpose kernel against the casts the model charges inside its GEMMs. A third table reads the
host side: the CPU time of each node of DeepSeek's schedule on the thread that issues it, the
kernels it launches and their GPU time (what an eager PyTorch MoE layer costs the host).

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


def kernels(path: str):
    """(name, milliseconds) of every kernel the trace records (every stream)."""
    with open(path) as fh:
        trace = json.load(fh)
    for e in trace["traceEvents"] if isinstance(trace, dict) else trace:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            yield e["name"], e["dur"] / 1e3


def measured(path: str) -> dict[str, float]:
    """Milliseconds of kernel time per family in the trace (every stream)."""
    out: dict[str, float] = defaultdict(float)
    for name, ms in kernels(path):
        out[next(f for f, pattern in FAMILIES if re.search(pattern, name))] += ms
    return dict(out)


def modelled() -> dict[str, float]:
    """Milliseconds of the model's kernels for 4 MoE layers' forward and backward, by family."""
    spec = find_model("deepseek-v3")
    moe = _moe_layer(spec, build_machine(load_database(), "hgx-h800", 2048))
    out: dict[str, float] = defaultdict(float)
    for op, seconds in moe.seconds.items():
        out[MODEL_FAMILIES.get(op, "other elementwise")] += LAYERS * float(seconds[0] + moe.backward[op][0]) * 1e3
    # Recomputed in the backward (Sec. 3.2.3): the RMSNorms and the MLA up-projections.
    out["norms"] += LAYERS * float(moe.seconds["norms and activations"][0]) * 1e3
    out["GEMM"] += LAYERS * _mla_up_share(spec) * float(moe.seconds["qkv projection"][0]) * 1e3
    return dict(out)


# The MoE layer's kernels in the trace, by role (DeepSeek's names); the rest of the table's families.
MOE_ROLES = (("routed grouped GEMMs (fwd + dgrad)", r"m_grouped"),
             ("token kernels (permute, unpermute, map, top-k, router)",
              r"expand_to_fused|reduce_fused|get_fused_mapping|clean_and_count|TopK|topk|sm90_xmma_gemm_bf16"),
             ("fp8 casts and transposes", r"cast|transpose|quant"))


def moe_measured(path: str) -> dict[str, float]:
    """Milliseconds of the trace's compute-stream kernels by MoE role (first match wins)."""
    out: dict[str, float] = defaultdict(float)
    for name, ms in kernels(path):
        role = None if re.search(r"dpsk::ep::", name) else next(
            (r for r, pattern in MOE_ROLES if re.search(pattern, name)), None)
        if role:
            out[role] += ms
    return dict(out)


def moe_modelled() -> dict[str, tuple[float, float]]:
    """(as charged, kernels alone) milliseconds of the model's terms for the same roles, 4 layers."""
    from dataclasses import replace
    db = load_database()
    spec = find_model("deepseek-v3")
    machine = build_machine(db, "hgx-h800", 2048)
    grouped = machine.grouped_kernel("fp8", block=True, in_framework=True)
    rows, experts = 4096.0 * spec.moe.top_k, spec.moe.num_experts / 64     # balanced, EP64
    m, h, f = rows / experts, spec.hidden_size, spec.moe.expert_ffn_hidden_size

    def fwd_dgrad(kernel):
        return LAYERS * 1e3 * float(sum(kernel.time(m, n, k, 1, 1, 1, experts) + kernel.time(m, k, n, 1, 1, 1, experts)
                                        for n, k in ((2 * f, h), (h, f))))
    cast_free = {k: replace(v, cast=0.0) for k, v in machine.grouped_kernels.items()}
    bare = replace(machine, grouped_kernels=cast_free, gemm_kernels={k: replace(v, cast=0.0)
                                                                      for k, v in machine.gemm_kernels.items()})
    charged, alone = (_moe_ms(spec, mc) for mc in (machine, bare))
    gemm = sum(charged[k] for k in ("qkv projection", "output projection", "router", "experts"))
    gemm_bare = sum(alone[k] for k in ("qkv projection", "output projection", "router", "experts"))
    return {MOE_ROLES[0][0]: (fwd_dgrad(grouped), fwd_dgrad(replace(grouped, cast=0.0))),
            MOE_ROLES[1][0]: (charged["expert permute"] + charged["router"],) * 2,
            MOE_ROLES[2][0]: (gemm - gemm_bare, 0.0)}


def _moe_layer(spec, machine):
    """The model's operator times of one MoE layer of the trace's plan (EP64, fp8, balanced)."""
    plan = TrainPlan(tp=1, pp=16, dp=128, ep=64, zero=1, precision="fp8", moe_imbalance=1.0)
    c = {k: np.atleast_1d(v) for k, v in plan.columns().items()}
    sh = _shape(spec, machine, c, TrainWorkload(15360, 4096))
    _, moe, _, _ = _layer_times(spec, machine, c["precision"], c["sp"].astype(bool), c["flash"].astype(bool),
                                sh.tokens, sh.context, sh.gemm_input_bytes, sh.imbalance, sh.layout.tp,
                                sh.layout.cp, sh.layout.dp, sh.layout.ep, sh.layout.etp)
    return moe


def _moe_ms(spec, machine) -> dict[str, float]:
    """Milliseconds per operator of 4 MoE layers' forward and backward (modelled()'s plan)."""
    moe = _moe_layer(spec, machine)
    return {op: LAYERS * float(s[0] + moe.backward[op][0]) * 1e3 for op, s in moe.seconds.items()}


def host(path: str) -> dict[str, tuple[int, float, float, float, float]]:
    """The host side of the trace's schedule: per node of DeepSeek's schedule (the annotations on the
    thread that runs it: attn(F), dispatch(F), mlp(B), ...), (instances, mean and least host ms per
    instance, kernels launched per instance by any thread, those kernels' GPU ms per instance). A
    node's host time is the schedule thread's time in it: Python and framework work that issues its
    kernels (in the backward, autograd's thread issues them while this one waits), plus any wait on
    the device (DeepEP's dispatch spins until the received-token counts arrive); its least instance
    bounds the issue part."""
    with open(path) as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    notes = [e for e in events if e.get("cat") == "user_annotation" and "(" in e["name"]]
    thread = max({e["tid"] for e in notes}, key=lambda t: sum(e["tid"] == t for e in notes))
    notes = [e for e in notes if e["tid"] == thread]
    gpu = {e["args"].get("correlation"): e["dur"] for e in events if e.get("cat") == "kernel"}
    # Any thread's launches: the backward's kernels are issued by autograd's thread while the
    # schedule's thread waits in its node.
    launches = [e for e in events if e.get("cat") == "cuda_runtime"
                and "LaunchKernel" in e["name"] and e["args"].get("correlation") in gpu]
    rows: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    for note in notes:
        inside = [e for e in launches if note["ts"] <= e["ts"] <= note["ts"] + note["dur"]]
        rows[note["name"]].append((note["dur"] / 1e3, len(inside),
                                   sum(gpu[e["args"]["correlation"]] for e in inside) / 1e3))
    return {name: (len(r), float(np.mean([x[0] for x in r])), min(x[0] for x in r),
                   float(np.mean([x[1] for x in r])), float(np.mean([x[2] for x in r]))) for name, r in rows.items()}


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
    print()
    got, model = moe_measured(path), moe_modelled()
    print(f"{'MoE role':54s} {'trace (ms)':>11s} {'model (ms)':>11s} {'kernel alone':>13s}")
    for role, _ in MOE_ROLES:
        charged, alone = model[role]
        print(f"{role:54s} {got.get(role, 0.0):11.1f} {charged:11.1f} {alone:13.1f}")
    print("(routed GEMMs: the fitted grouped kernel at the trace's rows per expert, balanced EP64, with the fit's input\n"
          " passes and without them; casts: what the input passes of every GEMM of the model add)")
    print()
    nodes = host(path)
    print(f"{'schedule node (host thread)':28s} {'count':>5s} {'host ms':>8s} {'least':>7s} {'kernels':>8s} "
          f"{'their GPU ms':>13s}")
    for name, (count, mean, least, launched, busy) in nodes.items():
        print(f"{name:28s} {count:5d} {mean:8.2f} {least:7.2f} {launched:8.1f} {busy:13.2f}")
    for phase in ("F", "B"):
        mine = [v for k, v in nodes.items() if k.endswith(f"({phase})") or (phase == "B" and k.endswith("(W)"))]
        issue, launched, busy = (sum(v[i] for v in mine) for i in (2, 3, 4))
        print(f"one layer's {'forward' if phase == 'F' else 'backward'}: host {issue:.2f} ms at least (each node's "
              f"least instance) for {launched:.0f} kernels ({1e3 * issue / max(launched, 1):.0f} us each), "
              f"whose GPU time is {busy:.2f} ms")
    print("(the host thread issues the schedule's kernels; where a layer's kernels take less GPU time than their\n"
          " issue, an eager step without CUDA graphs waits on the host)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
