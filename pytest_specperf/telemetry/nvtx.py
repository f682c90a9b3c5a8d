"""NVTX ranges per phase for Nsight Systems (``--specperf-profile nvtx``).

:func:`nvtx_range` is a context manager that pushes/pops an NVTX range through
``torch.cuda.nvtx`` when torch is already imported in this process and CUDA is available,
and does nothing otherwise. It never imports torch itself (a process that has not imported
torch has no CUDA work to annotate). For hot paths, build one :class:`NvtxRanges` up front:
it decides once, and when disabled hands out a shared no-op context manager, so the cost is
one attribute lookup and an empty ``with``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any


def _cuda_nvtx() -> ModuleType | None:
    """``torch.cuda.nvtx`` if torch is loaded and CUDA is available, else None."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        nvtx: ModuleType = torch.cuda.nvtx
    except Exception:
        return None
    return nvtx


@contextlib.contextmanager
def _pushed(nvtx: ModuleType, name: str) -> Iterator[None]:
    nvtx.range_push(name)
    try:
        yield
    finally:
        nvtx.range_pop()


def nvtx_range(name: str, *, enabled: bool = True) -> AbstractContextManager[None]:
    """An NVTX range named ``name`` around the ``with`` body; a no-op when ``enabled`` is
    False, torch is not loaded or CUDA is not available."""
    if not enabled:
        return contextlib.nullcontext()
    nvtx = _cuda_nvtx()
    if nvtx is None:
        return contextlib.nullcontext()
    return _pushed(nvtx, name)


class NvtxRanges:
    """Per-phase NVTX ranges with the on/off decision taken once, at construction.

    ``NvtxRanges(enabled)`` is active only when ``enabled`` and CUDA is available through an
    already imported torch; ``ranges.range("verify")`` then returns a context manager.
    """

    __slots__ = ("_noop", "_nvtx")

    def __init__(self, enabled: bool = True) -> None:
        self._nvtx = _cuda_nvtx() if enabled else None
        self._noop: AbstractContextManager[None] = contextlib.nullcontext()

    @property
    def active(self) -> bool:
        return self._nvtx is not None

    def range(self, name: str) -> AbstractContextManager[None]:
        """Context manager for one range (a shared no-op when inactive)."""
        if self._nvtx is None:
            return self._noop
        return _pushed(self._nvtx, name)
