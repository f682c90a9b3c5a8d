"""Phase spans inside a decode step: the hot path.

``StepProbe`` is driven by the engine (or by SGLang hooks): ``begin_step``, any number of
``with probe.phase(name):`` blocks, ``end_step``. Host time is taken with
``perf_counter_ns``; on a GPU each span also records a pair of CUDA events on the current
stream. Events are never waited for inside a step: a record whose events have not
completed stays pending and is resolved by a later ``end_step`` (``Event.query()``, which
does not block) or by ``flush()``, which the caller invokes after the measured window.

Phase times are exclusive. A phase entered while another is open pauses the outer one,
and re-entering an open phase (a hooked method calling its hooked parent) counts once, so
the phases plus ``unaccounted`` always add up to the step.

With an ``InjectControl`` the probe looks at its run directory's control file once every
``CONTROL_EVERY_STEPS`` steps, before the step's clock starts, and switches the canary
injection (and the records' ``inject`` label) when the file changed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specperf.probe.inject import CONTROL_EVERY_STEPS, INJECT_ERROR_LABEL, INJECT_LABEL
from pytest_specperf.probe.phases import PHASES
from pytest_specperf.probe.record import GraphCount, StepRecord

if TYPE_CHECKING:
    from pytest_specperf.probe.inject import InjectControl
    from pytest_specperf.probe.sink import RunDirSink

_perf_ns = time.perf_counter_ns
_INDEX = {name: i for i, name in enumerate(PHASES)}


class PhaseInjector(Protocol):
    """Canary slowdowns (``--specperf-inject``): called by the probe around phases."""

    def before_phase(self, phase: str) -> None:
        """Called before a top-level phase is entered (outside every phase)."""

    def stretch(self, phase: str, elapsed_ns: int) -> None:
        """Called inside the phase just before it ends, with its elapsed host time."""

    def end_step(self) -> None:
        """Called when a step's record is made (it will be resolved later on a GPU)."""

    def abort_step(self) -> None:
        """Called when a step is dropped without a record."""

    def observe_step(self, device_ns: Mapping[str, int]) -> None:
        """Called once per recorded step, oldest first, when its exclusive device time
        per phase is resolved (GPU only)."""


@dataclass
class _DeviceSpan:
    index: int
    start: Any
    end: Any
    parent: int  # position in the span list, -1 for top level


class _Span:
    """Reusable context manager for one phase name (no allocation per use)."""

    __slots__ = ("_index", "_probe")

    def __init__(self, probe: StepProbe, index: int) -> None:
        self._probe = probe
        self._index = index

    def __enter__(self) -> None:
        self._probe._enter(self._index)

    def __exit__(self, *exc: object) -> None:
        self._probe._exit(self._index)


class _NullSpan:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL_SPAN = _NullSpan()


class NullProbe:
    """Same interface as ``StepProbe`` and does nothing: the probe-off arm of overhead runs."""

    enabled = False

    def phase(self, name: str) -> _NullSpan:
        return _NULL_SPAN

    def begin_step(
        self, *, context_len: int, batch_size: int, rids: list[str], mode: str = "decode"
    ) -> None:
        return None

    def end_step(self, *, accepted_tokens: int) -> None:
        return None

    def abort_step(self) -> None:
        return None

    def count_graph(self, runner: str, *, replay: bool, capture: bool = False) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class StepProbe:
    """Times the phases of decode steps and hands one ``StepRecord`` per step to a sink."""

    enabled = True

    def __init__(
        self,
        sink: RunDirSink | None,
        *,
        rank: int = 0,
        use_cuda: bool = False,
        labels: dict[str, str] | None = None,
        injector: PhaseInjector | None = None,
        nvtx: bool = False,
        control: InjectControl | None = None,
    ) -> None:
        self._sink = sink
        self._rank = rank
        self._pid = os.getpid()
        self._labels = dict(labels or {})
        self._injector = injector
        self._control = control
        self._until_control = 1  # steps until the control file is looked at (first: now)
        self._spans = [_Span(self, i) for i in range(len(PHASES))]
        self._by_name = dict(zip(PHASES, self._spans))
        self._torch: Any = None
        self._nvtx: Any = None
        if use_cuda:
            import torch

            self._torch = torch
            if nvtx:
                self._nvtx = torch.cuda.nvtx  # one range per phase, for Nsight Systems
        self._event_pool: list[Any] = []
        self._pending: list[tuple[StepRecord, list[_DeviceSpan], Any, Any]] = []
        self._completed: list[StepRecord] = []
        self._step_no = 0
        self._in_step = 0
        self._reset()

    # -- step lifecycle -------------------------------------------------------------
    def _reset(self) -> None:
        self._host = [0] * len(PHASES)
        self._depth = [0] * len(PHASES)
        self._stack: list[list[int]] = []  # [index, t_enter, child_ns, device_span_pos]
        self._dev_spans: list[_DeviceSpan] = []
        self._graphs: dict[str, GraphCount] = {}

    def begin_step(
        self, *, context_len: int, batch_size: int, rids: list[str], mode: str = "decode"
    ) -> None:
        self._in_step += 1
        if self._in_step > 1:
            return  # a nested step hook (a worker calling another hooked worker)
        if self._control is not None:
            self._until_control -= 1
            if self._until_control <= 0:
                self._until_control = CONTROL_EVERY_STEPS
                self._apply_control(self._control)
        self._reset()
        self._ctx = context_len
        self._batch = batch_size
        self._rids = rids
        self._mode = mode
        self._wall = time.time_ns()
        if self._nvtx is not None:
            self._nvtx.range_push(f"specperf.step ctx={context_len} bs={batch_size}")
        self._step_ev0 = self._event() if self._torch is not None else None
        self._t0 = _perf_ns()

    def _apply_control(self, control: InjectControl) -> None:
        """Switch the injection and the records' labels if the control file changed."""
        change = control.poll()
        if change is None:
            return
        self._injector = change.injector
        labels = {
            k: v for k, v in self._labels.items() if k not in (INJECT_LABEL, INJECT_ERROR_LABEL)
        }
        if change.label:
            labels[INJECT_LABEL] = change.label
        if change.error:
            labels[INJECT_ERROR_LABEL] = change.error
        self._labels = labels  # a new dict: records already made keep theirs

    def abort_step(self) -> None:
        """Forget a step that raised (no record); the next ``begin_step`` starts clean."""
        if not self._in_step:
            return
        if self._nvtx is not None:
            for _ in range(len(self._stack) + 1):
                self._nvtx.range_pop()
        if self._injector is not None:
            self._injector.abort_step()
        self._in_step = 0
        self._reset()

    def end_step(self, *, accepted_tokens: int) -> None:
        if self._in_step == 0:
            return
        if self._in_step > 1:
            self._in_step -= 1
            return
        t1 = _perf_ns()
        step_ns = t1 - self._t0
        while self._stack:  # a phase left open by an exception: close it at the step end
            idx = self._stack[-1][0]
            self._depth[idx] = 1
            self._exit(idx, now=t1)
        self._in_step = 0
        if self._nvtx is not None:
            self._nvtx.range_pop()
        host = dict(zip(PHASES, self._host))
        record = StepRecord(
            step=self._step_no,
            wall_ns=self._wall,
            mode=self._mode,
            rids=list(self._rids),
            context_len=self._ctx,
            batch_size=self._batch,
            accepted_tokens=accepted_tokens,
            step_ns=step_ns,
            host_ns=host,
            unaccounted_ns=step_ns - sum(self._host),
            graphs=self._graphs,
            rank=self._rank,
            pid=self._pid,
            labels=self._labels,
        )
        self._step_no += 1
        if self._injector is not None:
            self._injector.end_step()
        if self._torch is None:
            self._emit(record)
            return
        step_ev1 = self._event()
        self._pending.append((record, self._dev_spans, self._step_ev0, step_ev1))
        self._resolve(block=False)

    # -- spans ----------------------------------------------------------------------
    def phase(self, name: str) -> _Span:
        """Context manager timing ``name`` (one of ``PHASES``) inside the current step."""
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"unknown phase {name!r}; valid phases: {', '.join(PHASES)}") from None

    def _enter(self, index: int) -> None:
        if not self._in_step:
            return
        if self._depth[index]:
            self._depth[index] += 1
            return
        if self._injector is not None and not self._stack:
            self._injector.before_phase(PHASES[index])
        self._depth[index] = 1
        if self._nvtx is not None:
            self._nvtx.range_push(PHASES[index])
        pos = -1
        if self._torch is not None:
            parent = self._stack[-1][3] if self._stack else -1
            pos = len(self._dev_spans)
            self._dev_spans.append(_DeviceSpan(index, self._event(), None, parent))
        self._stack.append([index, _perf_ns(), 0, pos])

    def _exit(self, index: int, now: int | None = None) -> None:
        if not self._in_step or not self._depth[index]:
            return
        self._depth[index] -= 1
        if self._depth[index]:
            return
        if self._injector is not None and now is None:
            frame = next(f for f in reversed(self._stack) if f[0] == index)
            self._injector.stretch(PHASES[index], _perf_ns() - frame[1] - frame[2])
        t = _perf_ns() if now is None else now
        # Pop up to and including this phase (inner phases left open by an exception).
        while self._stack:
            idx, t_enter, child, pos = self._stack.pop()
            incl = t - t_enter
            self._host[idx] += incl - child
            self._depth[idx] = 0
            if pos >= 0:
                self._dev_spans[pos].end = self._event()
            if self._nvtx is not None:
                self._nvtx.range_pop()
            if self._stack:
                self._stack[-1][2] += incl
            if idx == index:
                break

    def count_graph(self, runner: str, *, replay: bool, capture: bool = False) -> None:
        """Count one CUDA-graph replay, eager forward or (``capture``) capture of
        ``runner`` in this step."""
        if not self._in_step:
            return
        g = self._graphs.get(runner)
        if g is None:
            g = self._graphs[runner] = GraphCount()
        if capture:
            g.capture += 1
        elif replay:
            g.replay += 1
        else:
            g.eager += 1

    # -- device events ------------------------------------------------------------------
    def _event(self) -> Any:
        ev = self._event_pool.pop() if self._event_pool else None
        if ev is None:
            ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _resolve(self, *, block: bool) -> None:
        while self._pending:
            record, spans, ev0, ev1 = self._pending[0]
            if block:
                ev1.synchronize()
            elif not ev1.query():
                return
            self._pending.pop(0)
            incl = [s.start.elapsed_time(s.end) * 1e6 if s.end is not None else 0.0 for s in spans]
            excl = list(incl)
            for s, t in zip(spans, incl):
                if s.parent >= 0:
                    excl[s.parent] -= t
            device = dict.fromkeys(PHASES, 0)
            for s, t in zip(spans, excl):
                device[PHASES[s.index]] += round(t)
            record.device_ns = device
            if self._injector is not None:
                self._injector.observe_step(device)
            record.device_step_ns = round(ev0.elapsed_time(ev1) * 1e6)
            for s in spans:
                self._event_pool.append(s.start)
                if s.end is not None:
                    self._event_pool.append(s.end)
            self._event_pool.extend((ev0, ev1))
            self._emit(record)

    def _emit(self, record: StepRecord) -> None:
        if self._sink is not None:
            self._sink.write(record)
        else:
            self._completed.append(record)

    # -- after the measured window -------------------------------------------------------
    def flush(self) -> None:
        """Resolve pending device times (may wait for the GPU) and write them out.

        Call only outside the measured window, for example after a request completes.
        """
        self._resolve(block=True)
        if self._sink is not None:
            self._sink.flush()

    def take_completed(self) -> list[StepRecord]:
        """Records kept in memory when the probe has no sink (tests, in-process benches)."""
        out, self._completed = self._completed, []
        return out

    def close(self) -> None:
        self.flush()
        if self._sink is not None:
            self._sink.close()
