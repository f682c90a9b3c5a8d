"""The probe's CPU timers: wall minus the thread's CPU time is time the thread waited."""

from __future__ import annotations

import json
import time

import pytest

from pytest_specperf.judging.metrics import (
    ACTIVE_SHARE,
    GATEABLE,
    RUNQ_SHARE,
    RUNQ_SLICES,
    STEP,
    active_form,
    cpu_form,
    is_stored,
    unknown_gates,
)
from pytest_specperf.judging.samples import build_run
from pytest_specperf.probe import StepProbe
from pytest_specperf.probe.inject import Injector, parse_inject
from pytest_specperf.probe.kernels import STEP_KEY, KernelSample, KernelTotal, PhaseKernels
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.probe.phases import CORE_PHASES
from pytest_specperf.probe.record import RECORD_VERSION, StepRecord
from pytest_specperf.store.report import run_record_json


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_sleep_grows_wall_time_and_not_cpu_time():
    probe = StepProbe(None)
    probe.begin_step(context_len=1, batch_size=1, rids=["r"])
    with probe.phase("draft"):
        _busy(0.010)
    with probe.phase("verify"):
        time.sleep(0.030)
    time.sleep(0.010)  # outside every phase
    probe.end_step(accepted_tokens=1)
    (rec,) = probe.take_completed()
    assert rec.cpu_ns is not None and rec.step_cpu_ns is not None
    assert rec.host_ns["verify"] >= 30e6
    assert rec.cpu_ns["verify"] < 0.2 * rec.host_ns["verify"]  # slept: no CPU time
    assert rec.cpu_ns["draft"] <= rec.host_ns["draft"] + 50_000
    assert rec.cpu_ns["draft"] > 0
    assert sum(rec.cpu_ns.values()) <= rec.step_cpu_ns <= rec.step_ns


def test_nested_phase_cpu_time_is_exclusive():
    probe = StepProbe(None)
    probe.begin_step(context_len=1, batch_size=1, rids=[])
    with probe.phase("verify"):
        _busy(0.005)
        with probe.phase("prepare_for_verify"):
            _busy(0.010)
    probe.end_step(accepted_tokens=1)
    (rec,) = probe.take_completed()
    assert rec.cpu_ns is not None
    inner, outer = rec.cpu_ns["prepare_for_verify"], rec.cpu_ns["verify"]
    assert inner <= rec.host_ns["prepare_for_verify"] + 50_000
    assert outer <= rec.host_ns["verify"] + 50_000
    assert inner + outer <= rec.step_cpu_ns  # type: ignore[operator]


def test_verify_wait_canary_sleeps_inside_the_phase():
    probe = StepProbe(None, injector=Injector(parse_inject("verify_wait=20")))
    probe.begin_step(context_len=1, batch_size=1, rids=[])
    with probe.phase("verify"):
        _busy(0.002)
    probe.end_step(accepted_tokens=1)
    (rec,) = probe.take_completed()
    assert rec.host_ns["verify"] >= 20e6
    assert rec.cpu_ns is not None and rec.cpu_ns["verify"] < 10e6
    assert rec.unaccounted_ns < 1e6  # inside the phase, not between phases


def test_run_queue_time_is_read_where_linux_reports_it():
    probe = StepProbe(None)
    probe.begin_step(context_len=1, batch_size=1, rids=[])
    probe.end_step(accepted_tokens=1)
    (rec,) = probe.take_completed()
    assert rec.step_runq_ns is None or rec.step_runq_ns >= 0


_SCHEDSTAT = "/proc/thread-self/schedstat"


def _linux_schedstat() -> bool:
    try:
        with open(_SCHEDSTAT) as f:
            return len(f.read().split()) >= 3
    except OSError:
        return False


@pytest.mark.skipif(not _linux_schedstat(), reason=f"no {_SCHEDSTAT} (not Linux)")
def test_a_step_that_sleeps_gets_the_cpu_back_and_a_busy_step_need_not():
    """``step_slices``: the times the thread got a CPU during the step (each ends a wait)."""
    probe = StepProbe(None)
    probe.begin_step(context_len=1, batch_size=1, rids=[])
    for _ in range(3):
        time.sleep(0.002)  # three waits: the thread gives up its CPU three times
    probe.end_step(accepted_tokens=1)
    (slept,) = probe.take_completed()
    assert slept.step_slices is not None and 3 <= slept.step_slices < 1000
    # the run-queue time and the slices come from one read: both or neither
    assert slept.step_runq_ns is not None and slept.step_runq_ns >= 0


def test_slices_round_trip_and_make_a_column_shown_not_stored_nor_gated():
    recs = [_v2_record(step=i, step_slices=2 + i % 2) for i in range(4)]
    again = StepRecord.from_json(json.loads(json.dumps(recs[1].to_json())))
    assert again.step_slices == 3
    run = _run(recs)
    assert run.summaries[RUNQ_SLICES].value == pytest.approx(2.5)  # a count: its mean
    assert run_record_json(run)["values"][RUNQ_SLICES] == pytest.approx(2.5)  # the JSON shows it
    assert not is_stored(RUNQ_SLICES) and is_stored(RUNQ_SHARE)
    assert RUNQ_SLICES not in GATEABLE and unknown_gates([RUNQ_SHARE]) == [RUNQ_SHARE]
    # a step that did not read the run queue: NaN in the column, out of the summary
    run = _run([_v2_record(step=i, step_slices=None if i else 4) for i in range(4)])
    assert run.summaries[RUNQ_SLICES].n == 1 and run.summaries[RUNQ_SLICES].value == 4
    # records without the field (older reports): no column at all
    assert RUNQ_SLICES not in _run([_v2_record(step=i) for i in range(4)]).samples


def _v2_record(**kw) -> StepRecord:
    host = dict.fromkeys(CORE_PHASES, 1_000_000)  # an engine step: no scheduler phases
    fields = dict(
        step=0, wall_ns=1, mode="decode", rids=["r"], context_len=8, batch_size=1,
        accepted_tokens=2, step_ns=8_000_000, host_ns=host, unaccounted_ns=1_000_000,
        cpu_ns=dict.fromkeys(CORE_PHASES, 400_000), step_cpu_ns=3_000_000, step_runq_ns=500_000,
    )  # fmt: skip
    fields.update(kw)
    return StepRecord(**fields)


def test_record_v2_round_trips_and_v1_records_still_read():
    sample = KernelSample(
        "cuda", {"verify": PhaseKernels(5, (KernelTotal("k", 1, 5),)), STEP_KEY: PhaseKernels(5)}
    )
    rec = _v2_record(kernels=sample)
    data = json.loads(json.dumps(rec.to_json()))
    assert data["v"] == RECORD_VERSION == 2
    again = StepRecord.from_json(data)
    assert again.cpu_ns == rec.cpu_ns and again.step_cpu_ns == 3_000_000
    assert again.step_runq_ns == 500_000
    assert again.kernels is not None and again.kernels.active_ns("verify") == 5
    v1 = {k: v for k, v in data.items() if k not in ("cpu_ns", "step_cpu_ns", "kernels")}
    v1["v"] = 1
    old = StepRecord.from_json(v1)
    assert old.cpu_ns is None and old.step_cpu_ns is None and old.kernels is None
    with pytest.raises(ValueError, match="version 3 is not supported"):
        StepRecord.from_json({**data, "v": 3})


def _run(records):
    return build_run(
        records, [i // 2 for i in range(len(records))], context_len=8, batch_size=1,
        layout=KVLayout("contiguous", 1.0),
    )  # fmt: skip


def test_cpu_run_samples_cpu_time_as_the_active_time():
    run = _run([_v2_record(step=i) for i in range(4)])
    s = run.summaries
    assert run.active_source == "cpu"
    assert s[cpu_form("verify")].median == pytest.approx(0.4)
    assert s[active_form("verify")].median == pytest.approx(0.4)
    assert s[cpu_form(STEP)].median == pytest.approx(3.0)
    # the step's CPU time beyond its phases' (0.2 ms) lies outside every phase
    assert s[cpu_form("unaccounted")].median == pytest.approx(0.2)
    assert s[ACTIVE_SHARE].median == pytest.approx(3 / 8)
    assert s[RUNQ_SHARE].median == pytest.approx(0.5 / 5)  # of 5 ms off the CPU


def test_gpu_run_takes_active_time_from_the_sampled_steps_only():
    dev = dict.fromkeys(CORE_PHASES, 900_000)
    sample = KernelSample(
        "cuda",
        {
            "verify": PhaseKernels(300_000, (KernelTotal("attn", 2, 300_000),)),
            "unaccounted": PhaseKernels(50_000, (KernelTotal("append", 1, 50_000),)),
            STEP_KEY: PhaseKernels(350_000),
        },
    )
    recs = [
        _v2_record(step=i, device_ns=dev, device_step_ns=7_000_000,
                   kernels=sample if i % 2 == 0 else None)
        for i in range(4)
    ]  # fmt: skip
    run = _run(recs)
    s = run.summaries
    assert run.active_source == "device"
    assert s[active_form("verify")].n == 2  # two sampled steps
    assert s[active_form("verify")].median == pytest.approx(0.3)
    assert s[active_form("draft")].median == 0.0  # sampled, launched nothing
    assert s[ACTIVE_SHARE].median == pytest.approx(0.35 / 8)
    assert s[cpu_form("verify")].n == 4  # CPU time on every step
    assert run.samples[ACTIVE_SHARE][1] != run.samples[ACTIVE_SHARE][1]  # NaN: not sampled
    assert run.kernels is not None and run.kernels.steps == 2
    (attn,) = run.kernels.phases["verify"]
    assert (attn.name, attn.calls, attn.total_ms) == ("attn", 2, pytest.approx(0.3))
    assert attn.share == pytest.approx(0.3 / 0.9)  # of verify's device span


def test_v1_records_have_no_activity():
    recs = [_v2_record(step=i, cpu_ns=None, step_cpu_ns=None, step_runq_ns=None) for i in range(4)]
    run = _run(recs)
    assert run.active_source is None and run.kernels is None
    assert cpu_form("verify") not in run.summaries and ACTIVE_SHARE not in run.summaries


def test_cpu_clocks_are_read_on_every_other_decode_step():
    probe = StepProbe(None)
    probe.begin_step(context_len=1, batch_size=1, rids=[], mode="prefill")
    probe.end_step(accepted_tokens=0)
    for _ in range(4):
        probe.begin_step(context_len=1, batch_size=1, rids=[])
        with probe.phase("verify"):
            time.sleep(0.002)
        probe.end_step(accepted_tokens=1)
    recs = probe.take_completed()
    assert [r.cpu_ns is not None for r in recs] == [False, True, False, True, False]
    assert [r.step_cpu_ns is not None for r in recs] == [False, True, False, True, False]
    run = _run(recs[1:])
    s = run.summaries
    assert run.active_source == "cpu"
    assert s[cpu_form("verify")].n == 2  # the steps that read the clock
    assert s[ACTIVE_SHARE].n == 2 and s[ACTIVE_SHARE].median < 0.5  # slept
    assert s["verify"].n == 4  # wall times on every step
