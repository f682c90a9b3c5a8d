"""CUDA graphs for the reference engine's verify and draft forwards.

A graph is captured per (runner, batch size, tokens per request, page bucket) the first
time that shape is seen, with static input buffers (tokens, positions, KV slots, a padded
page-index tensor, context lengths) and static outputs. Attention in a captured graph
reads through the padded page-index tensor (``PaddedReads``), since a graph cannot have
data-dependent shapes. Shapes outside the captured batch sizes or page buckets run
eagerly and are counted as eager forwards, as SGLang's ``can_run_graph`` falls back.

Only used on CUDA. ``static_inputs`` is also usable on the CPU, so that the graph-mode
forward can be checked against the eager one without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specperf.engines.reference.model import PaddedReads

if TYPE_CHECKING:
    import torch

    from pytest_specperf.engines.reference.engine import Engine

#: Batch sizes for which graphs are captured (SGLang captures a similar ladder).
CAPTURE_BATCH_SIZES = (1, 2, 4, 8)
#: Smallest page bucket; buckets double up to LINEAR_PAGE_STEP, then grow by it.
MIN_PAGE_BUCKET = 64
LINEAR_PAGE_STEP = 512


def page_bucket(pages: int) -> int:
    """Captured page count for ``pages``: powers of two up to LINEAR_PAGE_STEP, then its
    multiples, so that a long context reads at most LINEAR_PAGE_STEP pages of padding
    (8192 tokens at 16-token pages) instead of up to twice its KV."""
    b = MIN_PAGE_BUCKET
    while b < pages and b < LINEAR_PAGE_STEP:
        b *= 2
    if b >= pages:
        return b
    return -(-pages // LINEAR_PAGE_STEP) * LINEAR_PAGE_STEP


def static_inputs(
    page_tables: list[list[int]], context_lens: list[int], bucket: int, device: Any
) -> PaddedReads:
    """Padded page-index tensor ``(B, bucket)`` (pad: page 0, masked) and context lengths."""
    import torch

    rows = [t[:bucket] + [0] * (bucket - min(len(t), bucket)) for t in page_tables]
    return PaddedReads(
        page_index=torch.tensor(rows, dtype=torch.long, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.long, device=device),
    )


@dataclass
class _Captured:
    graph: Any
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...]
    replays: int = 0


class GraphRunner:
    """Captures and replays the engine's target-verify and draft forwards on CUDA."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._graphs: dict[tuple[str, int, int, int], _Captured] = {}
        self.fallback_reasons: dict[str, int] = {}

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
                }
                for k, g in sorted(self._graphs.items())
            ],
            "fallback_reasons": dict(self.fallback_reasons),
        }

    def _fallback(self, why: str) -> None:
        self.fallback_reasons[why] = self.fallback_reasons.get(why, 0) + 1

    def _key(
        self, runner: str, context_lens: list[int], tokens: int
    ) -> tuple[str, int, int, int] | None:
        b = len(context_lens)
        if b not in CAPTURE_BATCH_SIZES:
            self._fallback(f"batch size {b} not captured")
            return None
        p = self.engine.cfg.page_size
        pages = max(-(-c // p) for c in context_lens)
        bucket = page_bucket(max(pages, 1))
        if bucket * p > self.engine.pool_tokens:
            self._fallback("context beyond the largest page bucket")
            return None
        return (runner, b, tokens, bucket)

    def _capture(
        self, key: tuple[str, int, int, int], fn: Any, inputs: dict[str, Any]
    ) -> _Captured:
        import torch

        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up allocator and kernels outside the graph
                fn(**inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = fn(**inputs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        cap = _Captured(graph, inputs, outputs)
        self._graphs[key] = cap
        return cap

    def _replay(
        self, key: tuple[str, int, int, int], fn: Any, values: dict[str, Any]
    ) -> tuple[torch.Tensor, ...]:
        cap = self._graphs.get(key)
        if cap is None:
            cap = self._capture(key, fn, {k: v.clone() for k, v in values.items()})
        else:
            for name, value in values.items():
                cap.inputs[name].copy_(value, non_blocking=True)
        cap.graph.replay()
        cap.replays += 1
        return cap.outputs

    def try_replay(
        self,
        runner: str,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        page_tables: list[list[int]],
        context_lens: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Replay (capturing on first use) the target forward; ``None`` means run eagerly."""
        key = self._key(runner, context_lens, tokens.numel() // len(context_lens))
        if key is None:
            return None
        eng = self.engine
        reads = static_inputs(page_tables, context_lens, key[3], eng.device)

        def forward(
            tokens: Any, positions: Any, slots: Any, page_index: Any, context_lens: Any
        ) -> Any:
            return eng.target.forward(
                tokens, positions, PaddedReads(page_index, context_lens), eng.kv, slots
            )

        out = self._replay(
            key,
            forward,
            {
                "tokens": tokens,
                "positions": positions,
                "slots": slots,
                "page_index": reads.page_index,
                "context_lens": reads.context_lens,
            },
        )
        return out[0], out[1]

    def draft(
        self,
        anchors: torch.Tensor,
        anchor_positions: torch.Tensor,
        cond: torch.Tensor,
        page_tables: list[list[int]],
        context_lens: list[int],
    ) -> torch.Tensor | None:
        """Replay (capturing on first use) the drafter's block forward, or ``None``."""
        eng = self.engine
        key = self._key("draft", context_lens, eng.block)
        if key is None or eng.drafter is None:
            return None
        drafter = eng.drafter
        reads = static_inputs(page_tables, context_lens, key[3], eng.device)

        def forward(
            anchors: Any, anchor_positions: Any, cond: Any, page_index: Any, context_lens: Any
        ) -> Any:
            return drafter.draft(
                anchors,
                anchor_positions,
                cond,
                PaddedReads(page_index, context_lens),
                eng.kv,
                eng.block,
            )

        out = self._replay(
            key,
            forward,
            {
                "anchors": anchors,
                "anchor_positions": anchor_positions,
                "cond": cond,
                "page_index": reads.page_index,
                "context_lens": reads.context_lens,
            },
        )
        return out[0]
