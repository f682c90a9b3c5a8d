"""The control file: a running server's probe switches its canary injection at step
boundaries, looking at the file once every CONTROL_EVERY_STEPS steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_specperf.engines.env import probe_setup
from pytest_specperf.probe import StepProbe
from pytest_specperf.probe import inject as inject_mod
from pytest_specperf.probe.inject import (
    CONTROL_EVERY_STEPS,
    CONTROL_FILE,
    MAX_CONTROL_BYTES,
    InjectControl,
    parse_inject,
    remove_control,
    write_control,
)
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.server.decoder import MeasurementError, _check_one_injection

STALL = parse_inject("host_stall=2")


def _steps(probe: StepProbe, n: int) -> list[StepRecord]:
    for _ in range(n):
        probe.begin_step(context_len=8, batch_size=1, rids=["r"])
        with probe.phase("verify"):  # the host stall lands just before verify
            pass
        probe.end_step(accepted_tokens=1)
    return probe.take_completed()


def _injected(rec: StepRecord) -> str | None:
    return rec.labels.get("inject")


def test_the_control_file_switches_the_injection_within_one_period(tmp_path: Path) -> None:
    probe = StepProbe(None, labels={"engine": "x"}, control=InjectControl(tmp_path, device="cpu"))
    assert all(_injected(r) is None for r in _steps(probe, 3))
    write_control(tmp_path, STALL)
    recs = _steps(probe, CONTROL_EVERY_STEPS + 1)
    switched = next(i for i, r in enumerate(recs) if _injected(r) == "host_stall=2")
    assert switched <= CONTROL_EVERY_STEPS
    assert all(_injected(r) == "host_stall=2" for r in recs[switched:])
    assert all(r.unaccounted_ns >= 2_000_000 for r in recs[switched:])  # really stalled
    assert all(r.unaccounted_ns < 1_000_000 for r in recs[:switched])
    assert all(r.labels["engine"] == "x" for r in recs)
    write_control(tmp_path, None)  # "none": off, even against the environment's spec
    recs = _steps(probe, CONTROL_EVERY_STEPS)
    assert _injected(recs[-1]) is None and recs[-1].unaccounted_ns < 1_000_000
    assert (tmp_path / CONTROL_FILE).read_text() == "none\n"
    assert [p.name for p in tmp_path.iterdir()] == [CONTROL_FILE]  # no temporary file left


def test_a_new_request_looks_at_the_file_before_its_first_step(tmp_path: Path) -> None:
    """A canary switched between two requests holds from the second one's first step,
    however few steps the first ran since the last look (a 2-step warm-up, a 5-step
    block: the period alone would leave it stale for up to 15 steps)."""
    probe = StepProbe(None, control=InjectControl(tmp_path, device="cpu"))
    write_control(tmp_path, STALL)
    probe.new_request()
    assert all(_injected(r) == "host_stall=2" for r in _steps(probe, 2))
    write_control(tmp_path, None)
    assert all(_injected(r) == "host_stall=2" for r in _steps(probe, 2))  # mid-request: later
    probe.new_request()
    assert all(_injected(r) is None for r in _steps(probe, 2))


def test_without_a_file_the_environment_spec_applies_again(tmp_path: Path) -> None:
    setup = probe_setup(device="cpu", environ={"SPECPERF_INJECT": "host_stall=1"}, run_dir=tmp_path)
    probe = setup.build(None, use_cuda=False)  # no sink: the no-op probe
    assert not probe.enabled
    probe = StepProbe(None, labels=dict(setup.labels), injector=setup.injector,
                      control=setup.control)  # fmt: skip
    write_control(tmp_path, parse_inject("verify=1.2"))
    assert _injected(_steps(probe, CONTROL_EVERY_STEPS)[-1]) == "verify=1.2"
    assert remove_control(tmp_path) and not remove_control(tmp_path)
    assert _injected(_steps(probe, CONTROL_EVERY_STEPS)[-1]) == "host_stall=1"


def test_the_probe_stats_the_file_once_every_period(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real_stat = os.stat

    def counting_stat(path, *args, **kw):
        calls.append(path)
        return real_stat(path, *args, **kw)

    monkeypatch.setattr(inject_mod.os, "stat", counting_stat)
    write_control(tmp_path, STALL)
    probe = StepProbe(None, control=InjectControl(tmp_path, device="cpu"))
    steps = 10 * CONTROL_EVERY_STEPS
    _steps(probe, steps)
    assert len(calls) == steps // CONTROL_EVERY_STEPS  # the first step, then every period


@pytest.mark.parametrize(("content", "problem"), [
    ("verify=0.5\n", "factor 0.5 must be in (1, 10]"),
    ("fast please", "is not NAME=VALUE"),
    ("x" * (MAX_CONTROL_BYTES + 1), f"over {MAX_CONTROL_BYTES}"),
    (b"\xff\xfe", "not UTF-8 text"),
])
def test_a_bad_control_file_injects_nothing_and_says_why(tmp_path: Path, content, problem) -> None:
    path = tmp_path / CONTROL_FILE
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    probe = StepProbe(None, injector=inject_mod.Injector(STALL),
                      control=InjectControl(tmp_path, device="cpu", base=STALL))  # fmt: skip
    (rec,) = _steps(probe, 1)
    assert _injected(rec) is None and rec.unaccounted_ns < 1_000_000
    assert problem in rec.labels["inject_error"] and CONTROL_FILE in rec.labels["inject_error"]


def test_a_link_or_a_fifo_is_never_opened(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("verify=1.5")
    (tmp_path / CONTROL_FILE).symlink_to(target)
    probe = StepProbe(None, control=InjectControl(tmp_path, device="cpu"))
    (rec,) = _steps(probe, 1)
    assert "not a regular file" in rec.labels["inject_error"] and _injected(rec) is None
    os.unlink(tmp_path / CONTROL_FILE)
    os.mkfifo(tmp_path / CONTROL_FILE)
    probe = StepProbe(None, control=InjectControl(tmp_path, device="cpu"))
    (rec,) = _steps(probe, 1)  # returns at once: a FIFO is not read
    assert "not a regular file" in rec.labels["inject_error"]


def _rec(**labels: str) -> StepRecord:
    return StepRecord(0, 0, "decode", ["r"], 8, 1, 1, 10, {}, 0, labels=labels)


def test_measured_steps_must_share_one_injection_state() -> None:
    _check_one_injection([_rec(inject="verify=1.1"), _rec(inject="verify=1.1")])
    _check_one_injection([_rec(), _rec(engine="x")])
    with pytest.raises(MeasurementError, match=r"injection changed during the case \(none, verify=1.1\)"):
        _check_one_injection([_rec(), _rec(inject="verify=1.1")])
    with pytest.raises(MeasurementError, match="could not use its control file: bad"):
        _check_one_injection([_rec(inject_error="bad")])
