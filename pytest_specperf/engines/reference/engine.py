"""The reference engine: paged-KV target, block drafter, greedy verification, phase probe.

One ``generate`` call runs a batch of requests to completion in lockstep decode steps.
Each step is instrumented with the phases of DESIGN.md section 4:

========================  =============================================================
``schedule``              page allocation for the step's block; the step's inputs
                          (context lengths, anchors) in one pinned non-blocking copy
``draft``                 the drafter's attention metadata and its one block forward
``build_verify_input``    the verify chain: anchor + drafted tokens, positions
``prepare_for_verify``    cache locations (slots) from the device page table, attention
                          read plans (eager)
``verify``                one target forward over the whole block (graph or eager)
``accept``                greedy matching on the device (longest matching prefix plus the
                          bonus token), then the step's one read-back to the host
``kv_commit``             draft-KV append for the block, release of rejected pages
========================  =============================================================

With ``algorithm="NONE"`` a step is plain greedy decoding of one token (no draft, no
verify-input build; ``verify`` is the one-token target forward).
"""

from __future__ import annotations

import contextlib
import random
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specperf import __version__
from pytest_specperf.engines.reference.attention import CPU_CHUNK_TOKENS, ReadPlan, plan_reads
from pytest_specperf.engines.reference.config import ModelConfig
from pytest_specperf.engines.reference.graphs import (
    LINEAR_PAGE_STEP,
    MIN_PAGE_BUCKET,
    page_bucket,
)
from pytest_specperf.engines.reference.kv import (
    LAYOUTS,
    DevicePageTable,
    KVPool,
    PageAllocator,
    fragmentation,
    huge_pages_requested,
    pool_tokens,
)
from pytest_specperf.engines.reference.model import Drafter, PlannedReads, SeqRows, TargetModel
from pytest_specperf.engines.reference.staging import DeviceToHost, HostToDevice
from pytest_specperf.probe import NullProbe, StepProbe
from pytest_specperf.telemetry.bandwidth import GATHER_PASSES

if TYPE_CHECKING:
    import torch

    from pytest_specperf.engines.reference.graphs import CaptureBackend, GraphRunner, GraphUse

ALGORITHMS = ("DFLASH", "NONE")
#: Token id that ends a generation unless ``ignore_eos`` (as Llama's ``</s>``).
EOS_TOKEN_ID = 2
#: Synthetic prefill copies K/V from a seeded bank of this many random tokens.
SYNTH_BANK_TOKENS = 65536
#: Real prefill runs in chunks of this many tokens.
PREFILL_CHUNK = 1024
#: On a GPU, the reference read gathers at most this many bytes per kernel.
GPU_READ_CHUNK_BYTES = 1 << 30
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
    #: most decode steps (draft and verify), or None: ``max_new_tokens`` alone ends it
    max_decode_steps: int | None = None


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
    row: int = 0  # this request's row in the device page table
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


@dataclass(frozen=True)
class _StepInputs:
    """What one decode step reads on the device, staged in one host-to-device copy."""

    page_rows: torch.Tensor  # (B, width): the batch's rows of the device page table
    context_lens: torch.Tensor  # (B,): committed tokens, i.e. the anchors' positions
    anchors: torch.Tensor  # (B,)
    forced: torch.Tensor | None  # (B,): simulated accepted drafts, or None (real matching)
    max_context: int


class Engine:
    """A real speculative decoder over a paged KV cache, CPU or CUDA.

    On CUDA the engine makes its device the process's current one at construction and
    again around every ``generate`` (streams, graph capture, the probe's CUDA events and
    the canary's busy kernels all follow the current device). A decode step sends its
    inputs in one pinned, non-blocking copy, keeps page tables, cache locations and
    acceptance on the device, and waits for the device at one point: the accept phase's
    read-back of the verified tokens (see ``staging.py``).
    """

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
        graph_capture: CaptureBackend | None = None,
    ) -> None:
        import torch

        _check_settings(algorithm, num_draft_tokens, simulate_accept_len)
        self.cfg = cfg
        self.device = _claim_device(device)
        if dtype is None:
            dtype = "float32" if self.device.type == "cpu" else "bfloat16"
        self.dtype = getattr(torch, dtype)
        self.algorithm = algorithm
        self.block = num_draft_tokens
        self.simulate_accept_len = simulate_accept_len
        self.probe: StepProbe | NullProbe = probe if probe is not None else NullProbe()
        torch.set_grad_enabled(False)
        with self._device_guard():
            self._build(cfg, cuda_graphs, graph_capture)
        self.counters: dict[str, int] = {
            "requests": 0,
            "decode_steps": 0,
            "generated_tokens": 0,
            "prefill_tokens": 0,
            "synthetic_prefill_tokens": 0,
            "verify_forwards": 0,
            "kv_read_bytes": 0,
        }
        self.graph_counters: dict[str, dict[str, int]] = {}

    def _build(
        self, cfg: ModelConfig, cuda_graphs: bool, graph_capture: CaptureBackend | None
    ) -> None:
        import torch

        self.target = TargetModel(cfg, device=self.device, dtype=self.dtype)
        self.drafter = Drafter(self.target, self.block) if self.algorithm == "DFLASH" else None
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        self.pool_tokens = pool_tokens(cfg, self.device, itemsize)
        self.kv = KVPool(cfg, device=self.device, dtype=self.dtype, tokens=self.pool_tokens)
        self.allocator = PageAllocator(self.pool_tokens // cfg.page_size)
        self._h2d = HostToDevice(self.device)
        self._d2h = DeviceToHost(self.device)
        width = page_bucket(-(-cfg.max_context_len // cfg.page_size))
        self.page_table = DevicePageTable(cfg.max_batch_size, width, self.device, self._h2d)
        self._row_index: dict[tuple[int, ...], torch.Tensor] = {}
        self._aranges = torch.arange(max(cfg.max_batch_size, 32), device=self.device)
        self._pending_layout: tuple[str, float, int] | None = None
        self._bank: torch.Tensor | None = None
        self._layout_name = "contiguous"
        self.graphs: GraphRunner | None = None
        if graph_capture is not None or (self.device.type == "cuda" and cuda_graphs):
            from pytest_specperf.engines.reference.graphs import GraphRunner

            self.graphs = GraphRunner(self, graph_capture)

    def _device_guard(self) -> contextlib.AbstractContextManager[Any]:
        """The engine's CUDA device as the current one (a no-op on the CPU)."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        import torch

        return torch.cuda.device(self.device)

    # -- identity -------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """What the measured work depends on; a baseline is valid only for the same values."""
        import torch

        fp: dict[str, Any] = {
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
        if self.device.type == "cpu" and huge_pages_requested():
            fp["huge_pages"] = True  # only then: the fingerprint (and its hash) is as before
        return fp

    def kv_read_model(self) -> dict[str, Any]:
        """How many KV bytes a verify moves (see ``telemetry.bandwidth.kv_read_bytes``)."""
        model: dict[str, Any] = {
            "bytes_per_token": self.cfg.kv_bytes_per_token(self.kv.k[0].element_size()),
            "page_size": self.cfg.page_size,
            "gather_passes": GATHER_PASSES,
        }
        if self.graphs is not None:
            model["padded_bucket"] = {
                "min_pages": MIN_PAGE_BUCKET,
                "linear_step_pages": LINEAR_PAGE_STEP,
            }
        return model

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

    def _apply_pending_layout(self) -> None:
        if self._pending_layout is None:
            return
        layout, level, seed = self._pending_layout
        self._pending_layout = None
        if layout == "contiguous":
            self.allocator.reset()
        else:
            self.allocator.fragment(level, seed)
        self._layout_name = layout

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
        if req.max_decode_steps is not None and req.max_decode_steps < 1:
            raise RequestError(f"max_decode_steps must be at least 1, got {req.max_decode_steps}")
        need = n + req.max_new_tokens + self.block
        if need > cfg.max_context_len:
            raise RequestError(
                f"context {n} + max_new_tokens {req.max_new_tokens} + block {self.block} = {need} "
                f"exceeds the configured maximum context of {cfg.max_context_len} tokens"
            )

    def _check_batch(self, reqs: list[GenRequest]) -> None:
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

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        self._check_batch(reqs)
        with self._device_guard():
            return self._generate(reqs)

    def _generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        t0 = time.perf_counter()
        self.probe.new_request()
        self._apply_pending_layout()
        live = [_Live(req=r, pages=[], row=i) for i, r in enumerate(reqs)]
        self._row_index.clear()
        results: dict[str, GenResult] = {}
        try:
            for lr in live:
                self.page_table.truncate(lr.row, 0)
                self._prefill(lr)
                lr.reference_ms = self._reference_read(lr)
            self._decode(live)
            self.probe.flush()
            latency = time.perf_counter() - t0
            for lr in live:
                results[lr.req.rid] = self._result(lr, latency)
        finally:
            for lr in live:
                if lr.pages:
                    self.allocator.free(lr.pages)
                    lr.pages = []
        self.counters["requests"] += len(reqs)
        return [results[r.rid] for r in reqs]

    def _decode(self, live: list[_Live]) -> None:
        active = [lr for lr in live if not lr.finish]
        step = self._step_dflash if self.algorithm == "DFLASH" else self._step_greedy
        while active:
            try:
                step(active)
            except BaseException:
                self.probe.abort_step()  # no half record; later steps are recorded again
                raise
            for lr in active:
                cap = lr.req.max_decode_steps
                if not lr.finish and cap is not None and lr.steps >= cap:
                    lr.finish = "length"
            active = [lr for lr in active if not lr.finish]

    def _result(self, lr: _Live, latency: float) -> GenResult:
        return GenResult(
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

    # -- helpers ---------------------------------------------------------------------------
    def _ensure_pages(self, lr: _Live, tokens: int) -> None:
        need = -(-tokens // self.cfg.page_size) - len(lr.pages)
        if need > 0:
            lr.pages.extend(self.allocator.alloc(need))
            self.page_table.sync(lr.row, lr.pages)

    def _release_tail(self, lr: _Live) -> None:
        keep = -(-lr.seq_len // self.cfg.page_size)
        if len(lr.pages) > keep:
            tail = lr.pages[keep:]
            del lr.pages[keep:]
            self.allocator.free(tail)
            self.page_table.truncate(lr.row, keep)

    def _slots(self, lr: _Live, start: int, n: int) -> list[int]:
        p = self.cfg.page_size
        return [lr.pages[i // p] * p + i % p for i in range(start, start + n)]

    def _plan(self, lr: _Live) -> ReadPlan:
        key = (lr.seq_len, len(lr.pages))
        if lr.plan is None or lr.plan_key != key:
            p = self.cfg.page_size
            lr.plan = plan_reads(lr.pages, lr.seq_len, p, self.device, self._h2d.put)
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
        logits, fused = self._prefill_chunks(lr, ids)
        lr.anchor = int(self._d2h.fetch(logits[-1].argmax()))
        lr.cond = fused[-1].clone()
        if self.simulate_accept_len is not None:
            lr.rng = random.Random(zlib.crc32(f"{req.seed}:{req.rid}".encode()))
        self._finish_tokens(lr, [lr.anchor])

    def _prefill_chunks(self, lr: _Live, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        start = lr.seq_len
        self._ensure_pages(lr, start + len(ids))
        logits = fused = None
        for s in range(0, len(ids), PREFILL_CHUNK):
            chunk = ids[s : s + PREFILL_CHUNK]
            pos0 = start + s
            positions = torch.arange(pos0, pos0 + len(chunk), device=self.device)
            slots = self._h2d.put(self._slots(lr, pos0, len(chunk)))
            plan = plan_reads(lr.pages, pos0, self.cfg.page_size, self.device, self._h2d.put)
            reads = PlannedReads([SeqRows(0, len(chunk), plan)])
            logits, fused = self.target.forward(
                self._h2d.put(chunk), positions, reads, self.kv, slots
            )
            if self.drafter is not None:
                self.drafter.commit_context(fused, positions, self.kv, slots)
            lr.seq_len = pos0 + len(chunk)
        assert logits is not None and fused is not None
        return logits, fused

    def _synthetic_fill(self, lr: _Live, n: int) -> None:
        """Fill KV for positions ``[0, n)`` with seeded values, in O(n), without a forward.

        Documented stand-in for the prefill of a long prompt. Every target and drafter
        layer gets N(0, 1) keys and values (the scale real projections produce here),
        written through the page table exactly where a real prefill would put them. The
        values are copied from a bank of ``SYNTH_BANK_TOKENS`` seeded random tokens,
        starting at an offset drawn from the request's seed and wrapping around, with a
        different offset per layer, K and V: O(n) copying, no per-token generation.

        The gathered copy of the bank is kept on purpose. A fill without it (the bank's
        contiguous pieces straight into the pool, 1.8-2.7 times as fast) put a fragmented
        case's two server processes 16-28% apart in 3 of 6 A/A runs, this one in none of 4,
        for a reason not yet found (``docs/calibration.md``, "a faster KV fill splits the
        processes").
        """
        import torch

        if n <= 0:
            return
        self._ensure_pages(lr, n)
        p = self.cfg.page_size
        bank = self._synth_bank()
        size = bank.shape[0]
        pages = self._h2d.put(lr.pages)
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
        noisy neighbours), so step times can be judged against it. On the CPU the gathers
        are small (no page-fault storms); on a GPU they are as large as
        ``GPU_READ_CHUNK_BYTES`` allows (one per layer and pool for any context the
        configurations allow), so the figure measures memory, not kernel launches.
        """
        import torch

        p = self.cfg.page_size
        n = -(-lr.seq_len // p)
        pages = self._h2d.put(lr.pages[:n])
        per = self._reference_chunk_pages()
        times = []
        for _ in range(reps):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t = time.perf_counter()
            acc = torch.zeros((), device=self.device, dtype=torch.float32)
            for layer in range(self.cfg.num_layers):
                for pool in (self.kv.k[layer], self.kv.v[layer]):
                    h, _, d = pool.shape
                    paged = pool.view(h, -1, p, d)
                    for i in range(0, n, per):
                        acc += paged.index_select(1, pages[i : i + per]).sum(dtype=torch.float32)
            float(acc)  # waits for the device
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[len(times) // 2]

    def _reference_chunk_pages(self) -> int:
        """Pages per gather of the reference read (see ``_reference_read``)."""
        p = self.cfg.page_size
        if self.device.type != "cuda":
            return max(1, CPU_CHUNK_TOKENS // p)
        page_bytes = self.kv.k[0].element_size() * self.cfg.num_kv_heads * p * self.cfg.head_dim
        return max(1, GPU_READ_CHUNK_BYTES // page_bytes)

    # -- decode steps ------------------------------------------------------------------------
    def _count_graph(self, runner: str, use: GraphUse) -> None:
        self.probe.count_graph(runner, replay=use == "replay", capture=use == "capture")
        c = self.graph_counters.setdefault(runner, {"replay": 0, "eager": 0, "capture": 0})
        c[use] += 1

    def _begin(self, batch: list[_Live]) -> None:
        self.probe.begin_step(
            context_len=max(lr.seq_len for lr in batch),
            batch_size=len(batch),
            rids=[lr.req.rid for lr in batch],
        )

    def _end(self, produced: int) -> None:
        self.probe.end_step(accepted_tokens=produced)
        self.counters["decode_steps"] += 1
        self.counters["generated_tokens"] += produced

    def _schedule(self, batch: list[_Live], tokens: int, *, draws: bool) -> _StepInputs:
        """Pages for the step's ``tokens`` per request; the step's inputs in one copy."""
        for lr in batch:
            self._ensure_pages(lr, lr.seq_len + tokens)
        b = len(batch)
        ints = [lr.seq_len for lr in batch] + [lr.anchor for lr in batch]
        forced = self._forced_accepts(batch) if draws else None
        staged = self._h2d.put(ints + (forced or []))
        return _StepInputs(
            page_rows=self._page_rows(batch),
            context_lens=staged[:b],
            anchors=staged[b : 2 * b],
            forced=staged[2 * b :] if forced else None,
            max_context=max(lr.seq_len for lr in batch),
        )

    def _forced_accepts(self, batch: list[_Live]) -> list[int] | None:
        """Simulated acceptance (``simulate_accept_len``): accepted drafts per request,
        drawn on the host before the step (the draws do not depend on the step)."""
        if self.simulate_accept_len is None:
            return None
        m = self.simulate_accept_len
        out = []
        for lr in batch:
            assert lr.rng is not None
            out.append(int(m) - 1 + (lr.rng.random() < m - int(m)))
        return out

    def _page_rows(self, batch: list[_Live]) -> torch.Tensor:
        rows = tuple(lr.row for lr in batch)
        index = None
        if rows != tuple(range(len(rows))):
            index = self._row_index.get(rows)
            if index is None:
                index = self._row_index[rows] = self._h2d.put(list(rows))
        return self.page_table.rows(rows, index)

    def _slot_index(self, page_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Cache locations of ``positions`` ``(B, T)`` through the device page table."""
        p = self.cfg.page_size
        return (page_rows.gather(1, positions // p) * p + positions % p).reshape(-1)

    def _count_kv(self, batch: list[_Live], si: _StepInputs, padded: bool) -> None:
        """KV bytes this verify moves (``kv_read_model``), added to the counters."""
        per_token = self.cfg.kv_bytes_per_token(self.kv.k[0].element_size())
        if padded:
            bucket = page_bucket(max(-(-si.max_context // self.cfg.page_size), 1))
            tokens = GATHER_PASSES * bucket * self.cfg.page_size * len(batch)
        else:
            plans = [self._plan(lr) for lr in batch]
            tokens = sum(pl.context_len + (GATHER_PASSES - 1) * pl.copied_tokens for pl in plans)
        self.counters["verify_forwards"] += 1
        self.counters["kv_read_bytes"] += tokens * per_token

    def _verify_forward(
        self,
        batch: list[_Live],
        si: _StepInputs,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        runner: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target forward over the step's tokens: graph replay when possible, else eager."""
        if self.graphs is not None:
            out = self.graphs.try_replay(
                runner, tokens, positions, slots, si.page_rows, si.context_lens, si.max_context
            )
            if out is not None:
                self._count_graph(runner, self.graphs.last_use)
                self._count_kv(batch, si, padded=True)
                return out
        self._count_graph(runner, "eager")
        self._count_kv(batch, si, padded=False)
        t = tokens.numel() // len(batch)
        reads = PlannedReads(
            [SeqRows(i * t, (i + 1) * t, self._plan(lr)) for i, lr in enumerate(batch)]
        )
        return self.target.forward(tokens, positions, reads, self.kv, slots)

    def _draft(self, batch: list[_Live], si: _StepInputs) -> torch.Tensor:
        import torch

        assert self.drafter is not None
        cond = torch.stack([lr.cond for lr in batch])
        drafts: torch.Tensor | None = None
        use: GraphUse = "eager"
        if self.graphs is not None:
            drafts = self.graphs.draft(
                si.anchors, si.context_lens, cond, si.page_rows, si.max_context
            )
            use = self.graphs.last_use
        self._count_graph("draft", use)
        if drafts is None:
            plans = [self._plan(lr) for lr in batch]
            drafts = self.drafter.draft(
                si.anchors, si.context_lens, cond, plans, self.kv, self.block
            )
        return drafts

    def _accept_dflash(
        self, batch: list[_Live], si: _StepInputs, logits: torch.Tensor, drafts: torch.Tensor
    ) -> tuple[torch.Tensor, list[int], int]:
        """Greedy matching on the device, then the step's one sync: verified tokens and
        accepted counts come back to the host together. Returns the accepted drafts per
        request (device and host) and the tokens produced."""
        import torch

        pred = logits.argmax(dim=-1).view(len(batch), self.block)
        accepted = si.forced
        if accepted is None:  # longest prefix of drafts matching the target's tokens
            accepted = (drafts == pred[:, :-1]).long().cumprod(dim=1).sum(dim=1)
        host = self._d2h.fetch(torch.cat([pred, accepted[:, None]], dim=1))  # sync point
        taken, produced = [], 0
        for lr, row in zip(batch, host):
            j = row[-1]
            taken.append(j)
            before = len(lr.output)
            self._finish_tokens(lr, row[: j + 1])
            produced += len(lr.output) - before
            lr.anchor = row[j]
            lr.steps += 1
        return accepted, taken, produced

    def _commit_dflash(
        self,
        batch: list[_Live],
        fused: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        accepted: torch.Tensor,
        taken: list[int],
    ) -> None:
        """Draft KV for the block, the next step's conditioning, the committed lengths.

        Draft K/V is written for every row of the block, not only the accepted ones, so
        no variable-length index crosses to the device: a rejected row's slot lies at or
        beyond the request's new length, is masked by every read, and is overwritten
        when that position is committed (before any read can reach it)."""
        assert self.drafter is not None
        self.drafter.commit_context(fused, positions, self.kv, slots)
        b = len(batch)
        # a gather makes a new tensor: graph outputs are reused buffers
        conds = fused.view(b, self.block, -1)[self._aranges[:b], accepted]
        for i, (lr, j) in enumerate(zip(batch, taken)):
            lr.cond = conds[i]
            lr.seq_len += j + 1
            self._release_tail(lr)

    def _step_dflash(self, batch: list[_Live]) -> None:
        probe = self.probe
        self._begin(batch)
        with probe.phase("schedule"):
            si = self._schedule(batch, self.block, draws=True)
        with probe.phase("draft"):
            drafts = self._draft(batch, si)
        with probe.phase("build_verify_input"):
            tokens = self._cat_block(si.anchors, drafts)
            positions = si.context_lens[:, None] + self._aranges[None, : self.block]
        with probe.phase("prepare_for_verify"):
            slots = self._slot_index(si.page_rows, positions)
            if self.graphs is None:
                for lr in batch:
                    self._plan(lr)  # attention metadata for the eager verify
        with probe.phase("verify"):
            logits, fused = self._verify_forward(
                batch, si, tokens, positions.reshape(-1), slots, "target_verify"
            )
        with probe.phase("accept"):
            accepted, taken, produced = self._accept_dflash(batch, si, logits, drafts)
        with probe.phase("kv_commit"):
            self._commit_dflash(batch, fused, positions.reshape(-1), slots, accepted, taken)
        self._end(produced)

    @staticmethod
    def _cat_block(anchors: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.cat([anchors[:, None], drafts], dim=1).reshape(-1)

    def _step_greedy(self, batch: list[_Live]) -> None:
        probe = self.probe
        self._begin(batch)
        with probe.phase("schedule"):
            si = self._schedule(batch, 1, draws=False)
        with probe.phase("prepare_for_verify"):
            slots = self._slot_index(si.page_rows, si.context_lens[:, None])
            if self.graphs is None:
                for lr in batch:
                    self._plan(lr)  # attention metadata for the eager forward
        with probe.phase("verify"):
            logits, _ = self._verify_forward(
                batch, si, si.anchors, si.context_lens, slots, "target_decode"
            )
        with probe.phase("accept"):
            nxt = self._d2h.fetch(logits.argmax(dim=-1))  # the step's one sync point
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
        self._end(produced)

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
            "kv_read": self.kv_read_model(),
            "kv_free_pages": self.allocator.free_count,
            "kv_total_pages": self.allocator.num_pages,
            "fingerprint": self.fingerprint(),
        }


def _check_settings(algorithm: str, block: int, simulate: float | None) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown speculative algorithm {algorithm!r}; choose DFLASH or NONE")
    if not 2 <= block <= 32:
        raise ValueError(f"num_draft_tokens must be in [2, 32], got {block}")
    if simulate is not None and not 1.0 <= simulate <= block:
        raise ValueError(f"simulate_accept_len must be in [1, {block}], got {simulate}")


def _claim_device(device: str) -> torch.device:
    """``device`` as a torch device; a CUDA device gets an explicit index and becomes
    the process's current device."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    return dev
