"""Paged KV allocator invariants, fragmentation, and read plans."""

from __future__ import annotations

import pytest

from pytest_specperf.engines.reference.attention import MIN_VIEW_PAGES, plan_reads
from pytest_specperf.engines.reference.engine import (
    SYNTH_BANK_TOKENS,
    GenRequest,
    _Live,
)
from pytest_specperf.engines.reference.kv import AllocatorError, PageAllocator, fragmentation


def test_alloc_free_roundtrip_and_ownership():
    a = PageAllocator(64)
    x = a.alloc(10)
    y = a.alloc(5)
    assert not set(x) & set(y)
    a.check([x, y])
    with pytest.raises(AllocatorError, match="freed but not owned"):
        a.free([x[0], x[0]])
    a.free(y)
    a.free(x[1:])
    with pytest.raises(AllocatorError, match="exhausted"):
        a.alloc(100)
    a.check([[x[0]]])


def test_free_prepends_in_order():
    a = PageAllocator(16)
    x = a.alloc(4)
    a.free(x)
    assert a.free_list()[:4] == x


@pytest.mark.parametrize("level", [0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
def test_fragmentation_reached_matches_level(level):
    a = PageAllocator(8192)
    a.fragment(level, seed=5)
    pages = a.alloc(2875)  # a 46k-token request with 16-token pages
    assert fragmentation(pages) == pytest.approx(level, abs=0.04)
    a.check([pages])


def test_fragment_refuses_bad_level():
    with pytest.raises(ValueError, match="outside"):
        PageAllocator(8).fragment(1.5, seed=0)


@pytest.mark.parametrize("layout", ["contiguous", "fragmented"])
def test_engine_returns_every_page(tiny_engine_factory, layout):
    eng = tiny_engine_factory("DFLASH", 8)
    total = eng.allocator.num_pages
    eng.set_kv_layout(layout, 1.0, 1)
    reqs = [
        GenRequest(
            rid=f"r{i}", max_new_tokens=30, context_len=3000 + 100 * i, ignore_eos=True, seed=i
        )
        for i in range(3)
    ]
    eng.generate(reqs)
    assert eng.allocator.free_count == total
    eng.allocator.check([])


def test_engine_measures_requested_fragmentation(tiny_engine_factory):
    eng = tiny_engine_factory("DFLASH", 8)
    for level in (0.3, 1.0):
        eng.set_kv_layout("fragmented", level, 2)
        r = eng.generate(
            [GenRequest(rid="f", max_new_tokens=8, context_len=32000, ignore_eos=True)]
        )[0]
        assert r.kv_fragmentation == pytest.approx(level, abs=0.05)
        assert r.kv_layout == "fragmented"
    eng.set_kv_layout("contiguous")
    r = eng.generate([GenRequest(rid="c", max_new_tokens=8, context_len=32000, ignore_eos=True)])[0]
    assert r.kv_fragmentation == 0.0


@pytest.mark.parametrize("layout", ["contiguous", "fragmented"])
def test_synthetic_fill_writes_the_seeded_bank_rows_at_the_request_slots(
    tiny_engine_factory, layout
):
    """Every layer's K and V hold bank row ``(start + i) % bank size`` at position ``i``,
    ``start`` drawn from the request's seed per layer, K then V; the bank wraps (the
    context is longer than it)."""
    import random
    import zlib

    import torch

    eng = tiny_engine_factory("DFLASH", 8)
    eng.flush_cache()
    eng.set_kv_layout(layout, 1.0, 4)
    eng._apply_pending_layout()
    n = SYNTH_BANK_TOKENS + 1000
    lr = _Live(req=GenRequest(rid="f", max_new_tokens=1, context_len=n + 1, seed=11), pages=[])
    try:
        eng._synthetic_fill(lr, n)
        bank = eng._synth_bank()
        p = eng.cfg.page_size
        slots = torch.tensor([lr.pages[i // p] * p + i % p for i in range(n)])
        rng = random.Random(zlib.crc32(b"11:synthetic"))
        for layer in range(len(eng.kv.k)):
            for pool in (eng.kv.k[layer], eng.kv.v[layer]):
                rows = (torch.arange(n) + rng.randrange(bank.shape[0])) % bank.shape[0]
                assert torch.equal(pool.index_select(1, slots), bank[rows].transpose(0, 1))
    finally:
        eng.allocator.free(lr.pages)


def test_contiguous_pages_are_read_without_a_copy():
    pages = list(range(100, 200))
    plan = plan_reads(pages, 100 * 16 - 5, 16, "cpu")
    assert plan.views == ((1600, 1600 + 100 * 16 - 5),)
    assert plan.gather_pages is None and plan.copied_tokens == 0


def test_scattered_pages_are_gathered_and_long_runs_viewed():
    pages = [7, 3, 50, 51, 52, 53, 54, 9]  # one run of 5 pages amid singles
    plan = plan_reads(pages, 8 * 16 - 3, 16, "cpu")
    assert plan.views == ((50 * 16, 55 * 16),)
    assert plan.gather_pages is not None
    assert plan.gather_pages.tolist() == [7, 3, 9]
    assert plan.gather_len == 3 * 16 - 3  # the last page is partial
    assert MIN_VIEW_PAGES <= 5


def test_read_plan_covers_every_token_once():
    import random

    rng = random.Random(0)
    pages = rng.sample(range(1000), 300)
    pages[40:80] = list(range(2000, 2040))
    ctx = 300 * 16 - 7
    plan = plan_reads(pages, ctx, 16, "cpu")
    viewed = sum(b - a for a, b in plan.views)
    assert viewed + plan.gather_len == ctx


def test_huge_pages_enter_the_fingerprint_only_when_asked_for():
    """THP_MEM_ALLOC_ENABLE=1 makes PyTorch's CPU allocator ask for huge pages for the KV
    pool: a fingerprint field then, so a baseline recorded without them is INVALID for such
    a run, naming the field; otherwise absent, so fingerprints (and their hashes) recorded
    before the field stay as they were."""
    from pytest_specperf.engines.reference.kv import THP_ENV, huge_pages_requested
    from pytest_specperf.judging.baselines import fingerprint_mismatch

    assert huge_pages_requested({THP_ENV: "1"}) is True
    assert huge_pages_requested({THP_ENV: "0"}) is None and huge_pages_requested({}) is None
    assert huge_pages_requested({THP_ENV: " 1"}) is None  # PyTorch ignores it: no huge pages
    before = {"backend": "reference", "config": "tiny"}
    assert fingerprint_mismatch(before, dict(before)) == []
    [line] = fingerprint_mismatch(before, {**before, "huge_pages": True})
    assert line.startswith("huge_pages: baseline None, now True (") and THP_ENV in line


def test_a_cpu_engines_fingerprint_carries_huge_pages_only_when_asked_for(
    tiny_engine_factory, monkeypatch
):
    from pytest_specperf.engines.reference.kv import THP_ENV
    from pytest_specperf.judging.baselines import fingerprint_hash

    eng = tiny_engine_factory("DFLASH", 8)
    monkeypatch.delenv(THP_ENV, raising=False)
    plain = eng.fingerprint()
    assert "huge_pages" not in plain
    monkeypatch.setenv(THP_ENV, "1")
    asked = eng.fingerprint()
    assert asked == {**plain, "huge_pages": True}
    assert fingerprint_hash(asked) != fingerprint_hash(plain)
    monkeypatch.setattr(eng, "device", type(eng.device)("meta"))  # not a CPU pool: no field
    assert "huge_pages" not in eng.fingerprint()
