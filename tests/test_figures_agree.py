"""The same figure reads the same everywhere it appears: the pieces the reports read.

The end-to-end check (a case in two server processes, every output) is
``test_diagnosis_canaries.test_incident_shape_fails_a_first_run_on_its_active_share_budget``.
"""

from __future__ import annotations

import pytest


def test_a_report_without_centers_for_accept_reads_its_first_process():
    """A report written before the centers held the accepted length (2026-12-06) still
    reads: its first process's figures."""
    from pytest_specperf.store.report import CaseRecord

    old = {
        "test": "t.py::test_decode", "key": "ctx=1", "verdict": "SAME", "metrics": [],
        "step_ms": {"median": 10.0}, "accept_len": {"mean": 2.5, "median": 2.0, "center": "mean"},
        "phases": {"verify": {"median": 6.0}}, "centers": {"now": {"step": 10.5}, "base": None},
    }  # fmt: skip
    r = CaseRecord.from_json(old)
    assert r.accept_len == 2.5 and r.step_ms == 10.5 and r.phase_ms("verify") == 6.0
    new = {**old, "centers": {"now": {"step": 10.5, "verify": 6.2, "accept_len": 2.6}}}
    r = CaseRecord.from_json(new)
    assert r.accept_len == 2.6 and r.phase_ms("verify") == 6.2
    assert r.verdict_text() == "SAME" and not r.over_budget
    failed = CaseRecord.from_json({**new, "budgets": [{"failed": True, "describe": "x"}]})
    assert failed.verdict_text() == "OVER_BUDGET (SAME)"


def test_the_bottleneck_quotes_the_per_step_shares_the_run_line_and_gate_read():
    """The step's active share and device-busy share: the median over steps of each step's
    share (the run line's "active N%", the gated ``device_busy``), not the ratio of the
    medians, wherever the figures carry it; without it (older callers), the ratio."""
    from pytest_specperf.judging.bottleneck import StepFigures, classify

    cpu = StepFigures(step_ms=100.0, host_ms={"verify": 60.0}, unaccounted_ms=5.0,
                      active_ms={"verify": 50.0, "step": 64.0}, active_source="cpu",
                      step_active_share=0.70)  # fmt: skip
    b = classify(cpu)
    assert b.figures["step_active_share"] == 0.70 and "CPU time 70% of it" in b.describe()
    ratio = classify(StepFigures(**{**cpu.__dict__, "step_active_share": None}))
    assert ratio.figures["step_active_share"] == pytest.approx(0.64)
    gpu = StepFigures(step_ms=100.0, host_ms={"verify": 90.0}, device_ms={"verify": 45.0},
                      unaccounted_ms=5.0, step_busy_share=0.62)  # fmt: skip
    g = classify(gpu)
    assert g.figures["device_busy_share"] == 0.62 and "device busy 62%" in g.describe()
    assert g.kind != "host-bound"  # 62% is over the 50% line; the medians' 45% is not
    assert classify(StepFigures(**{**gpu.__dict__, "step_busy_share": None})).kind == "host-bound"
