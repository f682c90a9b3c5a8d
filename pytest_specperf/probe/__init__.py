"""Decode-step probe: phase spans, CUDA-event device times, graph counters, a run-dir sink.

This package has no dependency on pytest and imports torch only when device timing is on,
so it runs unchanged inside the reference server and inside SGLang's scheduler processes.
"""

from __future__ import annotations

from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED, check_phase
from pytest_specperf.probe.record import GraphCount, StepRecord
from pytest_specperf.probe.sink import (
    RunDirError,
    RunDirSink,
    iter_records,
    make_run_dir,
    read_records,
)
from pytest_specperf.probe.spans import NullProbe, PhaseInjector, StepProbe

__all__ = [
    "ALL_PHASES",
    "PHASES",
    "UNACCOUNTED",
    "GraphCount",
    "NullProbe",
    "PhaseInjector",
    "RunDirError",
    "RunDirSink",
    "StepProbe",
    "StepRecord",
    "check_phase",
    "iter_records",
    "make_run_dir",
    "read_records",
]
