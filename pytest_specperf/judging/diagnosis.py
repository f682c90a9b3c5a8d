"""Where did the time go: the bottleneck verdict of a case and the sentence of a failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_specperf.judging.metrics import STEP, device_form
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.stats import Summary
from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED
from pytest_specperf.telemetry.bandwidth import kv_read_bytes
from pytest_specperf.telemetry.bottleneck import Bottleneck, StepFigures, classify


def diagnose(
    run: DecodeRun,
    *,
    kv_bytes_per_token: float | None = None,
    kv_traffic: Mapping[str, Any] | None = None,
    peak_bandwidth_bytes_per_s: float | None = None,
) -> Bottleneck:
    """Host-bound, memory-bound, compute-bound or latency-bound, with its numbers.

    On a GPU: device-busy share from the CUDA-event phase times, utilization from NVML/GPM,
    and the KV-read bandwidth of the verify phase (the KV bytes the verify moves, see
    :func:`kv_read_bytes_per_step`, over its device time) against the device's peak. On a
    CPU: the host-side view (unaccounted share, largest phases).
    """
    s = run.summaries
    host = {p: s[p].value for p in PHASES if p in s}
    dev = {p: s[device_form(p)].value for p in PHASES if device_form(p) in s}
    kv_bytes = kv_read_bytes_per_step(run, kv_bytes_per_token, kv_traffic)
    figures = StepFigures(
        step_ms=s[STEP].value,
        host_ms=host,
        device_ms=dev,
        unaccounted_ms=s[UNACCOUNTED].value,
        kv_read_bytes_per_step=kv_bytes,
        peak_bandwidth_bytes_per_s=peak_bandwidth_bytes_per_s,
    ).with_telemetry(run.telemetry)
    return classify(figures)


def kv_read_bytes_per_step(
    run: DecodeRun,
    kv_bytes_per_token: float | None,
    kv_traffic: Mapping[str, Any] | None = None,
) -> float | None:
    """KV bytes one verify moves: from the server's traffic model when it has one (the
    reference engine's ``/server_info["kv_read"]``: its graph path gathers whole padded
    page buckets and reads the copy again), else the context's KV bytes, read once."""
    if kv_traffic is not None:
        share = run.fragmentation if run.fragmentation is not None else 0.0
        moved = kv_read_bytes(kv_traffic, run.context_len, run.batch_size, share)
        if moved is not None:
            return moved
    if kv_bytes_per_token is not None and kv_bytes_per_token > 0:
        return float(kv_bytes_per_token) * run.context_len * run.batch_size
    return None


def time_went(run: DecodeRun, base: Mapping[str, Summary] | None) -> str | None:
    """One sentence: how much the step grew and which phase took the growth."""
    if base is None or STEP not in base:
        return None
    grew = run.summaries[STEP].value - base[STEP].value
    if grew <= 0:
        return None
    deltas = {
        p: run.summaries[p].value - base[p].value
        for p in ALL_PHASES
        if p in base and p in run.summaries
    }
    if not deltas:
        return None
    top, d = max(deltas.items(), key=lambda kv: kv[1])
    if d <= 0:
        return None
    share = min(d / grew, 1.0)
    if top == UNACCOUNTED:
        return (
            f"where the time went: the step grew {grew:.2f} ms; {d:.2f} ms ({share:.0%} of the "
            "growth) is unaccounted, outside every named phase: a host-side stall between "
            "phases, while the device waited"
        )
    return (
        f"where the time went: the step grew {grew:.2f} ms; {top} took {d:.2f} ms "
        f"({share:.0%}) of the growth"
    )
