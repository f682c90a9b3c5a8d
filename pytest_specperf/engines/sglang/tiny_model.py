"""Tiny Llama-style model directories for SGLang runs with random (dummy) weights.

``python -m pytest_specperf.engines.sglang.tiny_model OUT_DIR`` writes ``OUT_DIR/target``
and ``OUT_DIR/draft``: a ``config.json`` each (``LlamaForCausalLM``, same vocabulary), no
weights and no tokenizer. Serve them with ``--load-format dummy
--speculative-draft-load-format dummy --skip-tokenizer-init`` and the STANDALONE algorithm
(a small draft model of the same family, driven by SGLang's EAGLE V2 worker), so a GPU
machine without internet or checkpoints can run the SGLang backend end to end. Prompts are
token ids (the plugin sends ``input_ids``), so no tokenizer is needed. With random weights
the draft is almost never accepted; set ``SGLANG_SIMULATE_ACC_LEN`` in the server's
environment to pin the acceptance length.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VOCAB = 32000
MAX_POSITIONS = 131072 + 2048


def llama_config(
    *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


TARGET = llama_config(hidden=1024, layers=8, heads=16, kv_heads=4, intermediate=2816)
DRAFT = llama_config(hidden=512, layers=2, heads=8, kv_heads=2, intermediate=1408)


def write(out_dir: str | Path) -> tuple[Path, Path]:
    """Write the target and draft model directories; return their paths."""
    out = Path(out_dir)
    paths = []
    for name, cfg in (("target", TARGET), ("draft", DRAFT)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
        paths.append(d)
    return paths[0], paths[1]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pytest_specperf.engines.sglang.tiny_model OUT_DIR", file=sys.stderr)
        return 2
    target, draft = write(argv[0])
    print(target)
    print(draft)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
