"""The reference engine: paged-KV target, block drafter, greedy verification, phase probe.

One ``generate`` call runs a batch of requests to completion in lockstep decode steps.
Each step is instrumented with the phases of DESIGN.md section 4:

========================  =============================================================
``schedule``              page allocation for the step's block, positions
``draft``                 the drafter's attention metadata and its one block forward
``build_verify_input``    the verify chain: anchor + drafted tokens, positions
``prepare_for_verify``    cache locations (slots), attention read plans, graph inputs
``verify``                one target forward over the whole block (graph or eager)
``accept``                greedy matching: longest matching prefix plus the bonus token
``kv_commit``             draft-KV append for accepted tokens, release of rejected pages
========================  =============================================================

With ``algorithm="NONE"`` a step is plain greedy decoding of one token (no draft, no
verify-input build; ``verify`` is the one-token target forward).
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specperf import __version__
from pytest_specperf.engines.reference.attention import CPU_CHUNK_TOKENS, ReadPlan, plan_reads
from pytest_specperf.engines.reference.config import ModelConfig
from pytest_specperf.engines.reference.kv import (
    LAYOUTS,
    KVPool,
    PageAllocator,
    fragmentation,
    pool_tokens,
)
from pytest_specperf.engines.reference.model import Drafter, PlannedReads, SeqRows, TargetModel
from pytest_specperf.probe import NullProbe, StepProbe

if TYPE_CHECKING:
    import torch

    from pytest_specperf.engines.reference.graphs import GraphRunner

ALGORITHMS = ("DFLASH", "NONE")
#: Token id that ends a generation unless ``ignore_eos`` (as Llama's ``</s>``).
EOS_TOKEN_ID = 2
#: Synthetic prefill copies K/V from a seeded bank of this many random tokens.
SYNTH_BANK_TOKENS = 65536
#: Real prefill runs in chunks of this many tokens.
PREFILL_CHUNK = 1024
ENGINE_NAME = "specperf-reference"


class RequestError(ValueError):
    """A request the engine cannot serve; the message says what to change."""


@dataclass(frozen=True)
class GenRequest:
    """One generation: either real ``input_ids`` or a synthetic ``context_len``."""

    rid: str
    max_new_tokens: int
    input_ids: list[int] | None = None
    context_len: int | None = None
    ignore_eos: bool = False
    seed: int = 0


@dataclass
class GenResult:
    rid: str
    output_ids: list[int]
    prompt_tokens: int
    spec_verify_ct: int
    e2e_latency: float
    finish_reason: str
    kv_layout: str
    kv_fragmentation: float
    kv_pages: int
    synthetic_prefill: bool
    reference_ms: float | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def spec_accept_length(self) -> float:
        """Tokens produced per decode step (the prefill's token excluded)."""
        return (self.completion_tokens - 1) / self.spec_verify_ct if self.spec_verify_ct else 0.0


@dataclass
class _Live:
    req: GenRequest
    pages: list[int]
    seq_len: int = 0  # tokens whose KV is committed
    anchor: int = 0  # next token to feed (produced, not yet in the KV cache)
    cond: Any = None  # fused target hidden state at the position that produced `anchor`
    output: list[int] = field(default_factory=list)
    steps: int = 0
    finish: str = ""
    rng: random.Random | None = None
    plan_key: tuple[int, int] = (-1, -1)
    plan: ReadPlan | None = None
    reference_ms: float | None = None


def _tensor(data: list[int], device: Any) -> torch.Tensor:
    import torch

    return torch.tensor(data, dtype=torch.long, device=device)


class Engine:
    """A real speculative decoder over a paged KV cache, CPU or CUDA."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        device: str = "cpu",
        algorithm: str = "DFLASH",
        num_draft_tokens: int = 8,
        simulate_accept_len: float | None = None,
        probe: StepProbe | NullProbe | None = None,
        cuda_graphs: bool = True,
        dtype: str | None = None,
    ) -> None:
        import torch

        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {algorithm!r}; choose DFLASH or NONE")
        if not 2 <= num_draft_tokens <= 32:
            raise ValueError(f"num_draft_tokens must be in [2, 32], got {num_draft_tokens}")
        if simulate_accept_len is not None and not 1.0 <= simulate_accept_len <= num_draft_tokens:
            raise ValueError(
                f"simulate_accept_len must be in [1, {num_draft_tokens}], got {simulate_accept_len}"
            )
        self.cfg = cfg
        self.device = torch.device(device)
        if dtype is None:
            dtype = "float32" if self.device.type == "cpu" else "bfloat16"
        self.dtype = getattr(torch, dtype)
        self.algorithm = algorithm
        self.block = num_draft_tokens
        self.simulate_accept_len = simulate_accept_len
        self.probe: StepProbe | NullProbe = probe if probe is not None else NullProbe()
        torch.set_grad_enabled(False)
        self.target = TargetModel(cfg, device=self.device, dtype=self.dtype)
        self.drafter = Drafter(self.target, self.block) if algorithm == "DFLASH" else None
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        self.pool_tokens = pool_tokens(cfg, self.device, itemsize)
        self.kv = KVPool(cfg, device=self.device, dtype=self.dtype, tokens=self.pool_tokens)
        self.allocator = PageAllocator(self.pool_tokens // cfg.page_size)
        self._pending_layout: tuple[str, float, int] | None = None
        self._bank: torch.Tensor | None = None
        self._layout_name = "contiguous"
        self.graphs: GraphRunner | None = None
        if self.device.type == "cuda" and cuda_graphs:
            from pytest_specperf.engines.reference.graphs import GraphRunner

            self.graphs = GraphRunner(self)
        self.counters: dict[str, int] = {
            "requests": 0,
            "decode_steps": 0,
            "generated_tokens": 0,
            "prefill_tokens": 0,
            "synthetic_prefill_tokens": 0,
        }
        self.graph_counters: dict[str, dict[str, int]] = {}

    # -- identity -------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What the measured work depends on; a baseline is valid only for the same values."""
        import torch

        return {
            "backend": "reference",
            "engine": ENGINE_NAME,
            "engine_version": __version__,
            "config": self.cfg.name,
            "config_hash": self.cfg.fingerprint(),
            "speculative_algorithm": self.algorithm,
            "num_draft_tokens": self.block if self.algorithm == "DFLASH" else 1,
            "simulate_accept_len": self.simulate_accept_len,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device_type": self.device.type,
            "cuda_graphs": self.graphs is not None,
            "torch_version": torch.__version__,
        }

    # -- cache control -----------------------------------------------------------------------
    def set_kv_layout(self, layout: str, level: float = 1.0, seed: int = 0) -> None:
        """Lay out the free list for the next ``generate`` call (one-shot)."""
        if layout not in LAYOUTS:
            raise RequestError(f"unknown KV layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
        if not 0.0 <= level <= 1.0:
            raise RequestError(f"KV fragmentation level {level!r} is outside [0, 1]")
        self._pending_layout = (layout, level, seed)

    def flush_cache(self) -> None:
        self.allocator.reset()
        self._layout_name = "contiguous"

    # -- generation ------------------------------------------------------------------------
    def validate(self, req: GenRequest) -> None:
        cfg = self.cfg
        if (req.input_ids is None) == (req.context_len is None):
            raise RequestError("give exactly one of input_ids and context_len")
        if req.input_ids is not None:
            n = len(req.input_ids)
            if n == 0:
                raise RequestError("input_ids is empty")
            bad = [t for t in req.input_ids if not 0 <= t < cfg.vocab_size]
            if bad:
                raise RequestError(
                    f"token id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})"
                )
        else:
            n = req.context_len or 0
            if n < 1:
                raise RequestError(f"context_len must be at least 1, got {n}")
        if req.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {req.max_new_tokens}")
        need = n + req.max_new_tokens + self.block
        if need > cfg.max_context_len:
            raise RequestError(
                f"context {n} + max_new_tokens {req.max_new_tokens} + block {self.block} = {need} "
                f"exceeds the configured maximum context of {cfg.max_context_len} tokens"
            )

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        if not 1 <= len(reqs) <= self.cfg.max_batch_size:
            raise RequestError(f"batch size must be in [1, {self.cfg.max_batch_size}]")
        for r in reqs:
            self.validate(r)
        total = sum((r.input_ids and len(r.input_ids)) or r.context_len or 0 for r in reqs)
        total_pages = -(
            -(total + len(reqs) * (max(r.max_new_tokens for r in reqs) + self.block))
            // self.cfg.page_size
        )
        if total_pages > self.allocator.free_count:
            raise RequestError(
                f"the batch needs up to {total_pages} KV pages, the pool has "
                f"{self.allocator.free_count} free"
            )
        t0 = time.perf_counter()
        if self._pending_layout is not None:
            layout, level, seed = self._pending_layout
            self._pending_layout = None
            if layout == "contiguous":
                self.allocator.reset()
            else:
                self.allocator.fragment(level, seed)
            self._layout_name = layout
        live = [_Live(req=r, pages=[]) for r in reqs]
        results: dict[str, GenResult] = {}
        try:
            for lr in live:
                self._prefill(lr)
                lr.reference_ms = self._reference_read(lr)
            active = [lr for lr in live if not lr.finish]
            step = self._step_dflash if self.algorithm == "DFLASH" else self._step_greedy
            while active:
                try:
                    step(active)
                except BaseException:
                    self.probe.abort_step()  # no half record; later steps are recorded again
                    raise
                active = [lr for lr in active if not lr.finish]
            self.probe.flush()
            latency = time.perf_counter() - t0
            for lr in live:
                results[lr.req.rid] = GenResult(
                    rid=lr.req.rid,
                    output_ids=lr.output,
                    prompt_tokens=len(lr.req.input_ids or ()) or (lr.req.context_len or 0),
                    spec_verify_ct=lr.steps,
                    e2e_latency=latency,
                    finish_reason=lr.finish,
                    kv_layout=self._layout_name,
                    kv_fragmentation=fragmentation(lr.pages),
                    kv_pages=len(lr.pages),
                    synthetic_prefill=lr.req.context_len is not None,
                    reference_ms=lr.reference_ms,
                )
        finally:
            for lr in live:
                if lr.pages:
                    self.allocator.free(lr.pages)
                    lr.pages = []
        self.counters["requests"] += len(reqs)
        return [results[r.rid] for r in reqs]

    # -- helpers ---------------------------------------------------------------------------
    def _ensure_pages(self, lr: _Live, tokens: int) -> None:
        need = -(-tokens // self.cfg.page_size) - len(lr.pages)
        if need > 0:
            lr.pages.extend(self.allocator.alloc(need))

    def _release_tail(self, lr: _Live) -> None:
        keep = -(-lr.seq_len // self.cfg.page_size)
        if len(lr.pages) > keep:
            tail = lr.pages[keep:]
            del lr.pages[keep:]
            self.allocator.free(tail)

    def _slots(self, lr: _Live, start: int, n: int) -> list[int]:
        p = self.cfg.page_size
        return [lr.pages[i // p] * p + i % p for i in range(start, start + n)]

    def _plan(self, lr: _Live) -> ReadPlan:
        key = (lr.seq_len, len(lr.pages))
        if lr.plan is None or lr.plan_key != key:
            lr.plan = plan_reads(lr.pages, lr.seq_len, self.cfg.page_size, self.device)
            lr.plan_key = key
        return lr.plan

    def _finish_tokens(self, lr: _Live, new: list[int]) -> None:
        room = lr.req.max_new_tokens - len(lr.output)
        new = new[:room]
        if not lr.req.ignore_eos and EOS_TOKEN_ID in new:
            new = new[: new.index(EOS_TOKEN_ID) + 1]
            lr.finish = "stop"
        lr.output.extend(new)
        if not lr.finish and len(lr.output) >= lr.req.max_new_tokens:
            lr.finish = "length"

    # -- prefill ---------------------------------------------------------------------------
    def _prefill(self, lr: _Live) -> None:
        import torch

        req = lr.req
        if req.input_ids is not None:
            ids = req.input_ids
            self.counters["prefill_tokens"] += len(ids)
        else:
            n = req.context_len or 0
            self._synthetic_fill(lr, n - 1)
            gen = random.Random(zlib.crc32(f"{req.seed}:last".encode()))
            ids = [gen.randrange(3, self.cfg.vocab_size)]
            self.counters["synthetic_prefill_tokens"] += n - 1
        start = lr.seq_len
        self._ensure_pages(lr, start + len(ids))
        logits = fused = None
        for s in range(0, len(ids), PREFILL_CHUNK):
            chunk = ids[s : s + PREFILL_CHUNK]
            pos0 = start + s
            positions = torch.arange(pos0, pos0 + len(chunk), device=self.device)
            slots = _tensor(self._slots(lr, pos0, len(chunk)), self.device)
            plan = plan_reads(lr.pages, pos0, self.cfg.page_size, self.device)
            reads = PlannedReads([SeqRows(0, len(chunk), plan)])
            logits, fused = self.target.forward(
                _tensor(chunk, self.device), positions, reads, self.kv, slots
            )
            if self.drafter is not None:
                self.drafter.commit_context(fused, positions, self.kv, slots)
            lr.seq_len = pos0 + len(chunk)
        assert logits is not None and fused is not None
        lr.anchor = int(logits[-1].argmax().item())
        lr.cond = fused[-1].clone()
        if self.simulate_accept_len is not None:
            lr.rng = random.Random(zlib.crc32(f"{req.seed}:{req.rid}".encode()))
        self._finish_tokens(lr, [lr.anchor])

    def _synthetic_fill(self, lr: _Live, n: int) -> None:
        """Fill KV for positions ``[0, n)`` with seeded values, in O(n), without a forward.

        Documented stand-in for the prefill of a long prompt. Every target and drafter
        layer gets N(0, 1) keys and values (the scale real projections produce here),
        written through the page table exactly where a real prefill would put them. The
        values are copied from a bank of ``SYNTH_BANK_TOKENS`` seeded random tokens,
        starting at an offset drawn from the request's seed and wrapping around, with a
        different offset per layer, K and V: O(n) copying, no per-token generation.
        """
        import torch

        if n <= 0:
            return
        self._ensure_pages(lr, n)
        p = self.cfg.page_size
        bank = self._synth_bank()
        size = bank.shape[0]
        pages = _tensor(lr.pages, self.device)
        slots = (pages[:, None] * p + torch.arange(p, device=self.device)[None, :]).reshape(-1)[:n]
        rng = random.Random(zlib.crc32(f"{lr.req.seed}:synthetic".encode()))
        for layer in range(len(self.kv.k)):
            kv = []
            for _ in range(2):
                start = rng.randrange(size)
                idx = (torch.arange(n, device=self.device) + start) % size
                kv.append(bank.index_select(0, idx))
            self.kv.write(layer, slots, kv[0], kv[1])
        lr.seq_len = n

    def _synth_bank(self) -> torch.Tensor:
        import torch

        if self._bank is None:
            gen = torch.Generator(device="cpu").manual_seed(self.cfg.seed + 1)
            shape = (SYNTH_BANK_TOKENS, self.cfg.num_kv_heads, self.cfg.head_dim)
            self._bank = torch.randn(shape, generator=gen).to(self.device, self.dtype)
        return self._bank

    def _reference_read(self, lr: _Live, reps: int = 3) -> float:
        """Median ms to read the request's whole target KV through its page table.

        Plain torch (one gather and a sum per layer, K and V): no engine code, the same
        bytes and memory pages the decode steps read. Measured after the prefill, outside
        every step; it tracks the memory system's speed for this very layout (huge pages,
        noisy neighbours), so step times can be judged against it.
        """
        import torch

        p = self.cfg.page_size
        n = -(-lr.seq_len // p)
        pages = _tensor(lr.pages[:n], self.device)
        times = []
        for _ in range(reps):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t = time.perf_counter()
            acc = torch.zeros((), device=self.device, dtype=torch.float32)
            per = max(1, CPU_CHUNK_TOKENS // p)  # small temporaries: no page-fault storms
            for layer in range(self.cfg.num_layers):
                for pool in (self.kv.k[layer], self.kv.v[layer]):
                    h, _, d = pool.shape
                    paged = pool.view(h, -1, p, d)
                    for i in range(0, n, per):
                        acc += paged.index_select(1, pages[i : i + per]).sum(dtype=torch.float32)
            float(acc)  # waits for the device
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[len(times) // 2]

    # -- decode steps ------------------------------------------------------------------------
    def _count_graph(self, runner: str, replay: bool) -> None:
        self.probe.count_graph(runner, replay=replay)
        c = self.graph_counters.setdefault(runner, {"replay": 0, "eager": 0})
        c["replay" if replay else "eager"] += 1

    def _verify_forward(
        self,
        batch: list[_Live],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        runner: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward over the step's tokens: graph replay when possible, else eager."""
        if self.graphs is not None:
            out = self.graphs.try_replay(
                runner,
                tokens,
                positions,
                slots,
                [lr.pages for lr in batch],
                [lr.seq_len for lr in batch],
            )
            if out is not None:
                self._count_graph(runner, True)
                return out
        self._count_graph(runner, False)
        t = tokens.numel() // len(batch)
        reads = PlannedReads(
            [SeqRows(i * t, (i + 1) * t, self._plan(lr)) for i, lr in enumerate(batch)]
        )
        return self.target.forward(tokens, positions, reads, self.kv, slots)

    def _step_dflash(self, batch: list[_Live]) -> None:
        import torch

        probe, block, dev = self.probe, self.block, self.device
        assert self.drafter is not None
        probe.begin_step(
            context_len=max(lr.seq_len for lr in batch),
            batch_size=len(batch),
            rids=[lr.req.rid for lr in batch],
        )
        with probe.phase("schedule"):
            for lr in batch:
                self._ensure_pages(lr, lr.seq_len + block)
            anchor_pos = _tensor([lr.seq_len for lr in batch], dev)
            anchors = _tensor([lr.anchor for lr in batch], dev)
        with probe.phase("draft"):
            cond = torch.stack([lr.cond for lr in batch])
            drafts = None
            if self.graphs is not None:
                drafts = self.graphs.draft(
                    anchors,
                    anchor_pos,
                    cond,
                    [lr.pages for lr in batch],
                    [lr.seq_len for lr in batch],
                )
            self._count_graph("draft", drafts is not None)
            if drafts is None:
                plans = [self._plan(lr) for lr in batch]
                drafts = self.drafter.draft(anchors, anchor_pos, cond, plans, self.kv, block)
        with probe.phase("build_verify_input"):
            tokens = torch.cat([anchors[:, None], drafts], dim=1).reshape(-1)
            offs = torch.arange(block, device=dev)
            positions = (anchor_pos[:, None] + offs[None, :]).reshape(-1)
        with probe.phase("prepare_for_verify"):
            slots = _tensor([s for lr in batch for s in self._slots(lr, lr.seq_len, block)], dev)
            if self.graphs is None:
                for lr in batch:
                    self._plan(lr)  # attention metadata for the eager verify
        with probe.phase("verify"):
            logits, fused = self._verify_forward(batch, tokens, positions, slots, "target_verify")
        with probe.phase("accept"):
            pred = logits.argmax(dim=-1).view(len(batch), block).tolist()
            draft_l = drafts.tolist()
            taken: list[int] = []
            produced = 0
            for lr, p, d in zip(batch, pred, draft_l):
                j = 0
                if lr.rng is not None:
                    m = self.simulate_accept_len or 1.0
                    j = int(m) - 1 + (lr.rng.random() < m - int(m))
                else:
                    while j < block - 1 and d[j] == p[j]:
                        j += 1
                taken.append(j)
                before = len(lr.output)
                self._finish_tokens(lr, p[: j + 1])
                produced += len(lr.output) - before
                lr.anchor = p[j]
                lr.steps += 1
        with probe.phase("kv_commit"):
            rows = [i * block + k for i, j in enumerate(taken) for k in range(j + 1)]
            idx = _tensor(rows, dev)
            self.drafter.commit_context(
                fused.index_select(0, idx),
                positions.index_select(0, idx),
                self.kv,
                slots.index_select(0, idx),
            )
            for i, (lr, j) in enumerate(zip(batch, taken)):
                lr.cond = fused[i * block + j].clone()  # graph outputs are reused buffers
                lr.seq_len += j + 1
                self._release_tail(lr)
        probe.end_step(accepted_tokens=produced)
        self.counters["decode_steps"] += 1
        self.counters["generated_tokens"] += produced

    def _step_greedy(self, batch: list[_Live]) -> None:
        probe, dev = self.probe, self.device
        probe.begin_step(
            context_len=max(lr.seq_len for lr in batch),
            batch_size=len(batch),
            rids=[lr.req.rid for lr in batch],
        )
        with probe.phase("schedule"):
            for lr in batch:
                self._ensure_pages(lr, lr.seq_len + 1)
            tokens = _tensor([lr.anchor for lr in batch], dev)
            positions = _tensor([lr.seq_len for lr in batch], dev)
        with probe.phase("prepare_for_verify"):
            slots = _tensor([self._slots(lr, lr.seq_len, 1)[0] for lr in batch], dev)
            if self.graphs is None:
                for lr in batch:
                    self._plan(lr)  # attention metadata for the eager forward
        with probe.phase("verify"):
            logits, _ = self._verify_forward(batch, tokens, positions, slots, "target_decode")
        with probe.phase("accept"):
            nxt = logits.argmax(dim=-1).tolist()
            produced = 0
            for lr, t in zip(batch, nxt):
                before = len(lr.output)
                self._finish_tokens(lr, [t])
                produced += len(lr.output) - before
                lr.anchor = t
                lr.steps += 1
        with probe.phase("kv_commit"):
            for lr in batch:
                lr.seq_len += 1
        probe.end_step(accepted_tokens=produced)
        self.counters["decode_steps"] += 1
        self.counters["generated_tokens"] += produced

    def mean_accept_length(self) -> float:
        """Tokens produced per decode step over the engine's lifetime."""
        steps = self.counters["decode_steps"]
        return round(self.counters["generated_tokens"] / steps, 4) if steps else 0.0

    def info(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "speculative_algorithm": self.algorithm,
            "speculative_num_draft_tokens": self.block,
            "simulate_accept_len": self.simulate_accept_len,
            "cuda_graphs": self.graphs.info() if self.graphs is not None else None,
            "counters": dict(self.counters),
            "graph_counters": {k: dict(v) for k, v in self.graph_counters.items()},
            "kv_bytes_per_token": self.cfg.kv_bytes_per_token(self.kv.k[0].element_size()),
            "kv_free_pages": self.allocator.free_count,
            "kv_total_pages": self.allocator.num_pages,
            "fingerprint": self.fingerprint(),
        }
