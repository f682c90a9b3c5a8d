"""Session state: settings, device, baselines, server, outcomes. State only, no policy.

One ``SpecperfSession`` per pytest session, stored in ``config.stash``; no globals. The
verdicts are decided in ``judging.judge`` (called through ``run.cases``), the summary is
written by ``reporting.terminal`` (called from ``run.finish``).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_specperf.judging.baselines import BaselineFile, CaseBaseline
from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.plugin.options import Settings
from pytest_specperf.plugin.progress import Progress
from pytest_specperf.reporting.view import CaseView
from pytest_specperf.run.finish import Gathered, host_name
from pytest_specperf.run.inputs import RunInputs, load_inputs, refusal
from pytest_specperf.store.baselines import WriteResult

if TYPE_CHECKING:
    from pytest_specperf.run.cases import Reference
    from pytest_specperf.server.model_server import ModelServer
    from pytest_specperf.server.pool import ServerPool
    from pytest_specperf.telemetry.device import DeviceInfo


class SpecperfWarning(pytest.PytestWarning):
    """A case that could not be judged (INVALID) or another condition worth a look."""


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
    #: ``--specperf-ab``: the reference side's server processes, and what it is as typed
    reference_pool: ServerPool | None = None
    reference: Reference | None = None
    #: what an update wrote, per baseline file
    written: list[WriteResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    telemetry_note: str | None = None
    notes: list[str] = field(default_factory=list)
    #: pytest-xdist: the workers' results, gathered by the controller
    gathered: Gathered | None = None
    _device: DeviceInfo | None = None
    _inputs: RunInputs | None = None
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

    def inputs(self) -> RunInputs:
        """What every case is judged with (device, baselines, noise prior, history,
        bandwidth, sitting), read once, before the first case is measured."""
        if self._inputs is None:
            s = self.settings
            self._inputs = load_inputs(
                self.device(),
                baselines_dir=s.baselines_dir,
                baseline_max_bytes=s.baseline_max_bytes,
                history_dir=s.history_dir,
                sitting=self.sitting,
                display=self.display_path,
                ab=s.ab is not None,
                recording=s.update_baselines,
            )
            self.notes += self._inputs.notes
        return self._inputs

    def baselines(self) -> BaselineFile | None:
        """The device's baseline file, read once; ``BaselineError`` if unusable."""
        inputs = self.inputs()
        if inputs.baseline_error is not None:
            raise inputs.baseline_error
        return inputs.baselines

    def baseline_refusal(self) -> str | None:
        """Why the session must not measure anything (an unusable baseline file, or an
        update into another device's), read before its first server starts."""
        return refusal(self.inputs(), recording=self.settings.update_baselines)


SESSION_KEY = pytest.StashKey[SpecperfSession]()


def get_session(config: pytest.Config) -> SpecperfSession:
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise RuntimeError(
            "pytest-specperf is not configured (was it disabled with -p no:specperf?)"
        ) from None
