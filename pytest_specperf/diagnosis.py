"""Where did the time go: the bottleneck verdict of a case and the sentence of a failure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED
from pytest_specperf.telemetry.bandwidth import kv_read_bytes
from pytest_specperf.telemetry.bottleneck import Bottleneck, StepFigures, classify

if TYPE_CHECKING:
    from pytest_specperf.baselines import CaseBaseline
    from pytest_specperf.measure import DecodeRun
    from pytest_specperf.telemetry.device import DeviceInfo


def diagnose(run: DecodeRun, server_info: dict[str, Any], device: DeviceInfo) -> Bottleneck:
    """Host-bound, memory-bound, compute-bound or latency-bound, with its numbers.

    On a GPU: device-busy share from the CUDA-event phase times, utilization from NVML/GPM,
    and the KV-read bandwidth of the verify phase (the KV bytes the verify moves, see
    :func:`kv_read_bytes_per_step`, over its device time) against the device's peak. On a
    CPU: the host-side view (unaccounted share, largest phases).
    """
    s = run.summaries
    host = {p: s[p].value for p in PHASES if p in s}
    dev = {p: s[f"device.{p}"].value for p in PHASES if f"device.{p}" in s}
    kv_bytes = kv_read_bytes_per_step(run, server_info)
    peak = None
    if device.kind == "cuda":
        from pytest_specperf.telemetry.bandwidth import peak_bandwidth

        pb = peak_bandwidth(device.name, device.nvml_index)
        peak = pb.bytes_per_s if pb is not None else None
    figures = StepFigures(
        step_ms=s["step"].value,
        host_ms=host,
        device_ms=dev,
        unaccounted_ms=s[UNACCOUNTED].value,
        kv_read_bytes_per_step=kv_bytes,
        peak_bandwidth_bytes_per_s=peak,
    ).with_telemetry(run.telemetry)
    return classify(figures)


def kv_read_bytes_per_step(run: DecodeRun, server_info: dict[str, Any]) -> float | None:
    """KV bytes one verify moves: the server's traffic model when it has one (the
    reference engine's graph path gathers whole padded page buckets and reads the copy
    again), else the context's KV bytes (read once)."""
    traffic = server_info.get("kv_read")
    if isinstance(traffic, dict):
        share = run.fragmentation if run.fragmentation is not None else 0.0
        return kv_read_bytes(traffic, run.context_len, run.batch_size, share)
    kv_per_token = server_info.get("kv_bytes_per_token")
    if isinstance(kv_per_token, (int, float)) and kv_per_token > 0:
        return float(kv_per_token) * run.context_len * run.batch_size
    return None


def time_went(run: DecodeRun, base: CaseBaseline | None) -> str | None:
    """One sentence: how much the step grew and which phase took the growth."""
    if base is None or "step" not in base.metrics:
        return None
    grew = run.summaries["step"].value - base.metrics["step"].value
    if grew <= 0:
        return None
    deltas = {
        p: run.summaries[p].value - base.metrics[p].value
        for p in ALL_PHASES
        if p in base.metrics and p in run.summaries
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
