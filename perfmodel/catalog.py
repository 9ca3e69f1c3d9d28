"""The model catalog: built-in transformer specs, the user's YAML, and Hugging Face ``config.json``.

These loaders are the only file reading in ``perfmodel``. Nothing here touches the network: a
``config.json`` is read from a local path only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfmodel.hardware_db.errors import SpecError, UnknownNameError
from perfmodel.hardware_db.files import read_json, read_yaml, short
from perfmodel.hardware_db.loader import format_validation_error

from .model import TransformerSpec

CATALOG_FILE = Path(__file__).parent / "catalog" / "models.yaml"


def _validate(raw: Mapping[str, Any], where: str) -> TransformerSpec:
    try:
        return TransformerSpec.model_validate(dict(raw))
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, where)) from None


def _specs_from_yaml(path: Path) -> dict[str, TransformerSpec]:
    data = read_yaml(path)
    entries = data.get("models") if isinstance(data, Mapping) and "models" in data else [data]
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise SpecError(f"{path}: needs a model mapping or 'models:' with a list of them")
    specs = {}
    for e in entries:
        name = e.get("name", "?")
        spec = _validate(e, f"{path}:{name if isinstance(name, str) and len(name) <= 100 else short(name)}")
        specs[spec.name] = spec
    return specs


@lru_cache(maxsize=1)
def builtin_models() -> dict[str, TransformerSpec]:
    """The built-in catalog, by name (validated once per change of the file, then cached)."""
    from perfmodel.hardware_db.cache import cached

    code = [Path(__file__), Path(__file__).with_name("model.py")]
    return cached("catalog", code, [CATALOG_FILE], lambda: _specs_from_yaml(CATALOG_FILE), dict)


def find_model(name: str, catalog: Mapping[str, TransformerSpec] | None = None) -> TransformerSpec:
    """A catalog model by name or alias (case-insensitive)."""
    catalog = builtin_models() if catalog is None else catalog
    key = name.strip().lower()
    if key in catalog:
        return catalog[key]
    for spec in catalog.values():
        if key in spec.aliases:
            return spec
    raise UnknownNameError("model", name, catalog)


def load_model(ref: str) -> TransformerSpec:
    """A model from a catalog name, a spec YAML file, a Hugging Face ``config.json`` path or a
    Hugging Face model directory (a downloaded snapshot: its ``config.json`` is read, no weights)."""
    path = Path(ref)
    if ref and path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"model directory {ref} has no config.json (a Hugging Face model directory holds one)")
        return spec_from_hf_config(read_json(path / "config.json"), path / "config.json")
    if path.suffix.lower() == ".json" or (path.suffix.lower() in (".yaml", ".yml")):
        if not path.is_file():
            raise SpecError(f"model file not found: {ref}")
        if path.suffix.lower() == ".json":
            return spec_from_hf_config(read_json(path), path)
        specs = _specs_from_yaml(path)
        if len(specs) != 1:
            raise SpecError(f"{path}: holds {len(specs)} models; give one")
        return next(iter(specs.values()))
    return find_model(ref)


# model_type of config.json -> family; every other model_type is refused with this list.
HF_FAMILIES = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "mixtral": "mixtral", "qwen3_moe": "qwen3-moe", "deepseek_v3": "deepseek-v3", "gpt_oss": "gpt-oss",
}


def _hf_moe(cfg: Mapping[str, Any], family: str) -> dict[str, Any] | None:
    if family == "mixtral" or family == "gpt-oss":
        return {"num_experts": cfg.get("num_local_experts"), "top_k": cfg.get("num_experts_per_tok",
                cfg.get("experts_per_token")), "expert_ffn_hidden_size": cfg.get("intermediate_size"),
                "router_bias": family == "gpt-oss", "expert_bias": family == "gpt-oss"}
    if family == "qwen3-moe":
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            raise SpecError("qwen3_moe configs with mlp_only_layers or decoder_sparse_step != 1 are not supported")
        return {"num_experts": cfg.get("num_experts"), "top_k": cfg.get("num_experts_per_tok"),
                "expert_ffn_hidden_size": cfg.get("moe_intermediate_size")}
    if family == "deepseek-v3":
        if cfg.get("moe_layer_freq", 1) != 1:
            raise SpecError("deepseek_v3 configs with moe_layer_freq != 1 are not supported")
        return {"num_experts": cfg.get("n_routed_experts"), "top_k": cfg.get("num_experts_per_tok"),
                "num_shared_experts": cfg.get("n_shared_experts", 0),
                "expert_ffn_hidden_size": cfg.get("moe_intermediate_size"),
                "first_dense_layers": cfg.get("first_k_dense_replace", 0)}
    return None


def _hf_window(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """gpt-oss alternates sliding-window and full layers; read the period from ``layer_types``."""
    types = cfg.get("layer_types")
    if not cfg.get("sliding_window") or not types:
        return {}
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise SpecError("config.json:layer_types: needs a list of layer-type names")
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if not windowed:
        return {}
    every = len(types) // len(windowed)
    if windowed != list(range(windowed[0], len(types), every)):
        raise SpecError("config.json:layer_types: only a regular alternation of sliding and full layers is supported")
    return {"sliding_window": cfg["sliding_window"], "sliding_window_every": every}


def _hf_precision(cfg: Mapping[str, Any]) -> str:
    """The published weights' format: quantization_config's method (fp8, mxfp4), else torch_dtype."""
    quant = cfg.get("quantization_config")
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, Mapping) else ""
    if method in ("fp8", "mxfp4"):
        return {"fp8": "fp8", "mxfp4": "fp4"}[method]
    return "fp16" if cfg.get("torch_dtype") in ("float16", "fp16") else "bf16"


def spec_from_hf_config(cfg: Any, path: Path | str = "config.json") -> TransformerSpec:
    """A spec from a Hugging Face ``config.json`` of a Llama, Qwen2/3, Mixtral, DeepSeek-V3 or gpt-oss model."""
    if not isinstance(cfg, Mapping):
        raise SpecError(f"{path}: needs a JSON object, has {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in HF_FAMILIES:
        raise SpecError(f"{path}:model_type: needs one of {', '.join(HF_FAMILIES)}, has {model_type!r}")
    family = HF_FAMILIES[model_type]
    for key in ("moe_layer_freq", "decoder_sparse_step"):
        if key in cfg and not isinstance(cfg[key], int):
            raise SpecError(f"{path}:{key}: needs an integer, has {cfg[key]!r}")
    stem = Path(str(cfg.get("_name_or_path") or Path(path).parent.name or model_type)).name
    name = re.sub(r"[^a-z0-9.\-_]+", "-", stem.lower()).strip("-") or model_type
    raw: dict[str, Any] = {
        "name": name, "display_name": stem, "family": family,
        "hidden_size": cfg.get("hidden_size"), "num_layers": cfg.get("num_hidden_layers"),
        "num_heads": cfg.get("num_attention_heads"), "num_kv_heads": cfg.get("num_key_value_heads"),
        "ffn_hidden_size": cfg.get("intermediate_size"), "vocab_size": cfg.get("vocab_size"),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "max_seq_len": cfg.get("max_position_embeddings", 4096),
        "linear_bias": bool(cfg.get("attention_bias", False)) and family == "gpt-oss",
        "qkv_bias": family == "qwen2" or (bool(cfg.get("attention_bias", False)) and family != "gpt-oss"),
        "qk_norm": family in ("qwen3", "qwen3-moe"),
        "attention_sinks": family == "gpt-oss",
        "native_precision": _hf_precision(cfg),
        "sources": (f"Hugging Face config.json read from {path}",),
    }
    if cfg.get("head_dim"):
        raw["head_dim"] = cfg["head_dim"]
    moe = _hf_moe(cfg, family)
    if moe is not None:
        raw["moe"] = moe
    if family == "deepseek-v3":
        raw["mla"] = {k: cfg.get(k) or 0 for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                   "qk_rope_head_dim", "v_head_dim")}
        raw["mtp_layers"] = cfg.get("num_nextn_predict_layers", 0)
        raw.pop("head_dim", None)
    raw.update(_hf_window(cfg))
    if raw["num_kv_heads"] is None:
        raw.pop("num_kv_heads")  # absent: one KV head per query head (MHA)
    missing = [k for k, v in raw.items() if v is None]
    if missing:
        raise SpecError(f"{path}: missing field {missing[0]} (config.json key for it is absent)")
    return _validate(raw, str(path))
