"""KV-cache bytes per context token of a served model, from its Hugging Face config.json.

What one decode step of one request reads from the KV cache per token of its context,
on one GPU (one tensor-parallel rank), as SGLang lays the cache out:

* **MHA / GQA / MQA** (Llama, Qwen, Mistral, ...): ``2 (K and V) x layers x KV heads per
  rank x head_dim x bytes``. KV heads per rank are ``num_key_value_heads / tp`` (at least
  one: SGLang replicates a KV head over ranks when there are fewer heads than ranks);
  ``head_dim`` is the config's, else ``hidden_size / num_attention_heads``.
* **MLA** (DeepSeek-V2/V3, Kimi K2: a config with ``kv_lora_rank``): one compressed latent
  per token and layer, ``kv_lora_rank + qk_rope_head_dim`` values, the same on every rank:
  ``layers x (kv_lora_rank + qk_rope_head_dim) x bytes``.
* Layers that do not keep a full-context KV (``layer_types`` entries other than
  ``full_attention``, or every ``full_attention_interval``-th layer only in hybrid models)
  are not counted: their reads do not grow with the context.

Bytes per value: SGLang's ``--kv-cache-dtype`` (``fp8_e4m3``/``fp8_e5m2``: 1, ``fp4_e2m1``:
0.5, scales not counted), or with ``auto`` the model's dtype (``--dtype``, else the
config's ``torch_dtype``/``dtype``; a float32 checkpoint is served in 16 bits). Unknown
shapes (a sliding window in use on some layers, a missing field) give None: no bandwidth
rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "float16": 2.0,
    "half": 2.0,
    "fp16": 2.0,
    "bfloat16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp4_e2m1": 0.5,
}
#: ``layer_types`` entries that keep a KV entry for every context token.
_FULL_LAYERS = frozenset({"full_attention", "attention", "global"})


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (multimodal configs nest it)."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, Mapping) and _int(inner.get("num_hidden_layers")):
            return inner
    return config


def value_bytes(config: Mapping[str, Any], kv_cache_dtype: str, dtype: str) -> float | None:
    """Bytes of one cached value: the KV-cache dtype, else the model's serving dtype."""
    kv = (kv_cache_dtype or "auto").lower()
    if kv != "auto":
        return _BYTES.get(kv)
    model = (dtype or "auto").lower()
    if model == "auto":
        model = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower()
        model = model.removeprefix("torch.")
        if model in ("float32", "float"):
            return 2.0  # served in 16 bits
    return _BYTES.get(model)


def full_attention_layers(config: Mapping[str, Any]) -> int | None:
    """Layers whose KV grows with the context (None when the layout is not understood)."""
    layers = _int(config.get("num_hidden_layers"))
    if layers is None:
        return None
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if t in _FULL_LAYERS)
    interval = _int(config.get("full_attention_interval"))
    if interval is not None:
        return layers // interval
    if config.get("use_sliding_window") and config.get("sliding_window"):
        return None  # windowed layers read a bounded KV: the split is model-specific
    return layers


def _per_layer_values(config: Mapping[str, Any], tp_size: int) -> int | None:
    """Cached values per token and layer on one rank."""
    latent = _int(config.get("kv_lora_rank"))
    if latent is not None:  # MLA: one latent, replicated on every rank
        return latent + (_int(config.get("qk_rope_head_dim")) or 0)
    heads = _int(config.get("num_attention_heads"))
    kv_heads = _int(config.get("num_key_value_heads")) or heads
    head_dim = _int(config.get("head_dim"))
    if head_dim is None and heads and _int(config.get("hidden_size")):
        head_dim = config["hidden_size"] // heads
    if kv_heads is None or head_dim is None:
        return None
    return 2 * max(kv_heads // max(tp_size, 1), 1) * head_dim


def kv_bytes_per_token(
    config: Mapping[str, Any],
    *,
    kv_cache_dtype: str = "auto",
    dtype: str = "auto",
    tp_size: int = 1,
) -> float | None:
    """KV bytes per context token one rank reads for one request (None if unknown)."""
    cfg = text_config(config)
    layers = full_attention_layers(cfg)
    per_layer = _per_layer_values(cfg, tp_size)
    size = value_bytes(cfg, kv_cache_dtype, dtype)
    if not layers or per_layer is None or size is None:
        return None
    return float(layers * per_layer * size)
