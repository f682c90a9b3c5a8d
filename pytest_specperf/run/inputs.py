"""What every case of a run is judged with, loaded once into one frozen record: the
device, its baseline file and noise prior, the earlier runs (``--specperf-history``),
the device's peak memory bandwidth, and the run's sitting."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_specperf.judging.baselines import BaselineFile, cpu_changed, device_mismatch
from pytest_specperf.judging.judge import HistoryRun
from pytest_specperf.judging.noise import PROVISIONAL_PRIOR, DevicePrior
from pytest_specperf.store.baselines import BaselineError, load_baselines

if TYPE_CHECKING:
    from pytest_specperf.store.history_runs import History
    from pytest_specperf.telemetry.device import DeviceInfo


@dataclass(frozen=True)
class RunInputs:
    """The run's inputs. ``baseline_error`` says why the baseline file (or the prior file
    beside it) is unusable: every case then fails naming it. ``notes``: what the run's
    summary says of them (the history read, a provisional prior)."""

    device: DeviceInfo
    baseline_path: Path
    baselines: BaselineFile | None
    baseline_error: BaselineError | None
    history: History | None
    notes: tuple[str, ...]
    peak_bandwidth_bytes_per_s: float | None
    prior: DevicePrior = PROVISIONAL_PRIOR
    #: this run's sitting id (one pytest session's servers, at one time on one host)
    sitting: str | None = None
    #: whose the baseline file is when another device recorded it (never judged against)
    foreign: str | None = None

    def history_of(self, test: str, key: str, *, ab: bool = False) -> tuple[HistoryRun, ...]:
        """The earlier runs of a case measured the way this one is (``ab``: the tested
        side of an A/B run; else against stored baselines); empty without
        ``--specperf-history``."""
        runs = self.history.of(test, key) if self.history is not None else ()
        return tuple(h for h in runs if h.ab is ab)


def peak_bandwidth(device: DeviceInfo) -> float | None:
    """The device's peak memory bandwidth in bytes/s (None on a CPU or if unknown)."""
    if device.kind != "cuda":
        return None
    from pytest_specperf.telemetry.bandwidth import peak_bandwidth as lookup

    pb = lookup(device.name, device.nvml_index)
    return pb.bytes_per_s if pb is not None else None


def _prior(baseline_path: Path, display: Callable[[Path], str]) -> tuple[DevicePrior, str]:
    """The device's noise prior (the file beside the baselines, or the provisional one)
    and the note saying which, if provisional; ``BaselineError`` if the file is unusable."""
    from pytest_specperf.store.prior import load_prior, prior_path

    prior = load_prior(baseline_path)
    where = display(prior_path(baseline_path))
    if prior is PROVISIONAL_PRIOR:
        return prior, f"{prior.describe()}; no prior file {where}"
    return prior, f"{prior.describe()} ({where})" if prior.provisional else ""


def load_inputs(device: DeviceInfo, *, baselines_dir: Path, baseline_max_bytes: int | None,
                history_dir: Path | None, sitting: str | None = None,
                display: Callable[[Path], str] = str, ab: bool = False,
                recording: bool = False) -> RunInputs:  # fmt: skip
    """Read the device's baseline file, its noise prior and the history once.
    ``display``: a path as the notes name it; ``ab``: the run judges A/B in one run (the
    file only marks cases not gated), ``recording``: it updates the file."""
    bandwidth = peak_bandwidth(device)
    path = baselines_dir / f"{device.slug}.yaml"
    baselines, error, prior, notes = None, None, PROVISIONAL_PRIOR, []
    try:
        baselines = load_baselines(path, max_bytes=baseline_max_bytes)
    except BaselineError as e:
        error = e
    history = None
    if history_dir is not None:
        from pytest_specperf.store.history_runs import load_history

        history = load_history(history_dir)
        notes.append(history.describe(display(history_dir)))
    if error is None:
        try:
            prior, note = _prior(path, display)
            notes += [note] if note else []
        except BaselineError as e:
            error = e
    foreign = device_mismatch(baselines.device, device.to_dict()) if baselines else None
    if baselines is not None and foreign is None and not ab:
        moved = cpu_changed(baselines.device, device.to_dict(), recording=recording)
        notes += [moved] if moved else []
    return RunInputs(device, path, baselines, error, history, tuple(notes), bandwidth, prior,
                     sitting, foreign)  # fmt: skip


#: What to do about a baseline file another device recorded.
FOREIGN_FIX = (
    "move the file away (or point --specperf-baselines elsewhere) and record this "
    "device's with --specperf-update-baselines"
)


def refusal(inputs: RunInputs, *, recording: bool) -> str | None:
    """Why the run must not measure anything, known before its first server starts: an
    unusable baseline file (the message names the file, the place and the fix), or an
    update into a file another device recorded."""
    if inputs.baseline_error is not None:
        return f"specperf: refused before measuring anything: {inputs.baseline_error}"
    if inputs.foreign is not None and recording:
        return (
            f"specperf: refused before measuring anything: {inputs.baseline_path}: "
            f"{inputs.foreign}; an update would mix the two devices' runs: {FOREIGN_FIX}"
        )
    return None
