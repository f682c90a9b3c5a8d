"""Unit tests of KV fragmentation for SGLang: permuting allocator free lists, refusing
unsafe allocators, measuring a request's fragmentation from ``req_to_token``.

The allocator doubles copy what SGLang 0.5.23's allocators do that matters here
(``clear()`` sets ``free_pages = arange(1, n + 1)``, ``alloc`` takes from the head), with
real torch tensors. ``apply_layout`` recognises allocators by exact class name, so each
double is given SGLang's class name with :func:`named_like` (the Python name stays Fake*).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_specperf.engines.reference.kv import PageAllocator
from pytest_specperf.engines.sglang import kv_fragment
from pytest_specperf.engines.sglang.hooks import ProbeRuntime, make_hook
from pytest_specperf.engines.sglang.kv_fragment import (
    KVLayoutError,
    apply_layout,
    fragment_order,
    fragmentation,
    measure_request,
    pages_of_slots,
    rid_key,
)
from pytest_specperf.engines.sglang.phase_map import load_builtin


def named_like(cls: type, sglang_name: str) -> type:
    """A subclass of the double ``cls`` whose ``__name__`` is SGLang's class name."""
    return type(sglang_name, (cls,), {})


class FakeTokenAllocator:
    """TokenToKVPoolAllocator (page size 1): free_pages holds slot ids, slot 0 is padding."""

    page_size = 1

    def __init__(self, size: int) -> None:
        self.size = size
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64)
        self.release_pages = torch.empty((0,), dtype=torch.int64)
        self.free_group = None

    def alloc(self, n: int) -> torch.Tensor:
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out


class FakePagedAllocator:
    """PagedTokenToKVPoolAllocator: free_pages holds page ids; slots are page*size+offset."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)
        self.staged_pages: list[torch.Tensor] = []

    def alloc_tokens(self, n_tokens: int) -> torch.Tensor:
        n = -(-n_tokens // self.page_size)
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        slots = pages[:, None] * self.page_size + torch.arange(self.page_size)[None, :]
        return slots.reshape(-1)[:n_tokens]


TokenAllocator = named_like(FakeTokenAllocator, "TokenToKVPoolAllocator")
PagedAllocator = named_like(FakePagedAllocator, "PagedTokenToKVPoolAllocator")


# -- the permutation ---------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "level", "seed"), [(1, 1.0, 0), (2, 1.0, 3), (50, 0.3, 1),
                                                  (1000, 1.0, 7), (1000, 0.0, 7)])
def test_unit_fragment_order_is_the_reference_allocators_free_list(
    n: int, level: float, seed: int
) -> None:
    ref = PageAllocator(n)
    ref.fragment(level, seed)
    order = fragment_order(n, level, seed)
    assert order == ref.free_list()
    assert sorted(order) == list(range(n))


def test_unit_fragment_order_edge_cases() -> None:
    assert fragment_order(0, 1.0, 0) == []
    assert fragment_order(10, 0.0, 5) == list(range(10))
    with pytest.raises(ValueError, match="outside"):
        fragment_order(10, 1.5, 0)


# -- applying a layout -------------------------------------------------------------------------
@pytest.mark.parametrize("level", [0.25, 0.5, 1.0])
def test_unit_token_allocator_fragmented_to_the_level(level: float) -> None:
    alloc = TokenAllocator(4096)
    summary = apply_layout(alloc, "fragmented", level, seed=11)
    assert summary["allocator"] == "TokenToKVPoolAllocator" and summary["free_pages"] == 4096
    expected = torch.tensor(fragment_order(4096, level, 11)) + 1
    assert torch.equal(alloc.free_pages, expected)
    slots = alloc.alloc(1000)  # the next request's prompt
    assert abs(fragmentation(slots.tolist()) - level) < 0.08


def test_unit_paged_allocator_fragments_page_ids_and_measure_sees_it() -> None:
    alloc = PagedAllocator(512, 16)
    apply_layout(alloc, "fragmented", 1.0, seed=2)
    assert sorted(alloc.free_pages.tolist()) == list(range(1, 513))
    slots = alloc.alloc_tokens(1000)
    req_to_token = torch.zeros((3, 2048), dtype=torch.int64)
    req_to_token[1, :1000] = slots
    m = measure_request(req_to_token, 1, 1000, 16)
    assert m["pages"] == 63 and m["tokens"] == 1000 and m["page_size"] == 16
    assert m["fragmentation"] == 1.0


def test_unit_contiguous_layout_keeps_the_sorted_free_list() -> None:
    alloc = PagedAllocator(64, 4)
    summary = apply_layout(alloc, "contiguous", 0.7, seed=1)
    assert summary["level"] == 0.0
    assert torch.equal(alloc.free_pages, torch.arange(1, 65))
    slots = alloc.alloc_tokens(100)
    assert fragmentation(pages_of_slots(slots, 4)) == 0.0


@pytest.mark.parametrize(("name", "kind"), [
    ("SWATokenToKVPoolAllocator", "sliding-window"),
    ("UnifiedSWATokenToKVPoolAllocator", "sliding-window"),
    ("UnifiedMambaTokenToKVPoolAllocator", "unified"),
    ("HiSparseTokenToKVPoolAllocator", "HiSparse"),
    ("PageInterleavePoolAllocator", "not validated"),
])
def test_unit_unsafe_allocators_are_refused(name: str, kind: str) -> None:
    alloc = named_like(FakeTokenAllocator, name)(128)
    before = alloc.free_pages.clone()
    with pytest.raises(KVLayoutError) as exc:
        apply_layout(alloc, "fragmented", 1.0, seed=0)
    assert name in str(exc.value) and kind in str(exc.value) and "unsafe" in str(exc.value)
    assert torch.equal(alloc.free_pages, before)
    apply_layout(alloc, "contiguous", 0.0, seed=0)  # nothing to permute: fine


def test_unit_allocator_not_just_cleared_is_refused() -> None:
    alloc = TokenAllocator(64)
    alloc.alloc(3)
    alloc.free_pages = torch.cat((alloc.free_pages, torch.tensor([2, 1, 3])))
    with pytest.raises(KVLayoutError, match="not the sorted list"):
        apply_layout(alloc, "fragmented", 1.0, seed=0)
    alloc.clear()
    alloc.release_pages = torch.tensor([5])
    with pytest.raises(KVLayoutError, match="release_pages is not empty"):
        apply_layout(alloc, "fragmented", 1.0, seed=0)
    paged = PagedAllocator(8, 2)
    paged.staged_pages = [torch.tensor([1])]
    with pytest.raises(KVLayoutError, match="staged_pages is not empty"):
        apply_layout(paged, "fragmented", 1.0, seed=0)


def test_unit_bad_layout_arguments() -> None:
    with pytest.raises(KVLayoutError, match="unknown KV layout"):
        apply_layout(TokenAllocator(8), "scattered", 1.0, 0)
    with pytest.raises(KVLayoutError, match="outside"):
        apply_layout(TokenAllocator(8), "fragmented", 2.0, 0)
    with pytest.raises(KVLayoutError, match="nothing to fragment"):
        apply_layout(TokenAllocator(1), "fragmented", 1.0, 0)


def test_unit_pages_of_slots() -> None:
    assert pages_of_slots(torch.tensor([8, 9, 10, 11, 4, 5, 6, 7]), 4) == [2, 1]
    assert pages_of_slots([3, 4, 9], 1) == [3, 4, 9]
    assert pages_of_slots([], 4) == []


# -- run-directory files -----------------------------------------------------------------------
def test_unit_request_file_roundtrip_and_validation(tmp_path: Path) -> None:
    rid = kv_fragment.write_request(tmp_path, "fragmented", 0.5, 3)
    assert kv_fragment.read_request(tmp_path) == {"id": rid, "layout": "fragmented",
                                                  "level": 0.5, "seed": 3}
    with pytest.raises(ValueError, match="unknown KV layout"):
        kv_fragment.write_request(tmp_path, "messy", 0.5, 3)
    with pytest.raises(ValueError, match="level"):
        kv_fragment.write_request(tmp_path, "fragmented", -0.1, 3)
    with pytest.raises(ValueError, match="seed"):
        kv_fragment.write_request(tmp_path, "fragmented", 0.1, -3)
    path = tmp_path / kv_fragment.REQUEST_FILE
    for bad, msg in (("{", "not valid JSON"), ("[]", "JSON object"),
                     ('{"layout": "x", "level": 0, "seed": 0}', "unknown layout"),
                     ('{"layout": "fragmented", "level": 2, "seed": 0}', "level"),
                     ('{"layout": "fragmented", "level": 1, "seed": true}', "seed")):
        path.write_text(bad)
        with pytest.raises(KVLayoutError, match=msg):
            kv_fragment.read_request(tmp_path)
    path.unlink()
    assert kv_fragment.read_request(tmp_path) is None


def test_unit_rid_key_is_file_safe() -> None:
    assert rid_key("specperf-case-0123abcd") == "specperf-case-0123abcd"
    for rid in ("../etc/passwd", "a/b", "", ".hidden", "x" * 200, "sp ace"):
        key = rid_key(rid)
        assert key.startswith("h") and len(key) == 25 and "/" not in key


# -- the scheduler side, through the hooks -------------------------------------------------------
MAP = load_builtin("0.5.23").by_target()


class FakeScheduler:
    def __init__(self, allocator: Any) -> None:
        self.token_to_kv_pool_allocator = allocator
        self.idle = True

    def flush_cache(self, empty_cache: bool = True) -> bool:
        if not self.idle:
            return False
        self.token_to_kv_pool_allocator.clear()
        return True


def flush_hook(rt: ProbeRuntime) -> Any:
    return make_hook(MAP["sglang.srt.managers.scheduler.Scheduler.flush_cache"], rt)


def test_unit_flush_hook_applies_the_request_and_reports(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False, meta_suffix="pid1")
    sched = FakeScheduler(TokenAllocator(2048))
    hook = flush_hook(rt)
    assert hook(FakeScheduler.flush_cache, sched) is True  # no request: untouched
    assert torch.equal(sched.token_to_kv_pool_allocator.free_pages, torch.arange(1, 2049))
    assert list(tmp_path.glob("kvlayout-*.json")) == []
    req_id = kv_fragment.write_request(tmp_path, "fragmented", 1.0, 9)
    assert hook(FakeScheduler.flush_cache, sched) is True
    (res,) = kv_fragment.read_layout_results(tmp_path, req_id)
    assert res["status"] == "ok" and res["allocator"] == "TokenToKVPoolAllocator"
    assert res["head_fragmentation"] > 0.95
    assert not torch.equal(sched.token_to_kv_pool_allocator.free_pages, torch.arange(1, 2049))
    # the request stays in force: the next flush lays the cache out the same way again
    first = sched.token_to_kv_pool_allocator.free_pages.clone()
    hook(FakeScheduler.flush_cache, sched)
    assert torch.equal(sched.token_to_kv_pool_allocator.free_pages, first)
    # a busy server: flush fails, nothing is applied
    sched.idle = False
    assert hook(FakeScheduler.flush_cache, sched) is False


def test_unit_flush_hook_reports_a_refusal(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False, meta_suffix="pid2")
    sched = FakeScheduler(named_like(FakeTokenAllocator, "SWATokenToKVPoolAllocator")(64))
    req_id = kv_fragment.write_request(tmp_path, "fragmented", 0.5, 1)
    flush_hook(rt)(FakeScheduler.flush_cache, sched)
    (res,) = kv_fragment.read_layout_results(tmp_path, req_id)
    assert res["status"] == "refused" and "sliding-window" in res["message"]
    assert rt.kv_layout is None


def test_unit_flush_hook_reports_a_malformed_request(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False, meta_suffix="pid3")
    (tmp_path / kv_fragment.REQUEST_FILE).write_text("{")
    flush_hook(rt)(FakeScheduler.flush_cache, FakeScheduler(TokenAllocator(8)))
    data = json.loads(next(tmp_path.glob("kvlayout-*.json")).read_text())
    assert data["status"] == "refused" and "not valid JSON" in data["message"]


class FakeReq:
    def __init__(self, rid: str, row: int, committed: int) -> None:
        self.rid = rid
        self.kv = type("FakeReqKvInfo", (), {"req_pool_idx": row,
                                              "kv_committed_len": committed})()
        self.done = True

    def finished(self) -> bool:
        return self.done


class FakeTreeCache:
    def __init__(self, req_to_token: torch.Tensor, allocator: Any) -> None:
        self.req_to_token_pool = type("FakeReqToTokenPool", (), {"req_to_token": req_to_token})()
        self.token_to_kv_pool_allocator = allocator
        self.page_size = allocator.page_size


def test_unit_release_hook_measures_the_finished_request(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False)
    alloc = PagedAllocator(256, 8)
    sched = FakeScheduler(alloc)
    kv_fragment.write_request(tmp_path, "fragmented", 0.5, 4)
    flush_hook(rt)(FakeScheduler.flush_cache, sched)
    req_to_token = torch.zeros((4, 1024), dtype=torch.int64)
    req_to_token[2, :900] = alloc.alloc_tokens(900)
    release = make_hook(MAP["sglang.srt.mem_cache.common.release_kv_cache"], rt)
    calls: list[Any] = []

    def release_kv_cache(req: Any, tree_cache: Any, *, checkpoint: bool) -> None:
        calls.append(req.rid)

    cache = FakeTreeCache(req_to_token, alloc)
    req = FakeReq("specperf-x-1", 2, 900)
    release(release_kv_cache, req, cache, checkpoint=False)
    assert calls == ["specperf-x-1"]
    data = kv_fragment.read_fragmentation(tmp_path, "specperf-x-1")
    assert data is not None
    assert data["pages"] == 113 and data["page_size"] == 8 and data["level"] == 0.5
    assert abs(data["fragmentation"] - 0.5) < 0.15
    unfinished = FakeReq("still-running", 2, 900)
    unfinished.done = False
    release(release_kv_cache, unfinished, cache, checkpoint=False)  # retracted: not measured
    assert kv_fragment.read_fragmentation(tmp_path, "still-running") is None


def test_unit_no_layout_requested_means_no_measurement(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False)
    release = make_hook(MAP["sglang.srt.mem_cache.common.release_kv_cache"], rt)
    cache = FakeTreeCache(torch.zeros((1, 8), dtype=torch.int64), TokenAllocator(8))
    release(lambda *a, **k: None, FakeReq("r", 0, 4), cache, checkpoint=True)
    assert list(tmp_path.glob("kvfrag-*")) == []
