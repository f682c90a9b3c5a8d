"""Where the GPU check's CUDA-only calls go: the GPU itself, or named CPU stand-ins.

Every call of the check's in-process steps that only a CUDA device can make goes through a
*side*: :class:`Cuda` on the GPU machine, :class:`CpuStandIns` in the CPU rehearsal
(``bash scripts/gpu-check.sh --rehearse``). A stand-in does the nearest thing the CPU can
do and says so: every result it produces carries ``"stand_in": <its name>``, the step's
JSON lists the stand-ins it used under ``"stand_ins"``, and the rehearsal's output is
headed as a rehearsal. A rehearsal proves that every part runs, in order and in time; its
figures are CPU figures, never GPU results.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

#: The stand-ins of a CPU rehearsal: name -> what stands in for the CUDA-only call.
STAND_INS: dict[str, str] = {
    "cuda-graph-capture": "StandInCapture: a capture runs the forward once and keeps it; a "
    "replay reruns it on the static inputs (the graph path's code, no CUDA graph)",
    "cuda-events": "the probe without CUDA events: host times only, device times None",
    "device-copy": "a host memcpy of 64 MiB timed with perf_counter, not a 4 GiB device copy",
    "sleep-calibration": "not run: the _sleep kernel's cycles per ns are None",
    "sync-debug-mode": "torch.cuda.set_sync_debug_mode not set: the census counts host "
    "read-backs only",
    "memory-reserved": "torch.cuda.memory_reserved read as 0",
    "profiler-cuda-activity": "torch.profiler with CPU activity only: ops, not kernels",
    "synchronize": "torch.cuda.synchronize: nothing to wait for on the CPU",
}
#: Bytes of the stand-in copy (a device copy moves 4 GiB).
STAND_IN_COPY_BYTES = 64 << 20
#: A rehearsal's contexts: the GPU's long contexts shortened, so that the CPU runs every
#: part in CI time (on the CPU a decode step's time is no estimate of the GPU's anyway;
#: the desk estimate adds the GPU's decode time, see ``gpu_check.Desk``).
REHEARSAL_CONTEXTS = {32768: 2048, 46000: 4096, 4096: 1024}
#: A rehearsal decodes this fraction of the tokens, steps and seconds of each part.
REHEARSAL_WORK = 0.25


class StandInCapture:
    """Stand-in for ``CudaCapture`` (``cuda-graph-capture``): capture runs ``fn`` once and
    keeps it; replay reruns it on the static inputs and writes the static outputs in place,
    as a graph replay does, so the engine's graph path (static buffers, padded reads,
    per-bucket captures, replay counters) runs on the CPU."""

    name = "cuda-graph-capture"

    def capture(
        self, fn: Callable[..., Any], inputs: dict[str, Any]
    ) -> tuple[Any, tuple[Any, ...]]:
        out = fn(**inputs)
        out = out if isinstance(out, tuple) else (out,)
        return (fn, inputs, out), out

    def replay(self, graph: Any) -> None:
        fn, inputs, out = graph
        new = fn(**inputs)
        for static, fresh in zip(out, new if isinstance(new, tuple) else (new,), strict=True):
            static.copy_(fresh)


class Cuda:
    """The GPU machine: every call is the real CUDA call, on ``cuda:0``."""

    rehearsal = False
    device = "cuda:0"
    config = "medium"
    use_cuda = True

    def __init__(self) -> None:
        self.stand_ins: dict[str, str] = {}

    def ctx(self, context_len: int) -> int:
        """The context a part decodes at (the GPU's own)."""
        return context_len

    def work(self, n: int) -> int:
        """Tokens, steps or repetitions a part runs (the GPU's own)."""
        return n

    def seconds(self, s: float) -> float:
        """Seconds a timed part runs (the GPU's own)."""
        return s

    def capture(self) -> Any:
        return None  # the engine's own CudaCapture

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def memory_reserved(self) -> int:
        import torch

        return int(torch.cuda.memory_reserved(self.device))

    def sync_debug_mode(self, mode: str | int) -> None:
        import torch

        torch.cuda.set_sync_debug_mode(mode)

    def empty_cache(self) -> None:
        import torch

        torch.cuda.empty_cache()

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    def sleep_calibration(self) -> float | None:
        from pytest_specperf.probe.inject import CudaSleep

        return float(CudaSleep(self.device).calibrate())

    def copy_rate(self, nbytes: int, seconds: float, window: Any = None) -> dict[str, Any]:
        """Device-to-device copies of ``nbytes`` back to back for about ``seconds`` (one
        enqueue, one wait), timed with CUDA events; ``window``: a context to run them in."""
        import torch

        src = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        n = max(1, math.ceil(seconds / max(start.elapsed_time(end) / 1e3, 1e-6)))
        with window if window is not None else nullcontext():
            start.record()
            for _ in range(n):
                dst.copy_(src)
            end.record()
            end.synchronize()
        s = start.elapsed_time(end) / 1e3
        del src, dst
        return _rate(nbytes, n, s)


class CpuStandIns(Cuda):
    """The CPU rehearsal: the ``tiny`` engine on the CPU, each CUDA-only call replaced by
    the stand-in named in :data:`STAND_INS` (and recorded in ``stand_ins`` when used), at
    shorter contexts and with less work (:data:`REHEARSAL_CONTEXTS`,
    :data:`REHEARSAL_WORK`): every part's code runs, in order, in CI time."""

    rehearsal = True
    device = "cpu"
    config = "tiny"
    use_cuda = False

    def ctx(self, context_len: int) -> int:
        return REHEARSAL_CONTEXTS.get(context_len, context_len)

    def work(self, n: int) -> int:
        return max(2, round(n * REHEARSAL_WORK))

    def seconds(self, s: float) -> float:
        return s * REHEARSAL_WORK

    def __init__(self) -> None:
        super().__init__()
        self._used("cuda-events")  # every probe of a rehearsal has host times only

    def _used(self, name: str) -> dict[str, str]:
        self.stand_ins[name] = STAND_INS[name]
        return {"stand_in": name}

    def capture(self) -> Any:
        self._used(StandInCapture.name)
        return StandInCapture()

    def synchronize(self) -> None:
        self._used("synchronize")

    def memory_reserved(self) -> int:
        self._used("memory-reserved")
        return 0

    def sync_debug_mode(self, mode: str | int) -> None:
        self._used("sync-debug-mode")

    def empty_cache(self) -> None:
        return None

    def profiler_activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        self._used("profiler-cuda-activity")
        return [ProfilerActivity.CPU]

    def sleep_calibration(self) -> float | None:
        self._used("sleep-calibration")
        return None

    def copy_rate(self, nbytes: int, seconds: float, window: Any = None) -> dict[str, Any]:
        import torch

        nbytes = min(nbytes, STAND_IN_COPY_BYTES)
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        n, t0 = 0, time.perf_counter()
        with window if window is not None else nullcontext():
            while n == 0 or time.perf_counter() - t0 < min(seconds, 0.2):
                dst.copy_(src)
                n += 1
        return {**_rate(nbytes, n, time.perf_counter() - t0), **self._used("device-copy")}


def _rate(nbytes: int, n: int, s: float) -> dict[str, Any]:
    return {
        "copy_bytes": nbytes,
        "copies": n,
        "seconds": s,
        "copy_gb_per_s": n * nbytes / s / 1e9,
        "moved_gb_per_s": 2 * n * nbytes / s / 1e9,  # read + write
    }


def side_for(rehearse: bool) -> Cuda:
    return CpuStandIns() if rehearse else Cuda()
