"""Per-target hook-call counts (issue 29, item 4): the in-scheduler hooks count the calls
each phase/iteration target timed inside a step, write them beside the records at every
flush (``calls-*.json``), the backend takes their difference over the measured window, and
``--specperf-strict`` names each required target that timed none.

Hooks are built from the real built-in map and called the way SGLang's ``HookRegistry``
calls AROUND hooks; the workers they wrap are small named test doubles (``Fake*``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_specperf.engines.sglang.backend import SGLangBackend
from pytest_specperf.engines.sglang.hooks import ProbeRuntime, make_hook
from pytest_specperf.engines.sglang.phase_map import HookEntry, load_builtin
from pytest_specperf.judging.strict import silent_targets, unjudged
from pytest_specperf.probe.sink import read_records
from pytest_specperf.server.client import ServerUnreachable

MAP = load_builtin("0.5.23").by_target()
S = "sglang.srt."
SAMPLE = S + "speculative.eagle_utils.eagle_sample"
FORWARD = S + "model_executor.model_runner.ModelRunner.forward"  # when: is_draft_worker
TPF = S + "managers.tp_worker.TpModelWorker.forward_batch_generation"  # outermost, is_verify
INGEST = S + "managers.scheduler.Scheduler.ingest_requests"


def entry(target: str) -> HookEntry:
    return MAP[target]


class FakeModelRunner:
    """Test double: only the attribute the draft condition reads."""

    def __init__(self, is_draft_worker: bool) -> None:
        self.is_draft_worker = is_draft_worker

    def forward(self, batch: Any) -> None:
        return None


def sample(batch: Any) -> None:
    return None


def _open_step(rt: ProbeRuntime, rid: str) -> None:
    rt.probe.begin_step(context_len=5, batch_size=1, rids=[rid])
    rt.step_depth = 1


def _close_step(rt: ProbeRuntime) -> None:
    rt.cur_mode = "decode"
    rt.end(None)


def test_unit_hooks_count_only_calls_they_timed_inside_a_step(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, rank=0, use_cuda=False)
    hook = make_hook(entry(SAMPLE), rt)
    fwd = make_hook(entry(FORWARD), rt)
    tpf = make_hook(entry(TPF), rt)
    assert rt.calls == {SAMPLE: 0, FORWARD: 0, TPF: 0}  # every installed target, from zero
    hook(sample, None)  # outside a step: not timed, not counted
    _open_step(rt, "r")
    hook(sample, None)
    hook(sample, None)
    fwd(FakeModelRunner.forward, FakeModelRunner(False), None)  # condition false: nothing
    # nested in a timed verify: an `outermost` entry times nothing there
    tpf(lambda *a, **k: tpf(lambda *a, **k: None, None, None, None, None, True),
        None, None, None, None, True)  # fmt: skip
    _close_step(rt)
    assert rt.calls == {SAMPLE: 2, FORWARD: 0, TPF: 1}


def test_unit_counts_are_on_disk_with_the_records_they_cover(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, rank=0, use_cuda=False, meta_suffix="pid7")
    hook = make_hook(entry(SAMPLE), rt)
    make_hook(entry(FORWARD), rt)
    for _ in range(3):
        _open_step(rt, "r")
        hook(sample, None)
        _close_step(rt)
    rt.flush(None)
    assert len(read_records(tmp_path, rids={"r"})) == 3
    data = json.loads((tmp_path / "calls-pid7-rank0.json").read_text())
    assert data == {"calls": {SAMPLE: 3, FORWARD: 0}}


class UnreachableClientDouble:
    """Test double of ``ServerClient``: the metrics endpoint never answers, so only the
    hook-call side of ``metrics_before``/``metrics_check`` runs."""

    def get(self, *a: Any, **k: Any) -> Any:
        raise ServerUnreachable("test double: no server")

    def get_text(self, *a: Any, **k: Any) -> Any:
        raise ServerUnreachable("test double: no server")


def _installed(target: str, phase: str, role: str = "phase", optional: bool = False) -> dict:
    return {"target": target, "role": role, "phase": phase, "optional": optional}


def test_unit_backend_counts_each_required_target_over_the_measured_window(
    tmp_path: Path,
) -> None:
    b = SGLangBackend()
    b.bind(tmp_path)
    report = {"installed": [
        _installed(SAMPLE, "accept"), _installed(FORWARD, "draft"),
        _installed(INGEST, "ingest", role="iteration"),
        _installed(S + "fork.Only.optional", "verify", optional=True),
        {"target": S + "x.Runner.execute", "role": "graph", "phase": None},
    ]}  # fmt: skip
    (tmp_path / "hooks-pid1-rank0.json").write_text(json.dumps(report))
    client: Any = UnreachableClientDouble()
    assert b.target_calls({}) is None  # no window measured yet
    (tmp_path / "calls-pid1-rank0.json").write_text(
        json.dumps({"calls": {SAMPLE: 4, FORWARD: 2, INGEST: 9}})
    )
    before = b.metrics_before(client)
    # the window: sample and ingest fired, the draft forward did not (warm-up calls only);
    # a second rank's counts add up
    (tmp_path / "calls-pid1-rank0.json").write_text(
        json.dumps({"calls": {SAMPLE: 10, FORWARD: 2, INGEST: 15}})
    )
    (tmp_path / "calls-pid2-rank1.json").write_text(json.dumps({"calls": {SAMPLE: 6}}))
    b.metrics_check(client, before, [], 1.0)
    assert b.target_calls({}) == {
        (SAMPLE, "accept"): 12, (FORWARD, "draft"): 0, (INGEST, "ingest"): 6,
    }  # fmt: skip
    # a server whose plugin writes no counts: nothing to say (never a false failure)
    for p in tmp_path.glob("calls-*.json"):
        p.unlink()
    b.metrics_before(client)
    b.metrics_check(client, None, [], 1.0)
    assert b.target_calls({}) is None


class RunDouble(SimpleNamespace):
    """Test double of a ``CaseOutcome`` for the strict rule: only what ``unjudged`` reads
    when recording (the run's step count and telemetry)."""


def _outcome(steps: int = 16) -> Any:
    return RunDouble(run=SimpleNamespace(steps=steps, telemetry=None, samples={}))


def test_unit_strict_names_every_required_target_that_never_fired() -> None:
    calls = {(SAMPLE, "accept"): 12, (FORWARD, "draft"): 0, (TPF, "verify"): 0}
    assert silent_targets(calls) == [(TPF, "verify"), (FORWARD, "draft")]  # target order
    (problem,) = unjudged(_outcome(), mapped=None, gpu_run=False, recording=True,
                          target_calls=calls)  # fmt: skip
    assert problem.label == (
        "hook target(s) never fired: TpModelWorker.forward_batch_generation, ModelRunner.forward"
    )
    assert f"{FORWARD} (draft)" in problem.detail and f"{TPF} (verify)" in problem.detail
    assert "16 steps" in problem.detail and "specperf sglang-check" in problem.detail
    assert SAMPLE not in problem.detail


@pytest.mark.parametrize("calls", [None, {}, {(SAMPLE, "accept"): 1}])
def test_unit_strict_passes_when_every_target_fired_or_nothing_is_counted(calls: Any) -> None:
    assert unjudged(_outcome(), mapped=None, gpu_run=False, recording=True,
                    target_calls=calls) == ()  # fmt: skip


def test_unit_counting_costs_an_increment(tmp_path: Path) -> None:
    """A timed phase call with the count against the same call without it: the count adds
    well under a microsecond (generous bound for a loaded box; catches a write or lock)."""
    rt = ProbeRuntime(tmp_path, rank=0, use_cuda=False)
    hook = make_hook(entry(SAMPLE), rt)
    _open_step(rt, "c")
    calls, n = rt.calls, 20000
    t0 = time.perf_counter_ns()
    for _ in range(n):
        calls[SAMPLE] += 1
    per_call_us = (time.perf_counter_ns() - t0) / n / 1000
    hook(sample, None)
    assert rt.calls[SAMPLE] == n + 1
    assert per_call_us < 1.0, per_call_us


def test_unit_may_not_fire_entries_are_not_required(tmp_path: Path) -> None:
    """The built-in map marks the overlap loop's delayed sampling and DFlash's alternative
    draft samplers ``may_not_fire``; the hook report says so and strict skips them."""
    from pytest_specperf.engines.sglang.sgl_plugin import _describe

    launch = MAP[S + "managers.scheduler.Scheduler.launch_batch_sample_if_needed"]
    assert launch.may_not_fire and not launch.optional
    assert not entry(SAMPLE).may_not_fire
    b = SGLangBackend()
    b.bind(tmp_path)
    report = {"installed": [_describe(launch), _describe(entry(SAMPLE))]}
    (tmp_path / "hooks-pid1-rank0.json").write_text(json.dumps(report))
    assert b.required_targets() == {SAMPLE: "accept"}


@pytest.mark.parametrize(
    ("extra", "problem"),
    [("may_not_fire: yes please", "'may_not_fire' must be true or false"),
     ("may_not_fire: true\n    replay: true", "'may_not_fire' is only valid with role 'phase'")],
)  # fmt: skip
def test_unit_a_bad_may_not_fire_is_refused(extra: str, problem: str) -> None:
    from pytest_specperf.engines.sglang.phase_map import PhaseMapError, load_text, parse_map

    role = "graph" if "replay" in extra else "phase\n    phase: draft"
    text = f"schema: 1\nentries:\n  - target: sglang.a.B.c\n    role: {role}\n    {extra}\n"
    with pytest.raises(PhaseMapError, match=problem):
        parse_map(*load_text(text, "m.yaml")[:1], "m.yaml")
