"""The servers of a side: launched from a ``ServerSpec`` (or attached to), the extra
processes of ``--specperf-processes`` started on first need, all stopped together.

A ``ServerSpec`` is what makes one side of a case: an A/B run (``--specperf-ab``) holds
two, the build under test's and the reference side's (``reference_spec``), and measures
every case on both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_specperf.engines import get_backend
from pytest_specperf.judging.noise import MAX_PROCESSES
from pytest_specperf.probe.inject import InjectSpec
from pytest_specperf.server.control import ControlError, release, take_control
from pytest_specperf.server.model_server import ModelServer, attach_server, start_server
from pytest_specperf.server.pool import ServerPool
from pytest_specperf.server.protocol import BackendSettings
from pytest_specperf.settings import ABSpec

#: A line on the progress display.
Say = Callable[[str], None]


@dataclass(frozen=True)
class ServerSpec:
    """How a side's servers come to be: the backend launched with ``settings``, or, with
    ``url``, a server someone else started (its records in ``run_dir``)."""

    backend: str
    settings: BackendSettings
    ready_timeout_s: float
    url: str | None = None
    run_dir: Path | None = None
    #: the canary put into an attached server through its control file
    inject: InjectSpec | None = None


def reference_spec(tested: ServerSpec, ab: ABSpec) -> ServerSpec:
    """The reference side of an A/B run: the running server at ``ab.url``, or the tested
    side's launch with ``ab.python`` as its interpreter and ``ab.args`` after its server
    arguments. Never injected: ``--specperf-inject`` slows the side under test only."""
    if ab.url is not None:
        return replace(tested, url=ab.url, run_dir=ab.run_dir, inject=None)
    settings = replace(
        tested.settings,
        python=ab.python,
        server_args=(*tested.settings.server_args, *ab.args),
        inject=None,
    )
    return replace(tested, settings=settings, url=None, run_dir=None, inject=None)


@dataclass
class Servers:
    """A side's running servers: the pool, and whether this run holds the attached
    server's control file (released when the servers stop)."""

    pool: ServerPool
    controlled: bool

    @property
    def first(self) -> ModelServer:
        return self.pool.first

    def stop(self, note: Say) -> None:
        """Release the control file (a failure is a note) and stop every server."""
        try:
            if self.controlled:
                try:
                    release(self.first)
                except ControlError as e:
                    note(f"the attached server's injection was removed but not confirmed: {e}")
        finally:
            self.pool.stop()


def _launch(spec: ServerSpec, settings: BackendSettings, work_dir: Path,
            say: Say) -> ModelServer:  # fmt: skip
    return start_server(
        get_backend(spec.backend),
        settings,
        work_dir=work_dir,
        ready_timeout_s=spec.ready_timeout_s,
        progress=say,
    )


def open_servers(spec: ServerSpec, *, work_dir: Callable[[str], Path], parallel: int,
                 processes: int, say: Say) -> Servers:  # fmt: skip
    """Launch (or attach to) the first server; the others of ``processes`` start on first
    need (``work_dir(name)``: a fresh directory). ``parallel``: servers side by side, one
    per pytest-xdist worker (the first one's launch settings say so)."""
    if spec.url:
        server = attach_server(get_backend(spec.backend), spec.url, spec.run_dir)
        try:
            if spec.inject is not None:
                say(f"injecting {spec.inject} into the attached server (control file)")
            controlled = take_control(server, spec.inject)
        except BaseException:
            server.stop()
            raise
    else:
        first = replace(spec.settings, parallel=parallel)
        server, controlled = _launch(spec, first, work_dir("specperf"), say), False

    def start_more(index: int) -> ModelServer:
        say(f"starting server process {index} of {processes}")
        return _launch(spec, spec.settings, work_dir(f"specperf-p{index}"), say)

    return Servers(ServerPool(server, start_more, limit=MAX_PROCESSES), controlled)
