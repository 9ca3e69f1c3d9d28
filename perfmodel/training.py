"""Training step time, memory, energy and cost of plans, vectorized over plan columns.

One call evaluates one plan or a million: every plan field may be a numpy array and all of them
broadcast. Ranks are laid out TP innermost, then CP, then DP (EP carved out of DP x CP), then PP
(Megatron-LM's default order), so each parallel group's stride decides which topology level it
crosses and which bandwidth it pays.

References
----------
Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC21: Sec. 2.2 (1F1B and interleaved schedules; bubble (p-1)/(v m)), Sec. 3.2 (TP: two all-reduces
per layer forward and two backward), Sec. 5.1 (FLOPs; backward = 2 x forward).
Korthikanti et al. 2022, Sec. 4-5 (sequence parallelism: all-gather + reduce-scatter in place of
each all-reduce, same volume; selective and full recompute).
Rajbhandari et al., ZeRO, SC20, Sec. 7 (communication: stages 1-2 as an all-reduce, stage 3 adds
an all-gather of the parameters in forward and backward, 1.5x) and ZeRO-Offload (Ren et al.,
USENIX ATC 2021, Sec. 4: gradients to the CPU during backward, Adam on the CPU, fp16 parameters
back) and ZeRO-Infinity (Rajbhandari et al., SC21, Sec. 5: parameters streamed from CPU or NVMe).
Lepikhin et al., "GShard", 2020, and Rajbhandari et al., "DeepSpeed-MoE", ICML 2022: two
all-to-alls (dispatch, combine) per MoE layer forward and two backward.
Liu et al., "Ring Attention", 2023: context parallelism passes K and V around a ring of cp ranks,
overlapped with the blockwise attention.
Chowdhery et al., "PaLM", 2022, App. B: model FLOPs utilization.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from hardware_db.schema import PRECISIONS

from .machine import Machine
from .memory import (ADAM_STATE_BYTES, GRAD_BYTES, RECOMPUTE, WEIGHT_BYTES, activation_bytes_per_layer,
                     in_flight_microbatches, model_state_bytes)
from .model import TransformerSpec
from .power import device_power_w, run_cost
from .roofline import Op, lm_head_ops, layer_ops, roofline

PLACES = ("hbm", "ddr", "cxl", "pooled", "nvme")  # where offloadable state lives (plan code = index)


@dataclass(frozen=True)
class TrainPlan:
    """Plan columns (scalars or equal-length arrays). Precision and recompute are names or codes."""

    tp: object = 1
    pp: object = 1
    dp: object = 1
    cp: object = 1
    ep: object = 1
    interleave: object = 1
    micro_batch: object = 1
    zero: object = 0
    recompute: object = "none"
    sp: object = False
    precision: object = "bf16"
    optimizer_place: object = "hbm"
    grad_place: object = "hbm"
    param_place: object = "hbm"
    flash: object = True
    overlap_dp: object = True         # bucketed gradient reduction overlapped with backward
    moe_imbalance: object = 0.0       # busiest over mean EP device load; 0: the named constant

    def columns(self) -> dict[str, np.ndarray]:
        """Every field as a numpy array, names turned into codes (numeric columns pass through)."""
        out = {}
        for name in self.__dataclass_fields__:
            value = np.asarray(getattr(self, name))
            codes = {"recompute": RECOMPUTE, "precision": PRECISIONS, "optimizer_place": PLACES,
                     "grad_place": PLACES, "param_place": PLACES}.get(name)
            if codes is not None and value.dtype.kind in "USO":
                lookup = {c: i for i, c in enumerate(codes)}
                value = np.vectorize(lambda v: lookup[v] if isinstance(v, str) else int(v), otypes=[int])(value)
            out[name] = value
        return out


@dataclass(frozen=True)
class TrainWorkload:
    """Global batch in sequences, sequence length, and total training tokens (for run totals)."""

    global_batch: int
    seq_len: int
    tokens: float = 0.0


@dataclass
class TrainResult:
    """Per-plan arrays: times (s), memory (bytes per device), rates, energy (J), cost (USD)."""

    step_time_s: np.ndarray
    components: dict[str, np.ndarray]
    bounds: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    tier_bytes: dict[str, np.ndarray]
    tokens_per_s: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    power_w: np.ndarray
    energy_per_token_j: np.ndarray
    cost_per_hour_usd: np.ndarray
    cost_per_million_tokens_usd: np.ndarray
    run_time_s: np.ndarray
    run_energy_kwh: np.ndarray
    run_cost_usd: np.ndarray
    hbm_used_bytes: np.ndarray    # per device, with the reserve
    feasible: np.ndarray
    binding_code: np.ndarray      # 0 when feasible, else 1 + index into constraint_names
    shortfall: np.ndarray         # by how much (bytes, or the ratio for divisibility), 0 when feasible
    constraint_names: tuple[str, ...] = ()
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def binding(self) -> np.ndarray:
        """Name of the violated constraint of each plan ("" when feasible)."""
        return np.asarray(("",) + self.constraint_names, dtype=object)[self.binding_code]


def _layers_per_stage(spec: TransformerSpec, pp):
    return np.ceil(spec.num_layers / np.maximum(pp, 1))


def _sum_ops(ops: list[Op], machine: Machine, flops_per_s, prefix: str, times: dict, bounds: dict, scale):
    # Attention runs in bf16 even in fp8 training (Transformer Engine keeps the core in bf16).
    rates = {"gemm": flops_per_s, "attention": machine.flops("bf16"), "vector": np.inf}
    total = 0.0
    for op in ops:
        t, compute_bound = roofline(op.flops, op.bytes, rates[op.unit], machine.hbm_bytes_per_s)
        key = f"{prefix}{op.name}"
        times[key] = times.get(key, 0.0) + t * scale
        bounds[key] = compute_bound
        total = total + t * scale
    return total


# Rows evaluated per pass: blocks of this size keep each temporary array in the CPU cache (several
# times faster than one pass over a million rows), and numpy releases the GIL inside each array
# operation, so blocks run on every core at once (benchmarks/bench_evaluate.py measures both).
BLOCK_ROWS = 16384


def estimate_training(spec: TransformerSpec, machine: Machine, plan: TrainPlan, work: TrainWorkload,
                      detail: bool = True) -> TrainResult:
    """Step time, memory per tier, MFU, energy and cost of every plan (Narayanan et al. 2021 Sec. 2-3).

    Plan columns broadcast; a long plan is evaluated in cache-sized blocks and joined. With
    ``detail=False`` (the search's mode) the per-component breakdowns of a multi-block call are
    left out and only the per-plan totals are joined.
    """
    columns = plan.columns()
    n = int(np.broadcast(*columns.values()).size)
    if n <= BLOCK_ROWS:
        return _estimate(spec, machine, columns, work)
    from concurrent.futures import ThreadPoolExecutor

    full = {k: np.broadcast_to(v, (n,)) for k, v in columns.items()}

    def block(start: int) -> TrainResult:
        return _estimate(spec, machine, {k: v[start:start + BLOCK_ROWS] for k, v in full.items()}, work)

    with ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 8)) as pool:
        parts = list(pool.map(block, range(0, n, BLOCK_ROWS)))
    fields = TrainResult.__dataclass_fields__
    return TrainResult(**{f: _join([getattr(p, f) for p in parts], n)
                          if detail or not isinstance(getattr(parts[0], f), dict) else {} for f in fields})


def _join(values: list, n: int):
    """Concatenate the per-block values of one result field (arrays, or dicts of them)."""
    if isinstance(values[0], tuple):
        return values[0]
    if isinstance(values[0], dict):
        return {k: _join([v[k] for v in values], n) for k in values[0]}
    return np.concatenate([np.broadcast_to(v, (min(BLOCK_ROWS, n - i * BLOCK_ROWS),))
                           for i, v in enumerate(values)])


def _estimate(spec: TransformerSpec, machine: Machine, c: dict[str, np.ndarray], work: TrainWorkload) -> TrainResult:
    """One block of plans (see estimate_training)."""
    tp, pp, dp, cp, ep = (np.maximum(c[k].astype(float), 1.0) for k in ("tp", "pp", "dp", "cp", "ep"))
    v = np.maximum(c["interleave"].astype(float), 1.0)
    mb = np.maximum(c["micro_batch"].astype(float), 1.0)
    zero, recompute, sp, flash = c["zero"], c["recompute"], c["sp"].astype(bool), c["flash"].astype(bool)
    flops_per_s = machine.flops_table()[c["precision"]]
    if np.isnan(flops_per_s).any():
        bad = PRECISIONS[int(np.asarray(c["precision"]).flat[int(np.argmax(np.isnan(np.atleast_1d(flops_per_s))))])]
        machine.flops(bad)  # raises with the precisions the device lists
    act_bytes = np.where(np.isin(c["precision"], [PRECISIONS.index("fp8")]), 1.0, 2.0)  # fp8 GEMM inputs
    gb, s = float(work.global_batch), float(work.seq_len)
    num_micro = np.maximum(gb / (mb * dp), 1.0)
    topo = machine.topology
    h, L = spec.hidden_size, spec.num_layers
    moe = spec.moe is not None
    # Expert load imbalance: the plan's own factor (from a placement of real routing) or the constant.
    imbalance = np.where(c["moe_imbalance"] > 0, c["moe_imbalance"],
                         machine.constants.get("moe-load-imbalance", 1.0)) if moe else 1.0

    # --- compute per microbatch per stage -------------------------------------------------------
    tokens = mb * s / cp                         # tokens of one microbatch on one device's TP group
    context = np.where(flash, s / 2.0, s)        # causal flash skips masked blocks; 2021 kernels did not
    layers = _layers_per_stage(spec, pp)
    moe_frac = spec.moe_layers / L if moe else 0.0
    times: dict[str, np.ndarray] = {}
    bounds: dict[str, np.ndarray] = {}
    dense_ops = layer_ops(spec, tokens, context, tp, sp, act_bytes=act_bytes, flash=flash)
    fwd = _sum_ops(dense_ops, machine, flops_per_s, "", times, bounds, layers * (1 - moe_frac))
    if moe:
        moe_ops = layer_ops(spec, tokens, context, tp, sp, act_bytes=act_bytes, flash=flash, moe_layer=True, ep=ep,
                            expert_tokens_scale=imbalance)
        fwd = fwd + _sum_ops(moe_ops, machine, flops_per_s, "", times, bounds, layers * moe_frac)
    head = _sum_ops(lm_head_ops(spec, tokens, tp, act_bytes=act_bytes), machine, flops_per_s, "", times, bounds,
                    np.ones_like(layers))
    fwd = fwd + head
    attention_fwd = times["attention core"]
    recompute_time = np.where(recompute == 2, fwd - head, np.where(recompute == 1, attention_fwd, 0.0))
    compute_mb = 3.0 * fwd + recompute_time      # backward = 2 x forward (Narayanan et al. Sec. 5.1)

    # --- communication per microbatch per stage ----------------------------------------------------
    act = tokens * h * 2.0                       # one layer's activation, bf16, per TP group
    tp_passes = 4.0 + 2.0 * (recompute == 2)     # 2 forward + 2 backward (+2 in the recomputed forward)
    tp_comm = layers * tp_passes * topo.all_reduce(act, 1, tp)
    ep_comm = 0.0
    if moe:
        token_bytes = tokens * h * 2.0 * imbalance
        ep_comm = layers * moe_frac * (4.0 + 2.0 * (recompute == 2)) * topo.moe_all_to_all(
            token_bytes, spec.moe.top_k, tp * cp, ep)
    kv_w = 2.0 * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim if spec.mla else spec.kv_heads * spec.dim_head)
    cp_step = topo.p2p(tokens * kv_w / tp * 2.0, tp)
    cp_comm_raw = (cp - 1) * cp_step * 3.0       # K, V forward; K, V and their gradients backward
    cp_comm = layers * np.maximum(cp_comm_raw - 3.0 * attention_fwd / np.maximum(layers, 1), 0.0) * (cp > 1)
    pp_msg = act / tp   # scatter-gather: each TP rank sends 1/t, then an all-gather (Narayanan et al. Sec. 4.1)
    pp_comm = 2.0 * v * topo.p2p(pp_msg, tp * cp * dp) * (pp > 1)

    # --- ZeRO-3 gathers and parameter offload, per microbatch ----------------------------------------
    params_dense, params_expert = _params_per_device(spec, tp, pp, ep)
    shard_dp = dp * cp                            # ranks holding the same weights
    expert_dp = np.maximum(shard_dp / ep, 1.0)
    stage_param_bytes = (params_dense + params_expert) * WEIGHT_BYTES
    gathers = (2.0 + (recompute == 2)) * topo.all_gather(stage_param_bytes, tp, shard_dp)
    zero3_exposed = np.where(zero >= 3, np.maximum(gathers - compute_mb, 0.0), 0.0)
    param_tier_bw = _tier_bandwidth(machine, c["param_place"], "read")
    param_fetch = (2.0 + (recompute == 2)) * stage_param_bytes / np.maximum(shard_dp * (zero >= 3), 1.0) / param_tier_bw
    param_exposed = np.where(c["param_place"] > 0, np.maximum(param_fetch - compute_mb, 0.0), 0.0)

    per_micro = compute_mb + tp_comm + ep_comm + cp_comm + zero3_exposed + param_exposed
    pipeline = (num_micro + (pp - 1) / v) * per_micro + num_micro * pp_comm
    bubble = (pp - 1) / v * per_micro

    # --- data-parallel gradient reduction, overlapped with the last backward --------------------
    grad_bytes = params_dense * GRAD_BYTES
    dp_comm = np.where(zero >= 2, topo.reduce_scatter(grad_bytes, tp, shard_dp) * np.where(zero >= 3, num_micro, 1.0)
                       + np.where(zero == 2, topo.all_gather(params_dense * WEIGHT_BYTES, tp, shard_dp), 0.0),
                       topo.all_reduce(grad_bytes, tp, shard_dp))
    if moe:
        dp_comm = dp_comm + topo.all_reduce(params_expert * GRAD_BYTES, tp * cp, expert_dp)
    overlap = machine.constants.get("dp-overlap-fraction", 0.0) * 2.0 * fwd * np.where(zero >= 3, num_micro, 1.0) \
        * c["overlap_dp"].astype(bool)
    dp_exposed = np.maximum(dp_comm - overlap, 0.0) * (shard_dp > 1)

    # --- optimizer step: on the device, or on the CPU over the tier holding the states ----------
    opt_params = params_dense / np.where(zero >= 1, shard_dp, 1.0) + params_expert / np.where(zero >= 1, expert_dp, 1.0)
    adam_bytes = opt_params * (ADAM_STATE_BYTES * 2 + GRAD_BYTES + WEIGHT_BYTES * 2)
    on_gpu = c["optimizer_place"] == 0
    tier_rw = _tier_bandwidth(machine, c["optimizer_place"], "read")
    host_link = machine.host_bytes_per_s or np.inf
    transfers = opt_params * (GRAD_BYTES + WEIGHT_BYTES) / host_link   # grads out, updated weights back
    optimizer = np.where(on_gpu, adam_bytes / machine.hbm_bytes_per_s,
                         adam_bytes / tier_rw + np.maximum(transfers - 2.0 * fwd, 0.0))
    # Offloaded gradients: each rank's reduced partition goes to the tier during the last backward
    # (ZeRO-Offload, Ren et al. 2021, Sec. 4.1), so only what outlasts that backward is exposed.
    grad_partition = (params_dense / shard_dp + params_expert / expert_dp) * GRAD_BYTES
    grad_offload = np.where(c["grad_place"] > 0,
                            np.maximum(grad_partition / _tier_bandwidth(machine, c["grad_place"], "write")
                                       - 2.0 * fwd, 0.0), 0.0)

    step = pipeline + dp_exposed + optimizer + grad_offload

    # --- memory per device --------------------------------------------------------------------------
    weights_d, grads_d, optim_d = model_state_bytes(params_dense, shard_dp, zero)
    weights_e, grads_e, optim_e = model_state_bytes(params_expert, expert_dp, zero)
    weights, grads, optim = weights_d + weights_e, grads_d + grads_e, optim_d + optim_e
    per_layer = activation_bytes_per_layer(spec, s / cp, mb, tp, sp, recompute, flash=flash)
    if moe:
        per_layer = per_layer * (1 - moe_frac) + moe_frac * activation_bytes_per_layer(
            spec, s / cp, mb, tp, sp, recompute, flash=flash, moe_layer=True)
    activations = per_layer * layers * in_flight_microbatches(pp, num_micro, v)
    logits = 4.0 * tokens * spec.vocab_size / tp * (pp == 1)   # fp32 logits (last stage; with pp=1 it is also first)
    activations = activations + logits
    memory = {"weights": weights, "gradients": grads, "optimizer states": optim, "activations": activations}
    hbm = activations.copy()
    tier_bytes = {p: np.zeros_like(activations) for p in PLACES[1:]}
    for part, place in (("weights", c["param_place"]), ("gradients", c["grad_place"]),
                        ("optimizer states", c["optimizer_place"])):
        hbm = hbm + np.where(place == 0, memory[part], 0.0)
        for code, name in enumerate(PLACES[1:], start=1):
            tier_bytes[name] = tier_bytes[name] + np.where(place == code, memory[part], 0.0)
    reserve = machine.constants.get("hbm-reserve-fraction", 0.0) * machine.hbm_bytes
    hbm_used = hbm + reserve
    memory["reserve"] = np.full_like(hbm, reserve)

    # --- feasibility, in the order a planner reads it -------------------------------------------
    code = np.zeros(np.shape(step), dtype=np.int8)     # 0 = feasible, else 1 + index into names
    shortfall = np.zeros(np.shape(step))
    names: list[str] = []

    def violate(mask, name, amount):
        nonlocal code, shortfall
        names.append(name)
        new = np.asarray(mask) & (code == 0)
        code = np.where(new, len(names), code)
        shortfall = np.where(new, amount, shortfall)

    devices_used = tp * pp * dp * cp
    violate(devices_used != machine.devices, "devices", devices_used - machine.devices)
    violate(gb % (mb * dp) != 0, f"global batch ({gb:g}) divisible by micro batch x dp", mb * dp)
    violate(spec.num_heads % tp != 0, "tp divides heads", tp)
    violate((ep > 1) & (not moe), "ep needs an MoE model", ep)
    if moe:
        violate(spec.moe.num_experts % ep != 0, "ep divides experts", ep)
    violate((dp * cp) % ep != 0, "ep divides dp x cp", ep)
    violate(s % cp != 0, "cp divides sequence", cp)
    # Uneven splits are allowed (the largest stage holds ceil(L / pp) layers and sets the pace).
    violate(pp * v > spec.num_layers, "pp x interleave at most layers", pp * v)
    violate((v > 1) & (num_micro % pp != 0), "interleaving needs microbatches divisible by pp", num_micro)
    # Offload follows DeepSpeed: optimizer states with ZeRO >= 1 (ZeRO-Offload), gradients with
    # ZeRO >= 2 (partitioned before they leave), parameters with ZeRO-3 (ZeRO-Infinity).
    violate((c["optimizer_place"] > 0) & (zero < 1), "optimizer offload needs zero >= 1", zero)
    violate((c["grad_place"] > 0) & (zero < 2), "gradient offload needs zero >= 2", zero)
    violate((c["param_place"] > 0) & (zero < 3), "parameter offload needs zero 3", zero)
    violate(hbm_used > machine.hbm_bytes, "hbm", hbm_used - machine.hbm_bytes)
    for name in PLACES[1:]:
        capacity = _tier_capacity(machine, name)
        violate(tier_bytes[name] > capacity, name, tier_bytes[name] - capacity)
    feasible = code == 0

    # --- rates, utilization, energy and cost ------------------------------------------------------
    tokens_per_step = gb * s
    tokens_per_s = tokens_per_step / step
    model_flops = spec.training_flops_per_token(s) * tokens_per_step
    # Utilization against the dense peak of the precision the GEMMs run at (fp8 plans against fp8).
    peak = np.array([machine.peak_flops.get(p, np.nan) for p in PRECISIONS])[c["precision"]]
    mfu = model_flops / (step * machine.devices * peak)
    # Hardware FLOPs add what recompute re-executes: the whole forward (full) or the attention
    # core's forward (selective; Korthikanti et al. 2022 Sec. 5, 4 x layers x s x width per token).
    attention_fwd_flops = 4.0 * L * spec.attended_context(s) * spec.attention_width * tokens_per_step
    hw_flops = model_flops + np.where(recompute == 2, model_flops / 3.0,
                                      np.where(recompute == 1, attention_fwd_flops, 0.0))
    hfu = hw_flops / (step * machine.devices * peak)
    busy = np.clip((num_micro * compute_mb + optimizer * on_gpu) / step, 0.0, 1.0)
    power = device_power_w(machine, busy) + machine.overhead_w_per_device
    energy_per_token = power * machine.devices * machine.constants.get("pue", 1.0) / tokens_per_s
    cost_hour = run_cost(machine, power) * machine.devices
    cost_mtok = cost_hour / 3600.0 / tokens_per_s * 1e6
    run_time = work.tokens / tokens_per_s if work.tokens else np.zeros_like(step)
    components = {
        "compute (fwd+bwd+recompute)": num_micro * compute_mb,
        "pipeline bubble": bubble,
        "tp communication": num_micro * tp_comm,
        "ep all-to-all": num_micro * ep_comm,
        "cp ring exchange (exposed)": num_micro * cp_comm,
        "pp point-to-point": num_micro * pp_comm,
        "zero-3 gathers (exposed)": num_micro * zero3_exposed,
        "parameter offload (exposed)": num_micro * param_exposed,
        "dp gradient reduction (exposed)": dp_exposed,
        "gradient offload (exposed)": grad_offload,
        "optimizer step": optimizer,
    }
    op_times = {k: num_micro * 3.0 * v_ for k, v_ in times.items()}
    return TrainResult(
        step_time_s=step, components=components, bounds={k: bounds[k] for k in times}, memory=memory,
        tier_bytes=tier_bytes, tokens_per_s=tokens_per_s, mfu=mfu, hfu=hfu, power_w=power,
        energy_per_token_j=energy_per_token, cost_per_hour_usd=cost_hour, cost_per_million_tokens_usd=cost_mtok,
        run_time_s=run_time, run_energy_kwh=energy_per_token * work.tokens / 3.6e6,
        run_cost_usd=cost_hour * run_time / 3600.0, feasible=feasible, binding_code=code, shortfall=shortfall,
        constraint_names=tuple(names),
        hbm_used_bytes=hbm_used,
        extra={"num_microbatches": num_micro, "operator_times": op_times,
               "busy_fraction": busy, "model_flops_per_step": np.broadcast_to(model_flops, np.shape(step))})


def _params_per_device(spec: TransformerSpec, tp, pp, ep):
    """(dense, routed-expert) parameters one device holds: the largest pipeline stage's share.

    Dense weights split by TP; a stage holds ceil(L/pp) layers, and the first stage also the
    embedding and the last the LM head (each split by TP).
    """
    layers = _layers_per_stage(spec, pp)
    per_layer_common = spec.attention_params + 2 * spec.hidden_size * (2 if spec.norm == "layernorm" else 1)
    moe_frac = spec.moe_layers / spec.num_layers if spec.moe else 0.0
    dense_layer = per_layer_common + (1 - moe_frac) * spec.dense_mlp_params + moe_frac * (
        spec.router_params + spec.shared_expert_params)
    embed = spec.vocab_size * spec.hidden_size
    ends = np.where(pp > 1, embed, spec.embedding_params)
    dense = (layers * dense_layer + ends) / tp
    expert = layers * moe_frac * (spec.moe.num_experts * spec.expert_params if spec.moe else 0.0) / (tp * ep)
    return dense, expert


def _tier_bandwidth(machine: Machine, place_code, direction: str):
    """Per-device bandwidth of the tier each plan places a state in (HBM for code 0)."""
    table = [machine.hbm_bytes_per_s]
    for name in PLACES[1:]:
        tier = next((t for t in machine.memory_tiers if t.kind == name), None)
        # A missing tier gets 1 byte/s: any plan placing state there fails its capacity check (0 bytes).
        bw = (tier.read_bytes_per_s if direction == "read" else tier.write_bytes_per_s) if tier else 1.0
        table.append(bw)
    return np.asarray(table)[np.asarray(place_code)]


def _tier_capacity(machine: Machine, kind: str) -> float:
    return sum(t.bytes_per_device for t in machine.memory_tiers if t.kind == kind)
