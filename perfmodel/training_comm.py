"""Communication of a training step and what of it compute hides (perfmodel.training).

TP, CP, EP, PP and ZeRO collectives per layer and pass (Narayanan et al. 2021, Sec. 3.2; Korthikanti
et al. 2022, Sec. 4; Ring Attention; GShard; ZeRO and MiCS; Zhao et al., PyTorch FSDP, VLDB 2023),
the step's tail (gradient synchronization, the optimizer, offload transfers), and the overlap of
each with the compute it runs under.
"""

from __future__ import annotations

import numpy as np

from .layout import Layout
from .machine import Machine
from .memory import GRAD_BYTES, WEIGHT_BYTES, state_bytes_per_param
from .model import TransformerSpec
from .plan import CpComm, Dispatcher, Overlap, Place, Recompute, Schedule
from .sharding import QGZ_BYTES, Sharding
from .activation_offload import layer_lag, recompute_kept, swap_seconds
from .training_memory import _tier_bandwidth, activation_swap
from .training_terms import Communication, Compute, Exposure, Shape, StepTail, TrainWorkload
from .transformer_pass import stage_handoff_s, tp_all_reduces_s


def _communication(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, comp: Compute,
                   stage_params: tuple, work: TrainWorkload) -> Communication:
    """Collectives of one microbatch on the busiest stage (Narayanan et al. 2021 Sec. 3.2 and 4.1;
    Korthikanti et al. 2022 Sec. 4; GShard / DeepSpeed-MoE; Ring Attention; ZeRO-3 and
    ZeRO-Infinity), each over its layout group's slowest link."""
    lay, topo, h = sh.layout, machine.topology, spec.hidden_size
    full = c["recompute"] == Recompute.FULL
    act = sh.tokens * h * 2.0                    # one layer's activation, bf16, per TP group
    passes = 4.0 + 2.0 * full                    # 2 forward + 2 backward (+2 in the recomputed forward)
    swap = activation_swap(spec, c, sh, work)
    if swap is not None:   # the swapped tokens' recomputed forward does not run (activation_offload)
        passes = 4.0 + 2.0 * full * recompute_kept(c["activation_offload"], True)
    tp = tp_all_reduces_s(topo, lay, comp.layers, act, passes)
    ep = 0.0
    if spec.moe:
        # Each device dispatches the rows it holds (tokens x etp / tp) to top-k experts, busiest load,
        # in bf16, as the plan's dispatcher does it. Megatron-Core's alltoall: an NCCL all-to-all of
        # every token-expert copy to its rank (Topology.moe_all_to_all, the link model). The flex
        # dispatcher's backends, DeepEP and HybridEP, and DualPipe (DeepSeek's own training, on
        # DeepEP): DeepEP's normal kernels, a token across nodes once per node holding its experts and
        # forwarded inside over NVLink (Topology.normal_exchange: fitted on measured DeepEP normal
        # kernels where the device has a fit, else the link model with that deduplication). Each
        # pass runs a dispatch and a combine (the backward's dispatch is the forward's combine
        # reversed).
        rows = lay.expert_rows(sh.tokens, 1) * sh.imbalance
        g = lay.ep_group
        alltoall = topo.moe_all_to_all(rows * h * 2.0, spec.moe.top_k, g.stride, g.size, deduplicated=False)
        flex = (np.asarray(c["schedule"]) == Schedule.DUALPIPE) | (np.asarray(c["dispatcher"]) != Dispatcher.ALLTOALL)
        if np.any(flex):
            normal = 0.5 * sum(topo.normal_exchange(op, rows, h * 2.0, spec.moe.top_k, spec.moe.num_experts, g.stride,
                                                    g.size) for op in ("dispatch", "combine"))
            alltoall = np.where(flex, normal, alltoall)
        ep = comp.layers * sh.moe_frac * passes * alltoall
    cp = comp.layers * _cp_exchange(spec, topo, c["cp_comm"], sh.tokens, lay) * (lay.cp > 1)
    # Scatter-gather: each TP rank sends 1/t, then an all-gather (Narayanan et al. Sec. 4.1).
    pp = 2.0 * np.maximum(c["interleave"], 1) * stage_handoff_s(topo, lay, act)

    dense, expert = stage_params
    zero3 = c["zero"] >= 3
    # ZeRO-3 / FSDP gathers and reduce-scatters one layer (one FSDP unit) at a time: each pass
    # runs one collective per layer of a layer's parameters (Zhao et al., "PyTorch FSDP", VLDB
    # 2023: one all-gather per unit in the forward and in the backward, one
    # reduce-scatter per unit in the backward; DeepSpeed ZeRO-3 likewise per submodule), so
    # each collective pays its latency once per layer, at the layer's shard size.
    layers = np.maximum(comp.layers, 1.0)
    forward, backward = _dense_gathers(machine, lay, sh.sharding, dense / layers, full)
    gathers_forward = layers * forward
    gathers = gathers_forward + layers * backward
    scatters = layers * _dense_scatters(machine, lay, sh.sharding, dense / layers)
    if spec.moe:  # routed experts: flat ZeRO-3 over their expert-data-parallel group, per MoE layer
        moe_layers = np.maximum(comp.layers * sh.moe_frac, 1.0)
        expert_gather = moe_layers * topo.all_gather(expert / moe_layers * WEIGHT_BYTES, lay.edp_group.stride,
                                                     lay.edp_group.size)
        gathers_forward = gathers_forward + expert_gather
        gathers = gathers + (2.0 + full) * expert_gather
        scatters = scatters + moe_layers * topo.reduce_scatter(expert / moe_layers * GRAD_BYTES,
                                                               lay.edp_group.stride, lay.edp_group.size)
    # Sharded gradients (ZeRO-2 and 3) are reduce-scattered in every microbatch's backward: a rank
    # holds only its shard, so each microbatch's gradient is reduced before the next one's arrives
    # (Megatron-FSDP, core_v0.19.0 megatron_fsdp.py _process_post_backward_gradients: 'With
    # gradient-sharding strategies, gradient reduction occurs on every backward propagation';
    # DeepSpeed refuses no_sync under ZeRO-2, engine.py; PyTorch FSDP's SHARD_GRAD_OP likewise
    # outside no_sync).
    gathers, scatters = np.where(zero3, gathers, 0.0), np.where(c["zero"] >= 2, scatters, 0.0)
    gathers_forward = np.where(zero3, gathers_forward, 0.0)
    fetch_bytes = (dense / sh.sharding.weights + expert / np.where(zero3, lay.edp, 1.0)) * WEIGHT_BYTES * (2.0 + full)
    fetch = np.where(c["param_place"] > 0, fetch_bytes / _tier_bandwidth(machine, c["param_place"], "read"), 0.0)
    if swap is None:
        return Communication(tp, ep, cp, pp, gathers, gathers_forward, scatters, fetch)
    # The busiest stage's layers swap out in the forward and back in the backward, over the host path.
    host = swap.host * comp.layers
    return Communication(tp, ep, cp, pp, gathers, gathers_forward, scatters, fetch,
                         swap_seconds(host, _tier_bandwidth(machine, Place.DDR, "write")),
                         swap_seconds(host, _tier_bandwidth(machine, Place.DDR, "read")))


def _cp_exchange(spec: TransformerSpec, topo, cp_comm, tokens, lay: Layout):
    """One layer's context-parallel traffic for one microbatch, forward and backward, bf16
    (plan.CpComm). The ring passes the local K and V (cp - 1) steps forward and K, V and their
    gradients backward; the all-gather variant gathers K and V in the forward and again in the
    backward and reduce-scatters their gradients; Ulysses all-to-alls Q, K, V and the output in
    the forward and their gradients in the backward."""
    kv_w = 2.0 * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim if spec.mla else spec.kv_heads * spec.dim_head)
    kv = tokens * kv_w / lay.tp * 2.0                        # this rank's K and V, bytes
    group = lay.cp_group
    ring = (lay.cp - 1) * topo.p2p(kv, group.stride) * 3.0
    gathering, ulysses = cp_comm == CpComm.ALL_GATHER, cp_comm == CpComm.A2A
    gathered = heads = 0.0                   # each variant's traffic only where some plan runs it
    if np.any(gathering):
        gathered = 2.0 * topo.all_gather(kv * lay.cp, group.stride, group.size) \
            + topo.reduce_scatter(kv * lay.cp, group.stride, group.size)
    if np.any(ulysses):
        q_w = spec.num_heads * (spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim if spec.mla else spec.dim_head)
        out_w = spec.num_heads * (spec.mla.v_head_dim if spec.mla else spec.dim_head)
        heads = 2.0 * (topo.all_to_all(tokens * q_w / lay.tp * 2.0 + kv, group.stride, group.size)
                       + topo.all_to_all(tokens * out_w / lay.tp * 2.0, group.stride, group.size))
    return np.select([gathering, ulysses], [gathered, heads], ring)


def _dense_gathers(machine: Machine, lay: Layout, s: Sharding, dense, full) -> tuple:
    """ZeRO-3's weight all-gathers of ``dense`` parameters (one layer's) for one microbatch (s), as
    (forward, backward): forward over the weights' group, backward (and the recomputed forward)
    over the same group, or inside hpZ's secondary partition in bf16 (ZeRO++ Sec. 3.2); with qwZ
    every primary gather sends int8 (Sec. 3.1) and pays its kernels' HBM passes: each rank
    quantizes its shard (read 2, write 1 byte per element), each receiver dequantizes the
    gathered weights (read 1, write 2)."""
    topo = machine.topology
    primary, secondary = lay.replica_subgroup(s.weights), lay.replica_subgroup(s.secondary)
    hpz = s.secondary < s.weights
    forward = topo.all_gather(dense * s.weight_gather_bytes, primary.stride, primary.size)
    backward = np.where(hpz, topo.all_gather(dense * WEIGHT_BYTES, secondary.stride, secondary.size), forward)
    kernel = np.where(s.qwz & (s.weights > 1), 3.0 * (dense + dense / s.weights), 0.0) / machine.hbm_bytes_per_s
    return forward + kernel, (1.0 + full) * backward + np.where(hpz, 0.0, 1.0 + full) * kernel


def _reduce_scatter(machine: Machine, group, s: Sharding, grad_bytes):
    """A gradient reduce-scatter of ``grad_bytes`` (bf16) over ``group``: a ring, or with qgZ two
    int4 all-to-alls, inside the fast level then across (ZeRO++ Sec. 3.3), plus its kernels' HBM
    passes per bf16 element: quantize (read 2, write 0.5 bytes), then after each hop read what
    arrived and write the reduced slice (0.5 + 0.5 / k, 0.5 / k + 2 / n)."""
    topo = machine.topology
    ring = topo.reduce_scatter(grad_bytes, group.stride, group.size)
    quantizing = s.qgz & (group.size > 1)
    quantized = 0.0                          # the qgZ path only where some plan takes it
    if np.any(quantizing):
        elements = np.asarray(grad_bytes, dtype=float) / GRAD_BYTES
        k = topo.inner_members(group.stride, group.size)
        passes = elements * (2.5 + 0.5 + 1.0 / k + 2.0 / group.size)
        quantized = topo.two_hop_reduce_scatter(elements * QGZ_BYTES, group.stride, group.size) \
            + passes / machine.hbm_bytes_per_s
    return np.where(quantizing, quantized, ring)


def _dense_scatters(machine: Machine, lay: Layout, s: Sharding, dense):
    """ZeRO-3's gradient reduce-scatter of one microbatch (s), inside the gradients' group."""
    return _reduce_scatter(machine, lay.replica_subgroup(s.grads), s, dense * GRAD_BYTES)


def _dense_step_sync(machine: Machine, lay: Layout, s: Sharding, zero, dense):
    """The dense gradients' reduction and the updated weights' return, once per step (s), level by
    level. Gradients: stages 2 and 3 reduce-scattered them inside the gradients' group with every
    microbatch (_communication); each gradient shard is reduce-scattered across the gradients'
    groups of one optimizer group, then all-reduced across optimizer groups (MiCS's second hop).
    After the update, weights return to their shards: all-gathered across the gradients' groups,
    then across the weights' groups inside one (the three-level scheme's levels in reverse). Over
    the whole group, per step: stage 1 one all-reduce, stage 2 an all-gather, stage 3 nothing more
    (Rajbhandari et al. 2020, Sec. 7, with the reduce-scatter in every microbatch)."""
    topo = machine.topology
    r, o, g, w = s.replicas, s.optimizer, s.grads, s.weights
    grads, weights = dense * GRAD_BYTES, dense * WEIGHT_BYTES
    across = lay.replica_subgroup(o / g, every=g)
    replicas = lay.replica_subgroup(r / o, every=o)
    back_across, back_inside = lay.replica_subgroup(o / g, every=g), lay.replica_subgroup(g / w, every=w)
    reduce = _reduce_scatter(machine, across, s, grads / g) + topo.all_reduce(grads / o, replicas.stride, replicas.size)
    gather = topo.all_gather(weights / g, back_across.stride, back_across.size) \
        + topo.all_gather(weights / w, back_inside.stride, back_inside.size)
    whole = lay.replica_group
    return np.where((zero == 1) & (o == r), topo.all_reduce(grads, whole.stride, whole.size), reduce + gather)


def _step_tail(spec: TransformerSpec, machine: Machine, c: dict, sh: Shape, comp: Compute,
               stage_params: tuple) -> StepTail:
    """Gradient reduction (bucketed under the last backward; Li et al., VLDB 2020, Sec. 3.2.3),
    offloaded gradients and updated weights over the host path (ZeRO-Offload, Ren et al. 2021,
    Sec. 4.1), and the Adam step on the device or on the CPU over the states' tier."""
    lay, topo = sh.layout, machine.topology
    dense, expert = stage_params
    zero = c["zero"]
    edp = lay.edp_group
    o = sh.sharding.optimizer
    dp = _dense_step_sync(machine, lay, sh.sharding, zero, dense)
    if spec.moe:   # routed experts, flat over their group: stage 2 returns the updated weights (its
        # gradients were reduce-scattered with every microbatch), stage 1 all-reduces.
        dp = dp + np.select([zero >= 3, zero == 2], [0.0, topo.all_gather(expert * WEIGHT_BYTES, edp.stride, edp.size)],
                            topo.all_reduce(expert * GRAD_BYTES, edp.stride, edp.size))
    dp_overlap = machine.constants.dp_overlap_fraction * c["overlap_dp"].astype(bool)

    opt_params = dense / o + expert / np.where(zero >= 1, lay.edp, 1.0)
    weight_bytes, grad_bytes, state_bytes = state_bytes_per_param(c["storage"])
    adam_bytes = opt_params * (state_bytes * 2 + grad_bytes + weight_bytes * 2)     # states read and written
    on_device = c["optimizer_place"] == Place.HBM
    host_link = machine.host_bytes_per_s or np.inf
    # Over the device's host path: gradients out and updated weights back when the optimizer runs on
    # the CPU, or the reduced gradient partition to its tier when gradients are offloaded (the one the
    # CPU step then reads: it crosses once).
    gradients_out = np.where(on_device | (c["grad_place"] > 0), 0.0, opt_params * GRAD_BYTES / host_link)
    weights_back = np.where(on_device, 0.0, opt_params * WEIGHT_BYTES / host_link)
    grad_partition = (dense / o + expert / lay.edp) * GRAD_BYTES
    grad_io = np.where(c["grad_place"] > 0, grad_partition / _tier_bandwidth(machine, c["grad_place"], "write"), 0.0)
    # Off the device the step runs on the host CPU over the states where they lie: at the memory's own
    # bandwidth (DeepSpeedCPUAdam is memory-bound; Ren et al. 2021, 'Optimized CPU execution'), not
    # over the device's path.
    optimizer = np.where(on_device, adam_bytes / machine.hbm_bytes_per_s,
                         adam_bytes / _tier_bandwidth(machine, c["optimizer_place"], "host"))
    return StepTail(dp, dp_overlap, gradients_out + grad_io, optimizer, on_device, weights_back)


def _overlap(c: dict, sh: Shape, comp: Compute, comm: Communication, tail: StepTail, held: float = 0.0,
             breakdown: bool = True, tp_held: float = 0.0, collective_held: float = 0.0) -> Exposure:
    """What each transfer leaves exposed, with every compute window spent once.

    Framework (Megatron-LM / DeepSpeed schedules): TP all-reduces block compute unless TP-comm
    overlap pipelines all but one chunk of them with the layer's GEMMs (with sequence
    parallelism); the CP ring passes K and V under the attention it feeds (Liu et al., Ring
    Attention, 2023); EP dispatch and combine block (Megatron's default); ZeRO-3 gathers and
    parameter streaming prefetch the next layer under the compute of its phase, each on its own
    link, except each phase's first layer's; the pipeline's point-to-point messages block, except
    in an interleaved schedule, where only the warm-up's and the flush's do (Megatron's
    overlap_p2p_comm). Once per step, the gradient reduction hides under the last backward on the
    network while offload transfers use the host path. Transfers hiding under one window add up
    on it, so a faster device or format never makes a step slower. None: every transfer exposed.
    Ideal: every transfer under the whole compute (T_lower = max, as the scaling book writes it;
    T_upper = sum is ``none``).

    ZeRO-3 prefetch (``prefetch`` layers ahead, PyTorch FSDP's default 1: Zhao et al., VLDB 2023:
    backward and forward prefetching; DeepSpeed's stage3_prefetch_bucket_size): each
    layer's gather runs under the previous layer's compute, so a pass is as long as the slower
    of its compute and its network traffic, phase by phase (the forward's gathers under the
    forward; the backward's gathers, the recomputed forward's and the reduce-scatters under the
    backward and the recompute), after the phase's first layer's gather (_prefetch_exposure).
    Deeper prefetch holds more gathered layers (``_memory``) but with layers of one size runs no
    faster. Without prefetch (0) every gather blocks the compute that needs it.

    With ``ep_overlap`` the dispatch and combine of one microbatch run under another's compute
    (Megatron-Core's --overlap-moe-expert-parallel-comm, forward of one microbatch against the
    backward of the previous; DeepSeek-V3's DualPipe, DeepSeek-AI 2024, Sec. 3.2.1). The exchange
    kernels hold ``exchange-sms`` of the SMs while they run (Sec. 3.2.2), so the rest of the
    microbatch runs on fewer SMs for that long: the pair takes max(A, X + A h), A the exchange, X
    everything else, h the held share; never more than X + A. A pipeline's first microbatch has
    none before it to pair with and pays A in full.

    TP-communication overlap, as perfmodel's Megatron-LM export configures Transformer Engine's
    userbuffers: the all-gathers and the forward's reduce-scatters ring-exchange on the copy
    engines and leave the GEMMs every SM; the backward's reduce-scatters (bulk, under the weight
    gradients' GEMMs) hold ``tp_held`` of the SMs while they run, so that compute runs on fewer
    SMs for as long: the bulk transfers add ``tp_held`` times their time.

    No collective hides for free: the NCCL kernels of the CP ring, the ZeRO-3 gathers and
    reduce-scatters and the data-parallel reduction hold ``collective_held`` of the SMs while they
    run beside compute (Megatron-Bridge's performance guide reserves 16 SMs for the DP collectives
    and speaks of "the computing kernel slowdown from the overlap"), so a transfer A hidden under
    compute X takes max(A, X + A h), as the MoE exchange does; never more than X + A.
    """
    mode = c["overlap"]
    compute = comp.per_micro_s
    attention = comp.forward.seconds["attention core"] + comp.forward.backward["attention core"]
    others = compute - attention
    tp_overlapped = c["tp_overlap"].astype(bool) & c["sp"].astype(bool) & (sh.layout.tp > 1)
    # The overlap splits each all-gather and reduce-scatter into tp chunks around the GEMM it feeds
    # (Transformer Engine's userbuffers ring exchange; Wang et al., "Overlap Communication with
    # Dependent Computation via Decomposition", ASPLOS 2023, Sec. 3): the first chunk's gather and
    # the last chunk's scatter have no GEMM to hide under, 1 / tp of the transfer stays exposed.
    tp_hidden = np.where(tp_overlapped, comm.tp * (1.0 - 1.0 / np.maximum(sh.layout.tp, 1.0)), 0.0)
    # Two of each layer's 4 (full recompute: 6) reduce-scatter and all-gather pairs' 8 (12) transfers are bulk.
    margin = tp_hidden * tp_held / np.where(c["recompute"] == Recompute.FULL, 6.0, 4.0)
    if np.any(np.asarray(comm.swap) > 0):   # the swapped tokens' recomputed forward does not run
        margin = tp_hidden * tp_held / (4.0 + 2.0 * (c["recompute"] == Recompute.FULL)
                                        * recompute_kept(c["activation_offload"], True))
    # The first layer's gathers of each phase (the forward's first, the backward's first) are not prefetched.
    first = comm.zero3 / np.maximum(comp.layers, 1.0)
    # ZeRO-3's reduce-scatters share the gathers' link; when the reduction does not overlap the
    # backward (--no-dp-overlap) they also block compute.
    reduce_hidden = comm.zero3_reduce * tail.dp_overlap
    # Only the ring's messages run under the attention; the all-gather and the all-to-alls block it.
    ring = c["cp_comm"] == CpComm.P2P
    cp_part = np.where(ring, np.maximum(comm.cp, attention + comm.cp * collective_held), attention + comm.cp)
    rest = np.maximum(others + margin, tp_hidden) + cp_part + (comm.tp - tp_hidden) \
        + (comm.zero3_reduce - reduce_hidden)
    ep_exposed = _exposed_exchange(c, sh, comp, comm.ep, rest, rest - compute, held)
    main = rest + ep_exposed
    gathered, fetched = _prefetch_exposure(c, comp, comm, main, first, held=collective_held, split=breakdown)
    transfers = {"tp": comm.tp, "ep": comm.ep, "cp": comm.cp, "zero3": comm.zero3 + comm.zero3_reduce,
                 "param": comm.param_fetch}
    swapped = 0.0
    swapping = bool(np.any(np.asarray(comm.swap) > 0))
    if swapping:   # what the activation swap adds to the phases, on the host path beside streamed parameters
        with_swap = _prefetch_exposure(c, comp, comm, main, first, swap=True, held=collective_held, split=breakdown)
        swapped = sum(with_swap) - (gathered + fetched)
        transfers["activation"] = comm.swap
    framework = main + first + gathered + fetched + swapped
    none = compute + sum(transfers.values())
    ideal = np.maximum(compute, np.maximum.reduce(np.broadcast_arrays(*transfers.values())))
    if swapping:   # the swap and the streamed parameters share the host path
        ideal = np.maximum(ideal, comm.param_fetch + comm.swap)
    per_micro = np.select([mode == Overlap.NONE, mode == Overlap.IDEAL], [none, ideal], framework)

    micro = _attribution(mode, compute, cp_part - attention, others, comm, tp_hidden, margin, first, reduce_hidden,
                         gathered, fetched, transfers, ideal, ep_exposed, swapped) if breakdown else {}
    # Interleaved schedules overlap each chunk's pipeline messages with the next chunk's compute
    # (Megatron-LM's overlap_p2p_comm, on by default with a virtual pipeline; Megatron-Bridge sets it
    # whenever vp > 1): only the warm-up's and the flush's messages stay exposed.
    v = np.maximum(c["interleave"], 1)
    warm = np.minimum(2.0 * (sh.layout.pp - 1) + (v - 1) * sh.layout.pp, sh.num_micro * v)
    steady_hidden = np.where((v > 1) & (mode == Overlap.FRAMEWORK), warm / (sh.num_micro * v), 1.0)
    pp = np.where(mode == Overlap.IDEAL, 0.0, comm.pp * steady_hidden)

    # Once per step: the reduction on the network and the host transfers run side by side.
    # The last backward as it runs, stalls included; its links also carry that microbatch's own
    # transfers (parameters over the host path, ZeRO-3 traffic over the network), so only their
    # idle time is free for the step's transfers.
    backward = np.maximum(per_micro - comp.forward.total - comp.recompute_s, 0.0)
    host_window = np.minimum(backward, np.maximum(per_micro - (comm.param_fetch + comm.swap if swapping
                                                               else comm.param_fetch), 0.0))
    dp_window = np.minimum(tail.dp_overlap * backward, np.maximum(per_micro - comm.zero3 - comm.zero3_reduce, 0.0))
    dp_exposed = np.maximum(tail.dp - dp_window, 0.0) + collective_held * np.minimum(tail.dp, dp_window)
    host_exposed = np.maximum(np.maximum(tail.host - host_window, 0.0) - dp_exposed, 0.0)
    none_mode = mode == Overlap.NONE
    return Exposure(per_micro, micro, pp, {"dp": np.where(none_mode, tail.dp, dp_exposed),
                                           "host": np.where(none_mode, tail.host, host_exposed)})


def _exposed_exchange(c: dict, sh: Shape, comp: Compute, exchange, rest, blocking, held: float):
    """Per microbatch, what the MoE dispatch and combine (``exchange``, s, its four passes) add to the
    rest of the microbatch (``rest``, s, of which ``blocking`` is transfers on the compute stream):
    all of it, or with ``ep_overlap`` on the microbatches the schedule pairs, what the paired MoE
    layers' critical path (``one_f_one_b_layer``) adds to their compute, at least the slowdown of
    the SMs the exchange kernels hold (``held``; see _overlap). DualPipe (DeepSeek-V3 Sec. 3.2.1,
    Fig. 4) arranges its chunk's components to hide the exchange whole: max(A, X + A h) - X over
    the whole microbatch.

    Unpaired are a pipeline's first microbatch and the warm-up's forwards and the flush's backwards
    of the busiest (last) stage, (v - 1) pp of the m v chunks of an interleaved schedule (Megatron-Core
    get_pp_rank_microbatches); their exchange blocks."""
    overlapped = c["ep_overlap"].astype(bool) & (sh.layout.ep > 1)
    moe = sh.moe_frac
    fwd, bwd = comp.forward.seconds, comp.forward.backward
    side = ("qkv projection", "attention core", "output projection", "norms and activations")
    # Each MoE layer's two compute nodes (core_v0.19.0 fine_grained_callables): before the dispatch
    # (norms, attention, router) and the experts (permute, grouped GEMMs, unpermute); the compute
    # stream's blocking transfers (TP, CP) and the recompute belong to the first.
    attention_f = moe * (sum(fwd.get(k, 0.0) for k in side) + blocking / 3.0) + fwd.get("router", 0.0)
    attention_b = moe * (sum(bwd.get(k, 0.0) for k in side) + 2.0 * blocking / 3.0 + comp.recompute_s) \
        + bwd.get("router", 0.0)
    experts_f = fwd.get("experts", 0.0) + fwd.get("expert permute", 0.0)
    experts_w = 0.5 * bwd.get("experts", 0.0)          # the weight gradients' GEMMs, as many FLOPs as the data's
    experts_b = bwd.get("experts", 0.0) - experts_w + bwd.get("expert permute", 0.0)
    paired_compute = attention_f + attention_b + experts_f + experts_b + experts_w
    path = one_f_one_b_layer(attention_f, attention_b, experts_f, experts_b, experts_w, exchange / 4.0)
    layered = np.maximum(path, paired_compute + exchange * held) - paired_compute
    whole = np.maximum(exchange, rest + exchange * held) - rest
    paired = np.where(np.asarray(c["schedule"]) == Schedule.DUALPIPE, whole, layered)
    chunks = sh.num_micro * np.maximum(c["interleave"], 1)
    unpaired = np.maximum((np.maximum(c["interleave"], 1) - 1) * sh.layout.pp, 1.0)
    share = np.where(overlapped, np.maximum(chunks - unpaired, 0.0) / np.maximum(chunks, 1.0), 0.0)
    return exchange - share * (exchange - paired)


def one_f_one_b_layer(attention_f, attention_b, experts_f, experts_b, experts_w, exchange):
    """The time of one MoE layer of a microbatch's forward paired with another's backward, as
    Megatron-Core schedules the pair on two CUDA streams (core_v0.19.0,
    TransformerLayerSchedulePlan.run: "comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd |
    combine_fwd; comp_stream: pre_dispatch_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | pre_dispatch_bwd"),
    each node starting when its stream is free and its input has arrived. ``attention_*``: the
    pre-dispatch node forward / backward (s); ``experts_f``, ``experts_b``, ``experts_w``: the
    experts' forward, data and weight gradients; ``exchange``: one dispatch or combine. The pair
    takes at least its compute and at least its four exchanges, and more where one waits on the
    other: a microbatch's forward still runs attention, dispatch, experts, combine in order."""
    combine_b = exchange                                          # on the comm stream from the start
    grad_ready = np.maximum(attention_f, combine_b)
    data_grad = grad_ready + experts_b                            # mlp_bwd, after its gradient arrives
    dispatch_f = np.maximum(combine_b, attention_f) + exchange    # after the attention forward
    weight_grad = data_grad + experts_w
    dispatch_b = np.maximum(dispatch_f, data_grad) + exchange     # after the experts' data gradient
    forward = np.maximum(weight_grad, dispatch_f) + experts_f     # mlp_fwd, once its tokens arrive
    both = np.maximum(dispatch_b, forward)
    # combine_fwd (comm) and pre_dispatch_bwd (comp) both wait on the experts' forward and the
    # backward dispatch; the next layer waits on both.
    return both + np.maximum(exchange, attention_b)


def _prefetch_exposure(c: dict, comp: Compute, comm: Communication, main, first, swap: bool = False,
                       held: float = 0.0, split: bool = True) -> tuple:
    """(ZeRO-3 traffic, streamed parameters) each microbatch exposes beyond ``main`` (the
    microbatch's compute and blocking transfers, s) and ``first``, the gathers of each phase's
    first layer (its forward share: the forward's).

    With prefetch (depth >= 1) each phase lasts max(its share of ``main``, its network traffic,
    its parameter streaming): the forward's gathers (after the first) under the forward share,
    the backward's and the recomputed forward's gathers plus the reduce-scatters under the rest;
    the phase's excess belongs to the longer transfer. The network's collectives hold ``held`` of the
    SMs while they run (see _overlap), so the compute share under them lasts share + held x traffic;
    the streamed parameters move on the copy engines and hold none. Without prefetch the gathers and the
    streaming block (a + G_f + P_f + max(b, R) + G_b + P_b: only the reduce-scatters run under
    the backward), never less than with it. The forward share is the forward's part of the
    compute (Compute.forward over per_micro_s). Without ``split`` (the search's mode) the first
    element is the sum and the second 0.

    With ``swap`` the host path also carries the activation swap (activation_offload): out in the
    forward, back in the backward, each layer's under the next layer's compute, so a phase lasts at
    least one layer's share of it plus everything on the host path (layer_lag); without prefetch the
    streamed parameters block and the swap runs beside the rest of the phase."""
    full = c["recompute"] == Recompute.FULL
    share = comp.forward.total / np.maximum(comp.per_micro_s, 1e-30)
    ahead, behind = share * main, (1.0 - share) * main
    fetch_forward = comm.param_fetch / (2.0 + full)           # one of the 2 (+1 recomputed) passes
    fetch_backward = comm.param_fetch - fetch_forward
    swap_forward = swap_backward = 0.0
    if swap:
        swap_forward = comm.swap_out + layer_lag(ahead, comp.layers, comm.swap_out)
        swap_backward = comm.swap_in + layer_lag(behind, comp.layers, comm.swap_in)
        fetch_forward, fetch_backward = fetch_forward + swap_forward, fetch_backward + swap_backward
    first_forward = first * comm.zero3_forward / np.maximum(comm.zero3, 1e-30)
    net_forward = comm.zero3_forward - first_forward
    net_backward = comm.zero3 - comm.zero3_forward - (first - first_forward) + comm.zero3_reduce
    slowed_forward, slowed_backward = held * net_forward, held * net_backward
    excess_forward = np.maximum(ahead + slowed_forward, np.maximum(net_forward, fetch_forward)) - ahead
    excess_backward = np.maximum(behind + slowed_backward, np.maximum(net_backward, fetch_backward)) - behind
    prefetching = np.asarray(c["prefetch"]) >= 1
    blocking = comm.zero3 - first + np.maximum(behind, comm.zero3_reduce) - behind
    streamed = comm.param_fetch
    if swap:
        streamed = streamed + np.maximum(swap_forward - ahead, 0.0) + np.maximum(swap_backward - behind, 0.0)
    if not split:   # the search's mode: only the sum counts
        return np.where(prefetching, excess_forward + excess_backward, blocking + streamed), 0.0
    lead_forward, lead_backward = net_forward >= fetch_forward, net_backward >= fetch_backward
    # Where the streaming leads, the gathers' own share is the slowdown of the SMs they hold.
    own_forward = np.where(lead_forward, excess_forward, np.minimum(excess_forward, slowed_forward))
    own_backward = np.where(lead_backward, excess_backward, np.minimum(excess_backward, slowed_backward))
    gathered = own_forward + own_backward
    fetched = excess_forward - own_forward + excess_backward - own_backward
    return np.where(prefetching, gathered, blocking), np.where(prefetching, fetched, streamed)


def _attribution(mode, compute, cp_exposed, others, comm, tp_hidden, margin, first, reduce_hidden, gathered, fetched,
                 transfers, ideal, ep_exposed, swapped=0.0) -> dict[str, np.ndarray]:
    """Which transfer each exposed second belongs to, for the breakdown (the totals are _overlap's;
    the SMs the bulk TP transfers hold count as TP communication)."""
    framework = {"tp": (comm.tp - tp_hidden) + np.maximum(others + margin, tp_hidden) - others,
                 "cp": cp_exposed, "ep": ep_exposed,
                 "zero3": first + (comm.zero3_reduce - reduce_hidden) + gathered,
                 "param": fetched, "activation": swapped}
    largest = np.argmax(np.stack(np.broadcast_arrays(*transfers.values())), axis=0)
    return {k: np.select([mode == Overlap.NONE, mode == Overlap.IDEAL],
                         [transfers[k], np.where(largest == i, ideal - compute, 0.0)], framework[k])
            for i, k in enumerate(transfers)}
