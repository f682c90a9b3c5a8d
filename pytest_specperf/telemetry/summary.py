"""What one measurement window's GPU telemetry came to: :class:`TelemetrySummary`.

Metric names (all medians/min/max over the samples of the window):

* ``gpu_util_pct``: NVML utilization.gpu, share of the sample period in which at least one
  kernel ran (coarse: one tiny kernel counts as busy).
* ``mem_util_pct``: NVML utilization.memory, share of time the memory controller was busy
  (not a bandwidth figure).
* ``sm_clock_mhz``, ``mem_clock_mhz``: current SM and memory clocks.
* ``power_w``: board power draw.
* ``sm_util_pct``, ``tensor_util_pct``, ``dram_util_pct``: GPM (Hopper and newer) SM
  occupancy, tensor-pipe activity and DRAM bandwidth as a share of the theoretical peak,
  each computed between two consecutive GPM samples.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pytest_specperf.telemetry.clocks import is_throttling

GPU_UTIL: Final = "gpu_util_pct"
MEM_UTIL: Final = "mem_util_pct"
SM_CLOCK: Final = "sm_clock_mhz"
MEM_CLOCK: Final = "mem_clock_mhz"
POWER: Final = "power_w"
SM_UTIL: Final = "sm_util_pct"
TENSOR_UTIL: Final = "tensor_util_pct"
DRAM_UTIL: Final = "dram_util_pct"

#: Every metric the sampler may report, in display order.
METRICS: Final[tuple[str, ...]] = (
    GPU_UTIL,
    MEM_UTIL,
    SM_CLOCK,
    MEM_CLOCK,
    POWER,
    SM_UTIL,
    TENSOR_UTIL,
    DRAM_UTIL,
)
#: The GPM subset.
GPM_METRICS: Final[tuple[str, ...]] = (SM_UTIL, TENSOR_UTIL, DRAM_UTIL)

UNAVAILABLE_PREFIX: Final = "telemetry unavailable: "


@dataclass(frozen=True)
class MetricSummary:
    """Robust summary of one metric's samples."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> MetricSummary:
        """Summary of a non-empty sequence of samples."""
        if not values:
            raise ValueError("MetricSummary.of needs at least one value")
        return cls(
            median=float(statistics.median(values)),
            min=float(min(values)),
            max=float(max(values)),
            n=len(values),
        )

    def to_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}


@dataclass(frozen=True)
class TelemetrySummary:
    """GPU telemetry over one measurement window.

    ``available`` is False when nothing could be sampled (no pynvml, no NVML library, no
    permission, no such device, nothing supported); ``reason`` is then one line starting
    with ``"telemetry unavailable: "``. ``metrics`` holds only the metrics that produced
    samples; ``dropped`` says, per metric (or ``"gpm"``, ``"processes"``,
    ``"clock_event_reasons"``), why it was not sampled. ``throttle_reasons`` counts, per
    decoded clock-event reason (benign ones included), the samples in which it was active,
    out of ``reason_samples``; ``foreign_pids`` / ``unresolved_pids`` count, per PID, the
    samples in which another process held a context on the device, out of
    ``process_samples`` (see :mod:`pytest_specperf.telemetry.processes`). With marked
    windows (``windows`` > 0) every count covers only the readings inside them.
    """

    available: bool
    reason: str = ""
    device_index: int | None = None
    samples: int = 0
    duration_s: float = 0.0
    metrics: Mapping[str, MetricSummary] = field(default_factory=dict)
    throttle_reasons: Mapping[str, int] = field(default_factory=dict)
    reason_samples: int = 0
    foreign_pids: Mapping[int, int] = field(default_factory=dict)
    unresolved_pids: Mapping[int, int] = field(default_factory=dict)
    process_samples: int = 0
    dropped: Mapping[str, str] = field(default_factory=dict)
    errors: int = 0
    #: marked windows the readings were restricted to (0: the whole sampling span),
    #: their total length, and the samples taken outside them (left out)
    windows: int = 0
    window_s: float = 0.0
    outside_samples: int = 0

    @classmethod
    def unavailable(cls, reason: str, device_index: int | None = None) -> TelemetrySummary:
        """A summary saying telemetry could not be taken, with a one-line reason."""
        text = " ".join(reason.split())
        if not text.startswith(UNAVAILABLE_PREFIX):
            text = UNAVAILABLE_PREFIX + text
        return cls(available=False, reason=text, device_index=device_index)

    def median(self, metric: str) -> float | None:
        """Median of ``metric``, or None when it was not sampled."""
        summary = self.metrics.get(metric)
        return summary.median if summary is not None else None

    @property
    def throttling(self) -> dict[str, int]:
        """Only the reasons that mean real throttling (see
        :mod:`pytest_specperf.telemetry.clocks`), with their sample counts."""
        return {k: v for k, v in self.throttle_reasons.items() if is_throttling(k)}

    def utilization(self) -> dict[str, float]:
        """Medians of the utilization metrics that were sampled, keyed by metric name."""
        out: dict[str, float] = {}
        for name in (GPU_UTIL, MEM_UTIL, SM_UTIL, TENSOR_UTIL, DRAM_UTIL):
            value = self.median(name)
            if value is not None:
                out[name] = value
        return out

    def describe(self) -> str:
        """One human line: the medians, throttling and other processes."""
        if not self.available:
            return self.reason
        labels = {
            GPU_UTIL: ("GPU", "%"),
            MEM_UTIL: ("mem-ctl", "%"),
            SM_UTIL: ("SM", "%"),
            TENSOR_UTIL: ("tensor", "%"),
            DRAM_UTIL: ("DRAM", "%"),
            SM_CLOCK: ("SM clock", " MHz"),
            MEM_CLOCK: ("mem clock", " MHz"),
            POWER: ("power", " W"),
        }
        parts = [
            f"{label} {self.metrics[name].median:.0f}{unit}"
            for name, (label, unit) in labels.items()
            if name in self.metrics
        ]
        throttling = self.throttling
        parts.append(
            "throttling: "
            + (
                ", ".join(f"{k} {v}/{self.reason_samples}" for k, v in sorted(throttling.items()))
                if throttling
                else "none"
            )
        )
        if self.foreign_pids:
            pids = ", ".join(str(p) for p in sorted(self.foreign_pids))
            parts.append(f"other processes on the GPU: {pids}")
        span = f"{self.samples} samples, {self.duration_s:.1f} s"
        if self.windows:
            span = f"{self.samples} samples in {self.windows} window(s) of {self.window_s:.1f} s"
        return f"telemetry ({span}): " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON/YAML-safe mapping (PIDs as strings)."""
        return {
            "available": self.available,
            "reason": self.reason,
            "device_index": self.device_index,
            "samples": self.samples,
            "duration_s": self.duration_s,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "throttle_reasons": dict(self.throttle_reasons),
            "reason_samples": self.reason_samples,
            "foreign_pids": {str(k): v for k, v in self.foreign_pids.items()},
            "unresolved_pids": {str(k): v for k, v in self.unresolved_pids.items()},
            "process_samples": self.process_samples,
            "dropped": dict(self.dropped),
            "errors": self.errors,
            "windows": self.windows,
            "window_s": self.window_s,
            "outside_samples": self.outside_samples,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TelemetrySummary:
        """Read back what ``to_dict`` wrote; ``ValueError`` naming the field if unusable."""
        if not isinstance(d, Mapping) or not isinstance(d.get("available"), bool):
            raise ValueError("telemetry: expected an object with 'available'")
        try:
            metrics = {
                str(k): MetricSummary(
                    float(v["median"]), float(v["min"]), float(v["max"]), int(v["n"])
                )
                for k, v in (d.get("metrics") or {}).items()
            }
            index = d.get("device_index")
            return cls(
                available=d["available"],
                reason=str(d.get("reason", "")),
                device_index=None if index is None else int(index),
                samples=int(d.get("samples", 0)),
                duration_s=float(d.get("duration_s", 0.0)),
                metrics=metrics,
                throttle_reasons=_counts(d.get("throttle_reasons"), str),
                reason_samples=int(d.get("reason_samples", 0)),
                foreign_pids=_counts(d.get("foreign_pids"), int),
                unresolved_pids=_counts(d.get("unresolved_pids"), int),
                process_samples=int(d.get("process_samples", 0)),
                dropped={str(k): str(v) for k, v in (d.get("dropped") or {}).items()},
                errors=int(d.get("errors", 0)),
            )
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"telemetry: {type(e).__name__}: {e}") from None


def _counts(d: Any, key: Any) -> dict[Any, int]:
    """A ``{key: count}`` mapping read back (PIDs were written as strings)."""
    return {key(k): int(v) for k, v in (d or {}).items()}
