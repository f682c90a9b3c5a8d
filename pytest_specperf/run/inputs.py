"""What every case of a run is judged with, loaded once into one frozen record: the
device, its baseline file, the earlier runs (``--specperf-history``) and the device's
peak memory bandwidth."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_specperf.judging.baselines import BaselineFile
from pytest_specperf.judging.judge import HistoryRun
from pytest_specperf.store.baselines import BaselineError, load_baselines

if TYPE_CHECKING:
    from pytest_specperf.store.history_runs import History
    from pytest_specperf.telemetry.device import DeviceInfo


@dataclass(frozen=True)
class RunInputs:
    """The run's inputs; ``baseline_error`` says why the baseline file is unusable
    (every case then fails naming it), ``history_note`` what the history held."""

    device: DeviceInfo
    baseline_path: Path
    baselines: BaselineFile | None
    baseline_error: BaselineError | None
    history: History | None
    history_note: str | None
    peak_bandwidth_bytes_per_s: float | None

    def history_of(self, test: str, key: str) -> tuple[HistoryRun, ...]:
        """The earlier runs of a case (empty without ``--specperf-history``)."""
        return self.history.of(test, key) if self.history is not None else ()


def peak_bandwidth(device: DeviceInfo) -> float | None:
    """The device's peak memory bandwidth in bytes/s (None on a CPU or if unknown)."""
    if device.kind != "cuda":
        return None
    from pytest_specperf.telemetry.bandwidth import peak_bandwidth as lookup

    pb = lookup(device.name, device.nvml_index)
    return pb.bytes_per_s if pb is not None else None


def load_inputs(device: DeviceInfo, *, baselines_dir: Path, baseline_max_bytes: int | None,
                history_dir: Path | None, shown: str | None = None) -> RunInputs:  # fmt: skip
    """Read the device's baseline file and the history once. ``shown``: the history
    directory as the notes name it (default: its path)."""
    bandwidth = peak_bandwidth(device)
    path = baselines_dir / f"{device.slug}.yaml"
    baselines, error = None, None
    try:
        baselines = load_baselines(path, max_bytes=baseline_max_bytes)
    except BaselineError as e:
        error = e
    history, note = None, None
    if history_dir is not None:
        from pytest_specperf.store.history_runs import load_history

        history = load_history(history_dir)
        note = history.describe(shown or str(history_dir))
    return RunInputs(device, path, baselines, error, history, note, bandwidth)
