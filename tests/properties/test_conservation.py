"""Conservation laws every plan obeys, over random valid plans of every model family and system kind.

- FLOPs: summed over devices, the FLOPs the operators compute equal the model's (causal with
  FlashAttention), and recompute adds exactly what it runs again.
- Bytes: summed over every device of every pipeline stage, weights, gradients and optimizer states
  are at least the model's (equal when nothing is replicated); in serving, weights per device x
  devices are at least the model's bytes; HBM holds exactly the parts placed there.
- Utilization: MFU <= HFU <= the device's calibrated ceiling.
- Time: no step beats its busiest device's roofline, nor the model's FLOPs over all devices at the
  achievable rate; no collective beats its bytes over the slowest link it crosses.
- Expert parallelism shards expert weights, not expert work: at fixed devices, changing EP leaves
  the per-device expert FLOPs unchanged (for a fixed load imbalance).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.catalog import find_model
from perfmodel.collectives import Topology
from perfmodel.layout import Layout
from perfmodel.machine import build_machine
from perfmodel.memory import WEIGHT_BYTES, model_state_bytes, stage_layers
from perfmodel.plan import Recompute
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

FAMILIES = {
    "dense-gqa": ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b"],
    "dense-mha": ["gpt3-175b", "megatron-1t"],
    "mla-moe": ["deepseek-v3"],
    "gqa-moe": ["mixtral-8x7b", "qwen3-235b-a22b", "grok-1", "gpt-oss-120b"],
}
SYSTEMS = ["dgx-h100", "dgx-a100", "mi300x-8x", "gb200-nvl72", "cloudmatrix384-die", "frontier", "ascend-910b-8x"]
PLANS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
REL = 1e-9


def _divisors(n: int, at_most: int) -> list[int]:
    return [d for d in range(1, min(n, at_most) + 1) if n % d == 0]


@st.composite
def training_cases(draw, family: str):
    """A model of the family, a system, and a plan that passes every rule but (maybe) memory."""
    spec = find_model(draw(st.sampled_from(FAMILIES[family])))
    system = draw(st.sampled_from(SYSTEMS))
    seq = draw(st.sampled_from([2048, 4096, 8192]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if spec.num_heads % t == 0]))
    cp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 8, 16) if p <= spec.num_layers]))
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    ep, etp = 1, 0
    if spec.moe:
        ep = draw(st.sampled_from(_divisors(spec.moe.num_experts, dp * cp) or [1]))
        ep = ep if (dp * cp) % ep == 0 else 1
        etp = draw(st.sampled_from([0, 1]))
    mb = draw(st.sampled_from([1, 2]))
    micro = draw(st.sampled_from([1, 4, 16, 32]))
    interleave = draw(st.sampled_from([1, 2])) if pp > 1 and micro % pp == 0 and 2 * pp <= spec.num_layers else 1
    machine_devices = tp * cp * pp * dp
    plan = TrainPlan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, interleave=interleave, micro_batch=mb,
                     zero=draw(st.integers(0, 3)), recompute=draw(st.sampled_from(["none", "selective", "full"])),
                     sp=tp > 1 and draw(st.booleans()), flash=draw(st.booleans()),
                     moe_imbalance=draw(st.sampled_from([0.0, 1.0, 1.3])))
    return spec, system, machine_devices, plan, TrainWorkload(dp * mb * micro, seq)


def _state_bytes_all_devices(spec, plan: TrainPlan) -> tuple[float, float]:
    """(weights, all model states) summed over every device of every stage, stage by stage."""
    lay = Layout(plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.etp)
    pp = int(plan.pp)
    q, r = (int(x) for x in stage_layers(spec.num_layers, pp))
    weights = states = 0.0
    for stage in range(pp):
        layers = q + (stage >= pp - r)
        dense, expert = lay.params_per_device(spec, layers, stage == 0, stage == pp - 1)
        parts = [model_state_bytes(dense, lay.dense_replicas, plan.zero),
                 model_state_bytes(expert, lay.edp, plan.zero)]
        weights += sum(float(p[0]) for p in parts) * float(lay.stage_devices)
        states += sum(float(sum(p)) for p in parts) * float(lay.stage_devices)
    return weights, states


def _check_training_laws(db, case):
    spec, system, devices, plan, work = case
    machine = build_machine(db, system, devices)
    if not machine.supports("bf16"):
        return
    r = estimate_training(spec, machine, plan, work)
    assert str(r.binding) in ("", "hbm"), r.binding            # the strategy draws only valid plans
    tokens = work.global_batch * work.seq_len
    # FLOPs, exactly: the operators summed over devices are the model's, recompute adds what it reruns.
    model = spec.training_flops_per_token(work.seq_len, causal=bool(plan.flash), mtp=True) * tokens
    assert float(r.model_flops_per_step) == pytest.approx(model, rel=REL)
    attention_fwd = 4.0 * spec.num_layers * spec.attended_context(work.seq_len, causal=bool(plan.flash)) \
        * spec.attention_width * tokens
    # Full recompute reruns the layers' forward (not the head, nor the MTP depths); selective, the
    # attention core of every layer.
    layers_fwd = spec.forward_flops_per_token(work.seq_len, causal=bool(plan.flash)) * tokens \
        - 2.0 * spec.vocab_size * spec.hidden_size * tokens
    again = {"none": 0.0, "selective": attention_fwd, "full": layers_fwd}[plan.recompute]
    assert float(r.executed_flops_per_step) == pytest.approx(model + again, rel=REL)
    # Bytes: every stage's devices together hold at least the model (equal when nothing is replicated).
    weights, states = _state_bytes_all_devices(spec, plan)
    assert weights >= spec.total_params * WEIGHT_BYTES * (1 - REL)
    lay = Layout(plan.tp, plan.cp, plan.dp, plan.pp, plan.ep, plan.etp)
    # (the multi-token-prediction depths train beside the model, not in its parameter count)
    assert weights >= (spec.total_params + spec.mtp_params) * WEIGHT_BYTES * (1 - REL)
    replicated = (plan.zero < 3 and float(lay.dense_replicas) > 1) or (spec.tied_embeddings and plan.pp > 1) \
        or (spec.mtp_layers and plan.pp > 1) or (spec.tp_replicated_params and plan.tp > 1) \
        or (spec.moe and (float(lay.expert_slots(spec)) * plan.ep != spec.moe.num_experts
                          or (plan.zero < 3 and float(lay.edp) > 1)))
    if not replicated:
        assert weights == pytest.approx((spec.total_params + spec.mtp_params) * WEIGHT_BYTES, rel=1e-9)
    assert states >= spec.total_params * (2 + 2 + 12) * (1 - REL)
    # HBM holds exactly the parts placed there, plus the reserve.
    placed = sum(float(r.memory[k]) for k in ("weights", "gradients", "optimizer states", "activations",
                                              "gathered layers (ZeRO-3)", "reserve"))
    assert float(r.hbm_used_bytes) == pytest.approx(placed, rel=REL)
    # Utilization: MFU <= HFU <= the calibrated ceiling of the plan's precision.
    ceiling = machine.achievable_flops[str(plan.precision)] / machine.peak_flops[str(plan.precision)]
    assert 0 < float(r.mfu) <= float(r.hfu) * (1 + REL)
    assert float(r.hfu) <= ceiling * (1 + REL)
    # Time: the busiest device's operators run one after another, and all devices together cannot
    # beat the model's FLOPs at the fastest achievable rate.
    assert float(r.step_time_s) >= sum(float(v) for v in r.operator_times.values()) * (1 - REL)
    assert float(r.step_time_s) >= model / (devices * max(machine.achievable_flops.values())) * (1 - REL)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_training_plans_obey_the_conservation_laws(db, family):
    @PLANS
    @given(case=training_cases(family))
    def check(case):
        _check_training_laws(db, case)

    check()


@st.composite
def serving_cases(draw, family: str):
    spec = find_model(draw(st.sampled_from(FAMILIES[family])))
    system = draw(st.sampled_from(["dgx-h100", "mi300x-8x", "gb200-nvl72", "cloudmatrix384-die", "dgx-b200"]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if spec.num_heads % t == 0]))
    dpa = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    ep = 1
    if spec.moe:
        ep = draw(st.sampled_from([e for e in _divisors(tp * dpa, 64)
                                   if spec.moe.expert_ffn_hidden_size % (tp * dpa // e) == 0] or [1]))
    weight = draw(st.sampled_from(["bf16", "fp8", "int8", "int4"]))
    plan = ServePlan(tp=tp, pp=pp, ep=ep, dp_attention=dpa, batch=dpa * draw(st.sampled_from([1, 8, 64])),
                     weight_precision=weight, kv_precision=draw(st.sampled_from(["bf16", "int4"])))
    return spec, system, tp * dpa * pp, plan


def _check_serving_laws(db, case):
    spec, system, devices, plan = case
    machine = build_machine(db, system, max(devices, db.system(system).devices_per_node))
    r = estimate_serving(spec, machine, plan, ServeWorkload(1024, 256))
    assert str(r.binding) in ("", "hbm"), r.binding
    from perfmodel.hardware_db.schema import BYTES_PER_ELEMENT
    model_bytes = spec.total_params * BYTES_PER_ELEMENT[plan.weight_precision]
    assert float(r.memory["weights"]) * devices >= model_bytes * (1 - REL)
    assert float(r.hbm_used_bytes) == pytest.approx(sum(float(v) for v in r.memory.values()), rel=REL)
    assert float(r.ttft_s) > 0 and float(r.tpot_s) > 0


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_serving_instances_hold_the_whole_model(db, family):
    @PLANS
    @given(case=serving_cases(family))
    def check(case):
        _check_serving_laws(db, case)

    check()


@pytest.mark.parametrize("name", FAMILIES["gqa-moe"] + FAMILIES["mla-moe"])
def test_expert_parallelism_shards_weights_not_work(db, name):
    spec = find_model(name)
    machine = build_machine(db, "dgx-h100", 64)
    work = TrainWorkload(64, 4096)
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if spec.moe.num_experts % e == 0]
    runs = {e: estimate_training(spec, machine, TrainPlan(tp=1, pp=1, dp=64, ep=e, zero=1, moe_imbalance=1.2),
                                 work) for e in eps}
    flops = {e: float(r.operator_flops["experts"]) for e, r in runs.items()}
    assert max(flops.values()) == pytest.approx(min(flops.values()), rel=REL), flops
    # ... while the expert weights each device holds shrink as 1 / ep.
    weights = {e: float(r.memory["weights"]) for e, r in runs.items()}
    assert all(weights[a] > weights[b] for a, b in zip(eps, eps[1:]))


# --- collectives ------------------------------------------------------------------------------------

@st.composite
def topologies(draw):
    """Two or three levels, innermost first, each group a multiple of the one inside it, each
    level no faster than the one inside it."""
    inner = draw(st.sampled_from([2, 4, 8]))
    sizes = [inner, inner * draw(st.sampled_from([2, 4, 8]))]
    if draw(st.booleans()):
        sizes.append(sizes[-1] * draw(st.sampled_from([2, 4])))
    bw = [draw(st.floats(1e10, 1e12))]
    for _ in sizes[1:]:
        bw.append(bw[-1] / draw(st.floats(1.0, 20.0)))
    lat = sorted(draw(st.floats(1e-7, 1e-5)) for _ in sizes)
    return Topology(tuple(f"l{i}" for i in range(len(sizes))), np.array(sizes, float), np.array(bw), np.array(lat))


@settings(max_examples=300, deadline=None)
@given(topo=topologies(), size=st.floats(1.0, 1e11), stride_exp=st.integers(0, 4), n_exp=st.integers(1, 7),
       top_k=st.integers(1, 8))
def test_no_collective_beats_its_bytes_over_the_slowest_link(topo, size, stride_exp, n_exp, top_k):
    stride, n = 2 ** stride_exp, 2 ** n_exp
    bw_slow, _ = topo.link(stride, n)
    k = float(topo.inner_members(stride, n))
    groups = n / k
    # Across the slow level each inner group must send out (G-1)/G of the buffer, spread over its k
    # members' links: all-reduce twice that (reduce and broadcast), the others once.
    reduce_scatter_bound = (groups - 1) / groups * size / k / bw_slow
    assert float(topo.all_reduce(size, stride, n)) >= 2 * reduce_scatter_bound * (1 - 1e-9)
    assert float(topo.reduce_scatter(size, stride, n)) >= reduce_scatter_bound * (1 - 1e-9)
    assert float(topo.all_gather(size, stride, n)) >= reduce_scatter_bound * (1 - 1e-9)
    # An MoE dispatch sends each token once to every remote group holding one of its experts.
    remote = (groups - 1) * (1 - (1 - 1 / groups) ** top_k)
    # (or, sent flat without node deduplication, top_k copies to (n-1)/n remote ranks: never fewer bytes).
    least = min(remote, (n - 1) / n * top_k) if groups > 1 else 0.0
    assert float(topo.moe_all_to_all(size, top_k, stride, n)) >= least * size / bw_slow * (1 - 1e-9)
    bw_p2p, lat = topo.link(stride, 2)
    assert float(topo.p2p(size, stride)) >= size / bw_p2p


def test_training_recompute_code_names():
    assert [r.name for r in Recompute] == ["NONE", "SELECTIVE", "FULL", "MODULES"]


# --- overlap: every compute window is spent once ------------------------------------------------------

def _faster(machine, compute: float, memory: float, links: float):
    """The same machine with every achievable rate, HBM stream and link bandwidth scaled up."""
    from dataclasses import replace

    topo = machine.topology
    fitted = replace(topo.fitted, link=topo.fitted.link * links) if topo.fitted else None
    kernels = {p: replace(k, peak=k.peak * compute, bandwidth=k.bandwidth * memory)
               for p, k in machine.gemm_kernels.items()}
    grouped = {p: replace(k, peak=k.peak * compute, bandwidth=k.bandwidth * memory)
               for p, k in (machine.grouped_kernels or {}).items()}
    return replace(machine, achievable_flops={p: v * compute for p, v in machine.achievable_flops.items()},
                   hbm_bytes_per_s=machine.hbm_bytes_per_s * memory, gemm_kernels=kernels, grouped_kernels=grouped,
                   topology=replace(topo, bw=topo.bw * links, fitted=fitted))


def _with_fp8_as_twice(machine, precision: str):
    """fp8 GEMMs as the plan's own kernel at twice the rate and half the weight bytes: a faster
    format with no fixed costs of its own. (Measured fp8 GEMMs also pay activation-cast kernels,
    which can make small GEMMs slower than bf16: that is measured, not an overlap artefact.)"""
    from dataclasses import replace

    own = machine.gemm_kernels[precision]
    # The routed experts' grouped kernel likewise: the plan's own at twice the rate, for both fp8 recipes.
    grouped = dict(machine.grouped_kernels or {})
    if precision in grouped:
        grouped.update({p: replace(grouped[precision], peak=grouped[precision].peak * 2.0) for p in ("fp8", "fp8_block")})
    else:
        grouped = {p: k for p, k in grouped.items() if p not in ("fp8", "fp8_block")}
    return replace(machine, gemm_kernels={**machine.gemm_kernels, "fp8": replace(own, peak=own.peak * 2.0)},
                   grouped_kernels=grouped,
                   achievable_flops={**machine.achievable_flops, "fp8": 2.0 * machine.achievable_flops[precision]})


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_faster_device_or_format_never_makes_a_step_slower(db, family):
    """Transfers sharing a compute window queue on it, so shrinking compute (a faster device, fp8
    GEMMs) or faster links can only shorten the step, under every overlap mode."""
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=training_cases(family), compute=st.floats(1.0, 4.0), memory=st.floats(1.0, 4.0),
           links=st.floats(1.0, 4.0), overlap=st.sampled_from(["none", "framework", "ideal"]),
           offload=st.sampled_from(["hbm", "ddr", "nvme"]))
    def check(case, compute, memory, links, overlap, offload):
        from dataclasses import replace

        spec, system, devices, plan, work = case
        machine = build_machine(db, system, devices)
        plan = replace(plan, overlap=overlap, param_place=offload if plan.zero == 3 else "hbm",
                       grad_place=offload if plan.zero >= 2 else "hbm")
        if offload != "hbm" and not any(t.kind == offload for t in machine.memory_tiers):
            return
        base = estimate_training(spec, machine, plan, work)
        slow = float(base.step_time_s)
        assert float(base.step_time_low_s) <= slow <= float(base.step_time_high_s)
        fast = float(estimate_training(spec, _faster(machine, compute, memory, links), plan, work).step_time_s)
        assert fast <= slow * (1 + 1e-9)
        if machine.supports("fp8"):
            twice = _with_fp8_as_twice(machine, str(plan.precision))
            assert float(estimate_training(spec, twice, replace(plan, precision="fp8"), work).step_time_s) \
                <= slow * (1 + 1e-9)

    check()


def test_overlap_modes_bracket_the_step(db):
    # ideal (every transfer under compute) <= framework <= none (every transfer exposed).
    spec, machine = find_model("llama-3.1-70b"), build_machine(db, "dgx-h100", 64)
    plan = dict(tp=8, pp=2, cp=2, dp=2, zero=3, recompute="selective", sp=True)
    steps = [float(estimate_training(spec, machine, TrainPlan(**plan, overlap=o), TrainWorkload(64, 8192))
                   .step_time_s) for o in ("ideal", "framework", "none")]
    assert steps == sorted(steps) and steps[0] < steps[2]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_faster_device_never_serves_slower(db, family):
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=serving_cases(family), compute=st.floats(1.0, 4.0), memory=st.floats(1.0, 4.0),
           links=st.floats(1.0, 4.0))
    def check(case, compute, memory, links):
        spec, system, devices, plan = case
        machine = build_machine(db, system, max(devices, db.system(system).devices_per_node))
        work = ServeWorkload(1024, 256)
        slow = estimate_serving(spec, machine, plan, work)
        fast = estimate_serving(spec, _faster(machine, compute, memory, links), plan, work)
        assert float(fast.ttft_s) <= float(slow.ttft_s) * (1 + 1e-9)
        assert float(fast.tpot_s) <= float(slow.tpot_s) * (1 + 1e-9)

    check()
