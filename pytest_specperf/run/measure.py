"""Measure one case on one side: the decoders of its server processes, the automatic
extension, and the frozen ``DecodeRun`` the judge gets.

A side is the server processes that run a case the same way (``--specperf-processes``).
The same-run A/B comparison will measure two sides of one case, alternating their rounds
(A B B A) with :func:`start_side` and :func:`more_rounds`; today a case has one side.

The extension is a loop here, not a call back into the judge mid-flight: the caller hands
in ``undecided``, a pure function of the run so far (``run.cases.undecided``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pytest_specperf.judging.samples import DecodeRun, Window, build_run
from pytest_specperf.judging.significance import MAX_LOOKS
from pytest_specperf.server.client import ServerHTTPError, ServerUnreachable
from pytest_specperf.server.decoder import (
    CaseSpec,
    Decoder,
    Measured,
    MeasurementError,
    ServerExited,
    sampler_for,
)
from pytest_specperf.server.model_server import ModelServer
from pytest_specperf.server.supervisor import ServerStartError

if TYPE_CHECKING:
    from pytest_specperf.telemetry.device import DeviceInfo

#: What a measurement can fail with (the server, its HTTP, or a process that did not start).
FAILURES = (MeasurementError, ServerHTTPError, ServerUnreachable, ServerStartError)

#: The metrics a run leaves UNSTABLE that more rounds would decide (empty: decided).
Undecided = Callable[[DecodeRun], list[str]]


class Progress(Protocol):
    """A case's progress line: steps done, and seconds since the case started."""

    def update(self, done: int, total: int, note: str) -> None: ...

    def elapsed(self) -> float: ...


class Rounds(Protocol):
    """What the extension asks of a side's decoder (``server.decoder.Decoder``)."""

    server: ModelServer

    def measured(self, case: CaseSpec) -> Measured: ...

    def more(self, case: CaseSpec, *, note: str = "") -> bool: ...


class MeasurementFailed(RuntimeError):
    """A case's measurement broke off; the message names what happened and the log tail."""


@dataclass(frozen=True)
class Side:
    """The server processes that measure a case (the first one's run is the case's run,
    the others' are its ``siblings``)."""

    servers: tuple[ModelServer, ...]


@dataclass(frozen=True)
class Extension:
    """The automatic extension: more rounds while ``undecided`` names a metric and the
    next round fits in ``max_time_s`` (0: off)."""

    max_time_s: float
    undecided: Undecided


def extension(max_time_s: float, *, recording: bool, undecided: Undecided) -> Extension | None:
    """The case's automatic extension: none when recording (a baseline is measured as
    asked) or with no time for it."""
    if recording or max_time_s <= 0:
        return None
    return Extension(max_time_s, undecided)


def decode_run(measured: Measured) -> DecodeRun:
    """The frozen run of what a decoder measured."""
    m, case = measured, measured.case
    window = Window(
        fragmentation=m.fragmentation,
        wall_s=m.wall_s,
        warmup_steps=case.warmup_steps,
        reference=m.reference,
        telemetry=m.telemetry,
        cross_check=m.cross_check,
        server_pid=m.server_pid,
        rounds=m.rounds,
        round_steps=m.round_steps,
    )
    return build_run(
        m.records,
        m.blocks,
        context_len=case.context_len,
        batch_size=case.batch_size,
        layout=case.layout,
        window=window,
    )


def side_run(decoders: Sequence[Rounds], case: CaseSpec) -> DecodeRun:
    """The run of a side so far: the first process's, the others as its siblings."""
    runs = [decode_run(d.measured(case)) for d in decoders]
    return dataclasses.replace(runs[0], siblings=tuple(runs[1:]))


def measurement_failure(server: ModelServer, error: Exception) -> str:
    """The failure of a case whose measurement broke off: what happened (the server
    exited, stopped responding, or answered an error) and the server's log tail."""
    what = str(error)
    status = server.exit_status()
    if status is not None and not isinstance(error, ServerExited):
        what = f"the server {status} during the case ({what})"
    where = f" ({server.log_path})" if server.log_path is not None else ""
    return (
        f"specperf: measurement failed: {what}\nserver log{where}, last lines:\n{server.log_tail()}"
    )


@dataclass
class _Active:
    """The server being measured (named when its measurement fails)."""

    server: ModelServer


def start_side(side: Side, case: CaseSpec, progress: Progress, *, device: DeviceInfo,
               pids: tuple[int, ...], baseline_step_ms: float | None,
               active: _Active | None = None) -> tuple[list[Decoder], str]:  # fmt: skip
    """Warm up and measure the first round of ``case`` in every process of ``side``; the
    decoders (the caller closes them) and the telemetry note, if telemetry is missing.
    ``active`` follows the server being measured (to name it when it fails)."""
    decoders: list[Decoder] = []
    telemetry_note = ""
    n = len(side.servers)
    try:
        for i, server in enumerate(side.servers):
            if active is not None:
                active.server = server
            sampler, note = sampler_for(device, server, pids)
            telemetry_note = note or telemetry_note
            decoders.append(
                Decoder(server, progress.update, sampler=sampler, baseline_step_ms=baseline_step_ms)
            )
            decoders[-1].start(case, note=f"process {i + 1}/{n}" if n > 1 else "")
    except BaseException:
        for d in decoders:
            d.close()
        raise
    return decoders, telemetry_note


def more_rounds(decoders: Sequence[Rounds], case: CaseSpec, progress: Progress,
                extension: Extension, active: _Active | None = None) -> None:  # fmt: skip
    """More rounds of every process's blocks while some gated metric is UNSTABLE only for
    want of steps (``extension.undecided``), the next round fits in its time, and the
    case has looks left (``MAX_LOOKS``: the false-alarm budget is split over them)."""
    if extension.max_time_s <= 0:
        return
    round_s = progress.elapsed()  # the first round in every process, warm-ups included
    while True:
        metrics = extension.undecided(side_run(decoders, case))
        if not metrics:
            return
        if progress.elapsed() + round_s > extension.max_time_s:
            return  # the budget is spent: the verdict says so
        if decoders[0].measured(case).rounds >= MAX_LOOKS:
            return  # the false-alarm budget was split over MAX_LOOKS looks
        t0 = time.monotonic()
        note = f"round {decoders[0].measured(case).rounds + 1} ({', '.join(metrics)} undecided)"
        for d in decoders:
            if active is not None:
                active.server = d.server
            if not d.more(case, note=note):
                return
        round_s = time.monotonic() - t0


@dataclass(frozen=True)
class SideMeasurement:
    """A side's measured run of a case, and why it has no GPU telemetry (if so)."""

    run: DecodeRun
    telemetry_note: str


def measure_side(side: Side, case: CaseSpec, progress: Progress, *, device: DeviceInfo,
                 pids: tuple[int, ...], baseline_step_ms: float | None,
                 extension: Extension | None) -> SideMeasurement:  # fmt: skip
    """The first round of ``case`` in every process of ``side``, then the extension's
    rounds; ``MeasurementFailed`` naming the server whose measurement broke off."""
    active = _Active(side.servers[0])
    failure: str | None = None
    try:
        decoders, note = start_side(
            side, case, progress, device=device, pids=pids,
            baseline_step_ms=baseline_step_ms, active=active,
        )  # fmt: skip
        try:
            if extension is not None:
                more_rounds(decoders, case, progress, extension, active)
            return SideMeasurement(side_run(decoders, case), note)
        finally:
            for d in decoders:
                d.close()
    except FAILURES as e:
        failure = measurement_failure(active.server, e)
    raise MeasurementFailed(failure)  # raised here, not in the handler: no chained traceback
