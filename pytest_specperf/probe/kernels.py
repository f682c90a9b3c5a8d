"""Device activity inside each phase, from a kineto trace: interval unions and top kernels.

Pure code (no torch): it reads a trace as ``torch.profiler`` exports it (Chrome trace
JSON from kineto) and turns it into one :class:`KernelSample` per sampled step. The same
code serves CUDA and CPU traces:

* **CUDA** (``source="cuda"``): activities are kernels, memcpys and memsets (``cat``
  ``kernel``, ``gpu_memcpy``, ``gpu_memset``). Each is linked to the host call that
  launched it (``cuda_runtime`` / ``cuda_driver`` event with the same ``correlation``;
  failing that, the CPU op with the same ``External id``), and that launch's host time
  decides its phase.
* **CPU** (``source="cpu"``): activities are the outermost ``cpu_op`` events of the
  probe's thread; an op's own start is its launch.

A phase's windows are the probe's ``specperf.<phase>`` annotations (``user_annotation``
events, written only on sampled steps); the step's window is ``specperf.step``. An
activity launched on the probe's thread inside the step belongs to the innermost phase
window holding its launch, or to ``unaccounted`` when it was launched outside every phase
(GPU work the phase map does not cover). A phase's *active* time is the union of its
activities' intervals: overlapping kernels (several streams) count once, so the active
time never exceeds the wall time they cover. ``step`` is the union over the whole step.
:func:`phase_totals` gives the same per phase over several steps of one trace, with each
phase's operation count and summed time (the GPU check's kernel-vs-span comparison).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pytest_specperf.probe.phases import PHASES, UNACCOUNTED

#: Annotation names the probe writes on sampled steps (``specperf.verify``, ...).
ANNOTATION_PREFIX = "specperf."
STEP_KEY = "step"
STEP_ANNOTATION = ANNOTATION_PREFIX + STEP_KEY
#: Keys of a sample: every phase, ``unaccounted`` and ``step``.
SAMPLE_KEYS = (*PHASES, UNACCOUNTED, STEP_KEY)
#: Kernels kept per phase and sampled step (the rest are in ``active_ns`` only).
TOP_KERNELS = 10
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
SOURCES = ("cuda", "cpu")


@dataclass(frozen=True)
class KernelTotal:
    """One kernel (or op) name within one phase of one step: calls and summed time."""

    name: str
    calls: int
    total_ns: int


@dataclass(frozen=True)
class PhaseKernels:
    """A phase's active time (union of its activities) and its largest kernels."""

    active_ns: int
    top: tuple[KernelTotal, ...] = ()


@dataclass(frozen=True)
class KernelSample:
    """The device (or CPU-op) activity of one sampled step, per phase.

    ``cost_ns``: host time the sampling itself took outside the step (starting and
    stopping the profiler, reading its trace).
    """

    source: str
    phases: Mapping[str, PhaseKernels] = field(default_factory=dict)
    cost_ns: int = 0

    def active_ns(self, key: str) -> int:
        p = self.phases.get(key)
        return p.active_ns if p is not None else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "cost_ns": self.cost_ns,
            "phases": {
                k: [p.active_ns, [[t.name, t.calls, t.total_ns] for t in p.top]]
                for k, p in self.phases.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelSample:
        source = str(data["source"])
        if source not in SOURCES:
            raise ValueError(f"kernel sample source {source!r}; expected one of {SOURCES}")
        phases = {}
        for key, (active, top) in data["phases"].items():
            tops = tuple(KernelTotal(str(n), int(c), int(t)) for n, c, t in top)
            phases[str(key)] = PhaseKernels(int(active), tops)
        return cls(source, MappingProxyType(phases), int(data.get("cost_ns", 0)))


@dataclass(frozen=True)
class PhaseTotals:
    """A phase's activities over several steps: count, summed time, active (union) time and
    largest kernels."""

    ops: int
    kernel_ns: int
    active_ns: int
    top: tuple[KernelTotal, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "kernel_ns": self.kernel_ns,
            "active_ns": self.active_ns,
            "top": [{"name": t.name, "calls": t.calls, "total_ns": t.total_ns} for t in self.top],
        }


@dataclass(frozen=True)
class Activity:
    """One kernel, copy or op: its interval and the host time of its launch (ns)."""

    name: str
    start_ns: int
    end_ns: int
    launch_ns: int


@dataclass(frozen=True)
class Window:
    """A host-side window of the probe's thread: a phase (or the step) annotation."""

    key: str
    start_ns: int
    end_ns: int


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total = 0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def owner(windows: Sequence[Window], t: int) -> str | None:
    """The key of the innermost window holding ``t`` (the latest started), or None."""
    best: Window | None = None
    for w in windows:
        if w.start_ns <= t <= w.end_ns and (best is None or w.start_ns >= best.start_ns):
            best = w
    return best.key if best is not None else None


def attribute(
    activities: Iterable[Activity], phases: Sequence[Window], step: Window
) -> dict[str, list[Activity]]:
    """Activities launched inside ``step``, by the phase holding the launch (or
    ``unaccounted`` for a launch outside every phase)."""
    out: dict[str, list[Activity]] = {}
    for a in activities:
        if not step.start_ns <= a.launch_ns <= step.end_ns:
            continue
        key = owner(phases, a.launch_ns) or UNACCOUNTED
        out.setdefault(key, []).append(a)
    return out


def phases_in(phases: Iterable[Window], step: Window) -> list[Window]:
    """The phase windows that start inside ``step``."""
    return [w for w in phases if step.start_ns <= w.start_ns <= step.end_ns]


def top_kernels(activities: Iterable[Activity], n: int = TOP_KERNELS) -> tuple[KernelTotal, ...]:
    """The ``n`` names with the largest summed time: calls and total per name."""
    sums: dict[str, list[int]] = {}
    for a in activities:
        s = sums.setdefault(a.name, [0, 0])
        s[0] += 1
        s[1] += a.end_ns - a.start_ns
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1][1], kv[0]))[:n]
    return tuple(KernelTotal(name, c, t) for name, (c, t) in ranked)


def summarize_step(
    activities: Sequence[Activity], phases: Sequence[Window], step: Window, source: str
) -> KernelSample:
    """Per phase (and ``unaccounted``, ``step``): active time and top kernels."""
    by_key = attribute(activities, phases, step)
    out = {
        key: PhaseKernels(union_ns((a.start_ns, a.end_ns) for a in acts), top_kernels(acts))
        for key, acts in by_key.items()
    }
    every = [a for acts in by_key.values() for a in acts]
    out[STEP_KEY] = PhaseKernels(union_ns((a.start_ns, a.end_ns) for a in every))
    return KernelSample(source, MappingProxyType(out))


def phase_totals(
    activities: Sequence[Activity],
    phases: Sequence[Window],
    steps: Iterable[Window],
    n: int = TOP_KERNELS,
) -> dict[str, PhaseTotals]:
    """Over ``steps``: per phase (and ``unaccounted``; ``step`` for all of them) the
    activities launched in it, their summed and active time and the ``n`` largest names."""
    by_key: dict[str, list[Activity]] = {}
    for step in steps:
        for key, acts in attribute(activities, phases_in(phases, step), step).items():
            by_key.setdefault(key, []).extend(acts)
    every = [a for acts in by_key.values() for a in acts]
    out = {key: _totals(acts, n) for key, acts in by_key.items()}
    out[STEP_KEY] = _totals(every, n)
    return out


def _totals(acts: Sequence[Activity], n: int) -> PhaseTotals:
    return PhaseTotals(
        ops=len(acts),
        kernel_ns=sum(a.end_ns - a.start_ns for a in acts),
        active_ns=union_ns((a.start_ns, a.end_ns) for a in acts),
        top=top_kernels(acts, n),
    )
