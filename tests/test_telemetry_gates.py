"""Utilization gates (SLOWER) and validity checks (INVALID)."""

from __future__ import annotations

import math

import pytest

from pytest_specperf.telemetry import (
    TelemetrySummary,
    invalid_reasons,
    utilization_figures,
    utilization_regressions,
)
from pytest_specperf.telemetry.summary import MetricSummary

BASE = {"device_busy_pct": 45.0, "sm_util_pct": 60.0, "dram_util_pct": 30.0}


def test_drop_beyond_tolerance_is_reported() -> None:
    now = {"device_busy_pct": 30.0, "sm_util_pct": 58.0, "dram_util_pct": 31.0}
    assert utilization_regressions(BASE, now, 10.0) == [
        "device-busy share dropped from 45.0% to 30.0% (-15.0 points, tolerance 10.0 points)"
    ]


def test_every_gated_figure_can_fail() -> None:
    now = {"device_busy_pct": 20.0, "sm_util_pct": 20.0, "dram_util_pct": 5.0}
    messages = utilization_regressions(BASE, now, 5.0)
    assert [m.split(" dropped")[0] for m in messages] == [
        "device-busy share",
        "SM utilization (GPM)",
        "DRAM bandwidth utilization (GPM)",
    ]


def test_within_tolerance_rises_and_missing_figures_pass() -> None:
    assert utilization_regressions(BASE, {"device_busy_pct": 35.0}, 10.0) == []  # exactly 10
    assert utilization_regressions(BASE, {"device_busy_pct": 95.0}, 0.0) == []  # a rise
    assert utilization_regressions(BASE, {}, 0.0) == []
    assert utilization_regressions({}, BASE, 0.0) == []
    assert utilization_regressions(BASE, {"sm_util_pct": math.nan}, 0.0) == []
    # tensor utilization is not gated unless asked for
    assert utilization_regressions({"tensor_util_pct": 80.0}, {"tensor_util_pct": 0.0}, 1.0) == []
    asked = utilization_regressions(
        {"tensor_util_pct": 80.0}, {"tensor_util_pct": 0.0}, 1.0, metrics=["tensor_util_pct"]
    )
    assert asked == [
        "tensor_util_pct dropped from 80.0% to 0.0% (-80.0 points, tolerance 1.0 points)"
    ]


@pytest.mark.parametrize("tolerance", [-1.0, math.nan, math.inf])
def test_bad_tolerance(tolerance: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        utilization_regressions(BASE, BASE, tolerance)


def test_utilization_figures() -> None:
    summary = TelemetrySummary(
        available=True,
        metrics={
            "sm_util_pct": MetricSummary(61.0, 50.0, 70.0, 9),
            "gpu_util_pct": MetricSummary(99.0, 90.0, 100.0, 9),
        },
    )
    assert utilization_figures(0.42, summary) == {
        "device_busy_pct": pytest.approx(42.0),
        "sm_util_pct": 61.0,
    }
    assert utilization_figures(None, TelemetrySummary.unavailable("x")) == {}
    assert utilization_figures(0.5, None) == {"device_busy_pct": 50.0}


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
