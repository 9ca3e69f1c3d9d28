"""Parameter, FLOP and KV-cache counts pinned to published figures and hand-worked formulas."""

from __future__ import annotations

import pytest

from perfmodel.hardware_db.errors import SpecError, UnknownNameError
from perfmodel.catalog import find_model, load_model
from perfmodel.model import TransformerSpec

REQUIRED = ["gpt3-175b", "megatron-1t", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b",
            "qwen3-235b-a22b", "deepseek-v3", "mixtral-8x7b", "grok-1", "gpt-oss-120b"]


def test_catalog_has_the_required_models(catalog):
    assert set(REQUIRED) <= set(catalog)
    assert find_model("deepseek-r1").name == "deepseek-v3"


@pytest.mark.parametrize("name", REQUIRED)
def test_parameter_counts_match_the_publisher(catalog, name):
    spec = catalog[name]
    pub = spec.published
    assert pub is not None and pub.source
    assert spec.total_params == pytest.approx(pub.total_params, rel=pub.tolerance)
    active = spec.active_params - spec.input_embedding_params * (not pub.active_counts_input_embedding)
    assert active == pytest.approx(pub.active_params, rel=pub.tolerance)
    if pub.tolerance > 0.01:
        assert pub.note, "a tolerance wider than 1% says why"


def test_llama_405b_by_hand():
    # Llama 3 paper Table 3: 126 layers, d 16384, FFN 53248, 128 heads, 8 KV heads, vocab 128256.
    spec = TransformerSpec(name="l", hidden_size=16384, num_layers=126, num_heads=128, num_kv_heads=8,
                           ffn_hidden_size=53248, vocab_size=128256)
    attention = 16384 * 16384 * 2 + 2 * 16384 * 1024
    mlp = 3 * 16384 * 53248
    expected = 126 * (attention + mlp + 2 * 16384) + 2 * 128256 * 16384 + 16384
    assert spec.total_params == expected
    assert spec.attention_kind == "gqa"
    # KV cache: 2 (K, V) x 126 layers x 8 heads x 128 dims x 2 bytes.
    assert spec.kv_bytes_per_token("bf16") == 2 * 126 * 8 * 128 * 2
    assert spec.kv_bytes_per_token("fp8") == spec.kv_bytes_per_token("bf16") / 2
    assert spec.kv_bytes_per_token("int4") == spec.kv_bytes_per_token("bf16") / 4  # never 4 // 8 == 0


def test_megatron_1t_flops_match_narayanan_equation():
    # Narayanan et al. 2021, Section 5.1: with full recompute an iteration of B sequences costs
    # 96 B s l h^2 (1 + s/6h) + 6 B s V h; without recompute the transformer part is 3/4 of that.
    spec = find_model("megatron-1t")
    s, l, h, V = 2048, spec.num_layers, spec.hidden_size, spec.vocab_size
    per_token = 72 * l * h**2 * (1 + s / (6 * h)) + 6 * V * h
    assert spec.training_flops_per_token(s) == pytest.approx(per_token, rel=1e-3)


def test_mla_caches_the_latent_and_rope_key():
    spec = find_model("deepseek-v3")
    assert spec.attention_kind == "mla"
    assert spec.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2
    assert spec.moe_layers == 58 and spec.moe.num_experts == 256


def test_sliding_window_layers_cap_the_cache():
    spec = find_model("gpt-oss-120b")
    short, long = spec.kv_cache_bytes(100), spec.kv_cache_bytes(100_000)
    per_layer_token = spec.kv_elements_per_token_per_layer() * 2
    assert short == pytest.approx(100 * spec.num_layers * per_layer_token)
    full, windowed = spec.num_layers - spec.window_layers, spec.window_layers
    assert long == pytest.approx(per_layer_token * (full * 100_000 + windowed * spec.sliding_window))


def test_flops_are_linear_in_parameters_for_short_context():
    spec = find_model("llama-3.1-70b")
    assert spec.forward_flops_per_token(1) == pytest.approx(2 * spec.matmul_params_per_token, rel=1e-4)
    assert spec.training_flops_per_token(8192) == 3 * spec.forward_flops_per_token(8192)
    assert spec.forward_flops_per_token(8192, causal=True) < spec.forward_flops_per_token(8192)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-72b", "qwen3-235b-a22b", "mixtral-8x7b",
                                  "deepseek-v3", "gpt-oss-120b"])
def test_hf_config_gives_the_catalog_counts(catalog, name, request):
    path = request.config.rootpath / "tests" / "data" / "hf" / f"{name}.json"
    spec = load_model(str(path))
    assert spec.total_params == catalog[name].total_params
    assert spec.active_params == catalog[name].active_params
    assert spec.kv_bytes_per_token() == catalog[name].kv_bytes_per_token()


@pytest.mark.parametrize("text, message", [
    ('{"model_type": "bert"}', "model_type: needs one of"),
    ('{"model_type": "llama", "hidden_size": 4096}', "missing field"),
    ('{"model_type": "llama", "hidden_size": -1, "num_hidden_layers": 2, "num_attention_heads": 2,'
     ' "intermediate_size": 8, "vocab_size": 10}', "hidden_size"),
    ('{"model_type": ', "malformed JSON"),
    ('[1, 2]', "needs a JSON object"),
])
def test_bad_config_json_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_model(str(path))


def test_unknown_model_suggests(catalog):
    with pytest.raises(UnknownNameError, match="did you mean llama-3.1-70b"):
        find_model("llama-3.1-70")


def test_spec_rejects_inconsistent_shapes():
    with pytest.raises(ValueError, match="num_kv_heads needs to divide"):
        TransformerSpec(name="x", hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=3, ffn_hidden_size=8,
                        vocab_size=10)
    with pytest.raises(ValueError, match="top_k"):
        TransformerSpec(name="x", hidden_size=64, num_layers=2, num_heads=8, ffn_hidden_size=8, vocab_size=10,
                        moe={"num_experts": 2, "top_k": 3, "expert_ffn_hidden_size": 8})
