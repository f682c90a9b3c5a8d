"""STAND-IN for the CPU build of ``sgl-kernel``, in plain torch: test support, not a kernel.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports names from ``sgl_kernel`` at module
level; the real package is a compiled (AVX-512/AMX) extension that is not on PyPI for this
machine. This module lets real SGLang 0.5.23 serve tiny models on any CPU for the live tests
(``tests/test_sglang_live.py``): it gives real bodies to the ops SGLang's CPU path *calls*
for a Llama model with plain and chain-draft speculative decoding (STANDALONE, EAGLE,
EAGLE3, topk 1), and makes every other name importable as a function that raises
:class:`NotImplementedError` naming itself if it is ever called.

Every op with a body is checked against a reference in ``tests/test_sglang_cpu_stand_in.py``
(SGLang's own Triton kernel for the same op, run by Triton's interpreter, or a plain
float64 attention). Speed is not the point: these are O(context) Python/torch loops.

``convert_weight_packed`` is deliberately absent: SGLang's ``cpu_has_amx_support()`` tests
for it, so it stays false and every layer runs its plain-torch ``forward_native``.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import torch

__version__ = "0.0.0+specperf.stand.in"
STAND_IN = True

# -- KV cache moves ---------------------------------------------------------------------------


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer (base address ``data_ptrs[b]``, row stride ``strides[b]`` bytes),
    copy row ``src_loc[j]`` to row ``tgt_loc[j]`` (rows are whole: stride bytes each)."""
    ptrs = [int(p) for p in data_ptrs.tolist()]
    row_bytes = [int(s) for s in strides.tolist()]
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for base, stride in zip(ptrs, row_bytes):
        for tgt, src in pairs:
            if tgt != src:
                ctypes.memmove(base + int(tgt) * stride, base + int(src) * stride, stride)


# -- attention over the token-to-KV pool -----------------------------------------------------


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    logit_cap: float,
    q_offset: int,
    causal: bool,
    window: int,
) -> torch.Tensor:
    """Attention of ``q`` [Lq, Hq, D] over ``keys``/``values`` [Lk, Hkv, D] (GQA), query i at
    position ``q_offset + i``; float32 accumulation. Returns [Lq, Hq, Dv] in float32."""
    lq, hq, _ = q.shape
    lk, hkv, _ = keys.shape
    fused = not causal or (q_offset + lq == lk and q_offset <= lq)
    if logit_cap <= 0 and window <= 0 and lq > 1 and fused:
        # torch's fused attention for prefill chunks. Its causal mask is aligned to the first
        # key, so queries starting at q_offset are preceded by q_offset unused zero queries
        # (cheaper than an explicit [lq, lk] mask, which the fused kernel cannot take). Only
        # where those are at most as many as the real ones: a verify pass (4 queries after
        # thousands of tokens) takes the explicit path below.
        pad = q_offset if causal else 0
        qf = q.float()
        if pad:
            qf = torch.cat([qf.new_zeros((pad, *qf.shape[1:])), qf])
        group = hq // hkv
        out = torch.nn.functional.scaled_dot_product_attention(
            qf.transpose(0, 1).unsqueeze(0),
            keys.float().repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0),
            values.float().repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0),
            is_causal=causal,
            scale=scale,
        )
        return out.squeeze(0).transpose(0, 1)[pad:]
    group = hq // hkv
    qf = q.float().reshape(lq, hkv, group, -1)
    kf = keys.float()
    vf = values.float()
    logits = torch.einsum("qhgd,khd->hgqk", qf, kf) * scale
    if logit_cap > 0:
        logits = logit_cap * torch.tanh(logits / logit_cap)
    qpos = torch.arange(lq).unsqueeze(1) + q_offset
    kpos = torch.arange(lk).unsqueeze(0)
    mask = torch.zeros((lq, lk), dtype=torch.bool)
    if causal:
        mask |= kpos > qpos
    if window > 0:
        mask |= kpos <= qpos - window
    if bool(mask.any()):
        logits = logits.masked_fill(mask, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("hgqk,khd->qhgd", probs, vf)
    return out.reshape(lq, hq, -1)


def _unsupported(
    name: str,
    *,
    is_cross_attention: bool,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    k_buffer: torch.Tensor,
) -> None:
    if is_cross_attention or encoder_lens is not None:
        raise NotImplementedError(f"stand-in sgl_kernel.{name}: no cross attention")
    if sinks is not None:
        raise NotImplementedError(f"stand-in sgl_kernel.{name}: no attention sinks")
    if k_buffer.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise NotImplementedError(f"stand-in sgl_kernel.{name}: no fp8 KV cache")


def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    o: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One query token per sequence. When ``k``/``v`` are given, they are first written
    into the pool at ``loc`` (the kernel stores the new token's KV itself); then sequence i
    attends over the slots ``req_to_token[req_pool_indices[i], :seq_lens[i]]``.
    ``attn_logits`` is the real kernel's split-K scratch; unused here."""
    _unsupported(
        "decode_attention_cpu",
        is_cross_attention=is_cross_attention,
        encoder_lens=encoder_lens,
        sinks=sinks,
        k_buffer=k_buffer,
    )
    if k is not None and v is not None:
        k_buffer[loc] = k.reshape(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc] = v.reshape(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    rows = req_pool_indices.tolist()
    lens = seq_lens.tolist()
    for i, (row, n) in enumerate(zip(rows, lens)):
        slots = req_to_token[int(row), : int(n)].long()
        keys = k_buffer[slots] * key_scale if key_scale != 1.0 else k_buffer[slots]
        vals = v_buffer[slots] * value_scale if value_scale != 1.0 else v_buffer[slots]
        out = _attend(
            q[i : i + 1], keys, vals, sm_scale, logit_cap, int(n) - 1, False, sliding_window_size
        )
        o[i] = out[0].to(o.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Sequence i appends ``extend_seq_lens[i]`` tokens (rows ``extend_start_loc[i]`` on of
    ``q_extend``/``k_extend``/``v_extend``) to a prefix of ``seq_lens[i] - extend_seq_lens[i]``
    tokens in the pool; its queries attend over the prefix (pool slots
    ``req_to_token[req_pool_indices[i], :prefix]``) and, causally, over the extend tokens
    (read from ``k_extend``/``v_extend``, or from the pool when those are None)."""
    _unsupported(
        "extend_attention_cpu",
        is_cross_attention=is_cross_attention,
        encoder_lens=encoder_lens,
        sinks=sinks,
        k_buffer=k_buffer,
    )
    if tree_mask is not None:
        raise NotImplementedError(
            "stand-in sgl_kernel.extend_attention_cpu: no tree mask (chain drafts, topk 1, only)"
        )
    rows = req_pool_indices.tolist()
    for i, (row, n, e, s) in enumerate(
        zip(rows, seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist())
    ):
        n, e, s = int(n), int(e), int(s)
        prefix = n - e
        slots = req_to_token[int(row), :n].long()
        keys = k_buffer[slots]
        vals = v_buffer[slots]
        if k_extend is not None and v_extend is not None:
            keys = torch.cat([keys[:prefix], k_extend[s : s + e].to(keys.dtype)])
            vals = torch.cat([vals[:prefix], v_extend[s : s + e].to(vals.dtype)])
        if key_scale != 1.0:
            keys = keys * key_scale
        if value_scale != 1.0:
            vals = vals * value_scale
        out = _attend(
            q_extend[s : s + e],
            keys,
            vals,
            sm_scale,
            logit_cap,
            prefix,
            is_causal,
            sliding_window_size,
        )
        o_extend[s : s + e] = out.to(o_extend.dtype)
        del i


# -- index bookkeeping of the draft/verify loop ------------------------------------------------


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """``req_to_token`` rows for the multi-step draft's decode attention, one per candidate
    (``bs * topk``). With topk 1 (chain drafts) the draft tokens' slots follow the prefix in
    the request's own row (allocated contiguously), so candidate i's row is request i's."""
    if topk != 1:
        raise NotImplementedError(
            "stand-in sgl_kernel.build_draft_decode_metadata_cpu: topk 1 (chain drafts) only"
        )
    del seq_lens, num_steps
    return req_to_token[req_pool_indices.long(), :pool_len].clone()


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write request i's slots ``out_cache_loc`` (packed, request after request) into
    ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]``."""
    del pool_len
    at = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    ):
        n = int(end) - int(start)
        if n > 0:
            req_to_token[int(row), int(start) : int(end)] = out_cache_loc[at : at + n].to(
                req_to_token.dtype
            )
        at += max(n, 0)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse: pack ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]``
    into ``out_cache_loc``, request after request."""
    del pool_len
    at = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    ):
        n = int(end) - int(start)
        if n > 0:
            out_cache_loc[at : at + n] = req_to_token[int(row), int(start) : int(end)].to(
                out_cache_loc.dtype
            )
        at += max(n, 0)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """Copy each request's ``topk * speculative_num_steps`` slots from ``seq_lens[i]`` on
    into its block of ``out_cache_loc``."""
    del pool_len
    width = topk * speculative_num_steps
    for i, (row, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[
            int(row), int(n) : int(n) + width
        ].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i]`` = the last accepted token of request i (``accept_lens`` counts
    the bonus token): ``accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]``."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + int(n) - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Compact: the slots ``out_cache_loc[accept_index[j]]`` of every accepted entry
    (``accept_index[j] != -1``), in order, into ``accept_out_cache_loc``."""
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE's draft tree: tree mask, positions and the retrieve links, as SGLang's
    ``sgl_build_tree_kernel_efficient_triton`` builds them (FULL_MASK and QLEN_ONLY modes)."""
    n = draft_token_num
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(
            f"stand-in sgl_kernel.build_tree_kernel_efficient_cpu: tree mask mode {mode}"
        )
    lens = [int(x) for x in verified_seq_len.tolist()]
    sel = selected_index.reshape(selected_index.shape[0], -1).tolist()
    parents = parent_list.reshape(parent_list.shape[0], -1).tolist()
    mask = tree_mask.view(-1)
    pos = positions.view(-1)
    r_index = retrieve_index.view(-1)
    r_next = retrieve_next_token.view(-1)
    r_sib = retrieve_next_sibling.view(-1)
    prefix_sum = 0
    for b, seq_len in enumerate(lens):
        seq_tree_idx = n * n * b + prefix_sum * n
        prefix_sum += seq_len
        pos[b * n] = seq_len
        base = b * n
        for i in range(n - 1, 0, -1):
            r_index[base + i] = base + i
            parent_tb = int(sel[b][i - 1]) // topk
            parent_position = 0
            found = parent_tb == 0
            if not found:
                parent_token = parents[b][parent_tb]
                for pp in range(n - 1):
                    if sel[b][pp] == parent_token:
                        parent_position, found = pp + 1, True
                        break
            if found:
                nxt = int(r_next[base + parent_position])
                r_next[base + parent_position] = i
                if nxt != -1:
                    r_sib[base + i] = nxt
        r_index[base] = base
        for x in range(n):
            if mode == 0:
                tok = seq_tree_idx + (seq_len + n) * x + seq_len + 1
            else:
                tok = n * n * b + n * x + 1
            mask[tok - 1] = True
            mask[tok : tok + n - 1] = False
            if x == 0:
                continue
            cur = x - 1
            position = 0
            for _ in range(depth):
                position += 1
                mask[tok + cur] = True
                parent_tb = int(sel[b][cur]) // topk
                if parent_tb == 0:
                    break
                parent_token = parents[b][parent_tb]
                for cp in range(n - 1):
                    if sel[b][cp] == parent_token:
                        cur = cp
                        break
                else:
                    break
            pos[base + x] = position + seq_len


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification of a draft tree, as SGLang's ``verify_tree_greedy_kernel_triton``:
    walk from the root, at each level accept the first child whose token equals the target's
    prediction at the last accepted node; write ``predicts``, ``accept_index`` and
    ``accept_token_num``."""
    bs, n = candidates.shape
    spec = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrive_index.reshape(bs, n).tolist()
    r_next = retrive_next_token.reshape(bs, n).tolist()
    r_sib = retrive_next_sibling.reshape(bs, n).tolist()
    target = target_predict.reshape(-1)
    pred = predicts.view(-1)
    for b in range(bs):
        last = r_index[b][0]
        accept_index[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, spec):
            cur = r_next[b][cur]
            want = int(target[last])
            matched = False
            while cur != -1:
                if cand[b][cur] == want:
                    pred[last] = want
                    accepted += 1
                    accept_index[b, accepted] = r_index[b][cur]
                    last = r_index[b][cur]
                    matched = True
                    break
                cur = r_sib[b][cur]
            if not matched:
                break
        accept_token_num[b] = accepted
        pred[last] = target[last]


# -- registration -------------------------------------------------------------------------------

#: Schemas of the ops SGLang reaches through ``torch.ops.sgl_kernel`` on this path.
_OPS: dict[str, tuple[str, Callable[..., None]]] = {
    "decode_attention_cpu": (
        "decode_attention_cpu(Tensor q, Tensor(a!) k_buffer, Tensor(b!) v_buffer, "
        "float key_scale, float value_scale, Tensor(c!) o, Tensor? k, Tensor? v, Tensor loc, "
        "Tensor(d!) attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attention, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()",
        decode_attention_cpu,
    ),
    "extend_attention_cpu": (
        "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
        "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float key_scale, "
        "float value_scale, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
        "Tensor extend_seq_lens, Tensor extend_start_loc, int? max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()",
        extend_attention_cpu,
    ),
}


def _register() -> Any:
    if hasattr(torch.ops.sgl_kernel, "decode_attention_cpu"):
        return None  # registered already (the module was imported twice under two names)
    lib = torch.library.Library("sgl_kernel", "DEF")
    for name, (schema, fn) in _OPS.items():
        lib.define(schema)
        lib.impl(name, fn, "CPU")
    return lib


_LIB = _register()  # keep the Library alive: its registrations die with it


def __getattr__(name: str) -> Any:
    """Any other name imports (SGLang imports many at module level) and raises if called."""
    if name.startswith("__"):
        raise AttributeError(name)

    def not_in_stand_in(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but the stand-in sgl_kernel of the live CPU tests "
            "(tests/sglang_cpu/stand_in) has no body for it: add one, with a reference test"
        )

    not_in_stand_in.__name__ = name
    return not_in_stand_in
