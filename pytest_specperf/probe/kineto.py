"""Read a kineto Chrome trace (``torch.profiler`` export) into activities and windows.

Pure code: the input is the parsed JSON of a trace file. What is read, per complete
event (``"ph": "X"``; ``ts`` and ``dur`` in microseconds):

* ``user_annotation`` named ``specperf.<phase>`` / ``specperf.step``: the probe's windows;
  their thread is the probe's thread;
* ``kernel``, ``gpu_memcpy``, ``gpu_memset``: device activities, linked to their launch by
  ``args.correlation`` (the ``cuda_runtime`` / ``cuda_driver`` call of that correlation) or,
  without one, by ``args["External id"]`` (the CPU op that issued them);
* ``cpu_op``: host ops; the outermost ones of the probe's thread are the CPU activities.

Launches from other threads than the probe's are not attributed (their phase is unknown).

:func:`parse_events` reads the same from the profiler's own event objects
(``prof.profiler.kineto_results.events()``), without writing and reading a JSON file (the
sampler's fast path): there a device activity is linked only through its
``linked_correlation_id`` to the CPU op or annotation that issued it, whose thread ids are
the profiler's own, like the annotations'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_specperf.probe.kernels import (
    ANNOTATION_PREFIX,
    DEVICE_CATEGORIES,
    LAUNCH_CATEGORIES,
    SAMPLE_KEYS,
    STEP_ANNOTATION,
    STEP_KEY,
    TOP_KERNELS,
    Activity,
    KernelSample,
    PhaseTotals,
    Window,
    phase_totals,
    phases_in,
    summarize_step,
)

_Thread = tuple[Any, Any]


@dataclass(frozen=True)
class _Event:
    cat: str
    name: str
    start_ns: int
    end_ns: int
    thread: _Thread
    args: Mapping[str, Any]


@dataclass(frozen=True)
class ParsedTrace:
    """The probe's windows and the activities of one trace."""

    steps: tuple[Window, ...]
    phases: tuple[Window, ...]
    cuda: tuple[Activity, ...]
    cpu: tuple[Activity, ...]

    @property
    def source(self) -> str:
        """``cuda`` when the trace holds device activity, else ``cpu``."""
        return "cuda" if self.cuda else "cpu"

    def activities(self, source: str | None = None) -> tuple[Activity, ...]:
        """The ``cuda`` or ``cpu`` activities (default: the trace's source)."""
        return self.cuda if (source or self.source) == "cuda" else self.cpu

    def samples(self, source: str | None = None) -> list[KernelSample]:
        """One sample per ``specperf.step`` window, from ``source`` (default: the trace's)."""
        src = source or self.source
        acts = self.activities(src)
        return [summarize_step(acts, phases_in(self.phases, s), s, src) for s in self.steps]

    def totals(self, source: str | None = None, top: int = TOP_KERNELS) -> dict[str, PhaseTotals]:
        """Per phase over every step of the trace (see :func:`~.kernels.phase_totals`)."""
        return phase_totals(self.activities(source), self.phases, self.steps, top)


def _ns(us: Any) -> int:
    return round(float(us) * 1000)


def _events(trace: Mapping[str, Any]) -> list[_Event]:
    raw = trace.get("traceEvents") if isinstance(trace, Mapping) else None
    if not isinstance(raw, list):
        raise ValueError("not a kineto trace: no traceEvents list")
    out = []
    for e in raw:
        if not isinstance(e, Mapping) or e.get("ph") != "X" or "ts" not in e:
            continue
        start = _ns(e["ts"])
        args = e.get("args")
        out.append(
            _Event(
                cat=str(e.get("cat", "")),
                name=str(e.get("name", "")),
                start_ns=start,
                end_ns=start + _ns(e.get("dur", 0)),
                thread=(e.get("pid"), e.get("tid")),
                args=args if isinstance(args, Mapping) else {},
            )
        )
    return out


def _windows(events: Sequence[_Event]) -> tuple[list[Window], list[Window], set[_Thread]]:
    steps, phases, threads = [], [], set()
    for e in events:
        if e.cat != "user_annotation" or not e.name.startswith(ANNOTATION_PREFIX):
            continue
        key = e.name.removeprefix(ANNOTATION_PREFIX)
        if e.name == STEP_ANNOTATION:
            steps.append(Window(STEP_KEY, e.start_ns, e.end_ns))
        elif key in SAMPLE_KEYS:
            phases.append(Window(key, e.start_ns, e.end_ns))
        else:
            continue
        threads.add(e.thread)
    return sorted(steps, key=lambda w: w.start_ns), phases, threads


def _device(events: Sequence[_Event], threads: set[_Thread]) -> list[Activity]:
    """Device activities with the host time of their launch on the probe's thread."""
    launch_by_corr: dict[Any, _Event] = {}
    op_by_ext: dict[Any, _Event] = {}
    for e in events:
        if e.cat in LAUNCH_CATEGORIES and "correlation" in e.args:
            launch_by_corr[e.args["correlation"]] = e
        elif e.cat in ("cpu_op", "user_annotation") and "External id" in e.args:
            op_by_ext[e.args["External id"]] = e
    out = []
    for e in events:
        if e.cat not in DEVICE_CATEGORIES:
            continue
        launch = launch_by_corr.get(e.args.get("correlation"))
        if launch is None:
            launch = op_by_ext.get(e.args.get("External id"))
        if launch is None or launch.thread not in threads:
            continue
        out.append(Activity(e.name, e.start_ns, e.end_ns, launch.start_ns))
    return out


def _outermost_ops(events: Iterable[_Event], threads: set[_Thread]) -> list[Activity]:
    """The ``cpu_op`` events of the probe's thread that no other op contains."""
    ops = sorted(
        (e for e in events if e.cat == "cpu_op" and e.thread in threads),
        key=lambda e: (e.start_ns, -e.end_ns),
    )
    out: list[Activity] = []
    for e in ops:
        if out and e.start_ns < out[-1].end_ns:
            continue  # nested in the previous outermost op
        out.append(Activity(e.name, e.start_ns, e.end_ns, e.start_ns))
    return out


def _from_event(e: Any) -> _Event:
    """One profiler event object (``_KinetoEvent``) as a trace event."""
    cat = str(e.activity_type())
    if cat in DEVICE_CATEGORIES:
        args = {"External id": e.linked_correlation_id()}
    elif cat in ("cpu_op", "user_annotation"):
        args = {"External id": e.correlation_id()}
    else:
        args = {}
    return _Event(
        cat=cat,
        name=str(e.name()),
        start_ns=int(e.start_ns()),
        end_ns=int(e.end_ns()),
        thread=(None, e.start_thread_id()),
        args=args,
    )


def device_event_count(events: Iterable[Any]) -> int:
    """How many kernels, copies and memsets a list of profiler event objects holds."""
    return sum(1 for e in events if str(e.activity_type()) in DEVICE_CATEGORIES)


def parse_events(events: Sequence[Any], source: str | None = None) -> ParsedTrace:
    """Windows and activities from the profiler's event objects (see the module docstring).

    With ``source="cuda"`` only what device activity needs is read (the annotations, the
    device events and the CPU ops they link to), which is most of the cost saved on a step
    of many ops.
    """
    if source != "cuda":
        return _parsed([_from_event(e) for e in events])
    types = [str(e.activity_type()) for e in events]
    linked = {e.linked_correlation_id() for e, t in zip(events, types) if t in DEVICE_CATEGORIES}
    kept = [
        _from_event(e)
        for e, t in zip(events, types)
        if t in DEVICE_CATEGORIES
        or t == "user_annotation"
        or (t == "cpu_op" and e.correlation_id() in linked)
    ]
    return _parsed(kept)


def _parsed(events: list[_Event]) -> ParsedTrace:
    steps, phases, threads = _windows(events)
    return ParsedTrace(
        steps=tuple(steps),
        phases=tuple(phases),
        cuda=tuple(_device(events, threads)),
        cpu=tuple(_outermost_ops(events, threads)),
    )


def parse_trace(trace: Mapping[str, Any]) -> ParsedTrace:
    """Windows and activities of a kineto Chrome trace (``ValueError`` if it is not one)."""
    return _parsed(_events(trace))
