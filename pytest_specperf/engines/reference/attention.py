"""Attention that reads the KV cache through a request's page table.

A context of ``n`` tokens lives in pages listed by the page table. ``plan_reads`` splits
the table into maximal runs of physically consecutive pages: long runs are read as
views of the pool (no copy), the short leftovers are gathered with one ``index_select``
per layer. A contiguous page table therefore costs no copy at all, while a fragmented
one pays a gather of its whole KV every layer and step, as scattered reads cost on a GPU.

Each read segment is attended separately and the partial results are merged with their
log-sum-exp weights (split-K / flash-decoding), so the result does not depend on how
the context was split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Runs shorter than this many pages are gathered rather than read as views.
MIN_VIEW_PAGES = 4
#: At most this many views per request (the longest runs); the rest is gathered.
MAX_VIEWS = 16
#: On the CPU, context is attended in chunks of this many tokens (see paged_attention).
CPU_CHUNK_TOKENS = 8192


@dataclass(frozen=True)
class ReadPlan:
    """How to read the first ``context_len`` tokens of one request's KV."""

    context_len: int
    views: tuple[tuple[int, int], ...]  # slot ranges [start, end)
    gather_pages: torch.Tensor | None  # page ids in logical order, last page possibly partial
    gather_len: int  # valid tokens in the gathered buffer

    @property
    def copied_tokens(self) -> int:
        return self.gather_len


def plan_reads(
    pages: list[int],
    context_len: int,
    page_size: int,
    device: Any,
    stage: Callable[[list[int]], torch.Tensor] | None = None,
) -> ReadPlan:
    """Split ``pages`` (a page table) into views and one gather for ``context_len`` tokens.

    ``stage`` sends the gathered page ids to the device (the engine's pinned staging);
    without it they are copied with ``torch.tensor`` (tests, CPU).
    """
    import torch

    if context_len <= 0:
        return ReadPlan(0, (), None, 0)
    n = -(-context_len // page_size)
    last_valid = context_len - (n - 1) * page_size
    runs: list[tuple[int, int]] = []  # [start index, end index) into pages
    start = 0
    for i in range(1, n):
        if pages[i] != pages[i - 1] + 1:
            runs.append((start, i))
            start = i
    runs.append((start, n))
    long_runs = sorted(
        (r for r in runs if r[1] - r[0] >= MIN_VIEW_PAGES), key=lambda r: r[0] - r[1]
    )[:MAX_VIEWS]
    chosen = set(long_runs)
    views = []
    for a, b in sorted(long_runs):
        end_slot = pages[b - 1] * page_size + (last_valid if b == n else page_size)
        views.append((pages[a] * page_size, end_slot))
    rest = [p for r in runs if r not in chosen for p in pages[r[0] : r[1]]]
    if not rest:
        return ReadPlan(context_len, tuple(views), None, 0)
    gather_len = len(rest) * page_size
    if rest[-1] == pages[n - 1]:
        gather_len -= page_size - last_valid
    gp = stage(rest) if stage is not None else torch.tensor(rest, dtype=torch.long, device=device)
    return ReadPlan(context_len, tuple(views), gp, gather_len)


def _partial(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q (H, M, D)`` over ``k, v (H, S, D)``: normalized output and LSE."""
    import torch

    s = torch.bmm(q, k.transpose(1, 2))
    s.mul_(scale)
    if mask is not None:
        s.add_(mask)
    m = s.amax(dim=-1, keepdim=True)
    s.sub_(m).exp_()
    denom = s.sum(dim=-1, keepdim=True)
    o = torch.bmm(s, v).div_(denom)
    return o, m + denom.log()


def paged_attention(
    q: torch.Tensor,
    block_k: torch.Tensor,
    block_v: torch.Tensor,
    pool_k: torch.Tensor,
    pool_v: torch.Tensor,
    plan: ReadPlan,
    page_size: int,
    block_mask: torch.Tensor | None,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Attention of one request's block over its paged context plus the block itself.

    ``q``: ``(T, H, D)``; ``block_k``/``block_v``: ``(T, Hkv, D)``, the block's own keys
    (``block_mask`` is added to their scores, e.g. causal). Pools: ``(Hkv, slots, D)``.
    With ``chunk_tokens``, the context is read in chunks of at most that many tokens
    (split-K, as GPU decode kernels do): on the CPU this keeps every temporary small
    enough for the heap, so a step does not pay page faults for fresh hundred-megabyte
    buffers, whose cost depends on the host's huge-page supply rather than on the code.
    Returns ``(T, H, D)``.
    """
    import torch

    t, h, d = q.shape
    hkv = block_k.shape[1]
    g = h // hkv
    scale = d**-0.5
    # (T, Hkv, g, D) -> (Hkv, g*T, D), rows ordered (group, token)
    qh = q.view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d)
    mask = None
    if block_mask is not None:
        mask = block_mask.repeat(g, 1).unsqueeze(0)  # (1, g*T, T)
    parts = [_partial(qh, block_k.transpose(0, 1), block_v.transpose(0, 1), scale, mask)]
    step = chunk_tokens or (1 << 62)
    for a, b in plan.views:
        for c in range(a, b, step):
            e = min(c + step, b)
            parts.append(_partial(qh, pool_k[:, c:e], pool_v[:, c:e], scale, None))
    if plan.gather_pages is not None:
        gp = plan.gather_pages
        per = max(1, step // page_size)
        kpool, vpool = (pool.view(hkv, -1, page_size, d) for pool in (pool_k, pool_v))
        left = plan.gather_len
        for i in range(0, gp.numel(), per):
            idx = gp[i : i + per]
            n = idx.numel()
            take = min(n * page_size, left)
            left -= take
            kp = kpool.index_select(1, idx).view(hkv, n * page_size, d)[:, :take]
            vp = vpool.index_select(1, idx).view(hkv, n * page_size, d)[:, :take]
            parts.append(_partial(qh, kp, vp, scale, None))
    if len(parts) == 1:
        out = parts[0][0]
    else:
        outs = torch.stack([p[0] for p in parts])  # (P, Hkv, gT, D)
        lses = torch.stack([p[1] for p in parts])  # (P, Hkv, gT, 1)
        w = torch.softmax(lses, dim=0)
        out = (outs * w).sum(dim=0)
    # (Hkv, g*T, D) -> (T, H, D)
    return out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, h, d)


def padded_paged_attention(
    q: torch.Tensor,
    block_k: torch.Tensor,
    block_v: torch.Tensor,
    pool_k: torch.Tensor,
    pool_v: torch.Tensor,
    page_index: torch.Tensor,
    context_lens: torch.Tensor,
    page_size: int,
    block_mask: torch.Tensor | None,
) -> torch.Tensor:
    """Static-shape variant for CUDA graphs: no host sync, no data-dependent shapes.

    ``q``: ``(B*T, H, D)``; ``page_index``: ``(B, MP)`` page ids padded to a bucket;
    ``context_lens``: ``(B,)``. Every request gathers ``MP`` pages through its page table
    and masks positions at or beyond its context length, the way a paged-attention
    kernel reads through a page-table tensor. The gather lands in ``(Hkv, B, S, D)``
    order, which the matmuls read as is: the KV moves three times (gather read, copy
    write, attention read), never a fourth for a layout change. Returns ``(B*T, H, D)``.
    """
    import torch

    b, mp = page_index.shape
    n, h, d = q.shape
    t = n // b
    hkv = block_k.shape[1]
    g = h // hkv
    scale = d**-0.5
    s_len = mp * page_size
    qh = q.view(b, t, hkv, g, d).permute(2, 0, 3, 1, 4).reshape(hkv, b, g * t, d)
    flat = page_index.reshape(-1)
    kc = pool_k.view(hkv, -1, page_size, d).index_select(1, flat).view(hkv, b, s_len, d)
    vc = pool_v.view(hkv, -1, page_size, d).index_select(1, flat).view(hkv, b, s_len, d)
    kb = block_k.view(b, t, hkv, d).permute(2, 0, 1, 3)  # (Hkv, B, T, D)
    vb = block_v.view(b, t, hkv, d).permute(2, 0, 1, 3)
    sc = torch.matmul(qh, kc.transpose(-1, -2)) * scale  # (Hkv, B, gT, S)
    invalid = torch.arange(s_len, device=q.device)[None, :] >= context_lens[:, None]  # (B, S)
    sc = sc.masked_fill(invalid[None, :, None, :], float("-inf"))
    sb = torch.matmul(qh, kb.transpose(-1, -2)) * scale  # (Hkv, B, gT, T)
    if block_mask is not None:
        sb = sb + block_mask.repeat(g, 1)
    p = torch.softmax(torch.cat([sc, sb], dim=-1), dim=-1)
    out = torch.matmul(p[..., :s_len], vc) + torch.matmul(p[..., s_len:], vb)
    return out.view(hkv, b, g, t, d).permute(1, 3, 0, 2, 4).reshape(n, h, d)
