"""The progress rule on real processes: a server process that burns CPU or records steps
is making progress however long it takes, and so is one waiting on a child process that
works (a compiler) or waiting for a CPU on a loaded machine; one that is stopped (SIGSTOP)
or blocked (a hung lock: no step, no CPU, no child working) is stalled within the stall
time. The end-to-end tries (a
real server frozen in a first request and mid-case, one throttled) are in
``test_server_faults.py``."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fault_table
import pytest

from pytest_specperf.probe.heartbeat import (
    CPU_PROGRESS_S,
    Heartbeat,
    ProgressWatch,
    read_progress,
    tree_activity_s,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

FORK = multiprocessing.get_context("fork")
#: A short stall time and beat for these tries (the shipped ones: 6 s, 0.5 s).
STALL_S = 1.5
BEAT_S = 0.1
WHAT = {"burn": "burning CPU without a step", "steps": "recording steps, idle between"}
#: A child that burns CPU for 30 s (a compiler the server waits for).
BURNER = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n"


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
    elif how == "child":  # waits, using no CPU itself, for a child that works
        with open(os.path.join(run_dir, "child.pid"), "w") as fh:
            child = subprocess.Popen([sys.executable, "-c", BURNER])
            fh.write(str(child.pid))
        child.wait()


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


def test_a_process_waiting_on_a_working_child_is_not_stalled_until_the_child_stops(tmp_path):
    """A first request on a cold compile cache: the scheduler waits for torch.compile's
    workers and the C++ compiler (no step, no CPU of its own, tens of seconds); the work
    is its child's. Stopping the child leaves the whole tree still: stalled."""
    proc = _child(tmp_path, "child")
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "child.pid").exists() or not (tmp_path / "child.pid").read_text():
            assert time.monotonic() < deadline, "no child started"
            time.sleep(0.02)
        child = int((tmp_path / "child.pid").read_text())
        watch = ProgressWatch(tmp_path, stall_s=STALL_S)
        assert _watch(watch, 3 * STALL_S) is None, watch.describe()
        [own] = read_progress(tmp_path).values()
        assert own.steps == 0 and own.cpu_s < 1.0  # the work was the child's
        os.kill(child, signal.SIGSTOP)
        t0 = time.monotonic()
        stalled = _watch(watch, 4 * STALL_S)
        took = time.monotonic() - t0
        assert stalled is not None, watch.describe()
        assert "with its child processes" in watch.describe(), watch.describe()
        assert took < STALL_S + 1.0, took
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError, OSError):
            os.kill(int((tmp_path / "child.pid").read_text()), signal.SIGKILL)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)
    fault_table.row(f"server process waiting on a working child for {3 * STALL_S:g} s, then "
                    "the child stopped", 1, f"never stalled while the child worked; stalled "
                    f"{took:.1f} s after its stop", True)  # fmt: skip


def _fake_proc(root: Path, pid: int, *, cpu_ticks: int, wait_ns: int,
               children: dict[int, int] | None = None) -> None:  # fmt: skip
    """A ``/proc`` stand-in (test double) holding ``pid`` and its ``children`` (pid: CPU
    ticks), each with one thread whose run-queue wait is ``wait_ns``."""
    for p, parent, ticks in [(pid, 1, cpu_ticks)] + [
        (c, pid, t) for c, t in (children or {}).items()
    ]:
        (root / str(p) / "task" / str(p)).mkdir(parents=True, exist_ok=True)
        rest = " ".join(["0"] * 9)  # pgrp .. cmajflt, then utime stime
        (root / str(p) / "stat").write_text(f"{p} (x y) S {parent} {rest} {ticks} 0 0 0\n")
        (root / str(p) / "task" / str(p) / "schedstat").write_text(f"0 {wait_ns} 1\n")


def test_waiting_for_a_cpu_counts_as_progress_a_still_tree_does_not(tmp_path):
    """A niced server on a busy machine: runnable, it got no CPU for the stall time (its
    run-queue wait grew); a frozen one neither ran nor waited. The kernel's account of each
    is a ``/proc`` stand-in here (the real one cannot be made to starve on demand)."""
    run_dir, proc = tmp_path / "run", tmp_path / "proc"
    run_dir.mkdir()
    me = os.getpid()  # a live pid, so that the progress file is watched
    (run_dir / f"progress-rank0-pid{me}.json").write_text(
        '{"beats": 1, "steps": 3, "cpu_s": 1.0}'.ljust(255) + "\n"
    )
    ticks = os.sysconf("SC_CLK_TCK")
    _fake_proc(proc, me, cpu_ticks=100, wait_ns=0, children={me + 1: 50})
    assert tree_activity_s(me, proc) == 150 / ticks
    assert tree_activity_s(me + 7, proc) is None  # not shown: the file's CPU alone

    watch = ProgressWatch(run_dir, stall_s=0.3, proc=proc)
    assert watch.stalled_for() is None  # the first look: progress
    waited = 0
    for _ in range(5):  # runnable, without a CPU, for longer than the stall time
        time.sleep(0.1)
        waited += int(CPU_PROGRESS_S * 1e9)
        _fake_proc(proc, me, cpu_ticks=100, wait_ns=waited, children={me + 1: 50})
        assert watch.stalled_for() is None, watch.describe()
    time.sleep(0.4)  # still: nothing ran or waited to run
    stalled = watch.stalled_for()
    assert stalled is not None and stalled >= 0.3, watch.describe()
    assert "0.00 s on or waiting for a CPU in the stall" in watch.describe(), watch.describe()
    fault_table.row("server process runnable without a CPU (run-queue wait growing, no step, "
                    "no CPU) for twice the stall time, then still (a /proc stand-in)", 1,
                    "never stalled while waiting for a CPU; stalled once nothing ran or "
                    "waited", True)  # fmt: skip


def test_a_reaped_childs_cpu_stays_in_the_tree(tmp_path):
    """A cold compile's compiler runs, exits and is reaped: its CPU time moves to its
    parent's ``cutime`` and the tree's total does not drop (had it dropped, the next
    compiler would first have to make up the lost time before counting as progress)."""
    proc = tmp_path / "proc"
    me = os.getpid()
    ticks = os.sysconf("SC_CLK_TCK")
    _fake_proc(proc, me, cpu_ticks=100, wait_ns=0, children={me + 1: 50})
    assert tree_activity_s(me, proc) == 150 / ticks
    shutil.rmtree(proc / str(me + 1))  # the compiler exits; the server waits for it
    rest = " ".join(["0"] * 9)  # the compiler's 50 ticks now its parent's cutime + cstime
    (proc / str(me) / "stat").write_text(f"{me} (x y) S 1 {rest} 100 0 30 20\n")
    assert tree_activity_s(me, proc) == 150 / ticks
    fault_table.row("a compiler child exits and is reaped while the server waits on the next "
                    "(a /proc stand-in)", 1, "its CPU stays in the tree's total (the parent's "
                    "cutime + cstime): no drop to make up before progress counts", True)  # fmt: skip


def test_a_pid_that_names_another_process_is_not_read_as_the_servers(tmp_path):
    """A server in another PID namespace (a container with the run directory mounted)
    writes its own pid, which here may name some other process (pid 1: the whole machine
    as its "tree", the freeze watch silently off). The progress file carries the process's
    start time; ``/proc`` is read as the server's only where the two agree."""
    from pytest_specperf.probe.heartbeat import start_ticks

    ticks = os.sysconf("SC_CLK_TCK")
    up = float(Path("/proc/uptime").read_text().split()[0]) * ticks
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:  # field 22 read right: a process started now started about now since boot
        assert abs(start_ticks(str(child.pid)) - up) <= 2 * ticks
    finally:
        child.kill()
        child.wait()
    beat = Heartbeat(tmp_path, lambda: 0).start()
    try:
        [p] = read_progress(tmp_path).values()
    finally:
        beat.stop()
    me = os.getpid()
    assert p.start is not None and p.start == start_ticks(str(me))
    assert tree_activity_s(me, start=p.start) is not None
    assert tree_activity_s(me, start=p.start + 1) is None  # another process of that number
    assert tree_activity_s(me) is not None  # an older server's file without a start time
    # the watch: a file whose start does not match the pid's process is never called
    # stalled (the deadline judges it), one that matches is
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for start, stalls in ((p.start + 1, False), (p.start, True)):
        line = json.dumps({"beats": 1, "steps": 3, "cpu_s": 1.0, "start": start})
        (run_dir / f"progress-rank0-pid{me}.json").write_text(line.ljust(255) + "\n")
        watch = ProgressWatch(run_dir, stall_s=0.3, proc=tmp_path / "no-proc")
        if stalls:  # a /proc stand-in with this process, still
            watch.proc = tmp_path / "proc"
            _fake_proc(watch.proc, me, cpu_ticks=100, wait_ns=0)
            rest = " ".join(["0"] * 9)
            (watch.proc / str(me) / "stat").write_text(
                f"{me} (x y) S 1 {rest} 100 0 0 0 0 0 0 0 {start}\n"
            )
        else:
            watch.proc = Path("/proc")
        assert watch.stalled_for() is None
        assert (_watch(watch, 1.0) is not None) is stalls, watch.describe()
    fault_table.row("progress file of a server in another PID namespace, whose pid names "
                    "another local process", 1, "its start time disagrees with /proc's: never "
                    "called frozen from the file alone (the deadline judges it); a matching "
                    "one still is", True)  # fmt: skip
