"""Timestamped telemetry readings, and the windows that restrict a summary to them.

A measurement window of the sampler usually holds more than the work being judged
(prefill, HTTP round trips, client polling). Marked windows (wall-clock nanoseconds, the
clock of ``StepRecord.wall_ns``) say which stretches count: a point reading (a clock, the
power, NVML's utilization) counts when taken inside one; an interval reading (a GPM
metric, computed between two samples) counts when at least ``INTERVAL_INSIDE_SHARE`` of
its interval lies inside. Without windows every reading counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

#: ``(start_ns, end_ns)`` on the wall clock (``time.time_ns``).
Span = tuple[int, int]

#: An interval reading counts for the windows when this share of it lies inside them.
INTERVAL_INSIDE_SHARE: Final = 0.9
#: Decode steps closer than this are one window (the host's bookkeeping between steps).
STEP_GAP_NS: Final = 5_000_000


def merge_windows(spans: Iterable[Span], max_gap_ns: int = 0) -> list[Span]:
    """Sorted, disjoint windows covering ``spans``; spans at most ``max_gap_ns`` apart
    are joined (consecutive decode steps make one window)."""
    out: list[Span] = []
    for a, b in sorted((int(a), int(b)) for a, b in spans):
        if b < a:
            raise ValueError(f"window ends before it starts: ({a}, {b})")
        if out and a - out[-1][1] <= max_gap_ns:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def covered_ns(t0: int, t1: int, windows: Sequence[Span]) -> int:
    """Nanoseconds of ``[t0, t1]`` inside ``windows`` (merged)."""
    return sum(max(0, min(t1, b) - max(t0, a)) for a, b in windows)


def _inside(t0: int, t1: int, windows: Sequence[Span]) -> bool:
    if not windows:
        return True
    if t1 <= t0:
        return any(a <= t0 <= b for a, b in windows)
    return covered_ns(t0, t1, windows) >= INTERVAL_INSIDE_SHARE * (t1 - t0)


@dataclass
class Kept:
    """What a :class:`SampleLog` holds inside a set of windows."""

    samples: int = 0
    outside: int = 0
    values: dict[str, list[float]] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    reason_samples: int = 0
    foreign: Counter[int] = field(default_factory=Counter)
    unresolved: Counter[int] = field(default_factory=Counter)
    process_samples: int = 0


@dataclass
class SampleLog:
    """Every reading of one sampler, with its time (or interval) on the wall clock."""

    times: list[int] = field(default_factory=list)
    series: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    reason_log: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    process_log: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def sample(self, t: int) -> None:
        self.times.append(t)

    def value(self, name: str, value: float, t0: int, t1: int | None = None) -> None:
        """A point reading at ``t0``, or an interval reading over ``[t0, t1]``."""
        self.series.setdefault(name, []).append((t0, t0 if t1 is None else t1, float(value)))

    def reasons(self, t: int, names: tuple[str, ...]) -> None:
        self.reason_log.append((t, names))

    def processes(self, t: int, foreign: tuple[int, ...], unresolved: tuple[int, ...]) -> None:
        self.process_log.append((t, foreign, unresolved))

    def kept(self, windows: Sequence[Span]) -> Kept:
        """The readings inside ``windows`` (merged; empty: all of them)."""
        k = Kept()
        k.samples = sum(1 for t in self.times if _inside(t, t, windows))
        k.outside = len(self.times) - k.samples
        for name, points in self.series.items():
            vals = [v for t0, t1, v in points if _inside(t0, t1, windows)]
            if vals:
                k.values[name] = vals
        for t, names in self.reason_log:
            if _inside(t, t, windows):
                k.reason_samples += 1
                k.reasons.update(names)
        for t, foreign, unresolved in self.process_log:
            if _inside(t, t, windows):
                k.process_samples += 1
                k.foreign.update(foreign)
                k.unresolved.update(unresolved)
        return k
