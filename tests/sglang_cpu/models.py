"""Tiny Llama models for live SGLang on a CPU: ``config.json`` only (dummy weights).

Served with ``--load-format dummy --speculative-draft-load-format dummy
--skip-tokenizer-init``: SGLang fills the weights with random values, so the tokens are
meaningless but deterministic for a given server, and greedy speculative decoding must give
exactly the tokens of plain greedy decoding. Hidden 64, 4 heads / 2 KV heads, vocabulary
4096: a decode step costs milliseconds on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOCAB = 4096
#: Context of the tiny models (the live tests keep to 8k: the stand-in attention is O(n)).
MAX_POSITIONS = 16384


def llama(layers: int, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    cfg.update(extra)
    return cfg


#: name -> config. ``target4`` is the EAGLE3 target (its draft reads layers 0, 1 and 2).
MODELS: dict[str, dict[str, Any]] = {
    "target": llama(2),
    "target4": llama(4),
    "draft": llama(1),  # STANDALONE: a small model of the same family
    "eagle": llama(1, architectures=["LlamaForCausalLMEagle"]),
    "eagle3": llama(
        1,
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=VOCAB,
        target_hidden_size=64,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
    ),
}


def write_models(out_dir: Path) -> dict[str, Path]:
    """Write every model directory under ``out_dir``; return name -> path."""
    paths = {}
    for name, cfg in MODELS.items():
        d = out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
        paths[name] = d
    return paths
