"""The probe's own cost per decode step, timed alone: begin, every phase with no work, end.

Shared by the measuring scripts (``probe_overhead.py``, ``measure_engine.py``,
``measure_control_stat.py``); each passes its probe and its clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pytest_specperf.probe import PHASES


def empty_steps_us(probe: Any, n: int, clock: Callable[[], int] = time.perf_counter_ns) -> float:
    """Run ``n`` decode steps of ``probe`` (every phase entered and left, nothing inside)
    and close it; the cost per step in microseconds by ``clock`` (nanoseconds)."""
    t = clock()
    for _ in range(n):
        probe.begin_step(context_len=8192, batch_size=1, rids=["r"])
        for ph in PHASES:
            with probe.phase(ph):
                pass
        probe.end_step(accepted_tokens=3)
    cost = (clock() - t) / n / 1e3
    probe.close()
    return cost
