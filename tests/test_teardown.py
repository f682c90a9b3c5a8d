"""No server survives: a normal end, Ctrl-C, or the pytest process being killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e import alive, sigint_default

pytestmark = pytest.mark.timeout(300)

SLOW_CASE = """
import json, os, time
from pathlib import Path

def test_hold(model_server):
    info = {"pid": model_server.server_info["pid"]}
    Path(os.environ["SPECPERF_TEST_PIDFILE"]).write_text(json.dumps(info))
    time.sleep(120)
"""


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    (tmp_path / "test_hold.py").write_text(SLOW_CASE)
    pidfile = tmp_path / "pid.json"
    env = {**os.environ, "SPECPERF_TEST_PIDFILE": str(pidfile)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_hold.py", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=sigint_default,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not pidfile.exists():
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)
    time.sleep(0.2)
    return proc, json.loads(pidfile.read_text())["pid"]


def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.2)
    return False


def test_ctrl_c_tears_the_server_down(tmp_path):
    proc, server_pid = _start(tmp_path)
    assert alive(server_pid)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    assert _gone(server_pid), "the server survived Ctrl-C"


def test_killed_pytest_takes_the_server_with_it(tmp_path):
    """SIGKILL leaves no chance to clean up: the server's parent-death signal does it."""
    proc, server_pid = _start(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    assert _gone(server_pid), "the server outlived a killed pytest"
