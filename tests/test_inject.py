"""Canary injection: spec parsing, option errors, real slowdowns of the named phase."""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import pytest

from pytest_specperf.probe import StepProbe
from pytest_specperf.probe.inject import Injector, InjectSpec, parse_inject


def test_parse_spec():
    spec = parse_inject("verify=1.10, draft=1.5,host_stall=20")
    assert spec == InjectSpec({"verify": 1.1, "draft": 1.5}, 20.0)
    assert str(spec) == "draft=1.5,verify=1.1,host_stall=20"


def test_parse_wait_spec():
    spec = parse_inject("verify_wait=20,verify=1.1,draft_wait=0.5")
    assert spec == InjectSpec({"verify": 1.1}, 0.0, {"verify": 20.0, "draft": 0.5})
    assert str(spec) == "verify=1.1,draft_wait=0.5,verify_wait=20"
    assert parse_inject(str(spec)) == spec


@pytest.mark.parametrize(("text", "message"), [
    ("verfy=1.1", "unknown phase 'verfy'; choose one of: ingest, schedule, launch, draft"),
    ("verfy_wait=3", "unknown phase 'verfy_wait'"),
    ("unaccounted_wait=3", "unknown phase 'unaccounted_wait'"),
    ("verify_wait=0", "verify_wait: 0 ms must be in (0, 10000]"),
    ("verify_wait=20000", "verify_wait: 20000 ms must be in (0, 10000]"),
    ("verify_wait=1,verify_wait=2", "verify_wait is given twice"),
    ("unaccounted=1.2", "unknown phase 'unaccounted'"),
    ("verify=fast", "verify: 'fast' is not a number"),
    ("verify=0.9", "factor 0.9 must be in (1, 10]"),
    ("verify=1", "factor 1 must be in (1, 10]"),
    ("verify=50", "factor 50 must be in (1, 10]"),
    ("verify", "is not NAME=VALUE"),
    ("verify=1.1,verify=1.2", "verify is given twice"),
    ("host_stall=-3", "host_stall: -3 ms must be in (0, 10000]"),
    ("", "empty spec"),
])
def test_bad_specs_name_the_fix(text, message):
    with pytest.raises(ValueError) as e:
        parse_inject(text)
    assert message in str(e.value)


@pytest.mark.parametrize(("args", "message"), [
    (["--specperf-inject=verify=0.5"], "*--specperf-inject: invalid value 'verify=0.5': verify: factor 0.5 must be in (1, 10]*"),
    (["--specperf-inject=kv=2"], "*unknown phase 'kv'*"),
    (["--specperf-inject=verify=1.1", "--specperf-update-baselines"],
     "*--specperf-inject cannot be combined with --specperf-update-baselines*"),
])
def test_option_errors(pytester, args, message):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _draft_10_verify_20(spec: str, steps: int) -> list:
    """Records of ``steps`` steps of 10 ms draft and 20 ms verify under ``spec``."""
    probe = StepProbe(None, injector=Injector(parse_inject(spec)))
    for _ in range(steps):
        probe.begin_step(context_len=1, batch_size=1, rids=[])
        with probe.phase("draft"):
            _busy(0.010)
        with probe.phase("verify"):
            _busy(0.020)
        probe.end_step(accepted_tokens=1)
    return probe.take_completed()


def test_phase_factor_stretches_the_phase_itself():
    """verify=1.5 makes verify 1.5x as long and leaves draft alone. Judged on the median of
    5 steps: one step preempted on a busy 2-core box (129 ms once in a CI run) is the
    machine, not the injector; a broken injector moves every step."""
    recs = _draft_10_verify_20("verify=1.5", 5)
    verify = statistics.median(r.host_ns["verify"] for r in recs)
    draft = statistics.median(r.host_ns["draft"] for r in recs)
    assert verify == pytest.approx(30e6, rel=0.15)  # 20 ms x 1.5
    assert draft == pytest.approx(10e6, rel=0.15)  # untouched
    assert statistics.median(r.unaccounted_ns for r in recs) < 1e6


def test_all_stretches_every_phase_alike():
    """all=1.5: every phase 1.5x as long, each by its own busy work, so every phase keeps
    its share of the step (no phase gate sees it) while the step grows by the factor."""
    spec = parse_inject("all=1.5")
    assert str(spec) == "all=1.5" and spec.uniform == 1.5
    recs = _draft_10_verify_20("all=1.5", 5)
    draft = statistics.median(r.host_ns["draft"] for r in recs)
    verify = statistics.median(r.host_ns["verify"] for r in recs)
    assert draft == pytest.approx(15e6, rel=0.15)  # the median: robust to a preemption
    assert verify == pytest.approx(30e6, rel=0.15)
    assert statistics.median(r.unaccounted_ns for r in recs) < 1e6


@pytest.mark.parametrize(("text", "message"), [
    ("all=1.1,verify=1.2", "all= sets every phase: give either all=FACTOR or phase factors"),
    ("verify=1.2,all=1.1", "give either all=FACTOR or phase factors, not both"),
    ("all=1.1,all=1.2", "all is given twice"),
    ("all=0.9", "all: factor 0.9 must be in (1, 10]"),
])
def test_bad_all_specs(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        parse_inject(text)
    assert str(parse_inject("all=1.1,host_stall=3")) == "all=1.1,host_stall=3"


def test_host_stall_lands_in_unaccounted():
    """Judged on the median of 5 steps, as the factors above: one preempted step is the
    machine."""
    recs = _draft_10_verify_20("host_stall=15", 5)
    assert len(recs) == 5
    assert statistics.median(r.unaccounted_ns for r in recs) == pytest.approx(15e6, rel=0.15)
    assert statistics.median(r.host_ns["verify"] for r in recs) == pytest.approx(20e6, rel=0.15)


def test_engine_records_are_labelled(tiny_engine_factory):
    from pytest_specperf.engines.reference.engine import GenRequest

    probe = StepProbe(None, labels={"inject": "verify=1.1"},
                      injector=Injector(parse_inject("verify=1.1")))
    eng = tiny_engine_factory("DFLASH", 8, probe=probe)
    eng.generate([GenRequest(rid="i", max_new_tokens=20, context_len=2048, ignore_eos=True)])
    recs = probe.take_completed()
    assert recs and all(r.labels == {"inject": "verify=1.1"} for r in recs)


# -- the GPU canary's feedback, against a fake GPU clock ------------------------------------


class FakeGpuClock:
    """Test double of the device: a nanosecond clock and an SM clock (GHz = sleep cycles
    per ns) that the test changes, as a GPU's boost clock changes under load."""

    def __init__(self, ghz: float) -> None:
        self.ghz = ghz
        self.now_ns = 0.0


class FakeSleepDevice:
    """Test double of ``CudaSleep``: a sleep of ``cycles`` lasts ``cycles / ghz`` ns of
    the fake clock at the speed the clock has when it runs."""

    def __init__(self, clock: FakeGpuClock) -> None:
        self.clock = clock
        self.calibrations = 0
        self.slept_ns: list[float] = []

    def calibrate(self) -> float:
        self.calibrations += 1
        return self.clock.ghz

    def sleep(self, cycles: int) -> float:
        ns = cycles / self.clock.ghz
        self.clock.now_ns += ns
        self.slept_ns.append(ns)
        return ns

    def elapsed_ns(self, handle: float) -> float:
        return handle


VERIFY_NS = 10e6  # the phase's own device time


def _stretched_steps(inj: Injector, dev: FakeSleepDevice, steps: int, slow_at: int) -> list[float]:
    """Drive the injector as the probe does; the sleep added to verify, per step."""
    added = []
    for step in range(steps):
        if step == slow_at:
            dev.clock.ghz = 1.2  # the SM clock drops from its calibrated 1.98 GHz
        before = len(dev.slept_ns)
        inj.stretch("verify", elapsed_ns=0)
        inj.end_step()
        extra = sum(dev.slept_ns[before:])
        inj.observe_step({"verify": round(VERIFY_NS + extra), "draft": 1_000_000})
        added.append(extra)
    return added


def test_gpu_canary_tracks_a_clock_that_changes_speed():
    dev = FakeSleepDevice(FakeGpuClock(ghz=1.98))
    inj = Injector(parse_inject("verify=1.10"), sleeper=dev)
    assert dev.calibrations == 1  # at start, not inside a phase
    added = _stretched_steps(inj, dev, steps=40, slow_at=15)
    assert dev.calibrations == 1  # later corrections come from the achieved sleeps
    assert added[0] == 0  # no estimate of the phase yet: nothing to size the sleep from
    for extra in added[5:15] + added[19:]:
        assert extra == pytest.approx(0.10 * VERIFY_NS, rel=0.02)
    assert inj.cycles_per_ns == pytest.approx(1.2, rel=0.01)
    # the feedback subtracts the achieved sleep: the estimate stays the phase's own time
    assert inj.baseline_ns("verify") == pytest.approx(VERIFY_NS, rel=0.01)


def test_gpu_canary_without_achieved_sleeps_would_overshoot():
    """The test above can fail: with no achieved sleep reported back (the old behaviour:
    one calibration, the intended sleep subtracted) the stretch overshoots by more than
    the clock ratio once the clock drops, and the phase estimate absorbs the excess."""
    dev = FakeSleepDevice(FakeGpuClock(ghz=1.98))
    inj = Injector(parse_inject("verify=1.10"), sleeper=dev)
    dev.elapsed_ns = lambda handle: None  # type: ignore[assignment,method-assign]
    added = _stretched_steps(inj, dev, steps=30, slow_at=10)
    assert added[-1] > 0.10 * VERIFY_NS * 1.98 / 1.2
    assert inj.baseline_ns("verify") > 1.05 * VERIFY_NS


class FakeEvent:
    """Test double of ``torch.cuda.Event`` on the fake clock."""

    clock: FakeGpuClock

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self, stream: object = None) -> None:
        self.t = self.clock.now_ns

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) / 1e6


def test_probe_feeds_the_canary_its_resolved_steps():
    """Through the StepProbe's device-time path (fake CUDA events): the verify phase's
    device time grows by the factor, the other phases do not."""
    clock = FakeGpuClock(ghz=1.5)
    FakeEvent.clock = clock
    dev = FakeSleepDevice(clock)
    probe = StepProbe(None, injector=Injector(parse_inject("verify=1.2"), sleeper=dev))
    probe._torch = SimpleNamespace(cuda=SimpleNamespace(Event=FakeEvent))
    for _ in range(12):
        probe.begin_step(context_len=1, batch_size=1, rids=[])
        with probe.phase("draft"):
            clock.now_ns += 2e6
        with probe.phase("verify"):
            clock.now_ns += VERIFY_NS
        probe.end_step(accepted_tokens=1)
    recs = probe.take_completed()
    assert len(recs) == 12
    assert recs[0].device_ns["verify"] == pytest.approx(VERIFY_NS)
    for r in recs[3:]:
        assert r.device_ns["verify"] == pytest.approx(1.2 * VERIFY_NS, rel=0.01)
        assert r.device_ns["draft"] == pytest.approx(2e6)


def test_plain_cuda_calibrates_after_the_first_step_not_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``device="cuda"`` (a process that picks its GPU later): no CUDA work when built;
    calibrated once, right after the first recorded step, outside every record."""
    import pytest_specperf.probe.inject as inject

    clock = FakeGpuClock(ghz=1.7)
    made: list[FakeSleepDevice] = []

    def fake_cuda_sleep(device: str) -> FakeSleepDevice:
        made.append(FakeSleepDevice(clock))
        return made[-1]

    monkeypatch.setattr(inject, "CudaSleep", fake_cuda_sleep)
    inj = Injector(parse_inject("verify=1.1"), device="cuda")
    assert made[0].calibrations == 0 and inj.cycles_per_ns == 0.0
    inj.stretch("verify", elapsed_ns=0)
    inj.end_step()
    assert made[0].calibrations == 1 and inj.cycles_per_ns == 1.7
    inj.end_step()
    assert made[0].calibrations == 1
    pinned = Injector(parse_inject("verify=1.1"), device="cuda:1")
    assert made[1].calibrations == 1 and pinned.calibrations == [1.7]  # at start


def test_engine_claims_its_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA engine makes its device current (streams, capture, events and the canary
    follow the current device); plain "cuda" gets the current index spelled out."""
    import torch

    from pytest_specperf.engines.reference.engine import _claim_device

    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _claim_device("cuda:1") == torch.device("cuda", 1)
    assert _claim_device("cuda") == torch.device("cuda", 3)
    assert _claim_device("cpu") == torch.device("cpu")
    assert calls == [torch.device("cuda", 1), torch.device("cuda", 3)]
