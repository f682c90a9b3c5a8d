"""Device work per phase from torch.profiler (kineto) traces.

The attribution is tested on a small named trace (kernels, the runtime calls that
launched them, the probe's phase ranges); the trace format it relies on (the
``user_annotation`` category of ``record_function`` ranges) on a real CPU trace recorded
here. A recorded CUDA trace (``gpu-check`` leaves one in ``OUT/traces/cuda-small.json.gz``)
belongs under ``tests/data`` once a GPU run has produced it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.telemetry.kineto import PREFIX, device_ops, phase_activity, union_ms


def _x(cat: str, name: str, ts: float, dur: float, *, tid: int = 1, **args: Any) -> dict[str, Any]:
    pid = 0 if cat == "kernel" else 1
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": args}


# One step: a draft graph replay, two verify kernels that overlap, a kernel launched
# between phases, and a kernel whose launch is not in the trace.
ONE_STEP = {"traceEvents": [
    _x("user_annotation", "specperf:step", 0, 100),
    _x("user_annotation", "specperf:draft", 5, 20),
    _x("cuda_runtime", "cudaGraphLaunch", 10, 2, correlation=1),
    _x("user_annotation", "specperf:verify", 30, 50),
    _x("cuda_runtime", "cudaLaunchKernel", 35, 1, correlation=2),
    _x("cuda_runtime", "cudaLaunchKernel", 40, 1, correlation=3),
    _x("cuda_runtime", "cudaLaunchKernel", 90, 1, correlation=4),
    _x("kernel", "draft_gemm", 15, 10, tid=7, correlation=1),
    _x("kernel", "gather", 40, 30, tid=7, correlation=2),
    _x("kernel", "attention", 60, 20, tid=7, correlation=3),
    _x("kernel", "commit", 95, 3, tid=7, correlation=4),
    _x("kernel", "orphan", 200, 5, tid=7, correlation=99),
    {"ph": "f", "cat": "ac2g", "name": "flow", "id": 2},
]}


def test_kernels_are_attributed_to_the_phase_that_launched_them() -> None:
    ops = {op.name: op for op in device_ops(ONE_STEP)}
    assert (ops["draft_gemm"].phase, ops["draft_gemm"].step) == ("draft", 0)
    assert (ops["gather"].phase, ops["attention"].phase) == ("verify", "verify")
    assert (ops["commit"].phase, ops["commit"].step) == (None, 0)  # between phases
    assert (ops["orphan"].phase, ops["orphan"].step) == (None, None)


def test_phase_activity_sums_and_unions() -> None:
    act = phase_activity(op for op in device_ops(ONE_STEP) if op.step is not None)
    verify = act["verify"]
    assert verify.ops == 2
    assert verify.kernel_ms == pytest.approx(0.050)  # 30 + 20 us
    assert verify.active_ms == pytest.approx(0.040)  # 40..80 us: the kernels overlap
    assert [name for name, _, _ in verify.top] == ["gather", "attention"]
    assert act["draft"].kernel_ms == pytest.approx(0.010)
    assert act["(none)"].ops == 1
    assert union_ms([(0, 10), (5, 15), (20, 30)]) == pytest.approx(0.025)


def test_record_function_ranges_are_user_annotations(tmp_path: Path) -> None:
    """The trace format the attribution relies on, as this torch writes it."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    a = torch.randn(64, 64)
    step, verify = record_function(PREFIX + "step"), record_function(PREFIX + "verify")
    with profile(activities=[ProfilerActivity.CPU]) as prof, step, verify:
        a @ a
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    cats = {e["name"]: e.get("cat") for e in events if str(e.get("name", "")).startswith(PREFIX)}
    assert cats == {PREFIX + "step": "user_annotation", PREFIX + "verify": "user_annotation"}
    assert device_ops(json.loads(path.read_text())) == []  # no device work on a CPU
