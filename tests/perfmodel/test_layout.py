"""The device layout, and the slips it removed: each a test of what a practitioner would check."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.hardware_db import load_database
from perfmodel.catalog import find_model
from perfmodel.layout import Layout
from perfmodel.machine import build_machine
from perfmodel.serving import ServePlan, ServeWorkload, estimate_serving
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training


def test_groups_follow_megatron_order_and_fold_the_experts():
    lay = Layout(tp=2, cp=2, dp=4, pp=3, ep=4, etp=1)
    assert float(lay.devices) == 48 and float(lay.stage_devices) == 16
    assert (float(lay.cp_group.stride), float(lay.dp_group.stride), float(lay.pp_neighbour_stride)) == (2, 4, 16)
    # Experts: etp 1 innermost, ep 4 next (stride 1), expert data parallel 4 (stride 4).
    assert (float(lay.ep_group.stride), float(lay.ep_group.size)) == (1, 4)
    assert (float(lay.edp_group.stride), float(lay.edp)) == (4, 4)
    assert bool(lay.folds) and not bool(Layout(tp=2, dp=3, ep=4).folds)


def test_etp_defaults_to_tp_and_arrays_broadcast():
    lay = Layout(tp=np.array([1, 2, 8]), dp=8, ep=2)
    assert lay.etp.tolist() == [1, 2, 8] and lay.edp.tolist() == [4, 4, 4]


def test_expert_work_per_device_does_not_depend_on_ep():
    # tokens x top_k x etp / tp rows, each meeting 1/etp of an expert: 2 x tokens x top_k x expert / tp.
    for etp, ep in ((1, 8), (2, 4), (8, 1)):
        lay = Layout(tp=8, dp=1, ep=ep, etp=etp)
        assert float(lay.expert_rows(1000, 2)) / etp == pytest.approx(1000 * 2 / 8)


def test_mixtral_expert_time_is_the_same_at_every_ep(db):
    # The case: 16 H100, dp 16, EP 1/2/4/8: the experts operator took 1.906/0.953/0.476/0.238 s.
    # The work is the same at every EP; only the grouped GEMMs' tiles differ (more experts with
    # fewer rows each at small EP), a few percent, not a factor of EP.
    spec, machine = find_model("mixtral-8x7b"), build_machine(db, "dgx-h100", 16)
    runs = [estimate_training(spec, machine, TrainPlan(dp=16, ep=e, zero=3, recompute="full"), TrainWorkload(64, 4096))
            for e in (1, 2, 4, 8)]
    flops = [float(r.operator_flops["experts"]) for r in runs]
    times = [float(r.operator_times["experts"]) for r in runs]
    assert max(flops) == pytest.approx(min(flops), rel=1e-9)
    assert max(times) <= 1.05 * min(times)


def test_deepseek_int8_on_four_npus_needs_the_whole_model(db):
    # tp4 ep4 on 4 CloudMatrix NPUs holds all 671B int8 weights over 4 devices: >= 168 GB each.
    spec, machine = find_model("deepseek-v3"), build_machine(db, "cloudmatrix384", 4)
    r = estimate_serving(spec, machine, ServePlan(tp=4, ep=4, batch=2, weight_precision="int8",
                                                  activation_precision="a8"), ServeWorkload(2048, 512))
    assert str(r.binding) == "hbm"
    assert float(r.hbm_used_bytes) >= 168e9
    assert float(r.memory["weights"]) * 4 >= spec.total_params      # one byte a weight


def test_serving_ep_inside_one_node_uses_the_scale_up_link(db):
    # attention dp 8 x ep 8 in one DGX H100: the experts' all-to-all stays on NVLink (it was priced over
    # InfiniBand).
    spec, machine = find_model("mixtral-8x7b"), build_machine(db, "dgx-h100", 8)
    lay = Layout(tp=1, dp=8, ep=8, etp=1)
    assert int(machine.topology.level_of(lay.ep_group.stride, lay.ep_group.size)) == 0
    r = estimate_serving(spec, machine, ServePlan(tp=1, ep=8, dp_attention=8, batch=16, overlap_comm=False),
                         ServeWorkload(2048, 256))
    assert 0 < float(r.prefill_components["ep all-to-all"]) < 0.2 * float(r.ttft_s)


def test_ep_ranks_inside_one_tp_group_hold_their_tokens():
    # Attention TP over the EP ranks: every EP rank has every token (Layout.ep_holds_tokens).
    assert bool(Layout(tp=8, ep=8, etp=1).ep_holds_tokens) and bool(Layout(tp=8, ep=4, etp=2).ep_holds_tokens)
    assert bool(Layout(tp=8).ep_holds_tokens)
    # Attention data parallelism: the EP group spans ranks holding different tokens.
    assert not bool(Layout(tp=1, dp=8, ep=8, etp=1).ep_holds_tokens)
    assert not bool(Layout(tp=2, dp=2, ep=4, etp=1).ep_holds_tokens)
    assert not bool(Layout(tp=2, cp=2, ep=4, etp=1).ep_holds_tokens)


def test_ep_inside_the_tp_group_exchanges_nothing(db):
    # tp 8 x ep 8 without attention dp: no dispatch, and the combine is the TP all-reduce already paid
    # (TensorRT-LLM's fused MoE without attention dp), so the TP communication is that of tp 8 alone.
    spec, machine = find_model("mixtral-8x7b"), build_machine(db, "dgx-h100", 8)
    work = ServeWorkload(2048, 256)
    held = estimate_serving(spec, machine, ServePlan(tp=8, ep=8, batch=16), work)
    assert float(held.prefill_components["ep all-to-all"]) == 0.0 and float(held.ep_per_token_s) == 0.0
    tp_only = estimate_serving(spec, machine, ServePlan(tp=8, ep=1, batch=16), work)
    assert float(held.prefill_components["tp communication"]) == pytest.approx(
        float(tp_only.prefill_components["tp communication"]))


def test_ep_beyond_the_routed_experts_holds_redundant_copies(db):
    # CloudMatrix384 runs EP 320 over 256 experts (Zuo et al. 2025): one slot per die, 64 replicas.
    spec, machine = find_model("deepseek-v3"), build_machine(db, "cloudmatrix384-die", 320)
    plan = ServePlan(tp=1, ep=320, dp_attention=320, batch=320 * 8, weight_precision="int8",
                     activation_precision="a8")
    r = estimate_serving(spec, machine, plan, ServeWorkload(4096, 1024))
    assert str(r.binding) == ""
    assert float(Layout(ep=320).expert_slots(spec)) == 1
    expert_bytes = spec.expert_weight_params / spec.moe.num_experts      # int8: one byte a weight
    assert float(r.memory["weights"]) >= expert_bytes


def test_fp16_only_device_trains_in_fp16(tmp_path):
    # A V100-like device lists fp16 but no bf16: --precision fp16 runs attention in fp16 too.
    (tmp_path / "v100.yaml").write_text("""
accelerators:
  - name: fp16-only-gpu
    extends: a100-sxm-80gb
    display_name: a device without bf16 (test)
    dense_tflops: {fp64: 19.5, fp32: 19.5, fp16: 312}
    sources: ["test fixture"]
systems:
  - name: fp16-only-node
    extends: dgx-a100
    display_name: eight fp16-only devices (test)
    accelerator: fp16-only-gpu
    sources: ["test fixture"]
""")
    db = load_database([tmp_path])
    machine = build_machine(db, "fp16-only-node", 8)
    assert not machine.supports("bf16")
    r = estimate_training(find_model("llama-3.1-8b"), machine, TrainPlan(dp=8, zero=1, precision="fp16"),
                          TrainWorkload(64, 4096))
    assert float(r.step_time_s) > 0 and str(r.binding) == ""


def test_a_one_gpu_job_sees_the_whole_node_host_memory(db):
    # ZeRO-Offload's point: one GPU with the node's host memory trains a 10B+ model.
    one, eight = build_machine(db, "dgx-a100", 1), build_machine(db, "dgx-a100", 8)
    ddr = lambda m: sum(t.bytes_per_device for t in m.memory_tiers if t.kind == "ddr")  # noqa: E731
    assert ddr(one) == pytest.approx(8 * ddr(eight))
    spec = find_model("llama-3.1-8b")
    r = estimate_training(spec, one, TrainPlan(zero=2, recompute="full", optimizer_place="ddr", grad_place="ddr"),
                          TrainWorkload(8, 2048))
    assert str(r.binding) == ""


def test_causal_mfu_never_exceeds_the_ceiling_for_any_catalog_model(db):
    from perfmodel.catalog import builtin_models

    machine = build_machine(db, "gb200-nvl72", 72)
    ceiling = machine.achievable_flops["bf16"] / machine.peak_flops["bf16"]
    for name in builtin_models():
        spec = find_model(name)
        ep = 8 if spec.moe and spec.moe.num_experts % 8 == 0 else 1
        r = estimate_training(spec, machine, TrainPlan(tp=1, dp=72, ep=ep, zero=3, recompute="full"),
                              TrainWorkload(72 * 4, 4096))
        assert 0 < float(r.mfu) <= float(r.hfu) <= ceiling, name
