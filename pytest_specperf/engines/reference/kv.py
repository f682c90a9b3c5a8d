"""Paged KV cache of the reference engine: page pools, a page allocator, page tables.

Layout: for every layer, K and V pools of shape ``(num_kv_heads, num_slots, head_dim)``,
where ``slot = page * page_size + offset``. A run of physically consecutive pages is then
a plain slice of the pool (a view, no copy); scattered pages must be gathered.

The allocator hands out pages from the head of its free list and puts freed pages back
at the head, as SGLang's ``PagedTokenToKVPoolAllocator`` does. A fragmented layout is
a permuted free list, as a long-running server's allocator is after churn.
"""

from __future__ import annotations

import itertools
import os
import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from pytest_specperf.engines.reference.config import ModelConfig
    from pytest_specperf.engines.reference.staging import HostToDevice

LAYOUTS = ("contiguous", "fragmented")

#: PyTorch's CPU allocator asks the kernel for transparent huge pages (``madvise``) for
#: every allocation of 2 MiB or more, the KV pool's included, when this is ``1``.
THP_ENV = "THP_MEM_ALLOC_ENABLE"


def huge_pages_requested(environ: Mapping[str, str] = os.environ) -> bool | None:
    """True when the CPU KV pool asks for transparent huge pages (``THP_ENV=1``), else
    None. A fingerprint field, present only when True: a fragmented gather's page walks
    cost differently with huge pages (docs/calibration.md, "Huge pages take the fragmented
    cases' process split away"), so a baseline recorded with them is not compared with a
    run without; without them the fingerprint and its hash are what they were. Exactly
    ``1``, as PyTorch reads it (it ignores ``" 1"`` with a warning)."""
    return True if environ.get(THP_ENV) == "1" else None


class AllocatorError(RuntimeError):
    """Out of pages, or a page freed that is not owned: a bug or an over-full pool."""


def fragmentation(pages: Sequence[int]) -> float:
    """Share of logically adjacent page pairs that are not physically adjacent (0..1)."""
    if len(pages) < 2:
        return 0.0
    breaks = sum(1 for a, b in itertools.pairwise(pages) if b != a + 1)
    return breaks / (len(pages) - 1)


class PageAllocator:
    """Free-list page allocator with ownership tracking."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError("num_pages must be positive")
        self.num_pages = num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._owned = bytearray(num_pages)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def free_list(self) -> list[int]:
        return list(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise AllocatorError(f"KV pool exhausted: need {n} pages, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for p in out:
            if self._owned[p]:
                raise AllocatorError(f"page {p} handed out twice")
            self._owned[p] = 1
        return out

    def free(self, pages: Sequence[int]) -> None:
        """Return pages to the head of the free list, keeping their order."""
        for p in pages:
            if not self._owned[p]:
                raise AllocatorError(f"page {p} freed but not owned")
            self._owned[p] = 0
        self._free.extendleft(reversed(pages))

    def reset(self) -> None:
        """Sorted free list, as after ``/flush_cache``. Only valid with nothing allocated."""
        if any(self._owned):
            raise AllocatorError("reset with pages still allocated")
        self._free = deque(range(self.num_pages))

    def fragment(self, level: float, seed: int) -> None:
        """Permute the free list so that a share ``level`` of adjacent pairs is broken.

        The sorted free list is cut at ``round(level * (n - 1))`` randomly chosen links
        and the resulting runs are shuffled, then repaired so that no two runs that
        follow each other in the new order happen to be physically adjacent. A request
        that takes any prefix of the list therefore sees a fragmentation close to
        ``level``: 0 is contiguous, 1 is a full permutation with no adjacent pair.
        """
        if not 0.0 <= level <= 1.0:
            raise ValueError(f"fragmentation level {level!r} is outside [0, 1]")
        self.reset()
        n = self.num_pages
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, n), round(level * (n - 1))))
        runs: list[list[int]] = []
        start = 0
        for c in [*cuts, n]:
            runs.append(list(range(start, c)))
            start = c
        rng.shuffle(runs)
        if len(runs) > 2:
            for _ in range(8):
                bad = [i for i in range(len(runs) - 1) if runs[i][-1] + 1 == runs[i + 1][0]]
                if not bad:
                    break
                for i in bad:
                    j = rng.randrange(len(runs))
                    runs[i + 1], runs[j] = runs[j], runs[i + 1]
        self._free = deque(p for run in runs for p in run)

    def check(self, tables: Sequence[Sequence[int]]) -> None:
        """Invariants: every page is either free or in exactly one table, never both."""
        seen = bytearray(self.num_pages)
        for p in self._free:
            if seen[p]:
                raise AllocatorError(f"page {p} is twice in the free list")
            seen[p] = 1
        for table in tables:
            for p in table:
                if seen[p]:
                    raise AllocatorError(f"page {p} is owned twice (or owned and free)")
                seen[p] = 1
        if not all(seen):
            missing = [i for i in range(self.num_pages) if not seen[i]][:5]
            raise AllocatorError(f"pages leaked (neither free nor owned), e.g. {missing}")


class KVPool:
    """K and V page pools for every target layer and every drafter layer.

    Zero-initialised: the graph path reads whole padded page buckets and gives the
    masked slots a softmax weight of exactly 0, and ``0 x NaN`` (uninitialised memory
    can hold NaN bit patterns) would still be NaN.
    """

    def __init__(self, cfg: ModelConfig, *, device: Any, dtype: Any, tokens: int) -> None:
        import torch

        shape = (cfg.num_kv_heads, tokens, cfg.head_dim)
        n = cfg.num_layers + cfg.draft_num_layers
        self.page_size = cfg.page_size
        self.k: list[torch.Tensor] = [
            torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)
        ]
        self.v: list[torch.Tensor] = [
            torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)
        ]
        self.num_target_layers = cfg.num_layers

    def draft_layer(self, i: int) -> int:
        """Pool index of drafter layer ``i`` (drafter pools follow the target's)."""
        return self.num_target_layers + i

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` of shape ``(tokens, kv_heads, head_dim)`` at ``slots``."""
        self.k[layer].index_copy_(1, slots, k.transpose(0, 1))
        self.v[layer].index_copy_(1, slots, v.transpose(0, 1))


def pool_bytes_per_token(cfg: ModelConfig, itemsize: int) -> int:
    """K and V bytes per token over every target and drafter layer."""
    return 2 * (cfg.num_layers + cfg.draft_num_layers) * cfg.num_kv_heads * cfg.head_dim * itemsize


def available_memory(device: Any) -> int | None:
    """Free bytes on ``device`` (CUDA: free device memory; CPU: MemAvailable)."""
    if getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def pool_tokens(cfg: ModelConfig, device: Any, itemsize: int, share: float = 0.6) -> int:
    """KV pool size: the config's, or less if only ``share`` of free memory would hold it."""
    want = cfg.kv_pool_tokens
    free = available_memory(device)
    if free is None:
        return want
    fit = int(free * share) // pool_bytes_per_token(cfg, itemsize)
    fit -= fit % cfg.page_size
    return max(cfg.page_size * 64, min(want, fit))


class DevicePageTable:
    """The live requests' page tables on the device, one row per batch slot.

    Updated incrementally (only newly allocated pages are sent, through the pinned
    staging ring), so a decode step builds no page list on the host: cache locations and
    the graph path's padded page index are read from here on the device. Entries past a
    request's pages are stale but valid page ids; every reader masks them by context
    length.
    """

    def __init__(self, rows: int, width: int, device: Any, stage: HostToDevice) -> None:
        import torch

        self.table = torch.zeros((rows, width), dtype=torch.long, device=device)
        self.width = width
        self._stage = stage
        self._synced = [0] * rows

    def truncate(self, row: int, pages: int) -> None:
        """Row ``row`` keeps only its first ``pages`` entries (pages were released, or a
        new request takes the row: ``pages=0``)."""
        self._synced[row] = min(self._synced[row], pages)

    def sync(self, row: int, pages: Sequence[int]) -> None:
        """Make row ``row`` hold ``pages``: sends the pages appended since the last sync
        (releases must have been reported with :meth:`truncate`)."""
        have = self._synced[row]
        if len(pages) > self.width:
            raise AllocatorError(
                f"a request holds {len(pages)} pages, more than the device page table's "
                f"{self.width}"
            )
        if have < len(pages):
            new = self._stage.put(pages[have:])
            self.table[row, have : len(pages)].copy_(new, non_blocking=True)
        self._synced[row] = len(pages)

    def rows(self, rows: Sequence[int], index: torch.Tensor | None) -> torch.Tensor:
        """The page-table rows of a batch, ``(B, width)``: a view when the rows are
        ``0..B-1``, else gathered with ``index`` (the rows as a device tensor)."""
        if list(rows) == list(range(len(rows))):
            return self.table[: len(rows)]
        assert index is not None
        return self.table.index_select(0, index)
