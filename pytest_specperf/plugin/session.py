"""Session state: settings, device, baselines, server, outcomes. State only, no policy.

One ``SpecperfSession`` per pytest session, stored in ``config.stash``; no globals. The
verdicts are decided in ``judging.judge`` (called from ``plugin.cases``), the summary is
written by ``reporting.terminal`` (called from ``plugin.finish``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_specperf.judging.baselines import (
    BaselineFile,
    CaseBaseline,
    WriteResult,
    load_baselines,
)
from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.plugin.options import Settings
from pytest_specperf.plugin.progress import Progress

if TYPE_CHECKING:
    from pytest_specperf.server.model_server import ModelServer
    from pytest_specperf.telemetry.device import DeviceInfo


class SpecperfWarning(pytest.PytestWarning):
    """A case that could not be judged (INVALID) or another condition worth a look."""


@dataclass
class SpecperfSession:
    config: pytest.Config
    settings: Settings
    progress: Progress
    #: judged cases, in the order they ran
    outcomes: list[CaseOutcome] = field(default_factory=list)
    #: cases to write with --specperf-update-baselines
    to_record: list[CaseBaseline] = field(default_factory=list)
    server: ModelServer | None = None
    #: what an update wrote
    written: WriteResult | None = None
    errors: list[str] = field(default_factory=list)
    telemetry_note: str | None = None
    notes: list[str] = field(default_factory=list)
    _device: DeviceInfo | None = None
    _baselines: BaselineFile | None = None
    _baselines_loaded: bool = False

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
        """The device's baseline file, read once; ``BaselineError`` if unusable."""
        if not self._baselines_loaded:
            self._baselines = load_baselines(
                self.baseline_path, max_bytes=self.settings.baseline_max_bytes
            )
            self._baselines_loaded = True
        return self._baselines


SESSION_KEY = pytest.StashKey[SpecperfSession]()


def get_session(config: pytest.Config) -> SpecperfSession:
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise RuntimeError(
            "pytest-specperf is not configured (was it disabled with -p no:specperf?)"
        ) from None
