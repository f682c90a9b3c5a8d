"""The decoder against a real reference server: blocks, records, and the telemetry window."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.engines import get_backend
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.run.measure import decode_run
from pytest_specperf.server.decoder import CaseSpec, Decoder
from pytest_specperf.server.model_server import ModelServer, start_server
from pytest_specperf.server.protocol import BackendSettings
from pytest_specperf.telemetry.summary import TelemetrySummary


class FakeSampler:
    """Test double of ``TelemetrySampler``: records when it runs and the windows it gets."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.windows: list[tuple[int, int]] = []

    def start(self) -> None:
        self.calls.append("start")

    def add_windows(self, spans: Iterable[tuple[int, int]]) -> None:
        self.windows += list(spans)

    def stop(self) -> TelemetrySummary:
        self.calls.append("stop")
        return TelemetrySummary(available=True, samples=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterable[ModelServer]:
    srv = start_server(
        get_backend("reference"),
        BackendSettings(server_args=("--threads=1",)),
        work_dir=tmp_path_factory.mktemp("decoder"),
        ready_timeout_s=120,
        progress=lambda *a, **k: None,
    )
    yield srv
    srv.stop()


def test_blocks_of_a_case(server: ModelServer) -> None:
    decoder = Decoder(server, lambda done, total, note: None)
    try:
        run = decode_run(decoder.decode(CaseSpec(1024, 1, 8, 2, KVLayout("contiguous", 0.0), "t")))
    finally:
        decoder.close()
    assert run.steps == 8 and len(set(run.blocks)) == 4  # blocks of 2 steps
    assert run.telemetry is None and run.utilizations == {}


def test_a_block_runs_its_wanted_steps_only(server: ModelServer) -> None:
    """The server ends a measured request on its last wanted step (the dropped first
    step and the block's), not a few steps later at its token ceiling; the warm-up runs
    the warm-up steps asked for."""
    steps_run: list[int] = []
    decoder = Decoder(server, lambda done, total, note: None)
    request = decoder._request

    def counting(*args: Any, **kwargs: Any) -> Any:
        recs, metas = request(*args, **kwargs)
        steps_run.append(max(int(m["spec_verify_ct"]) for m in metas))
        return recs, metas

    decoder._request = counting  # type: ignore[method-assign]
    try:
        run = decode_run(decoder.decode(CaseSpec(1024, 1, 8, 3, KVLayout("contiguous", 0.0), "t")))
    finally:
        decoder.close()
    assert run.steps == 8
    assert steps_run == [3, 3, 3, 3, 3]  # warm-up 3; blocks of 1 dropped + 2 measured


def test_telemetry_samples_one_long_decode_after_the_blocks(server: ModelServer) -> None:
    sampler = FakeSampler()
    decoder = Decoder(server, lambda done, total, note: None, sampler=sampler)  # type: ignore[arg-type]
    try:
        run = decode_run(decoder.decode(CaseSpec(1024, 1, 8, 2, KVLayout("contiguous", 0.0), "t")))
    finally:
        decoder.close()
    assert sampler.calls == ["start", "stop"]
    assert run.telemetry is not None and run.telemetry.samples == 3
    # the windows are decode steps of a request after the measured ones, at least 1 s
    first_window = min(w[0] for w in sampler.windows)
    last_measured = max(r.wall_ns + r.step_ns for r in run.records)
    assert first_window > last_measured
    covered = sum(b - a for a, b in sampler.windows) / 1e9
    assert covered >= 0.5, covered  # ~1 s of steps (step times vary: a floor, not exact)


def test_run_dir_of_a_launch_is_fresh_and_private(server: ModelServer) -> None:
    rd = Path(server.run_dir)
    assert rd.is_dir() and (rd.stat().st_mode & 0o777) == 0o700
