"""Where did the time go: the bottleneck verdict of a case and the sentence of a failure."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from pytest_specperf.judging.bottleneck import (
    ActiveSource,
    Bottleneck,
    StepFigures,
    Thresholds,
    busy_words,
    classify,
    cpu_activity_kind,
    phase_activity,
)
from pytest_specperf.judging.metrics import (
    ACTIVE_SHARE,
    DEVICE_BUSY,
    RUNQ_SHARE,
    STEP,
    STEP_PARTS,
    active_form,
    cpu_form,
    device_form,
)
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.stats import Summary
from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED
from pytest_specperf.telemetry.bandwidth import kv_read_bytes


def _medians(s: Mapping[str, Summary], form: str) -> dict[str, float]:
    """``{part: median}`` of ``cpu.<part>`` or ``active.<part>`` where measured."""
    name = {"cpu": cpu_form, "active": active_form}[form]
    return {p: s[name(p)].median for p in STEP_PARTS if name(p) in s}


def _runq_ms(s: Mapping[str, Summary]) -> float | None:
    """Run-queue time per step: the median share of off-CPU time the thread waited for a
    CPU (steps that read it) times the median step's off-CPU time."""
    share, cpu = s.get(RUNQ_SHARE), s.get(cpu_form(STEP))
    if share is None or cpu is None:
        return None
    return share.median * max(s[STEP].median - cpu.median, 0.0)


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


def figures_of(
    run: DecodeRun,
    *,
    kv_bytes_per_token: float | None = None,
    kv_traffic: Mapping[str, Any] | None = None,
    peak_bandwidth_bytes_per_s: float | None = None,
) -> StepFigures:
    """The figures the bottleneck verdict is computed from (medians of the run)."""
    s = run.summaries
    kv_bytes = kv_read_bytes_per_step(run, kv_bytes_per_token, kv_traffic)
    top = {}
    if run.kernels is not None:
        top = {k: (v[0].name, v[0].total_ms) for k, v in run.kernels.phases.items() if v}
    source: ActiveSource | None = None
    if run.active_source == "device":
        source = "device"
    elif run.active_source == "cpu":
        source = "cpu"
    return StepFigures(
        step_ms=s[STEP].value,
        host_ms={p: s[p].value for p in PHASES if p in s},
        device_ms={p: s[device_form(p)].value for p in PHASES if device_form(p) in s},
        unaccounted_ms=s[UNACCOUNTED].value,
        kv_read_bytes_per_step=kv_bytes,
        peak_bandwidth_bytes_per_s=peak_bandwidth_bytes_per_s,
        cpu_ms=_medians(s, "cpu"),
        active_ms=_medians(s, "active") if source else {},
        active_source=source,
        top_kernel=top,
        context_len=run.context_len,
        runq_ms=_runq_ms(s),
        device_gap_ms=_device_gap_ms(run),
        step_active_share=s[ACTIVE_SHARE].median if source and ACTIVE_SHARE in s else None,
        step_busy_share=s[DEVICE_BUSY].median if DEVICE_BUSY in s else None,
    ).with_telemetry(run.telemetry)


def _device_gap_ms(run: DecodeRun) -> float | None:
    """Median device idle time between consecutive steps' forwards (records that have it:
    SGLang on a GPU), ms; None where not measured."""
    gaps = [r.device_gap_ns for r in run.records if r.device_gap_ns is not None]
    return statistics.median(gaps) / 1e6 if gaps else None


def diagnose(
    run: DecodeRun,
    *,
    kv_bytes_per_token: float | None = None,
    kv_traffic: Mapping[str, Any] | None = None,
    peak_bandwidth_bytes_per_s: float | None = None,
) -> Bottleneck:
    """Host-bound, memory-bound, compute-bound or latency-bound, with its numbers, and per
    phase whether it worked or waited (``Bottleneck.lines``).

    On a GPU: device-busy share from the CUDA-event phase times, active time from kernel
    samples, utilization from NVML/GPM, and the KV-read bandwidth of the verify phase (the
    KV bytes the verify moves, see :func:`kv_read_bytes_per_step`, over its device time)
    against the device's peak. On a
    CPU: the host-side view (unaccounted share, largest phases) and the thread's CPU time.
    """
    return classify(
        figures_of(
            run,
            kv_bytes_per_token=kv_bytes_per_token,
            kv_traffic=kv_traffic,
            peak_bandwidth_bytes_per_s=peak_bandwidth_bytes_per_s,
        )
    )


def _why(run: DecodeRun, phase: str) -> str:
    """``; verify now: busy on the CPU (work, not waits)``: the phase's activity verdict of
    this run by the one rule of the activity lines (``bottleneck.phase_activity``: CPU time
    on a CPU, sampled kernels on a GPU); empty where the run did not measure it."""
    words = phase_activity(figures_of(run), phase)
    return f"; {phase} now: {words}" if words else ""


def _on_device(base: Mapping[str, float], now: Mapping[str, float]) -> bool:
    """Whether both sides have every shared phase's device time: a GPU run, whose phases
    the verdict judges on their device times (``metrics.judged_form``), so the sentence
    reads those too."""
    shared = [p for p in PHASES if p in base and p in now]
    return bool(shared) and all(device_form(p) in base and device_form(p) in now for p in shared)


def _unaccounted_cause(run: DecodeRun) -> str:
    """What the time outside every phase was, from the evidence the run has."""
    s = run.summaries
    u = s[UNACCOUNTED].value
    active = s.get(active_form(UNACCOUNTED))
    idle = Thresholds().idle_share
    if run.active_source == "device" and active is not None and u > 0:
        if active.median >= idle * u:
            return "GPU work outside the mapped phases (the device was active)"
        return "a host-side stall between phases, while the device idled"
    if run.active_source == "cpu" and active is not None and u > 0:
        figures = figures_of(run)
        kind = cpu_activity_kind(figures, u, active.median)
        if kind == "work":
            return "a host-side stall between phases (the thread was busy)"
        return busy_words(figures) if kind == "busy" else "the thread waited between phases"
    if run.has_device_times:
        return (
            "a host-side stall or GPU work outside the mapped phases (device activity not "
            "sampled: --specperf-profile kernels=N)"
        )
    return "a host-side stall between phases"


def _of_growth(d: float, grew: float, *, device: bool = False) -> str:
    """``55% of the growth``; ``more than the step grew: other parts took less`` where a
    part grew more than the whole, beyond the rounding of the figures shown (never a share
    over 100%). ``device``: ``d`` is GPU time against the host step's growth, which it can
    exceed by filling the device's idle gaps as well: only ``more than the step grew``."""
    if d > grew * 1.005:
        return "more than the step grew" + ("" if device else ": other parts took less")
    return f"{d / grew:.0%} of the growth"


def time_went(
    run: DecodeRun,
    base: Mapping[str, float] | None,
    now: Mapping[str, float] | None = None,
    culprit: str | None = None,
) -> str | None:
    """One sentence: how much the step grew, which phase took the most of the growth, and
    whether that phase worked or waited (by the rule of the activity lines: its CPU time on
    a CPU, its sampled kernels' active time on a GPU). On a GPU a phase's milliseconds are
    its device time (``of GPU time``), the figure its verdict judges and the phase table's
    dev columns show; the step and the unaccounted time stay host wall time.

    ``base`` and ``now``: per step part, the centers every report of the case shows
    (``CaseOutcome.base_centers`` / ``now_centers``); ``now`` defaults to the run's own.
    ``culprit``: the phase the verdict blames (``CaseVerdict.culprit``). A phase is judged
    against the rest of its step, so it can be blamed while another phase took more
    milliseconds (a slower machine grows the largest phase most); the sentence then says
    what the blamed phase took too, so that the headline and this line do not disagree."""
    if base is None or STEP not in base:
        return None
    if now is None:
        rows = (*ALL_PHASES, STEP, *map(device_form, PHASES))
        now = {p: s.value for p, s in run.summaries.items() if p in rows}
    grew = now[STEP] - base[STEP]
    if grew <= 0:
        return None
    device = _on_device(base, now)

    def part(centers: Mapping[str, float], p: str) -> float:
        return centers[device_form(p)] if device and p != UNACCOUNTED else centers[p]

    deltas = {p: part(now, p) - part(base, p) for p in ALL_PHASES if p in base and p in now}
    if not deltas:
        return None
    top, d = max(deltas.items(), key=lambda kv: kv[1])
    if d <= 0:
        return None
    head = f"where the time went: the step grew {grew:.2f} ms; "
    of_gpu = " of GPU time" if device else ""
    if top == UNACCOUNTED:
        text = (
            f"{head}{d:.2f} ms ({_of_growth(d, grew)}) is unaccounted, outside every named "
            f"phase: {_unaccounted_cause(run)}"
        )
    else:
        share = _of_growth(d, grew, device=device)
        text = f"{head}{top} took {d:.2f} ms{of_gpu} ({share})" + _why(run, top)
    if culprit is None or culprit == top or culprit not in deltas:
        return text
    dc = deltas[culprit]
    on_gpu = device and culprit != UNACCOUNTED
    gpu = " of GPU time" if on_gpu else ""
    took = (f"took {dc:.2f} ms{gpu} ({_of_growth(dc, grew, device=on_gpu)})" if dc > 0
            else f"changed {dc:+.2f} ms{gpu}")  # fmt: skip
    judged = ("its share of the step" if culprit == UNACCOUNTED
              else "against the rest of its step")  # fmt: skip
    return f"{text}; {culprit}, which the verdict blames ({judged}), {took}" + _why(run, culprit)
