"""place-experts prices an MoE layer as plan does (issue 31: one MoE formula for both)."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.catalog import find_model
from perfmodel.collectives import normal_exchange_copies
from perfmodel.machine import build_machine
from perfmodel.moe import moe_layer_time
from perfmodel.serving import ServePlan, _instance, _pass


@pytest.mark.parametrize("model, devices", [("qwen3-235b-a22b", 32), ("mixtral-8x7b", 8)])
def test_a_uniform_placement_costs_what_serving_charges_its_moe_layer(db, model, devices):
    """Uniform routing over one expert shard per device: the busiest device is the mean one and its
    tokens leave as uniform routing sends them (normal_exchange_copies). place-experts' layer then
    costs exactly the experts, permutes and normal-kernel exchange of one of serving's MoE layers."""
    spec = find_model(model)
    machine = build_machine(db, "dgx-h100", devices).for_serving()
    tokens = 4096.0
    inst = _instance(spec, machine, ServePlan(tp=1, dp_attention=devices, ep=devices, batch=devices,
                                              moe_imbalance=1.0))
    ops, _, ep, _ = _pass(spec, machine, inst, tokens, 2048.0, False)
    layers = float(inst.layers * inst.moe_frac)
    serving = (ops.seconds["experts"] + ops.seconds["expert permute"] + ep) / layers
    nvlink, rdma = normal_exchange_copies(spec.moe.top_k, spec.moe.num_experts, devices, min(devices, 8))
    rows = tokens * spec.moe.top_k
    placed = moe_layer_time(spec, machine, rows, rows, spec.moe.num_experts // devices, tokens * float(nvlink),
                            tokens * float(rdma), devices)
    assert placed == pytest.approx(float(serving), rel=1e-9)


def test_a_busier_device_and_more_traffic_cost_more(db):
    spec = find_model("qwen3-235b-a22b")
    machine = build_machine(db, "dgx-h100", 32).for_serving()
    base = moe_layer_time(spec, machine, 32768.0, 32768.0, 4, 2000.0, 500.0, 32)
    assert moe_layer_time(spec, machine, 49152.0, 32768.0, 4, 2000.0, 500.0, 32) > base
    assert moe_layer_time(spec, machine, 32768.0, 32768.0, 4, 2000.0, 5000.0, 32) > base
    assert np.isfinite(base) and base > 0
