"""The progress rule on real processes: a server process that burns CPU or records steps
is making progress however long it takes; one that is stopped (SIGSTOP) or blocked (a
hung lock: no step, no CPU) is stalled within the stall time. The end-to-end tries (a
real server frozen in a first request and mid-case, one throttled) are in
``test_server_faults.py``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import fault_table
import pytest

from pytest_specperf.probe.heartbeat import Heartbeat, ProgressWatch, read_progress

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

FORK = multiprocessing.get_context("fork")
#: A short stall time and beat for these tries (the shipped ones: 6 s, 0.5 s).
STALL_S = 1.5
BEAT_S = 0.1
WHAT = {"burn": "burning CPU without a step", "steps": "recording steps, idle between"}


def _server(run_dir: str, how: str) -> None:
    """In a child: a heartbeat, then ``how``: burn CPU without a step, record steps without
    CPU, or block (a lock that is never released)."""
    steps = [0]
    Heartbeat(run_dir, lambda: steps[0], interval_s=BEAT_S).start()
    end = time.monotonic() + 30
    if how == "burn":
        x = 0
        while time.monotonic() < end:
            x += 1
    elif how == "steps":
        while time.monotonic() < end:
            time.sleep(0.3)
            steps[0] += 1
    elif how == "blocked":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire(timeout=30)  # the hang: a lock its own holder waits for


def _child(tmp_path: Path, how: str) -> multiprocessing.process.BaseProcess:
    proc = FORK.Process(target=_server, args=(str(tmp_path), how), daemon=True)
    proc.start()
    deadline = time.monotonic() + 10
    while not read_progress(tmp_path):
        assert time.monotonic() < deadline, "no progress file"
        time.sleep(0.02)
    return proc


def _watch(watch: ProgressWatch, seconds: float) -> float | None:
    """Poll ``watch`` like a request does for ``seconds``; the first stall it reports."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stalled = watch.stalled_for()
        if stalled is not None:
            return stalled
        time.sleep(0.2)
    return None


@pytest.mark.parametrize("how", ["burn", "steps"])
def test_a_process_making_progress_is_never_stalled_then_a_freeze_is(tmp_path, how):
    proc = _child(tmp_path, how)
    try:
        watch = ProgressWatch(tmp_path, stall_s=STALL_S)
        assert _watch(watch, 3 * STALL_S) is None, watch.describe()
        os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        stalled = _watch(watch, 4 * STALL_S)
        took = time.monotonic() - t0
        assert stalled is not None and stalled >= STALL_S, watch.describe()
        assert took < STALL_S + 1.0, took
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
    fault_table.row(f"server process {WHAT[how]} for {3 * STALL_S:g} s, then SIGSTOP", 1,
                    f"never stalled while working; stalled {took:.1f} s after the stop "
                    f"(stall time {STALL_S:g} s)", True)  # fmt: skip


def test_a_blocked_process_is_stalled_though_its_heartbeat_runs(tmp_path):
    """A hung lock: the heartbeat thread still writes, but no step and no CPU advance."""
    proc = _child(tmp_path, "blocked")
    try:
        watch = ProgressWatch(tmp_path, stall_s=STALL_S)
        stalled = _watch(watch, 4 * STALL_S)
        assert stalled is not None, watch.describe()
        beats = [p.beats for p in read_progress(tmp_path).values()]
        assert beats and beats[0] > STALL_S / BEAT_S  # it was beating all along
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
    fault_table.row("server process hung on a lock (heartbeat still beating)", 1,
                    f"stalled after {stalled:.1f} s (stall time {STALL_S:g} s)", True)  # fmt: skip


def test_without_a_progress_file_only_the_deadline_applies(tmp_path):
    watch = ProgressWatch(tmp_path, stall_s=0.1)
    time.sleep(0.2)
    assert watch.stalled_for() is None
    assert ProgressWatch(None).stalled_for() is None
    fault_table.row("server without a progress file", 1, "never stalled: the deadline alone", True)


def test_a_torn_planted_or_stale_progress_file_is_ignored(tmp_path):
    me = os.getpid()
    (tmp_path / f"progress-rank0-pid{me}.json").write_text('{"beats": 1, "ste')
    (tmp_path / f"progress-rank1-pid{me}.json").symlink_to("/dev/zero")
    proc = FORK.Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join(5)  # a process that has ended: its pid is free
    stale = '{"beats": 9, "steps": 9, "cpu_s": 1.0}'
    (tmp_path / f"progress-rank0-pid{proc.pid}.json").write_text(stale)
    assert read_progress(tmp_path) == {}
    fault_table.row("torn progress file, link to /dev/zero, file of an ended server", 3,
                    "ignored (no hang, no false stall)", True)  # fmt: skip
