"""The MoE exchange's overlap as Megatron-Core schedules one layer of a forward beside another
microbatch's backward (perfmodel.training_comm.one_f_one_b_layer; core_v0.19.0
TransformerLayerSchedulePlan.run), and what it leaves exposed in a whole step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training
from perfmodel.training_comm import one_f_one_b_layer

seconds = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


def test_limits_of_the_two_streams():
    # No exchange: the compute stream alone. No compute: the four exchanges one after another.
    assert one_f_one_b_layer(1.0, 2.0, 3.0, 1.5, 1.5, 0.0) == pytest.approx(9.0)
    assert one_f_one_b_layer(0.0, 0.0, 0.0, 0.0, 0.0, 1.0) == pytest.approx(4.0)
    # Exchanges shorter than every node they pair with hide whole.
    assert one_f_one_b_layer(1.0, 2.0, 1.0, 1.0, 1.0, 0.5) == pytest.approx(6.0)
    # One exchange the length of all the compute: the forward's own chain (attention, dispatch,
    # experts, combine) and the comm stream both bind; worked by hand from the schedule:
    # combine_bwd 0-6, mlp_bwd 6-7, dispatch_fwd 6-12, wgrad 7-8, dispatch_bwd 12-18,
    # mlp_fwd 12-13, then combine_fwd 18-24 beside pre_dispatch_bwd 18-20.
    assert one_f_one_b_layer(1.0, 2.0, 1.0, 1.0, 1.0, 6.0) == pytest.approx(24.0)


@given(a=seconds, b=seconds, f=seconds, d=seconds, w=seconds, e=seconds)
def test_never_below_either_stream_nor_above_both_in_series(a, b, f, d, w, e):
    path = one_f_one_b_layer(a, b, f, d, w, e)
    compute = a + b + f + d + w
    assert path >= max(compute, 4.0 * e) * (1 - 1e-12) - 1e-12
    assert path <= (compute + 4.0 * e) * (1 + 1e-12) + 1e-12
    # A longer exchange never shortens the pair.
    assert one_f_one_b_layer(a, b, f, d, w, e + 0.5) >= path - 1e-12


def test_cross_node_exchange_hides_only_under_the_moe_layers(db):
    """Qwen3-235B-A22B on 256 H100 as Megatron-Bridge ran it (EP 32 over 4 nodes, alltoall, the A2A
    overlap): its exchange on the links outlasts the MoE layers' compute, so the overlap leaves at
    least the excess exposed; the last stage's head and loss, which run outside the layers' pairs,
    hide none of it (they did before the layer schedule: 10.3 s exposed of 53.6 s on the links)."""
    spec = find_model("qwen3-235b-a22b")
    machine = build_machine(db, "dgx-h100", 256)
    plan = dict(tp=2, pp=8, dp=16, ep=32, etp=1, interleave=4, sp=True, precision="fp8", ends_as_layers=True)
    work = TrainWorkload(8192, 4096)
    on = estimate_training(spec, machine, TrainPlan(**plan, ep_overlap=True), work)
    off = estimate_training(spec, machine, TrainPlan(**plan, ep_overlap=False), work)
    link = float(on.link_times["ep all-to-all"])
    exposed = float(on.components["ep all-to-all"])
    assert float(off.components["ep all-to-all"]) == pytest.approx(link)
    # The layers' compute stream: their operators and the TP collectives that block it.
    layers = sum(float(v) for k, v in on.operator_times.items() if k not in ("lm head", "cross entropy")) \
        + float(on.components["tp communication"])
    assert link > layers
    unpaired = (4 - 1) * 8 / (float(on.num_microbatches) * 4)        # (v - 1) pp of m v chunks
    assert (1 - unpaired) * (link - layers) <= exposed < link
    assert float(on.step_time_s) < float(off.step_time_s)
