"""Fault suite of the server side: Ctrl-C during a case, the server killed or frozen in the
middle of one. Each try runs a real pytest session with a real reference server and does
the harm from outside, at a random moment (seeded per try, so a failure repeats).

``pytest tests`` runs one try of each; ``pytest tests -m faults --full-faults -s`` runs
all of them (SIGINT 5, killed 3, frozen mid-case 3, frozen in a first request 3,
throttled 1) and prints the counts as rows of the table in docs/faults.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import fault_table
import pytest
from e2e import sigint_default

from pytest_specperf.probe.heartbeat import STALL_S
from pytest_specperf.server.decoder import FIRST_DEADLINE_FLOOR_S
from pytest_specperf.store.baselines import write_baselines

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

TRIES = {"sigint": 5, "killed": 3, "frozen": 3, "first": 3, "throttled": 1}
CASE = """
import json, os
from pathlib import Path

def test_decode(specperf, model_server):
    info = {"pid": model_server.process.pid, "run_dir": str(model_server.run_dir)}
    Path(os.environ["SPECPERF_FAULT_INFO"]).write_text(json.dumps(info))
    env = os.environ.get
    specperf.decode(context_len=int(env("SPECPERF_FAULT_CTX", 2048)),
                    steps=int(env("SPECPERF_FAULT_STEPS", 400)),
                    warmup=int(env("SPECPERF_FAULT_WARMUP", 2)))
"""
#: A first request long enough to be frozen or throttled in (its pace is unknown: the
#: deadline of a first request is at least ``FIRST_DEADLINE_FLOOR_S``).
LONG_FIRST = {"SPECPERF_FAULT_CTX": "32768", "SPECPERF_FAULT_WARMUP": "60"}
#: Seconds a server may take to go after its pytest ended (SIGTERM grace, then SIGKILL).
GONE_WITHIN_S = 30.0
#: Seconds the stopped-server teardown may add after the deadline (SIGTERM, SIGCONT).
TEARDOWN_S = 15.0
ROWS: dict[str, list[str]] = {kind: [] for kind in TRIES}
#: the test function of each kind (the fault table's last column)
BY: dict[str, str] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attempt" in metafunc.fixturenames:
        kind = metafunc.function.__name__.split("_")[1]  # test_<kind>_...
        n = TRIES[kind] if metafunc.config.getoption("--full-faults") else 1
        metafunc.parametrize("attempt", range(n), ids=lambda a: f"try{a + 1}")


@pytest.fixture(scope="module", autouse=True)
def _print_table(request):
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None or not any(ROWS.values()):
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        tr.write_line("")
        tr.write_line("fault suite (server): test | tries | outcome | nothing lost")
        for line in _table():
            tr.write_line(line)


def _table() -> list[str]:
    titles = {
        "sigint": "SIGINT to pytest during a case (update run)",
        "killed": "server killed (SIGKILL) mid-case",
        "frozen": "server frozen (SIGSTOP) mid-case",
        "first": "server frozen (SIGSTOP) during a case's first request (pace unknown)",
        "throttled": "server throttled (SIGSTOP 2 s / SIGCONT 0.5 s, 15 s) in a first request",
    }
    out = []
    for kind, rows in ROWS.items():
        if rows:
            ok = sum(1 for r in rows if r.startswith("ok"))
            details = "; ".join(r.removeprefix("ok ") for r in rows)
            outcome = f"{ok}/{len(rows)} as expected: {details}"
            fault_table.row(titles[kind], len(rows), outcome, ok == len(rows), by=BY[kind])
            lost = "yes" if ok == len(rows) else "NO"
            out.append(f"{titles[kind]} | {len(rows)} | {outcome} | {lost}")
    return out


@dataclass
class Session:
    proc: subprocess.Popen[bytes]
    pid: int
    run_dir: Path


def _start(work: Path, *extra: str, env_extra: dict[str, str] | None = None) -> Session:
    (work / "test_fault.py").write_text(CASE)
    info = work / "info.json"
    env = {**os.environ, "SPECPERF_FAULT_INFO": str(info), **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_fault.py", "-p", "no:cacheprovider", "-q",
         "--specperf-device=test-box", *extra],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=sigint_default,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not info.exists():
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    time.sleep(0.05)  # written, not only created
    data = json.loads(info.read_text())
    return Session(proc, int(data["pid"]), Path(data["run_dir"]))


def _measuring(s: Session, within: float = 60.0) -> None:
    """Wait until the first measured block's records appear (the warm-up is over)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and s.proc.poll() is None:
        if any(b"-b0-" in p.read_bytes() for p in s.run_dir.glob("steps-*.jsonl")):
            return
        time.sleep(0.05)
    raise AssertionError("the case never reached its measured blocks")


def _mid_measurement(tmp_path: Path, kind: str, attempt: int) -> Session:
    """A session whose case is measuring, at a moment under a second into its measured
    blocks (seeded by ``kind`` and ``attempt``)."""
    rng = random.Random(f"{kind}-{attempt}")
    s = _start(tmp_path)
    _measuring(s)
    time.sleep(rng.uniform(0.0, 1.0))
    return s


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _gone(pgid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while _group(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _finish(s: Session, timeout: float) -> tuple[int, str, float]:
    """The session's exit code, output, and seconds it took from now."""
    t0 = time.monotonic()
    out, _ = s.proc.communicate(timeout=timeout)
    return s.proc.returncode, out.decode(errors="replace"), time.monotonic() - t0


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


@needs_proc
def test_sigint_during_a_case_leaves_no_server_and_the_baseline_whole(
    tmp_path, make_case, attempt
) -> None:
    rng = random.Random(f"sigint-{attempt}")
    baseline = tmp_path / "baselines" / "test-box.yaml"
    write_baselines(baseline, {"name": "test box"}, [make_case()])
    before = baseline.read_bytes()
    files = sorted(p.name for p in baseline.parent.iterdir())  # the file and its lock
    s = _start(tmp_path, "--specperf-update-baselines")
    delay = rng.uniform(0.0, 3.0)  # warm-up or measured blocks
    time.sleep(delay)
    s.proc.send_signal(signal.SIGINT)
    rc, out, dt = _finish(s, timeout=120)
    gone = _gone(s.pid)
    untouched = baseline.read_bytes() == before
    left = sorted(p.name for p in baseline.parent.iterdir())
    ok = rc == pytest.ExitCode.INTERRUPTED and gone and untouched and left == files
    BY.setdefault("sigint", fault_table.current_test())
    ROWS["sigint"].append(f"{'ok' if ok else 'BAD'} at {delay:.1f} s: exit {rc}, "
                          f"ended in {dt:.1f} s, file {'untouched' if untouched else 'CHANGED'}")  # fmt: skip
    assert rc == pytest.ExitCode.INTERRUPTED, out
    assert gone, "the server outlived the interrupted session"
    assert untouched and left == files, left  # no temporary file either


@needs_proc
def test_killed_server_fails_the_case_naming_the_signal(tmp_path, attempt) -> None:
    s = _mid_measurement(tmp_path, "killed", attempt)
    os.killpg(s.pid, signal.SIGKILL)
    rc, out, dt = _finish(s, timeout=60)
    gone = _gone(s.pid)
    named = "the server was killed by signal 9 (SIGKILL) during the case" in out
    clean = "During handling of the above exception" not in out and "server log (" in out
    ok = rc == pytest.ExitCode.TESTS_FAILED and named and clean and gone and dt < 10
    BY.setdefault("killed", fault_table.current_test())
    ROWS["killed"].append(f"{'ok' if ok else 'BAD'} failed in {dt:.1f} s")
    assert rc == pytest.ExitCode.TESTS_FAILED and named and clean, out
    assert dt < 10, f"took {dt:.1f} s to notice"
    assert gone


#: Seconds between a freeze and the end of the session: the stall (``STALL_S``, seen at
#: the next poll), then the teardown of the stopped server (SIGTERM, SIGCONT).
FROZEN_WITHIN_S = STALL_S + 1.0 + TEARDOWN_S


def _frozen_session(s: Session, kind: str) -> tuple[int, str, float, re.Match[str] | None]:
    """Freeze the server of ``s`` now; the session's exit, output, seconds and the stall."""
    os.kill(s.pid, signal.SIGSTOP)
    try:
        rc, out, dt = _finish(s, timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(s.pid, signal.SIGKILL)  # only if the session failed to
    found = re.search(r"server made no progress for ([0-9.]+) s during ([^,]+), ([^(]+)\(", out)
    gone = _gone(s.pid)
    ok = (rc == pytest.ExitCode.TESTS_FAILED and found is not None and dt <= FROZEN_WITHIN_S
          and "server log (" in out and gone)  # fmt: skip
    where = f"{found.group(2)}, {found.group(3).strip()}" if found else "no stall message"
    stall = f"{float(found.group(1)):.1f} s" if found else "-"
    BY.setdefault(kind, fault_table.current_test())
    ROWS[kind].append(f"{'ok' if ok else 'BAD'} stall {stall} ({where}), ended in {dt:.1f} s")
    assert rc == pytest.ExitCode.TESTS_FAILED and found, out
    assert dt <= FROZEN_WITHIN_S, f"ended {dt:.1f} s after the freeze"
    assert "server log (" in out and gone
    assert "During handling of the above exception" not in out
    return rc, out, dt, found


@needs_proc
def test_frozen_server_fails_the_case_within_its_deadline(tmp_path, attempt) -> None:
    s = _mid_measurement(tmp_path, "frozen", attempt)
    _frozen_session(s, "frozen")


@needs_proc
def test_first_frozen_request_is_caught_in_seconds(tmp_path, attempt) -> None:
    """Frozen in a case's first request, whose deadline is at least 120 s: caught by the
    server's progress within ``STALL_S``, naming the warm-up."""
    rng = random.Random(f"first-{attempt}")
    s = _start(tmp_path, env_extra=LONG_FIRST)
    time.sleep(rng.uniform(0.0, 0.5))  # the warm-up request: sent, or about to be
    assert FIRST_DEADLINE_FLOOR_S > FROZEN_WITHIN_S
    _, out, _, found = _frozen_session(s, "first")
    assert found is not None and "warm-up" in found.group(2), out


@needs_proc
def test_throttled_first_request_making_progress_is_not_killed(tmp_path, attempt) -> None:
    """A first request slowed to a crawl that still makes progress (2 s stopped, 0.5 s
    running, for 2.5 x ``STALL_S``) is never failed by the progress rule."""
    short = {**LONG_FIRST, "SPECPERF_FAULT_STEPS": "12"}  # the warm-up is what is throttled
    s = _start(tmp_path, "--specperf-max-time=0", env_extra=short)
    t0 = time.monotonic()
    stopped = 0.0
    while time.monotonic() - t0 < 2.5 * STALL_S and s.proc.poll() is None:
        os.kill(s.pid, signal.SIGSTOP)
        time.sleep(2.0)
        stopped += 2.0
        os.kill(s.pid, signal.SIGCONT)
        time.sleep(0.5)
    rc, out, _ = _finish(s, timeout=300)
    gone = _gone(s.pid)
    ok = rc == pytest.ExitCode.OK and "made no progress" not in out and gone
    BY.setdefault("throttled", fault_table.current_test())
    ROWS["throttled"].append(
        f"{'ok' if ok else 'BAD'} exit {rc} after {stopped:.0f} s stopped in "
        f"{time.monotonic() - t0:.1f} s, never failed as frozen"
    )
    assert rc == pytest.ExitCode.OK and "made no progress" not in out, out
    assert gone
