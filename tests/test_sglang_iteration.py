"""The step record as the scheduler's whole iteration (issue 29, items 2 and 6): against
SGLang 0.5.23's source (``ast``, no server) and with the test doubles of
``test_sglang_hooks`` driven in the order of SGLang's two event loops.

SGLang runs no overlap scheduler with a speculative CPU server, so what only the overlap
loop does (the flush when a request finishes while the next step runs, the overshoot step,
the context of a batch without a host copy of its lengths) is checked here: the source
facts the hooks rely on, and the hooks on doubles in that order. ``FakeCuda`` is a test
double of CUDA events (no GPU here): an event recorded while a step is in flight completes
only when that step's result is processed, and waiting on it before is recorded as a fault.
"""

from __future__ import annotations

import ast
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_sglang_hooks as th
import torch
from test_sglang_hooks import (
    FakeEagleWorker,
    FakeReq,
    FakeScheduleBatch,
    FakeTreeCache,
    around,
    busy,
    entry,
)

from pytest_specperf.engines.sglang import check, source
from pytest_specperf.engines.sglang.hooks import ProbeRuntime, make_hook
from pytest_specperf.probe.phases import SCHEDULER_PHASES
from pytest_specperf.probe.sink import read_records

SCHED = "managers.scheduler.Scheduler."
OUTPUT = "managers.scheduler_components.output_streamer.SchedulerOutputStreamer.stream_output"
RESULT = (
    "managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor.process_batch_result_decode"
)


# -- SGLang's source ------------------------------------------------------------------------------
def _root() -> Path:
    root = source.sglang_root()
    if root is None:
        pytest.skip("SGLang is not installed (pip install -e '.[sglang]')")
    return root


def _method(path: Path, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not in {path}")


def _self_calls(node: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``self.<name>(...)`` call under ``node``, in source order."""
    out = [
        (n.lineno, n.func.attr)
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
    ]
    return sorted(out)


def _loop_body(fn: ast.FunctionDef) -> list[ast.stmt]:
    (loop,) = [n for n in fn.body if isinstance(n, ast.While)]
    return loop.body


@pytest.mark.parametrize("loop", ["event_loop_normal", "event_loop_overlap"])
def test_source_every_iteration_starts_with_ingest_requests(loop: str) -> None:
    """The iteration hook's premise: ``ingest_requests`` is the first call of both loops'
    iterations (after the exit check), so its start is the iteration's start."""
    fn = _method(_root() / "srt/managers/scheduler.py", "Scheduler", loop)
    body = _loop_body(fn)
    first_calls = [c for stmt in body[:2] for c in _self_calls(stmt)]
    assert [name for _, name in first_calls][:1] == ["ingest_requests"], first_calls


def test_source_the_host_phases_are_what_the_loops_call() -> None:
    """``event_loop_normal`` calls get_next_batch_to_run, run_batch, process_batch_result
    in that order; the overlap loop launches the next batch (run_batch) before it processes
    the last one's result (pop_and_process -> process_batch_result)."""
    path = _root() / "srt/managers/scheduler.py"
    normal = [n for _, n in _self_calls(ast.Module(_loop_body(
        _method(path, "Scheduler", "event_loop_normal")), []))]  # fmt: skip
    order = [n for n in normal if n in ("get_next_batch_to_run", "run_batch",
                                        "process_batch_result")]  # fmt: skip
    assert order == ["get_next_batch_to_run", "run_batch", "process_batch_result"]
    fn = _method(path, "Scheduler", "event_loop_overlap")
    (pop,) = [n for n in fn.body if isinstance(n, ast.FunctionDef) and n.name == "pop_and_process"]
    assert "process_batch_result" in [n for _, n in _self_calls(pop)]
    body = ast.Module(_loop_body(fn), [])
    run_line = min(line for line, n in _self_calls(body) if n == "run_batch")
    pops = [
        n.lineno for n in ast.walk(body)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        and n.func.id == "pop_and_process"
    ]  # fmt: skip
    assert len(pops) == 2 and max(pops) > run_line  # the overlapped one comes after launch
    # ... and the rest of the batch's work is in the calls the host phases time
    assert "launch_batch_sample_if_needed" in [n for _, n in _self_calls(body)]


def test_source_run_batch_holds_the_waits_named_by_the_issue() -> None:
    """``launch`` (Scheduler.run_batch) contains resolve_seq_lens_cpu (overlap),
    resolve_forward_inputs, _copy_result_to_cpu and, without overlap,
    ``new_seq_lens.to("cpu")``; ``postprocess`` (process_batch_result_decode, called from
    process_batch_result) opens with ``copy_done.synchronize()``."""
    root = _root()
    text = ast.unparse(_method(root / "srt/managers/scheduler.py", "Scheduler", "run_batch"))
    for needle in ("resolve_seq_lens_cpu(batch)", "resolve_forward_inputs(batch",
                   "self._copy_result_to_cpu(", "new_seq_lens.to('cpu')",
                   "self.model_worker.forward_batch_generation("):  # fmt: skip
        assert needle in text, needle
    proc = _method(
        root / "srt/managers/scheduler_components/batch_result_processor.py",
        "SchedulerBatchResultProcessor",
        "process_batch_result_decode",
    )
    assert "result.copy_done.synchronize()" in ast.unparse(proc.body[0])
    assert "self.output_streamer.stream_output(batch.reqs" in ast.unparse(proc)


def test_source_overlap_skips_rows_of_finished_requests() -> None:
    """Item 6: the overshoot step's tokens of a request that already finished are dropped
    by SGLang (``req.finished() or req.is_retracted`` under overlap): the probe counts
    the same rows."""
    proc = _method(
        _root() / "srt/managers/scheduler_components/batch_result_processor.py",
        "SchedulerBatchResultProcessor",
        "process_batch_result_decode",
    )
    skips = [
        ast.unparse(n.test) for n in ast.walk(proc)
        if isinstance(n, ast.If) and any(isinstance(b, ast.Continue) for b in n.body)
    ]  # fmt: skip
    assert any("enable_overlap" in s and "req.finished() or req.is_retracted" in s
               for s in skips), skips  # fmt: skip


def test_source_seq_lens_cpu_may_be_absent_under_overlap() -> None:
    """Item 6: the host copy of the lengths, fresh at the step method under overlap, is
    dropped for backends that do not need it; the probe then reads the requests, whose
    tokens lag a step, and reads them again when the step's result is processed."""
    fn = ast.unparse(_method(
        _root() / "srt/managers/overlap_utils.py", "FutureMap", "resolve_seq_lens_cpu"
    ))  # fmt: skip
    assert "if not self.needs_cpu_seq_lens:" in fn and "batch.seq_lens_cpu = None" in fn


def test_sglang_check_lists_the_event_loops_with_their_host_phases() -> None:
    """``specperf sglang-check`` reads the event loops: every host phase is reached from
    ``event_loop_normal``; what no phase covers there is the iteration's ``unaccounted``."""
    _root()
    report = check.build_report(None, None, "STANDALONE")
    assert report.ok
    loops = {s.target.rsplit(".", 1)[1]: s for s in report.loops}
    assert set(loops) == {"event_loop_normal", "event_loop_overlap"}
    assert set(loops["event_loop_normal"].phases_reached) == set(SCHEDULER_PHASES)
    assert {"ingest", "schedule", "launch"} <= set(loops["event_loop_overlap"].phases_reached)
    text = check.render_text(report)
    assert "Scheduler loop sglang.srt.managers.scheduler.Scheduler.event_loop_overlap" in text


# -- test doubles: the scheduler's loops ---------------------------------------------------------
class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.index = -1
        self.t = 0

    def record(self) -> None:
        self.index = len(self.cuda.recorded)
        self.t = time.perf_counter_ns()
        self.cuda.recorded.append(self)

    def _in_flight(self) -> bool:
        start = self.cuda.in_flight_from
        return start is not None and self.index >= start

    def query(self) -> bool:
        return not self._in_flight()

    def synchronize(self) -> None:
        if self._in_flight():
            self.cuda.waited_in_flight += 1

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.t - self.t) / 1e6


class FakeCuda:
    """Test double of ``torch`` for the probe's CUDA events (``torch.cuda.Event``)."""

    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []
        self.in_flight_from: int | None = None  # events from here on: the launched step's
        self.waited_in_flight = 0
        self.cuda = self

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # torch's name
        return FakeEvent(self)


class FakeStreamer:
    def stream_output(self, reqs: list[Any], return_logprob: bool, skip_req: Any = None) -> None:
        busy(30)


class FakeProcessor:
    """SGLang's process_batch_result_decode in what the hooks read: copy_done, the skip of
    a finished row under overlap, finishing (KV release), streaming."""

    def __init__(self, finish_at: dict[str, int], overlap: bool) -> None:
        self.finish_at = finish_at
        self.overlap = overlap
        self.tree_cache = FakeTreeCache()
        self.output_streamer = FakeStreamer()
        self.sleep_s = 0.0

    def process_batch_result_decode(self, batch: FakeScheduleBatch, result: Any) -> None:
        result.copy_done.synchronize()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        for req, n in zip(batch.reqs, result.accept_lens.tolist(), strict=True):
            if self.overlap and req.finished():
                continue  # the overshoot row of a finished request
            req.output_ids += [1] * n
            if len(req.output_ids) >= self.finish_at.get(req.rid, 10**9):
                req.done = True
                th.release_kv_cache(req, self.tree_cache, checkpoint=False)
        self.output_streamer.stream_output(batch.reqs, False)


class FakeScheduler:
    """Scheduler.event_loop_normal / event_loop_overlap over the doubles."""

    def __init__(self, worker: FakeEagleWorker, reqs: list[FakeReq], finish_at: dict[str, int],
                 *, overlap: bool, cuda: FakeCuda | None = None,
                 lens_on_host: bool = True) -> None:  # fmt: skip
        self.worker = worker
        self.reqs = reqs
        self.overlap = overlap
        self.cuda = cuda
        self.lens_on_host = lens_on_host
        self.batch_result_processor = FakeProcessor(finish_at, overlap)
        self.prefilled = False

    def ingest_requests(self, stop_at_pause: bool = False) -> list[Any]:
        busy(20)
        return []

    def get_next_batch_to_run(self, running_batch: Any, last_batch: Any) -> Any:
        if not self.prefilled:
            self.prefilled = True
            return FakeScheduleBatch(self.reqs, "extend")
        live = [r for r in self.reqs if not r.done]
        if not live:
            return None
        batch = FakeScheduleBatch(live)
        if not self.lens_on_host:
            batch.seq_lens_cpu = None  # FutureMap.resolve_seq_lens_cpu, needs_cpu_seq_lens off
        batch.prepare_for_decode()
        return batch

    def run_batch(self, batch: Any, pp_proxy_tensors: Any = None) -> Any:
        busy(40)  # resolve_forward_inputs, ...
        if self.cuda is not None and self.overlap:
            self.cuda.in_flight_from = len(self.cuda.recorded)  # this step runs on
        result = self.worker.forward_batch_generation(batch)
        busy(40)  # _copy_result_to_cpu, ...
        return result

    def launch_batch_sample_if_needed(self, batch_result: Any, cur_batch: Any) -> None:
        return None

    def process_batch_result(self, batch: Any, result: Any) -> None:
        if batch.forward_mode.is_extend():
            return
        if self.cuda is not None and result is self._in_flight_result:
            self.cuda.in_flight_from = None  # the step is done (its copy synchronized)
        self.batch_result_processor.process_batch_result_decode(batch, result)

    def on_idle(self) -> None:
        return None

    _in_flight_result: Any = None

    def run(self) -> None:
        if self.overlap:
            self._overlap()
        else:
            self._normal()

    def _normal(self) -> None:
        while True:
            self.ingest_requests()
            batch = self.get_next_batch_to_run(None, None)
            if batch is None:
                self.on_idle()
                self.ingest_requests()  # the next iteration starts (and ends the last)
                self.on_idle()
                return
            result = self.run_batch(batch)
            self.process_batch_result(batch, result)

    def _overlap(self) -> None:
        queue: list[tuple[Any, Any]] = []
        last = None
        while True:
            self.ingest_requests()
            batch = self.get_next_batch_to_run(None, last)
            if batch is not None:
                result = self.run_batch(batch)
                self._in_flight_result = result
                queue.append((batch, result))
            if last is not None:
                b, r = queue.pop(0)
                self.process_batch_result(b, r)
            elif batch is None:
                self.on_idle()
                self.ingest_requests()
                self.on_idle()
                return
            self.launch_batch_sample_if_needed(None, batch)
            last = batch


def _install(rt: ProbeRuntime, mp: pytest.MonkeyPatch) -> None:
    for name, suffix in (
        ("build_eagle_verify_input", "speculative.eagle_worker_common.build_eagle_verify_input"),
        ("eagle_prepare_for_verify", "speculative.eagle_utils.eagle_prepare_for_verify"),
        ("eagle_sample", "speculative.eagle_utils.eagle_sample"),
        ("release_kv_cache", "mem_cache.common.release_kv_cache"),
        ("prepare_for_draft_extend", "speculative.eagle_worker_common.prepare_for_draft_extend"),
    ):
        mp.setattr(th, name, around(getattr(th, name), make_hook(entry(suffix), rt)))
    for cls, name, suffix in (
        (FakeEagleWorker, "forward_batch_generation",
         "speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
        (FakeEagleWorker, "draft", "speculative.eagle_worker_v2.EagleDraftWorker.draft"),
        (FakeEagleWorker, "verify", "speculative.eagle_worker_v2.EAGLEWorkerV2.verify"),
        (FakeEagleWorker, "_draft_extend_for_decode",
         "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"),
        (FakeScheduleBatch, "prepare_for_decode",
         "managers.schedule_batch.ScheduleBatch.prepare_for_decode"),
        (FakeScheduler, "ingest_requests", SCHED + "ingest_requests"),
        (FakeScheduler, "get_next_batch_to_run", SCHED + "get_next_batch_to_run"),
        (FakeScheduler, "run_batch", SCHED + "run_batch"),
        (FakeScheduler, "launch_batch_sample_if_needed", SCHED + "launch_batch_sample_if_needed"),
        (FakeScheduler, "process_batch_result", SCHED + "process_batch_result"),
        (FakeScheduler, "on_idle", SCHED + "on_idle"),
        (FakeStreamer, "stream_output", OUTPUT),
        (FakeProcessor, "process_batch_result_decode", RESULT),
    ):  # fmt: skip
        mp.setattr(cls, name, around(getattr(cls, name), make_hook(entry(suffix), rt)))


@pytest.fixture
def make_rt(tmp_path: Path) -> Iterator[Any]:
    mp = pytest.MonkeyPatch()

    def make(sub: str, cuda: FakeCuda | None = None) -> ProbeRuntime:
        mp.undo()
        d = tmp_path / sub
        d.mkdir()
        rt = ProbeRuntime(d, rank=0, use_cuda=cuda is not None)
        if cuda is not None:
            rt.probe._torch = cuda  # the test double of torch's CUDA events
        _install(rt, mp)
        return rt

    yield make
    mp.undo()


def _records(rt: ProbeRuntime, rid: str) -> list[Any]:
    assert rt.run_dir is not None
    return read_records(rt.run_dir, rids={rid})


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_unit_a_record_spans_the_iteration_with_named_host_phases(
    make_rt: Any, overlap: bool
) -> None:
    rt = make_rt("run")
    sched = FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r", 100)], {"r": 12},
                          overlap=overlap)  # fmt: skip
    sched.run()
    recs = _records(rt, "r")
    assert len(recs) == 4  # 12 tokens at 3 a step
    assert [r.accepted_tokens for r in recs] == [3, 3, 3, 3]
    for r in recs:
        assert r.mode == "decode" and r.rids == ["r"]
        for phase in ("ingest", "schedule", "launch", "draft", "verify", "kv_commit"):
            assert r.host_ns[phase] > 0, (phase, r.host_ns)
        assert sum(r.host_ns.values()) + r.unaccounted_ns == r.step_ns
        # run_batch's busy work around the step method (80 us) is launch, the step
        # method's own time is not
        assert r.host_ns["launch"] >= 70_000
    if not overlap:  # the step's own result is processed in its iteration
        assert all(r.host_ns["postprocess"] > 0 and r.host_ns["output"] > 0 for r in recs)
    else:  # the last result is processed in an iteration that runs no step (no record)
        assert all(r.host_ns["postprocess"] > 0 for r in recs[1:])


def test_unit_a_sleep_in_result_processing_is_postprocess(make_rt: Any) -> None:
    base = make_rt("plain")
    FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r", 100)], {"r": 15},
                  overlap=False).run()  # fmt: skip
    plain = _records(base, "r")
    slow = make_rt("slow")
    sched = FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r", 100)], {"r": 15},
                          overlap=False)  # fmt: skip
    sched.batch_result_processor.sleep_s = 0.02
    sched.run()
    slept = _records(slow, "r")

    def med(recs: list[Any], key: str) -> float:
        return statistics.median(
            (r.unaccounted_ns if key == "unaccounted" else r.host_ns[key]) for r in recs
        )

    assert med(slept, "postprocess") - med(plain, "postprocess") >= 19e6
    assert abs(med(slept, "unaccounted") - med(plain, "unaccounted")) < 5e6


def test_unit_overlap_flush_never_waits_on_the_launched_step(make_rt: Any) -> None:
    """Item 6: a request finishing while the next step runs (overlap) flushes through its
    own last step only."""
    cuda = FakeCuda()
    rt = make_rt("run", cuda)
    reqs = [FakeReq("a", 64), FakeReq("b", 32)]
    FakeScheduler(FakeEagleWorker(accept=2), reqs, {"a": 4, "b": 8}, overlap=True,
                  cuda=cuda).run()  # fmt: skip
    assert cuda.waited_in_flight == 0
    a, b = _records(rt, "a"), _records(rt, "b")
    assert len(a) == 2 and len(b) == 4
    # the overshoot step launched for both before "a" finished: b's tokens only
    assert [r.accepted_tokens for r in b] == [4, 4, 2, 2]
    assert [r.rids for r in b] == [["a", "b"], ["a", "b"], ["b"], ["b"]]


def test_unit_the_old_flush_waited_on_the_launched_step(make_rt: Any) -> None:
    """The same double shows the fault of item 6 when the flush is asked for all steps:
    the test double can tell (this test fails if FakeCuda cannot)."""
    cuda = FakeCuda()
    rt = make_rt("run", cuda)
    original = rt.flush
    rt.flush = lambda through=None: original(None)  # type: ignore[method-assign]
    FakeScheduler(FakeEagleWorker(accept=2), [FakeReq("a", 64), FakeReq("b", 32)],
                  {"a": 4, "b": 8}, overlap=True, cuda=cuda).run()  # fmt: skip
    assert cuda.waited_in_flight > 0


def test_unit_context_under_overlap_does_not_lag(make_rt: Any) -> None:
    """Item 6: without a host copy of the lengths, the context is read from the requests
    when the step's result is processed: the same figures with and without overlap."""
    got = {}
    for overlap in (False, True):
        rt = make_rt(f"run-{overlap}")
        FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r", 100)], {"r": 15},
                      overlap=overlap, lens_on_host=False).run()  # fmt: skip
        got[overlap] = [r.context_len for r in _records(rt, "r")]
    assert got[False] == [100, 103, 106, 109, 112]
    assert got[True] == got[False]


def test_unit_device_gap_pairs_the_forwards_of_consecutive_steps(make_rt: Any) -> None:
    """The device gap of a step runs from the previous step method's end event to this
    one's start event (both recorded on the stream current at the call). With
    the test double's events (completed when recorded) it is the host time between the
    calls: the 20 ms result processing in between. On a GPU the events complete when the
    stream reaches them, so it is the device's idle time; not yet run on a GPU."""
    cuda = FakeCuda()
    rt = make_rt("run", cuda)
    sched = FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r", 100)], {"r": 12},
                          overlap=False, cuda=cuda)  # fmt: skip
    sched.batch_result_processor.sleep_s = 0.02
    sched.run()
    assert rt.run_dir is not None
    recs = [r for r in read_records(rt.run_dir, mode="decode")]
    assert [r.device_gap_ns is None for r in recs] == [False] * 4  # prefill's forward first
    assert all(r.device_gap_ns is not None and r.device_gap_ns >= 20e6 for r in recs[1:])


def test_unit_accept_len_counted_from_live_rows_only() -> None:
    """accepted_tokens of a step whose batch carries a finished row (overlap)."""
    from pytest_specperf.engines.sglang.hooks import accepted_tokens

    class R:
        accept_lens = torch.tensor([3, 2, 4])
        copy_done = None

    assert accepted_tokens(R()) == 9
    assert accepted_tokens(R(), {0, 2}) == 7


def test_unit_bottleneck_names_the_scheduler_host_work() -> None:
    """A host-bound step whose time is the scheduler's result processing says so, with
    the phases (the founding incident: 192 ms a step, GPU idle)."""
    from pytest_specperf.judging.bottleneck import StepFigures, classify

    fig = StepFigures(
        step_ms=192.0,
        host_ms={
            "ingest": 1.0,
            "schedule": 3.0,
            "launch": 6.0,
            "verify": 20.0,
            "postprocess": 150.0,
            "output": 2.0,
        },
        device_ms={"verify": 18.0, "draft": 4.0},
        unaccounted_ms=10.0,
    )
    b = classify(fig)
    assert b.kind == "host-bound"
    text = " | ".join(b.reasons)
    assert "largest host phase: postprocess 150.0 ms (78%)" in text
    assert (
        "the scheduler's own host work 162.0 ms (84%): postprocess 150.0 ms, launch 6.0 ms, "
        "schedule 3.0 ms, output 2.0 ms, ingest 1.0 ms"
    ) in text
    cpu = classify(StepFigures(step_ms=10.0, host_ms={"draft": 4.0, "verify": 5.0}))
    assert "scheduler" not in " | ".join(cpu.reasons)  # the embedded engine has none


# -- item 3: one meaning per phase -----------------------------------------------------------
#: Calls that run the draft model (a forward of its runner, or a replay of a draft graph).
DRAFT_FORWARDS = re.compile(
    r"(draft_runner|draft_model_runner|draft_runner_list\[[^\]]*\])\.forward\("
    r"|cuda_graph_runner(_for_draft_extend)?\.execute\(|\.replay\("
)


def test_source_draft_model_forwards_are_draft_for_every_eagle_worker() -> None:
    """A draft-model slowdown reads as ``draft`` whatever the algorithm: every mapped
    draft/kv_commit method of the EAGLE-style workers that runs the draft model (its
    runner's forward or a draft graph) is ``draft``; ``kv_commit`` ones run none."""
    from pytest_specperf.engines.sglang.callgraph import CallGraph
    from pytest_specperf.engines.sglang.phase_map import load_builtin
    from pytest_specperf.engines.sglang.source import SourceTree

    graph = CallGraph(SourceTree(_root()))
    families = {"eagle", "eagle-draft", "eagle-multi-layer", "frozen-kv-mtp"}
    seen = {}
    for e in load_builtin("0.5.23").active():
        if e.role != "phase" or e.phase not in ("draft", "kv_commit") or e.family not in families:
            continue
        d = graph.definition(e.target)
        assert d is not None, e.target
        text = ast.unparse(d.node)
        seen[e.target.rsplit(".", 2)[-2] + "." + e.target.rsplit(".", 1)[1]] = (
            e.phase,
            DRAFT_FORWARDS.search(text) is not None,
        )
    assert seen["EagleDraftWorker._draft_extend_for_decode"] == ("draft", True)
    assert seen["MultiLayerEagleDraftWorker._draft_extend_for_decode"] == ("draft", True)
    assert seen["FrozenKVMTPDraftWorker._draft_extend_for_decode"] == ("kv_commit", False)
    forwards_in_kv_commit = [
        t for t, (phase, runs) in seen.items() if phase == "kv_commit" and runs
    ]
    assert forwards_in_kv_commit == []


def test_unit_bottleneck_shows_the_device_gap_beside_the_scheduler_host_work() -> None:
    """On a GPU, the device's idle time between steps is named beside what the host did
    (figures as a GPU run would record them; no GPU run has checked them yet)."""
    from pytest_specperf.judging.bottleneck import StepFigures, classify

    fig = StepFigures(
        step_ms=192.0,
        host_ms={
            "ingest": 1.0,
            "schedule": 3.0,
            "launch": 6.0,
            "verify": 20.0,
            "postprocess": 150.0,
            "output": 2.0,
        },
        device_ms={"verify": 18.0, "draft": 4.0},
        unaccounted_ms=10.0,
        device_gap_ms=158.0,
    )
    b = classify(fig)
    assert b.figures["device_gap_ms"] == 158.0
    assert (
        "device idle 158.0 ms (82%) between one step's forward and the next, while the "
        "scheduler's own host work 162.0 ms (84%): postprocess 150.0 ms"
    ) in " | ".join(b.reasons)


def test_unit_strict_names_a_mapped_host_phase_that_never_timed() -> None:
    """A scheduler host phase has samples only where some step timed it: mapped (its hook
    installed) and absent is silent, as a mapped phase at 0 ms in every step is."""
    from types import SimpleNamespace

    from pytest_specperf.judging.strict import silent_phases

    run = SimpleNamespace(samples={"step": [5.0, 5.0], "verify": [2.0, 2.0], "draft": [0.0, 0.0]})
    outcome: Any = SimpleNamespace(run=run)
    assert silent_phases(outcome, {"verify", "draft", "postprocess"}) == ["draft", "postprocess"]
    assert silent_phases(outcome, {"verify"}) == []


def test_unit_host_stall_canary_lands_in_unaccounted_inside_the_iteration(make_rt: Any) -> None:
    """``--specperf-inject host_stall=MS`` spins before verify outside every named phase;
    inside an iteration verify is entered from the step method (under ``launch``), and the
    spin still counts as ``unaccounted``, not ``launch``."""
    from pytest_specperf.probe.inject import Injector, parse_inject

    rt = make_rt("run")
    rt.probe._injector = Injector(parse_inject("host_stall=5"))
    FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r", 100)], {"r": 9},
                  overlap=False).run()  # fmt: skip
    recs = _records(rt, "r")
    assert len(recs) == 3
    for r in recs:
        assert r.unaccounted_ns >= 4.5e6, r
        assert r.host_ns["launch"] < 2e6, r


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_unit_a_canary_switched_between_requests_holds_from_the_next_prefill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """With the iteration as the record, the prefill's iteration is described after its
    clock started: the control file is looked at when the next iteration (the request's
    first decode step) starts, so a canary switched between two short requests holds from
    the second one's first decode step."""
    from pytest_specperf.probe.inject import (
        CONTROL_EVERY_STEPS,
        InjectControl,
        parse_inject,
        write_control,
    )

    rt = ProbeRuntime(tmp_path, rank=0, use_cuda=False,
                      control=InjectControl(tmp_path, device="cpu"))  # fmt: skip
    _install(rt, monkeypatch)
    FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r1", 100)], {"r1": 9},
                  overlap=overlap).run()  # fmt: skip
    first = _records(rt, "r1")
    assert 0 < len(first) < CONTROL_EVERY_STEPS
    write_control(tmp_path, parse_inject("host_stall=2"))
    FakeScheduler(FakeEagleWorker(accept=3), [FakeReq("r2", 100)], {"r2": 9},
                  overlap=overlap).run()  # fmt: skip
    th.assert_switched_at_the_second_request(first, _records(rt, "r2"))
    assert rt.errors == {}
