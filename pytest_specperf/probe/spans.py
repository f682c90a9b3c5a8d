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

On every ``CPU_EVERY``-th decode step the spans also read the CPU time of the calling
thread (``thread_time_ns``): wall minus CPU time is time the thread waited inside the phase
(a sleep, a lock, a blocking device sync that yields); the step also reads the thread's
run-queue time (waiting for a CPU on a busy machine) and, from the same read, the times
it got a CPU (each ends a wait). With ``kernel_every=N`` every N-th
decode step also runs under the kineto profiler (:mod:`.kernel_sampler`), whose trace gives
the device's active time inside each phase.

With an ``InjectControl`` the probe looks at its run directory's control file once every
``CONTROL_EVERY_STEPS`` steps and before the first step of every request the engine
announces (``new_request``), before the step's clock starts, and switches the canary
injection (and the records' ``inject`` label) when the file changed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from pytest_specperf.probe.inject import CONTROL_EVERY_STEPS, INJECT_ERROR_LABEL, INJECT_LABEL
from pytest_specperf.probe.kernel_sampler import KernelSampler
from pytest_specperf.probe.kernels import KernelSample
from pytest_specperf.probe.phases import PHASES, UNACCOUNTED
from pytest_specperf.probe.record import GraphCount, StepRecord

if TYPE_CHECKING:
    from pytest_specperf.probe.inject import InjectControl
    from pytest_specperf.probe.sink import RunDirSink

_perf_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns
#: A phase entered within this much wall time of the probe's last CPU-clock read reuses
#: that read (the thread's CPU clock is a system call, the wall clock is not): the CPU
#: time of so short a gap is counted in the phase instead of outside it.
CPU_REUSE_NS = 20_000
#: A phase shorter than this (wall time) is taken as busy for its whole span instead of
#: reading the CPU clock at its end: a wait worth reporting lasts far longer.
CPU_SHORT_NS = 50_000
#: The thread's CPU time is read on every this-many-th decode step, its run-queue time
#: (two ``/proc`` schedstat reads, the dearest of the probe's reads) on every
#: ``RUNQ_EVERY``-th (a multiple: those steps have CPU times too). In a real step these
#: reads cost several times what they cost in a tight loop (the model's work evicts the
#: caches between them).
CPU_EVERY = 2
RUNQ_EVERY = 8


class _RunQueue:
    """Time the calling thread spent runnable but not running (waiting for a CPU) and the
    times it got a CPU, from ``/proc/thread-self/schedstat`` (Linux); None where the
    kernel does not report them."""

    __slots__ = ("_fds",)

    def __init__(self) -> None:
        self._fds: dict[int, int | None] = {}

    def read(self) -> tuple[int, int] | None:
        """``(run-queue wait ns, timeslices)`` of the calling thread so far."""
        tid = threading.get_native_id()
        fd = self._fds.get(tid, -1)
        if fd == -1:
            try:
                fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                fd = None
            self._fds[tid] = fd
        if fd is None:
            return None
        try:
            fields = os.pread(fd, 64, 0).split()
            return int(fields[1]), int(fields[2])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()


_INDEX = {name: i for i, name in enumerate(PHASES)}
#: Index of the unnamed frame (:meth:`StepProbe.unnamed`): a span whose own time is
#: ``unaccounted`` (a step method's inline work inside an enclosing host phase).
_HIDDEN = len(PHASES)
_NAMES = (*PHASES, UNACCOUNTED)


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

    def new_request(self) -> None:
        return None

    def count_graph(self, runner: str, *, replay: bool, capture: bool = False) -> None:
        return None

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


#: A step's figures in the order ``build_record`` takes them (see ``StepProbe._raw``).
RawStep = tuple[Any, ...]


def build_record(raw: RawStep) -> StepRecord:
    """The ``StepRecord`` of a step's raw figures (the lists may carry the unnamed frame's
    time last: it is left out, so it counts as ``unaccounted``)."""
    (step, wall, mode, rids, ctx, batch, accepted, step_ns, host_list, graphs, rank, pid,
     labels, cpu_list, step_cpu_ns, runq, kernels) = raw  # fmt: skip
    named = host_list[:_HIDDEN]
    return StepRecord(
        step=step,
        wall_ns=wall,
        mode=mode,
        rids=rids,
        context_len=ctx,
        batch_size=batch,
        accepted_tokens=accepted,
        step_ns=step_ns,
        host_ns=dict(zip(PHASES, named)),
        unaccounted_ns=step_ns - sum(named),
        graphs=graphs,
        rank=rank,
        pid=pid,
        labels=labels,
        cpu_ns=dict(zip(PHASES, cpu_list)) if cpu_list is not None else None,
        step_cpu_ns=step_cpu_ns,
        step_runq_ns=runq[0] if runq is not None else None,
        step_slices=runq[1] if runq is not None else None,
        kernels=kernels,
    )


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
        kernel_every: int = 0,
        control: InjectControl | None = None,
    ) -> None:
        """``kernel_every``: profile every N-th step's kernels (CPU ops without CUDA); 0 off."""
        self._sink = sink
        self._rank = rank
        self._pid = os.getpid()
        self._labels = dict(labels or {})
        self._injector = injector
        self._control = control
        self._until_control = CONTROL_EVERY_STEPS  # decode steps until the next look
        self._control_due = control is not None  # look at the next step's start (first: now)
        self._spans = [_Span(self, i) for i in range(len(_NAMES))]
        self._by_name = dict(zip(PHASES, self._spans))
        self._torch: Any = None
        self._nvtx: Any = None
        if use_cuda:
            import torch

            self._torch = torch
            if nvtx:
                self._nvtx = torch.cuda.nvtx  # one range per phase, for Nsight Systems
        self._event_pool: list[Any] = []
        # (record, device spans, step start event, step end event, the previous step's
        # unnamed-frame end event: the start of the device gap before this step's)
        self._pending: list[tuple[StepRecord, list[_DeviceSpan], Any, Any, Any]] = []
        self._gap_from: Any = None  # end event of the last step's unnamed frame
        self._completed: list[StepRecord] = []
        self._step_no = 0
        self._in_step = 0
        self._sampler = KernelSampler(kernel_every, cuda=use_cuda) if kernel_every else None
        self._sampling = False
        self._step_annotation: Any = None
        self._sample_cost = 0
        self._runq = _RunQueue()
        self._decode_steps = 0
        self._cpu_on = False
        self._reset()

    # -- step lifecycle -------------------------------------------------------------
    def _reset(self) -> None:
        self._host = [0] * len(_NAMES)
        self._cpu = [0] * len(_NAMES)
        self._depth = [0] * len(_NAMES)
        # [index, t_enter, child_ns, device_span_pos, cpu_enter, child_cpu_ns, annotation]
        self._stack: list[list[Any]] = []
        self._dev_spans: list[_DeviceSpan] = []
        self._graphs: dict[str, GraphCount] = {}
        self._described = False
        self._worker_end: Any = None

    def begin_step(
        self,
        *,
        context_len: int = 0,
        batch_size: int = 0,
        rids: list[str] | None = None,
        mode: str | None = "decode",
    ) -> None:
        """Start a step's clock. ``mode=None`` opens a step whose batch is not known yet
        (a scheduler iteration, timed from its start): :meth:`describe` names it once the
        batch is known, and :meth:`abort_step` drops it if no batch ran."""
        self._in_step += 1
        if self._in_step > 1:
            return  # a nested step hook (a worker calling another hooked worker)
        if self._control is not None:
            if mode is not None:
                self._until_control -= 1
                self._control_due = self._control_due or self._until_control <= 0
            if self._control_due:
                self._control_due = False
                self._until_control = CONTROL_EVERY_STEPS
                self._apply_control(self._control)
        self._reset()
        self._ctx = context_len
        self._batch = batch_size
        self._rids = list(rids or ())
        self._mode = mode or "decode"
        self._wall = time.time_ns()
        if self._nvtx is not None:
            self._nvtx.range_push(f"specperf.step ctx={context_len} bs={batch_size}")
        if self._sampler is not None and mode == "decode":
            self._start_sampling()
        self._step_ev0 = self._event() if self._torch is not None else None
        # an iteration counts as a decode step for the CPU-clock cadence until described
        n = self._decode_steps if mode in ("decode", None) else -1
        self._decode_steps += mode == "decode"
        self._cpu_on = n >= 0 and n % CPU_EVERY == 0
        self._q0 = self._runq.read() if n >= 0 and n % RUNQ_EVERY == 0 else None
        self._t0 = self._last_t = _perf_ns()
        self._c0 = self._last_c = _thread_ns() if self._cpu_on else 0

    def describe(self, *, context_len: int, batch_size: int, rids: list[str], mode: str) -> None:
        """Name the batch of a step opened with ``begin_step(mode=None)`` (the first call
        wins; the records' kernel sampling of a decode step starts here)."""
        if not self._in_step or self._described:
            return
        self._described = True
        self._ctx = context_len
        self._batch = batch_size
        self._rids = rids
        self._mode = mode
        if mode == "decode":
            self._decode_steps += 1
            if self._control is not None:
                self._until_control -= 1
                self._control_due = self._control_due or self._until_control <= 0
            if self._sampler is not None:
                self._start_sampling()
        elif self._cpu_on:  # the CPU clock is read on decode steps only
            self._cpu_on = False
            self._cpu = [0] * len(_NAMES)

    def new_request(self) -> None:
        """A request begins: the control file is looked at before its first step, so a
        canary switched between requests holds from the request's first step, however
        few steps came since the last look."""
        if self._control is not None:
            self._control_due = True

    def unnamed(self) -> _Span:
        """A span whose own time is ``unaccounted``: a step method's inline work nested in
        a named host phase (its named phases inside it are timed as usual)."""
        return self._spans[_HIDDEN]

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
        if self._sampling:
            for frame in reversed(self._stack):
                if frame[6] is not None:
                    KernelSampler.end(frame[6])
            self._stop_sampling()
        if self._injector is not None:
            self._injector.abort_step()
        self._in_step = 0
        self._reset()

    # -- kernel sampling (every N-th step only) -----------------------------------------
    def _start_sampling(self) -> None:
        assert self._sampler is not None
        if not self._sampler.due():
            return
        t = _perf_ns()
        self._sampling = self._sampler.start()
        if self._sampling:
            self._step_annotation = self._sampler.annotate("step")
        self._sample_cost = _perf_ns() - t

    def _annotate(self, index: int) -> Any:
        assert self._sampler is not None
        return self._sampler.annotate(_NAMES[index])

    def _stop_sampling(self) -> KernelSample | None:
        """End the step's annotation and the profiler (after the step's clock stopped)."""
        assert self._sampler is not None
        t = _perf_ns()
        self._sampling = False
        KernelSampler.end(self._step_annotation)
        self._step_annotation = None
        sample = self._sampler.stop()
        if sample is None:
            return None
        return replace(sample, cost_ns=self._sample_cost + _perf_ns() - t)

    def end_step(self, *, accepted_tokens: int) -> None:
        if self._in_step == 0:
            return
        if self._in_step > 1:
            self._in_step -= 1
            return
        c1 = _thread_ns() if self._cpu_on else 0
        t1 = _perf_ns()
        q1 = self._runq.read() if self._q0 is not None else None
        step_ns = t1 - self._t0
        while self._stack:  # a phase left open by an exception: close it at the step end
            idx = self._stack[-1][0]
            self._depth[idx] = 1
            self._exit(idx, now=t1, cpu_now=c1)
        self._in_step = 0
        if self._nvtx is not None:
            self._nvtx.range_pop()
        kernels = self._stop_sampling() if self._sampling else None
        if self._sampler is not None and self._mode == "decode":
            self._sampler.note_step(step_ns, kernels.cost_ns if kernels is not None else None)
        q0 = self._q0
        runq = (q1[0] - q0[0], q1[1] - q0[1]) if q1 is not None and q0 is not None else None
        raw = self._raw(step_ns, c1 - self._c0, runq, accepted_tokens, kernels)
        self._step_no += 1
        if self._injector is not None:
            self._injector.end_step()
        if self._torch is None:
            # the record is built when its batch is written, not here: built one by one
            # inside the steps (cold caches) it cost about 0.4% of an 8k CPU step
            if self._sink is not None:
                self._sink.write_deferred(build_record, raw)
            else:
                self._completed.append(build_record(raw))
            return
        record = build_record(raw)
        step_ev1 = self._event()
        # the device gap runs from the last step's unnamed frame (the worker's forward) to
        # this step's: both on the stream current at the worker call
        gap_from = self._gap_from if self._worker_end is not None else None
        if self._worker_end is not None:
            self._gap_from = self._worker_end
        self._pending.append((record, self._dev_spans, self._step_ev0, step_ev1, gap_from))
        self._resolve(block=False)

    def _raw(
        self,
        step_ns: int,
        step_cpu_ns: int,
        runq: tuple[int, int] | None,
        accepted_tokens: int,
        kernels: KernelSample | None,
    ) -> RawStep:
        """The step's figures as they stand (``_reset`` gives the next step new lists, so
        these are not changed after the step); ``build_record`` makes the record."""
        cpu_on = self._cpu_on
        return (
            self._step_no, self._wall, self._mode, list(self._rids), self._ctx, self._batch,
            accepted_tokens, step_ns, self._host, self._graphs, self._rank, self._pid,
            self._labels, self._cpu if cpu_on else None, step_cpu_ns if cpu_on else None,
            runq, kernels,
        )  # fmt: skip

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
        # before a phase entered outside every named phase (directly in the step, or in
        # the unnamed frame of a step method: time that counts as unaccounted)
        if (
            self._injector is not None
            and index != _HIDDEN
            and (not self._stack or self._stack[-1][0] == _HIDDEN)
        ):
            self._injector.before_phase(PHASES[index])
        self._depth[index] = 1
        if self._nvtx is not None:
            self._nvtx.range_push(_NAMES[index])
        pos = -1
        if self._torch is not None:
            parent = self._stack[-1][3] if self._stack else -1
            pos = len(self._dev_spans)
            self._dev_spans.append(_DeviceSpan(index, self._event(), None, parent))
        annotation = self._annotate(index) if self._sampling else None
        t = _perf_ns()
        if self._cpu_on and t - self._last_t > CPU_REUSE_NS:
            self._last_t, self._last_c = t, _thread_ns()
        self._stack.append([index, t, 0, pos, self._last_c, 0, annotation])

    def _exit(self, index: int, now: int | None = None, cpu_now: int = 0) -> None:
        if not self._in_step or not self._depth[index]:
            return
        self._depth[index] -= 1
        if self._depth[index]:
            return
        if self._injector is not None and now is None and index != _HIDDEN:
            frame = next(f for f in reversed(self._stack) if f[0] == index)
            self._injector.stretch(PHASES[index], _perf_ns() - frame[1] - frame[2])
        if now is None:  # the clocks at the phase's end; a short phase counts as busy
            top = self._stack[-1]
            t = _perf_ns()
            if not self._cpu_on:
                c = 0
            elif top[0] == index and t - top[1] < CPU_SHORT_NS:
                c = top[4] + t - top[1]
            else:
                c = _thread_ns()
                t = _perf_ns()
            self._last_c, self._last_t = c, t
        else:
            c, t = cpu_now, now
        # Pop up to and including this phase (inner phases left open by an exception).
        while self._stack:
            idx, t_enter, child, pos, c_enter, child_c, annotation = self._stack.pop()
            incl = t - t_enter
            incl_c = c - c_enter
            self._host[idx] += incl - child
            excl_c = incl_c - child_c
            if excl_c > 0:
                self._cpu[idx] += excl_c
            self._depth[idx] = 0
            if pos >= 0:
                self._dev_spans[pos].end = self._event()
                if idx == _HIDDEN:
                    self._worker_end = self._dev_spans[pos].end
            if annotation is not None:
                KernelSampler.end(annotation)
            if self._nvtx is not None:
                self._nvtx.range_pop()
            if self._stack:
                self._stack[-1][2] += incl
                self._stack[-1][5] += incl_c
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

    def _resolve(self, *, block: bool, through: int | None = None) -> None:
        """Resolve pending steps in order; ``through``: only those up to that step
        number (a later one, still running on the device, is neither waited for nor
        resolved)."""
        while self._pending:
            record, spans, ev0, ev1, gap_from = self._pending[0]
            if through is not None and record.step > through:
                return
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
            gap_to = None
            for s, t in zip(spans, excl):
                if s.index == _HIDDEN:
                    gap_to = gap_to or s.start
                else:
                    device[PHASES[s.index]] += round(t)
            if gap_from is not None and gap_to is not None:
                record.device_gap_ns = max(round(gap_from.elapsed_time(gap_to) * 1e6), 0)
                self._event_pool.append(gap_from)
            record.device_ns = device
            if self._injector is not None:
                self._injector.observe_step(device)
            record.device_step_ns = round(ev0.elapsed_time(ev1) * 1e6)
            for s in spans:
                self._event_pool.append(s.start)
                if s.end is not None and s.index != _HIDDEN:
                    self._event_pool.append(s.end)  # an unnamed frame's end: a gap's start
            self._event_pool.extend((ev0, ev1))
            self._emit(record)

    def _emit(self, record: StepRecord) -> None:
        if self._sink is not None:
            self._sink.write(record)
        else:
            self._completed.append(record)

    # -- after the measured window -------------------------------------------------------
    def flush(self, through: int | None = None) -> None:
        """Resolve pending device times (may wait for the GPU) and write them out;
        ``through``: only the steps up to that number (never waits on a later one, such as
        the step the overlap scheduler already launched).

        Call only outside the measured window, for example after a request completes.
        """
        self._resolve(block=True, through=through)
        if self._sink is not None:
            self._sink.flush()

    def take_completed(self) -> list[StepRecord]:
        """Records kept in memory when the probe has no sink (tests, in-process benches)."""
        out, self._completed = self._completed, []
        return out

    def close(self) -> None:
        self.flush()
        self._runq.close()
        if self._sink is not None:
            self._sink.close()
