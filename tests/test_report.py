"""Report helpers on hand-built verdicts (no timing)."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_specperf.judging.verdict import MetricVerdict, Verdict
from pytest_specperf.reporting.terminal import most_changed


def _m(metric, verdict, change):
    return MetricVerdict(metric, verdict, 10.0, 10.0 * (1 + change), change, 0.01, 0.05, "ms")


def test_most_changed_shows_the_slower_phase_not_the_one_it_squeezed():
    # verify grew 7.6%, so draft's share of the rest shrank by more: the column must name
    # verify (the regression), as the failure message does.
    metrics = [_m("verify", Verdict.SLOWER, 0.076), _m("draft", Verdict.SAME, -0.079),
               _m("step", Verdict.SLOWER, 0.12)]
    outcome = SimpleNamespace(verdict=SimpleNamespace(metrics=metrics))
    assert most_changed(outcome).metric == "verify"


def test_most_changed_without_a_regression_is_the_largest_change():
    metrics = [_m("verify", Verdict.SAME, 0.01), _m("draft", Verdict.FASTER, -0.09),
               _m("step", Verdict.SAME, 0.2)]
    outcome = SimpleNamespace(verdict=SimpleNamespace(metrics=metrics))
    assert most_changed(outcome).metric == "draft"
    assert most_changed(SimpleNamespace(verdict=SimpleNamespace(metrics=[]))) is None


def test_change_of_a_near_zero_phase_is_shown_in_ms():
    from pytest_specperf.reporting.terminal import _change_cell

    assert _change_cell(0.026, 9.231, 44.0) == "+9.21 ms"
    assert _change_cell(26.36, 28.03, 35.9) == "+6.3%"
    assert _change_cell(0.018, 0.017, 44.0) == "-5.6%"  # small and steady: relative is fine
    assert _change_cell(0.0, 0.5, 44.0) == "+0.50 ms"
