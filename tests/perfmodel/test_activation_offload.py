"""Activation offload to host memory (perfmodel.activation_offload, MEMO, arXiv:2407.12117): where the
activations live, what the swap costs on the host path, and that it never makes a step faster."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perfmodel.activation_offload import layer_lag, layer_swap, swap_buffers
from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training
from perfmodel.training_memory import SWAP_BUFFERS, SWAPPED

SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
layer_bytes = st.floats(min_value=0.0, max_value=1e12, allow_nan=False)


@given(kept=layer_bytes, extra=layer_bytes, share=shares, full=st.booleans())
def test_swapped_and_kept_activations_add_up_to_what_the_layer_saves(kept, extra, share, full):
    whole = kept + extra                     # recompute none keeps at least what any recompute keeps
    swap = layer_swap(kept, whole, share, full)
    token_wise = full and share > 0
    saved = share * whole + (1 - share) * kept if token_wise else kept
    assert float(swap.total) == pytest.approx(saved, rel=1e-12, abs=1e-3)
    assert float(swap.hbm) >= 0 and float(swap.host) >= 0
    if share == 0:
        assert float(swap.host) == 0 and float(swap.hbm) == kept
    assert float(swap_buffers(swap.host, 1.0)) <= float(swap.host) * (1 + 1e-12)


def test_the_lag_is_one_layer_of_the_phase_and_none_without_a_swap():
    assert float(layer_lag(32.0, 32, 1.0)) == 1.0 and float(layer_lag(32.0, 32, 0.0)) == 0.0


def _one(db, model="llama-3.1-8b", system="dgx-a100", devices=8, work=TrainWorkload(8, 8192), **plan):
    spec, machine = find_model(model), build_machine(db, system, devices)
    return estimate_training(spec, machine, TrainPlan(**plan), work), machine


PLAN = dict(tp=8, pp=1, dp=1, sp=True, zero=1, micro_batch=1)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_memory_is_conserved_and_the_host_holds_the_swapped_share(db, recompute):
    """The activations kept in HBM plus those in host memory are the plan's activations; DDR holds the
    swapped ones; HBM holds the rest plus two layers of staging."""
    base, machine = _one(db, **PLAN, recompute=recompute)
    half, _ = _one(db, **PLAN, recompute=recompute, activation_offload=0.5)
    assert SWAPPED not in base.memory and float(base.tier_bytes["ddr"]) == 0
    acts, kept, host = (float(x) for x in (base.memory["activations"], half.memory["activations"],
                                           half.memory[SWAPPED]))
    assert kept + host == pytest.approx(acts, rel=1e-12)
    logits = 4.0 * 8192 * find_model("llama-3.1-8b").vocab_size / 8
    assert host == pytest.approx(0.5 * (acts - logits), rel=1e-12)
    assert float(half.tier_bytes["ddr"]) == pytest.approx(host, rel=1e-12)
    staging = float(half.memory[SWAP_BUFFERS])
    assert float(half.hbm_used_bytes) == pytest.approx(float(base.hbm_used_bytes) - host + staging, rel=1e-12)


def test_full_recomputation_swaps_every_input_and_spares_the_swapped_tokens(db):
    """MEMO's token-wise recomputation and swapping: under full recomputation the swap takes every layer's
    input and a share of the tokens' whole activations, and only the other tokens are recomputed."""
    full, _ = _one(db, **PLAN, recompute="full")
    swapped, _ = _one(db, **PLAN, recompute="full", activation_offload=0.25)
    none, _ = _one(db, **PLAN, recompute="none")
    logits = 4.0 * 8192 * find_model("llama-3.1-8b").vocab_size / 8
    inputs, whole = float(full.memory["activations"]) - logits, float(none.memory["activations"]) - logits
    assert float(swapped.memory["activations"]) == pytest.approx(logits, rel=1e-12)
    assert float(swapped.memory[SWAPPED]) == pytest.approx(0.25 * whole + 0.75 * inputs, rel=1e-12)
    executed = lambda r: float(r.executed_flops_per_step - r.model_flops_per_step)  # noqa: E731
    assert executed(swapped) == pytest.approx(0.75 * executed(full), rel=1e-9)
    assert float(swapped.step_time_s) >= float(none.step_time_s) * (1 - 1e-12)


def test_the_swap_is_never_faster_than_its_bytes_over_the_host_path(db):
    """Out in the forward, back in the backward, each way at most the device's host-path rate."""
    for recompute, share in (("selective", 0.5), ("full", 0.25)):
        r, machine = _one(db, **PLAN, recompute=recompute, activation_offload=share)
        moved = 2.0 * float(r.num_microbatches) * float(r.memory[SWAPPED])   # pp 1: one microbatch in flight
        assert float(r.link_times["activation offload"]) >= moved / machine.host_bytes_per_s * (1 - 1e-12)


def test_the_swap_shares_the_host_path_with_streamed_parameters(db):
    """Streamed parameters (ZeRO-Infinity) and swapped activations queue on one host path: together they
    expose at least what each exposes alone."""
    plan = dict(PLAN, zero=3, recompute="selective", micro_batch=1)
    work = TrainWorkload(8, 65536)
    both, _ = _one(db, work=work, **plan, param_place="ddr", activation_offload=1.0)
    params, _ = _one(db, work=work, **plan, param_place="ddr")
    swap, _ = _one(db, work=work, **plan, activation_offload=1.0)
    alone = max(float(params.step_time_s), float(swap.step_time_s))
    assert float(both.step_time_s) >= alone * (1 - 1e-12)


def test_plans_without_a_swap_are_unchanged_beside_plans_with_one(db):
    """A share of 0 leaves every output as it was, bit for bit, also evaluated beside swapping plans."""
    spec, machine = find_model("llama-3.1-70b"), build_machine(db, "dgx-h100", 64)
    work = TrainWorkload(256, 4096)
    plan = dict(tp=8, pp=2, dp=4, sp=True, zero=1, interleave=2, micro_batch=1, tp_overlap=True)
    for recompute in ("none", "selective", "full"):
        alone = estimate_training(spec, machine, TrainPlan(**plan, recompute=recompute), work)
        mixed = estimate_training(spec, machine, TrainPlan(**plan, recompute=recompute,
                                                           activation_offload=np.array([0.0, 0.5])), work)
        for name in ("step_time_s", "mfu", "hbm_used_bytes", "power_w", "energy_per_token_j"):
            assert float(getattr(mixed, name)[0]) == float(getattr(alone, name)), (recompute, name)
        assert float(mixed.tier_bytes["ddr"][0]) == 0.0


@SLOW
@given(name=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b"]), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), micro=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective", "full"]), share=st.sampled_from([0.03125, 0.25, 0.5, 1.0]),
       zero=st.sampled_from([1, 3]), param=st.sampled_from(["hbm", "ddr"]), overlap=st.sampled_from(
           ["framework", "none", "ideal"]), system=st.sampled_from(["dgx-a100", "dgx-h100", "mi300x-8x"]))
@example(name="llama-3.1-8b", tp=8, pp=1, cp=1, micro=1, recompute="full", share=1.0, zero=1, param="hbm",
         overlap="framework", system="dgx-a100")
def test_swapping_activations_never_makes_a_step_faster(db, name, tp, pp, cp, micro, recompute, share, zero, param,
                                                        overlap, system):
    """A swap only adds host-path time to the plan that keeps the same activations in HBM: the same plan
    without it, or under full recomputation (whose swapped tokens skip recomputing) the plan that keeps
    every activation and recomputes nothing."""
    spec, machine = find_model(name), build_machine(db, system, 64)
    work = TrainWorkload(128, 8192)
    plan = dict(tp=tp, pp=pp, cp=cp, dp=64 // (tp * pp * cp), micro_batch=micro, sp=tp > 1, zero=zero,
                param_place=param if zero == 3 else "hbm", overlap=overlap)
    swapped = estimate_training(spec, machine, TrainPlan(**plan, recompute=recompute, activation_offload=share), work)
    kept = estimate_training(spec, machine, TrainPlan(**plan, recompute="none" if recompute == "full" else recompute),
                             work)
    assert float(swapped.step_time_s) >= float(kept.step_time_s) * (1 - 1e-12)
    assert float(swapped.link_times["activation offload"]) > 0


def test_no_exported_framework_takes_a_swap_and_each_says_why_in_one_line(db):
    """Megatron-Core core_v0.19.0 has --fine-grained-activation-offloading, but it swaps named modules'
    inputs (not a dense MLP's) by a fraction of offload groups, with no token-wise recomputation: every
    export refuses a swapping plan in one line, and takes the same plan without the swap."""
    from perfmodel.exports import TRAINING, training_frameworks
    from perfmodel.requests import TrainRequest

    request = TrainRequest(model="llama-3.1-8b", system="dgx-h100", devices=8, tp=8, pp=1, zero=1,
                           recompute="selective", global_batch=8, seq_len=4096, activation_offload=0.5)
    spec, machine, plan, work = request.resolve(db)
    answers = training_frameworks(spec, machine, plan, work, "llama-3.1-8b")
    assert set(answers) == set(TRAINING)
    for framework, why in answers.items():
        assert why is not None and "\n" not in why and "activation" in why and "--activation-offload 0" in why
    assert "fine-grained-activation-offloading" in answers["megatron"]
    spec, machine, plan, work = replace(request, activation_offload=0.0).resolve(db)
    assert training_frameworks(spec, machine, plan, work, "llama-3.1-8b", ("megatron",))["megatron"] is None


def test_the_request_checks_the_share_and_the_host_memory(db):
    from perfmodel.hardware_db.errors import SpecError
    from perfmodel.requests import TrainRequest

    with pytest.raises(SpecError, match="--activation-offload needs a share from 0 to 1, has 1.5"):
        TrainRequest(model="llama-3.1-8b", system="dgx-h100", devices=8, tp=8, pp=1,
                     activation_offload=1.5).resolve(db)
    request = TrainRequest(model="llama-3.1-8b", system="dgx-h100", devices=8, tp=8, pp=1, activation_offload=0.5)
    assert TrainRequest.of_plan("llama-3.1-8b", "dgx-h100", 8, request.resolve(db)[2],
                                TrainWorkload(8, 4096)).activation_offload == 0.5
    assert "--activation-offload 0.5" in " ".join(request.cli_args())
