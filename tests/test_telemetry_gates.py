"""Utilization gates in points (SLOWER) and validity checks (INVALID)."""

from __future__ import annotations

import pytest

from pytest_specperf.judging.gates import invalid_reasons
from pytest_specperf.judging.samples import Utilization, utilizations
from pytest_specperf.judging.verdict import Tolerances, judge_gate, judge_points
from pytest_specperf.telemetry import TelemetrySummary
from pytest_specperf.telemetry.summary import MetricSummary


def test_utilizations_from_telemetry() -> None:
    """NVML/GPM medians become utilizations of their own type (one value per run)."""
    summary = TelemetrySummary(
        available=True,
        metrics={
            "sm_util_pct": MetricSummary(61.0, 50.0, 70.0, 9),
            "gpu_util_pct": MetricSummary(99.0, 90.0, 100.0, 9),
        },
    )
    u = utilizations(summary)
    assert set(u) == {"util.sm", "util.gpu"}
    assert u["util.sm"] == Utilization("util.sm", 61.0, 50.0, 70.0, 9)
    assert u["util.sm"].blocks == () and u["util.sm"].value == 61.0
    assert utilizations(TelemetrySummary.unavailable("x")) == {}
    assert utilizations(None) == {}


@pytest.mark.parametrize(
    ("base", "now", "tol", "verdict"),
    [
        (45.0, 35.0, 0.05, "SLOWER"),  # a 10-point drop beyond 5 points
        (45.0, 42.0, 0.05, "SAME"),  # 3 points: within
        (45.0, 60.0, 0.05, "FASTER"),  # a rise
        (2.0, 1.0, 0.05, "SAME"),  # 2% -> 1% is -50% but only 1 point
    ],
)
def test_utilization_is_gated_in_points(base: float, now: float, tol: float, verdict: str) -> None:
    b = Utilization("util.sm", base, base, base, 10)
    n = Utilization("util.sm", now, now, now, 10)
    mv = judge_points("util.sm", b, n, tol, 10)
    assert mv.verdict.value == verdict and mv.points_based
    assert mv.change == pytest.approx((now - base) / 100)


def test_utilization_gate_needs_both_runs() -> None:
    tol = Tolerances(0.05, 0.25)
    u = {"util.sm": Utilization("util.sm", 40.0, 40.0, 40.0, 5)}
    assert judge_gate("util.sm", {}, {}, tol, base_util=u, now_util={}) is None
    mv = judge_gate("util.sm", {}, {}, tol, base_util=u, now_util=u)
    assert mv is not None and mv.verdict.value == "SAME"


def _summary(reasons: dict[str, int], samples: int, **kw: object) -> TelemetrySummary:
    return TelemetrySummary(
        available=True,
        samples=samples,
        throttle_reasons=reasons,
        reason_samples=samples,
        process_samples=samples,
        **kw,  # type: ignore[arg-type]
    )


def test_throttling_needs_a_share_of_samples() -> None:
    # 1 of 40 samples = 2.5% < 5%: a blip, tolerated
    assert invalid_reasons(_summary({"sw_power_cap": 1}, 40)) == []
    # 2 of 40 = 5%: sustained
    assert invalid_reasons(_summary({"sw_power_cap": 2}, 40)) == [
        "clocks throttled during the measurement: sw_power_cap in 2 of 40 samples"
    ]
    # a short window: one sample is enough
    assert invalid_reasons(_summary({"hw_slowdown": 1}, 4)) != []
    # any share when asked
    assert invalid_reasons(_summary({"sw_power_cap": 1}, 40), throttle_min_share=0.0) != []


def test_benign_reasons_never_invalidate() -> None:
    summary = _summary({"gpu_idle": 40, "applications_clocks_setting": 40, "unknown_0x800": 40}, 40)
    assert invalid_reasons(summary) == []


def test_other_process_invalidates_never_slower() -> None:
    summary = _summary({}, 10, foreign_pids={4242: 1}, unresolved_pids={99: 10})
    assert invalid_reasons(summary) == [
        "another process on the GPU during the measurement: pid 4242 in 1 of 10 samples"
    ]
    assert len(invalid_reasons(summary, include_unresolved=True)[0].split("pid ")) == 3


def test_unavailable_summary_has_no_invalid_reasons() -> None:
    assert invalid_reasons(TelemetrySummary.unavailable("nvmlInit failed")) == []
