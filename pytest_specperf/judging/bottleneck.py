"""Where did the time go: a bottleneck verdict from recorded figures (pure functions).

No NVML, no torch: the inputs are what a run already recorded (per-phase host and device
medians, step median, unaccounted median, GPM/NVML utilization medians, KV bytes read per
step and the device's peak bandwidth), so the verdict can be recomputed from a report.

Derived figures:

* device-busy share = the median over steps of each step's device phase times over its
  step time (the gated ``device_busy``'s figure; without it, the sum of the device
  phase medians over the step median). The probe times each phase
  on the GPU with CUDA events on one stream, so phases do not overlap and the sum is the
  time the GPU had work queued.
* unaccounted share = unaccounted median / step median (time outside every named phase).
* achieved KV-read bandwidth = KV bytes read per step / verify device time. Weights are not
  counted, so this is a *lower bound* on the DRAM traffic of verify.

Decision, in this order (defaults in :class:`Thresholds`):

1. **host-bound (GPU starved)**: device busy < 50% of the step. The GPU idles more than half
   of the step waiting for the host (Python, scheduling, syncs, stalls); no kernel work can
   win back more than 2x, so the host side is what to look at first.
2. **memory-bound**: KV-read bandwidth >= 60% of peak, or GPM DRAM-bandwidth utilization
   >= 60%. Attainable bandwidth is ~85-90% of the theoretical peak (STREAM-like copies), so
   60% of peak means within about 1.5x of the practical roof.
3. **compute-bound**: GPM tensor-pipe utilization >= 50%, or GPM SM utilization >= 80% with
   DRAM below its threshold (SMs saturated without saturating memory). When both 2 and 3
   hold, the one furthest past its threshold wins; both are listed in ``reasons``.
4. **latency-bound (small kernels, launch gaps)**: the GPU is busy but neither DRAM (GPM
   DRAM utilization known and low) nor the tensor pipes (known and low) are near their
   roofs: many small kernels, launch overhead, serial dependencies.
5. **unknown**: the figures needed to choose between 2-4 are missing (e.g. no GPM on a
   pre-Hopper GPU: a low KV-read bandwidth alone cannot rule memory-bound out, because
   weights are not counted).

On a CPU run (no device times) the kind is ``unknown`` and :meth:`Bottleneck.describe`
gives the host-side view instead: step time, unaccounted time and share, and the largest
phases with their shares ("host only (no device timing): ...").

**Active time inside the phases** (``StepFigures.active_ms``). A CUDA-event span says
when a phase's work passed through the stream, not whether the GPU worked inside it. With
kernel samples (``active_source="device"``: the union of the kernels and copies each phase
launched) the verdict uses the device's *active* share instead of the span share for rule 1
(a GPU that idles inside its spans is starved too), and :func:`activity_lines` says per
phase whether it worked or waited, in words with the numbers:

* ``verify: span 190.0 ms, device active 4.0 ms (2%): the GPU idled inside verify (waits,
  not work)`` when the active share of the span is below ``idle_share`` (50%);
* ``verify: device active 185.0 ms (97% of its 190.0 ms span), DRAM 2% of peak:
  latency-bound kernels (top: <kernel> 180.0 ms)`` otherwise, with the roof rules 2-4;
* ``unaccounted 180.0 ms outside every phase, device idle (active 0.0 ms, 0%): host
  stall`` or ``unaccounted 40.0 ms with the device active (38.0 ms, 95%): GPU work outside
  the mapped phases`` for the time outside every phase.

On a CPU (``active_source="cpu"``) the thread's CPU time plays the device's part, by one
rule (:func:`cpu_activity`, used by every line that says it): a part whose CPU time is at
least half its wall time worked; else, when the machine was busy (the step's run-queue
time, Linux schedstat, is at least half the step's time off the CPU), "cannot tell: the
machine was busy" with those milliseconds; else the thread waited inside it. The lines
also show an estimate of the part's own run-queue time (the step's, shared out by time
off the CPU).
Phases under ``MIN_LINE_SHARE`` of the step get no line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pytest_specperf.probe.kernels import STEP_KEY
from pytest_specperf.probe.phases import PHASES, SCHEDULER_PHASES, UNACCOUNTED, VERIFY
from pytest_specperf.telemetry.summary import (
    DRAM_UTIL,
    GPU_UTIL,
    SM_UTIL,
    TENSOR_UTIL,
    TelemetrySummary,
)

BottleneckKind = Literal["host-bound", "memory-bound", "compute-bound", "latency-bound", "unknown"]

_LABELS: dict[str, str] = {
    "host-bound": "host-bound (GPU starved)",
    "memory-bound": "memory-bound",
    "compute-bound": "compute-bound",
    "latency-bound": "latency-bound (small kernels, launch gaps)",
    "unknown": "unknown (not enough figures to decide)",
}

#: Phase whose device time the KV-read bandwidth is computed over.
VERIFY_PHASE = VERIFY


@dataclass(frozen=True)
class Thresholds:
    """Decision thresholds (see the module docstring for why these values)."""

    #: Device busy below this share of the step -> host-bound.
    host_bound_busy_share: float = 0.5
    #: Achieved KV-read bandwidth at or above this share of peak -> memory-bound.
    memory_bound_bandwidth_share: float = 0.6
    #: GPM DRAM bandwidth utilization at or above this (percent) -> memory-bound.
    memory_bound_dram_util_pct: float = 60.0
    #: GPM tensor-pipe utilization at or above this (percent) -> compute-bound.
    compute_bound_tensor_util_pct: float = 50.0
    #: GPM SM utilization at or above this (percent), DRAM below its threshold -> compute-bound.
    compute_bound_sm_util_pct: float = 80.0
    #: A phase (or the time outside every phase) active below this share of its span
    #: idled inside it: waits, not work.
    idle_share: float = 0.5


#: Phases (and the time outside them) under this share of the step get no activity line.
MIN_LINE_SHARE = 0.05
ActiveSource = Literal["device", "cpu"]


@dataclass(frozen=True)
class StepFigures:
    """Recorded figures of one case (medians, milliseconds and percent).

    ``device_ms`` is empty on a CPU run. ``unaccounted_ms`` defaults to the step minus the
    sum of the host phases. Utilization figures are GPM (``sm``, ``tensor``, ``dram``) and
    NVML (``gpu``) medians, None when not measured.
    """

    step_ms: float
    host_ms: Mapping[str, float] = field(default_factory=dict)
    device_ms: Mapping[str, float] = field(default_factory=dict)
    unaccounted_ms: float | None = None
    sm_util_pct: float | None = None
    tensor_util_pct: float | None = None
    dram_util_pct: float | None = None
    gpu_util_pct: float | None = None
    kv_read_bytes_per_step: float | None = None
    peak_bandwidth_bytes_per_s: float | None = None
    #: the probe thread's CPU time per phase, ``unaccounted`` and ``step`` (ms)
    cpu_ms: Mapping[str, float] = field(default_factory=dict)
    #: active time per phase, ``unaccounted`` and ``step`` (ms): the device's (kernel
    #: samples) or, on a CPU, the thread's CPU time; see ``active_source``
    active_ms: Mapping[str, float] = field(default_factory=dict)
    active_source: ActiveSource | None = None
    #: per phase (and ``unaccounted``): its largest kernel and that kernel's ms per step
    top_kernel: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    context_len: int | None = None
    #: time per step the probe's thread was runnable without a CPU (a busy machine), ms
    runq_ms: float | None = None
    #: the device's idle time between consecutive steps' forwards (SGLang on a GPU), ms
    device_gap_ms: float | None = None
    #: the median over steps of the step's active share and of its device-busy share (the
    #: run line's and the gated ``device_busy``'s figures); None: from the medians above
    step_active_share: float | None = None
    step_busy_share: float | None = None

    def with_telemetry(self, summary: TelemetrySummary | None) -> StepFigures:
        """Copy with the utilization medians of ``summary`` filled in (where measured)."""
        if summary is None or not summary.available:
            return self
        return replace(
            self,
            sm_util_pct=summary.median(SM_UTIL),
            tensor_util_pct=summary.median(TENSOR_UTIL),
            dram_util_pct=summary.median(DRAM_UTIL),
            gpu_util_pct=summary.median(GPU_UTIL),
        )


@dataclass(frozen=True)
class Bottleneck:
    """The verdict: ``kind``, the ``reasons`` that led to it, and the ``figures`` used.

    Figure keys: ``step_ms``, ``unaccounted_ms``, ``unaccounted_share``,
    ``host_ms.<phase>``, ``host_share.<phase>``, and on a GPU ``device_busy_ms``,
    ``device_busy_share``, ``device_ms.<phase>``, ``sm_util_pct``, ``tensor_util_pct``,
    ``dram_util_pct``, ``gpu_util_pct``, ``kv_read_bytes_per_s``,
    ``peak_bandwidth_bytes_per_s``, ``bandwidth_share`` (those measured). Shares are
    fractions (0.09 = 9%), utilizations percent.
    """

    kind: BottleneckKind
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    #: the activity lines (:func:`activity_lines`): per phase worked or waited, in words
    lines: tuple[str, ...] = ()
    active_source: ActiveSource | None = None

    @property
    def host_only(self) -> bool:
        """True when there were no device times (a CPU run)."""
        return "device_busy_share" not in self.figures

    def describe(self) -> str:
        """One line with the verdict and the numbers that led to it."""
        f = self.figures
        step = f.get("step_ms", float("nan"))
        unacc = f.get("unaccounted_ms", float("nan"))
        unacc_share = f.get("unaccounted_share", float("nan"))
        if self.host_only:
            phases = sorted(
                ((k.split(".", 1)[1], v) for k, v in f.items() if k.startswith("host_ms.")),
                key=lambda kv: -kv[1],
            )
            top = ", ".join(
                f"{name} {ms:.1f} ms ({_pct(f.get('host_share.' + name, 0.0))})"
                for name, ms in phases[:3]
                if ms > 0
            )
            text = f"host only (no device timing): step {step:.1f} ms"
            if "step_active_share" in f:
                text += f", CPU time {_pct(f['step_active_share'])} of it"
            if f.get("runq_share", 0.0) >= 0.01:
                text += f", waiting for a CPU {_pct(f['runq_share'])} (a busy machine)"
            text += f", unaccounted {unacc:.1f} ms ({_pct(unacc_share)})"
            return text + (f"; largest phases: {top}" if top else "")
        active = ""
        if "step_active_share" in f:
            active = f", device active {_pct(f['step_active_share'])} (kernel samples)"
        parts = [
            f"{_LABELS[self.kind]}: device busy {_pct(f['device_busy_share'])} of the "
            f"{step:.1f} ms step{active}, unaccounted {unacc:.1f} ms ({_pct(unacc_share)})"
        ]
        for key, label in (
            ("dram_util_pct", "DRAM"),
            ("tensor_util_pct", "tensor"),
            ("sm_util_pct", "SM"),
        ):
            if key in f:
                parts.append(f"{label} {f[key]:.0f}%")
        if "kv_read_bytes_per_s" in f:
            bw = f"KV read {_bandwidth(f['kv_read_bytes_per_s'])}"
            if "bandwidth_share" in f:
                bw += (
                    f" ({_pct(f['bandwidth_share'])} of "
                    f"{_bandwidth(f['peak_bandwidth_bytes_per_s'])} peak)"
                )
            parts.append(bw)
        return ", ".join(parts)


def scheduler_clause(host_ms: Mapping[str, float], step: float) -> str | None:
    """The serving scheduler's own host work in the step (SGLang: taking in requests,
    building and launching the batch, processing results, streaming output), largest
    first; None when the backend times none of it (the embedded engine)."""
    parts = sorted(
        ((p, host_ms[p]) for p in SCHEDULER_PHASES if host_ms.get(p, 0.0) > 0),
        key=lambda kv: -kv[1],
    )
    if not parts or step <= 0:
        return None
    total = sum(ms for _, ms in parts)
    named = ", ".join(f"{p} {ms:.1f} ms" for p, ms in parts)
    return f"the scheduler's own host work {total:.1f} ms ({_pct(total / step)}): {named}"


def _largest_phase(label: str, phase_ms: Mapping[str, float], step: float) -> str:
    name, ms = max(phase_ms.items(), key=lambda kv: kv[1])
    return f"{label}: {name} {ms:.1f} ms ({_pct(ms / step)})"


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%" if math.isfinite(share) else "?%"


def _bandwidth(bytes_per_s: float) -> str:
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.2f} TB/s"
    return f"{bytes_per_s / 1e9:.1f} GB/s"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def device_busy_share(device_ms: Mapping[str, float], step_ms: float) -> float | None:
    """Sum of device phase times over the step time; None without device times."""
    if not device_ms or step_ms <= 0:
        return None
    return sum(device_ms.values()) / step_ms


def achieved_bandwidth(kv_read_bytes_per_step: float, verify_device_ms: float) -> float | None:
    """KV bytes read per step over the verify phase's device time, in bytes/s."""
    if verify_device_ms <= 0 or kv_read_bytes_per_step < 0:
        return None
    return kv_read_bytes_per_step / (verify_device_ms / 1e3)


def _host_figures(figures: StepFigures, out: dict[str, float]) -> float:
    """Fill in the host-side figures; return the unaccounted time (ms)."""
    step = figures.step_ms
    unacc = _finite(figures.unaccounted_ms)
    if unacc is None:
        unacc = max(0.0, step - sum(figures.host_ms.values()))
    out["unaccounted_ms"] = unacc
    out["unaccounted_share"] = unacc / step
    for name, ms in figures.host_ms.items():
        out[f"host_ms.{name}"] = ms
        out[f"host_share.{name}"] = ms / step
    return unacc


def _host_only(figures: StepFigures, unacc: float, out: dict[str, float]) -> Bottleneck:
    step = figures.step_ms
    reasons = [
        "no device timing (CPU run): host-side view only",
        f"unaccounted {unacc:.1f} ms ({_pct(unacc / step)}) of the {step:.1f} ms step "
        "is outside every named phase",
    ]
    if figures.host_ms:
        reasons.append(_largest_phase("largest phase", figures.host_ms, step))
    sched = scheduler_clause(figures.host_ms, step)
    if sched is not None:
        reasons.append(sched)
    return Bottleneck("unknown", reasons, out)


@dataclass(frozen=True)
class _Device:
    """The device-side figures of one case (utilizations in percent, None if unmeasured)."""

    busy: float
    sm: float | None
    tensor: float | None
    dram: float | None
    bw_share: float | None


def _device_figures(figures: StepFigures, busy: float, out: dict[str, float]) -> _Device:
    out["device_busy_ms"] = sum(figures.device_ms.values())
    gap = _finite(figures.device_gap_ms)
    if gap is not None:
        out["device_gap_ms"] = gap
    out["device_busy_share"] = busy
    for name, ms in figures.device_ms.items():
        out[f"device_ms.{name}"] = ms
    utils = {
        "sm_util_pct": _finite(figures.sm_util_pct),
        "tensor_util_pct": _finite(figures.tensor_util_pct),
        "dram_util_pct": _finite(figures.dram_util_pct),
        "gpu_util_pct": _finite(figures.gpu_util_pct),
    }
    out.update({k: v for k, v in utils.items() if v is not None})
    bw_share: float | None = None
    kv = _finite(figures.kv_read_bytes_per_step)
    verify_ms = figures.device_ms.get(VERIFY_PHASE)
    achieved = achieved_bandwidth(kv, verify_ms) if kv is not None and verify_ms else None
    if achieved is not None:
        out["kv_read_bytes_per_s"] = achieved
        peak = _finite(figures.peak_bandwidth_bytes_per_s)
        if peak is not None and peak > 0:
            out["peak_bandwidth_bytes_per_s"] = peak
            bw_share = out["bandwidth_share"] = achieved / peak
    return _Device(
        busy, utils["sm_util_pct"], utils["tensor_util_pct"], utils["dram_util_pct"], bw_share
    )


def _host_bound(figures: StepFigures, d: _Device, unacc: float, t: Thresholds) -> list[str]:
    step = figures.step_ms
    reasons = [
        f"device busy {_pct(d.busy)} of the step, below {_pct(t.host_bound_busy_share)}: "
        "the GPU waits for the host"
    ]
    if unacc / step >= 0.5:
        reasons.append(
            f"unaccounted {unacc:.1f} ms ({_pct(unacc / step)}) is outside every named "
            "phase: a host-side stall"
        )
    elif figures.host_ms:
        reasons.append(_largest_phase("largest host phase", figures.host_ms, step))
    sched = scheduler_clause(figures.host_ms, step)
    gap = _finite(figures.device_gap_ms)
    if gap is not None and gap > 0:
        reasons.append(
            f"device idle {gap:.1f} ms ({_pct(gap / step)}) between one step's forward and "
            f"the next" + (f", while {sched}" if sched is not None else "")
        )
    elif sched is not None:  # what the host did while the GPU waited
        reasons.append(sched)
    return reasons


def _memory(d: _Device, t: Thresholds) -> tuple[list[str], float]:
    reasons: list[str] = []
    score = 0.0
    if d.bw_share is not None and d.bw_share >= t.memory_bound_bandwidth_share:
        reasons.append(
            f"KV reads reach {_pct(d.bw_share)} of peak bandwidth "
            f"(>= {_pct(t.memory_bound_bandwidth_share)})"
        )
        score = max(score, d.bw_share / t.memory_bound_bandwidth_share)
    if d.dram is not None and d.dram >= t.memory_bound_dram_util_pct:
        reasons.append(
            f"DRAM bandwidth utilization {d.dram:.0f}% (>= {t.memory_bound_dram_util_pct:.0f}%)"
        )
        score = max(score, d.dram / t.memory_bound_dram_util_pct)
    return reasons, score


def _compute(d: _Device, t: Thresholds, memory_bound: bool) -> tuple[list[str], float]:
    reasons: list[str] = []
    score = 0.0
    if d.tensor is not None and d.tensor >= t.compute_bound_tensor_util_pct:
        reasons.append(
            f"tensor pipes busy {d.tensor:.0f}% (>= {t.compute_bound_tensor_util_pct:.0f}%)"
        )
        score = max(score, d.tensor / t.compute_bound_tensor_util_pct)
    if d.sm is not None and d.sm >= t.compute_bound_sm_util_pct and not memory_bound:
        reasons.append(
            f"SM utilization {d.sm:.0f}% (>= {t.compute_bound_sm_util_pct:.0f}%) without "
            "DRAM saturation"
        )
        score = max(score, d.sm / t.compute_bound_sm_util_pct)
    return reasons, score


def _busy_verdict(d: _Device, t: Thresholds, out: dict[str, float]) -> Bottleneck:
    """Memory-, compute- or latency-bound (or unknown) for a GPU that is mostly busy."""
    busy_reason = f"device busy {_pct(d.busy)} of the step"
    memory, memory_score = _memory(d, t)
    compute, compute_score = _compute(d, t, bool(memory))
    if memory and (not compute or memory_score >= compute_score):
        return Bottleneck("memory-bound", [busy_reason, *memory, *compute], out)
    if compute:
        return Bottleneck("compute-bound", [busy_reason, *compute, *memory], out)
    if d.dram is not None and d.tensor is not None:
        reasons = [
            busy_reason,
            f"DRAM {d.dram:.0f}% (< {t.memory_bound_dram_util_pct:.0f}%) and tensor "
            f"{d.tensor:.0f}% (< {t.compute_bound_tensor_util_pct:.0f}%): neither roof is "
            "near, so the time goes to kernel latency, launches and gaps",
        ]
        return Bottleneck("latency-bound", reasons, out)
    missing = [
        name
        for name, value in (("GPM DRAM utilization", d.dram), ("GPM tensor utilization", d.tensor))
        if value is None
    ]
    reasons = [
        busy_reason,
        f"missing {' and '.join(missing)}: cannot tell memory-, compute- and latency-bound apart",
    ]
    if d.bw_share is not None:
        reasons.append(
            f"KV reads reach {_pct(d.bw_share)} of peak (a lower bound: weights not counted)"
        )
    return Bottleneck("unknown", reasons, out)


def classify(figures: StepFigures, thresholds: Thresholds | None = None) -> Bottleneck:
    """The bottleneck verdict for one case (decision rules in the module docstring)."""
    t = thresholds or Thresholds()
    step = figures.step_ms
    out: dict[str, float] = {"step_ms": step}
    if not math.isfinite(step) or step <= 0:
        return Bottleneck("unknown", [f"step time {step!r} ms is not a positive number"], out)
    unacc = _host_figures(figures, out)
    _activity_figures(figures, unacc, out)
    verdict = _classify(figures, unacc, out, t)
    return replace(
        verdict, lines=tuple(activity_lines(figures, t)), active_source=figures.active_source
    )


def _classify(
    figures: StepFigures, unacc: float, out: dict[str, float], t: Thresholds
) -> Bottleneck:
    busy = device_busy_share(figures.device_ms, figures.step_ms)
    if busy is None:
        return _host_only(figures, unacc, out)
    per_step = _finite(figures.step_busy_share)  # the gated device_busy's own figure
    busy = busy if per_step is None else per_step
    d = _device_figures(figures, busy, out)
    active = out.get("step_active_share") if figures.active_source == "device" else None
    if active is not None and active < t.host_bound_busy_share:
        reasons = [
            f"device active {_pct(active)} of the step (kernel samples), below "
            f"{_pct(t.host_bound_busy_share)}; its phases' CUDA-event spans cover "
            f"{_pct(busy)}: the GPU idles, inside the phases or between them"
        ]
        return Bottleneck("host-bound", reasons + _host_bound(figures, d, unacc, t)[1:], out)
    if busy < t.host_bound_busy_share:
        return Bottleneck("host-bound", _host_bound(figures, d, unacc, t), out)
    return _busy_verdict(d, t, out)


# -- active time inside the phases ---------------------------------------------------------
def _span(figures: StepFigures, part: str, unacc: float | None) -> float | None:
    """A part's span: device span on a GPU with kernel samples, else its host wall time."""
    if part == UNACCOUNTED:
        return unacc
    if figures.active_source == "device":
        return figures.device_ms.get(part)
    return figures.host_ms.get(part)


def _activity_figures(figures: StepFigures, unacc: float, out: dict[str, float]) -> None:
    """``cpu_ms.<part>``, and per part ``active_ms``, ``idle_ms``, ``active_share``."""
    for part, ms in figures.cpu_ms.items():
        out[f"cpu_ms.{part}"] = ms
    runq = _finite(figures.runq_ms)
    if runq is not None:
        out["runq_ms"] = runq
        out["runq_share"] = runq / figures.step_ms
    if figures.active_source is None:
        return
    for part in (*PHASES, UNACCOUNTED):
        active = _finite(figures.active_ms.get(part))
        span = _span(figures, part, unacc)
        if active is None or span is None:
            continue
        out[f"active_ms.{part}"] = active
        out[f"idle_ms.{part}"] = max(span - active, 0.0)
        if span > 0:
            out[f"active_share.{part}"] = min(active / span, 1.0)
    step_active = _finite(figures.active_ms.get(STEP_KEY))
    if step_active is not None:
        out["active_ms.step"] = step_active
        share = _finite(figures.step_active_share)  # per step, as the run line shows it
        out["step_active_share"] = min(step_active / figures.step_ms if share is None else share,
                                       1.0)  # fmt: skip


def _top(figures: StepFigures, part: str) -> str:
    top = figures.top_kernel.get(part)
    return f" (top: {top[0]} {top[1]:.1f} ms)" if top else ""


def _kernel_kind(figures: StepFigures, part: str, active_ms: float, t: Thresholds) -> str:
    """What a busy phase's kernels are bound by, from the run's roofs (GPM, KV reads)."""
    dram, tensor, sm = (
        _finite(figures.dram_util_pct),
        _finite(figures.tensor_util_pct),
        _finite(figures.sm_util_pct),
    )
    bw = _verify_bandwidth_share(figures, active_ms) if part == VERIFY_PHASE else None
    if (dram is not None and dram >= t.memory_bound_dram_util_pct) or (
        bw is not None and bw >= t.memory_bound_bandwidth_share
    ):
        return "memory-bound kernels"
    if (tensor is not None and tensor >= t.compute_bound_tensor_util_pct) or (
        sm is not None and sm >= t.compute_bound_sm_util_pct
    ):
        return "compute-bound kernels"
    if dram is not None:
        return "latency-bound kernels"
    return "busy kernels (no DRAM figure to tell memory-, compute- and latency-bound apart)"


def _verify_bandwidth_share(figures: StepFigures, verify_ms: float) -> float | None:
    kv, peak = _finite(figures.kv_read_bytes_per_step), _finite(figures.peak_bandwidth_bytes_per_s)
    bw = achieved_bandwidth(kv, verify_ms) if kv is not None and verify_ms > 0 else None
    return bw / peak if bw is not None and peak else None


def device_activity(
    figures: StepFigures, part: str, span: float, active: float, t: Thresholds | None = None
) -> str:
    """Whether a phase worked or waited on a GPU, from its kernels' active time inside its
    device span: the one rule of the activity lines and of "where the time went".
    ``the GPU idled inside verify (waits, not work)`` under ``idle_share`` of the span,
    else what its kernels are bound by (``memory-bound kernels``, ...)."""
    t = t or Thresholds()
    if span <= 0 or active / span < t.idle_share:
        return f"the GPU idled inside {part} (waits, not work)"
    return _kernel_kind(figures, part, active, t)


def phase_activity(figures: StepFigures, phase: str) -> str | None:
    """Whether ``phase`` worked or waited in words, by the rule of its activity line
    (:func:`cpu_activity` on a CPU, :func:`device_activity` on a GPU with kernel samples),
    from the span the line uses (:func:`_span`); None where the run did not measure it, and
    for ``unaccounted``, which its own line words (a stall, GPU work outside the phases)."""
    active = _finite(figures.active_ms.get(phase))
    span = _span(figures, phase, None) if phase != UNACCOUNTED else None
    if figures.active_source is None or active is None or span is None:
        return None
    if figures.active_source == "cpu":
        return cpu_activity(figures, phase, span, active)
    return device_activity(figures, phase, span, active)


def _phase_line(figures: StepFigures, part: str, span: float, active: float, t: Thresholds) -> str:
    share = active / span if span > 0 else 0.0
    if figures.active_source == "cpu":
        return _cpu_phase_line(figures, part, span, active, t)
    words = device_activity(figures, part, span, active, t)
    if share < t.idle_share:
        return f"{part}: span {span:.1f} ms, device active {active:.1f} ms ({_pct(share)}): {words}"
    dram = _finite(figures.dram_util_pct)
    roof = f", DRAM {dram:.0f}% of peak" if dram is not None else ""
    return (
        f"{part}: device active {active:.1f} ms ({_pct(share)} of its {span:.1f} ms span)"
        f"{roof}: {words}{_top(figures, part)}"
    )


def _runq_part(figures: StepFigures, span: float, cpu: float) -> float:
    """The step's run-queue time that falls in a part (``span`` ms wall, ``cpu`` ms CPU):
    shared out by time off the CPU, where alone a thread can wait for one."""
    runq = _finite(figures.runq_ms)
    step_cpu = _finite(figures.cpu_ms.get(STEP_KEY))
    if runq is None or step_cpu is None:
        return 0.0
    off, step_off = max(span - cpu, 0.0), figures.step_ms - step_cpu
    if step_off <= 0:
        return 0.0
    return min(runq * off / step_off, off)


def machine_busy(figures: StepFigures, t: Thresholds | None = None) -> tuple[float, float] | None:
    """``(runq_ms, off_cpu_ms)`` of the step when the machine was busy: the thread's
    run-queue time (runnable, no CPU) is at least ``idle_share`` of the time it spent off
    the CPU and at least ``MIN_LINE_SHARE`` of the step, so its time off the CPU cannot be
    read as waits of its own; None otherwise."""
    t = t or Thresholds()
    runq, step_cpu = _finite(figures.runq_ms), _finite(figures.cpu_ms.get(STEP_KEY))
    if runq is None or step_cpu is None:
        return None
    off = max(figures.step_ms - step_cpu, 0.0)
    if off <= 0 or runq < t.idle_share * off or runq < MIN_LINE_SHARE * figures.step_ms:
        return None
    return runq, off


CpuActivity = Literal["work", "wait", "busy"]


def cpu_activity_kind(
    figures: StepFigures, span: float, active: float, t: Thresholds | None = None
) -> CpuActivity:
    """Whether a part of the step worked or waited on a CPU: the one rule every line that
    says it uses (the activity lines, the unaccounted line, "where the time went").

    ``busy``: the machine was busy (:func:`machine_busy`) and the part spent a material
    share of its span (``MIN_LINE_SHARE``) off the CPU: that time may be waits for a CPU
    as well as the thread's own, so it cannot tell. Else ``work`` when the thread was on
    the CPU for at least ``idle_share`` of the span, ``wait`` when not (a sleep, a lock, a
    poll inside the part)."""
    t = t or Thresholds()
    off = max(span - active, 0.0)
    if off >= MIN_LINE_SHARE * span and machine_busy(figures, t) is not None:
        return "busy"
    return "work" if span > 0 and active / span >= t.idle_share else "wait"


def busy_words(figures: StepFigures) -> str:
    """``cannot tell: the machine was busy (...)`` with the step's milliseconds."""
    runq, off = machine_busy(figures) or (math.nan, math.nan)
    return (
        f"cannot tell: the machine was busy (the thread was off the CPU {off:.1f} ms per "
        f"step, {runq:.1f} ms of it waiting for a CPU)"
    )


def cpu_activity(
    figures: StepFigures, part: str, span: float, active: float, t: Thresholds | None = None
) -> str:
    """:func:`cpu_activity_kind` in the words of the activity lines."""
    kind = cpu_activity_kind(figures, span, active, t)
    if kind == "busy":
        return busy_words(figures)
    if part == UNACCOUNTED:
        if kind == "work":
            return "host stall (work outside the mapped phases)"
        return "the thread waited outside every phase"
    if kind == "work":
        return "busy on the CPU (work, not waits)"
    return f"the thread waited inside {part} (waits, not work)"


def _runq_clause(figures: StepFigures, span: float, active: float) -> str:
    """ ", about X ms waiting for a CPU (a busy machine)" when the run-queue part of ``span``
    is worth a line, else ""."""
    runq = _runq_part(figures, span, active)
    if runq >= MIN_LINE_SHARE * span:
        return f", about {runq:.1f} ms waiting for a CPU (a busy machine)"
    return ""


def _cpu_phase_line(
    figures: StepFigures, part: str, span: float, active: float, t: Thresholds
) -> str:
    share = active / span if span > 0 else 0.0
    head = f"{part}: span {span:.1f} ms, CPU {active:.1f} ms ({_pct(share)})"
    head += _runq_clause(figures, span, active)
    verdict = cpu_activity(figures, part, span, active, t)
    top = _top(figures, part) if verdict.startswith("busy on the CPU") else ""
    return f"{head}: {verdict}{top}"


def _unaccounted_line(figures: StepFigures, unacc: float, t: Thresholds) -> str | None:
    active = _finite(figures.active_ms.get(UNACCOUNTED))
    head = f"unaccounted {unacc:.1f} ms"
    if figures.active_source is None or active is None:
        if not figures.device_ms:
            return None
        return (
            f"{head} outside every phase: device activity not sampled, so a host stall "
            "cannot be told from GPU work outside the mapped phases (sample kernels with "
            "--specperf-profile kernels=N)"
        )
    share = active / unacc if unacc > 0 else 0.0
    if figures.active_source == "cpu":
        text = f"{head} outside every phase, CPU {active:.1f} ms ({_pct(share)})"
        text += _runq_clause(figures, unacc, active)
        verdict = cpu_activity(figures, UNACCOUNTED, unacc, active, t)
        top = _top(figures, UNACCOUNTED) if verdict.startswith("host stall") else ""
        return f"{text}: {verdict}{top}"
    if share < t.idle_share:
        cpu = _finite(figures.cpu_ms.get(UNACCOUNTED))
        host = f"; host thread CPU {cpu:.1f} ms of it" if cpu is not None else ""
        return (
            f"{head} outside every phase, device idle (active {active:.1f} ms, "
            f"{_pct(share)}): host stall{host}"
        )
    return (
        f"{head} with the device active ({active:.1f} ms, {_pct(share)}): GPU work outside "
        "the mapped phases" + _top(figures, UNACCOUNTED)
    )


def _kv_line(figures: StepFigures) -> str | None:
    """``verify read the 46000-token KV at N GB/s, P% of peak`` (GPU, KV size known)."""
    kv = _finite(figures.kv_read_bytes_per_step)
    active = None
    if figures.active_source == "device":
        active = _finite(figures.active_ms.get(VERIFY_PHASE))
    verify_ms = active if active else figures.device_ms.get(VERIFY_PHASE)
    if kv is None or not verify_ms:
        return None
    bw = achieved_bandwidth(kv, verify_ms)
    if bw is None:
        return None
    ctx = f"{figures.context_len}-token " if figures.context_len else ""
    over = "its device active time" if active else "its CUDA-event span"
    text = f"{VERIFY_PHASE} read the {ctx}KV at {_bandwidth(bw)} over {over}"
    peak = _finite(figures.peak_bandwidth_bytes_per_s)
    if peak:
        text += f", {_pct(bw / peak)} of {_bandwidth(peak)} peak"
    return text


def activity_lines(figures: StepFigures, thresholds: Thresholds | None = None) -> list[str]:
    """Per phase (at least ``MIN_LINE_SHARE`` of the step) whether it worked or waited, the
    time outside every phase, and the verify's KV-read bandwidth, in words with numbers."""
    t = thresholds or Thresholds()
    step = figures.step_ms
    if not math.isfinite(step) or step <= 0:
        return []
    unacc = _finite(figures.unaccounted_ms)
    if unacc is None:
        unacc = max(0.0, step - sum(figures.host_ms.values()))
    lines = []
    if figures.active_source is not None:
        for p in PHASES:
            span = _span(figures, p, unacc)
            active = _finite(figures.active_ms.get(p))
            if span is not None and active is not None and span >= MIN_LINE_SHARE * step:
                lines.append(_phase_line(figures, p, span, active, t))
    if unacc >= MIN_LINE_SHARE * step:
        line = _unaccounted_line(figures, unacc, t)
        lines += [line] if line else []
    kv = _kv_line(figures)
    return lines + ([kv] if kv else [])
