"""Device activity per phase from a torch.profiler (kineto) trace.

A trace exported with ``torch.profiler.profile(...).export_chrome_trace(path)`` holds,
per launched kernel (or memcpy/memset), the device interval and a ``correlation`` id
shared with the host runtime call that launched it (``cudaLaunchKernel``,
``cudaGraphLaunch``, ...). The host call happens inside the host ranges the probe opens
with ``torch.profiler.record_function(PREFIX + phase)``: so each device operation is
attributed to the innermost phase range around its launch, and each phase gets its
kernel time (sum), its active time (union of intervals) and its top kernels. A CUDA
graph's kernels carry the correlation of the graph launch, so they land in the phase
that replayed the graph.

Pure: reads the trace's dictionary, imports nothing heavy.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

#: Prefix of the host ranges that name phases (and ``PREFIX + "step"`` for a step).
PREFIX: Final = "specperf:"
STEP: Final = "step"
#: Trace categories (lowercased) of device work and of the host calls that launch it.
DEVICE_CATEGORIES: Final = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES: Final = frozenset({"cuda_runtime", "cuda_driver"})
ANNOTATION_CATEGORY: Final = "user_annotation"


@dataclass(frozen=True)
class DeviceOp:
    """One kernel (or memcpy/memset) and the phase and step whose launch it came from."""

    name: str
    start_us: float
    end_us: float
    phase: str | None
    step: int | None


@dataclass
class PhaseActivity:
    """A phase's device work: operations, summed time, active (union) time, top kernels."""

    ops: int = 0
    kernel_ms: float = 0.0
    active_ms: float = 0.0
    top: list[tuple[str, int, float]] = field(default_factory=list)  # name, calls, ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "kernel_ms": round(self.kernel_ms, 4),
            "active_ms": round(self.active_ms, 4),
            "top": [{"name": n, "calls": c, "ms": round(ms, 4)} for n, c, ms in self.top],
        }


def _events(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    events = trace.get("traceEvents", [])
    return [e for e in events if isinstance(e, Mapping) and e.get("ph") == "X"]


def _cat(e: Mapping[str, Any]) -> str:
    return str(e.get("cat", "")).lower()


def _correlation(e: Mapping[str, Any]) -> int | None:
    args = e.get("args")
    value = args.get("correlation") if isinstance(args, Mapping) else None
    return value if isinstance(value, int) else None


class _Ranges:
    """Annotation ranges of one host thread, searchable by time."""

    def __init__(self, ranges: Iterable[tuple[float, float, str]]) -> None:
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]

    def innermost(self, t: float, *, steps: bool) -> str | None:
        best: tuple[float, str] | None = None
        for start, end, name in self.ranges[: bisect.bisect_right(self.starts, t)]:
            is_step = name == STEP
            if start <= t <= end and is_step == steps and (best is None or end - start < best[0]):
                best = (end - start, name)
        return best[1] if best else None


def _annotations(events: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, Any], _Ranges]:
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        name = str(e.get("name", ""))
        if _cat(e) == ANNOTATION_CATEGORY and name.startswith(PREFIX):
            ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
            by_thread[(e.get("pid"), e.get("tid"))].append((ts, ts + dur, name[len(PREFIX) :]))
    return {k: _Ranges(v) for k, v in by_thread.items()}


def _step_index(annotations: Mapping[tuple[Any, Any], _Ranges]) -> dict[float, int]:
    starts = sorted(r[0] for rs in annotations.values() for r in rs.ranges if r[2] == STEP)
    return {t: i for i, t in enumerate(starts)}


def device_ops(trace: Mapping[str, Any]) -> list[DeviceOp]:
    """Every device operation of the trace, attributed to the phase and step (in order of
    the ``PREFIX + "step"`` ranges) whose host range enclosed its launch."""
    events = _events(trace)
    annotations = _annotations(events)
    steps = _step_index(annotations)
    launches: dict[int, tuple[tuple[Any, Any], float]] = {}
    for e in events:
        corr = _correlation(e)
        if corr is not None and _cat(e) in LAUNCH_CATEGORIES:
            launches[corr] = ((e.get("pid"), e.get("tid")), float(e.get("ts", 0.0)))
    out = []
    for e in events:
        if _cat(e) not in DEVICE_CATEGORIES:
            continue
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        phase = step = None
        launch = launches.get(_correlation(e) or -1)
        if launch is not None and launch[0] in annotations:
            ranges = annotations[launch[0]]
            phase = ranges.innermost(launch[1], steps=False)
            step_start = _enclosing_step(ranges, launch[1])
            step = steps.get(step_start) if step_start is not None else None
        out.append(DeviceOp(str(e.get("name", "")), ts, ts + dur, phase, step))
    return out


def _enclosing_step(ranges: _Ranges, t: float) -> float | None:
    for start, end, name in ranges.ranges:
        if name == STEP and start <= t <= end:
            return start
    return None


def union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start_us, end_us)`` intervals, in ms."""
    total, cur_start, cur_end = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_end is None or a > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total / 1e3


def phase_activity(ops: Iterable[DeviceOp], top: int = 5) -> dict[str, PhaseActivity]:
    """Per phase (``"(none)"`` for work launched outside every phase): operations, summed
    kernel time, active time and the ``top`` kernels by total time."""
    grouped: dict[str, list[DeviceOp]] = defaultdict(list)
    for op in ops:
        grouped[op.phase or "(none)"].append(op)
    out = {}
    for phase, items in grouped.items():
        by_name: dict[str, list[float]] = defaultdict(list)
        for op in items:
            by_name[op.name].append((op.end_us - op.start_us) / 1e3)
        ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
        out[phase] = PhaseActivity(
            ops=len(items),
            kernel_ms=sum(sum(v) for v in by_name.values()),
            active_ms=union_ms((op.start_us, op.end_us) for op in items),
            top=[(name, len(v), sum(v)) for name, v in ranked],
        )
    return out
