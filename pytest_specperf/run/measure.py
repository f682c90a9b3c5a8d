"""Measure one case on one side: the decoders of its server processes, the automatic
extension, and the frozen ``DecodeRun`` the judge gets.

A side is the server processes that run a case the same way (``--specperf-processes``).
An A/B run (``--specperf-ab``) measures two sides of one case, alternating their server
processes (``A1 B1 B2 A2``, ``judging.ab``) with :func:`measure_ab`.

The extension is a loop here, not a call back into the judge mid-flight: the caller hands
in ``undecided``, a pure function of the run so far (``run.cases.undecided``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pytest_specperf.judging.ab import REFERENCE, Slot, abba_order, describe_order, next_round
from pytest_specperf.judging.samples import DecodeRun, Window, build_run
from pytest_specperf.judging.significance import MAX_LOOKS, planned_looks
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


def side_run(decoders: Sequence[Rounds], case: CaseSpec, looks: int | None = None) -> DecodeRun:
    """The run of a side so far: the first process's, the others as its siblings;
    ``looks``: the looks the extension planned for it (``DecodeRun.looks``)."""
    runs = [decode_run(d.measured(case)) for d in decoders]
    return dataclasses.replace(runs[0], siblings=tuple(runs[1:]), looks=looks)


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
                extension: Extension, first_round_s: float,
                active: _Active | None = None) -> int:  # fmt: skip
    """More rounds of every process's blocks while some gated metric is UNSTABLE only for
    want of steps (``extension.undecided``), the next round fits in its time, and the
    case has looks left (those planned from ``first_round_s``, the first round's own time
    without the servers' starts, ``significance.planned_looks``: the false-alarm budget
    is spent over them). The looks planned."""
    if extension.max_time_s <= 0:
        return 1
    round_s = first_round_s  # the next round is predicted to take as long as the last
    looks = planned_looks(extension.max_time_s, first_round_s)
    while True:
        metrics = extension.undecided(side_run(decoders, case, looks))
        if not metrics:
            return looks
        if progress.elapsed() + round_s > extension.max_time_s:
            return looks  # the budget is spent: the verdict says so
        if decoders[0].measured(case).rounds >= looks:
            return looks  # the false-alarm budget was spent over the planned looks
        t0 = time.monotonic()
        note = f"round {decoders[0].measured(case).rounds + 1} ({', '.join(metrics)} undecided)"
        for d in decoders:
            if active is not None:
                active.server = d.server
            if not d.more(case, note=note):
                return looks
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
        t0 = time.monotonic()  # the first round's own time: the servers are up already
        decoders, note = start_side(
            side, case, progress, device=device, pids=pids,
            baseline_step_ms=baseline_step_ms, active=active,
        )  # fmt: skip
        try:
            looks = None
            if extension is not None:
                looks = more_rounds(decoders, case, progress, extension,
                                    time.monotonic() - t0, active)  # fmt: skip
            return SideMeasurement(side_run(decoders, case, looks), note)
        finally:
            for d in decoders:
                d.close()
    except FAILURES as e:
        failure = measurement_failure(active.server, e)
    raise MeasurementFailed(failure)  # raised here, not in the handler: no chained traceback


#: For an A/B case's extension: the metrics left UNSTABLE that more rounds would decide,
#: from the reference side's run, the tested side's run so far and the looks taken (a
#: side with fewer processes measures more than one round of a process per look).
UndecidedAB = Callable[[DecodeRun, DecodeRun, int], list[str]]


@dataclass(frozen=True)
class ABMeasurement:
    """An A/B case: the reference side's run (``a``), the tested side's (``b``), the order
    its processes were measured in, round by round, and why it has no GPU telemetry."""

    a: DecodeRun
    b: DecodeRun
    order: tuple[str, ...]
    telemetry_note: str


def _ab_runs(decoders: Mapping[Slot, Rounds], case: CaseSpec,
             looks: int | None = None) -> tuple[DecodeRun, DecodeRun]:  # fmt: skip
    def side(letter: str) -> DecodeRun:
        ds = [d for s, d in sorted(decoders.items(), key=lambda kv: kv[0].index)
              if s.side == letter]  # fmt: skip
        return side_run(ds, case, looks)

    return side(REFERENCE), side("B")


def _ab_round(order: Sequence[Slot], decoders: Mapping[Slot, Rounds], case: CaseSpec,
              active: _Active, note: str) -> bool:  # fmt: skip
    """One more round of every process, in ``order``; False when a process came back
    without measured steps (its rounds stay whole; the case is judged as it is)."""
    for slot in order:
        d = decoders[slot]
        active.server = d.server
        if not d.more(case, note=f"{slot}: {note}"):
            return False
    return True


def measure_ab(a: Side, b: Side, case: CaseSpec, progress: Progress, *, device: DeviceInfo,
               pids: tuple[int, ...], extension: tuple[float, UndecidedAB] | None,
               ) -> ABMeasurement:  # fmt: skip
    """An A/B case: the first round of every process of both sides in ``abba_order``
    (a side's process met again measures another round), then, while ``extension``'s
    function names an UNSTABLE metric, the next round fits in its seconds and the case
    has looks left (those planned from the first round's time, ``planned_looks``, at most
    ``MAX_LOOKS``, counted in ``order``'s entries, one per look: a side
    with fewer processes measures a process twice per look), further rounds in the
    mirrored order.
    ``MeasurementFailed`` naming the side and server whose measurement broke off."""
    sides = {REFERENCE: a, "B": b}
    active = _Active(b.servers[0])
    decoders: dict[Slot, Decoder] = {}
    order = abba_order(len(a.servers), len(b.servers))
    rounds = [describe_order(order)]
    note, failure, where = "", None, ""
    first = time.monotonic()  # the first round's own time (the servers are up already)
    try:
        try:
            for slot in order:
                where = f"side {slot.side} ({slot})"
                if slot in decoders:  # a side with fewer processes: another round
                    if not _ab_round([slot], decoders, case, active, "again"):
                        break
                    continue
                server = sides[slot.side].servers[slot.index]
                active.server = server
                started, n = start_side(Side((server,)), case, progress, device=device,
                                        pids=pids, baseline_step_ms=None)  # fmt: skip
                decoders[slot] = started[0]
                note = n or note
            last, t0 = order, progress.elapsed()
            first = time.monotonic() - first
            planned = None if extension is None else planned_looks(extension[0], first)
            while extension is not None and extension[0] > 0:
                looks = len(rounds)  # one entry per look, whatever the processes' rounds
                metrics = extension[1](*_ab_runs(decoders, case, planned), looks)
                if not metrics or looks >= (planned or MAX_LOOKS):
                    break
                if progress.elapsed() + t0 > extension[0]:
                    break  # the budget is spent: the verdict says so
                t1 = time.monotonic()
                last = next_round(last)
                where = f"look {looks + 1}"
                text = f"look {looks + 1} ({', '.join(metrics)} undecided)"
                if not _ab_round(last, decoders, case, active, text):
                    break
                rounds.append(describe_order(last))
                t0 = time.monotonic() - t1
            ra, rb = _ab_runs(decoders, case, planned)
            return ABMeasurement(ra, rb, tuple(rounds), note)
        finally:
            for d in decoders.values():
                d.close()
    except FAILURES as e:
        failure = measurement_failure(active.server, e).replace(
            "measurement failed:", f"measurement failed (A/B, {where}):", 1
        )
    raise MeasurementFailed(failure)  # raised here, not in the handler: no chained traceback
