"""Hook functions that run inside SGLang's scheduler processes.

:class:`ProbeRuntime` is the per-process state (one scheduler = one tensor-parallel rank):
the :class:`~pytest_specperf.probe.StepProbe`, a sink that completes records before
writing them, and the few counters the hooks need. :func:`make_hook` turns one
:class:`~pytest_specperf.engines.sglang.phase_map.HookEntry` into an AROUND hook for
``HookRegistry`` (signature ``hook(original_fn, *args, **kwargs)``).

A record is one iteration of the scheduler's event loop that ran a batch through the
speculative worker's ``forward_batch_generation`` (role ``step``): it opens when an
iteration starts (role ``iteration``, ``Scheduler.ingest_requests``, timed as ``ingest``)
and ends when the next one starts. The scheduler's own work in it is timed by host-phase
entries (``schedule``, ``launch``, ``postprocess``, ``output``); the worker call's own time
outside its phases is ``unaccounted`` (the probe's unnamed frame, so that it is not counted
in the enclosing ``launch``). Iterations that ran no batch make no record. A map without an
``iteration`` entry gets the former records, one per worker call, completed from:

- ``schedule``: ``ScheduleBatch.prepare_for_decode`` runs in the scheduler loop *before*
  the worker call; its host time is carried into the next step's ``schedule`` phase and
  ``step_ns``, and its thread CPU time into the step's ``cpu_ns`` and ``step_cpu_ns`` (on
  the steps that read CPU time), so that carried time does not read as waiting (device
  time is not carried: it runs on the schedule stream). That next step is a
  decode step, or an extend step when mixed chunked prefill merged the decode batch into
  a prefill batch; either way the carry is consumed by the step it preceded, never by a
  later one.

Accepted tokens are known on the host only when the scheduler processes the step's result
(``process_batch_result_decode``, after the next step was launched under the overlap
scheduler). Decode records are held until then. When a request finishes, its records are
written through its last step, and only through it (never waiting on a step the overlap
loop already launched): at once without iterations, at the start of the next iteration
with them (its last step's record ends there).

Under the overlap scheduler SGLang runs one more step for a request after its last one
(the batch was launched before the finish was known); that step's record drops the
finished request from ``rids`` (it produced nothing for it) and counts none of its tokens
(SGLang skips that row).

Hot path: a wrapper that is not in a step, or whose condition is false, costs one or two
attribute tests before calling through; a timed phase adds the probe's span (two
``perf_counter_ns`` and, on a GPU, two CUDA-event records); every scheduler iteration,
idle ones too, opens a record (and drops it when no batch ran). Nothing here synchronizes
with the GPU inside a step; flushing (which resolves CUDA events) happens when a request
finishes or the scheduler is idle. A failure in our own code is recorded (``errors``
report in the run directory, one log line) and never propagates into SGLang.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_specperf.engines.sglang import kv_fragment
from pytest_specperf.engines.sglang.phase_map import HookEntry
from pytest_specperf.probe.inject import InjectControl
from pytest_specperf.probe.phases import INGEST
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.probe.sink import RunDirSink
from pytest_specperf.probe.spans import PhaseInjector, StepProbe

logger = logging.getLogger("pytest_specperf.sglang")

Hook = Callable[..., Any]
_perf_ns = time.perf_counter_ns
_thread_ns = time.thread_time_ns
_STEP_ATTR = "_specperf_step"
#: SGLang's rid prefix of its own health-check requests (``sglang.srt.constants``): no
#: fragmentation report is written for them (nobody asks for it).
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"


class DeferredSink(RunDirSink):
    """A :class:`RunDirSink` that completes decode records before writing them.

    The probe hands records over at the end of a step (or later, once their CUDA events
    completed); decode records wait here for their accepted-token count, and get the
    carried-in ``schedule`` time. A record is written when its count arrives, when it is
    older than ``max_hold`` steps, or on :meth:`release_through`.
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], *, rank: int = 0, max_hold: int = 8
    ) -> None:
        super().__init__(run_dir, rank=rank)
        self.max_hold = max_hold
        self._held: dict[int, StepRecord] = {}
        self._accepted: dict[int, tuple[int, int | None]] = {}
        self._carry: dict[int, tuple[int, int]] = {}
        self._finished: dict[str, int | None] = {}
        self._newest = -1

    # -- fed by the hooks ----------------------------------------------------------------
    def note_carry(self, step: int, host_ns: int, cpu_ns: int = 0) -> None:
        """Host (wall) and thread CPU time spent on ``schedule`` for ``step`` before the
        step began."""
        wall, cpu = self._carry.get(step, (0, 0))
        self._carry[step] = (wall + host_ns, cpu + cpu_ns)

    def set_accepted(self, step: int, tokens: int, context_len: int | None = None) -> None:
        """``step`` produced ``tokens``; ``context_len``: its context as known only now
        (read from the requests when the batch had no host copy of its lengths)."""
        rec = self._held.pop(step, None)
        if rec is None:
            self._accepted[step] = (tokens, context_len)
            self._trim(self._accepted)
            return
        rec.accepted_tokens = tokens
        if context_len is not None:
            rec.context_len = context_len
        super().write(rec)

    def request_finished(self, rid: str, last_step: int | None) -> None:
        """``rid`` produced its last tokens in ``last_step`` (None: unknown, keep all)."""
        self._finished[rid] = last_step
        while len(self._finished) > 4096:
            self._finished.pop(next(iter(self._finished)))
        if last_step is None:
            return
        for step, rec in self._held.items():
            if step > last_step and rid in rec.rids:
                rec.rids = [r for r in rec.rids if r != rid]

    # -- called by the probe --------------------------------------------------------------
    def write_deferred(self, build: Callable[[Any], StepRecord], raw: Any) -> None:
        """Built at once: records are completed here (accepted tokens, carried schedule
        time, finished requests) before they are written."""
        self.write(build(raw))

    def write(self, record: StepRecord) -> None:
        carry, carry_cpu = self._carry.pop(record.step, (0, 0))
        if carry:
            record.host_ns["schedule"] = record.host_ns.get("schedule", 0) + carry
            record.step_ns += carry
        if carry_cpu and record.cpu_ns is not None and record.step_cpu_ns is not None:
            record.cpu_ns["schedule"] = record.cpu_ns.get("schedule", 0) + carry_cpu
            record.step_cpu_ns += carry_cpu
        if record.mode != "decode":
            for rid in record.rids:  # a new request reusing an old id
                self._finished.pop(rid, None)
            super().write(record)
            return
        if self._finished:
            record.rids = [r for r in record.rids if not self._ran_past_finish(r, record.step)]
        self._newest = max(self._newest, record.step)
        known = self._accepted.pop(record.step, None)
        if known is not None:
            record.accepted_tokens = known[0]
            if known[1] is not None:
                record.context_len = known[1]
            super().write(record)
        else:
            self._held[record.step] = record
        stale = [s for s in self._held if s < self._newest - self.max_hold]
        for s in sorted(stale):
            super().write(self._held.pop(s))

    def _ran_past_finish(self, rid: str, step: int) -> bool:
        last = self._finished.get(rid, -1)
        return last is not None and last >= 0 and step > last

    def release_through(self, step: int | None) -> None:
        """Write every held record up to ``step`` (all if None), as they are."""
        for s in sorted(self._held):
            if step is None or s <= step:
                super().write(self._held.pop(s))

    @property
    def held(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self.release_through(None)
        super().close()

    def _trim(self, d: dict[int, Any]) -> None:
        while len(d) > 256:
            d.pop(min(d))


class ProbeRuntime:
    """State of the in-scheduler probe for one process."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None,
        *,
        rank: int = 0,
        labels: dict[str, str] | None = None,
        use_cuda: bool | None = None,
        meta_suffix: str | None = None,
        injector: PhaseInjector | None = None,
        nvtx: bool = False,
        kernel_every: int = 0,
        control: InjectControl | None = None,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._kernel_every = kernel_every
        self.rank = rank
        self.labels = dict(labels or {})
        self._use_cuda = use_cuda
        self._injector = injector
        self._nvtx = nvtx
        self._control = control
        self.meta_suffix = meta_suffix or f"pid{os.getpid()}"
        self.sink: DeferredSink | None = (
            DeferredSink(self.run_dir, rank=rank) if self.run_dir is not None else None
        )
        self._probe: StepProbe | None = None
        self.step_depth = 0
        self.phase_depth = 0
        self.graph_depth = 0
        self.carry_depth = 0
        self.carry_ns = 0
        self.carry_cpu_ns = 0
        self.step_no = 0  # number the probe gives the next step
        self.cur_mode: str | None = None
        self.cur_carry = 0
        self.cur_carry_cpu = 0
        self.processing_step: int | None = None
        # the scheduler's iteration (role ``iteration``): a record is open from one
        # iteration's start to the next's; ``in_worker`` while the step method runs
        self.iterating = False
        self.in_worker = 0
        self.worker_seen = False
        self.flush_due = False
        self.flush_through: int | None = None
        self._late_ctx: set[int] = set()
        self.dirty = False
        self.kv_layout: dict[str, Any] | None = None
        self.errors: dict[str, list[Any]] = {}
        self._runner_labels: dict[tuple[type, bool], str] = {}
        self._result_steps: dict[int, int] = {}
        #: per phase/iteration target: the calls it timed inside a step (zero from
        #: install); written beside the records at every flush (``write_calls``)
        self.calls: dict[str, int] = {}

    # -- probe -----------------------------------------------------------------------
    @property
    def probe(self) -> StepProbe:
        if self._probe is None:
            use_cuda = self._use_cuda
            if use_cuda is None:
                try:
                    import torch

                    use_cuda = bool(torch.cuda.is_available())
                except Exception:
                    use_cuda = False
            self._probe = StepProbe(
                self.sink,
                rank=self.rank,
                use_cuda=use_cuda,
                labels=self.labels,
                injector=self._injector,
                nvtx=self._nvtx,
                kernel_every=self._kernel_every,
                control=self._control,
            )
        return self._probe

    # -- errors ------------------------------------------------------------------------
    def note_error(self, where: str, exc: BaseException) -> None:
        entry = self.errors.get(where)
        if entry is None:
            self.errors[where] = [1, f"{type(exc).__name__}: {exc}"]
            logger.warning(
                "pytest-specperf hook %s failed (server unaffected): %s: %s",
                where,
                type(exc).__name__,
                exc,
            )
            self.write_errors()
        else:
            entry[0] += 1

    def write_errors(self) -> None:
        if self.sink is None or not self.errors:
            return
        with contextlib.suppress(OSError):
            self.sink.write_meta(
                f"errors-{self.meta_suffix}",
                {k: {"count": v[0], "first": v[1]} for k, v in self.errors.items()},
            )

    def write_calls(self) -> None:
        """``calls-<pid>-rank<R>.json``: how often each phase/iteration target timed a call
        inside a step since the hooks were installed (``--specperf-strict`` reads it)."""
        if self.sink is None or not self.calls:
            return
        with contextlib.suppress(OSError):
            self.sink.write_meta(f"calls-{self.meta_suffix}", {"calls": dict(self.calls)})

    # -- iterations ----------------------------------------------------------------------
    def next_iteration(self) -> None:
        """A scheduler iteration starts: the last one's record ends here (none if it ran
        no batch), a flush a finished request asked for runs (between records, never
        waiting on a later step), and the new iteration's clock starts."""
        if self.iterating:
            self.iterating = False
            self.step_depth = self.phase_depth = self.graph_depth = 0
            if self.worker_seen:
                self.end(None)
            else:
                self.probe.abort_step()
        if self.flush_due:
            self.flush_due = False
            self.flush(self.flush_through)
        self.probe.begin_step(mode=None)
        self.iterating = True
        self.worker_seen = False
        self.step_depth = 1

    def describe(self, entry: HookEntry, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """The iteration's step method was called: name its batch in the record. False:
        an idle (DP padding) batch, which makes no record."""
        found = _batch_mode(entry, args, kwargs)
        if found is None:
            return False
        batch, mode = found
        reqs = batch.reqs
        rids = [str(r.rid) for r in reqs]
        ctx, exact = _context_len_of(batch, reqs)
        if not exact and mode == "decode":
            self._late_ctx.add(self.step_no)  # read again when its result is processed
            while len(self._late_ctx) > 64:
                self._late_ctx.discard(min(self._late_ctx))
        self.probe.describe(context_len=ctx, batch_size=len(rids), rids=rids, mode=mode)
        if mode == "extend":  # this iteration's clock runs: the next one looks at the file
            self.probe.new_request()
        self.cur_mode = mode
        self.worker_seen = True
        return True

    def worker_done(self, result: Any) -> None:
        """The iteration's step method returned: its result carries the number the
        iteration's record will have (records end in order, one step method a record)."""
        if self.cur_mode == "decode" and result is not None:
            self._tag(result, self.step_no)

    # -- steps -------------------------------------------------------------------------
    def begin(self, entry: HookEntry, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Open a step for the worker call; False: not a step we record (idle, unknown)."""
        found = _batch_mode(entry, args, kwargs)
        if found is None:
            self.carry_ns = self.carry_cpu_ns = 0  # belongs to no recorded step
            return False
        batch, mode = found
        reqs = batch.reqs
        rids = [str(r.rid) for r in reqs]
        ctx, exact = _context_len_of(batch, reqs)
        if not exact and mode == "decode":
            self._late_ctx.add(self.step_no)
            while len(self._late_ctx) > 64:
                self._late_ctx.discard(min(self._late_ctx))
        if mode == "extend":
            # a prefill (a new request, or a chunk of one) precedes the request's first
            # decode step: the canary's control file is looked at before this step's clock
            # starts, so a canary switched between requests holds from the request's start
            self.probe.new_request()
        self.probe.begin_step(context_len=ctx, batch_size=len(rids), rids=rids, mode=mode)
        self.step_depth = 1
        self.cur_mode = mode
        # prepare_for_decode ran for this batch (mixed into a prefill batch when extend)
        self.cur_carry, self.carry_ns = self.carry_ns, 0
        self.cur_carry_cpu, self.carry_cpu_ns = self.carry_cpu_ns, 0
        return True

    def end(self, result: Any) -> None:
        self.step_depth = 0
        self.phase_depth = 0
        self.graph_depth = 0
        step = self.step_no
        self.step_no += 1
        if self.sink is not None and self.cur_carry:
            self.sink.note_carry(step, self.cur_carry, self.cur_carry_cpu)
        self.cur_carry = self.cur_carry_cpu = 0
        self.probe.end_step(accepted_tokens=0)
        self.dirty = True
        if self.cur_mode == "decode" and result is not None:
            self._tag(result, step)

    def _tag(self, result: Any, step: int) -> None:
        try:
            setattr(result, _STEP_ATTR, step)
        except (AttributeError, TypeError):
            self._result_steps[id(result)] = step
            while len(self._result_steps) > 64:
                self._result_steps.pop(next(iter(self._result_steps)))

    def step_of(self, result: Any) -> int | None:
        step = getattr(result, _STEP_ATTR, None)
        if step is None:
            step = self._result_steps.pop(id(result), None)
        return step if isinstance(step, int) else None

    # -- results, finishes, flushes --------------------------------------------------------
    def on_result(self, result: Any, batch: Any = None) -> int | None:
        """A decode step's result is about to be processed: record its accepted tokens
        (of the requests SGLang will take them for: not those that finished before, which
        under overlap ride one extra step) and, where the step's context was read from
        the requests, its context now that the previous step's tokens are in."""
        step = self.step_of(result)
        if step is None or self.sink is None:
            return step
        reqs = getattr(batch, "reqs", None)
        live = _live_rows(reqs) if reqs is not None else None
        tokens = accepted_tokens(result, live)
        ctx = None
        if step in self._late_ctx and reqs is not None:
            self._late_ctx.discard(step)
            ctx = max(
                (_req_len(r) for i, r in enumerate(reqs) if live is None or i in live), default=0
            )
        if tokens is not None:
            self.sink.set_accepted(step, tokens, ctx)
        return step

    def on_release(self, req: Any, tree_cache: Any) -> None:
        """A request gives its KV back: if it finished, measure and write its records."""
        finished = getattr(req, "finished", None)
        if not callable(finished) or not finished():
            return
        rid = str(req.rid)
        if self.kv_layout is not None and not rid.startswith(HEALTH_CHECK_RID_PREFIX):
            try:
                self.measure_kv(req, tree_cache)
            except Exception as e:
                self.note_error("kv_measure", e)
        if self.sink is not None:
            self.sink.request_finished(rid, self.processing_step)
        if not self.iterating:
            self.flush(self.processing_step)
            return
        # the request's last step may be this iteration's (still open): flush when the
        # iteration ends, through the latest step a finished request asked for
        through = self.processing_step
        if self.flush_due and (self.flush_through is None or through is None):
            through = None
        elif self.flush_due and self.flush_through is not None and through is not None:
            through = max(through, self.flush_through)
        self.flush_due, self.flush_through = True, through

    def flush(self, through: int | None = None) -> None:
        """Resolve device times (waits for the GPU) and write records up to ``through``
        (all if None). Only steps up to ``through`` are waited for: under the overlap
        scheduler the next step is already running when a request finishes, and waiting
        for it would drain the pipeline."""
        if self._probe is not None:
            self._probe.flush(through)
        self.write_calls()  # before the records: a reader that sees them sees these counts
        if self.sink is not None:
            self.sink.release_through(through)
            self.sink.flush()
            self.dirty = self.sink.held > 0
        else:
            self.dirty = False
        self.write_errors()

    # -- KV layout -------------------------------------------------------------------------
    def on_flush_cache(self, scheduler: Any) -> None:
        """After a successful flush: apply the requested KV layout, report the outcome."""
        if self.run_dir is None or self.sink is None:
            return
        status: dict[str, Any]
        try:
            req = kv_fragment.read_request(self.run_dir)
        except kv_fragment.KVLayoutError as e:
            self.sink.write_meta(
                f"{kv_fragment.RESULT_META}-{self.meta_suffix}",
                {"request_id": None, "status": "refused", "message": str(e)},
            )
            return
        if req is None:
            return
        status = {
            "request_id": req["id"],
            "layout": req["layout"],
            "level": req["level"],
            "seed": req["seed"],
            "rank": self.rank,
        }
        try:
            allocator = scheduler.token_to_kv_pool_allocator
            status.update(
                kv_fragment.apply_layout(allocator, req["layout"], req["level"], req["seed"])
            )
            status["status"] = "ok"
            self.kv_layout = req
        except kv_fragment.KVLayoutError as e:
            status.update(status="refused", message=str(e))
            self.kv_layout = None
        except Exception as e:
            status.update(status="error", message=f"{type(e).__name__}: {e}")
            self.kv_layout = None
            self.note_error("kv_flush", e)
        self.sink.write_meta(f"{kv_fragment.RESULT_META}-{self.meta_suffix}", status)

    def measure_kv(self, req: Any, tree_cache: Any) -> None:
        if self.sink is None:
            return
        kv = getattr(req, "kv", req)
        row = getattr(kv, "req_pool_idx", None)
        length = getattr(kv, "kv_committed_len", None)
        if row is None or not length:
            return
        pool = tree_cache.req_to_token_pool
        allocator = getattr(tree_cache, "token_to_kv_pool_allocator", None)
        page_size = int(
            getattr(allocator, "page_size", None) or getattr(tree_cache, "page_size", 1) or 1
        )
        data = kv_fragment.measure_request(pool.req_to_token, int(row), int(length), page_size)
        data["rid"] = str(req.rid)
        layout = self.kv_layout or {}
        data.update(
            layout=layout.get("layout"),
            level=layout.get("level"),
            seed=layout.get("seed"),
            request_id=layout.get("id"),
        )
        self.sink.write_meta(kv_fragment.FRAG_META_PREFIX + kv_fragment.rid_key(str(req.rid)), data)

    # -- graph counters --------------------------------------------------------------------
    def runner_label(self, runner: Any) -> str:
        is_draft = bool(getattr(getattr(runner, "model_runner", None), "is_draft_worker", False))
        key = (type(runner), is_draft)
        label = self._runner_labels.get(key)
        if label is None:
            label = type(runner).__name__ + ("[draft]" if is_draft else "")
            self._runner_labels[key] = label
        return label


def _batch_mode(
    entry: HookEntry, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, str] | None:
    """The step method's batch and the record's mode; None: no batch, or an idle one."""
    batch = kwargs.get("batch")
    if batch is None:
        idx = entry.arg_index("batch")
        i = 1 if idx is None else idx
        batch = args[i] if len(args) > i else None
    if batch is None:
        return None
    fm = batch.forward_mode
    if fm.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return batch, "extend"  # a mixed batch (decode merged into a prefill) too
    if fm.is_idle():
        return None
    return batch, "decode"


def _req_len(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def _context_len_of(batch: Any, reqs: Any) -> tuple[int, bool]:
    """The batch's longest context and whether it is exact now: the host copy of the
    sequence lengths (fresh at the step method: SGLang resolves it just before), else the
    requests' token lists, which under the overlap scheduler lack the previous step's
    tokens (its result is processed after this step is launched): False then."""
    lens = getattr(batch, "seq_lens_cpu", None)
    if lens is not None:
        try:
            return (int(lens.max()) if len(lens) else 0), True
        except (TypeError, ValueError, RuntimeError):
            pass
    return max((_req_len(r) for r in reqs), default=0), False


def _context_len(batch: Any, reqs: Any) -> int:
    return _context_len_of(batch, reqs)[0]


def _live_rows(reqs: Any) -> set[int] | None:
    """Rows of the batch SGLang will process: under overlap a request that finished (or
    was retracted) in an earlier step rides one more step and is skipped. None: all."""
    skip = set()
    for i, r in enumerate(reqs):
        finished = getattr(r, "finished", None)
        if (callable(finished) and finished()) or getattr(r, "is_retracted", False):
            skip.add(i)
    return None if not skip else set(range(len(reqs))) - skip


def accepted_tokens(result: Any, rows: set[int] | None = None) -> int | None:
    """Tokens a processed decode step produced (accepted drafts plus bonus), host-side only;
    ``rows``: only those rows of the batch (None: all).

    Waits on the result's ``copy_done`` event first, which the scheduler does anyway at the
    top of ``process_batch_result_decode``; never copies a device tensor itself.
    """
    done = getattr(result, "copy_done", None)
    if done is not None:
        done.synchronize()
    lens = getattr(result, "accept_lens", None)
    if lens is None or getattr(lens, "is_cuda", False):
        return None
    if rows is None:
        return int(lens.sum())
    return sum(int(lens[i]) for i in sorted(rows) if i < len(lens))


# -- hook factories ----------------------------------------------------------------------------
def make_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    """The AROUND hook for ``entry`` (``hook(original_fn, *args, **kwargs)``)."""
    factory = _FACTORIES.get(entry.role)
    if factory is None:
        raise ValueError(f"no hook for role {entry.role!r} ({entry.target})")
    return factory(entry, rt)


def _step_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    where = f"step:{entry.target}"

    def step_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        if rt.in_worker:
            return original(*args, **kwargs)  # a worker calling another hooked worker
        if rt.iterating:
            return _iteration_step(original, args, kwargs)
        if rt.step_depth:
            return original(*args, **kwargs)
        try:
            opened = rt.begin(entry, args, kwargs)
        except Exception as e:
            rt.note_error(where, e)
            opened = False
        if not opened:
            return original(*args, **kwargs)
        result = None
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            try:
                rt.end(result)
            except Exception as e:
                rt.step_depth = 0
                rt.note_error(where, e)

    def _iteration_step(original: Hook, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Inside an iteration: name the record's batch; the call's own time (outside the
        named phases nested in it) is ``unaccounted``, not the enclosing ``launch``."""
        if rt.worker_seen:
            return original(*args, **kwargs)  # a second step method in one iteration
        try:
            opened = rt.describe(entry, args, kwargs)
        except Exception as e:
            rt.note_error(where, e)
            opened = False
        if not opened:
            return original(*args, **kwargs)
        span = rt.probe.unnamed()
        rt.in_worker = 1
        span.__enter__()
        result = None
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            span.__exit__(None, None, None)
            rt.in_worker = 0
            try:
                rt.worker_done(result)
            except Exception as e:
                rt.note_error(where, e)

    return step_hook


def _iteration_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    """The first call of every scheduler iteration (``Scheduler.ingest_requests``): ends
    the last iteration's record, starts this one's, and is timed as ``ingest``."""
    where = f"iteration:{entry.target}"
    key, calls = entry.target, rt.calls
    calls[key] = 0

    def iteration_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        if rt.in_worker:
            return original(*args, **kwargs)
        try:
            rt.next_iteration()
        except Exception as e:
            rt.iterating = False
            rt.step_depth = 0
            rt.note_error(where, e)
            return original(*args, **kwargs)
        calls[key] += 1
        return _in_phase(rt, INGEST, original, args, kwargs)

    return iteration_hook


def _in_phase(
    rt: ProbeRuntime, phase: str, original: Hook, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``original`` called inside a span of ``phase`` (a counted, timed hook call)."""
    span = rt.probe.phase(phase)
    rt.phase_depth += 1
    span.__enter__()
    try:
        return original(*args, **kwargs)
    finally:
        span.__exit__(None, None, None)
        rt.phase_depth -= 1


Condition = Callable[[tuple[Any, ...], dict[str, Any]], bool]


def condition(entry: HookEntry) -> Condition | None:
    """The entry's ``when`` as a test of the call's arguments (None: always)."""
    attr = entry.when_self_attr
    if attr is not None:
        return lambda args, kwargs: bool(args and getattr(args[0], attr, False))
    name = entry.when_arg or entry.when_not_arg
    if name is None:
        return None
    idx = entry.arg_index(name)
    want = entry.when_arg is not None

    def test(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if name in kwargs:
            value = kwargs[name]
        else:
            value = args[idx] if idx is not None and len(args) > idx else None
        return bool(value) is want

    return test


def _phase_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    phase = entry.phase or ""
    carry = phase == "schedule"
    when = condition(entry)
    outermost = entry.outermost
    key, calls = entry.target, rt.calls
    calls[key] = 0

    def phase_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        if not rt.step_depth:
            if not carry or rt.carry_depth:
                return original(*args, **kwargs)
            rt.carry_depth = 1
            c0, t0 = _thread_ns(), _perf_ns()
            try:
                return original(*args, **kwargs)
            finally:
                rt.carry_ns += _perf_ns() - t0
                rt.carry_cpu_ns += _thread_ns() - c0
                rt.carry_depth = 0
        if outermost and rt.phase_depth:
            return original(*args, **kwargs)
        if when is not None and not when(args, kwargs):
            return original(*args, **kwargs)
        calls[key] += 1
        return _in_phase(rt, phase, original, args, kwargs)

    return phase_hook


def _graph_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    fixed = entry.label
    replay = bool(entry.replay)
    where = f"graph:{entry.target}"
    when = condition(entry)

    def graph_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        if not rt.step_depth or rt.graph_depth:
            return original(*args, **kwargs)
        if when is not None and not when(args, kwargs):
            return original(*args, **kwargs)
        try:
            label = fixed or rt.runner_label(args[0])
            rt.probe.count_graph(label, replay=replay)
        except Exception as e:
            rt.note_error(where, e)
        rt.graph_depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            rt.graph_depth -= 1

    return graph_hook


def _result_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    where = f"step_result:{entry.target}"
    idx = entry.arg_index("result")
    pos = 2 if idx is None else idx
    bidx = entry.arg_index("batch")
    bpos = 1 if bidx is None else bidx

    def result_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        result = (
            kwargs["result"] if "result" in kwargs else (args[pos] if len(args) > pos else None)
        )
        step = None
        if result is not None:
            batch = (
                kwargs["batch"] if "batch" in kwargs else (args[bpos] if len(args) > bpos else None)
            )
            try:
                step = rt.on_result(result, batch)
            except Exception as e:
                rt.note_error(where, e)
        prev, rt.processing_step = rt.processing_step, step
        try:
            return original(*args, **kwargs)
        finally:
            rt.processing_step = prev

    return result_hook


def _release_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    where = f"kv_release:{entry.target}"

    def release_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        try:
            req = kwargs["req"] if "req" in kwargs else args[0]
            tree_cache = kwargs["tree_cache"] if "tree_cache" in kwargs else args[1]
            rt.on_release(req, tree_cache)
        except Exception as e:
            rt.note_error(where, e)
        return original(*args, **kwargs)

    return release_hook


def _flush_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    where = f"kv_flush:{entry.target}"

    def flush_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        ok = original(*args, **kwargs)
        if ok and args:
            try:
                rt.on_flush_cache(args[0])
            except Exception as e:
                rt.note_error(where, e)
        return ok

    return flush_hook


def _idle_hook(entry: HookEntry, rt: ProbeRuntime) -> Hook:
    where = f"idle:{entry.target}"

    def idle_hook(original: Hook, *args: Any, **kwargs: Any) -> Any:
        if rt.dirty and not rt.in_worker and (rt.iterating or not rt.step_depth):
            try:
                rt.flush(None)
            except Exception as e:
                rt.dirty = False
                rt.note_error(where, e)
        return original(*args, **kwargs)

    return idle_hook


_FACTORIES: dict[str, Callable[[HookEntry, ProbeRuntime], Hook]] = {
    "step": _step_hook,
    "iteration": _iteration_hook,
    "phase": _phase_hook,
    "graph": _graph_hook,
    "step_result": _result_hook,
    "kv_release": _release_hook,
    "kv_flush": _flush_hook,
    "idle": _idle_hook,
}
