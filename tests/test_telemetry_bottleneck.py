"""Bottleneck verdicts from recorded figures (no GPU, no NVML, no torch)."""

from __future__ import annotations

import math

import pytest

from pytest_specperf.judging.bottleneck import (
    StepFigures,
    Thresholds,
    achieved_bandwidth,
    classify,
    device_busy_share,
)
from pytest_specperf.telemetry.summary import MetricSummary, TelemetrySummary

# The incident: 192 ms/step at 46k context, tensor cores 0%, DRAM 2%, tree build and mask
# prep ~2 ms, graphs replaying; the GPU was busy 17.3 ms of the step.
INCIDENT_HOST = {
    "schedule": 1.5,
    "draft": 4.2,
    "build_verify_input": 1.2,
    "prepare_for_verify": 0.8,
    "verify": 2.1,
    "accept": 0.6,
    "kv_commit": 0.3,
}
INCIDENT_DEVICE = {
    "draft": 4.0,
    "build_verify_input": 1.2,
    "prepare_for_verify": 0.8,
    "verify": 10.5,
    "accept": 0.5,
    "kv_commit": 0.3,
}


def incident() -> StepFigures:
    return StepFigures(
        step_ms=192.0,
        host_ms=INCIDENT_HOST,
        device_ms=INCIDENT_DEVICE,
        unaccounted_ms=181.3,
        dram_util_pct=2.0,
        tensor_util_pct=0.0,
        kv_read_bytes_per_step=2.0e9,
        peak_bandwidth_bytes_per_s=4.8e12,
    )


def test_incident_is_host_bound_with_the_numbers() -> None:
    verdict = classify(incident())
    assert verdict.kind == "host-bound"
    assert verdict.figures["device_busy_share"] == pytest.approx(17.3 / 192.0)
    assert verdict.figures["unaccounted_share"] == pytest.approx(181.3 / 192.0)
    line = verdict.describe()
    assert line.startswith(
        "host-bound (GPU starved): device busy 9% of the 192.0 ms step, "
        "unaccounted 181.3 ms (94%), DRAM 2%, tensor 0%"
    )
    assert "KV read 190.5 GB/s (4% of 4.80 TB/s peak)" in line
    assert "\n" not in line
    assert verdict.reasons[0].startswith("device busy 9% of the step, below 50%")
    assert "unaccounted 181.3 ms (94%)" in verdict.reasons[1]


def test_incident_without_kv_figures_reads_exactly_like_the_issue() -> None:
    figures = StepFigures(
        step_ms=192.0,
        host_ms=INCIDENT_HOST,
        device_ms=INCIDENT_DEVICE,
        unaccounted_ms=181.3,
        dram_util_pct=2.0,
        tensor_util_pct=0.0,
    )
    assert classify(figures).describe() == (
        "host-bound (GPU starved): device busy 9% of the 192.0 ms step, "
        "unaccounted 181.3 ms (94%), DRAM 2%, tensor 0%"
    )


def memory_case(**overrides: float) -> StepFigures:
    values: dict[str, float] = {
        "dram_util_pct": 78.0,
        "tensor_util_pct": 12.0,
        "sm_util_pct": 90.0,
    }
    values.update(overrides)
    return StepFigures(
        step_ms=40.0,
        host_ms={"draft": 5.0, "verify": 31.0, "accept": 1.0},
        device_ms={"draft": 5.0, "verify": 30.0, "accept": 1.0, "kv_commit": 1.0},
        unaccounted_ms=1.0,
        kv_read_bytes_per_step=3.6e12 * 0.030,  # 3.6 TB/s over 30 ms of verify
        peak_bandwidth_bytes_per_s=4.8e12,
        **values,
    )


def test_memory_bound() -> None:
    verdict = classify(memory_case())
    assert verdict.kind == "memory-bound"
    assert verdict.figures["bandwidth_share"] == pytest.approx(0.75)
    assert verdict.describe() == (
        "memory-bound: device busy 92% of the 40.0 ms step, unaccounted 1.0 ms (2%), "
        "DRAM 78%, tensor 12%, SM 90%, KV read 3.60 TB/s (75% of 4.80 TB/s peak)"
    )
    assert any("KV reads reach 75% of peak" in r for r in verdict.reasons)
    assert any("DRAM bandwidth utilization 78%" in r for r in verdict.reasons)


def test_memory_bound_from_kv_bandwidth_alone() -> None:
    figures = memory_case()
    figures = StepFigures(
        step_ms=figures.step_ms,
        device_ms=figures.device_ms,
        kv_read_bytes_per_step=figures.kv_read_bytes_per_step,
        peak_bandwidth_bytes_per_s=figures.peak_bandwidth_bytes_per_s,
    )
    assert classify(figures).kind == "memory-bound"


def test_compute_bound() -> None:
    verdict = classify(memory_case(dram_util_pct=30.0, tensor_util_pct=85.0))
    # KV bandwidth (75% of peak) is also past its threshold: 0.75/0.6 = 1.25 < 85/50 = 1.7
    assert verdict.kind == "compute-bound"
    assert verdict.reasons[1] == "tensor pipes busy 85% (>= 50%)"
    assert any("KV reads" in r for r in verdict.reasons[2:])


def test_compute_bound_from_sm_saturation_without_dram() -> None:
    figures = StepFigures(
        step_ms=10.0,
        device_ms={"verify": 9.5},
        sm_util_pct=95.0,
        tensor_util_pct=10.0,
        dram_util_pct=20.0,
    )
    verdict = classify(figures)
    assert verdict.kind == "compute-bound"
    assert "SM utilization 95%" in verdict.reasons[1]


def test_latency_bound() -> None:
    figures = StepFigures(
        step_ms=20.0,
        device_ms={"draft": 4.0, "verify": 12.0},
        unaccounted_ms=2.0,
        sm_util_pct=35.0,
        tensor_util_pct=4.0,
        dram_util_pct=18.0,
    )
    verdict = classify(figures)
    assert verdict.kind == "latency-bound"
    assert verdict.describe().startswith(
        "latency-bound (small kernels, launch gaps): device busy 80% of the 20.0 ms step"
    )


def test_unknown_without_gpm_figures() -> None:
    figures = StepFigures(
        step_ms=20.0,
        device_ms={"verify": 15.0},
        kv_read_bytes_per_step=1.0e9,
        peak_bandwidth_bytes_per_s=2.0e12,
    )
    verdict = classify(figures)
    assert verdict.kind == "unknown"
    assert "missing GPM DRAM utilization and GPM tensor utilization" in verdict.reasons[1]
    assert "lower bound" in verdict.reasons[2]
    assert verdict.describe().startswith("unknown (not enough figures to decide): device busy 75%")


def test_cpu_only_host_side_summary() -> None:
    figures = StepFigures(step_ms=192.0, host_ms=INCIDENT_HOST)
    verdict = classify(figures)
    assert verdict.kind == "unknown" and verdict.host_only
    # unaccounted defaults to step minus the named phases
    assert verdict.figures["unaccounted_ms"] == pytest.approx(192.0 - sum(INCIDENT_HOST.values()))
    assert verdict.describe() == (
        "host only (no device timing): step 192.0 ms, unaccounted 181.3 ms (94%); "
        "largest phases: draft 4.2 ms (2%), verify 2.1 ms (1%), schedule 1.5 ms (1%)"
    )
    assert verdict.reasons[0] == "no device timing (CPU run): host-side view only"
    assert verdict.figures["host_share.draft"] == pytest.approx(4.2 / 192.0)


def test_thresholds_are_parameters() -> None:
    lenient = Thresholds(host_bound_busy_share=0.05)
    verdict = classify(incident(), lenient)
    assert verdict.kind == "latency-bound"  # busy 9% >= 5%; DRAM 2%, tensor 0%


def test_bad_step_time_is_unknown() -> None:
    assert classify(StepFigures(step_ms=0.0)).kind == "unknown"
    assert classify(StepFigures(step_ms=math.nan)).kind == "unknown"


def test_with_telemetry_fills_utilization() -> None:
    summary = TelemetrySummary(
        available=True,
        metrics={
            "dram_util_pct": MetricSummary(2.0, 1.0, 3.0, 10),
            "tensor_util_pct": MetricSummary(0.0, 0.0, 0.0, 10),
            "gpu_util_pct": MetricSummary(12.0, 5.0, 20.0, 10),
        },
    )
    base = StepFigures(step_ms=192.0, device_ms=INCIDENT_DEVICE, unaccounted_ms=181.3)
    filled = base.with_telemetry(summary)
    assert (filled.dram_util_pct, filled.tensor_util_pct, filled.sm_util_pct) == (2.0, 0.0, None)
    assert filled.gpu_util_pct == 12.0
    assert base.with_telemetry(TelemetrySummary.unavailable("no NVML")) is base
    assert classify(filled).describe().endswith("DRAM 2%, tensor 0%")


def test_helpers() -> None:
    assert device_busy_share({}, 10.0) is None
    assert device_busy_share({"a": 2.0, "b": 3.0}, 10.0) == 0.5
    assert achieved_bandwidth(1e9, 0.0) is None
    assert achieved_bandwidth(1e9, 1.0) == pytest.approx(1e12)
