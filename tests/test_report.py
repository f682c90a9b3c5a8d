"""Report helpers on hand-built verdicts (no timing)."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_specperf.report import most_changed
from pytest_specperf.verdict import MetricVerdict, Verdict


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
