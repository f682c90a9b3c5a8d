"""NVML/GPM sampling thread around measured steps: :class:`TelemetrySampler`.

Usage::

    sampler = TelemetrySampler(device.nvml_index, interval_s=0.05)
    sampler.add_own_pid(server_pid)
    with sampler:
        run_measured_steps()
    summary = sampler.summary          # or: summary = sampler.stop()

Restricting the summary to the work being judged (decode, not prefill or HTTP): mark
windows, on the wall clock (``time.time_ns``, the clock of ``StepRecord.wall_ns``), and
only readings inside them count (see :mod:`.windows`)::

    sampler.start()
    with sampler.window():             # or sampler.mark_start() ... sampler.mark_end()
        decode()
    sampler.add_windows((r.wall_ns, r.wall_ns + r.step_ns) for r in records)  # after the fact
    summary = sampler.stop()           # summary.windows, .window_s, .outside_samples

GPM values need more than 0.1 s between two samples, so a window should hold at least
``MIN_WINDOW_S`` of back-to-back work (one long decode, not many short requests).

What is read each interval (one NVML call each; a few tens of microseconds in all):
utilization (gpu, memory), SM and memory clocks, clock-event (throttle) reasons, power,
the compute processes on the device and, where the device supports GPM (Hopper and newer),
SM / tensor-pipe / DRAM-bandwidth utilization computed between two GPM samples. At
``start()`` only the first GPM sample is taken (NVML utilization then still describes the
time *before* the window); at ``stop()`` one last full sample is taken, so a window shorter
than the interval still gets one.

Two sampling periods to know about: NVML's utilization.gpu/memory are averages over the
driver's own sample period (1/6 s to 1 s depending on the product), so sampling every 50 ms
oversamples them (harmless for a median). GPM counters refresh about every 100 ms and NVML's
documentation asks for more than 100 ms between the two ``nvmlGpmSampleGet()`` calls, so GPM
runs on its own cadence: a new GPM sample (and one set of GPM values) only once
``gpm_interval_s`` (default 0.11 s) has passed since the previous one. A window shorter than
that gets no GPM values (``dropped["gpm"]`` says so).

Failure policy: a missing ``pynvml``, a missing NVML library, no permission, no such device
all give ``TelemetrySummary(available=False, reason="telemetry unavailable: ...")``, never
an exception. A metric whose call answers NOT_SUPPORTED / NO_PERMISSION / FUNCTION_NOT_FOUND
(or that this nvidia-ml-py lacks) is dropped for the rest of the window with the reason in
``summary.dropped``; any other error skips that sample and is counted in ``summary.errors``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Final

from pytest_specperf.telemetry import loader
from pytest_specperf.telemetry.clocks import decode_clock_event_reasons
from pytest_specperf.telemetry.processes import PidClass, ProcessClassifier
from pytest_specperf.telemetry.summary import (
    DRAM_UTIL,
    GPM_METRICS,
    GPU_UTIL,
    MEM_CLOCK,
    MEM_UTIL,
    METRICS,
    POWER,
    SM_CLOCK,
    SM_UTIL,
    TENSOR_UTIL,
    MetricSummary,
    TelemetrySummary,
)
from pytest_specperf.telemetry.windows import STEP_GAP_NS, SampleLog, Span, merge_windows

# NVML return codes (nvml.h); read from the module when present, these are the fallbacks.
_NVML_SUCCESS = 0
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_NO_PERMISSION = 4
_NVML_ERROR_FUNCTION_NOT_FOUND = 13

#: GPM metric name -> nvidia-ml-py constant name.
_GPM_IDS: dict[str, str] = {
    SM_UTIL: "NVML_GPM_METRIC_SM_UTIL",
    TENSOR_UTIL: "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    DRAM_UTIL: "NVML_GPM_METRIC_DRAM_BW_UTIL",
}

_UTILIZATION = "utilization"
_REASONS = "clock_event_reasons"
_PROCESSES = "processes"
_GPM = "gpm"

#: NVML asks for more than 100 ms between the two GPM samples of one metrics computation.
GPM_MIN_INTERVAL_S: Final = 0.1
#: Default spacing of GPM samples: the minimum plus a margin for timer jitter.
GPM_INTERVAL_S: Final = 0.11
#: A marked window should hold at least this much back-to-back work: several GPM
#: intervals fit, and NVML's own utilization averages mostly cover it.
MIN_WINDOW_S: Final = 1.0

#: Returned by ``TelemetrySampler._call`` when the query failed (None can be a value).
_FAILED: Final[Any] = object()


class TelemetrySampler:
    """Samples one GPU through NVML in a daemon thread while measured steps run.

    ``device_index`` is the NVML index (``DeviceInfo.nvml_index``); ``uuid``, when given,
    selects the device by UUID instead, which is robust to any index reordering.
    ``own_pids`` are the PIDs whose contexts on the GPU are ours (the current process is
    always included; add the server's with :meth:`add_own_pid`). ``gpm_interval_s`` is the
    spacing of GPM samples (> 0.1 s, see the module docstring). ``classify_pid`` replaces the
    ``/proc``-based classifier, ``clock`` the monotonic clock and ``wall_clock`` the
    wall clock of the windows (tests). Not reusable: one sampler per window.
    """

    def __init__(
        self,
        device_index: int,
        interval_s: float = 0.05,
        *,
        uuid: str | None = None,
        own_pids: Iterable[int] = (),
        proc_root: Path = Path("/proc"),
        classify_pid: Callable[[int], PidClass] | None = None,
        gpm_interval_s: float = GPM_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if gpm_interval_s <= 0:
            raise ValueError(f"gpm_interval_s must be > 0, got {gpm_interval_s!r}")
        self.gpm_interval_s = gpm_interval_s
        self.device_index = device_index
        self.interval_s = interval_s
        self._uuid = uuid
        self._pids = ProcessClassifier({os.getpid(), *own_pids}, proc_root)
        self._classify = classify_pid or self._pids.classify
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = "new"  # new -> running -> stopped
        self._pynvml: ModuleType | None = None
        self._handle: Any = None
        self._unavailable = ""
        self._t0 = 0.0
        self._log = SampleLog()
        self._windows: list[Span] = []
        self._mark: int | None = None
        self._dropped: dict[str, str] = {}
        self._errors = 0
        self._gpm_ids: dict[str, int] = {}
        self._gpm_prev: Any = None
        self._gpm_prev_t = 0.0
        self._gpm_prev_wall = 0
        self._gpm_values = 0
        self._gpm_cur: Any = None
        self._summary: TelemetrySummary | None = None

    # ------------------------------------------------------------------ public API

    def add_own_pid(self, pid: int) -> None:
        """Count ``pid`` (and its descendants) as ours, not as a foreign process."""
        self._pids.add_own_pid(pid)

    @property
    def summary(self) -> TelemetrySummary | None:
        """The summary once :meth:`stop` has run, else None."""
        return self._summary

    def start(self, *, background: bool = True) -> None:
        """Open NVML and begin sampling (in a daemon thread when ``background``; otherwise
        the caller drives :meth:`sample_once`). Never raises for NVML problems."""
        if self._state != "new":
            raise RuntimeError("TelemetrySampler.start() called twice; use one per window")
        self._state = "running"
        self._t0 = self._clock()
        self._open()
        if self._pynvml is not None and background:
            self._thread = threading.Thread(
                target=self._run, name=f"specperf-telemetry-{self.device_index}", daemon=True
            )
            self._thread.start()

    def mark_start(self) -> None:
        """Open a window now: readings from here to :meth:`mark_end` count."""
        with self._lock:
            if self._mark is not None:
                raise RuntimeError("TelemetrySampler.mark_start() while a window is open")
            self._mark = self._wall()
            if self._pynvml is not None and self._state == "running":
                self._sample_gpm(self._pynvml)  # a GPM interval starts with the window

    def mark_end(self) -> None:
        """Close the open window, taking one last reading inside it."""
        if self._mark is None:
            raise RuntimeError("TelemetrySampler.mark_end() without mark_start()")
        self.sample_once()
        with self._lock:
            assert self._mark is not None
            self._windows.append((self._mark, self._wall()))
            self._mark = None

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """``mark_start()`` ... ``mark_end()`` around the block."""
        self.mark_start()
        try:
            yield
        finally:
            self.mark_end()

    def add_windows(self, spans: Iterable[Span], *, max_gap_ns: int = STEP_GAP_NS) -> None:
        """Windows given after the fact, e.g. decode steps ``(wall_ns, wall_ns + step_ns)``;
        spans at most ``max_gap_ns`` apart are joined. Call before :meth:`stop`."""
        merged = merge_windows(spans, max_gap_ns)
        with self._lock:
            self._windows.extend(merged)

    def sample_once(self) -> None:
        """Take one sample now (the thread calls this every ``interval_s``)."""
        with self._lock:
            if self._pynvml is None or self._state != "running":
                return
            try:
                self._sample(self._pynvml)
            except Exception:  # never let the sampler take the test down
                self._errors += 1

    def stop(self) -> TelemetrySummary:
        """Stop sampling, take a last sample, close NVML and return the summary.

        Idempotent: a second call returns the same summary."""
        if self._summary is not None:
            return self._summary
        if self._state == "new":
            self._summary = TelemetrySummary.unavailable(
                "sampler was never started", self.device_index
            )
            return self._summary
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 10 * self.interval_s))
        if self._mark is not None:
            self.mark_end()
        self.sample_once()
        with self._lock:
            self._state = "stopped"
            self._close()
            self._summary = self._build_summary(self._clock() - self._t0)
        return self._summary

    def __enter__(self) -> TelemetrySampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.sample_once()

    def _code(self, name: str, default: int) -> int:
        value = getattr(self._pynvml, name, default)
        return value if isinstance(value, int) else default

    def _is_permanent(self, exc: BaseException) -> bool:
        """True for errors that will not go away within the window (drop the metric)."""
        if isinstance(exc, AttributeError):  # this nvidia-ml-py lacks the function
            return True
        code = loader.nvml_error_code(exc)
        return code in {
            self._code("NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED),
            self._code("NVML_ERROR_NO_PERMISSION", _NVML_ERROR_NO_PERMISSION),
            self._code("NVML_ERROR_FUNCTION_NOT_FOUND", _NVML_ERROR_FUNCTION_NOT_FOUND),
        }

    def _call(self, keys: tuple[str, ...], fn: Callable[[], Any]) -> Any:
        """Run one NVML query feeding ``keys``; ``_FAILED`` (and bookkeeping) on failure."""
        if all(k in self._dropped for k in keys):
            return _FAILED
        try:
            return fn()
        except Exception as exc:
            if self._is_permanent(exc):
                why = loader.nvml_error_text(exc)
                for k in keys:
                    self._dropped.setdefault(k, why)
            else:
                self._errors += 1
            return _FAILED

    def _open(self) -> None:
        imported = loader.load_pynvml()
        if imported.module is None:
            self._unavailable = imported.reason
            return
        pynvml = imported.module
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            self._unavailable = f"nvmlInit failed: {loader.nvml_error_text(exc)}"
            return
        try:
            if self._uuid:
                self._handle = loader.handle_by_uuid(pynvml, self._uuid)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:
            which = self._uuid or f"index {self.device_index}"
            self._unavailable = f"no NVML device {which}: {loader.nvml_error_text(exc)}"
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()
            return
        self._pynvml = pynvml
        self._open_gpm(pynvml)

    def _open_gpm(self, pynvml: ModuleType) -> None:
        """GPM setup: device support, two sample buffers, the first sample."""
        try:
            support = pynvml.nvmlGpmQueryDeviceSupport(self._handle)
            if not getattr(support, "isSupportedDevice", 0):
                self._drop_gpm("GPM not supported on this device (needs Hopper or newer)")
                return
            self._gpm_ids = {name: int(getattr(pynvml, const)) for name, const in _GPM_IDS.items()}
            self._gpm_prev = pynvml.nvmlGpmSampleAlloc()
            self._gpm_cur = pynvml.nvmlGpmSampleAlloc()
            pynvml.nvmlGpmSampleGet(self._handle, self._gpm_prev)
            self._gpm_prev_t = self._clock()
            self._gpm_prev_wall = self._wall()
        except Exception as exc:
            self._drop_gpm(f"GPM unavailable: {loader.nvml_error_text(exc)}")
            self._free_gpm()

    def _drop_gpm(self, why: str) -> None:
        self._dropped.setdefault(_GPM, why)
        for name in GPM_METRICS:
            self._dropped.setdefault(name, why)
        self._gpm_ids = {}

    def _free_gpm(self) -> None:
        pynvml = self._pynvml
        for sample in (self._gpm_prev, self._gpm_cur):
            if sample is not None and pynvml is not None:
                with contextlib.suppress(Exception):
                    pynvml.nvmlGpmSampleFree(sample)
        self._gpm_prev = self._gpm_cur = None

    def _close(self) -> None:
        pynvml = self._pynvml
        if pynvml is None:
            return
        self._free_gpm()
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        self._pynvml = None

    def _sample(self, nv: ModuleType) -> None:
        h = self._handle
        t = self._wall()
        log = self._log
        log.sample(t)
        rates = self._call((GPU_UTIL, MEM_UTIL), lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if rates is not _FAILED:
            log.value(GPU_UTIL, rates.gpu, t)
            log.value(MEM_UTIL, rates.memory, t)
        sm = self._call((SM_CLOCK,), lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        if sm is not _FAILED:
            log.value(SM_CLOCK, sm, t)
        mem = self._call((MEM_CLOCK,), lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        if mem is not _FAILED:
            log.value(MEM_CLOCK, mem, t)
        power_mw = self._call((POWER,), lambda: nv.nvmlDeviceGetPowerUsage(h))
        if power_mw is not _FAILED:
            log.value(POWER, power_mw / 1000.0, t)
        self._sample_reasons(nv, t)
        self._sample_processes(nv, t)
        self._sample_gpm(nv)

    def _sample_reasons(self, nv: ModuleType, t: int) -> None:
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if fn is None:
            self._dropped.setdefault(_REASONS, "not in this nvidia-ml-py")
            return
        mask = self._call((_REASONS,), lambda: fn(self._handle))
        if mask is _FAILED:
            return
        self._log.reasons(t, decode_clock_event_reasons(int(mask)))

    def _sample_processes(self, nv: ModuleType, t: int) -> None:
        procs = self._call(
            (_PROCESSES,), lambda: nv.nvmlDeviceGetComputeRunningProcesses(self._handle)
        )
        if procs is _FAILED:
            return
        foreign, unresolved = [], []
        for pid in sorted({int(p.pid) for p in procs}):
            kind = self._classify(pid)
            if kind == "foreign":
                foreign.append(pid)
            elif kind == "unresolved":
                unresolved.append(pid)
        self._log.processes(t, tuple(foreign), tuple(unresolved))

    def _sample_gpm(self, nv: ModuleType) -> None:
        if not self._gpm_ids or self._gpm_prev is None:
            return
        now = self._clock()
        if now - self._gpm_prev_t < self.gpm_interval_s:
            return  # GPM counters have not refreshed yet (see module docstring)
        if self._call((_GPM,), lambda: nv.nvmlGpmSampleGet(self._handle, self._gpm_cur)) is _FAILED:
            if _GPM in self._dropped:
                self._drop_gpm(self._dropped[_GPM])
            return
        self._gpm_prev_t = now
        t0, t1 = self._gpm_prev_wall, self._wall()
        self._gpm_prev_wall = t1
        prev, cur = self._gpm_prev, self._gpm_cur
        self._gpm_prev, self._gpm_cur = cur, prev  # the newest sample starts the next interval
        names = list(self._gpm_ids)
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(names)
        request.sample1 = prev
        request.sample2 = cur
        for i, name in enumerate(names):
            request.metrics[i].metricId = self._gpm_ids[name]
        if self._call((_GPM,), lambda: nv.nvmlGpmMetricsGet(request)) is _FAILED:
            if _GPM in self._dropped:
                self._drop_gpm(self._dropped[_GPM])
            return
        ok = self._code("NVML_SUCCESS", _NVML_SUCCESS)
        for i, name in enumerate(names):
            metric = request.metrics[i]
            ret = int(metric.nvmlReturn)
            if ret == ok:
                self._log.value(name, metric.value, t0, t1)
                self._gpm_values += 1
            elif ret in {
                self._code("NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED),
                self._code("NVML_ERROR_NO_PERMISSION", _NVML_ERROR_NO_PERMISSION),
            }:
                self._dropped.setdefault(name, f"GPM metric not supported (NVML error {ret})")
                self._gpm_ids.pop(name, None)
            else:
                self._errors += 1

    def _build_summary(self, duration_s: float) -> TelemetrySummary:
        if self._unavailable:
            return TelemetrySummary.unavailable(self._unavailable, self.device_index)
        windows = merge_windows(self._windows)
        kept = self._log.kept(windows)
        window_s = sum(b - a for a, b in windows) / 1e9
        if windows and not kept.samples and not kept.values:
            return TelemetrySummary.unavailable(
                f"no telemetry reading inside the {len(windows)} marked window(s) "
                f"({window_s:.3f} s in all; the sampling interval is {self.interval_s:g} s)",
                self.device_index,
            )
        gpm_kept = any(name in kept.values for name in self._gpm_ids)
        if self._gpm_ids and not gpm_kept and _GPM not in self._dropped:
            self._dropped[_GPM] = (
                f"no GPM interval inside the marked windows (each needs more than "
                f"{self.gpm_interval_s:.2f} s of back-to-back work)"
                if self._gpm_values
                else f"no GPM interval completed (window shorter than {self.gpm_interval_s:.2f} s)"
            )
        metrics = {m: MetricSummary.of(kept.values[m]) for m in METRICS if m in kept.values}
        if not metrics and not kept.reason_samples and not kept.process_samples:
            why = "; ".join(f"{k}: {v}" for k, v in sorted(self._dropped.items()))
            return TelemetrySummary.unavailable(
                f"no NVML metric could be read on device {self.device_index}"
                + (f" ({why})" if why else f" ({self._errors} errors)"),
                self.device_index,
            )
        return TelemetrySummary(
            available=True,
            device_index=self.device_index,
            samples=kept.samples,
            duration_s=duration_s,
            metrics=metrics,
            throttle_reasons=dict(kept.reasons),
            reason_samples=kept.reason_samples,
            foreign_pids=dict(kept.foreign),
            unresolved_pids=dict(kept.unresolved),
            process_samples=kept.process_samples,
            dropped=dict(self._dropped),
            errors=self._errors,
            windows=len(windows),
            window_s=window_s,
            outside_samples=kept.outside,
        )
