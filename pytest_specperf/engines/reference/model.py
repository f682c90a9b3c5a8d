"""Llama-style target and DFlash-style block drafter with seeded random weights.

Target: token embedding, ``num_layers`` x (RMSNorm, grouped-query attention with RoPE,
RMSNorm, SwiGLU MLP), final RMSNorm, LM head. Attention reads the paged KV cache through
each request's page table (see ``attention.py``).

Drafter: one forward drafts a whole block. Block offset ``k`` starts from the shared
embedding of ``chain[k][anchor]``, where ``chain`` iterates the target's embedding ->
LM-head token map (what a trained drafter learns of its target; here it is derived from
the target's weights at build time instead of trained), plus a projection of the
target's hidden states at the last verified position, fused from ``draft_fuse_layers``.
Its layers attend to a draft KV cache filled from the target's fused hidden states of
committed tokens (what SGLang's ``_append_target_hidden_to_draft_kv_by_loc`` does) and
bidirectionally within the block. The shared LM head turns each offset into a token.
"""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specperf.engines.reference.attention import (
    CPU_CHUNK_TOKENS,
    ReadPlan,
    padded_paged_attention,
    paged_attention,
)

if TYPE_CHECKING:
    import torch

    from pytest_specperf.engines.reference.config import ModelConfig
    from pytest_specperf.engines.reference.kv import KVPool


@dataclass(frozen=True)
class SeqRows:
    """Rows ``[start, end)`` of a flattened forward that belong to one request."""

    start: int
    end: int
    plan: ReadPlan


@dataclass(frozen=True)
class PlannedReads:
    """Eager attention: per-request read plans (views for contiguous runs, one gather)."""

    seqs: list[SeqRows]


@dataclass(frozen=True)
class PaddedReads:
    """Graph-capturable attention: padded page-index tensor and context lengths."""

    page_index: torch.Tensor  # (B, MP)
    context_lens: torch.Tensor  # (B,)


Reads = PlannedReads | PaddedReads


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    import torch

    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


class _Rope:
    def __init__(self, head_dim: int, theta: float, device: Any, dtype: Any) -> None:
        import torch

        self.inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
        )
        self.dtype = dtype

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]
        return f.cos().to(self.dtype)[:, None, :], f.sin().to(self.dtype)[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        import torch

        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


#: A weight tensor larger than this many elements is drawn in chunks of this size, each from
#: its own seeded generator, in parallel. Every tensor of the ``tiny`` model is smaller, so
#: its weights (and the CPU baselines recorded with them) are those of the serial draw.
WEIGHT_CHUNK = 1 << 20


def chunk_seed(seed: int, ordinal: int, chunk: int) -> int:
    """The generator seed of chunk ``chunk`` of the ``ordinal``-th weight tensor drawn."""
    digest = hashlib.sha256(f"specperf-weights/{seed}/{ordinal}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def weight_workers() -> int:
    """Threads that draw weight chunks: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class _Weights:
    """Seeded weight factory: draws on the host so every device gets the same weights.

    A tensor of at most ``WEIGHT_CHUNK`` elements comes from the model's one serial
    generator, in order. A larger one is drawn in ``WEIGHT_CHUNK``-element chunks, each
    from its own CPU generator seeded by (seed, tensor ordinal, chunk): the chunks are
    independent, so a thread pool draws them in parallel (torch releases the GIL) and
    each lands in its slice of the device tensor as it is drawn (no host copy of the whole
    model). The values depend on the seed and the shapes only: not on the device, the
    dtype's rounding aside, nor on the number of threads. ``wait`` returns once every
    chunk is in place; a tensor is not to be read before.
    """

    def __init__(self, seed: int, device: Any, dtype: Any, workers: int | None = None) -> None:
        import torch

        self.seed = seed
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.device = device
        self.dtype = dtype
        self.workers = workers if workers is not None else weight_workers()
        self._ordinal = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def normal(self, *shape: int, std: float) -> torch.Tensor:
        import torch

        ordinal, self._ordinal = self._ordinal, self._ordinal + 1
        numel = math.prod(shape)
        if numel <= WEIGHT_CHUNK:
            t = torch.randn(*shape, generator=self.gen, dtype=torch.float32) * std
            return t.to(device=self.device, dtype=self.dtype)
        out = torch.empty(*shape, device=self.device, dtype=self.dtype)
        flat = out.view(-1)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="specperf-weights")
        for c, start in enumerate(range(0, numel, WEIGHT_CHUNK)):
            dst = flat[start : start + WEIGHT_CHUNK]
            self._pending.append(
                self._pool.submit(self._draw, dst, chunk_seed(self.seed, ordinal, c), std)
            )
        return out

    @staticmethod
    def _draw(dst: torch.Tensor, seed: int, std: float) -> None:
        import torch

        gen = torch.Generator(device="cpu").manual_seed(seed)
        direct = dst.device.type == "cpu" and dst.dtype == torch.float32
        buf = dst if direct else torch.empty(dst.shape, dtype=torch.float32)
        buf.normal_(0.0, std, generator=gen)  # one pass: the same values as randn * std
        if not direct:
            dst.copy_(buf)

    def wait(self) -> None:
        """Every chunk drawn and in place (raises the first chunk's error, if any)."""
        pending, self._pending = self._pending, []
        try:
            for f in pending:
                f.result()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def ones(self, n: int) -> torch.Tensor:
        import torch

        return torch.ones(n, device=self.device, dtype=self.dtype)

    def layer(self, cfg: ModelConfig, out_scale: float, mlp_scale: float) -> _Layer:
        h, d = cfg.hidden_size, cfg.head_dim
        q_out, kv_out, inter = cfg.num_heads * d, cfg.num_kv_heads * d, cfg.intermediate_size
        return _Layer(
            attn_norm=self.ones(h),
            wq=self.normal(h, q_out, std=cfg.qk_gain * h**-0.5),
            wk=self.normal(h, kv_out, std=h**-0.5),
            wv=self.normal(h, kv_out, std=h**-0.5),
            wo=self.normal(q_out, h, std=out_scale * q_out**-0.5),
            mlp_norm=self.ones(h),
            w_gate=self.normal(h, inter, std=h**-0.5),
            w_up=self.normal(h, inter, std=h**-0.5),
            w_down=self.normal(inter, h, std=mlp_scale * inter**-0.5),
        )


class _Stack:
    """Shared transformer-layer code for the target and the drafter."""

    def __init__(self, cfg: ModelConfig, device: Any, dtype: Any) -> None:

        self.cfg = cfg
        self.rope = _Rope(cfg.head_dim, cfg.rope_theta, device, dtype)
        self.device = device
        self.dtype = dtype
        cpu = getattr(device, "type", str(device)) == "cpu"
        self.chunk_tokens = CPU_CHUNK_TOKENS if cpu else None
        self._masks: dict[tuple[int, bool], torch.Tensor | None] = {}

    def block_mask(self, t: int, causal: bool) -> torch.Tensor | None:
        import torch

        key = (t, causal)
        if key not in self._masks:
            if not causal or t == 1:
                self._masks[key] = None
            else:
                m = torch.full((t, t), float("-inf"), device=self.device, dtype=self.dtype)
                self._masks[key] = torch.triu(m, diagonal=1)
        return self._masks[key]

    def layer(
        self,
        x: torch.Tensor,
        w: _Layer,
        cos: torch.Tensor,
        sin: torch.Tensor,
        reads: Reads,
        kv: KVPool,
        pool: int,
        write_slots: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        import torch

        cfg = self.cfg
        n = x.shape[0]
        a = _rms_norm(x, w.attn_norm, cfg.rms_eps)
        q = (a @ w.wq).view(n, cfg.num_heads, cfg.head_dim)
        k = (a @ w.wk).view(n, cfg.num_kv_heads, cfg.head_dim)
        v = (a @ w.wv).view(n, cfg.num_kv_heads, cfg.head_dim)
        q = _Rope.apply(q, cos, sin)
        k = _Rope.apply(k, cos, sin)
        if write_slots is not None:
            kv.write(pool, write_slots, k, v)
        if isinstance(reads, PaddedReads):
            t = n // reads.page_index.shape[0]
            o = padded_paged_attention(
                q,
                k,
                v,
                kv.k[pool],
                kv.v[pool],
                reads.page_index,
                reads.context_lens,
                cfg.page_size,
                self.block_mask(t, causal),
            )
        else:
            o = torch.empty_like(q)
            for s in reads.seqs:
                o[s.start : s.end] = paged_attention(
                    q[s.start : s.end],
                    k[s.start : s.end],
                    v[s.start : s.end],
                    kv.k[pool],
                    kv.v[pool],
                    s.plan,
                    cfg.page_size,
                    self.block_mask(s.end - s.start, causal),
                    self.chunk_tokens,
                )
        x = x + o.reshape(n, -1) @ w.wo
        m = _rms_norm(x, w.mlp_norm, cfg.rms_eps)
        return x + (torch.nn.functional.silu(m @ w.w_gate) * (m @ w.w_up)) @ w.w_down


class TargetModel:
    """The verified model. ``forward`` also returns the fused hidden states for the drafter."""

    def __init__(self, cfg: ModelConfig, *, device: Any, dtype: Any) -> None:
        wf = _Weights(cfg.seed, device, dtype)
        self.cfg = cfg
        self.stack = _Stack(cfg, device, dtype)
        self.embed = wf.normal(cfg.vocab_size, cfg.hidden_size, std=1.0)
        self.layers = [
            wf.layer(cfg, cfg.branch_scale, cfg.mlp_scale) for _ in range(cfg.num_layers)
        ]
        self.final_norm = wf.ones(cfg.hidden_size)
        self.lm_head = wf.normal(cfg.vocab_size, cfg.hidden_size, std=cfg.hidden_size**-0.5)
        wf.wait()
        self._weights = wf

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return _rms_norm(h, self.final_norm, self.cfg.rms_eps) @ self.lm_head.T

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        reads: Reads,
        kv: KVPool,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal forward of a flattened batch; writes K/V at ``slots``.

        Returns logits ``(N, vocab)`` and fused hidden states ``(N, F * hidden)``.
        """
        import torch

        cos, sin = self.stack.rope.cos_sin(positions)
        x = self.embed[tokens]
        fused = []
        for i, w in enumerate(self.layers):
            x = self.stack.layer(x, w, cos, sin, reads, kv, i, slots, causal=True)
            if i in self.cfg.draft_fuse_layers:
                fused.append(x)
        return self.logits(x), torch.cat(fused, dim=-1)

    def token_map(self, chunk: int = 2048) -> torch.Tensor:
        """The embedding -> LM-head greedy map ``g(t) = argmax lm_head(norm(embed[t]))``."""
        import torch

        out = []
        for s in range(0, self.cfg.vocab_size, chunk):
            out.append(self.logits(self.embed[s : s + chunk]).argmax(dim=-1))
        return torch.cat(out)


class Drafter:
    """DFlash-style block drafter sharing the target's embedding and LM head."""

    def __init__(self, target: TargetModel, max_block: int) -> None:
        import torch

        cfg = target.cfg
        wf = target._weights
        self.cfg = cfg
        self.target = target
        self.stack = target.stack
        fused_dim = cfg.hidden_size * len(cfg.draft_fuse_layers)
        self.fc = wf.normal(fused_dim, cfg.hidden_size, std=fused_dim**-0.5)
        self.layers = [
            wf.layer(cfg, cfg.draft_branch_scale, cfg.draft_branch_scale)
            for _ in range(cfg.draft_num_layers)
        ]
        self.norm = wf.ones(cfg.hidden_size)
        wf.wait()
        g = target.token_map()
        chain = [torch.arange(cfg.vocab_size, device=g.device)]
        for _ in range(max_block - 1):
            chain.append(g[chain[-1]])
        self.chain = torch.stack(chain)  # (max_block, vocab)

    def commit_context(
        self, fused: torch.Tensor, positions: torch.Tensor, kv: KVPool, slots: torch.Tensor
    ) -> None:
        """Append draft K/V for committed tokens, from the target's fused hidden states."""
        cfg = self.cfg
        n = fused.shape[0]
        h = fused @ self.fc
        cos, sin = self.stack.rope.cos_sin(positions)
        for i, w in enumerate(self.layers):
            a = _rms_norm(h, w.attn_norm, cfg.rms_eps)
            k = _Rope.apply((a @ w.wk).view(n, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = (a @ w.wv).view(n, cfg.num_kv_heads, cfg.head_dim)
            kv.write(kv.draft_layer(i), slots, k, v)

    def draft(
        self,
        anchors: torch.Tensor,
        anchor_positions: torch.Tensor,
        cond: torch.Tensor,
        reads: list[ReadPlan] | PaddedReads,
        kv: KVPool,
        block: int,
    ) -> torch.Tensor:
        """Draft ``block - 1`` tokens after each anchor in one forward: ``(B, block - 1)``.

        ``reads`` is a read plan per request (eager) or padded page indices (graphs).
        """
        import torch

        cfg = self.cfg
        b = anchors.shape[0]
        toks = self.chain[:block, anchors].T.reshape(-1)  # (B * block,), rows per request
        x = self.target.embed[toks]
        c = (cond @ self.fc) * cfg.draft_branch_scale
        x = (x.view(b, block, -1) + c[:, None, :]).view(b * block, -1)
        offs = torch.arange(block, device=anchors.device)
        positions = (anchor_positions[:, None] + offs[None, :]).reshape(-1)
        cos, sin = self.stack.rope.cos_sin(positions)
        how: Reads = (
            reads
            if isinstance(reads, PaddedReads)
            else PlannedReads([SeqRows(i * block, (i + 1) * block, p) for i, p in enumerate(reads)])
        )
        for i, w in enumerate(self.layers):
            x = self.stack.layer(x, w, cos, sin, how, kv, kv.draft_layer(i), None, causal=False)
        logits = _rms_norm(x, self.norm, cfg.rms_eps) @ self.target.lm_head.T
        return logits.view(b, block, -1)[:, : block - 1].argmax(dim=-1)
