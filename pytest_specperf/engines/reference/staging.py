"""Host <-> device transfers of the decode step without hidden synchronization.

``torch.tensor(list, device="cuda")`` copies from pageable host memory, which makes the
host wait for the stream: a sync point hidden in a line that looks free. Every integer
vector the reference engine sends to the device goes through :class:`HostToDevice`
instead (pinned staging buffers, ``non_blocking`` copies), and everything it reads back
goes through :class:`DeviceToHost`, whose ``fetch`` is the step's one documented sync
point: the host must know the accepted tokens before it can schedule the next step.
SGLang's step has the same point (its results are copied with ``non_blocking=True``
behind a ``copy_done`` event that the scheduler synchronizes on before it processes the
batch's output).

On the CPU both are plain conversions: nothing is staged and nothing waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: Pinned buffers in the ring: a buffer is rewritten only this many copies later.
RING = 8
#: Initial capacity of each pinned buffer, in int64 entries (grown on demand).
CAPACITY = 1 << 14


def _is_cuda(device: Any) -> bool:
    return getattr(device, "type", str(device)).startswith("cuda")


class HostToDevice:
    """Copies small int64 vectors to ``device`` through a ring of pinned buffers.

    A vector is written into the next pinned buffer and copied with
    ``non_blocking=True``; the event recorded behind that copy is waited for only when
    the buffer comes round again ``RING`` copies later (by then long complete), so the
    host never waits for the stream here.
    """

    def __init__(self, device: Any, *, capacity: int = CAPACITY, ring: int = RING) -> None:
        import torch

        self.device = torch.device(device)
        self._cuda = _is_cuda(self.device)
        self._capacity = capacity
        self._buffers: list[torch.Tensor | None] = [None] * ring
        self._events: list[Any] = [None] * ring
        self._next = 0
        self.copies = 0

    def put(self, values: Sequence[int]) -> torch.Tensor:
        """``values`` as an int64 tensor on the device (enqueued, not waited for)."""
        import torch

        host = torch.tensor(values, dtype=torch.long)
        if not self._cuda:
            return host
        return self.put_tensor(host)

    def put_tensor(self, host: torch.Tensor) -> torch.Tensor:
        """A CPU int64 tensor, copied to the device through the pinned ring."""
        import torch

        i = self._next
        self._next = (i + 1) % len(self._buffers)
        n = host.numel()
        ev = self._events[i]
        if ev is not None and not ev.query():  # complete RING copies ago, in practice
            ev.synchronize()
        buf = self._buffers[i]
        if buf is None or buf.numel() < n:
            size = max(self._capacity, 1 << max(n - 1, 1).bit_length())
            buf = torch.empty(size, dtype=torch.long, pin_memory=True)
            self._buffers[i] = buf
        staged = buf[:n]
        staged.copy_(host.reshape(-1))
        out = torch.empty(host.shape, dtype=torch.long, device=self.device)
        out.view(-1).copy_(staged, non_blocking=True)
        ev = ev or torch.cuda.Event()  # type: ignore[no-untyped-call]
        ev.record(torch.cuda.current_stream(self.device))
        self._events[i] = ev
        self.copies += 1
        return out


class DeviceToHost:
    """Reads small device tensors back: the step's one documented sync point."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self._cuda = _is_cuda(self.device)
        self._buffer: torch.Tensor | None = None
        self._event: Any = None
        self.fetches = 0

    def fetch(self, t: torch.Tensor) -> Any:
        """``t.tolist()``, waiting for the stream up to ``t`` (and no further) on a GPU.

        The copy goes into pinned memory with ``non_blocking=True`` behind an event, and
        the host waits on that event: only the work queued before the copy must finish.
        """
        import torch

        self.fetches += 1
        if not self._cuda:
            return t.tolist()
        n = t.numel()
        if self._buffer is None or self._buffer.numel() < n or self._buffer.dtype != t.dtype:
            self._buffer = torch.empty(max(n, 1024), dtype=t.dtype, pin_memory=True)
            self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        host = self._buffer[:n]
        host.copy_(t.reshape(-1), non_blocking=True)
        self._event.record(torch.cuda.current_stream(self.device))
        self._event.synchronize()
        return host.view(t.shape).tolist()
