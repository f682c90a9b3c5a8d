"""The stand-in ``sgl_kernel`` of the live CPU tests (``sglang_cpu/stand_in``), op by op,
against references: SGLang's own Triton kernels for the bookkeeping ops (run by Triton's
interpreter, ``sglang_cpu/triton_reference.py``), plain float64 attention for the attention
ops, direct tensor indexing for the KV copy."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sglang_cpu import live

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent / "sglang_cpu"


@pytest.fixture(scope="module")
def k() -> ModuleType:
    """The stand-in, loaded under its own name (``sgl_kernel`` stays unimportable here)."""
    path = HERE / "stand_in" / "sgl_kernel" / "__init__.py"
    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- attention against plain float64 attention -------------------------------------------------


def _reference(q: Any, keys: Any, vals: Any, scale: float, q_pos: list[int]) -> Any:
    """Per query token and head, softmax(q . k * scale) . v over the keys at positions
    <= its own, in float64 with Python loops over heads (GQA: head h reads KV head h // g)."""
    lq, hq, _ = q.shape
    hkv = keys.shape[1]
    out = torch.zeros((lq, hq, vals.shape[2]), dtype=torch.float64)
    for i in range(lq):
        n = q_pos[i] + 1
        for h in range(hq):
            kh = keys[:n, h // (hq // hkv)].double()
            w = torch.softmax((kh @ q[i, h].double()) * scale, dim=0)
            out[i, h] = w @ vals[:n, h // (hq // hkv)].double()
    return out


def _pool(seed: int, slots: int = 300, hkv: int = 2, d: int = 16) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn((slots, hkv, d), generator=g).to(torch.bfloat16),
        torch.randn((slots, hkv, d), generator=g).to(torch.bfloat16),
    )


def test_decode_attention_writes_the_new_token_then_attends_over_the_row(k: ModuleType) -> None:
    kb, vb = _pool(1)
    g = torch.Generator().manual_seed(2)
    lens = [40, 7]
    table = torch.zeros((3, 64), dtype=torch.int32)
    slots = torch.randperm(300, generator=g)[: sum(lens)].to(torch.int32)
    table[2, :40], table[0, :7] = slots[:40], slots[40:]
    loc = torch.tensor([int(table[2, 39]), int(table[0, 6])])  # the new tokens' slots
    q = torch.randn((2, 4, 16), generator=g).to(torch.bfloat16)
    knew = torch.randn((2, 2, 16), generator=g).to(torch.bfloat16)
    vnew = torch.randn((2, 2, 16), generator=g).to(torch.bfloat16)
    o = torch.empty_like(q)
    k.decode_attention_cpu(
        q,
        kb,
        vb,
        1.0,
        1.0,
        o,
        knew,
        vnew,
        loc,
        torch.empty(0),
        table,
        torch.tensor([2, 0]),
        torch.tensor(lens),
        0.25,
        0.0,
        False,
        0,
        None,
        None,
    )
    assert torch.equal(kb[loc], knew) and torch.equal(vb[loc], vnew)
    for i, (row, n) in enumerate(((2, 40), (0, 7))):
        idx = table[row, :n].long()
        ref = _reference(q[i : i + 1], kb[idx], vb[idx], 0.25, [n - 1])
        assert torch.allclose(o[i : i + 1].double(), ref, atol=2e-2), i


def test_extend_attention_is_causal_after_its_prefix(k: ModuleType) -> None:
    kb, vb = _pool(3)
    g = torch.Generator().manual_seed(4)
    table = torch.zeros((2, 128), dtype=torch.int32)
    table[1, :100] = torch.randperm(300, generator=g)[:100].to(torch.int32)
    table[0, :9] = torch.randperm(300, generator=g)[:9].to(torch.int32)
    # request A: prefix 80, extends 20; request B: no prefix, extends 9 (packed after A)
    ext, start, seq = [20, 9], [0, 20], [100, 9]
    q = torch.randn((29, 4, 16), generator=g).to(torch.bfloat16)
    kx = torch.cat([kb[table[1, 80:100].long()], kb[table[0, :9].long()]])
    vx = torch.cat([vb[table[1, 80:100].long()], vb[table[0, :9].long()]])
    for k_ext, v_ext in ((kx, vx), (None, None)):  # from the extend tensors, or the pool
        o = torch.empty_like(q)
        k.extend_attention_cpu(
            q,
            k_ext,
            v_ext,
            o,
            kb,
            vb,
            1.0,
            1.0,
            table,
            torch.tensor([1, 0]),
            torch.tensor(seq),
            torch.tensor(ext),
            torch.tensor(start),
            20,
            0.25,
            0.0,
            False,
            0,
            None,
            None,
            None,
            True,
        )
        for row, s, e, n in ((1, 0, 20, 100), (0, 20, 9, 9)):
            idx = table[row, :n].long()
            ref = _reference(q[s : s + e], kb[idx], vb[idx], 0.25, list(range(n - e, n)))
            assert torch.allclose(o[s : s + e].double(), ref, atol=2e-2), row


def test_attention_logit_cap_and_window_match_the_definition(k: ModuleType) -> None:
    g = torch.Generator().manual_seed(5)
    q = torch.randn((1, 2, 8), generator=g)
    keys = torch.randn((10, 1, 8), generator=g)
    vals = torch.randn((10, 1, 8), generator=g)
    out = k._attend(q, keys, vals, 1.0, 2.0, 9, False, 4)
    logits = 2.0 * torch.tanh((keys[6:, 0] @ q[0].T).T / 2.0)  # window 4: keys 6..9
    ref = torch.softmax(logits, dim=-1) @ vals[6:, 0]
    assert torch.allclose(out[0], ref, atol=1e-5)


def test_unsupported_inputs_raise_naming_the_op(k: ModuleType) -> None:
    kb, vb = _pool(6)
    with pytest.raises(NotImplementedError, match="extend_attention_cpu: no tree mask"):
        k.extend_attention_cpu(
            torch.zeros((1, 4, 16)),
            None,
            None,
            torch.zeros((1, 4, 16)),
            kb,
            vb,
            1.0,
            1.0,
            torch.zeros((1, 4), dtype=torch.int32),
            torch.tensor([0]),
            torch.tensor([1]),
            torch.tensor([1]),
            torch.tensor([0]),
            1,
            1.0,
            0.0,
            False,
            0,
            None,
            None,
            torch.ones(1, dtype=torch.bool),
            True,
        )
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.fused_experts_cpu was called"):
        k.fused_experts_cpu()
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # no AMX claimed
    assert torch.ops.sgl_kernel.decode_attention_cpu is not None  # what SGLang looks up


# -- KV copy and draft metadata -------------------------------------------------------------------


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer(k: ModuleType) -> None:
    bufs = [torch.arange(40 * 6, dtype=torch.float32).reshape(40, 2, 3) + i for i in range(3)]
    expected = [b.clone() for b in bufs]
    tgt, src = torch.tensor([5, 9, 0]), torch.tensor([30, 2, 0])
    for e in expected:
        e[tgt] = e[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    k.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, e in zip(bufs, expected):
        assert torch.equal(b, e)


def test_draft_decode_metadata_gives_each_chain_its_requests_row(k: ModuleType) -> None:
    table = torch.arange(5 * 32, dtype=torch.int32).reshape(5, 32)
    rows = k.build_draft_decode_metadata_cpu(
        table, torch.tensor([3, 0]), torch.tensor([9, 4]), 1, 3, 32
    )
    assert torch.equal(rows, table[[3, 0]])  # draft slots follow the prefix in the row
    with pytest.raises(NotImplementedError, match="topk 1"):
        k.build_draft_decode_metadata_cpu(table, torch.tensor([3]), torch.tensor([9]), 2, 3, 32)


# -- bookkeeping ops against SGLang's own Triton kernels -------------------------------------------

REFERENCE_CASES = [
    "assign_req_to_token_pool",
    "assign_extend_cache_locs",
    "assign_draft_cache_locs_contiguous_topk1",
    "assign_draft_cache_locs_contiguous_topk2",
    "fill_bonus_tokens",
    "fill_accept_out_cache_loc",
    *(f"build_tree_topk{t}_mode{m}" for t in (1, 2, 4) for m in (0, 1)),
    *(f"verify_tree_greedy_topk{t}" for t in (1, 2, 4)),
]


@pytest.fixture(scope="module")
def triton_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = live.missing()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("triton") / "reference.pt"
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(live.STAND_IN))  # torchvision's shim
    proc = subprocess.run(
        [sys.executable, str(HERE / "triton_reference.py"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases: dict[str, Any] = torch.load(out, weights_only=False)
    return cases


@pytest.mark.live_sglang
@pytest.mark.parametrize("name", REFERENCE_CASES)
def test_op_matches_sglangs_triton_kernel(
    k: ModuleType, triton_cases: dict[str, Any], name: str
) -> None:
    case = triton_cases[name]
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in case["args"]]
    getattr(k, case["op"])(*args)
    for i, expected in zip(case["out"], case["expected"]):
        assert torch.equal(args[i], expected), (name, i, args[i], expected)
    if name.startswith("verify_tree"):
        assert int(case["expected"][2].sum()) > 0, "no token accepted: a weak case"


@pytest.mark.live_sglang
def test_no_reference_case_is_left_unchecked(triton_cases: dict[str, Any]) -> None:
    assert sorted(triton_cases) == sorted(REFERENCE_CASES)
