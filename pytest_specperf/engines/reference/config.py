"""Named model configurations of the reference engine."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the Llama-style target and of the DFlash-style block drafter.

    Weights are random, drawn from ``seed``. The target's greedy next token is dominated
    by its embedding -> LM-head path (a fixed token -> token map); ``branch_scale`` and
    ``mlp_scale`` set how strongly the attention and MLP branches push it off that path,
    and ``qk_gain`` sharpens attention so that the push depends on the context at any
    length. The drafter follows the embedding -> LM-head path, so it agrees with the
    target often but not always: acceptance comes from real token matches and is neither
    trivial nor perfect. ``draft_branch_scale`` scales the drafter's own layer and its
    conditioning on the target's hidden states.
    """

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_num_layers: int
    draft_fuse_layers: tuple[int, ...]
    page_size: int
    max_context_len: int
    kv_pool_tokens: int
    max_batch_size: int
    branch_scale: float
    mlp_scale: float
    qk_gain: float
    draft_branch_scale: float
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (RoPE)")
        if not all(0 <= i < self.num_layers for i in self.draft_fuse_layers):
            raise ValueError("draft_fuse_layers must index target layers")
        if self.kv_pool_tokens % self.page_size:
            raise ValueError("kv_pool_tokens must be a multiple of page_size")

    @property
    def num_pages(self) -> int:
        return self.kv_pool_tokens // self.page_size

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["draft_fuse_layers"] = list(self.draft_fuse_layers)
        return d

    def fingerprint(self) -> str:
        """Short stable hash of every size and seed: a change means different work."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of K and V per token over all target layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize


#: Sized for 2 CPU cores: a decode step at 46k context takes tens of milliseconds.
TINY = ModelConfig(
    name="tiny",
    vocab_size=4096,
    hidden_size=256,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=512,
    draft_num_layers=1,
    draft_fuse_layers=(0, 1, 3),
    page_size=16,
    max_context_len=131072 + 4096,
    kv_pool_tokens=2 * (131072 + 4096),
    max_batch_size=8,
    branch_scale=0.35,
    mlp_scale=0.05,
    qk_gain=3.0,
    draft_branch_scale=0.05,
)
#: For GPUs: about 1B parameters, KV heavy enough that long contexts are memory-bound; the
#: same behaviour knobs, pool and limits as ``TINY``, larger sizes.
MEDIUM = dataclasses.replace(
    TINY,
    name="medium",
    vocab_size=32000,
    hidden_size=2048,
    num_layers=16,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=5632,
    draft_fuse_layers=(1, 7, 14),
)
CONFIGS: dict[str, ModelConfig] = {c.name: c for c in (TINY, MEDIUM)}


def get_config(name: str) -> ModelConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(
            f"unknown reference model config {name!r}; choose one of: {', '.join(CONFIGS)}"
        ) from None
