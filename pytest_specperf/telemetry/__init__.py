"""GPU telemetry and "where did the time go" (issue 6): device identity, NVML/GPM sampling,
peak bandwidth, bottleneck verdict, utilization gates, NVTX ranges.

No dependency on pytest; torch and pynvml (nvidia-ml-py) are imported lazily and their
absence is a reported state, never an exception. Public surface:

Device identity (:mod:`.device`)
    ``detect_device(prefer_cuda: bool = True, override_slug: str | None = None, *,
    cuda_index: int | None = None) -> DeviceInfo``
    ``DeviceInfo`` (frozen): ``kind`` ("cuda" | "cpu"), ``name``, ``slug``, ``count``,
    ``memory_bytes``, ``driver``, ``compute_capability``, ``uuid``, ``cuda_index``,
    ``nvml_index``, ``cpu_model``, ``cpu_cores``, ``notes``; ``to_dict()``.
    ``slugify(name, *, kind="cuda", count=1, cpu_cores=None) -> str``
    ``validate_slug(slug) -> str`` (raises ``ValueError`` naming the value and the pattern
    ``[a-z0-9][a-z0-9._-]{0,79}``; the plugin turns it into a ``pytest.UsageError``).
    ``import_pynvml() -> ModuleType | None`` / ``load_pynvml() -> PynvmlImport(module,
    reason)``: the one way this package imports pynvml, with the deprecated ``pynvml``
    shim's ``FutureWarning`` silenced so ``-W error`` runs survive.

Sampling (:mod:`.nvml`, :mod:`.summary`, :mod:`.clocks`, :mod:`.processes`)
    ``TelemetrySampler(device_index: int, interval_s: float = 0.05, *, uuid=None,
    own_pids=(), gpm_interval_s=0.11, ...)``: ``start()``, ``stop() -> TelemetrySummary``,
    context manager, ``add_own_pid(pid)``, ``sample_once()``, ``summary``.
    Windows (:mod:`.windows`): ``mark_start()`` / ``mark_end()``, ``with sampler.window():``
    or ``add_windows(spans)`` (wall-clock ns, e.g. decode steps ``(wall_ns, wall_ns +
    step_ns)``) restrict the summary to readings inside them; ``MIN_WINDOW_S`` of
    back-to-back work per window lets GPM (> 0.1 s per value) count.
    ``TelemetrySummary``: ``available``, ``reason`` ("telemetry unavailable: ..."),
    ``metrics`` (name -> ``MetricSummary(median, min, max, n)``), ``throttle_reasons``,
    ``foreign_pids``, ``unresolved_pids``, ``dropped``, ``throttling``, ``median(name)``,
    ``utilization()``, ``describe()``, ``to_dict()``.
    ``decode_clock_event_reasons(mask) -> tuple[str, ...]``, ``is_throttling(reason)``.

Bandwidth (:mod:`.bandwidth`)
    ``peak_bandwidth(name: str, nvml_index: int | None = None) -> PeakBandwidth | None``
    (NVML bus width x max memory clock x 2, else a table of known GPUs, else None).

Verdict (moved to :mod:`pytest_specperf.judging.bottleneck`)
    ``classify(StepFigures(...), thresholds: Thresholds | None = None) -> Bottleneck``;
    ``Bottleneck(kind, reasons, figures).describe()`` gives one line such as
    "host-bound (GPU starved): device busy 9% of the 192.0 ms step, unaccounted 181.3 ms
    (94%), DRAM 2%, tensor 0%". ``StepFigures.with_telemetry(summary)`` fills in the
    utilization medians.

Validity (moved to :mod:`pytest_specperf.judging.gates`)
    ``invalid_reasons(summary) -> list[str]`` (throttled clocks, other processes on the
    GPU: INVALID, never SLOWER).

NVTX (:mod:`.nvtx`)
    ``nvtx_range(name, *, enabled=True)`` context manager; ``NvtxRanges(enabled)`` for hot
    paths. No-ops without CUDA.
"""

from __future__ import annotations

from pytest_specperf.telemetry.bandwidth import (
    KNOWN_PEAK_BANDWIDTH,
    PeakBandwidth,
    bandwidth_from_bus,
    known_peak_bandwidth,
    peak_bandwidth,
)
from pytest_specperf.telemetry.clocks import (
    BENIGN_REASONS,
    THROTTLING_REASONS,
    decode_clock_event_reasons,
    is_throttling,
)
from pytest_specperf.telemetry.device import (
    SLUG_PATTERN,
    DeviceInfo,
    DeviceKind,
    detect_device,
    slugify,
    validate_slug,
)
from pytest_specperf.telemetry.loader import PynvmlImport, import_pynvml, load_pynvml
from pytest_specperf.telemetry.nvml import MIN_WINDOW_S, TelemetrySampler
from pytest_specperf.telemetry.nvtx import NvtxRanges, nvtx_range
from pytest_specperf.telemetry.summary import METRICS, MetricSummary, TelemetrySummary

__all__ = [
    "BENIGN_REASONS",
    "KNOWN_PEAK_BANDWIDTH",
    "METRICS",
    "MIN_WINDOW_S",
    "SLUG_PATTERN",
    "THROTTLING_REASONS",
    "DeviceInfo",
    "DeviceKind",
    "MetricSummary",
    "NvtxRanges",
    "PeakBandwidth",
    "PynvmlImport",
    "TelemetrySampler",
    "TelemetrySummary",
    "bandwidth_from_bus",
    "decode_clock_event_reasons",
    "detect_device",
    "import_pynvml",
    "is_throttling",
    "known_peak_bandwidth",
    "load_pynvml",
    "nvtx_range",
    "peak_bandwidth",
    "slugify",
    "validate_slug",
]
