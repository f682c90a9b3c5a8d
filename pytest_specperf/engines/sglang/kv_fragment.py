"""KV-cache layouts for the ``fragmented_kv`` fixture on a real SGLang server.

Flow (one scheduler per tensor-parallel rank, all doing the same):

1. The backend writes a layout request (``kv-layout-request.json``) into the run
   directory and POSTs ``/flush_cache``.
2. In the scheduler, right after a successful ``Scheduler.flush_cache`` (the server is
   idle and ``clear()`` has just reset the allocator's free list to sorted order), the
   hook reads the request and permutes ``token_to_kv_pool_allocator.free_pages`` (slot ids
   for ``TokenToKVPoolAllocator``, page ids for ``PagedTokenToKVPoolAllocator``) with the
   reference engine's algorithm (:func:`fragment_order`), so the next request's KV lands
   on a free list fragmented to the requested level. The request stays in force: every
   later flush re-applies it until the backend writes another one.
   Sliding-window, unified and HiSparse allocators are refused: they keep several pools or
   id spaces in step and a permuted free list would corrupt them.
3. The outcome is written as ``kvlayout-pid<P>-rank<R>.json``; the backend waits for it
   and raises :class:`KVLayoutError` with the scheduler's message on a refusal.
4. When a request finishes, the scheduler reads its row of ``req_to_token`` (the physical
   slots its attention reads) and writes the fragmentation reached as
   ``kvfrag-<rid>-rank<R>.json``; ``SGLangBackend.kv_fragmentation`` reads it.

Fragmentation is the share of logically adjacent pages that are not physically adjacent
(:func:`pytest_specperf.engines.reference.kv.fragmentation`), computed on page ids
(``slot // page_size``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REQUEST_FILE = "kv-layout-request.json"
RESULT_META = "kvlayout"
FRAG_META_PREFIX = "kvfrag-"
LAYOUTS = ("contiguous", "fragmented")

#: Allocators whose free list can be permuted safely (exact class names).
SUPPORTED_ALLOCATORS = ("TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator")


class KVLayoutError(RuntimeError):
    """The server could not (or would not) put its KV cache into the requested layout."""


# -- the permutation (shared with the reference engine) -----------------------------------
def fragment_order(n: int, level: float, seed: int) -> list[int]:
    """A permutation of ``range(n)``: the reference engine's fragmented free list.

    Exactly ``PageAllocator(n).fragment(level, seed)`` of the reference engine (it is
    called, not copied), so both backends lay out KV identically for the same level and
    seed: the sorted list is cut at ``round(level * (n - 1))`` random links, the runs are
    shuffled and repaired so that consecutive runs are not physically adjacent.
    """
    from pytest_specperf.engines.reference.kv import PageAllocator

    if n < 1:
        return []
    alloc = PageAllocator(n)
    alloc.fragment(level, seed)
    return alloc.free_list()


def unsupported_reason(allocator: Any) -> str | None:
    """Why the free list of ``allocator`` must not be permuted, or None if it may."""
    name = type(allocator).__name__
    if name in SUPPORTED_ALLOCATORS:
        return None
    low = name.lower()
    if "swa" in low:
        kind = "a sliding-window (SWA) allocator"
    elif "unified" in low or "multiended" in low:
        kind = "a unified-memory allocator"
    elif "hisparse" in low:
        kind = "a HiSparse allocator"
    else:
        kind = "an allocator this plugin has not validated"
    return (
        f"the server's KV allocator is {name}, {kind}: it keeps several pools or id spaces "
        f"in step, so permuting its free list is unsafe. Only {' and '.join(SUPPORTED_ALLOCATORS)}"
        " can be fragmented; use the 'contiguous' layout with this model/configuration"
    )


def apply_layout(allocator: Any, layout: str, level: float, seed: int) -> dict[str, Any]:
    """Permute ``allocator.free_pages`` in place (just after ``clear()``); return a summary.

    Raises :class:`KVLayoutError` when the allocator is not supported or its free list is
    not in the sorted state ``clear()`` leaves (the server was not idle).
    """
    import torch

    if layout not in LAYOUTS:
        raise KVLayoutError(f"unknown KV layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    if not 0.0 <= level <= 1.0:
        raise KVLayoutError(f"KV fragmentation level {level!r} is outside [0, 1]")
    name = type(allocator).__name__
    summary: dict[str, Any] = {
        "allocator": name,
        "page_size": int(getattr(allocator, "page_size", 1) or 1),
        "layout": layout,
        "level": level if layout == "fragmented" else 0.0,
        "seed": seed,
    }
    if layout == "contiguous" or level == 0.0:
        summary["free_pages"] = _numel(getattr(allocator, "free_pages", None))
        return summary  # clear() already left the free list sorted
    reason = unsupported_reason(allocator)
    if reason is not None:
        raise KVLayoutError(reason)
    free = getattr(allocator, "free_pages", None)
    if not isinstance(free, torch.Tensor) or free.dim() != 1:
        raise KVLayoutError(f"{name}.free_pages is not a 1-D tensor; cannot lay out the KV cache")
    for pending in ("release_pages", "staged_pages"):
        extra = getattr(allocator, pending, None)
        if extra is not None and _numel(extra):
            raise KVLayoutError(
                f"{name}.{pending} is not empty: the allocator was not just cleared "
                "(was the server busy during /flush_cache?)"
            )
    n = int(free.numel())
    if n < 2:
        raise KVLayoutError(f"{name} has {n} free pages; nothing to fragment")
    first = int(free[0])
    expected = torch.arange(first, first + n, dtype=free.dtype, device=free.device)
    if not torch.equal(free, expected):
        raise KVLayoutError(
            f"{name}.free_pages is not the sorted list clear() leaves; refusing to permute it"
        )
    order = torch.tensor(fragment_order(n, level, seed), dtype=torch.int64)
    allocator.free_pages = free[order.to(free.device)]
    summary["free_pages"] = n
    head = [int(x) for x in allocator.free_pages[: min(n, 4096)].tolist()]
    summary["head_fragmentation"] = fragmentation(head)
    return summary


def _numel(x: Any) -> int:
    if x is None:
        return 0
    if isinstance(x, list):
        return sum(_numel(t) for t in x)
    numel = getattr(x, "numel", None)
    return int(numel()) if callable(numel) else len(x)


# -- measuring what a request got ---------------------------------------------------------
def fragmentation(pages: Sequence[int]) -> float:
    """Share of logically adjacent page pairs that are not physically adjacent (0..1)."""
    from pytest_specperf.engines.reference.kv import fragmentation as ref_fragmentation

    return ref_fragmentation(pages)


def pages_of_slots(slots: Any, page_size: int) -> list[int]:
    """Page ids of a request's slot list, consecutive duplicates collapsed."""
    import torch

    t = torch.as_tensor(slots, dtype=torch.int64).reshape(-1).cpu()
    if page_size > 1:
        t = torch.div(t, page_size, rounding_mode="floor")
    if t.numel() == 0:
        return []
    return [int(x) for x in torch.unique_consecutive(t).tolist()]


def measure_request(req_to_token: Any, row: int, length: int, page_size: int) -> dict[str, Any]:
    """Fragmentation of the first ``length`` slots of ``req_to_token[row]``.

    Copies that row to the host (a device sync): call it outside measured steps.
    """
    slots = req_to_token[row, :length]
    pages = pages_of_slots(slots, page_size)
    return {
        "fragmentation": fragmentation(pages),
        "tokens": int(length),
        "pages": len(pages),
        "page_size": int(page_size),
    }


# -- files in the run directory -----------------------------------------------------------
def rid_key(rid: str) -> str:
    """A file-name-safe key for a request id."""
    if re.fullmatch(r"[A-Za-z0-9_.-]{1,96}", rid) and not rid.startswith("."):
        return rid
    return "h" + hashlib.sha256(rid.encode()).hexdigest()[:24]


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
    os.replace(tmp, path)


def write_request(run_dir: Path, layout: str, level: float, seed: int) -> str:
    """Write the layout request the scheduler applies on the next flush; return its id."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown KV layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level <= 1:
        raise ValueError(f"KV fragmentation level must be a number in [0, 1], got {level!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"KV layout seed must be a non-negative integer, got {seed!r}")
    request_id = uuid.uuid4().hex
    _atomic_write_json(
        Path(run_dir) / REQUEST_FILE,
        {"id": request_id, "layout": layout, "level": float(level), "seed": seed},
    )
    return request_id


def read_request(run_dir: Path) -> dict[str, Any] | None:
    """The current layout request, or None. Raises :class:`KVLayoutError` if malformed."""
    path = Path(run_dir) / REQUEST_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise KVLayoutError(f"cannot read {path}: {e}") from None
    try:
        data = json.loads(raw)
    except ValueError:
        raise KVLayoutError(f"{path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise KVLayoutError(f"{path} must hold a JSON object")
    layout, level, seed = data.get("layout"), data.get("level"), data.get("seed")
    if layout not in LAYOUTS:
        raise KVLayoutError(f"{path}: unknown layout {layout!r}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level <= 1:
        raise KVLayoutError(f"{path}: level must be a number in [0, 1], got {level!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise KVLayoutError(f"{path}: seed must be a non-negative integer, got {seed!r}")
    return {"id": str(data.get("id", "")), "layout": layout, "level": float(level), "seed": seed}


def read_layout_results(run_dir: Path, request_id: str) -> list[dict[str, Any]]:
    """Outcomes reported by the schedulers (one per rank) for ``request_id``."""
    out = []
    for path in sorted(Path(run_dir).glob(f"{RESULT_META}-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("request_id") == request_id:
            out.append(data)
    return out


def wait_layout_results(
    run_dir: Path, request_id: str, *, timeout_s: float = 10.0, poll_s: float = 0.05
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        results = read_layout_results(run_dir, request_id)
        if results or time.monotonic() >= deadline:
            return results
        time.sleep(poll_s)


def read_fragmentation(run_dir: Path, rid: str) -> dict[str, Any] | None:
    """The fragmentation measured for request ``rid`` (lowest rank that reported it)."""
    key = rid_key(rid)
    for path in sorted(Path(run_dir).glob(f"{FRAG_META_PREFIX}{key}-rank*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("rid") == rid:
            return data
    return None
