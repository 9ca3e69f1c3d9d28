"""Memory of a training plan per device and tier, and the rules a plan must meet (perfmodel.training).

Model states per ZeRO stage and sharding (Rajbhandari et al., ZeRO, SC20, Sec. 5; MiCS; ZeRO++),
activations per schedule (Korthikanti et al. 2022, Sec. 4-5; Narayanan et al. 2021, Sec. 2.2), the
gathered layers of ZeRO-3, and the tiers states are offloaded to (ZeRO-Offload, ZeRO-Infinity).
"""

from __future__ import annotations

import numpy as np

from perfmodel.hardware_db.schema import PRECISIONS

from .activation_offload import layer_swap, swap_buffers
from .feasibility import FirstBroken
from .kernels import on_distinct
from .layout import Layout
from .machine import Machine
from .memory import (activation_bytes_per_layer, in_flight_layers, layers_on_stage, model_state_bytes, stage_layers,
                     state_bytes_per_param)
from .model import TransformerSpec
from .plan import INTERLEAVED, PLACES, TIERS, CpComm, Place, Recompute, Schedule, Storage
from .training_terms import Memory, SHARDING_FIELDS, Shape, TrainWorkload


def _memory(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, work: TrainWorkload,
            parts: bool = True) -> Memory:
    """Memory per device of the fullest pipeline stage: the first (embedding, most microbatches in
    flight), the first of the longer stages, or the last (LM head, fp32 logits); model states by
    ZeRO stage (Rajbhandari et al. 2020), activations by Korthikanti et al. 2022 Eq. 1-2. Without
    ``parts`` (the screen: the HBM total and the tiers only) the fullest stage's parts are left out,
    except those offloaded, which the tiers hold."""
    lay = sh.layout
    zero, sp, flash, recompute = c["zero"], c["sp"].astype(bool), c["flash"].astype(bool), c["recompute"]
    s = float(work.seq_len)
    mb = np.maximum(c["micro_batch"], 1)
    low = c["storage"] == Storage.DEEPSEEK
    kw = dict(flash=flash, gemm_input_bytes=sh.gemm_input_bytes, low_precision=low)
    per_layer = layer_activation_bytes(spec, c, sh, work, recompute)
    swap = activation_swap(spec, c, sh, work, per_layer)
    mtp_acts = spec.mtp_layers * activation_bytes_per_layer(
        spec, s / lay.cp, mb, lay.tp, sp, recompute, moe_layer=spec.moe is not None, **kw) if spec.mtp_layers else 0.0
    last = lay.pp - 1
    dualpipe = c["schedule"] == Schedule.DUALPIPE
    candidates = _stage_candidates(spec, lay, sh.num_micro, c["interleave"], sh.ends, dualpipe)
    reserve = machine.hbm_reserve_bytes
    # Bytes per parameter of each state (linear in the parameters): dense weights shard over the
    # dp x cp replicas, routed experts over expert data parallelism.
    state_bytes = state_bytes_per_param(c["storage"])
    per_dense = sh.sharding.state_bytes(1.0, *state_bytes)
    per_expert = model_state_bytes(1.0, lay.edp, zero, *state_bytes) if spec.moe else (0.0, 0.0, 0.0)
    stages = []
    # ZeRO-3 gathers each layer's weights before it runs: the layer computing and the one being
    # prefetched are whole (PyTorch FSDP's rate limiter, limit_all_gathers, keeps at most two
    # all-gathers in flight; Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
    # Parallel", VLDB 2023), and in the backward the layer's whole gradient waits for its reduce-scatter.
    one_dense = lay.params_per_device(spec, 1.0, False, False)[0] - lay.params_per_device(spec, 0.0, False, False)[0]
    one_expert = lay.expert_slots(spec) * spec.expert_params / lay.etp if spec.moe else 0.0
    # ``prefetch`` layers ahead hold theirs too (FSDP's limit_all_gathers bounds the in-flight
    # gathers; depth 0 holds only the layer computing).
    in_flight = 1.0 + np.maximum(np.asarray(c["prefetch"], dtype=float), 0.0)
    gathered = (np.where((c["zero"] >= 3) & (sh.sharding.weights > 1), one_dense, 0.0)
                + np.where((c["zero"] >= 3) & (lay.edp > 1), one_expert, 0.0)) * (in_flight * state_bytes[0]
                                                                                  + state_bytes[1])
    # DualPipe keeps two copies of the parameters (and their gradients) on every rank (DeepSeek-V3
    # report, Table 2).
    copies = np.where(dualpipe, 2.0, 1.0)
    for stage, flight, dense, expert in candidates:
        weights, grads, optim = (dense * d + expert * e if spec.moe else dense * d
                                 for d, e in zip(per_dense, per_expert))
        weights, grads = weights * copies, grads * copies
        acts = per_layer * flight if swap is None else swap.hbm * flight
        # The last stage: fp32 logits of its microbatch in flight, for the head and each MTP depth,
        # and the MTP blocks' activations.
        acts = acts + np.where(stage == last, 4.0 * sh.tokens * spec.vocab_size / lay.tp * (1 + spec.mtp_layers)
                               + mtp_acts, 0.0)
        held = {"weights": weights, "gradients": grads, "optimizer states": optim, "activations": acts,
                "gathered layers (ZeRO-3)": gathered}
        hbm = acts + gathered + sum(_in_hbm(c[place], held[part]) for place, part in _OFFLOADABLE)
        if swap is not None:          # listed only where some plan swaps (outputs of the others unchanged)
            held[SWAPPED] = swap.host * flight
            held[SWAP_BUFFERS] = swap_buffers(swap.host, flight)
            hbm = hbm + held[SWAP_BUFFERS]
        stages.append((held, hbm))
    fullest = _first_largest([hbm for _, hbm in stages])

    def pick(values):
        return np.choose(fullest, np.broadcast_arrays(*values))

    hbm = pick([hbm for _, hbm in stages])
    names = stages[0][0] if parts else [part for place, part in _OFFLOADABLE if np.any(c[place])] + (
        [SWAPPED] if swap is not None else [])
    picked = {k: pick([p[k] for p, _ in stages]) for k in names}
    # Host memory holds the swapped activations of the stage that swaps the most (the first: the most in flight).
    tiered = picked if swap is None else {**picked, SWAPPED: _first_largest_value([p[SWAPPED] for p, _ in stages])}
    tier_bytes = {name: _tier_bytes(machine, name, c, tiered, np.shape(hbm)) for name in TIERS}
    if not parts:
        return Memory(picked, hbm + reserve, tier_bytes, None)
    picked["reserve"] = np.full(np.shape(hbm), reserve)
    stage = pick([np.broadcast_to(st, np.shape(hbm)) for st, *_ in candidates])
    return Memory(picked, hbm + reserve, tier_bytes, stage)


SWAPPED, SWAP_BUFFERS = "activations in host memory", "activation swap buffers"


def layer_activation_bytes(spec: TransformerSpec, c: dict, sh: Shape, work: TrainWorkload, recompute):
    """Activation bytes one transformer layer saves for one microbatch on one device under ``recompute``
    (Recompute codes), dense and MoE layers averaged by their share (Korthikanti et al. 2022 Eq. 1-2)."""
    lay = sh.layout
    s = float(work.seq_len)
    kw = dict(flash=c["flash"].astype(bool), gemm_input_bytes=sh.gemm_input_bytes,
              low_precision=c["storage"] == Storage.DEEPSEEK)
    args = (spec, s / lay.cp, np.maximum(c["micro_batch"], 1), lay.tp, c["sp"].astype(bool), recompute)
    per_layer = activation_bytes_per_layer(*args, **kw)
    if spec.moe:
        per_layer = per_layer * (1 - sh.moe_frac) + sh.moe_frac * activation_bytes_per_layer(*args, moe_layer=True,
                                                                                              **kw)
    return per_layer


def activation_swap(spec: TransformerSpec, c: dict, sh: Shape, work: TrainWorkload, per_layer=None):
    """One layer's activations of one microbatch by where they live (activation_offload.layer_swap), or
    None where no plan swaps (``per_layer``: the plan's layer_activation_bytes, when known)."""
    share = np.asarray(c["activation_offload"], dtype=float)
    if not np.any(share > 0):
        return None
    kept = layer_activation_bytes(spec, c, sh, work, c["recompute"]) if per_layer is None else per_layer
    whole = layer_activation_bytes(spec, c, sh, work, Recompute.NONE)
    return layer_swap(kept, whole, share, c["recompute"] == Recompute.FULL)


def _in_hbm(place, part_bytes):
    """The bytes of a part where its place is HBM (code 0), else 0: the bytes themselves when every
    plan keeps the part in HBM (a search's lattice) and the places add no dimension."""
    if np.any(place) or np.ndim(place) > np.ndim(part_bytes):
        return np.where(place == Place.HBM, part_bytes, 0.0)
    return part_bytes


def _first_largest(values: list) -> np.ndarray:
    """Per row, the index of the first of ``values`` (arrays of equal shape or scalars, none NaN)
    that is largest: ``np.argmax`` over them stacked, without the stack (a strided reduction)."""
    index, largest = np.zeros(np.broadcast(*values).shape, dtype=np.intp), values[0]
    for i, value in enumerate(values[1:], start=1):
        larger = value > largest
        index, largest = np.where(larger, i, index), np.where(larger, value, largest)
    return index


def _first_largest_value(values: list) -> np.ndarray:
    """Per row, the largest of ``values`` (arrays of equal shape or scalars)."""
    largest = values[0]
    for value in values[1:]:
        largest = np.maximum(largest, value)
    return largest


def _stage_candidates(spec: TransformerSpec, lay: Layout, num_micro, interleave, ends, dualpipe) -> list[tuple]:
    """(stage, layer-microbatches of activations in flight, dense and routed-expert parameters) of
    each stage that may be the fullest: the first (the most microbatches in flight), the second
    (with the embedding's slot in the split it may hold more), the first of the longer stages, the
    last (the head and its logits). DualPipe keeps PP + 1 microbatches in flight on every rank
    (DeepSeek-V3 report, Table 2). A search's plans share few layouts: each is evaluated once."""
    def terms(tp, cp, dp, pp, ep, etp, num_micro, interleave, ends, dualpipe) -> list[np.ndarray]:
        layout = Layout(tp, cp, dp, pp, ep, etp)
        _, r = stage_layers(spec.num_layers, pp, ends, spec.mtp_layers)
        last = pp - 1
        out = []
        for stage in (0.0, np.minimum(1.0, last), np.minimum(pp - r, last), last):
            layers = layers_on_stage(spec.num_layers, pp, stage, ends, spec.mtp_layers)
            flight = np.where(dualpipe, np.minimum(pp + 1.0, num_micro) * layers,
                              in_flight_layers(layers, stage, pp, num_micro, interleave, ends & (stage == 0)))
            out += [stage, flight, *layout.params_per_device(spec, layers, stage == 0, stage == last)]
        return out

    values = on_distinct(terms, lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, num_micro, interleave, ends, dualpipe)
    return [tuple(values[i:i + 4]) for i in range(0, len(values), 4)]


def _tier_bytes(machine: Machine, name: str, c: dict, parts: dict, shape: tuple) -> np.ndarray:
    """Bytes per device (an array of ``shape``) the offloaded parts keep in tier ``name`` (a DDR+CXL
    place its share); ``parts`` holds at least the parts some plan offloads."""
    out = np.zeros(shape)
    if name == "ddr" and SWAPPED in parts:   # swapped activations live in the host's DDR
        out = out + parts[SWAPPED]
    share = interleave_share(machine, name)
    for place, part in _OFFLOADABLE:
        if not np.any(c[place]):              # every plan keeps this part in HBM
            continue
        here = (c[place] == PLACES.index(name)) + (c[place] == Place.DDR_CXL) * share
        if np.any(here):                      # a search's lattice keeps every part in HBM
            out = out + parts[part] * here
    return out


GRADS_WITH_OPTIMIZER = "gradient offload needs the optimizer states offloaded to the same tier"


_OFFLOADABLE = (("param_place", "weights"), ("grad_place", "gradients"), ("optimizer_place", "optimizer states"))


def _feasibility(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, mem: Memory, work: TrainWorkload):
    """(code, shortfall, names): the first rule each plan breaks, in the order a planner reads them."""
    lay = sh.layout
    gb, s = float(work.global_batch), float(work.seq_len)
    mb, v = np.maximum(c["micro_batch"], 1), np.maximum(c["interleave"], 1)
    rules = FirstBroken(np.shape(mem.hbm_used))
    violate = rules.rule
    violate(lay.devices != machine.devices, "devices", lay.devices - machine.devices)
    violate(gb % (mb * lay.dp) != 0, f"global batch ({gb:g}) divisible by micro batch x dp", mb * lay.dp)
    violate(spec.num_heads % lay.tp != 0, "tp divides heads", lay.tp)
    violate((lay.ep > 1) & (spec.moe is None), "ep needs an MoE model", lay.ep)
    if spec.moe:
        violate(spec.moe.num_experts % lay.ep != 0, "ep divides experts", lay.ep)
        violate(spec.moe.expert_ffn_hidden_size % lay.etp != 0, "etp divides the expert hidden size", lay.etp)
        violate(~lay.folds, "ep x etp (etp defaults to tp: --etp 1 keeps experts whole) divides tp x cp x dp", lay.ep * lay.etp)
    violate(s % lay.cp != 0, "cp divides sequence", lay.cp)
    # Ulysses hands each cp rank whole heads of its TP rank's share (MLA trains as full heads).
    kv_heads = spec.num_heads if spec.mla else spec.kv_heads
    ulysses = (c["cp_comm"] == CpComm.A2A) & (lay.cp > 1)
    if np.any(ulysses):                       # the heads' split, only where Ulysses runs
        ulysses = ulysses & (((spec.num_heads // lay.tp) % lay.cp != 0)
                             | (np.maximum(kv_heads // lay.tp, 1) % lay.cp != 0))
    violate(ulysses, "cp a2a (Ulysses) needs cp to divide the query and KV heads of a TP rank", lay.cp)
    # Uneven splits are allowed (the longest stage holds ceil(L / pp) layers and sets the pace).
    violate(lay.pp * v > spec.num_layers + (2 + spec.mtp_layers) * sh.ends,
            "pp x interleave at most the pipeline's slots (the layers; with the ends as layers 2 and the MTP depths "
            "more)", lay.pp * v)
    violate(sh.layers < 0, "the last stage has a slot for the loss and each MTP depth", -sh.layers)
    violate((v > 1) & (sh.num_micro % lay.pp != 0), "interleaving needs microbatches divisible by pp", sh.num_micro)
    violate((c["storage"] == Storage.DEEPSEEK) & (c["precision"] != PRECISIONS.index("fp8")),
            "DeepSeek's low-precision storage caches FP8 activations: it needs fp8 GEMMs", c["precision"])
    dualpipe = c["schedule"] == Schedule.DUALPIPE
    if np.any(dualpipe):                      # its pairing rules, only where DualPipe runs
        dualpipe = dualpipe & ((lay.pp % 2 != 0) | (sh.num_micro % 2 != 0) | (v > 1))
    violate(dualpipe, "DualPipe needs an even pp, an even number of microbatches and no interleaving", lay.pp)
    # Offload follows DeepSpeed: optimizer states with ZeRO >= 1 (ZeRO-Offload), gradients with
    # ZeRO >= 2 (partitioned before they leave) and with the optimizer states, parameters with
    # ZeRO-3 (ZeRO-Infinity).
    zero = c["zero"]
    violate((c["optimizer_place"] > 0) & (zero < 1), "optimizer offload needs zero >= 1", zero)
    violate((c["grad_place"] > 0) & (zero < 2), "gradient offload needs zero >= 2", zero)
    # DeepSpeed has no gradient offload of its own: offload_optimizer moves the fp32 gradient
    # partitions to where the optimizer step runs, with the optimizer states.
    violate((c["grad_place"] > 0) & (c["grad_place"] != c["optimizer_place"]), GRADS_WITH_OPTIMIZER,
            c["optimizer_place"])
    violate((c["param_place"] > 0) & (zero < 3), "parameter offload needs zero 3", zero)
    for mask, name, amount in sh.sharding.rules(zero, *(c[k] for k in SHARDING_FIELDS)):
        violate(mask, name, amount)
    # The offloaded gradients are the optimizer's partition (ZeRO-Offload moves each rank's reduced
    # shard to where its optimizer step runs), so they cannot be sharded over a smaller group.
    violate((c["grad_place"] > 0) & (sh.sharding.grads != sh.sharding.optimizer),
            "gradient offload needs the gradients sharded as the optimizer states", sh.sharding.grads)
    violate(mem.hbm_used > machine.hbm_bytes, "hbm", mem.hbm_used - machine.hbm_bytes)
    for name in TIERS:
        capacity = _tier_capacity(machine, name)
        violate(mem.tier_bytes[name] > capacity, name, mem.tier_bytes[name] - capacity)
    return rules.code, rules.shortfall, tuple(rules.names)


def _kind_bandwidth(machine: Machine, kind: str, direction: str) -> float:
    """Per-device bandwidth of the first tier of ``kind`` ("read", "write" over the device's path;
    "host": the memory's own, as the host CPU reads it); 0 when the system has none."""
    tier = next((t for t in machine.memory_tiers if t.kind == kind), None)
    return getattr(tier, f"{direction}_bytes_per_s") if tier else 0.0


def interleave_share(machine: Machine, kind: str) -> float:
    """Share of an interleaved state (DDR + CXL) that lives in ``kind``: in proportion to each
    memory's bandwidth, so that a pass over the state (the CPU optimizer step) reads both at once and
    ends on both together (bandwidth-weighted interleaving, as Linux's weighted-interleave memory
    policy does for CXL memory: MPOL_WEIGHTED_INTERLEAVE, Linux 6.9)."""
    kinds = INTERLEAVED["ddr+cxl"]
    if kind not in kinds:
        return 0.0
    total = sum(_kind_bandwidth(machine, k, "host") for k in kinds)
    return _kind_bandwidth(machine, kind, "host") / total if total > 0 else 0.0


def _tier_bandwidth(machine: Machine, place_code, direction: str):
    """Per-device bandwidth of the tier each plan places a state in (HBM for code 0). An interleaved
    state is read at the sum of its memories' bandwidths by the CPU, and over the device's one host
    path (at most that path's rate) by the device."""
    table = [machine.hbm_bytes_per_s]
    for name in PLACES[1:]:
        kinds = INTERLEAVED.get(name, (name,))
        bw = sum(_kind_bandwidth(machine, k, direction) for k in kinds)
        if len(kinds) > 1 and direction != "host" and machine.host_bytes_per_s:
            bw = min(bw, machine.host_bytes_per_s)
        # A missing tier gets 1 byte/s: any plan placing state there fails its capacity check (0 bytes).
        table.append(bw if all(_kind_bandwidth(machine, k, "read") for k in kinds) else 1.0)
    return np.asarray(table)[np.asarray(place_code)]


def _tier_capacity(machine: Machine, kind: str) -> float:
    return sum(t.bytes_per_device for t in machine.memory_tiers if t.kind == kind)
