"""Unit tests of the in-scheduler hook functions, on small test doubles of SGLang objects.

The doubles (``Fake*``) carry only what the hooks read; tensors are real torch tensors.
Hooks are built from the real built-in phase map entries and wrapped the way SGLang's
``HookRegistry`` wraps AROUND hooks (``hook(original_fn, *args, **kwargs)``), so these
tests run the same code the scheduler runs, without SGLang or a GPU.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_specperf.engines.sglang.hooks import (
    DeferredSink,
    ProbeRuntime,
    accepted_tokens,
    make_hook,
)
from pytest_specperf.engines.sglang.phase_map import HookEntry, load_builtin
from pytest_specperf.probe.inject import (
    CONTROL_EVERY_STEPS,
    InjectControl,
    parse_inject,
    write_control,
)
from pytest_specperf.probe.record import GraphCount, StepRecord
from pytest_specperf.probe.sink import read_records

MAP = load_builtin("0.5.23").by_target()
S = "sglang.srt."


def entry(suffix: str) -> HookEntry:
    return MAP[S + suffix]


def around(original: Callable[..., Any], hook: Callable[..., Any]) -> Callable[..., Any]:
    """What HookRegistry._wrap_fn does for HookType.AROUND."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    return wrapper


def patch(cls: type, name: str, e: HookEntry, rt: ProbeRuntime) -> None:
    setattr(cls, name, around(getattr(cls, name), make_hook(e, rt)))


def busy(us: float = 20.0) -> None:
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


# -- test doubles ---------------------------------------------------------------------------
class FakeForwardMode:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_extend(self) -> bool:
        return self.kind == "extend"

    def is_idle(self) -> bool:
        return self.kind == "idle"


class FakeKvInfo:
    def __init__(self, row: int, committed: int) -> None:
        self.req_pool_idx = row
        self.kv_committed_len = committed


class FakeReq:
    def __init__(self, rid: str, prompt_len: int, row: int = 0) -> None:
        self.rid = rid
        self.origin_input_ids = [7] * prompt_len
        self.output_ids: list[int] = []
        self.kv = FakeKvInfo(row, prompt_len)
        self.committed = prompt_len  # device-side length (ahead of output_ids under overlap)
        self.done = False

    def finished(self) -> bool:
        return self.done


class FakeScheduleBatch:
    def __init__(self, reqs: list[FakeReq], kind: str = "decode") -> None:
        self.reqs = reqs
        self.forward_mode = FakeForwardMode(kind)
        self.is_extend_in_batch = False
        self.seq_lens_cpu = torch.tensor([r.committed for r in reqs])

    def prepare_for_decode(self) -> None:
        busy()


class FakeCopyDone:
    def __init__(self) -> None:
        self.waited = 0

    def synchronize(self) -> None:
        self.waited += 1


class FakeResult:
    def __init__(self, accept: list[int]) -> None:
        self.accept_lens = torch.tensor(accept, dtype=torch.int32)
        self.copy_done = FakeCopyDone()


class FakeModelRunner:
    def __init__(self, is_draft_worker: bool) -> None:
        self.is_draft_worker = is_draft_worker

    def forward(self, forward_batch: Any, skip_attn_backend_init: Any = None) -> str:
        busy()
        return "out"


class FakeGraphRunner:
    def __init__(self, model_runner: FakeModelRunner) -> None:
        self.model_runner = model_runner

    def execute(self, forward_batch: Any, pp_proxy_tensors: Any = None) -> str:
        busy()
        return "replayed"


class FakeGraphRunnerChild(FakeGraphRunner):
    def execute(self, forward_batch: Any, pp_proxy_tensors: Any = None) -> str:
        return super().execute(forward_batch, pp_proxy_tensors)


class FakeEagerRunner:
    def __init__(self, model_runner: FakeModelRunner) -> None:
        self.model_runner = model_runner

    def execute(self, forward_batch: Any, pp_proxy_tensors: Any = None, **kwargs: Any) -> str:
        busy()
        return "eager"


class FakeEagleWorker:
    """An EAGLE-V2-shaped worker: draft, build verify input, verify (prepare, forward,
    accept), draft extend. ``eager_target`` makes the target forward run eagerly."""

    def __init__(self, accept: int = 3, eager_target: bool = False) -> None:
        self.accept = accept
        self.target_runner = (FakeEagerRunner if eager_target else FakeGraphRunner)(
            FakeModelRunner(False))
        self.draft_runner = FakeGraphRunner(FakeModelRunner(True))

    def forward_batch_generation(self, batch: FakeScheduleBatch, on_publish: Any = None) -> Any:
        if batch.forward_mode.is_extend():
            busy()
            return FakeResult([1] * len(batch.reqs))
        self.draft(batch)
        self.verify(batch)
        self._draft_extend_for_decode(batch, None)
        for r in batch.reqs:
            r.committed += self.accept
        return FakeResult([self.accept] * len(batch.reqs))

    def draft(self, batch: Any) -> None:
        self.draft_runner.execute(None)
        build_eagle_verify_input(batch)

    def verify(self, batch: Any) -> None:
        eagle_prepare_for_verify(batch)
        self.target_runner.execute(None)
        eagle_sample(batch)

    def _draft_extend_for_decode(self, batch: Any, batch_result: Any) -> None:
        prepare_for_draft_extend(batch)  # KV locations: kv_commit
        busy()  # the draft model's forward over the accepted tokens: draft


def build_eagle_verify_input(batch: Any) -> None:
    busy()


def eagle_prepare_for_verify(batch: Any) -> None:
    busy()


def eagle_sample(batch: Any) -> None:
    busy()


class FakeResultProcessor:
    def __init__(self, rt: ProbeRuntime, finish_at: dict[str, int]) -> None:
        self.finish_at = finish_at  # rid -> number of output tokens that finishes it
        self.tree_cache = FakeTreeCache()

    def process_batch_result_decode(self, batch: FakeScheduleBatch, result: Any) -> None:
        for req, n in zip(batch.reqs, result.accept_lens.tolist(), strict=True):
            if req.done:
                continue  # the overshoot step of a request that already finished
            req.output_ids += [1] * n
            if len(req.output_ids) >= self.finish_at.get(req.rid, 10**9):
                req.done = True
                release_kv_cache(req, self.tree_cache, checkpoint=False)


class FakeTreeCache:
    def __init__(self) -> None:
        self.req_to_token_pool = type("FakeReqToTokenPool", (), {})()
        self.req_to_token_pool.req_to_token = torch.arange(4 * 64).reshape(4, 64) + 1
        self.token_to_kv_pool_allocator = type("FakeAllocator", (), {"page_size": 1})()
        self.page_size = 1


def release_kv_cache(req: Any, tree_cache: Any, *, checkpoint: bool) -> None:
    return None


class FakeSchedulerLoop:
    """Drives the fakes in the order SGLang's overlap scheduler does: prepare and launch
    step n+1, then process the result of step n."""

    def __init__(self, rt: ProbeRuntime, worker: FakeEagleWorker, reqs: list[FakeReq],
                 finish_at: dict[str, int]) -> None:
        self.rt = rt
        self.worker = worker
        self.reqs = reqs
        self.proc = FakeResultProcessor(rt, finish_at)

    def on_idle(self) -> None:
        return None

    def run(self, *, overlap: bool = True) -> int:
        self.worker.forward_batch_generation(FakeScheduleBatch(self.reqs, "extend"))
        pending: list[tuple[FakeScheduleBatch, Any]] = []
        decode_steps = 0
        while True:
            live = [r for r in self.reqs if not r.done]
            if not live and not pending:
                self.on_idle()
                return decode_steps
            if live:
                batch = FakeScheduleBatch(live)
                batch.prepare_for_decode()
                result = self.worker.forward_batch_generation(batch)
                decode_steps += 1
                pending.append((batch, result))
            if not overlap or len(pending) > 1 or not live:
                b, r = pending.pop(0)
                self.proc.process_batch_result_decode(b, r)


@pytest.fixture
def rt(tmp_path: Path) -> ProbeRuntime:
    return ProbeRuntime(tmp_path, rank=0, labels={"engine": "sglang"}, use_cuda=False)


@pytest.fixture
def hooked(rt: ProbeRuntime, monkeypatch: pytest.MonkeyPatch) -> ProbeRuntime:
    """Install hooks from the built-in map on the test doubles (undone after the test)."""
    return _install_hooks(rt, monkeypatch)


def _install_hooks(rt: ProbeRuntime, monkeypatch: pytest.MonkeyPatch) -> ProbeRuntime:
    g = globals()
    for name, suffix in (
        ("build_eagle_verify_input", "speculative.eagle_worker_common.build_eagle_verify_input"),
        ("eagle_prepare_for_verify", "speculative.eagle_utils.eagle_prepare_for_verify"),
        ("eagle_sample", "speculative.eagle_utils.eagle_sample"),
        ("release_kv_cache", "mem_cache.common.release_kv_cache"),
        ("prepare_for_draft_extend", "speculative.eagle_worker_common.prepare_for_draft_extend"),
    ):
        monkeypatch.setitem(g, name, around(g[name], make_hook(entry(suffix), rt)))
    for cls, name, suffix in (
        (FakeEagleWorker, "forward_batch_generation",
         "speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
        (FakeEagleWorker, "draft", "speculative.eagle_worker_v2.EagleDraftWorker.draft"),
        (FakeEagleWorker, "verify", "speculative.eagle_worker_v2.EAGLEWorkerV2.verify"),
        (FakeEagleWorker, "_draft_extend_for_decode",
         "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"),
        (FakeScheduleBatch, "prepare_for_decode",
         "managers.schedule_batch.ScheduleBatch.prepare_for_decode"),
        (FakeGraphRunner, "execute",
         "model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.execute"),
        (FakeGraphRunnerChild, "execute",
         "speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.execute"),
        (FakeEagerRunner, "execute", "model_executor.runner.eager_runner.EagerRunner.execute"),
        (FakeModelRunner, "forward", "model_executor.model_runner.ModelRunner.forward"),
        (FakeSchedulerLoop, "on_idle", "managers.scheduler.Scheduler.on_idle"),
        (FakeResultProcessor, "process_batch_result_decode",
         "managers.scheduler_components.batch_result_processor."
         "SchedulerBatchResultProcessor.process_batch_result_decode"),
    ):
        monkeypatch.setattr(cls, name, around(getattr(cls, name), make_hook(entry(suffix), rt)))
    return rt


# -- whole steps ------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_unit_decode_steps_recorded_with_phases_accept_and_schedule(
    hooked: ProbeRuntime, tmp_path: Path, overlap: bool
) -> None:
    reqs = [FakeReq("r1", 100)]
    loop = FakeSchedulerLoop(hooked, FakeEagleWorker(accept=3), reqs, {"r1": 12})
    steps = loop.run(overlap=overlap)
    recs = read_records(tmp_path, rids={"r1"})
    # the request finished after 4 steps of 3 tokens; under overlap SGLang ran a 5th
    assert steps == (5 if overlap else 4)
    assert len(recs) == 4, [r.rids for r in read_records(tmp_path)]
    assert [r.accepted_tokens for r in recs] == [3, 3, 3, 3]
    assert [r.context_len for r in recs] == [100, 103, 106, 109]
    for r in recs:
        assert r.mode == "decode" and r.batch_size == 1 and r.rank == 0
        assert r.labels == {"engine": "sglang"}
        for phase in ("schedule", "draft", "build_verify_input", "prepare_for_verify",
                      "verify", "accept", "kv_commit"):
            assert r.host_ns[phase] > 0, (phase, r.host_ns)
        assert r.step_ns == sum(r.host_ns.values()) + r.unaccounted_ns
        assert r.graphs["FakeGraphRunner[draft]"].replay == 1
        assert r.graphs["FakeGraphRunner"].replay == 1
        assert "FakeEagerRunner" not in r.graphs
    extend = read_records(tmp_path, rids={"r1"}, mode="extend")
    assert len(extend) == 1 and extend[0].accepted_tokens == 0
    if overlap:  # the overshoot step is recorded without the finished request
        everything = read_records(tmp_path)
        assert len(everything) == 5 and everything[-1].rids == []
    assert hooked.errors == {}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "sync"])
def test_unit_a_canary_switched_between_requests_holds_from_the_next_prefill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """The scheduler's probe looks at the control file at each prefill, not only every
    CONTROL_EVERY_STEPS decode steps: a canary switched between two short requests holds
    from the second one's first decode step (the period alone would leave it stale)."""
    rt = ProbeRuntime(tmp_path, rank=0, labels={"engine": "sglang"}, use_cuda=False,
                      control=InjectControl(tmp_path, device="cpu"))  # fmt: skip
    _install_hooks(rt, monkeypatch)
    FakeSchedulerLoop(rt, FakeEagleWorker(accept=3), [FakeReq("r1", 100)], {"r1": 9}).run(
        overlap=overlap)  # fmt: skip
    first = read_records(tmp_path, rids={"r1"})
    assert 0 < len(first) < CONTROL_EVERY_STEPS
    write_control(tmp_path, parse_inject("host_stall=2"))
    FakeSchedulerLoop(rt, FakeEagleWorker(accept=3), [FakeReq("r2", 100)], {"r2": 9}).run(
        overlap=overlap)  # fmt: skip
    assert_switched_at_the_second_request(first, read_records(tmp_path, rids={"r2"}))
    assert rt.errors == {}


def assert_switched_at_the_second_request(first: list[StepRecord],
                                          second: list[StepRecord]) -> None:  # fmt: skip
    """The first request's decode steps ran without the canary, every one of the second's
    under ``host_stall=2`` (labelled, and really stalled: the spin is ``unaccounted``)."""
    assert len(second) == len(first)
    assert all(r.labels.get("inject") is None for r in first)
    assert all(r.labels.get("inject") == "host_stall=2" for r in second)
    assert all(r.unaccounted_ns >= 2_000_000 for r in second)


def test_unit_records_are_on_disk_when_the_request_finishes(hooked: ProbeRuntime,
                                                            tmp_path: Path) -> None:
    """Written before SGLang streams the final output: no wait needed by the plugin."""
    seen: list[int] = []
    original = FakeResultProcessor.process_batch_result_decode

    def spy(self: FakeResultProcessor, batch: Any, result: Any) -> None:
        was_done = [r.done for r in batch.reqs]
        original(self, batch, result)
        if [r.done for r in batch.reqs] != was_done:  # a request finished in this step
            seen.append(len(read_records(tmp_path, rids={"r1"})))

    FakeResultProcessor.process_batch_result_decode = spy  # type: ignore[method-assign]
    try:
        FakeSchedulerLoop(hooked, FakeEagleWorker(accept=2), [FakeReq("r1", 50)],
                          {"r1": 6}).run()
    finally:
        FakeResultProcessor.process_batch_result_decode = original  # type: ignore[method-assign]
    assert seen == [3]


def test_unit_batch_of_two_finishing_at_different_steps(hooked: ProbeRuntime,
                                                        tmp_path: Path) -> None:
    reqs = [FakeReq("a", 64), FakeReq("b", 32)]
    FakeSchedulerLoop(hooked, FakeEagleWorker(accept=2), reqs, {"a": 4, "b": 8}).run()
    a, b = read_records(tmp_path, rids={"a"}), read_records(tmp_path, rids={"b"})
    assert len(a) == 2 and len(b) == 4
    # step 3 was launched for both before "a" was known to be finished (overlap): the
    # batch really had 2 rows, but it is no step of "a" any more, and of its 4 tokens
    # SGLang keeps only b's 2 (it skips a finished row): those are the step's
    assert [r.batch_size for r in b] == [2, 2, 2, 1]
    assert [r.accepted_tokens for r in b] == [4, 4, 2, 2]
    assert [r.rids for r in b] == [["a", "b"], ["a", "b"], ["b"], ["b"]]
    assert b[0].context_len == 64  # the longest request of the batch


def test_unit_eager_target_forward_is_counted(hooked: ProbeRuntime, tmp_path: Path) -> None:
    FakeSchedulerLoop(hooked, FakeEagleWorker(eager_target=True), [FakeReq("r", 10)],
                      {"r": 3}).run(overlap=False)
    (rec,) = read_records(tmp_path, rids={"r"})
    assert rec.graphs["FakeEagerRunner"].eager == 1
    assert "FakeGraphRunner" not in rec.graphs


def test_unit_idle_batches_are_not_steps(hooked: ProbeRuntime, tmp_path: Path) -> None:
    FakeEagleWorker().forward_batch_generation(FakeScheduleBatch([], "idle"))
    hooked.flush(None)
    assert read_records(tmp_path, mode="decode") == []
    assert read_records(tmp_path, mode="extend") == []
    assert hooked.step_no == 0


def test_unit_nested_graph_runners_count_once(hooked: ProbeRuntime, tmp_path: Path) -> None:
    """A runner subclass calling its (also hooked) base's execute is one replay."""
    runner = FakeGraphRunnerChild(FakeModelRunner(True))
    hooked.probe.begin_step(context_len=1, batch_size=1, rids=["x"])
    hooked.step_depth = 1
    runner.execute(None)
    hooked.end(None)
    hooked.flush(None)
    (r,) = read_records(tmp_path, mode="decode")
    assert r.graphs == {"FakeGraphRunnerChild[draft]": GraphCount(replay=1, eager=0)}


def test_unit_conditional_phases_for_dflash(rt: ProbeRuntime, tmp_path: Path) -> None:
    """ModelRunner.forward is `draft` only for a draft runner outside other phases;
    TpModelWorker.forward_batch_generation is `verify` only with is_verify=True."""

    class FakeTpWorker:
        def forward_batch_generation(self, batch: Any, forward_batch: Any = None,
                                     pp_proxy_tensors: Any = None,
                                     is_verify: bool = False) -> None:
            busy()

    draft_mr, target_mr, tp = FakeModelRunner(True), FakeModelRunner(False), FakeTpWorker()
    fwd = make_hook(entry("model_executor.model_runner.ModelRunner.forward"), rt)
    tpf = make_hook(entry("managers.tp_worker.TpModelWorker.forward_batch_generation"), rt)
    kv = make_hook(entry("speculative.dflash_worker_v2.DFlashWorkerV2."
                         "_append_target_hidden_to_draft_kv_by_loc"), rt)
    rt.probe.begin_step(context_len=5, batch_size=1, rids=["d"])
    rt.step_depth = 1
    fwd(FakeModelRunner.forward, draft_mr, None)  # top level, draft runner: draft
    fwd(FakeModelRunner.forward, target_mr, None)  # target runner: nothing
    tpf(FakeTpWorker.forward_batch_generation, tp, None, None, None, True)  # positional
    tpf(FakeTpWorker.forward_batch_generation, tp, None, is_verify=False)  # not verify
    kv(lambda *a, **k: fwd(FakeModelRunner.forward, draft_mr, None), None)  # nested: kv_commit
    rt.cur_mode = "decode"
    rt.end(None)
    rt.flush(None)
    (r,) = read_records(tmp_path, rids={"d"})
    assert r.host_ns["draft"] > 0 and r.host_ns["verify"] > 0 and r.host_ns["kv_commit"] > 0
    # the nested draft-runner forward stayed in kv_commit: draft only holds one busy()
    assert r.host_ns["kv_commit"] > 10_000


def test_unit_schedule_time_is_carried_into_the_next_decode_step(rt: ProbeRuntime,
                                                                  tmp_path: Path) -> None:
    sched = make_hook(entry("managers.schedule_batch.ScheduleBatch.prepare_for_decode"), rt)
    inner = make_hook(entry("speculative.eagle_utils.eagle_prepare_for_decode"), rt)
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)

    def prep(batch: Any) -> None:
        inner(lambda b: busy(200), batch)  # nested schedule hook: counted once

    sched(prep, None)
    assert 200_000 <= rt.carry_ns < 50_000_000
    carried, carried_cpu = rt.carry_ns, rt.carry_cpu_ns
    assert 0 < carried_cpu <= carried * 1.1  # busy(): CPU time, about the wall time
    batch = FakeScheduleBatch([FakeReq("s", 10)])
    step(lambda self, b: FakeResult([2]), None, batch)
    assert rt.carry_ns == rt.carry_cpu_ns == 0
    rt.flush(None)
    (r,) = read_records(tmp_path, rids={"s"})
    assert r.host_ns["schedule"] == carried
    assert r.step_ns >= carried
    # the first step reads CPU time (every CPU_EVERY-th does): the carried CPU time is in it
    assert r.cpu_ns is not None and r.step_cpu_ns is not None
    assert r.cpu_ns["schedule"] >= carried_cpu and r.step_cpu_ns >= carried_cpu


def test_unit_mixed_batch_consumes_the_carry_of_its_prepare_for_decode(
    rt: ProbeRuntime, tmp_path: Path
) -> None:
    """Mixed chunked prefill: prepare_for_decode ran for the decode rows that were merged
    into a prefill batch; its time belongs to that (extend) step, not to the next decode
    step, which ran no prepare_for_decode of its own."""
    sched = make_hook(entry("managers.schedule_batch.ScheduleBatch.prepare_for_decode"), rt)
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)
    sched(lambda b: busy(300), None)
    carried = rt.carry_ns
    assert carried >= 300_000
    mixed = FakeScheduleBatch([FakeReq("m", 30), FakeReq("new", 500)], "extend")
    mixed.is_extend_in_batch = True
    step(lambda self, b: FakeResult([1, 1]), None, mixed)
    assert rt.carry_ns == 0
    step(lambda self, b: FakeResult([2]), None, FakeScheduleBatch([FakeReq("m", 31)]))
    rt.flush(None)
    (ext,) = read_records(tmp_path, rids={"m"}, mode="extend")
    (dec,) = read_records(tmp_path, rids={"m"}, mode="decode")
    assert ext.host_ns["schedule"] == carried and ext.step_ns >= carried
    assert dec.host_ns["schedule"] == 0 and dec.step_ns < carried


def test_unit_idle_batch_drops_the_carry(rt: ProbeRuntime) -> None:
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)
    rt.carry_ns = 1234
    step(lambda self, b: None, None, FakeScheduleBatch([], "idle"))
    assert rt.carry_ns == 0


def test_unit_nested_step_hooks_make_one_record(rt: ProbeRuntime, tmp_path: Path) -> None:
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)
    batch = FakeScheduleBatch([FakeReq("n", 3)])

    def outer(self: Any, b: Any) -> Any:
        return step(lambda s, bb: FakeResult([2]), self, b)  # a subclass calling super()

    step(outer, None, batch)
    rt.flush(None)
    assert len(read_records(tmp_path, rids={"n"})) == 1


# -- robustness --------------------------------------------------------------------------------
def test_unit_exception_in_sglang_propagates_and_closes_the_step(rt: ProbeRuntime,
                                                                 tmp_path: Path) -> None:
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)

    def boom(self: Any, b: Any) -> None:
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        step(boom, None, FakeScheduleBatch([FakeReq("x", 3)]))
    assert rt.step_depth == 0
    rt.flush(None)
    assert len(read_records(tmp_path, rids={"x"})) == 1
    assert rt.errors == {}


def test_unit_our_failure_never_reaches_sglang(rt: ProbeRuntime, tmp_path: Path) -> None:
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)

    class FakeBrokenBatch:
        forward_mode = FakeForwardMode("decode")  # but no .reqs

    assert step(lambda self, b: "served", None, FakeBrokenBatch()) == "served"
    where = next(iter(rt.errors))
    assert where.startswith("step:") and rt.errors[where][0] == 1
    assert step(lambda self, b: "again", None, FakeBrokenBatch()) == "again"
    assert rt.errors[where][0] == 2
    rt.flush(None)
    written = json.loads(next(tmp_path.glob("errors-*.json")).read_text())
    assert written[where]["count"] == 2 and "AttributeError" in written[where]["first"]


def test_unit_hooks_pass_through_outside_steps(rt: ProbeRuntime) -> None:
    for suffix in ("speculative.eagle_utils.eagle_sample",
                   "model_executor.runner.eager_runner.EagerRunner.execute",
                   "model_executor.model_runner.ModelRunner.forward"):
        hook = make_hook(entry(suffix), rt)
        assert hook(lambda *a, **k: (a, k), 1, x=2) == ((1,), {"x": 2})
    assert rt._probe is None  # nothing created outside a step


def test_unit_unknown_role_is_rejected(rt: ProbeRuntime) -> None:
    with pytest.raises(ValueError, match="no hook for role"):
        make_hook(HookEntry(target="a.b", role="disabled"), rt)


def test_unit_hook_overhead_is_microseconds(rt: ProbeRuntime) -> None:
    """Generous bounds: catches an accidental sync, allocation storm or file write."""
    phase = make_hook(entry("speculative.eagle_utils.eagle_sample"), rt)

    def f(x: int) -> int:
        return x

    def per_call(fn: Callable[[], Any], n: int = 20000) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / n / 1000

    base = per_call(lambda: f(1))
    outside = per_call(lambda: phase(f, 1)) - base
    rt.probe.begin_step(context_len=1, batch_size=1, rids=["o"])
    rt.step_depth = 1
    inside = per_call(lambda: phase(f, 1)) - base
    assert outside < 20 and inside < 50, (outside, inside)


# -- the sink ------------------------------------------------------------------------------------
def _rec(step: int, rids: list[str], mode: str = "decode") -> StepRecord:
    return StepRecord(step=step, wall_ns=step, mode=mode, rids=rids, context_len=1, batch_size=1,
                      accepted_tokens=0, step_ns=100, host_ns={"schedule": 0, "verify": 60},
                      unaccounted_ns=40)


def test_unit_deferred_sink_holds_decode_records_until_accepted(tmp_path: Path) -> None:
    sink = DeferredSink(tmp_path, max_hold=3)
    sink.note_carry(0, 25)
    sink.write(_rec(0, ["a"]))
    sink.write(_rec(1, ["a"], mode="extend"))
    sink.flush()
    assert [r.step for r in read_records(tmp_path, mode="extend")] == [1]
    assert read_records(tmp_path) == []
    sink.set_accepted(0, 4)
    sink.set_accepted(2, 5)  # arrives before its record
    sink.write(_rec(2, ["a"]))
    sink.flush()
    got = read_records(tmp_path)
    assert [(r.step, r.accepted_tokens) for r in got] == [(0, 4), (2, 5)]
    assert got[0].host_ns["schedule"] == 25 and got[0].step_ns == 125
    assert got[0].unaccounted_ns == 40


def test_unit_deferred_sink_carries_schedule_cpu_time_where_the_step_read_it(
    tmp_path: Path,
) -> None:
    """Carried schedule time is CPU work: added to the CPU times too, else ``schedule``
    would read as waiting (wall grew, CPU did not)."""
    sink = DeferredSink(tmp_path)
    with_cpu = _rec(0, ["a"])
    with_cpu.cpu_ns, with_cpu.step_cpu_ns = {"schedule": 0, "verify": 50}, 90
    sink.note_carry(0, 25, 20)
    sink.note_carry(0, 5, 4)  # two prepare_for_decode calls before one step add up
    sink.write(with_cpu)
    sink.note_carry(1, 25, 20)
    sink.write(_rec(1, ["a"]))  # a step that read no CPU time keeps none
    sink.set_accepted(0, 3)
    sink.set_accepted(1, 3)
    sink.flush()
    got = {r.step: r for r in read_records(tmp_path)}
    assert got[0].host_ns["schedule"] == 30 and got[0].step_ns == 130
    assert got[0].cpu_ns == {"schedule": 24, "verify": 50} and got[0].step_cpu_ns == 114
    assert got[1].step_ns == 125 and got[1].cpu_ns is None and got[1].step_cpu_ns is None


def test_unit_deferred_sink_expires_and_releases(tmp_path: Path) -> None:
    sink = DeferredSink(tmp_path, max_hold=2)
    for s in range(5):
        sink.write(_rec(s, ["a"]))
    sink.flush()
    assert [r.step for r in read_records(tmp_path)] == [0, 1]  # older than newest - 2
    sink.release_through(3)
    sink.flush()
    assert [r.step for r in read_records(tmp_path)] == [0, 1, 2, 3]
    assert sink.held == 1
    sink.close()
    assert [r.step for r in read_records(tmp_path)] == [0, 1, 2, 3, 4]


def test_unit_deferred_sink_strips_finished_requests_from_later_steps(tmp_path: Path) -> None:
    sink = DeferredSink(tmp_path)
    sink.write(_rec(0, ["a", "b"]))
    sink.write(_rec(1, ["a", "b"]))
    sink.request_finished("a", 0)
    sink.write(_rec(2, ["a", "b"]))  # resolved later (CUDA events): stripped too
    sink.release_through(None)
    sink.flush()
    assert [r.rids for r in read_records(tmp_path)] == [["a", "b"], ["b"], ["b"]]
    sink.write(_rec(3, ["a"], mode="extend"))  # the id reused by a new request
    sink.write(_rec(4, ["a"]))
    sink.release_through(None)
    sink.flush()
    assert read_records(tmp_path)[-1].rids == ["a"]


def test_unit_accepted_tokens_reads_host_copies_only() -> None:
    r = FakeResult([3, 2])
    assert accepted_tokens(r) == 5 and r.copy_done.waited == 1

    class FakeDeviceTensor:
        is_cuda = True

        def sum(self) -> int:
            raise AssertionError("would synchronize")

    r.accept_lens = FakeDeviceTensor()  # type: ignore[assignment]
    assert accepted_tokens(r) is None
    assert accepted_tokens(object()) is None


def test_unit_untaggable_results_are_tracked_by_id(rt: ProbeRuntime, tmp_path: Path) -> None:
    step = make_hook(entry("speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"),
                     rt)

    class FakeSlottedResult:
        __slots__ = ("accept_lens", "copy_done")

        def __init__(self) -> None:
            self.accept_lens = torch.tensor([4])
            self.copy_done = None

    res = step(lambda self, b: FakeSlottedResult(), None, FakeScheduleBatch([FakeReq("t", 2)]))
    assert rt.on_result(res) == 0
    rt.flush(None)
    assert read_records(tmp_path, rids={"t"})[0].accepted_tokens == 4


# -- multi-layer EAGLE ----------------------------------------------------------------------------
ML = "speculative.multi_layer_eagle_worker_v2."
ML_RUNNERS = "speculative.multi_layer_eagle_draft_extend_cuda_graph_runner."


class FakeMultiStepRunner:
    """MultiLayerEagleMultiStepDraftExtendCudaGraphRunner: one graph per MTP layer."""

    def replay(self, step: int) -> str:
        busy(100)
        return "topk"


class FakeOneGraphRunner(FakeMultiStepRunner):
    """The single-graph variant: one replay at step 0, the other steps from its cache."""

    def replay(self, step: int) -> str:
        if step == 0:
            busy(300)
        return "cached"


class FakeMultiLayerEagleWorker:
    """MultiLayerEagleWorkerV2-shaped: draft() organises what the previous draft extend
    proposed; the draft model runs in _draft_extend_for_decode (graphs or eager)."""

    steps = 3

    def __init__(self, runner: FakeMultiStepRunner | None) -> None:
        self.runner = runner
        self.draft_runners = [FakeEagerRunner(FakeModelRunner(True)) for _ in range(self.steps)]
        self.target_runner = FakeGraphRunner(FakeModelRunner(False))

    def forward_batch_generation(self, batch: Any) -> Any:
        self.draft(batch)
        self._draft_extend_plan_for_decode(batch)
        self.verify(batch)
        self._draft_extend_for_decode(batch, None)
        return FakeResult([2] * len(batch.reqs))

    def draft(self, batch: Any) -> None:
        self.draft_forward(None)  # bookkeeping on every path
        build_eagle_verify_input(batch)

    def draft_forward(self, forward_batch: Any) -> None:
        busy(5)

    def _draft_extend_plan_for_decode(self, batch: Any) -> None:
        busy(10)

    def verify(self, batch: Any) -> None:
        eagle_prepare_for_verify(batch)
        self.target_runner.execute(None)
        eagle_sample(batch)

    def _draft_extend_for_decode(self, batch: Any, batch_result: Any) -> None:
        prepare_for_draft_extend(batch)
        for step in range(self.steps):
            if self.runner is not None:
                self.runner.replay(step)
            else:
                self.draft_runners[step].execute(None)


def prepare_for_draft_extend(batch: Any) -> None:
    busy(30)


@pytest.fixture
def multi_layer_hooked(rt: ProbeRuntime, monkeypatch: pytest.MonkeyPatch) -> ProbeRuntime:
    g = globals()
    for name, suffix in (
        ("build_eagle_verify_input", "speculative.eagle_worker_common.build_eagle_verify_input"),
        ("eagle_prepare_for_verify", "speculative.eagle_utils.eagle_prepare_for_verify"),
        ("eagle_sample", "speculative.eagle_utils.eagle_sample"),
        ("prepare_for_draft_extend", "speculative.eagle_worker_common.prepare_for_draft_extend"),
    ):
        monkeypatch.setitem(g, name, around(g[name], make_hook(entry(suffix), rt)))
    W = FakeMultiLayerEagleWorker
    for cls, name, suffix in (
        (W, "forward_batch_generation", ML + "MultiLayerEagleWorkerV2.forward_batch_generation"),
        (W, "draft", ML + "MultiLayerEagleDraftWorker.draft"),
        (W, "verify", ML + "MultiLayerEagleWorkerV2.verify"),
        (W, "_draft_extend_plan_for_decode",
         ML + "MultiLayerEagleDraftWorker._draft_extend_plan_for_decode"),
        (W, "_draft_extend_for_decode", ML + "MultiLayerEagleDraftWorker._draft_extend_for_decode"),
        (FakeMultiStepRunner, "replay",
         ML_RUNNERS + "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner.replay"),
        (FakeOneGraphRunner, "replay",
         ML_RUNNERS + "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner.replay"),
        (FakeGraphRunner, "execute",
         "model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.execute"),
        (FakeEagerRunner, "execute", "model_executor.runner.eager_runner.EagerRunner.execute"),
    ):
        monkeypatch.setattr(cls, name, around(getattr(cls, name), make_hook(entry(suffix), rt)))
    # MultiLayerEagleDraftWorker.draft_forward has no entry any more: bookkeeping, not a forward
    assert S + ML + "MultiLayerEagleDraftWorker.draft_forward" not in MAP
    return rt


def _one_step(rt: ProbeRuntime, tmp_path: Path, worker: FakeMultiLayerEagleWorker) -> StepRecord:
    worker.forward_batch_generation(FakeScheduleBatch([FakeReq("m", 40)]))
    rt.flush(None)
    (rec,) = read_records(tmp_path, rids={"m"})
    return rec


@pytest.mark.parametrize(("runner", "label", "replays"), [
    (FakeMultiStepRunner, "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner[draft]", 3),
    (FakeOneGraphRunner, "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner[draft]", 1),
], ids=["graph-per-layer", "one-graph"])
def test_unit_multi_layer_eagle_drafts_in_the_graph_replays(
    multi_layer_hooked: ProbeRuntime, tmp_path: Path, runner: type[FakeMultiStepRunner],
    label: str, replays: int,
) -> None:
    rec = _one_step(multi_layer_hooked, tmp_path, FakeMultiLayerEagleWorker(runner()))
    assert rec.graphs == {label: GraphCount(replay=replays, eager=0),
                          "FakeGraphRunner": GraphCount(replay=1, eager=0)}
    host = rec.host_ns
    # the replays (300 us) are draft; kv_commit holds the planning and the KV-location prep
    assert host["draft"] > 300_000 and host["kv_commit"] > 40_000, host
    assert host["build_verify_input"] > 0 and host["verify"] > 0 and host["accept"] > 0
    assert multi_layer_hooked.errors == {}


def test_unit_multi_layer_eagle_eager_draft_is_counted_per_forward(
    multi_layer_hooked: ProbeRuntime, tmp_path: Path
) -> None:
    rec = _one_step(multi_layer_hooked, tmp_path, FakeMultiLayerEagleWorker(None))
    assert rec.graphs["FakeEagerRunner[draft]"] == GraphCount(replay=0, eager=3)
    assert sum(g.eager for g in rec.graphs.values()) == 3  # draft_forward is not one of them
    assert rec.host_ns["draft"] > 60_000 and rec.host_ns["kv_commit"] > 40_000


def test_unit_when_not_arg_and_arg_conditions() -> None:
    from pytest_specperf.engines.sglang.hooks import condition

    replay = entry(ML_RUNNERS + "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner.replay")
    test = condition(replay)
    assert test is not None
    assert test((None, 0), {}) and not test((None, 2), {})
    assert test((None,), {"step": 0}) and not test((None,), {"step": 1})
    verify = condition(entry("managers.tp_worker.TpModelWorker.forward_batch_generation"))
    assert verify is not None
    assert verify((None, "b"), {"is_verify": True}) and not verify((None, "b"), {})
    assert condition(entry("speculative.eagle_utils.eagle_sample")) is None
