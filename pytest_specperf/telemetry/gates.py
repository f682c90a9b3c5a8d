"""Utilization gates and measurement-validity checks.

* :func:`utilization_regressions`: a drop in device-busy share, GPM SM utilization or GPM
  DRAM-bandwidth utilization beyond ``tolerance`` fails like a step-time regression
  (verdict SLOWER). Tolerances are **absolute percentage points**, not relative changes:
  utilizations are bounded 0-100 and a relative rule would fire on noise at low values
  (2% -> 1% is "-50%") while missing real drops at high ones. A 10-point drop from 45% to
  35% busy is a regression whatever the starting value.
* :func:`invalid_reasons`: throttled clocks or another process on the GPU during the
  measurement make the case INVALID (the figures do not describe the code under test),
  never SLOWER.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

from pytest_specperf.telemetry.summary import DRAM_UTIL, SM_UTIL, TelemetrySummary

DEVICE_BUSY: Final = "device_busy_pct"

#: Gated utilization figures (percent, 0-100) and how a message names them.
UTILIZATION_GATES: Final[Mapping[str, str]] = {
    DEVICE_BUSY: "device-busy share",
    SM_UTIL: "SM utilization (GPM)",
    DRAM_UTIL: "DRAM bandwidth utilization (GPM)",
}

#: Default share of samples with real throttling that makes a case INVALID.
THROTTLE_MIN_SHARE: Final = 0.05


def utilization_figures(
    device_busy_share: float | None, summary: TelemetrySummary | None
) -> dict[str, float]:
    """The gated figures of one run, in percent: ``device_busy_pct`` (from a share such as
    0.42) and the GPM SM/DRAM medians of ``summary``; absent figures are left out."""
    out: dict[str, float] = {}
    if device_busy_share is not None and math.isfinite(device_busy_share):
        out[DEVICE_BUSY] = device_busy_share * 100.0
    if summary is not None and summary.available:
        for name in (SM_UTIL, DRAM_UTIL):
            value = summary.median(name)
            if value is not None:
                out[name] = value
    return out


def utilization_regressions(
    base: Mapping[str, float],
    now: Mapping[str, float],
    tolerance: float,
    *,
    metrics: Iterable[str] = tuple(UTILIZATION_GATES),
) -> list[str]:
    """One message per gated figure that dropped by more than ``tolerance`` percentage
    points from ``base`` to ``now``. Figures missing (or NaN) on either side are skipped;
    rises never fail. Raises ``ValueError`` for a negative or NaN tolerance."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a non-negative number of points, got {tolerance!r}")
    messages: list[str] = []
    for name in metrics:
        before, after = base.get(name), now.get(name)
        if before is None or after is None or not (math.isfinite(before) and math.isfinite(after)):
            continue
        drop = before - after
        if drop > tolerance:
            label = UTILIZATION_GATES.get(name, name)
            messages.append(
                f"{label} dropped from {before:.1f}% to {after:.1f}% "
                f"(-{drop:.1f} points, tolerance {tolerance:.1f} points)"
            )
    return messages


def invalid_reasons(
    summary: TelemetrySummary,
    *,
    throttle_min_share: float = THROTTLE_MIN_SHARE,
    include_unresolved: bool = False,
) -> list[str]:
    """Why the measurement behind ``summary`` is INVALID; empty when it is not.

    * Real clock throttling (see :mod:`~pytest_specperf.telemetry.clocks`: power cap,
      thermal, hardware slowdown, sync boost; not GPU-idle or applications clocks) active in
      at least ``throttle_min_share`` of the samples (default 5%, and at least one sample):
      a single 50 ms blip is tolerated on long windows, sustained throttling is not.
    * Another process holding a context on the GPU in any sample.
    * With ``include_unresolved``, PIDs that could not be resolved (other PID namespace)
      count as other processes too.

    An unavailable summary gives no reasons: validity cannot be judged without telemetry
    (the caller reports ``summary.reason`` instead).
    """
    if not summary.available:
        return []
    reasons: list[str] = []
    throttled = summary.throttling
    if throttled and summary.reason_samples:
        need = max(1, math.ceil(throttle_min_share * summary.reason_samples))
        hits = {k: v for k, v in throttled.items() if v >= need}
        if hits:
            detail = ", ".join(
                f"{name} in {count} of {summary.reason_samples} samples"
                for name, count in sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))
            )
            reasons.append(f"clocks throttled during the measurement: {detail}")
    others = dict(summary.foreign_pids)
    if include_unresolved:
        others.update(summary.unresolved_pids)
    if others:
        detail = ", ".join(
            f"pid {pid} in {count} of {summary.process_samples} samples"
            for pid, count in sorted(others.items())
        )
        reasons.append(f"another process on the GPU during the measurement: {detail}")
    return reasons
