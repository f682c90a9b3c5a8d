"""Measurement validity: throttled clocks or another process on the GPU make a case INVALID.

:func:`invalid_reasons` says why the figures of a window do not describe the code under
test; such a case is never SLOWER. (Utilization drops are gated like any other metric, in
percentage points: ``judging.metrics`` and ``judging.verdict.judge_points``.)
"""

from __future__ import annotations

import math
from typing import Final

from pytest_specperf.telemetry.summary import TelemetrySummary

#: Default share of samples with real throttling that makes a case INVALID.
THROTTLE_MIN_SHARE: Final = 0.05


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
