"""Attach mode end to end: what a bad URL is called (within the deadline), and canaries
without relaunch: ``--specperf-inject`` and ``specperf calibrate --attach`` against
one running reference server, switched through the control file in its run directory."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import SHORT_RUN
from rawhttp import launch_reference, serve

from pytest_specperf.probe.inject import CONTROL_FILE, parse_inject, write_control
from pytest_specperf.server.client import ATTACH_DEADLINE_S, ServerClient
from pytest_specperf.store.report import read_report

pytestmark = pytest.mark.timeout(300)

CASE = """
import pytest

@pytest.mark.specperf(gate=["verify"])
def test_decode(specperf):
    run = specperf.decode(context_len=2048)
    print("INJECTED", run.injected)
"""
ARGS = (*SHORT_RUN, "-s")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerClient, Path]]:
    work = tmp_path_factory.mktemp("attach")
    proc, client = launch_reference(work)
    yield client, work / "run"
    proc.stop()


def _attached(pytester: pytest.Pytester, url: str, *extra: str) -> pytest.RunResult:
    pytester.makepyfile(test_case=CASE)
    return pytester.runpytest_subprocess(*ARGS, f"--specperf-attach={url}", *extra, timeout=180)


def test_inject_reaches_an_attached_server_and_is_removed_after(pytester, server) -> None:
    client, run_dir = server
    result = _attached(pytester, client.base_url, "--specperf-inject=verify=1.5")
    result.assert_outcomes(passed=1, failed=1)  # no baseline named verify: specperf::canary
    result.stdout.fnmatch_lines([
        "*injecting verify=1.5 into the attached server (control file)*",
        "*INJECTED verify=1.5",
        "*test_decode ctx=2048 kv=contiguous bs=1*[[]injected[]]*",
    ])  # fmt: skip
    assert not (run_dir / CONTROL_FILE).exists()
    result = _attached(pytester, client.base_url)  # the next session: the server is clean
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*INJECTED None"])


def test_a_control_file_left_by_a_killed_session_is_removed(pytester, server) -> None:
    client, run_dir = server
    write_control(run_dir, parse_inject("verify=2"))
    result = _attached(pytester, client.base_url)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*INJECTED None"])
    assert not (run_dir / CONTROL_FILE).exists()


RECORD_INJECTED = """
from pytest_specperf.probe.inject import parse_inject, write_control

def test_decode(specperf):
    # another process's canary, switched on while this session runs
    write_control(specperf.server.run_dir, parse_inject("verify=1.3"))
    run = specperf.decode(context_len=2048, warmup=40)
    assert run.injected == "verify=1.3"
"""


def test_an_injected_run_is_never_recorded_as_a_baseline(pytester, server) -> None:
    client, run_dir = server
    pytester.makepyfile(test_case=RECORD_INJECTED)
    try:
        result = pytester.runpytest_subprocess(
            *ARGS, f"--specperf-attach={client.base_url}", "--specperf-update-baselines",
            timeout=180,
        )  # fmt: skip
    finally:
        (run_dir / CONTROL_FILE).unlink(missing_ok=True)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*refusing to record ctx=2048 kv=contiguous bs=1 as a baseline: the server injected a "
        f"canary slowdown (verify=1.3); restart it without SPECPERF_INJECT, or remove {CONTROL_FILE}*"
    ])  # fmt: skip
    assert not (pytester.path / "baselines").exists()


def test_calibrate_against_one_running_server(pytester, server, tmp_path) -> None:
    client, run_dir = server
    pytester.makepyfile(test_case=CASE)
    work, out = tmp_path / "cal", tmp_path / "cal.json"
    cmd = [sys.executable, "-m", "pytest_specperf", "calibrate", "--repetitions", "1",
           "--inject", "verify=3", "--attach", client.base_url,
           "--work-dir", str(work), "--json", str(out), "--", "test_case.py", *ARGS[:-1]]  # fmt: skip
    proc = subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(out.read_text())
    rows = {r["condition"]: r for r in summary["conditions"]}
    assert all(r["runs"] == 1 for r in rows.values())
    # verify=3 triples verify: its verify/rest grew far beyond any drift (the verdict itself
    # may say UNSTABLE when a loaded machine disturbed the baseline; the growth does not)
    verify = {m.metric: m for m in read_report(work / "rep00-verify_3.json").cases[0].metrics}
    assert verify["verify"].change > 1.0, verify["verify"]
    aa = {m.metric: m for m in read_report(work / "rep00-A_A.json").cases[0].metrics}
    assert aa["verify"].change < verify["verify"].change / 2
    logs = {p.name: p.read_text() for p in (work / "raw").glob("*.log")}  # raw/: not committed
    injected = {name for name, text in logs.items() if "canary injection active" in text}
    assert injected == {n for n in logs if n.startswith(("rep00-verify", "rep00-host_stall"))}
    assert len(injected) == 2 and "rep00-A_A.log" in logs and "baseline.log" in logs
    assert "starting reference server" not in "".join(logs.values())  # never relaunched
    assert not (run_dir / CONTROL_FILE).exists()


# -- what a URL that is not a usable server is called --------------------------------------


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _json(self, status: int, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _NotFound(_Quiet):
    def do_GET(self) -> None:
        self.send_error(404)


class _OtherJSON(_Quiet):
    def do_GET(self) -> None:
        self._json(200, {"status": "ok"})


class _CannotGenerate(_Quiet):
    def do_GET(self) -> None:
        if self.path == "/server_info":
            self._json(200, {"version": "x", "fingerprint": {}, "config": {}, "run_dir": "/"})
        else:
            self._json(503, {"error": {"message": "model still loading"}})


@pytest.fixture
def url(request) -> Iterator[str]:
    kind = request.param
    if kind == "refused":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    elif kind == "silent":  # accepts connections, never answers
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(8)
            yield f"http://127.0.0.1:{s.getsockname()[1]}"
    else:
        yield from serve({"404": _NotFound, "other": _OtherJSON, "busy": _CannotGenerate}[kind])


@pytest.mark.parametrize(("url", "says"), [
    ("refused", "connection refused: nothing listens at http://127.0.0.1:*"),
    ("silent", f"timed out: http://127.0.0.1:* gave no answer to GET /server_info within {ATTACH_DEADLINE_S:g} s*"),
    ("404", "HTTP 404 from GET http://127.0.0.1:*/server_info: *"),
    ("other", "not a specperf server: GET http://127.0.0.1:*/server_info lacks fingerprint, config, run_dir*"),
    ("busy", "*answers /server_info but cannot generate: GET */health_generate -> HTTP 503: model still loading*"),
], indirect=["url"])  # fmt: skip
def test_attach_errors_say_what_is_wrong_within_the_deadline(pytester, url, says) -> None:
    pytester.makepyfile(test_case=CASE)
    t0 = time.monotonic()
    result = pytester.runpytest_inprocess(f"--specperf-attach={url}", "-p", "no:cacheprovider")
    assert time.monotonic() - t0 < ATTACH_DEADLINE_S + 5  # the session itself: a busy box
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*specperf: cannot start the reference server: cannot attach to {url}: {says}"])
    result.stdout.no_fnmatch_line("*During handling of the above exception*")


def test_a_server_whose_probe_cannot_switch_fails_the_session_and_is_left_as_it_was(
    pytester, tmp_path
) -> None:
    proc, client = launch_reference(tmp_path, "--no-probe")  # no probe: nothing reads the file
    try:
        result = _attached(pytester, client.base_url, "--specperf-inject=verify=1.5")
    finally:
        proc.stop()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*cannot start the reference server: switching the injection: the server ran * decode "
        "steps for request * but the probe recorded 0*"
    ])  # fmt: skip
    assert not (tmp_path / "run" / CONTROL_FILE).exists()
