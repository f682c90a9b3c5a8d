"""CUDA graphs for the reference engine's verify and draft forwards.

A graph is captured per (runner, batch size, tokens per request, page bucket) the first
time that shape is seen, with static input buffers (tokens, positions, KV slots, a padded
page-index tensor, context lengths) and static outputs. Attention in a captured graph
reads through the padded page-index tensor (``PaddedReads``), since a graph cannot have
data-dependent shapes. Shapes outside the captured batch sizes or page buckets run
eagerly and are counted as eager forwards, as SGLang's ``can_run_graph`` falls back.

Every use is one of three kinds, counted apart: ``capture`` (the shape was new: warm-up,
capture and one replay; slow, and a measured step that captures is not a graph step),
``replay`` and ``eager``. A capture that fails (an operation not permitted while
capturing, out of memory) is not retried: that shape runs eagerly from then on, with the
failure as its fallback reason, and the request that hit it completes.

The capture itself is a :class:`CaptureBackend`: :class:`CudaCapture` on a GPU; unit
tests pass a test double, so the graph path runs (and fails) on the CPU too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pytest_specperf.engines.reference.model import PaddedReads
from pytest_specperf.telemetry.bandwidth import padded_pages

if TYPE_CHECKING:
    import torch

    from pytest_specperf.engines.reference.engine import Engine

#: Batch sizes for which graphs are captured (SGLang captures a similar ladder).
CAPTURE_BATCH_SIZES = (1, 2, 4, 8)
#: Smallest page bucket; buckets double up to LINEAR_PAGE_STEP, then grow by it.
MIN_PAGE_BUCKET = 64
LINEAR_PAGE_STEP = 512

GraphUse = Literal["capture", "replay", "eager"]
Key = tuple[str, int, int, int]


def page_bucket(pages: int) -> int:
    """Captured page count for ``pages``: powers of two up to LINEAR_PAGE_STEP, then its
    multiples, so that a long context reads at most LINEAR_PAGE_STEP pages of padding
    (8192 tokens at 16-token pages) instead of up to twice its KV."""
    return padded_pages(pages, MIN_PAGE_BUCKET, LINEAR_PAGE_STEP)


def static_inputs(
    page_tables: list[list[int]], context_lens: list[int], bucket: int, device: Any
) -> PaddedReads:
    """Padded page-index tensor ``(B, bucket)`` (pad: page 0, masked) and context lengths.

    For tests and tools; the engine reads these from its device page table instead."""
    import torch

    rows = [t[:bucket] + [0] * (bucket - min(len(t), bucket)) for t in page_tables]
    return PaddedReads(
        page_index=torch.tensor(rows, dtype=torch.long, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.long, device=device),
    )


class CaptureBackend(Protocol):
    """Captures a forward into a replayable graph."""

    def capture(
        self, fn: Callable[..., Any], inputs: dict[str, torch.Tensor]
    ) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """Warm up and capture ``fn(**inputs)``; return the graph and its static outputs
        (valid after the call: the captured work has run once)."""

    def replay(self, graph: Any) -> None:
        """Run the captured work again on the current inputs."""


class CudaCapture:
    """``torch.cuda.graph`` capture on ``device`` (warm-up on a side stream first)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)

    def capture(
        self, fn: Callable[..., Any], inputs: dict[str, torch.Tensor]
    ) -> tuple[Any, tuple[torch.Tensor, ...]]:
        import torch

        with torch.cuda.device(self.device):
            current = torch.cuda.current_stream(self.device)
            stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up allocator and kernels outside the graph
                    fn(**inputs)
            current.wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = fn(**inputs)
            graph.replay()  # the captured work has not run yet: run it once
        return graph, outputs if isinstance(outputs, tuple) else (outputs,)

    def replay(self, graph: Any) -> None:
        graph.replay()


@dataclass
class _Captured:
    graph: Any
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...]
    capture_ms: float
    replays: int = 0


class GraphRunner:
    """Captures and replays the engine's target-verify and draft forwards."""

    def __init__(self, engine: Engine, backend: CaptureBackend | None = None) -> None:
        self.engine = engine
        self.backend: CaptureBackend = backend or CudaCapture(engine.device)
        self._graphs: dict[Key, _Captured] = {}
        self._failed: dict[Key, str] = {}
        self.fallback_reasons: dict[str, int] = {}
        self.last_use: GraphUse = "eager"

    def info(self) -> dict[str, Any]:
        return {
            "capture_batch_sizes": list(CAPTURE_BATCH_SIZES),
            "captured": [
                {
                    "runner": k[0],
                    "batch_size": k[1],
                    "tokens": k[2],
                    "page_bucket": k[3],
                    "replays": g.replays,
                    "capture_ms": round(g.capture_ms, 3),
                }
                for k, g in sorted(self._graphs.items())
            ],
            "capture_failures": [
                {"runner": k[0], "batch_size": k[1], "tokens": k[2], "page_bucket": k[3],
                 "reason": why}
                for k, why in sorted(self._failed.items())
            ],
            "fallback_reasons": dict(self.fallback_reasons),
        }

    def _fallback(self, why: str) -> None:
        self.fallback_reasons[why] = self.fallback_reasons.get(why, 0) + 1

    def _key(self, runner: str, batch: int, tokens: int, max_context: int) -> Key | None:
        if batch not in CAPTURE_BATCH_SIZES:
            self._fallback(f"batch size {batch} not captured")
            return None
        p = self.engine.cfg.page_size
        bucket = page_bucket(max(-(-max_context // p), 1))
        if bucket * p > self.engine.pool_tokens or bucket > self.engine.page_table.width:
            self._fallback("context beyond the largest page bucket")
            return None
        key = (runner, batch, tokens, bucket)
        failed = self._failed.get(key)
        if failed is not None:
            self._fallback(failed)
            return None
        return key

    def _capture(self, key: Key, fn: Any, values: dict[str, torch.Tensor]) -> _Captured | None:
        inputs = {k: v.clone() for k, v in values.items()}
        t0 = time.perf_counter()
        try:
            graph, outputs = self.backend.capture(fn, inputs)
        except Exception as e:  # any capture failure: this shape runs eagerly from now on
            why = f"capture failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            self._failed[key] = why
            self._fallback(why)
            self._settle()
            return None
        cap = _Captured(graph, inputs, outputs, (time.perf_counter() - t0) * 1e3)
        self._graphs[key] = cap
        return cap

    def _settle(self) -> None:
        """After a failed capture: wait for the device so the error surfaces here."""
        if self.engine.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.engine.device)

    def _run(
        self, key: Key, fn: Any, values: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, ...] | None:
        """Replay ``key`` on ``values`` (capturing it first if new); None: run eagerly."""
        cap = self._graphs.get(key)
        if cap is None:
            cap = self._capture(key, fn, values)
            self.last_use = "capture" if cap is not None else "eager"
            return cap.outputs if cap is not None else None
        for name, value in values.items():
            cap.inputs[name].copy_(value, non_blocking=True)
        self.backend.replay(cap.graph)
        cap.replays += 1
        self.last_use = "replay"
        return cap.outputs

    def try_replay(
        self,
        runner: str,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        page_rows: torch.Tensor,
        context_lens: torch.Tensor,
        max_context: int,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The target forward through a graph (``last_use`` says how), or None: eager.

        ``page_rows``: the batch's device page-table rows ``(B, width)``; the graph reads
        the first page-bucket columns. ``max_context``: the longest context (host int)."""
        b = context_lens.numel()
        key = self._key(runner, b, tokens.numel() // b, max_context)
        if key is None:
            self.last_use = "eager"
            return None
        eng = self.engine

        def forward(
            tokens: Any, positions: Any, slots: Any, page_index: Any, context_lens: Any
        ) -> Any:
            return eng.target.forward(
                tokens, positions, PaddedReads(page_index, context_lens), eng.kv, slots
            )

        values = {
            "tokens": tokens,
            "positions": positions,
            "slots": slots,
            "page_index": page_rows[:, : key[3]],
            "context_lens": context_lens,
        }
        out = self._run(key, forward, values)
        return None if out is None else (out[0], out[1])

    def draft(
        self,
        anchors: torch.Tensor,
        anchor_positions: torch.Tensor,
        cond: torch.Tensor,
        page_rows: torch.Tensor,
        max_context: int,
    ) -> torch.Tensor | None:
        """The drafter's block forward through a graph (``last_use`` says how), or None."""
        eng = self.engine
        drafter = eng.drafter
        key = self._key("draft", anchors.numel(), eng.block, max_context)
        if key is None or drafter is None:
            self.last_use = "eager"
            return None

        def forward(
            anchors: Any, anchor_positions: Any, cond: Any, page_index: Any, context_lens: Any
        ) -> Any:
            reads = PaddedReads(page_index, context_lens)
            return drafter.draft(anchors, anchor_positions, cond, reads, eng.kv, eng.block)

        values = {
            "anchors": anchors,
            "anchor_positions": anchor_positions,
            "cond": cond,
            "page_index": page_rows[:, : key[3]],
            "context_lens": anchor_positions,
        }
        out = self._run(key, forward, values)
        return None if out is None else out[0]
