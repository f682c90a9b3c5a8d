"""Where a measured request's time goes in the reference engine (in process, no HTTP).

python request_costs.py            # run from a checkout with the package installed

1. The parts of one request at 32768 and 131072 tokens, both layouts, 5 interleaved
   repetitions (medians): the KV fill of ``01e80b9``-``31e89d2`` (``fill_new``: the bank's
   contiguous pieces straight into the pool, ``pieces_fill`` below; taken back after it
   split the fragmented cases' processes) and the engine's (``fill_old``: a gathered copy
   of the bank first), side by side. ``request_costs.txt`` was measured at ``31e89d2``.
2. The decode steps a request ran without a step limit, as the decoder sized it before
   ``01e80b9``: the warm-up (1 + 8 x 8 tokens) and 8 measured blocks of 4 kept steps
   (1 + ceil(5 x accept x 1.25) + 1 tokens).
"""

from __future__ import annotations

import math
import random
import statistics as st
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch

from pytest_specperf.engines.reference.config import get_config
from pytest_specperf.engines.reference.engine import Engine, GenRequest, _Live

torch.set_num_threads(1)
eng = Engine(get_config("tiny"), device="cpu")


def pieces_fill(self: Engine, lr: _Live, n: int) -> None:
    """The synthetic fill of ``01e80b9``-``31e89d2``: the bank's contiguous pieces."""
    self._ensure_pages(lr, n)
    p = self.cfg.page_size
    bank = self._synth_bank()
    size = bank.shape[0]
    pages = self._h2d.put(lr.pages)
    slots = (pages[:, None] * p + torch.arange(p)[None, :]).reshape(-1)[:n]
    rng = random.Random(zlib.crc32(f"{lr.req.seed}:synthetic".encode()))
    for layer in range(len(self.kv.k)):
        for pool in (self.kv.k[layer], self.kv.v[layer]):
            pos = 0
            start = rng.randrange(size)
            while pos < n:
                src = (start + pos) % size
                take = min(n - pos, size - src)
                piece = bank[src : src + take].transpose(0, 1)
                pool.index_copy_(1, slots[pos : pos + take], piece)
                pos += take
    lr.seq_len = n


def timed(f: Callable[..., Any], *args: Any) -> float:
    t = time.perf_counter()
    f(*args)
    return (time.perf_counter() - t) * 1e3


def new_layout(layout: str, seed: int) -> None:
    eng.flush_cache()
    eng.set_kv_layout(layout, 1.0, seed)
    eng._apply_pending_layout()


def parts(ctx: int, layout: str) -> str:
    names = ("layout", "fill_new", "fill_old", "prefill1", "ref_read", "request")
    got: dict[str, list[float]] = {k: [] for k in names}
    fills: list[tuple[str, Callable[[Engine, _Live, int], None]]] = [
        ("fill_new", pieces_fill),
        ("fill_old", Engine._synthetic_fill),
    ]
    for rep in range(5):
        got["layout"].append(timed(new_layout, layout, rep))
        req = GenRequest(rid="x", max_new_tokens=40, context_len=ctx, ignore_eos=True, seed=rep)
        lr = _Live(req=req, pages=[])
        eng.page_table.truncate(0, 0)
        for name, fill in fills if rep % 2 == 0 else fills[::-1]:
            got[name].append(timed(fill, eng, lr, ctx - 1))
        got["prefill1"].append(timed(eng._prefill_chunks, lr, [5]))
        got["ref_read"].append(timed(eng._reference_read, lr))
        eng.allocator.free(lr.pages)
        six = GenRequest(
            rid="y", max_new_tokens=200, context_len=ctx, ignore_eos=True, seed=rep,
            max_decode_steps=6,
        )  # fmt: skip
        got["request"].append(timed(eng.generate, [six]))
    return "  ".join(f"{k} {st.median(v):.0f} ms" for k, v in got.items())


def uncapped_steps(ctx: int) -> str:
    eng.set_kv_layout("contiguous", 0.0, 0)
    warm = GenRequest(rid="w", max_new_tokens=65, context_len=ctx, ignore_eos=True, seed=10000)
    w = eng.generate([warm])[0]
    a = w.spec_accept_length
    max_new = 1 + math.ceil(5 * a * 1.25) + 1
    steps = []
    for b in range(8):
        req = GenRequest(
            rid=f"b{b}", max_new_tokens=max_new, context_len=ctx, ignore_eos=True, seed=b
        )
        steps.append(eng.generate([req])[0].spec_verify_ct)
    return (
        f"warm-up {w.spec_verify_ct} steps (accept {a:.2f}); blocks of {max_new} tokens: "
        f"{steps} steps (mean {st.mean(steps):.1f}; 5 wanted)"
    )


for ctx in (32768, 131072):
    for layout in ("contiguous", "fragmented"):
        print(f"ctx={ctx} {layout}: {parts(ctx, layout)}  (request: 6 decode steps)")
for ctx in (32768, 46000, 131072):
    print(f"ctx={ctx} uncapped: {uncapped_steps(ctx)}")
