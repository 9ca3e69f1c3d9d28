"""Memory formulas pinned to the ZeRO paper and Korthikanti et al. 2022, Table 2."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.memory import (activation_bytes_per_layer, dualpipe_rank_layers, in_flight_layers,
                              kv_cache_bytes_per_device, layers_on_stage, model_state_bytes, split_layers, stage_layers,
                              state_bytes_per_param)
from perfmodel.model import TransformerSpec
from perfmodel.catalog import find_model
from perfmodel.machine import build_machine
from perfmodel.plan import RECOMPUTE, Recompute, Storage
from perfmodel.training import TrainPlan, TrainWorkload, estimate_training

# GPT-3 175B as in Korthikanti et al. (a = 96 heads, h = 12288, s = 2048, b = 1, t = 8).
GPT = TransformerSpec(name="gpt", hidden_size=12288, num_layers=96, num_heads=96, ffn_hidden_size=4 * 12288,
                      mlp="plain", vocab_size=51200, position_embedding="learned", max_seq_len=2048,
                      norm="layernorm", linear_bias=True, tied_embeddings=True, dropout=True)
s, b, h, a, t = 2048, 1, 12288, 96, 8


@pytest.mark.parametrize("zero, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(zero, expected_gb):
    # Rajbhandari et al. 2020, Fig. 1: 7.5B parameters, DP 64, K = 12.
    total = sum(model_state_bytes(7.5e9, 64, zero)) / 1e9
    assert total == pytest.approx(expected_gb, abs=0.05)


@pytest.mark.parametrize("sp, recompute, coefficient", [
    (False, 0, 10 + 24 / t + 5 * a * s / (h * t)),    # tensor parallel
    (True, 0, (34 + 5 * a * s / h) / t),             # + sequence parallel
    (False, 1, 10 + 24 / t),                         # + selective recompute
    (True, 1, 34 / t),                               # + both
])
def test_korthikanti_table_2(sp, recompute, coefficient):
    got = activation_bytes_per_layer(GPT, s, b, t, sp, recompute, flash=False)
    assert got == pytest.approx(s * b * h * coefficient, rel=1e-12)


def test_no_parallelism_is_34_plus_5as_over_h():
    assert activation_bytes_per_layer(GPT, s, b, 1, False, 0, flash=False) == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_full_recompute_keeps_the_layer_input():
    assert activation_bytes_per_layer(GPT, s, b, t, False, 2) == pytest.approx(2 * s * b * h)
    assert activation_bytes_per_layer(GPT, s, b, t, True, 2) == pytest.approx(2 * s * b * h / t)


def test_flash_attention_drops_the_score_matrices():
    assert activation_bytes_per_layer(GPT, s, b, t, True, 0, flash=True) == pytest.approx(s * b * h * 34 / t)


def test_in_flight_layers_follow_1f1b_and_the_interleaved_schedule():
    # 1F1B: stage i holds p - i microbatches of its layers (at most the microbatches there are).
    assert in_flight_layers(10, 0, 8, 64, 1) == 80
    assert in_flight_layers(10, 3, 8, 64, 1) == 50
    assert in_flight_layers(10, 0, 8, 4, 1) == 40
    # Interleaved, stage 0: Korthikanti et al. Sec. 4.2.3, L (1 + (p - 1) / (p v)) layer-microbatches.
    p, v, L = 8, 2, 80
    assert in_flight_layers(L / p, 0, p, 64, v) == pytest.approx(L * (1 + (p - 1) / (p * v)))


def test_uneven_stages_put_the_shorter_ones_first():
    q, r = stage_layers(126, 16)          # Llama 3 405B on 16 stages: 2 of 7 layers, then 14 of 8
    assert (q, r) == (7, 14)


def test_the_embedding_and_the_loss_as_layers_of_the_split():
    # Llama 3 405B, pp 16 (Dubey et al. 2024 Sec. 3.3.2): 126 layers + 2 slots = 8 per stage; the first
    # and the last stage hold 7 layers (and the embedding, the head), the others 8.
    assert tuple(float(x) for x in stage_layers(126, 16, ends=True)) == (8.0, 0.0)
    assert tuple(float(x) for x in split_layers(126, 16, ends=True)) == (7.0, 8.0, 7.0)
    assert sum(float(layers_on_stage(126, 16, i, ends=True)) for i in range(16)) == 126
    # One stage: nothing to split, the flag changes nothing.
    assert tuple(float(x) for x in split_layers(126, 1, ends=True)) == tuple(float(x) for x in split_layers(126, 1))


def test_dualpipe_pairs_stage_i_with_stage_pp_minus_1_minus_i():
    # DeepSeek-V3 (61 layers, one MTP depth) on 16 stages with the ends as layers: 64 slots, 4 each;
    # stage 0 holds 3 layers (and the embedding), stage 15 two (and the loss and the MTP depth), the
    # rest 4. Rank 0 holds stages 0 and 15; every other rank i stages i and 15 - i.
    paired, others = dualpipe_rank_layers(61, 16, ends=True, mtp_slots=1)
    assert (float(paired), float(others)) == (5.0, 8.0)
    # Uneven: 126 layers on 16 stages, 7 on stages 0-1 and 8 on 2-15; rank 1 holds 7 + 8, rank 2 8 + 8.
    layers = [float(layers_on_stage(126, 16, i)) for i in range(16)]
    paired, others = dualpipe_rank_layers(126, 16)
    assert float(paired) == layers[0] + layers[15] and float(others) == max(layers[i] + layers[15 - i]
                                                                            for i in range(1, 8))
    # Two stages: one pair, no other rank; vectorized over pp.
    paired, others = dualpipe_rank_layers(126, np.array([2, 4]))
    assert paired.tolist() == [126.0, 63.0] and others.tolist() == [0.0, 63.0]


def test_the_embedding_slot_holds_no_activations():
    # Interleaved v 8 (one slot per chunk), p 16: stage 0's warm-up runs chunk 0 (the embedding only)
    # for its first 16 microbatches and 15 of the next group: 143 chunks in flight, 31 of them empty.
    assert in_flight_layers(7, 0, 16, 32, 8, embedding_slot=True) == pytest.approx(143 - 31)
    assert in_flight_layers(7, 0, 16, 32, 8) == pytest.approx(143 * 7 / 8)
    # 1F1B: p microbatches of the stage's layers, the embedding's slot empty in each.
    assert in_flight_layers(7, 0, 16, 32, 1, embedding_slot=True) == pytest.approx(16 * 7)


def test_no_dropout_and_fp8_inputs_keep_less():
    llama = find_model("llama-3.1-70b")
    bf16 = float(activation_bytes_per_layer(llama, 8192, 1, 4, True, 0))
    fp8 = float(activation_bytes_per_layer(llama, 8192, 1, 4, True, 0, gemm_input_bytes=1.0))
    # Llama, bf16: norm inputs and GEMM inputs 8, Q/K/V/O 2(1 + 2/8) + 2 = 4.5, MLP (4 + 2) x 3.5 = 21.
    assert bf16 == pytest.approx(8192 * 8192 * (8 + 4.5 + 21) / 4)
    # fp8 GEMM inputs: 6, attention 4.5 + an fp8 copy of O (1), MLP (4 + 1) x 3.5 = 17.5.
    assert fp8 == pytest.approx(8192 * 8192 * (6 + 5.5 + 17.5) / 4)



def test_kv_cache_shards_heads_but_not_below_one():
    llama = find_model("llama-3.1-70b")  # 8 KV heads
    one = kv_cache_bytes_per_device(llama, 1000, 2.0, 1, 1)
    assert one == pytest.approx(1000 * llama.kv_bytes_per_token("bf16"))
    assert kv_cache_bytes_per_device(llama, 1000, 2.0, 8, 1) == pytest.approx(one / 8)
    assert kv_cache_bytes_per_device(llama, 1000, 2.0, 16, 1) == pytest.approx(one / 8)  # replicated beyond 8
    ds = find_model("deepseek-v3")     # MLA latent: replicated on every TP rank
    assert kv_cache_bytes_per_device(ds, 10, 2.0, 8, 1) == pytest.approx(kv_cache_bytes_per_device(ds, 10, 2.0, 1, 1))
    np.testing.assert_allclose(kv_cache_bytes_per_device(llama, 1000, 2.0, np.array([1, 8]), 1), [one, one / 8])


@pytest.mark.parametrize("model, precision", [("deepseek-v3", "fp8"), ("deepseek-v3", "bf16"), ("mixtral-8x7b", "bf16"),
                                              ("llama-3.1-70b", "bf16")])
def test_recomputing_modules_keeps_between_selective_and_full(db, model, precision):
    """Recomputing the norms, MLA's up-projections and the MoE activation (DeepSeek-V3 Sec. 3.2.3) keeps
    less than selective recomputation and more than full, and recomputes more than selective does."""
    spec, machine = find_model(model), build_machine(db, "dgx-h100", 64)
    gemm_bytes = 1.0 if precision == "fp8" else 2.0
    kept = {r: float(activation_bytes_per_layer(spec, 4096, 1, 2, True, Recompute[r.upper()], moe_layer=bool(spec.moe),
                                                gemm_input_bytes=gemm_bytes)) for r in RECOMPUTE}
    assert kept["full"] < kept["modules"] <= kept["selective"] <= kept["none"]
    # Less than selective wherever something is left to drop: MLA's Q, K and V, or 16-bit norm outputs.
    assert kept["modules"] < kept["selective"] or (not spec.mla and precision == "fp8")
    runs = {r: estimate_training(spec, machine, TrainPlan(tp=2, pp=2, dp=16, ep=8 if spec.moe else 1, recompute=r,
                                                          sp=True, precision=precision), TrainWorkload(64, 4096))
            for r in ("selective", "modules")}
    assert float(runs["modules"].step_time_s) > float(runs["selective"].step_time_s)
    assert float(runs["modules"].hbm_used_bytes) < float(runs["selective"].hbm_used_bytes)
    executed = [float(runs[r].executed_flops_per_step) for r in ("selective", "modules")]
    assert executed[1] > executed[0] if spec.mla else executed[1] == executed[0]


def test_deepseek_low_precision_storage_keeps_what_section_3_3_3_says():
    """DeepSeek-V3's storage (report Sec. 3.3.3): one E5M6 copy of the attention output (1.5 bytes
    instead of bf16 plus an fp8 cast), the MoE SwiGLU inputs in FP8 (2 bytes per expert hidden unit
    instead of the bf16 gate and up outputs), and 2 + 4 + 8 bytes of states per parameter."""
    spec = find_model("deepseek-v3")
    kw = dict(moe_layer=True, gemm_input_bytes=1.0)
    mixed, low = (float(activation_bytes_per_layer(spec, 4096, 1, 1, False, Recompute.MODULES, low_precision=lp, **kw))
                  for lp in (False, True))
    context = spec.num_heads * spec.mla.v_head_dim / spec.hidden_size
    hidden = spec.moe.expert_ffn_hidden_size * (spec.moe.top_k + spec.moe.num_shared_experts) / spec.hidden_size
    assert mixed - low == pytest.approx(4096 * spec.hidden_size * ((3.0 - 1.5) * context + (4.0 - 2.0) * hidden))
    assert model_state_bytes(1.0, 1, 0, *state_bytes_per_param(Storage.DEEPSEEK)) == (2.0, 4.0, 8.0)
    assert model_state_bytes(1.0, 1, 0, *state_bytes_per_param(Storage.MIXED)) == (2.0, 2.0, 12.0)


def test_deepseek_v3_fits_80_gb_as_it_ran_only_with_its_storage(db):
    """The published run (2,048 H800, tp1 pp16 DualPipe ep64 ZeRO-1, fp8, modules recompute) fits an
    80 GB device with DeepSeek's low-precision storage and does not with mixed-precision storage;
    that storage needs fp8 GEMMs."""
    spec, machine = find_model("deepseek-v3"), build_machine(db, "hgx-h800", 2048)
    plan = dict(tp=1, pp=16, dp=128, ep=64, zero=1, recompute="modules", precision="fp8", ends_as_layers=True,
                schedule="dualpipe", ep_overlap=True)
    work = TrainWorkload(15360, 4096)
    low, mixed = (estimate_training(spec, machine, TrainPlan(**plan, storage=st), work) for st in ("deepseek", "mixed"))
    assert str(low.binding) == "" and str(mixed.binding) == "hbm"
    assert float(low.memory["optimizer states"]) == pytest.approx(float(mixed.memory["optimizer states"]) * 8 / 12)
    assert float(low.memory["gradients"]) == pytest.approx(2 * float(mixed.memory["gradients"]))
    bf16 = estimate_training(spec, machine, TrainPlan(**{**plan, "precision": "bf16"}, storage="deepseek"), work)
    assert "fp8" in str(bf16.binding)
