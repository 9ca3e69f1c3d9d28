"""Invariants of the cost model, the searches and the catalog, each named after the law it checks.

Strategies are named after what they draw; ``@example`` pins the cases that once mattered.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from perfmodel.catalog import builtin_models, find_model
from perfmodel.collectives import (Topology, all_gather_time, reduce_scatter_time, ring_all_reduce_time,
                                   tree_all_reduce_time)
from perfmodel.machine import build_machine
from perfmodel.memory import (activation_bytes_per_layer, kv_cache_bytes_per_device, layers_on_stage, model_state_bytes,
                              split_layers)
from perfmodel.economics import run_cost
from perfmodel.power import device_power_w
from perfmodel.roofline import roofline
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])

positive = st.floats(min_value=1e-3, max_value=1e18, allow_nan=False, allow_infinity=False)
rates = st.floats(min_value=1e6, max_value=1e18, allow_nan=False, allow_infinity=False)
sizes = st.one_of(st.just(0.0), st.floats(min_value=1.0, max_value=1e12))   # bytes: none, or at least one
group_sizes = st.integers(min_value=1, max_value=4096)
bandwidths = st.floats(min_value=1e8, max_value=1e13, allow_nan=False)
latencies = st.floats(min_value=0.0, max_value=1e-3, allow_nan=False)
zero_stages = st.integers(0, 2)
model_names = st.sampled_from(sorted(builtin_models()))
dense_models = st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "gpt3-175b"])


# --- roofline ------------------------------------------------------------------------------------

@given(flops=positive, bytes_=positive, peak=rates, bw=rates)
def test_roofline_time_at_least_each_bound_and_at_most_their_sum(flops, bytes_, peak, bw):
    t, _ = roofline(flops, bytes_, peak, bw)
    assert t >= flops / peak * (1 - 1e-12) and t >= bytes_ / bw * (1 - 1e-12)
    assert t <= (flops / peak + bytes_ / bw) * (1 + 1e-12)


@given(flops=positive, bytes_=positive, peak=rates, bw=rates, factor=st.floats(1.0, 100.0))
def test_roofline_non_increasing_in_peak_and_bandwidth(flops, bytes_, peak, bw, factor):
    base, _ = roofline(flops, bytes_, peak, bw)
    assert roofline(flops, bytes_, peak * factor, bw)[0] <= base * (1 + 1e-12)
    assert roofline(flops, bytes_, peak, bw * factor)[0] <= base * (1 + 1e-12)


@given(flops=positive, bytes_=positive, peak=rates, bw=rates, factor=st.floats(1.0, 100.0))
def test_roofline_non_decreasing_in_flops_and_bytes(flops, bytes_, peak, bw, factor):
    base, _ = roofline(flops, bytes_, peak, bw)
    assert roofline(flops * factor, bytes_, peak, bw)[0] >= base * (1 - 1e-12)
    assert roofline(flops, bytes_ * factor, peak, bw)[0] >= base * (1 - 1e-12)


@given(flops=positive, bytes_=positive, peak=rates, bw=rates)
def test_roofline_bound_names_the_larger_term(flops, bytes_, peak, bw):
    _, compute = roofline(flops, bytes_, peak, bw)
    assert bool(compute) == (flops / peak >= bytes_ / bw)


# --- collectives -----------------------------------------------------------------------------------

@given(size=sizes, bw=bandwidths, lat=latencies)
def test_collectives_cost_nothing_on_one_device(size, bw, lat):
    for f in (reduce_scatter_time, all_gather_time, ring_all_reduce_time, tree_all_reduce_time):
        assert f(size, 1, bw, lat) == 0.0


@given(size=sizes, n=group_sizes, bw=bandwidths, lat=latencies)
def test_ring_all_reduce_is_reduce_scatter_plus_all_gather(size, n, bw, lat):
    assert ring_all_reduce_time(size, n, bw, lat) == pytest.approx(
        reduce_scatter_time(size, n, bw, lat) + all_gather_time(size, n, bw, lat), rel=1e-12, abs=1e-15)


@given(size=sizes, n=group_sizes, bw=bandwidths, lat=latencies, factor=st.floats(1.0, 100.0))
def test_collectives_non_increasing_in_link_bandwidth(size, n, bw, lat, factor):
    for f in (reduce_scatter_time, ring_all_reduce_time, tree_all_reduce_time):
        assert f(size, n, bw * factor, lat) <= f(size, n, bw, lat) * (1 + 1e-12) + 1e-18


@given(size=sizes, n=st.integers(2, 8), fast=bandwidths, slow_ratio=st.floats(1.0, 50.0), lat=latencies)
def test_group_inside_one_tier_never_costs_more_than_spread_over_a_slower_one(size, n, fast, slow_ratio, lat):
    topo = Topology(("fast", "slow"), np.array([8.0, 64.0]), np.array([fast, fast / slow_ratio]),
                    np.array([lat, lat * slow_ratio]))
    inside = topo.all_reduce(size, 1, n)       # n consecutive ranks: one fast group
    spread = topo.all_reduce(size, 8, n)       # one rank per fast group: over the slow tier
    assert inside <= spread * (1 + 1e-12) + 1e-18


@given(size=sizes, n=group_sizes, bw=bandwidths, lat=latencies)
def test_all_reduce_never_beats_the_bandwidth_lower_bound(size, n, bw, lat):
    # Patarasuk and Yuan 2009: at least 2 (n-1)/n S / B for any algorithm on one level.
    topo = Topology(("one",), np.array([1e9]), np.array([bw]), np.array([lat]))
    assume(n > 1)
    assert topo.all_reduce(size, 1, n) >= 2 * (n - 1) / n * size / bw * (1 - 1e-9)


# --- memory --------------------------------------------------------------------------------------

@given(params=st.floats(1e6, 1e13), dp=group_sizes, stage=zero_stages)
def test_zero_stage_s_plus_1_never_uses_more_per_device(params, dp, stage):
    assert sum(model_state_bytes(params, dp, stage + 1)) <= sum(model_state_bytes(params, dp, stage)) * (1 + 1e-12)


@given(params=st.floats(1e6, 1e13), dp=group_sizes, stage=st.integers(0, 3), k=st.integers(1, 16))
def test_more_dp_never_increases_model_state_per_device(params, dp, stage, k):
    assert sum(model_state_bytes(params, dp * k, stage)) <= sum(model_state_bytes(params, dp, stage)) * (1 + 1e-12)


@SLOW
@given(name=dense_models, tp=st.sampled_from([1, 2, 4]), zero=st.integers(0, 3))
def test_more_tp_never_increases_weight_memory_per_device(db, name, tp, zero):
    spec = find_model(name)
    machine = build_machine(db, "dgx-h100", 64)
    work = TrainWorkload(64, 2048)
    narrow = estimate_training(spec, machine, TrainPlan(tp=tp, pp=1, dp=64 // tp, zero=zero), work)
    wide = estimate_training(spec, machine, TrainPlan(tp=2 * tp, pp=1, dp=32 // tp, zero=zero), work)
    assert float(wide.memory["weights"]) <= float(narrow.memory["weights"]) * (1 + 1e-12)


@given(name=model_names, tokens=st.integers(1, 10**6), tp=st.sampled_from([1, 2, 4, 8]))
def test_lower_kv_precision_never_increases_bytes(name, tokens, tp):
    spec = find_model(name)
    values = [kv_cache_bytes_per_device(spec, tokens, b, tp, 1) for b in (2.0, 1.0, 0.5)]
    assert values[0] >= values[1] >= values[2] > 0


@given(name=model_names, tokens=st.integers(1, 10**6), k=st.integers(1, 100))
def test_kv_cache_is_linear_in_tokens(name, tokens, k):
    spec = find_model(name)
    one = kv_cache_bytes_per_device(spec, tokens, 2.0, 1, 1)
    assert kv_cache_bytes_per_device(spec, tokens * k, 2.0, 1, 1) == pytest.approx(k * one, rel=1e-12)


@given(name=dense_models, seq=st.sampled_from([512, 2048, 8192]), b=st.integers(1, 8),
       tp=st.sampled_from([1, 2, 4, 8]), sp=st.booleans())
def test_recompute_never_increases_activation_memory(name, seq, b, tp, sp):
    spec = find_model(name)
    none, selective, full = (float(activation_bytes_per_layer(spec, seq, b, tp, sp, r, flash=False)) for r in (0, 1, 2))
    assert full <= selective <= none


@SLOW
@given(place=st.sampled_from(["ddr", "nvme"]), part=st.sampled_from(["optimizer_place", "grad_place", "param_place"]))
def test_offloading_never_increases_hbm_use(db, place, part):
    spec = find_model("llama-3.1-70b")
    machine = build_machine(db, "hgx-h200", 8)
    work = TrainWorkload(32, 4096)
    base = dict(tp=1, dp=8, zero=3, recompute="full")
    kept = estimate_training(spec, machine, TrainPlan(**base), work)
    moved = estimate_training(spec, machine, TrainPlan(**base, **{part: place}), work)
    assert float(moved.hbm_used_bytes) <= float(kept.hbm_used_bytes)


# --- training and serving ----------------------------------------------------------------------------

@SLOW
@given(name=model_names, batch=st.integers(1, 512), k=st.integers(2, 8), seq=st.sampled_from([1024, 4096]))
def test_flops_are_linear_in_tokens(db, name, batch, k, seq):
    spec = find_model(name)
    machine = build_machine(db, "dgx-h100", 8)
    one = estimate_training(spec, machine, TrainPlan(dp=8), TrainWorkload(8 * batch, seq))
    more = estimate_training(spec, machine, TrainPlan(dp=8), TrainWorkload(8 * batch * k, seq))
    assert float(more.model_flops_per_step) == pytest.approx(k * float(one.model_flops_per_step))
    assert float(one.model_flops_per_step) == pytest.approx(spec.training_flops_per_token(seq, causal=True, mtp=True)
                                                            * 8 * batch * seq)


@SLOW
@given(name=dense_models, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["none", "selective", "full"]), precision=st.sampled_from(["bf16", "fp8"]))
def test_step_time_at_least_compute_over_devices_times_peak(db, name, tp, pp, recompute, precision):
    spec = find_model(name)
    machine = build_machine(db, "dgx-h100", 64)
    r = estimate_training(spec, machine, TrainPlan(tp=tp, pp=pp, dp=64 // (tp * pp), recompute=recompute,
                                                   precision=precision, zero=1), TrainWorkload(128, 2048))
    peak = machine.peak_flops[precision] * 64
    assert float(r.step_time_s) >= float(r.model_flops_per_step) / peak


@SLOW
@given(name=dense_models, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       system=st.sampled_from(["dgx-h100", "dgx-a100", "mi300x-8x", "frontier"]))
def test_mfu_is_in_zero_one(db, name, tp, pp, system):
    spec = find_model(name)
    machine = build_machine(db, system, 64)
    r = estimate_training(spec, machine, TrainPlan(tp=tp, pp=pp, dp=64 // (tp * pp), zero=1, recompute="full"),
                          TrainWorkload(128, 2048))
    assert 0 < float(r.mfu) <= 1 and 0 < float(r.hfu) <= 1


@given(layers=st.integers(1, 200), pp=st.integers(1, 64), ends=st.booleans(), mtp=st.integers(0, 2))
@example(layers=126, pp=16, ends=True, mtp=0)
@example(layers=10, pp=2, ends=True, mtp=0)
@example(layers=61, pp=8, ends=True, mtp=1)
def test_a_pipeline_split_places_every_layer_once(layers, pp, ends, mtp):
    # Every transformer layer sits on exactly one stage, whether or not the embedding, the loss and the
    # MTP depths take a slot; no stage holds a negative count, and the fullest headless stage is one of them.
    assume(pp <= layers + (2 + mtp) * ends)
    assume(not ends or pp == 1 or layers + (2 + mtp) >= pp * (1 + mtp))   # the last stage holds its MTP slots
    counts = [float(layers_on_stage(layers, pp, i, ends, mtp)) for i in range(pp)]
    assert sum(counts) == layers and min(counts) >= 0
    first, headless, last = (float(x) for x in split_layers(layers, pp, ends, mtp))
    assert (first, last) == (counts[0], counts[-1])
    assert pp == 1 or headless == max(counts[:-1])


@SLOW
@given(name=dense_models, tp=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), zero=st.sampled_from([1, 2, 3]),
       system=st.sampled_from(["dgx-h100", "dgx-a100", "gb200-nvl72", "mi300x-8x"]), ends=st.booleans())
@example(name="llama-3.1-70b", tp=8, pp=2, cp=1, recompute="none", zero=1, system="dgx-h100", ends=False)
def test_an_overlap_the_framework_offers_never_slows_a_step(db, name, tp, pp, cp, recompute, zero, system, ends):
    # TP-communication overlap (with sequence parallelism) hides TP collectives under GEMMs: never slower,
    # and exactly as slow where the device cannot overlap (Machine.overlaps_tp_communication).
    spec = find_model(name)
    machine = build_machine(db, system, 64)
    plan = dict(tp=tp, pp=pp, cp=cp, dp=64 // (tp * pp * cp), sp=True, recompute=recompute, zero=zero,
                ends_as_layers=ends)
    work = TrainWorkload(128, 4096)
    off = float(estimate_training(spec, machine, TrainPlan(**plan, tp_overlap=False), work).step_time_s)
    on = float(estimate_training(spec, machine, TrainPlan(**plan, tp_overlap=True), work).step_time_s)
    assert on <= off * (1 + 1e-12)
    if not machine.overlaps_tp_communication:
        assert on == off


@SLOW
@given(name=dense_models, tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]),
       zero=st.sampled_from([1, 2, 3]), system=st.sampled_from(["dgx-h100", "dgx-a100", "mi300x-8x"]))
@example(name="llama-3.1-70b", tp=8, pp=1, cp=1, zero=3, system="dgx-h100")
def test_a_hidden_collective_costs_the_compute_beside_it_at_most_the_sms_it_holds(db, name, tp, pp, cp, zero, system):
    # The NCCL collectives hidden under compute (ZeRO-3's gathers and scatters, the gradient reduction, the CP
    # ring) hold collective-sms of the SMs while they run: a step is no shorter than with those SMs free, no
    # longer than with every transfer exposed, and longer by at most the held share of those transfers'
    # time on their links (each microbatch's, and the pipeline bubble's share of one).
    from dataclasses import replace
    spec = find_model(name)
    machine = build_machine(db, system, 64)
    free = replace(machine, constants=replace(machine.constants, collective_sms=0.0))
    plan = TrainPlan(tp=tp, pp=pp, cp=cp, dp=64 // (tp * pp * cp), sp=tp > 1, zero=zero)
    work = TrainWorkload(128, 4096)
    held = estimate_training(spec, machine, plan, work)
    step, unheld = float(held.step_time_s), float(estimate_training(spec, free, plan, work).step_time_s)
    exposed = float(estimate_training(spec, machine, replace(plan, overlap="none"), work).step_time_s)
    assert unheld <= step * (1 + 1e-12) and step <= exposed * (1 + 1e-12)
    m = float(held.num_microbatches)
    links = sum(float(held.link_times[k]) for k in ("zero-2/3 gathers and scatters", "cp exchange",
                                                     "dp gradient reduction"))
    assert step - unheld <= machine.collective_sm_share * links * (m + pp - 1) / m * (1 + 1e-9) + 1e-12


@SLOW
@given(name=st.sampled_from(["deepseek-v3", "mixtral-8x7b", "qwen3-235b-a22b", "gpt-oss-120b"]),
       tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([2, 4, 8]),
       interleave=st.sampled_from([1, 2]), micro=st.sampled_from([1, 2]),
       system=st.sampled_from(["dgx-h100", "gb200-nvl72", "mi300x-8x", "cloudmatrix384"]))
@example(name="deepseek-v3", tp=1, pp=1, ep=8, interleave=1, micro=1, system="dgx-h100")
def test_overlapping_the_expert_exchange_never_slows_a_step(db, name, tp, pp, ep, interleave, micro, system):
    # The MoE dispatch and combine under another microbatch's compute (Megatron's 1F1B all-to-all overlap,
    # DualPipe): the exchange kernels take SMs only while they run, so a step is never slower, and with one
    # microbatch per pipeline (nothing to pair with) exactly as fast.
    assume(interleave == 1 or pp > 1)
    spec = find_model(name)
    machine = build_machine(db, system, 64)
    plan = dict(tp=tp, pp=pp, dp=64 // (tp * pp), ep=ep, interleave=interleave, micro_batch=micro, sp=tp > 1,
                zero=1, precision="bf16")
    for batch in (64 // (tp * pp) * micro * pp, 512):
        work = TrainWorkload(batch, 4096)
        off = estimate_training(spec, machine, TrainPlan(**plan, ep_overlap=False), work)
        on = estimate_training(spec, machine, TrainPlan(**plan, ep_overlap=True), work)
        assert float(on.step_time_s) <= float(off.step_time_s) * (1 + 1e-12)
        assert float(on.components["ep all-to-all"]) <= float(off.components["ep all-to-all"]) * (1 + 1e-12)
        if float(off.num_microbatches) == 1:
            assert float(on.step_time_s) == float(off.step_time_s)


@SLOW
@given(p=st.sampled_from([2, 4, 8]), v=st.sampled_from([1, 2, 4]), m=st.sampled_from([8, 16, 64]))
@example(p=8, v=1, m=8)
def test_pipeline_bubble_is_p_minus_1_over_v_m(db, p, v, m):
    spec = find_model("llama-3.1-70b")
    machine = build_machine(db, "dgx-h100", 8 * p)
    r = estimate_training(spec, machine, TrainPlan(tp=8, pp=p, dp=1, interleave=v), TrainWorkload(m, 2048))
    per_micro = float(r.components["pipeline bubble"]) / ((p - 1) / v)
    assert float(r.components["pipeline bubble"]) == pytest.approx((p - 1) / (v * m) * m * per_micro)


@SLOW
@given(name=dense_models, dp=st.sampled_from([8, 16, 32]), k=st.sampled_from([2, 4]))
def test_adding_devices_under_zero3_never_makes_a_feasible_plan_infeasible(db, name, dp, k):
    spec = find_model(name)
    work = TrainWorkload(dp * k * 2, 2048)
    small = estimate_training(spec, build_machine(db, "dgx-h100", dp),
                              TrainPlan(tp=1, dp=dp, zero=3, recompute="full"), work)
    big = estimate_training(spec, build_machine(db, "dgx-h100", dp * k),
                            TrainPlan(tp=1, dp=dp * k, zero=3, recompute="full"), work)
    if bool(small.feasible):
        assert bool(big.feasible)
    assert float(big.hbm_used_bytes) <= float(small.hbm_used_bytes) * (1 + 1e-12)


@SLOW
@given(name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3"]),
       context=st.integers(128, 32768), extra=st.integers(1, 32768), batch=st.integers(1, 256))
def test_decode_time_non_decreasing_in_context_and_batch(db, name, context, extra, batch):
    spec = find_model(name)
    machine = build_machine(db, "dgx-h100", 16 if name == "deepseek-v3" else 8)
    plan = dict(tp=8 if name != "deepseek-v3" else 1, ep=16 if name == "deepseek-v3" else 1,
                dp_attention=16 if name == "deepseek-v3" else 1, weight_precision="fp8", activation_precision="a8")
    batch = batch * plan["dp_attention"]
    a = estimate_serving(spec, machine, ServePlan(batch=batch, **plan), ServeWorkload(context, 2))
    longer = estimate_serving(spec, machine, ServePlan(batch=batch, **plan), ServeWorkload(context + extra, 2))
    bigger = estimate_serving(spec, machine, ServePlan(batch=batch * 2, **plan), ServeWorkload(context, 2))
    assert float(longer.tpot_s) >= float(a.tpot_s) * (1 - 1e-9)
    assert float(bigger.tpot_s) >= float(a.tpot_s) * (1 - 1e-9)


# --- energy, cost, units -----------------------------------------------------------------------------

@SLOW
@given(busy=st.floats(0, 1), seconds=st.floats(1e-3, 1e6))
def test_energy_is_the_integral_of_power_over_time(db, busy, seconds):
    machine = build_machine(db, "dgx-h100", 8)
    power = float(device_power_w(machine, busy))
    steps = np.linspace(0, seconds, 101)
    integral = np.trapezoid(np.full_like(steps, power), steps)
    assert integral == pytest.approx(power * seconds, rel=1e-9)
    assert machine.idle_w <= power <= machine.tdp_w


@SLOW
@given(factor=st.floats(0.1, 10.0), busy=st.floats(0, 1))
def test_cost_is_linear_in_price(db, factor, busy):
    from dataclasses import replace

    machine = build_machine(db, "dgx-h100", 8, "owned")
    power = device_power_w(machine, busy)
    k = machine.constants
    capital = machine.price_usd_per_device / (1 - k.network_capex_fraction) / (k.depreciation_years * 8766.0)
    rest = float(run_cost(machine, power)) - capital          # facility and energy
    scaled = replace(machine, price_usd_per_device=machine.price_usd_per_device * factor)
    assert float(run_cost(scaled, power)) == pytest.approx(rest + factor * capital, rel=1e-9)
    # On the cloud basis the cost is the rent, whatever the power.
    cloud = build_machine(db, "dgx-h100", 8, "cloud")
    assert float(run_cost(cloud, power)) == cloud.cloud_usd_per_hour


@given(value=st.floats(1.0, 4000.0))
def test_units_round_trip_through_the_schema(value):
    from perfmodel.hardware_db.schema import Accelerator

    a = Accelerator.model_validate(dict(name="x", display_name="x", vendor="v", sources=["s"],
                                        dense_tflops={"bf16": 100.0}, hbm_gb=value, hbm_tb_per_s=1.0, l2_mb=10,
                                        tdp_w=500, scale_up_gb_per_s_per_direction=100))
    assert a.hbm_bytes / 2**30 == pytest.approx(value, rel=1e-15)        # HBM capacities are binary (schema)
    assert a.model_dump()["hbm_bytes"] == pytest.approx(value * 2**30)


# --- search --------------------------------------------------------------------------------------

@SLOW
@given(seed=st.integers(0, 10**6))
def test_the_optimum_is_no_worse_than_any_random_feasible_plan(db, seed):
    from perfmodel.search.space import build_space
    from perfmodel.search.train import PLAN_FIELDS, SearchOptions, search_training

    spec, work = find_model("llama-3.1-8b"), TrainWorkload(64, 4096)
    best = search_training(spec, db, [("dgx-h100", 16)], work, SearchOptions(offload=False)).best
    machine = build_machine(db, "dgx-h100", 16)
    cols, _ = build_space(spec, machine, work)
    i = np.random.default_rng(seed).integers(0, len(cols["tp"]), 64)
    r = estimate_training(spec, machine, TrainPlan(**{k: cols[k][i] for k in PLAN_FIELDS}), work)
    if r.feasible.any():
        assert best.step_time_s <= float(r.step_time_s[r.feasible].min()) * (1 + 1e-9)


@SLOW
@given(seed=st.integers(0, 10**6), name=st.sampled_from(["mixtral-8x7b", "deepseek-v3", "llama-3.1-70b"]))
@example(seed=0, name="deepseek-v3")
def test_a_plan_costs_the_same_alone_as_among_other_plans(db, seed, name):
    """A vectorized evaluation gives each plan what it gets alone, whatever plans share the call
    (the search evaluates lattices of mixed precisions: an MoE plan once lost its grouped-GEMM fit
    beside a plan of another precision)."""
    from perfmodel.search.space import build_space
    from perfmodel.search.train import PLAN_FIELDS

    spec, work, devices = find_model(name), TrainWorkload(512, 4096), 64
    machine = build_machine(db, "dgx-h100", devices)
    cols, _ = build_space(spec, machine, work)
    rows = np.random.default_rng(seed).integers(0, len(cols["tp"]), 6)
    together = estimate_training(spec, machine, TrainPlan(**{k: cols[k][rows] for k in PLAN_FIELDS}), work,
                                 detail=False)
    for j, i in enumerate(rows):
        alone = estimate_training(spec, machine, TrainPlan(**{k: cols[k][i] for k in PLAN_FIELDS}), work,
                                  detail=False)
        assert float(together.hbm_used_bytes[j]) == pytest.approx(float(alone.hbm_used_bytes), rel=1e-9)
        if bool(alone.feasible):
            assert float(together.step_time_s[j]) == pytest.approx(float(alone.step_time_s), rel=1e-9)


def test_the_searched_optimum_costs_what_its_estimate_says(db):
    """The pick of a search over both precisions, estimated alone, takes the step time the search
    reported (bench_practiced's DeepSeek-V3 on 1,024 H100s: 17.0 s searched, 20.4 s alone)."""
    from perfmodel.search.train import SearchOptions, search_training

    spec, work = find_model("deepseek-v3"), TrainWorkload(8192, 4096)
    best = search_training(spec, db, [("dgx-h100", 1024)], work, SearchOptions(offload=False)).best
    alone = estimate_training(spec, build_machine(db, "dgx-h100", 1024), best.plan, work)
    assert float(alone.step_time_s) == pytest.approx(best.step_time_s, rel=1e-9)


points = st.lists(st.tuples(*[st.floats(0, 100, allow_nan=False)] * 3), min_size=1, max_size=80)


@given(pts=points)
def test_pareto_set_is_non_dominated(pts):
    from perfmodel.search.pareto import dominates, pareto_front

    arr = np.array(pts)
    front = arr[pareto_front(arr)]
    assert not any(dominates(a, b) for a in front for b in front)


@given(pts=points)
def test_pareto_set_contains_each_single_objective_optimum(pts):
    from perfmodel.search.pareto import pareto_front

    arr = np.array(pts)
    front = arr[pareto_front(arr)]
    for k in range(3):
        assert front[:, k].min() == arr[:, k].min()


@given(pts=points)
def test_filtering_the_pareto_set_again_changes_nothing(pts):
    from perfmodel.search.pareto import pareto_front

    arr = np.array(pts)
    front = arr[pareto_front(arr)]
    assert len(pareto_front(front)) == len(front)


@SLOW
@given(layers=st.sampled_from([2, 4]), hidden=st.sampled_from([1024, 4096]), devices=st.sampled_from([1, 2, 4]),
       batch=st.sampled_from([8, 16]))
def test_solvers_agree_with_brute_force_on_small_spaces(db, layers, hidden, devices, batch):
    from perfmodel.model import TransformerSpec
    from perfmodel.search.brute import brute_force_training
    from perfmodel.search.space import SpaceOptions
    from perfmodel.search.train import SearchOptions, search_training

    spec = TransformerSpec(name="t", hidden_size=hidden, num_layers=layers, num_heads=16, ffn_hidden_size=4 * hidden,
                           vocab_size=32000)
    space = SpaceOptions(micro_batches=(1, 2), interleaves=(1,), recomputes=("none", "full"), precisions=("bf16",),
                         max_cp=1)
    work = TrainWorkload(batch, 2048)
    expected, _ = brute_force_training(spec, build_machine(db, "dgx-h100", devices), work, space)
    best = search_training(spec, db, [("dgx-h100", devices)], work, SearchOptions(space=space)).best
    assert (best is None and not np.isfinite(expected)) or best.step_time_s == pytest.approx(expected, rel=1e-6)


# --- catalog -------------------------------------------------------------------------------------

@given(name=model_names)
def test_parameter_counts_from_the_spec_equal_the_catalog_totals(name):
    spec = find_model(name)
    assert spec.total_params == spec.dense_layers * (spec.attention_params + 2 * spec._norm_params
                                                     + spec.dense_mlp_params) \
        + spec.moe_layers * (spec.attention_params + 2 * spec._norm_params + spec.router_params
                             + spec.shared_expert_params + (spec.moe.num_experts * spec.expert_params if spec.moe
                                                            else 0)) \
        + spec.embedding_params + spec._norm_params
    assert spec.active_params <= spec.total_params
    pub = spec.published
    assert spec.total_params == pytest.approx(pub.total_params, rel=pub.tolerance)
