"""Launch a server process, wait until it serves, and always tear it down.

The server runs in its own session (process group), its stdout and stderr go to a log
file that is kept, and teardown signals the whole group: SIGTERM, then SIGKILL after a
grace period. On Linux the child also gets SIGTERM if the pytest process dies without
cleaning up (``PR_SET_PDEATHSIG``), so no server outlives a killed test run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pytest_specperf.server.client import ServerClient


class ServerStartError(RuntimeError):
    """The server exited or did not become ready in time; the message has the log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def set_pdeathsig() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def describe_exit(code: int | None) -> str | None:
    """A ``Popen.returncode`` in words; None for a process still running."""
    if code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


class ServerProcess:
    """One supervised server subprocess."""

    def __init__(
        self,
        cmd: list[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        name: str = "server",
    ) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            log.write(f"$ {' '.join(self.cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=set_pdeathsig,
            )
        except OSError as e:
            raise ServerStartError(f"cannot start {self.name}: {e}") from None
        finally:
            log.close()
        atexit.register(self.stop)

    def exit_status(self) -> str | None:
        """How the process ended ("exited with code 1", "was killed by signal 9 (SIGKILL)"),
        or None while it runs (or before it started)."""
        if self.proc is None:
            return None
        return describe_exit(self.proc.poll())

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(
        self,
        client: ServerClient,
        *,
        deadline_s: float,
        progress: Callable[[float], None] | None = None,
    ) -> float:
        """Poll ``/health_generate`` until it answers 200; return the seconds it took."""
        t0 = time.monotonic()
        assert self.proc is not None
        while True:
            status = self.exit_status()
            if status is not None:
                raise ServerStartError(
                    f"{self.name} {status} before becoming ready "
                    f"(log: {self.log_path}); last lines:\n{self.log_tail()}"
                )
            if client.health_generate(timeout=10.0):
                return time.monotonic() - t0
            elapsed = time.monotonic() - t0
            if elapsed > deadline_s:
                self.stop()
                raise ServerStartError(
                    f"{self.name} not ready after {deadline_s:.0f} s (log: {self.log_path}); "
                    f"last lines:\n{self.log_tail()}"
                )
            if progress is not None:
                progress(elapsed)
            time.sleep(0.1)  # one call in flight at a time; a refused connect costs nothing

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL it after ``grace_s``; return the exit code."""
        proc = self.proc
        if proc is None:
            return None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        pgid = proc.pid  # start_new_session: the child leads its own group
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
                if sig == signal.SIGTERM:  # a stopped (SIGSTOP) server acts on it only now
                    os.killpg(pgid, signal.SIGCONT)
            try:
                proc.wait(timeout=wait)
                # The leader is gone; make sure no group member (a scheduler) survives it.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None
        return proc.returncode
