"""End of the session: write the baselines and the reports, and say what happened."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from pytest_specperf.judging.baselines import BaselineError, format_moved, write_baselines
from pytest_specperf.plugin.benchmark import commit_info
from pytest_specperf.plugin.session import SpecperfSession
from pytest_specperf.reporting.plot import write_svg
from pytest_specperf.reporting.report import report_payload, write_report
from pytest_specperf.reporting.terminal import RunSummary, run_summary


def _write_baselines(sess: SpecperfSession, interrupted: bool) -> bool:
    """Write the recorded cases; False when that failed."""
    if not (sess.settings.update_baselines and sess.to_record):
        return True
    if interrupted:
        sess.errors.append("baselines not written: the run was interrupted")
        return True
    try:
        sess.written = write_baselines(
            sess.baseline_path,
            sess.device().to_dict(),
            sess.to_record,
            max_bytes=sess.settings.baseline_max_bytes,
        )
    except (BaselineError, OSError) as e:
        sess.errors.append(f"baselines not written: {e}")
        return False
    return True


def report_header(sess: SpecperfSession) -> dict[str, Any]:
    """Everything in the JSON report besides the cases."""
    s, srv = sess.settings, sess.server
    server = None
    if srv is not None:
        server = {
            "url": srv.url,
            "attached": srv.attached,
            "startup_s": round(srv.startup_s, 3),
            "pid": srv.server_info.get("pid"),
            "notes": srv.backend.notes(),
            "log": str(srv.log_path or ""),
            "fingerprint": srv.fingerprint,
        }
    return {
        "device": sess.device().to_dict(),
        "backend": s.backend,
        "baselines": str(sess.baseline_path),
        "tolerance": s.tolerance,
        "step_tolerance": s.step_tolerance,
        "update_baselines": s.update_baselines,
        "server": server,
    }


def _write_reports(sess: SpecperfSession) -> bool:
    path = sess.settings.json_path
    if path is None or not sess.outcomes:
        return True
    header = {
        **report_header(sess),
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "commit_info": commit_info(sess.config),
    }
    try:
        write_report(path, report_payload(header, sess.outcomes))
        title = f"pytest-specperf: {sess.settings.backend} on {sess.device().slug}"
        write_svg(path.with_suffix(".svg"), sess.outcomes, title)
    except OSError as e:
        sess.errors.append(f"JSON report not written: {e}")
        return False
    return True


def finish(sess: SpecperfSession, session: pytest.Session, exitstatus: int) -> None:
    """Write baselines and reports; a failed write fails the run."""
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    ok = _write_baselines(sess, interrupted)
    ok = _write_reports(sess) and ok
    if not ok:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _written_lines(sess: SpecperfSession) -> tuple[str, ...]:
    """``baselines written: ...``, what moved per recorded case, and the store's notes."""
    w = sess.written
    if w is None:
        return ()
    head = (
        f"baselines written: {sess.display_path(w.path)} ({w.recorded} case(s) recorded, "
        f"{w.case_count() - w.recorded} kept); what moved:"
    )
    return (head, *(f"  {line}" for line in format_moved(w.moved)), *w.notes)


def summary_lines(sess: SpecperfSession) -> list[str]:
    """The lines printed after pytest's own summary."""
    s = sess.settings
    if not sess.outcomes and not sess.errors:
        return []
    json_ok = s.json_path is not None and not any(e.startswith("JSON") for e in sess.errors)
    summary = RunSummary(
        backend=s.backend,
        device_slug=sess.device().slug,
        baselines=sess.display_path(sess.baseline_path),
        tolerance=s.tolerance,
        step_tolerance=s.step_tolerance,
        update=s.update_baselines,
        inject=str(s.inject) if s.inject else None,
        telemetry_note=sess.telemetry_note,
        backend_notes=tuple(sess.server.backend.notes()) if sess.server is not None else (),
        notes=tuple(sess.notes),
        written=_written_lines(sess),
        json_path=str(s.json_path) if json_ok else None,
        errors=tuple(sess.errors),
    )
    return run_summary(summary, sess.outcomes)
