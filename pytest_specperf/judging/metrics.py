"""The metric registry: one frozen spec per metric, and the names of its derived forms.

Every other module names metrics through this one: verdicts, ``gate=`` validation,
reports and JSON. A metric is one of:

* a **time** (the step): judged as a relative change, against the request's KV read time
  when the backend reports it (``step/ref``), with the step tolerance;
* a **phase** (``verify``, ...): judged as its time relative to the rest of its own step
  (``verify/rest``), on device time where there is one (``device.verify/rest``);
* a **share** of the step in percentage points (``unaccounted``: its baseline is often
  near zero, so a relative change would mean nothing);
* a **utilization** in percentage points (device-busy share, active share, NVML/GPM SM,
  DRAM, tensor);
* a **rate** (tokens/s) or a **count** (accepted tokens per step), judged on their mean.

A metric read straight from one step record carries its per-step sample (``sample``):
``judging.samples`` makes a column of every such entry, so a new probe field is its
measurement (``probe/``) and its entry here. A column that only explains the others is
not gateable (``gateable=False``) and may stay out of the baselines (``stored=False``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED
from pytest_specperf.probe.record import StepRecord

Center = Literal["median", "mean"]
ToleranceKind = Literal["phase", "step"]
#: A metric's value in one step, read from its record; None where the step did not
#: measure it (a NaN in the column, left out of the summary)
Sample = Callable[[StepRecord], float | None]


class MetricKind(str, enum.Enum):
    TIME = "time"
    PHASE = "phase"
    SHARE = "share"
    UTILIZATION = "utilization"
    RATE = "rate"
    COUNT = "count"


@dataclass(frozen=True)
class MetricSpec:
    """What a metric is: its unit, the center judged, its direction, how it is judged."""

    name: str
    unit: str
    kind: MetricKind
    higher_is_better: bool = False
    center: Center = "median"
    #: which of the run's two tolerances applies (``--specperf-tolerance PHASE,step=STEP``:
    #: its first part or its ``step=`` part)
    tolerance: ToleranceKind = "phase"
    #: for utilizations: factor from the stored value to percent (a share 0.42 -> 42%)
    to_percent: float = 1.0
    description: str = ""
    #: its per-step sample, for a metric read straight from one step record: a run has
    #: the column when some record measured it (``judging.samples``)
    sample: Sample | None = field(default=None, compare=False)
    #: whether a test may gate on it (``gate=[...]``)
    gateable: bool = True
    #: whether a baseline stores it (an update records it, so adding a stored metric
    #: starts every case's stored runs again: "the set of recorded metrics changed")
    stored: bool = True

    @property
    def in_points(self) -> bool:
        """Judged as a change in percentage points, not as a relative change."""
        return self.kind in (MetricKind.SHARE, MetricKind.UTILIZATION)


STEP: Final = "step"
ACCEPT_LEN: Final = "accept_len"
TOKENS_PER_S: Final = "tokens_per_s"
DEVICE_BUSY: Final = "device_busy"
UTIL_SM: Final = "util.sm"
UTIL_DRAM: Final = "util.dram"
UTIL_TENSOR: Final = "util.tensor"
UTIL_GPU: Final = "util.gpu"
#: the step relative to the request's KV read time (see ``judged_form``)
STEP_PER_REF: Final = "step/ref"
#: accepted tokens per KV read time: the mean accept length over ``step/ref``, the
#: drift-free form of tokens/s (derived from both where they are judged)
TOKENS_PER_REF: Final = "tokens/ref"
#: the step's device time (first event to last event on the stream)
DEVICE_STEP: Final = "device.step"
#: share of the step something worked: on a GPU the device (union of kernels and copies,
#: sampled steps), on a CPU the probe's thread (its CPU time)
ACTIVE_SHARE: Final = "active_share"
#: share of a step's off-CPU time (wall minus the thread's CPU time) the probe's thread was
#: runnable but had no CPU (a busy machine); on the steps that read it
RUNQ_SHARE: Final = "runq.share"
#: times the probe's thread was put (back) on a CPU during a step: each one ends a wait
#: (a block on a lock, a device sync, an intra-op pool, or a preemption); on the steps
#: that read the run-queue time
RUNQ_SLICES: Final = "runq.slices"

_REST_SUFFIX: Final = "/rest"
_DEVICE_PREFIX: Final = "device."
_CPU_PREFIX: Final = "cpu."
_ACTIVE_PREFIX: Final = "active."
#: a step's part outside every phase and the whole step, in the cpu./active. forms
STEP_PARTS: Final[tuple[str, ...]] = (*ALL_PHASES, STEP)

#: A phase is gated by default, counted in a case's disturbance, and named as noisy in a
#: baseline when it takes at least this share of the baseline's step.
MIN_PHASE_SHARE: Final = 0.05


def _runq_share(r: StepRecord) -> float | None:
    """The share of the step's off-CPU time (wall minus the thread's CPU time) the thread
    waited for a CPU; None on a step that did not read both."""
    if r.cpu_ns is None or r.step_runq_ns is None:
        return None
    off = r.step_ns - (r.step_cpu_ns or 0)
    return min(r.step_runq_ns / off, 1.0) if off > 0 else None


def _runq_slices(r: StepRecord) -> float | None:
    return None if r.step_slices is None else float(r.step_slices)


def _phase(name: str) -> MetricSpec:
    return MetricSpec(name, "ms", MetricKind.PHASE, description=f"{name} phase time")


_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(STEP, "ms", MetricKind.TIME, tolerance="step", description="decode step time"),
    MetricSpec(
        ACCEPT_LEN,
        "tok/step",
        MetricKind.COUNT,
        higher_is_better=True,
        center="mean",
        description="accepted tokens per step and request",
    ),
    MetricSpec(
        TOKENS_PER_S,
        "tok/s",
        MetricKind.RATE,
        higher_is_better=True,
        center="mean",
        tolerance="step",
        description="accepted tokens per second of step time",
    ),
    *(_phase(p) for p in PHASES),
    MetricSpec(
        UNACCOUNTED, "ms", MetricKind.SHARE, description="step time outside every named phase"
    ),
    MetricSpec(
        DEVICE_BUSY,
        "share",
        MetricKind.UTILIZATION,
        higher_is_better=True,
        to_percent=100.0,
        description="device phase time over wall step time",
    ),
    MetricSpec(
        ACTIVE_SHARE,
        "share",
        MetricKind.UTILIZATION,
        higher_is_better=True,
        to_percent=100.0,
        description="share of the step the device (GPU: kernels and copies, sampled steps) "
        "or the probe's thread (CPU: its CPU time) was active",
    ),
    MetricSpec(UTIL_SM, "%", MetricKind.UTILIZATION, True, description="GPM SM utilization"),
    MetricSpec(UTIL_DRAM, "%", MetricKind.UTILIZATION, True, description="GPM DRAM bandwidth"),
    MetricSpec(UTIL_TENSOR, "%", MetricKind.UTILIZATION, True, description="GPM tensor pipes"),
    MetricSpec(UTIL_GPU, "%", MetricKind.UTILIZATION, True, description="NVML GPU utilization"),
    MetricSpec(
        RUNQ_SHARE,
        "share",
        MetricKind.SHARE,
        description="share of the step's off-CPU time the probe's thread waited for a CPU",
        sample=_runq_share,
        gateable=False,
    ),
    MetricSpec(
        RUNQ_SLICES,
        "1/step",
        MetricKind.COUNT,
        center="mean",
        description="times the probe's thread got a CPU during the step (Linux schedstat)",
        sample=_runq_slices,
        gateable=False,
        stored=False,
    ),
)

#: Every metric, by name.
REGISTRY: Final[dict[str, MetricSpec]] = {s.name: s for s in _SPECS}
#: Every metric a case can gate (``@pytest.mark.specperf(gate=[...])``).
GATEABLE: Final[tuple[str, ...]] = tuple(s.name for s in _SPECS if s.gateable)
#: The metrics read straight from one step record, each a column of the run's samples.
RECORD_COLUMNS: Final[tuple[tuple[str, Sample], ...]] = tuple(
    (s.name, s.sample) for s in _SPECS if s.sample is not None
)
#: Utilizations read from NVML/GPM telemetry (one median per run, no blocks).
TELEMETRY_UTILIZATIONS: Final[tuple[str, ...]] = (UTIL_SM, UTIL_DRAM, UTIL_TENSOR, UTIL_GPU)
#: Utilizations gated by default when the baseline and the run both have them.
DEFAULT_POINT_GATES: Final[tuple[str, ...]] = (DEVICE_BUSY, UTIL_SM, UTIL_DRAM)
#: Metrics that add up the phases: when the phases show a disturbed run, so do these.
COMPOSITE_METRICS: Final = frozenset({STEP, TOKENS_PER_S})
#: Metrics a disturbed case cannot judge: the phases (each judged against the rest of its
#: step, so a disturbance of one moves the others' ratios too) and the composites.
DISTURBABLE_METRICS: Final = COMPOSITE_METRICS | frozenset(PHASES)
#: What a phase table shows, in order.
TABLE_ROWS: Final[tuple[str, ...]] = (*ALL_PHASES, STEP)


def spec(name: str) -> MetricSpec:
    """The spec of ``name`` or of the metric it is a derived form of (``verify/rest``,
    ``device.verify``, ``step/ref``); ``KeyError`` for an unknown name."""
    return REGISTRY[base_metric(name)]


def base_metric(name: str) -> str:
    """``device.verify/rest`` -> ``verify``; ``step/ref``, ``device.step``, ``cpu.step`` and
    ``active.step`` -> ``step``; ``tokens/ref`` -> ``tokens_per_s``."""
    if name == STEP_PER_REF:
        return STEP
    if name == TOKENS_PER_REF:
        return TOKENS_PER_S
    for prefix in (_DEVICE_PREFIX, _CPU_PREFIX, _ACTIVE_PREFIX):
        name = name.removeprefix(prefix)
    return name.removesuffix(_REST_SUFFIX)


def center_of(name: str) -> Center:
    """The center a metric or derived form is summarized and judged on."""
    try:
        return spec(name).center
    except KeyError:
        return "median"


def rest_form(name: str) -> str:
    """Name of ``name``'s time relative to the rest of its step: ``verify/rest``."""
    return f"{name}{_REST_SUFFIX}"


def is_rest_form(name: str) -> bool:
    """Whether ``name`` is a phase's time relative to the rest of its step."""
    return name.endswith(_REST_SUFFIX)


def device_form(name: str) -> str:
    """Name of ``name``'s device time: ``device.verify``."""
    return f"{_DEVICE_PREFIX}{name}"


#: The figures every report shows of a case as one center over its server processes (or
#: the baseline's runs): the phase table's rows, their device times on a GPU (what a
#: phase verdict's raw milliseconds are there), the accepted length and tokens/s.
CENTER_ROWS: Final[tuple[str, ...]] = (
    *TABLE_ROWS,
    *map(device_form, TABLE_ROWS),
    ACCEPT_LEN,
    TOKENS_PER_S,
)


def cpu_form(name: str) -> str:
    """Name of the CPU time of the probe's thread in ``name``: ``cpu.verify``."""
    return f"{_CPU_PREFIX}{name}"


def active_form(name: str) -> str:
    """Name of the active time inside ``name``: ``active.verify`` (GPU: device active time
    from kernel samples; CPU: the thread's CPU time)."""
    return f"{_ACTIVE_PREFIX}{name}"


def is_stored(name: str) -> bool:
    """Whether a baseline stores ``name``: not the ``active.`` forms (sampled steps only on
    a GPU, the ``cpu.`` forms again on a CPU; their share, ``active_share``, is stored),
    nor a metric whose entry says ``stored=False``."""
    entry = REGISTRY.get(name)
    return not name.startswith(_ACTIVE_PREFIX) and (entry is None or entry.stored)


def is_phase(name: str) -> bool:
    return name in PHASES


def unknown_gates(names: list[str] | tuple[str, ...]) -> list[str]:
    """The names that are not gateable metrics."""
    return [n for n in names if n not in GATEABLE]
