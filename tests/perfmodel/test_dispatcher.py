"""The MoE token dispatcher as a plan field (plan.Dispatcher): Megatron-Core's alltoall sends every
token-expert copy to its rank; the flex dispatcher's DeepEP and HybridEP send a token across nodes
once per node holding its experts, priced on the measured DeepEP normal kernels where the device has
them (perfmodel.training_comm)."""

from __future__ import annotations

import pytest

from perfmodel.catalog import find_model
from perfmodel.hardware_db.errors import SpecError
from perfmodel.machine import build_machine
from perfmodel.requests import TrainRequest
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

QWEN = dict(tp=2, pp=8, dp=16, ep=32, etp=1, interleave=4, sp=True, precision="fp8", ends_as_layers=True)


def _qwen(db, **plan):
    spec, machine = find_model("qwen3-235b-a22b"), build_machine(db, "dgx-h100", 256)
    return estimate_training(spec, machine, TrainPlan(**{**QWEN, **plan}), TrainWorkload(8192, 4096))


def test_deduplication_cuts_the_cross_node_exchange_and_nothing_else(db):
    """EP 32 over 4 nodes: a token crosses InfiniBand once per remote node holding one of its 8
    experts instead of once per expert; compute and memory do not depend on the dispatcher."""
    alltoall, deepep = _qwen(db), _qwen(db, dispatcher="deepep")
    assert float(deepep.link_times["ep all-to-all"]) < 0.7 * float(alltoall.link_times["ep all-to-all"])
    assert float(deepep.step_time_s) < float(alltoall.step_time_s)
    assert float(deepep.components["compute (fwd+bwd+recompute)"]) == float(
        alltoall.components["compute (fwd+bwd+recompute)"])
    assert float(deepep.hbm_used_bytes) == float(alltoall.hbm_used_bytes)
    assert float(_qwen(db, dispatcher="hybridep").step_time_s) == float(deepep.step_time_s)


def test_a_dense_plan_or_one_without_expert_parallelism_ignores_it(db):
    spec, machine = find_model("llama-3.1-8b"), build_machine(db, "dgx-h100", 8)
    work = TrainWorkload(64, 4096)
    assert float(estimate_training(spec, machine, TrainPlan(dp=8, dispatcher="deepep"), work).step_time_s) == float(
        estimate_training(spec, machine, TrainPlan(dp=8), work).step_time_s)
    assert float(_qwen(db, ep=1, etp=0).step_time_s) == float(_qwen(db, ep=1, etp=0, dispatcher="deepep").step_time_s)


@pytest.mark.parametrize("model, system, ep, message", [
    ("llama-3.1-8b", "dgx-h100", 1, "needs an MoE model"),
    ("mixtral-8x7b", "dgx-h100", 1, "needs an MoE model and --ep 2 or more"),
    ("mixtral-8x7b", "mi300x-8x", 8, "is a CUDA library"),
])
def test_the_request_refuses_a_flex_dispatcher_where_it_cannot_run(db, model, system, ep, message):
    request = TrainRequest(model=model, system=system, devices=8, tp=1, dp=8, ep=ep, dispatcher="deepep",
                           global_batch=64, seq_len=4096)
    with pytest.raises(SpecError, match=message):
        request.resolve(db)
