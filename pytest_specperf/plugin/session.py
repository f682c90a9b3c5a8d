"""Session state: settings, device, baselines, server, outcomes. State only, no policy.

One ``SpecperfSession`` per pytest session, stored in ``config.stash``; no globals. The
verdicts are decided in ``judging.judge`` (called from ``plugin.cases``), the summary is
written by ``reporting.terminal`` (called from ``plugin.finish``).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_specperf.judging.baselines import BaselineFile, CaseBaseline, device_mismatch
from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.noise import PROVISIONAL_PRIOR, DevicePrior
from pytest_specperf.plugin.options import Settings
from pytest_specperf.plugin.progress import Progress
from pytest_specperf.reporting.view import CaseView
from pytest_specperf.store.baseline_io import BaselineError
from pytest_specperf.store.baselines import WriteResult, load_baselines

if TYPE_CHECKING:
    from pytest_specperf.server.model_server import ModelServer
    from pytest_specperf.server.pool import ServerPool
    from pytest_specperf.store.history_runs import History
    from pytest_specperf.telemetry.device import DeviceInfo


class SpecperfWarning(pytest.PytestWarning):
    """A case that could not be judged (INVALID) or another condition worth a look."""


def host_name() -> str:
    """This machine's name as a baseline run records it (printable, at most 64 chars)."""
    name = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return name[:64] or "unknown-host"


def new_sitting() -> str:
    """A sitting id: when (UTC, to the second), where (host) and which process started it,
    e.g. ``20261203T141502Z-box-4711``."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{host_name()[:40]}-{os.getpid()}"


@dataclass
class SpecperfSession:
    config: pytest.Config
    settings: Settings
    progress: Progress
    #: judged cases, in the order they ran
    outcomes: list[CaseOutcome] = field(default_factory=list)
    #: what the end-of-run reports show of each case (this process's and the workers')
    cases: list[CaseView] = field(default_factory=list)
    #: cases to write with --specperf-update-baselines
    to_record: list[CaseBaseline] = field(default_factory=list)
    server: ModelServer | None = None
    #: every server process of the session (``--specperf-processes``), the first is ``server``
    pool: ServerPool | None = None
    #: what an update wrote, per baseline file
    written: list[WriteResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    telemetry_note: str | None = None
    notes: list[str] = field(default_factory=list)
    #: pytest-xdist: the workers' results, gathered by the controller
    gathered: Gathered | None = None
    _device: DeviceInfo | None = None
    _baselines: BaselineFile | None = None
    _baselines_loaded: bool = False
    _baselines_error: BaselineError | None = None
    _history: History | None = None
    _prior: DevicePrior | None = None
    #: this session's sitting (one pytest session's servers, at one time on one host)
    sitting: str = field(default_factory=new_sitting)
    #: specperf tests the run judges (set when collection ends; the false-alarm budget's
    #: share per test, ``judging.significance``)
    judged_tests: int = 1

    def device(self) -> DeviceInfo:
        """The device the cases run on (detected once)."""
        if self._device is None:
            from pytest_specperf.telemetry.device import detect_device

            self._device = detect_device(override_slug=self.settings.device_slug)
        return self._device

    @property
    def baseline_path(self) -> Path:
        return self.settings.baselines_dir / f"{self.device().slug}.yaml"

    def display_path(self, path: Path) -> str:
        """``path`` relative to the rootdir where it lies below it."""
        try:
            return str(path.relative_to(self.config.rootpath))
        except ValueError:
            return str(path)

    def baselines(self) -> BaselineFile | None:
        """The device's baseline file, read once (a failed read too: every later call
        raises the same ``BaselineError`` without reading the file again)."""
        if not self._baselines_loaded:
            try:
                self._baselines = load_baselines(
                    self.baseline_path, max_bytes=self.settings.baseline_max_bytes
                )
            except BaselineError as e:
                self._baselines_error = e
            self._baselines_loaded = True
        if self._baselines_error is not None:
            raise BaselineError(self._baselines_error.path, self._baselines_error.problem)
        return self._baselines

    def foreign_baselines(self) -> str | None:
        """Whose the baseline file is when another device recorded it, else None."""
        bf = self.baselines()
        return device_mismatch(bf.device, self.device().to_dict()) if bf is not None else None

    def prior(self) -> DevicePrior:
        """The device's noise prior (the file beside the baselines, or the provisional
        one: a note says which), read once; ``BaselineError`` if the file is unusable."""
        if self._prior is None:
            from pytest_specperf.store.prior import load_prior, prior_path

            self._prior = load_prior(self.baseline_path)
            where = self.display_path(prior_path(self.baseline_path))
            if self._prior is PROVISIONAL_PRIOR:
                self.notes.append(f"{self._prior.describe()}; no prior file {where}")
            elif self._prior.provisional:
                self.notes.append(f"{self._prior.describe()} ({where})")
        return self._prior

    def history(self) -> History | None:
        """Earlier runs of the cases (``--specperf-history``), read once; None without it."""
        directory = self.settings.history_dir
        if directory is None:
            return None
        if self._history is None:
            from pytest_specperf.store.history_runs import load_history

            self._history = load_history(directory)
            self.notes.append(self._history.describe(self.display_path(directory)))
        return self._history


@dataclass
class Gathered:
    """What the pytest-xdist controller gathered from its workers (state only)."""

    workers: int
    #: baseline file -> (device as the workers detected it, cases to record there)
    to_record: dict[Path, tuple[dict[str, Any], list[CaseBaseline]]] = field(default_factory=dict)
    #: the first worker's device, its baseline file, and that file as shown
    device: dict[str, Any] | None = None
    baseline_path: str | None = None
    baselines: str | None = None
    backend_notes: list[str] = field(default_factory=list)
    servers: list[dict[str, Any]] = field(default_factory=list)
    #: node ids in collection order (the reports list cases in that order)
    order: list[str] = field(default_factory=list)


SESSION_KEY = pytest.StashKey[SpecperfSession]()


def get_session(config: pytest.Config) -> SpecperfSession:
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise RuntimeError(
            "pytest-specperf is not configured (was it disabled with -p no:specperf?)"
        ) from None
