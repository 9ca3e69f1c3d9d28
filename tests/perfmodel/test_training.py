"""The training step: its structure, vectorization and feasibility."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.roofline import layer_ops, lm_head_ops, roofline
from perfmodel.layout import Layout
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training


@pytest.fixture(scope="module")
def h100x64(db):
    return build_machine(db, "dgx-h100", 64)


def test_roofline_takes_the_larger_bound():
    t, compute = roofline(1e12, 1e9, 1e12, 1e12)
    assert t == 1.0 and compute
    t, compute = roofline(1e9, 1e12, 1e12, 1e12)
    assert t == 1.0 and not compute


def test_layer_gemm_flops_add_up_to_the_model_count():
    # Sum of the operators' GEMM FLOPs over all layers and the head = forward FLOPs of the spec, exactly.
    for name in ("llama-3.1-70b", "gpt3-175b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-120b"):
        spec = find_model(name)
        s = 4096
        total = 0.0
        for moe_layer, count in ((False, spec.dense_layers), (True, spec.moe_layers)):
            if count:
                ops = layer_ops(spec, s, spec.attended_context(s), Layout(), False, moe_layer=moe_layer)
                total += count * sum(float(op.flops) for op in ops if op.gemm)
        total += sum(float(op.flops) for op in lm_head_ops(spec, s, 1) if op.gemm)
        expected = spec.forward_flops_per_token(s) * s
        assert total == pytest.approx(expected, rel=1e-12), name


def test_one_code_path_for_one_plan_and_many(h100x64):
    spec = find_model("llama-3.1-70b")
    work = TrainWorkload(global_batch=256, seq_len=4096)
    tps = np.array([1, 2, 4, 8])
    pps = np.array([8, 4, 2, 1])
    dps = 64 // (tps * pps)
    many = estimate_training(spec, h100x64, TrainPlan(tp=tps, pp=pps, dp=dps, zero=1), work)
    for i in range(4):
        one = estimate_training(spec, h100x64, TrainPlan(tp=int(tps[i]), pp=int(pps[i]), dp=int(dps[i]), zero=1), work)
        assert float(one.step_time_s) == pytest.approx(float(many.step_time_s[i]))
        assert float(one.hbm_used_bytes) == pytest.approx(float(many.hbm_used_bytes[i]))


def test_pipeline_bubble_formula(h100x64):
    spec = find_model("llama-3.1-70b")
    work = TrainWorkload(global_batch=64, seq_len=4096)
    r = estimate_training(spec, h100x64, TrainPlan(tp=8, pp=8, dp=1, interleave=2), work)
    m = 64
    per_micro = float(r.components["pipeline bubble"]) / (7 / 2)
    assert float(r.components["compute (fwd+bwd+recompute)"]) <= m * per_micro + 1e-9
    # bubble / (ideal pipeline) = (p - 1) / (v m)
    ideal = m * per_micro
    assert float(r.components["pipeline bubble"]) / ideal == pytest.approx(7 / (2 * 64))


def test_utilization_is_a_fraction_and_step_time_respects_the_peak(h100x64):
    spec = find_model("llama-3.1-8b")
    r = estimate_training(spec, h100x64, TrainPlan(tp=1, pp=1, dp=64, zero=1), TrainWorkload(512, 8192))
    assert 0 < float(r.mfu) <= 1 and float(r.hfu) >= float(r.mfu)
    peak = h100x64.peak_flops["bf16"] * 64
    assert float(r.step_time_s) >= float(r.model_flops_per_step) / peak


def test_infeasible_plans_name_the_binding_constraint(h100x64, db):
    spec = find_model("llama-3.1-405b")
    r = estimate_training(spec, h100x64, TrainPlan(tp=8, pp=1, dp=8, zero=0), TrainWorkload(64, 8192))
    assert r.binding == "hbm" and float(r.shortfall) > 0
    r = estimate_training(spec, h100x64, TrainPlan(tp=3, pp=1, dp=21), TrainWorkload(63, 8192))
    assert r.binding == "devices"
    # An uneven split is allowed: 80 layers over 6 stages, the largest holding 14.
    machine = build_machine(db, "dgx-h100", 48)
    r = estimate_training(find_model("llama-3.1-70b"), machine, TrainPlan(tp=8, pp=6, dp=1, zero=1, recompute="full"),
                          TrainWorkload(48, 8192))
    assert bool(r.feasible), r.binding


def test_gradients_leave_hbm_only_with_the_optimizer_states(db):
    # DeepSpeed has no gradient offload of its own: offload_optimizer carries the gradient partitions.
    from perfmodel.training_memory import GRADS_WITH_OPTIMIZER

    machine, spec, work = build_machine(db, "hgx-h200", 8), find_model("llama-3.1-8b"), TrainWorkload(64, 4096)
    plan = dict(tp=1, dp=8, zero=2, grad_place="ddr")
    assert estimate_training(spec, machine, TrainPlan(**plan), work).binding == GRADS_WITH_OPTIMIZER
    assert estimate_training(spec, machine, TrainPlan(**plan, optimizer_place="nvme"), work).binding == \
        GRADS_WITH_OPTIMIZER
    assert bool(estimate_training(spec, machine, TrainPlan(**plan, optimizer_place="ddr"), work).feasible)


def test_zero3_offload_moves_state_off_hbm(db):
    machine = build_machine(db, "hgx-h200", 8)
    spec = find_model("llama-3.1-70b")
    work = TrainWorkload(32, 4096)
    base = estimate_training(spec, machine, TrainPlan(tp=1, dp=8, zero=3, recompute="full"), work)
    off = estimate_training(spec, machine, TrainPlan(tp=1, dp=8, zero=3, recompute="full", optimizer_place="ddr"), work)
    assert float(off.hbm_used_bytes) < float(base.hbm_used_bytes)
    assert float(off.tier_bytes["ddr"]) > 0
    cxl = estimate_training(spec, machine, TrainPlan(tp=1, dp=8, zero=3, recompute="full", optimizer_place="cxl"), work)
    # CPU Adam over the CXL cards is slower than over local DDR (narrower tier).
    assert float(cxl.components["optimizer step"]) > float(off.components["optimizer step"])


def test_moe_plans_pay_all_to_all(db):
    machine = build_machine(db, "dgx-h100", 64)
    spec = find_model("mixtral-8x7b")
    r = estimate_training(spec, machine, TrainPlan(tp=1, pp=1, dp=64, ep=8, zero=1, recompute="full"),
                          TrainWorkload(256, 4096))
    assert float(r.components["ep all-to-all"]) > 0


def test_a_state_interleaved_over_ddr_and_cxl(db):
    """Optimizer states interleaved over DDR and CXL by bandwidth: each memory holds its share, the CPU
    step reads both at once (faster than either alone), and CXL alone (naive) is the slowest."""
    from perfmodel.report import host_placements
    from perfmodel.training_memory import interleave_share

    spec = find_model("llama-3.1-70b")
    machine = build_machine(db, "hgx-h200", 8)
    plan = TrainPlan(tp=1, pp=1, dp=8, zero=3, recompute="full", optimizer_place="ddr+cxl", grad_place="ddr+cxl")
    work = TrainWorkload(64, 4096)
    r = estimate_training(spec, machine, plan, work)
    assert bool(r.feasible)
    share = interleave_share(machine, "ddr")
    assert 0 < share < 1 and share + interleave_share(machine, "cxl") == pytest.approx(1.0)
    moved = float(r.memory["optimizer states"] + r.memory["gradients"])
    assert float(r.tier_bytes["ddr"]) == pytest.approx(share * moved)
    assert float(r.tier_bytes["cxl"]) == pytest.approx((1 - share) * moved)
    steps = host_placements(spec, machine, plan, work)
    assert steps["ddr+cxl"] < steps["ddr"] < steps["cxl"]
    # No system without CXL offers the interleaved place.
    assert host_placements(spec, build_machine(db, "dgx-h100", 8), TrainPlan(tp=1, dp=8, zero=3,
                                                                             optimizer_place="ddr"), work) == {}


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_dualpipe_trades_parameter_copies_for_a_smaller_bubble(db, pp):
    """DualPipe (DeepSeek-V3 report, Table 2): a bubble of (PP/2 - 1) chunk forwards, never more than
    1F1B's (PP - 1) stage steps, so its pipeline (compute and bubble) is never longer; two copies of
    the parameters and their gradients (whose reduction may cost more than the bubble saves); PP + 1
    microbatches of activations; an odd pp or microbatch count is refused by name."""
    spec, machine = find_model("mixtral-8x7b"), build_machine(db, "dgx-h100", 64)
    plan = dict(tp=2, pp=pp, dp=64 // (2 * pp), ep=8, etp=1, sp=True, zero=1, precision="bf16")
    work = TrainWorkload(64 // (2 * pp) * 2 * pp, 4096)
    one, dual = (estimate_training(spec, machine, TrainPlan(**plan, schedule=s), work) for s in ("1f1b", "dualpipe"))
    assert float(dual.components["pipeline bubble"]) <= float(one.components["pipeline bubble"])
    def pipeline(r):
        return float(r.components["compute (fwd+bwd+recompute)"] + r.components["pipeline bubble"])
    assert pipeline(dual) <= pipeline(one)
    # (the fullest stage may differ between the two, with or without the embedding)
    assert float(dual.memory["weights"]) == pytest.approx(2 * float(one.memory["weights"]), rel=0.05)
    if pp == 2:
        assert float(dual.components["pipeline bubble"]) == 0.0      # (2 / 2 - 1) chunks
    odd = estimate_training(spec, machine, TrainPlan(**{**plan, "pp": 1, "dp": 32}, schedule="dualpipe"), work)
    assert str(odd.binding).startswith("DualPipe needs an even pp")


def test_a_dualpipe_rank_pays_the_mean_of_its_two_stages(db):
    """DualPipe places stages i and PP - 1 - i on rank i and runs half the microbatches through each
    (DeepSeek-V3 report, Sec. 3.2.1-3.2.3): with even stages rank 0 paces, its microbatch costs its
    layers and half the head (the embedding's stage beside the head's), where 1F1B's last stage pays
    the whole head; and it reduces both stages' gradients once per step."""
    spec, machine = find_model("llama-3.1-70b"), build_machine(db, "dgx-h100", 64)
    plan = dict(tp=8, pp=4, dp=2, sp=True, zero=1, precision="bf16")
    work = TrainWorkload(64, 4096)
    one, dual = (estimate_training(spec, machine, TrainPlan(**plan, schedule=s), work) for s in ("1f1b", "dualpipe"))
    ops_one, ops_dual = one.operator_times, dual.operator_times
    assert float(ops_dual["lm head"]) == pytest.approx(0.5 * float(ops_one["lm head"]))
    assert float(ops_dual["cross entropy"]) == pytest.approx(0.5 * float(ops_one["cross entropy"]))
    assert float(ops_dual["mlp"]) == pytest.approx(float(ops_one["mlp"]))     # 20 layers a stage either way
    assert float(dual.components["compute (fwd+bwd+recompute)"]) < float(one.components["compute (fwd+bwd+recompute)"])
    # Two stages' gradients (every layer's, once, on the two ranks of a pair) against one stage's.
    assert float(dual.components["dp gradient reduction"]) >= float(one.components["dp gradient reduction"])


def test_fp8_training_keeps_the_head_and_the_residual_stream_in_16_bits(db, h100x64):
    """The output head runs in bf16 in an fp8 plan (Megatron-Core's output layer is outside
    Transformer Engine; DeepSeek-V3 Sec. 3.3.1), and of the elementwise traffic only the norms'
    outputs and the activation's product (what feeds a GEMM) shrink to 8 bits: per token, gated,
    12h + 2h x 1 + 4f + f bytes against bf16's 16h + 6f."""
    spec = find_model("llama-3.1-70b")
    plan = dict(tp=8, pp=2, dp=4, sp=True, zero=1)
    work = TrainWorkload(64, 4096)
    bf16, fp8 = (estimate_training(spec, h100x64, TrainPlan(**plan, precision=p), work) for p in ("bf16", "fp8"))
    for op in ("lm head", "cross entropy"):
        assert float(fp8.operator_times[op]) == pytest.approx(float(bf16.operator_times[op]))
    assert float(fp8.operator_times["mlp"]) < float(bf16.operator_times["mlp"])
    lay = Layout(tp=8, dp=8)
    n, h, f = 4096.0, spec.hidden_size, spec.ffn_hidden_size / 8
    moved = {b: next(float(op.bytes) for op in layer_ops(spec, n, n / 2, lay, sp=True, act_bytes=b)
                     if op.name == "norms and activations") for b in (1.0, 2.0)}
    assert moved[2.0] == pytest.approx(n * (16 * h / 8 + 6 * f))
    assert moved[1.0] == pytest.approx(n * (14 * h / 8 + 5 * f))


def test_routed_rows_pay_their_permute_passes(db):
    """The token permute and unpermute around the routed experts move 3 passes of the routed rows and
    one of the tokens (roofline.PERMUTE_*_PASSES) in training and prefill; decode's low-latency
    dispatch lays the rows out itself."""
    from perfmodel.roofline import PERMUTE_ROW_PASSES, PERMUTE_TOKEN_PASSES

    spec, lay = find_model("mixtral-8x7b"), Layout(tp=1, dp=8, ep=8)
    ops = {op.name: op for op in layer_ops(spec, 4096.0, 2048.0, lay, sp=False, moe_layer=True)}
    rows = float(lay.expert_rows(4096.0, spec.moe.top_k))
    expected = (PERMUTE_ROW_PASSES * rows + PERMUTE_TOKEN_PASSES * 4096.0) * spec.hidden_size * 2.0
    assert float(ops["expert permute"].bytes) == pytest.approx(expected)
    decode = {op.name for op in layer_ops(spec, 64.0, 2048.0, lay, sp=False, moe_layer=True, decode=True)}
    assert "expert permute" not in decode and "experts" in decode


def test_zero3_holds_the_gathered_layers(db):
    """ZeRO-3 keeps the layer computing and the one prefetched whole, and a layer's whole gradient
    before its reduce-scatter (FSDP's two in-flight all-gathers): 2 x 2 + 2 bytes per parameter of one
    layer on the device; nothing without ZeRO-3 or without a group to shard over."""
    spec, machine = find_model("llama-3.1-70b"), build_machine(db, "dgx-h100", 64)
    layer = Layout(tp=8).params_per_device(spec, 1.0, False, False)[0] - Layout(tp=8).params_per_device(
        spec, 0.0, False, False)[0]
    work = TrainWorkload(128, 8192)
    three = estimate_training(spec, machine, TrainPlan(tp=8, dp=8, zero=3, sp=True), work)
    assert float(three.memory["gathered layers (ZeRO-3)"]) == pytest.approx(float(layer) * 6.0)
    one = estimate_training(spec, machine, TrainPlan(tp=8, dp=8, zero=1, sp=True), work)
    assert float(one.memory["gathered layers (ZeRO-3)"]) == 0.0
    alone = estimate_training(spec, build_machine(db, "dgx-h100", 8), TrainPlan(tp=8, dp=1, zero=3, sp=True), work)
    assert float(alone.memory["gathered layers (ZeRO-3)"]) == 0.0


def test_context_parallel_exchanges_as_megatron_runs_them(db):
    """The ring hides under the attention; the all-gather and Ulysses block it (Megatron-Bridge's
    cp_comm_type table). The same FLOPs either way, each exposed exchange no faster than its link,
    and Ulysses refused where cp does not divide a TP rank's KV heads."""
    spec = find_model("llama-3.1-8b")          # 32 heads, 8 KV heads
    machine = build_machine(db, "dgx-h100", 8)
    work = TrainWorkload(64, 32768)
    results = {c: estimate_training(spec, machine, TrainPlan(dp=2, cp=4, cp_comm=c, recompute="full", zero=1), work)
               for c in ("p2p", "all_gather", "a2a")}
    flops = {c: float(r.executed_flops_per_step) for c, r in results.items()}
    assert flops["all_gather"] == pytest.approx(flops["p2p"]) == pytest.approx(flops["a2a"])
    ring = results["p2p"]
    assert float(ring.components["cp exchange"]) < float(ring.link_times["cp exchange"])   # hidden, at least in part
    for c in ("all_gather", "a2a"):
        r = results[c]
        assert str(r.binding) == ""
        assert float(r.components["cp exchange"]) == pytest.approx(float(r.link_times["cp exchange"]))
        assert float(r.link_times["cp exchange"]) > 0
    # K and V only (all-gather) move less than Q, K, V and the output (Ulysses) with GQA.
    assert float(results["all_gather"].link_times["cp exchange"]) < 2 * float(results["a2a"].link_times["cp exchange"])
    refused = estimate_training(spec, build_machine(db, "dgx-h100", 16),
                                TrainPlan(tp=4, dp=1, cp=4, cp_comm="a2a", sp=True), TrainWorkload(16, 32768))
    assert "Ulysses" in str(refused.binding)


def test_mla_down_projections_run_whole_on_every_tensor_parallel_rank():
    """Megatron-Core, SGLang, TensorRT-LLM and vLLM replicate MLA's q and KV down-projections over
    TP: each rank runs and holds them whole; the model's FLOPs (what MFU counts) stay the model's."""
    spec = find_model("deepseek-v3")
    m = spec.mla
    down = spec.hidden_size * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    one, eight = (next(op for op in layer_ops(spec, 4096, 2048.0, Layout(tp=t), True) if op.name == "qkv projection")
                  for t in (1, 8))
    assert float(eight.flops) - float(one.flops) / 8 == pytest.approx(2 * 4096 * down * (1 - 1 / 8))
    assert float(eight.mean_flops) == pytest.approx(float(one.flops) / 8)
    assert eight.gemms[0].n == m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim     # the fused down-projection, whole
    held = [Layout(tp=t).params_per_device(spec, 1.0, False, False)[0] for t in (1, 8)]
    assert held[1] - held[0] / 8 == pytest.approx(spec.tp_replicated_params * (1 - 1 / 8))
    assert find_model("llama-3.1-70b").tp_replicated_params == 0


def test_zero3_gathers_hidden_under_compute_slow_it_by_the_sms_they_hold(db):
    """Llama 3.1 70B on 64 H100s at tp 8, ZeRO-3 over 8 nodes: the gathers and reduce-scatters (36 s on
    the network) run under 52 s of compute, so every second of them costs the compute beside it the
    share of the SMs NCCL holds (collective-sms, Megatron-Bridge's 16 of 132): the step grows by that
    share of the hidden traffic, nearly all of it (the first layer's gathers of each phase block)."""
    from dataclasses import replace
    spec, machine = find_model("llama-3.1-70b"), build_machine(db, "dgx-h100", 64)
    free = replace(machine, constants=replace(machine.constants, collective_sms=0.0))
    plan, work = TrainPlan(tp=8, pp=1, dp=8, sp=True, tp_overlap=True, zero=3, micro_batch=2), TrainWorkload(512, 8192)
    held, unheld = estimate_training(spec, machine, plan, work), estimate_training(spec, free, plan, work)
    assert machine.collective_sm_share == pytest.approx(16 / 132)
    traffic = float(held.link_times["zero-2/3 gathers and scatters"]) + float(held.link_times["dp gradient reduction"])
    added = float(held.step_time_s) - float(unheld.step_time_s)
    assert 0.9 * machine.collective_sm_share * traffic < added <= machine.collective_sm_share * traffic
    assert float(unheld.components["zero-2/3 gathers and scatters"]) < float(
        held.components["zero-2/3 gathers and scatters"])
