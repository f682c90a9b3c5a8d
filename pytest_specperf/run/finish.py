"""End of the run: write the baselines and the reports, and say what happened.

No pytest here: the plugin's ``pytest_sessionfinish`` calls ``end_run`` with the session
(read through the ``RunState`` protocol) once the cases are in collection order, and its
``pytest_terminal_summary`` prints ``summary_lines``. In a pytest-xdist worker nothing is
written: the worker's results go to the controller (``plugin.xdist``), which writes the
baselines once and every report for all workers.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pytest_specperf.judging.baselines import CaseBaseline
from pytest_specperf.judging.canary import canary_missed
from pytest_specperf.judging.verdict import Verdict
from pytest_specperf.reporting.markdown import append_markdown, markdown_summary, write_markdown
from pytest_specperf.reporting.plot import write_svg
from pytest_specperf.reporting.terminal import RunSummary, run_summary
from pytest_specperf.store.baselines import BaselineError, format_moved, write_baselines
from pytest_specperf.store.report import comparison_json, payload_of_cases, write_report

if TYPE_CHECKING:
    from pytest_specperf.probe.inject import InjectSpec
    from pytest_specperf.reporting.view import CaseView
    from pytest_specperf.server.model_server import ModelServer
    from pytest_specperf.settings import ABSpec
    from pytest_specperf.store.baselines import WriteResult
    from pytest_specperf.telemetry.device import DeviceInfo

#: GitHub Actions' step summary file (Markdown appended there is shown on the run's page).
GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def host_name() -> str:
    """This machine's name as a baseline run records it (printable, at most 64 chars)."""
    name = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return name[:64] or "unknown-host"


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


class EndSettings(Protocol):
    """The settings the end of the run reads (``plugin.options.Settings`` has them)."""

    @property
    def backend(self) -> str: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def step_tolerance(self) -> float: ...
    @property
    def processes(self) -> int: ...
    @property
    def max_time_s(self) -> float: ...
    @property
    def update_baselines(self) -> bool: ...
    @property
    def strict(self) -> bool: ...
    @property
    def json_path(self) -> Path | None: ...
    @property
    def markdown_path(self) -> Path | None: ...
    @property
    def keep_runs(self) -> int: ...
    @property
    def baseline_max_bytes(self) -> int | None: ...
    @property
    def inject(self) -> InjectSpec | None: ...
    @property
    def ab(self) -> ABSpec | None: ...


class RunState(Protocol):
    """What the end of the run reads of the session, and the lists it appends to
    (``plugin.session.SpecperfSession`` is one)."""

    @property
    def settings(self) -> EndSettings: ...
    @property
    def to_record(self) -> list[CaseBaseline]: ...
    @property
    def cases(self) -> list[CaseView]: ...
    @property
    def written(self) -> list[WriteResult]: ...
    @property
    def errors(self) -> list[str]: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def telemetry_note(self) -> str | None: ...
    @property
    def gathered(self) -> Gathered | None: ...
    @property
    def server(self) -> ModelServer | None: ...
    @property
    def sitting(self) -> str: ...
    @property
    def baseline_path(self) -> Path: ...
    def device(self) -> DeviceInfo: ...
    def display_path(self, path: Path) -> str: ...


def _record_groups(
    sess: RunState,
) -> list[tuple[Path, dict[str, Any], Sequence[CaseBaseline]]]:
    """Baseline file, device and cases of each file an update writes."""
    groups: list[tuple[Path, dict[str, Any], Sequence[CaseBaseline]]] = []
    if sess.to_record:
        groups.append((sess.baseline_path, sess.device().to_dict(), sess.to_record))
    if sess.gathered is not None:
        groups += [(p, dev, cases) for p, (dev, cases) in sess.gathered.to_record.items()]
    return groups


def _write_baselines(sess: RunState, interrupted: bool) -> bool:
    """Write the recorded cases, once per baseline file; False when that failed."""
    groups = _record_groups(sess) if sess.settings.update_baselines else []
    if not groups:
        return True
    if interrupted:
        sess.errors.append("baselines not written: the run was interrupted")
        return True
    ok = True
    for path, device, cases in groups:
        try:
            sess.written.append(
                write_baselines(
                    path,
                    device,
                    cases,
                    keep_runs=sess.settings.keep_runs,
                    max_bytes=sess.settings.baseline_max_bytes,
                    sitting=sess.sitting,
                    host=host_name(),
                )
            )
        except (BaselineError, OSError) as e:
            sess.errors.append(f"baselines not written: {e}")
            ok = False
    return ok


def server_header(sess: RunState) -> dict[str, Any] | None:
    """The JSON report's ``server``: this process's server, if it started one."""
    srv = sess.server
    if srv is None:
        return None
    return {
        "url": srv.url,
        "attached": srv.attached,
        "startup_s": round(srv.startup_s, 3),
        "pid": srv.server_info.get("pid"),
        "notes": srv.backend.notes(),
        "log": str(srv.log_path or ""),
        "fingerprint": srv.fingerprint,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def _device(sess: RunState) -> dict[str, Any]:
    g = sess.gathered
    if g is not None and g.device is not None:
        return g.device
    return sess.device().to_dict()


def report_header(sess: RunState) -> dict[str, Any]:
    """Everything in the JSON report besides the cases."""
    s, g = sess.settings, sess.gathered
    servers = g.servers if g is not None else [h for h in [server_header(sess)] if h]
    return {
        "device": _device(sess),
        "backend": s.backend,
        "baselines": str(sess.baseline_path) if g is None else (g.baseline_path or ""),
        "tolerance": s.tolerance,
        "step_tolerance": s.step_tolerance,
        "processes": s.processes,
        "max_time_s": s.max_time_s,
        "update_baselines": s.update_baselines,
        "strict": s.strict,
        "server": servers[0] if servers else None,
        "servers": servers,
        "xdist_workers": g.workers if g is not None else 0,
        # how the cases were compared: against baseline files, or A/B in this run
        "comparison": comparison_json(str(s.ab) if s.ab is not None else None),
    }


def _write_json(sess: RunState, commit: Callable[[], dict[str, Any] | None],
                canary: dict[str, Any] | None = None) -> bool:  # fmt: skip
    path = sess.settings.json_path
    if path is None or not sess.cases:
        return True
    header = {
        **report_header(sess),
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "commit_info": commit(),
        "canary": canary,
    }
    try:
        write_report(path, payload_of_cases(header, [c.record for c in sess.cases]))
        title = f"pytest-specperf: {sess.settings.backend} on {device_slug(sess)}"
        write_svg(path.with_suffix(".svg"), sess.cases, title)
    except OSError as e:
        sess.errors.append(f"JSON report not written: {e}")
        return False
    return True


def _write_markdown(sess: RunState) -> bool:
    path = sess.settings.markdown_path
    step_summary = os.environ.get(GITHUB_STEP_SUMMARY)
    if path is None and not step_summary:
        return True
    if not sess.cases and not sess.errors:
        return True
    text = markdown_summary(run_summary_of(sess), sess.cases)
    ok = True
    for where, write in ((path, write_markdown), (step_summary, append_markdown)):
        if not where:
            continue
        try:
            write(Path(where), text)
        except OSError as e:
            sess.errors.append(f"Markdown summary not written to {where}: {e}")
            ok = False
    return ok


def _canary_json(sess: RunState, interrupted: bool) -> dict[str, Any] | None:
    """The run's canary as its JSON report states it: ``{"inject": "verify=1.1",
    "caught": false, "missed": "canary not detected: ..."}``, where ``caught`` says
    whether every injected part was named by a SLOWER gate of some case, whatever the
    verdicts; None without a canary (or when interrupted: nothing was judged in full)."""
    spec = sess.settings.inject
    if spec is None or interrupted or sess.settings.update_baselines:
        return None
    slower = [m.metric for c in sess.cases for m in c.metrics if m.verdict is Verdict.SLOWER]
    none = sum(c.verdict is Verdict.NO_BASELINE for c in sess.cases)
    missed = canary_missed(spec, slower, cases=len(sess.cases), no_baseline=none)
    return {"inject": str(spec), "caught": missed is None, "missed": missed}


class RunFailure(NamedTuple):
    """A check of the whole run that failed after its tests: ``check`` names it
    (``canary``, ``baselines``, ``json-report``, ``markdown``), ``why`` is what the summary's
    ERROR line says."""

    check: str
    why: str


def end_run(
    sess: RunState, *, interrupted: bool, commit: Callable[[], dict[str, Any] | None]
) -> list[RunFailure]:
    """Write baselines and reports; the run's failures (empty when none): a write that
    failed, a canary that was not caught. The run fails on any, its summary says why
    (``sess.errors``), the JSON report says it too. ``commit``: the commit the JSON report
    names (asked only when it is written)."""
    failures: list[RunFailure] = []

    def check(name: str, ok: Callable[[], bool]) -> None:
        before = len(sess.errors)
        if not ok():
            failures.append(RunFailure(name, "\n".join(sess.errors[before:]) or name))

    check("baselines", lambda: _write_baselines(sess, interrupted))
    canary = _canary_json(sess, interrupted)
    check("json-report", lambda: _write_json(sess, commit, canary))
    if canary is not None and canary["missed"] is not None:
        sess.errors.append(canary["missed"])
        failures.append(RunFailure("canary", canary["missed"]))
    check("markdown", lambda: _write_markdown(sess))
    return failures


def _written_lines(sess: RunState) -> tuple[str, ...]:
    """``baselines written: ...``, what moved per recorded case, and the store's notes."""
    lines: list[str] = []
    for w in sess.written:
        lines.append(
            f"baselines written: {sess.display_path(w.path)} ({w.recorded} case(s) recorded, "
            f"{w.case_count() - w.recorded} kept); what moved:"
        )
        lines += [f"  {line}" for line in format_moved(w.moved)]
        lines += w.notes
    return tuple(lines)


def device_slug(sess: RunState) -> str:
    """The device the cases ran on (as the xdist workers detected it, under xdist)."""
    g = sess.gathered
    if g is not None:
        return str(g.device.get("slug", "?")) if g.device is not None else "(no worker ran)"
    return sess.device().slug


def _backend_notes(sess: RunState) -> tuple[str, ...]:
    if sess.gathered is not None:
        return tuple(sess.gathered.backend_notes)
    return tuple(sess.server.backend.notes()) if sess.server is not None else ()


def run_summary_of(sess: RunState) -> RunSummary:
    """What the summary says besides the cases."""
    s, g = sess.settings, sess.gathered
    json_ok = s.json_path is not None and not any(e.startswith("JSON") for e in sess.errors)
    return RunSummary(
        backend=s.backend,
        device_slug=device_slug(sess),
        baselines=(g.baselines or "-") if g is not None else sess.display_path(sess.baseline_path),
        tolerance=s.tolerance,
        step_tolerance=s.step_tolerance,
        update=s.update_baselines,
        inject=str(s.inject) if s.inject else None,
        telemetry_note=sess.telemetry_note,
        backend_notes=_backend_notes(sess),
        notes=tuple(sess.notes),
        written=_written_lines(sess),
        json_path=str(s.json_path) if json_ok else None,
        errors=tuple(sess.errors),
        strict=s.strict,
        workers=g.workers if g is not None else 0,
        max_time_s=None if s.update_baselines else s.max_time_s,
        processes=s.processes,
        ab=str(s.ab) if s.ab is not None else None,
    )


def summary_lines(sess: RunState) -> list[str]:
    """The lines printed after pytest's own summary."""
    if not sess.cases and not sess.errors:
        return []
    return run_summary(run_summary_of(sess), sess.cases)
