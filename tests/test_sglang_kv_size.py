"""KV bytes per context token for SGLang runs, from real config.json shapes.

The files under ``tests/data/model_configs/`` are the config.json files of the named
Hugging Face models (transcribed whole); the sizes asserted are worked out by hand below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specperf.engines.sglang.backend import SGLangBackend
from pytest_specperf.engines.sglang.kv_size import (
    full_attention_layers,
    kv_bytes_per_token,
    value_bytes,
)

CONFIGS = Path(__file__).parent / "data" / "model_configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("name", "kw", "expected"),
    [
        # GQA: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes (bf16)
        ("llama-3.1-8b-instruct", {}, 2 * 32 * 8 * 128 * 2),
        # tensor parallel 2: 4 KV heads per rank
        ("llama-3.1-8b-instruct", {"tp_size": 2}, 2 * 32 * 4 * 128 * 2),
        # 16 ranks, 8 KV heads: each rank keeps one (replicated) head
        ("llama-3.1-8b-instruct", {"tp_size": 16}, 2 * 32 * 1 * 128 * 2),
        ("llama-3.1-8b-instruct", {"kv_cache_dtype": "fp8_e4m3"}, 2 * 32 * 8 * 128 * 1),
        # head_dim from hidden_size / heads = 3584 / 28 = 128; the sliding window is off
        ("qwen2.5-7b-instruct", {}, 2 * 28 * 4 * 128 * 2),
        ("qwen3-8b", {}, 2 * 36 * 8 * 128 * 2),
        ("qwen3-8b", {"dtype": "float16"}, 2 * 36 * 8 * 128 * 2),
        # MLA: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes, on every rank
        ("deepseek-v3", {}, 61 * (512 + 64) * 2),
        ("deepseek-v3", {"tp_size": 8}, 61 * (512 + 64) * 2),
        ("deepseek-v3", {"kv_cache_dtype": "fp8_e5m2"}, 61 * (512 + 64) * 1),
    ],
)
def test_real_configs(name, kw, expected):
    assert kv_bytes_per_token(config(name), **kw) == expected


def test_kimi_k2_is_mla_like_deepseek():
    kimi = {**config("deepseek-v3"), "model_type": "kimi_k2", "num_attention_heads": 64,
            "num_key_value_heads": 64, "n_routed_experts": 384}  # fmt: skip
    assert kv_bytes_per_token(kimi) == 61 * (512 + 64) * 2


def test_hybrid_and_unknown_layouts():
    qwen = config("qwen3-8b")
    # only full-attention layers keep a KV that grows with the context
    assert full_attention_layers({**qwen, "layer_types": ["full_attention", "linear_attention"] * 18}) == 18
    assert full_attention_layers({**qwen, "full_attention_interval": 4}) == 9
    assert kv_bytes_per_token({**qwen, "use_sliding_window": True, "sliding_window": 4096}) is None
    nested = {"architectures": ["X"], "text_config": qwen}
    assert kv_bytes_per_token(nested) == 2 * 36 * 8 * 128 * 2
    assert kv_bytes_per_token({"num_hidden_layers": 4}) is None
    assert kv_bytes_per_token(qwen, kv_cache_dtype="int3") is None


@pytest.mark.parametrize(
    ("cfg", "kv", "dtype", "size"),
    [
        ({"torch_dtype": "bfloat16"}, "auto", "auto", 2.0),
        ({"torch_dtype": "float32"}, "auto", "auto", 2.0),  # served in 16 bits
        ({"dtype": "torch.float16"}, "auto", "auto", 2.0),
        ({}, "auto", "float32", 4.0),
        ({}, "fp4_e2m1", "auto", 0.5),
    ],
)
def test_value_bytes(cfg, kv, dtype, size):
    assert value_bytes(cfg, kv, dtype) == size


def test_backend_reads_the_served_models_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "deepseek-v3.json").read_text())
    backend = SGLangBackend()
    info = {"model_path": str(model), "kv_cache_dtype": "auto", "dtype": "auto", "tp_size": 8}
    assert backend.kv_bytes_per_token(info) == 61 * 576 * 2
    info["kv_cache_dtype"] = "fp8_e4m3"
    assert backend.kv_bytes_per_token(info) == 61 * 576
    # a server whose model is not on this machine (attach mode): no figure, no error
    assert backend.kv_bytes_per_token({"model_path": str(tmp_path / "elsewhere")}) is None
    assert backend.kv_bytes_per_token({}) is None
