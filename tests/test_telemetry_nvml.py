"""Telemetry sampler, NVML-absent path, pynvml warning filtering and GPU identity, on CPU.

``FakePynvml`` is a test double of the ``pynvml`` module (nvidia-ml-py) injected through
``pytest_specperf.telemetry.loader.load_pynvml``; ``test_fake_matches_real_api`` checks that
every NVML name it provides exists in the real bindings, so the double cannot drift from
the API the sampler is written against.
"""

from __future__ import annotations

import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.judging.gates import invalid_reasons
from pytest_specperf.telemetry import (
    TelemetrySampler,
    TelemetrySummary,
    detect_device,
    loader,
)
from pytest_specperf.telemetry.loader import PynvmlImport, load_pynvml
from pytest_specperf.telemetry.processes import PidClass
from pytest_specperf.telemetry.summary import (
    DRAM_UTIL,
    GPU_UTIL,
    MEM_CLOCK,
    MEM_UTIL,
    POWER,
    SM_CLOCK,
    SM_UTIL,
    TENSOR_UTIL,
)

NOT_SUPPORTED = 3
NO_PERMISSION = 4
LIBRARY_NOT_FOUND = 12
NOT_FOUND = 6
UNKNOWN = 999

_ERROR_TEXT = {
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    NOT_FOUND: "Not Found",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    UNKNOWN: "Unknown Error",
}


class FakeNVMLError(Exception):
    """Like ``pynvml.NVMLError``: carries the NVML return code in ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    """One scripted device. Sequences give the value of the n-th call (last one repeats)."""

    name: str = "NVIDIA H200"
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    memory: int = 150_000_000_000
    cc: tuple[int, int] = (9, 0)
    bus_width: int = 6144
    max_mem_clock: int = 3201
    gpu_util: Sequence[int] = (90,)
    mem_util: Sequence[int] = (40,)
    sm_clock: Sequence[int] = (1980,)
    mem_clock: Sequence[int] = (3201,)
    power_mw: Sequence[int] = (500_000,)
    reasons: Sequence[int] = (0,)
    processes: Sequence[Sequence[int]] = ((),)
    gpm_supported: bool = True
    gpm: dict[int, Sequence[float]] = field(
        default_factory=lambda: {2: (70.0,), 5: (20.0,), 10: (55.0,)}
    )
    gpm_metric_unsupported: set[int] = field(default_factory=set)


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class FakeGpmMetricsGet:
    """Stand-in for ``pynvml.c_nvmlGpmMetricsGet_t``."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: object = None
        self.sample2: object = None
        self.metrics = [_GpmMetric() for _ in range(8)]


class FakePynvml(types.ModuleType):
    """Test double of the ``pynvml`` module.

    ``unsupported``: function names that raise NOT_SUPPORTED; ``failures``: function name ->
    number of calls that raise a transient UNKNOWN error first. ``calls`` counts calls.
    """

    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NO_PERMISSION
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10
    NVML_GPM_METRICS_GET_VERSION = 1
    NVMLError = FakeNVMLError
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        *,
        init_error: int | None = None,
        driver: str = "550.54.15",
        unsupported: Sequence[str] = (),
        failures: dict[str, int] | None = None,
        sample_event: tuple[int, threading.Event] | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.gpus = list(gpus) or [FakeGpu()]
        self.init_error = init_error
        self.driver = driver
        self.unsupported = set(unsupported)
        self.failures = dict(failures or {})
        self.sample_event = sample_event
        self.calls: dict[str, int] = {}
        self.inits = 0
        self.shutdowns = 0
        self.gpm_alive: set[int] = set()
        self._gpm_next = 0

    # -- helpers
    def _enter(self, fn: str) -> int:
        n = self.calls.get(fn, 0)
        self.calls[fn] = n + 1
        if fn in self.unsupported:
            raise FakeNVMLError(NOT_SUPPORTED)
        if self.failures.get(fn, 0) > 0:
            self.failures[fn] -= 1
            raise FakeNVMLError(UNKNOWN)
        return n

    @staticmethod
    def _at(values: Sequence[Any], n: int) -> Any:
        return values[min(n, len(values) - 1)]

    def _gpu(self, handle: int) -> FakeGpu:
        return self.gpus[handle]

    # -- library
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    # -- identity
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError(NOT_FOUND)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return i
        raise FakeNVMLError(NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(total=self._gpu(handle).memory)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self._gpu(handle).cc

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        self._enter("nvmlDeviceGetMemoryBusWidth")
        return self._gpu(handle).bus_width

    def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo")
        return self._gpu(handle).max_mem_clock

    # -- sampled
    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        n = self._enter("nvmlDeviceGetUtilizationRates")
        if self.sample_event is not None and n + 1 >= self.sample_event[0]:
            self.sample_event[1].set()
        gpu = self._gpu(handle)
        return types.SimpleNamespace(
            gpu=self._at(gpu.gpu_util, n), memory=self._at(gpu.mem_util, n)
        )

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        gpu = self._gpu(handle)
        if kind == self.NVML_CLOCK_SM:
            return int(self._at(gpu.sm_clock, self._enter("nvmlDeviceGetClockInfo[sm]")))
        return int(self._at(gpu.mem_clock, self._enter("nvmlDeviceGetClockInfo[mem]")))

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int(self._at(self._gpu(handle).power_mw, self._enter("nvmlDeviceGetPowerUsage")))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        n = self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        return int(self._at(self._gpu(handle).reasons, n))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        n = self._enter("nvmlDeviceGetComputeRunningProcesses")
        pids = self._at(self._gpu(handle).processes, n)
        return [types.SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in pids]

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, handle: int) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport")
        return types.SimpleNamespace(
            version=1, isSupportedDevice=int(self._gpu(handle).gpm_supported)
        )

    def nvmlGpmSampleAlloc(self) -> int:
        self._gpm_next += 1
        self.gpm_alive.add(self._gpm_next)
        return self._gpm_next

    def nvmlGpmSampleFree(self, sample: int) -> None:
        self.gpm_alive.discard(sample)

    def nvmlGpmSampleGet(self, handle: int, sample: int) -> int:
        self._enter("nvmlGpmSampleGet")
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        n = self._enter("nvmlGpmMetricsGet")
        assert request.version == self.NVML_GPM_METRICS_GET_VERSION
        assert request.sample1 is not None and request.sample2 is not None
        assert request.sample1 != request.sample2
        gpu = self.gpus[0]
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in gpu.gpm_metric_unsupported:
                metric.nvmlReturn = NOT_SUPPORTED
            else:
                metric.nvmlReturn = 0
                metric.value = float(self._at(gpu.gpm[metric.metricId], n))
        return request


def inject(monkeypatch: pytest.MonkeyPatch, fake: FakePynvml | None, reason: str = "") -> None:
    """Make every telemetry import of pynvml return ``fake`` (None: absent, with reason)."""
    monkeypatch.setattr(loader, "load_pynvml", lambda: PynvmlImport(fake, reason))


def classifier(own: set[int], foreign: set[int]) -> Callable[[int], PidClass]:
    def classify(pid: int) -> PidClass:
        if pid in own:
            return "own"
        return "foreign" if pid in foreign else "unresolved"

    return classify


class Ticker:
    """A fake monotonic clock that advances ``step`` seconds per reading."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = -step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def run_manual(sampler: TelemetrySampler, ticks: int) -> TelemetrySummary:
    """Start without a thread, take ``ticks`` samples, stop (which takes one more)."""
    sampler.start(background=False)
    for _ in range(ticks):
        sampler.sample_once()
    return sampler.stop()


# ----------------------------------------------------------------------------- absent paths


def test_pynvml_not_importable_gives_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    imported = load_pynvml()
    assert imported.module is None
    assert imported.reason.startswith("pynvml not importable")
    assert "nvidia-ml-py" in imported.reason
    summary = TelemetrySampler(0).__enter__().stop()
    assert summary.available is False
    assert summary.reason.startswith("telemetry unavailable: pynvml not importable")
    assert "\n" not in summary.reason
    assert summary.describe() == summary.reason


def test_nvml_init_failure_gives_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml(init_error=LIBRARY_NOT_FOUND)
    inject(monkeypatch, fake)
    with TelemetrySampler(0) as sampler:
        pass
    summary = sampler.summary
    assert summary is not None and not summary.available
    assert summary.reason == (
        "telemetry unavailable: nvmlInit failed: NVML Shared Library Not Found"
    )
    assert invalid_reasons(summary) == []


def test_nvml_not_permitted_gives_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, FakePynvml(init_error=NO_PERMISSION))
    summary = run_manual(TelemetrySampler(0), 2)
    assert summary.reason == "telemetry unavailable: nvmlInit failed: Insufficient Permissions"


def test_missing_device_gives_unavailable_and_shuts_nvml_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakePynvml()
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(3), 1)
    assert summary.reason == "telemetry unavailable: no NVML device index 3: Not Found"
    assert fake.inits == fake.shutdowns == 1


def test_real_environment_never_raises() -> None:
    """Whatever this machine has (here: nvidia-ml-py without an NVML library, or nothing),
    the sampler answers with a summary, never an exception."""
    with TelemetrySampler(0, interval_s=0.01) as sampler:
        pass
    summary = sampler.summary
    assert summary is not None
    if not summary.available:
        assert summary.reason.startswith("telemetry unavailable: ")


# ----------------------------------------------------------------------------- sampling


def test_utilization_clocks_power_medians(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(
        gpu_util=(10, 50, 90, 30),
        mem_util=(5, 5, 6, 7),
        sm_clock=(1980, 1980, 1755, 1980),
        mem_clock=(3201,),
        power_mw=(400_000, 600_000, 500_000, 450_000),
        gpm_supported=False,
    )
    inject(monkeypatch, FakePynvml([gpu]))
    summary = run_manual(TelemetrySampler(0), 3)
    assert summary.available and summary.reason == ""
    assert summary.samples == 4
    util = summary.metrics[GPU_UTIL]
    assert (util.median, util.min, util.max, util.n) == (40.0, 10.0, 90.0, 4)
    assert summary.median(MEM_UTIL) == 5.5
    assert summary.metrics[SM_CLOCK].min == 1755.0
    assert summary.median(MEM_CLOCK) == 3201.0
    assert summary.median(POWER) == pytest.approx(475.0)
    assert summary.throttle_reasons == {} and summary.reason_samples == 4
    assert invalid_reasons(summary) == []
    assert "GPU 40%" in summary.describe() and "throttling: none" in summary.describe()


def test_throttle_reasons_decoded_benign_vs_real(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(reasons=(0x1, 0x4 | 0x40, 0x40, 0x2), gpm_supported=False)
    inject(monkeypatch, FakePynvml([gpu]))
    summary = run_manual(TelemetrySampler(0), 3)
    assert summary.throttle_reasons == {
        "gpu_idle": 1,
        "sw_power_cap": 1,
        "hw_thermal_slowdown": 2,
        "applications_clocks_setting": 1,
    }
    assert summary.throttling == {"sw_power_cap": 1, "hw_thermal_slowdown": 2}
    reasons = invalid_reasons(summary)
    assert reasons == [
        "clocks throttled during the measurement: hw_thermal_slowdown in 2 of 4 samples, "
        "sw_power_cap in 1 of 4 samples"
    ]


def test_benign_reasons_only_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, FakePynvml([FakeGpu(reasons=(0x1, 0x2, 0x100), gpm_supported=False)]))
    summary = run_manual(TelemetrySampler(0), 2)
    assert summary.throttling == {}
    assert invalid_reasons(summary) == []


def test_deprecated_throttle_reason_function_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml([FakeGpu(gpm_supported=False)])
    fake.nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment,method-assign]
    fake.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: 0x8  # type: ignore[attr-defined]
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0), 1)
    assert summary.throttling == {"hw_slowdown": 2}


def test_foreign_and_unresolved_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    me, server, other, hidden = os.getpid(), 5000, 4242, 777
    gpu = FakeGpu(
        processes=((me, server), (me, server, other), (server, other, hidden)),
        gpm_supported=False,
    )
    inject(monkeypatch, FakePynvml([gpu]))
    sampler = TelemetrySampler(0, classify_pid=classifier({me, server}, {other}))
    summary = run_manual(sampler, 2)
    assert summary.process_samples == 3
    assert summary.foreign_pids == {other: 2}
    assert summary.unresolved_pids == {hidden: 1}
    assert invalid_reasons(summary) == [
        "another process on the GPU during the measurement: pid 4242 in 2 of 3 samples"
    ]
    strict = invalid_reasons(summary, include_unresolved=True)
    assert strict == [
        "another process on the GPU during the measurement: pid 777 in 1 of 3 samples, "
        "pid 4242 in 2 of 3 samples"
    ]
    assert "other processes on the GPU: 4242" in summary.describe()


def test_own_pids_and_children_are_not_foreign(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default classifier walks PPid in /proc: the server's child is ours."""
    for pid, ppid in ((5000, 1), (5001, 5000), (6000, 1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nPPid:\t{ppid}\n")
    gpu = FakeGpu(processes=((5000, 5001, 6000, 7000),), gpm_supported=False)
    inject(monkeypatch, FakePynvml([gpu]))
    sampler = TelemetrySampler(0, proc_root=tmp_path)
    sampler.add_own_pid(5000)
    summary = run_manual(sampler, 0)
    assert summary.foreign_pids == {6000: 1}
    assert summary.unresolved_pids == {7000: 1}


def test_gpm_metrics_from_consecutive_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(gpm={2: (60.0, 80.0, 70.0), 5: (0.0, 2.0, 1.0), 10: (2.0, 3.0, 1.0)})
    fake = FakePynvml([gpu])
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0, clock=Ticker(0.2)), 2)
    assert summary.median(SM_UTIL) == 70.0
    assert summary.median(TENSOR_UTIL) == 1.0
    assert summary.median(DRAM_UTIL) == 2.0
    assert summary.metrics[SM_UTIL].n == 3
    # one GPM sample at start, one per tick: 1 + 3
    assert fake.calls["nvmlGpmSampleGet"] == 4
    assert fake.gpm_alive == set()  # both sample buffers freed at stop
    assert "gpm" not in summary.dropped
    assert summary.utilization()[DRAM_UTIL] == 2.0


def test_gpm_samples_are_spaced_beyond_the_refresh_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML wants > 100 ms between the two GPM samples: closer samples are skipped."""
    fake = FakePynvml([FakeGpu()])
    inject(monkeypatch, fake)
    # clock readings: start 0.0, first GPM sample 0.05, ticks 0.10 0.15 0.20, stop 0.25
    summary = run_manual(TelemetrySampler(0, clock=Ticker(0.05)), 3)
    assert summary.samples == 4
    assert summary.metrics[SM_UTIL].n == 1  # only 0.05 -> 0.20 is long enough
    assert fake.calls["nvmlGpmSampleGet"] == 2


def test_gpm_window_too_short_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, FakePynvml([FakeGpu()]))
    summary = run_manual(TelemetrySampler(0, clock=Ticker(0.001)), 2)
    assert summary.available and SM_UTIL not in summary.metrics
    assert summary.dropped["gpm"] == "no GPM interval completed (window shorter than 0.11 s)"


def test_gpm_unsupported_device_drops_gpm_only(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml([FakeGpu(gpm_supported=False)])
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0), 2)
    assert summary.available
    for name in (SM_UTIL, TENSOR_UTIL, DRAM_UTIL):
        assert name not in summary.metrics
        assert "GPM not supported" in summary.dropped[name]
    assert GPU_UTIL in summary.metrics
    assert "nvmlGpmSampleGet" not in fake.calls


def test_gpm_query_not_supported_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml(unsupported=["nvmlGpmQueryDeviceSupport"])
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0), 1)
    assert summary.dropped["gpm"] == "GPM unavailable: Not Supported"
    assert SM_UTIL not in summary.metrics and GPU_UTIL in summary.metrics


def test_gpm_single_metric_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml([FakeGpu(gpm_metric_unsupported={5})])
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0, clock=Ticker(0.2)), 2)
    assert TENSOR_UTIL not in summary.metrics
    assert TENSOR_UTIL in summary.dropped
    assert summary.median(SM_UTIL) == 70.0 and summary.median(DRAM_UTIL) == 55.0


def test_not_supported_metric_is_dropped_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml([FakeGpu(gpm_supported=False)], unsupported=["nvmlDeviceGetPowerUsage"])
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0), 4)
    assert POWER not in summary.metrics
    assert summary.dropped[POWER] == "Not Supported"
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert summary.metrics[GPU_UTIL].n == 5
    assert summary.errors == 0


def test_transient_error_skips_one_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePynvml([FakeGpu(gpm_supported=False)], failures={"nvmlDeviceGetClockInfo[sm]": 1})
    inject(monkeypatch, fake)
    summary = run_manual(TelemetrySampler(0), 2)
    assert summary.errors == 1
    assert summary.metrics[SM_CLOCK].n == 2
    assert SM_CLOCK not in summary.dropped


def test_nothing_supported_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    everything = [
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetClockInfo[sm]",
        "nvmlDeviceGetClockInfo[mem]",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlGpmQueryDeviceSupport",
    ]
    inject(monkeypatch, FakePynvml(unsupported=everything))
    summary = run_manual(TelemetrySampler(0), 1)
    assert not summary.available
    assert summary.reason.startswith(
        "telemetry unavailable: no NVML metric could be read on device 0"
    )
    assert "\n" not in summary.reason


def test_select_device_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeGpu(uuid="GPU-a", gpu_util=(11,)), FakeGpu(uuid="GPU-b", gpu_util=(77,))]
    inject(monkeypatch, FakePynvml(gpus))
    summary = run_manual(TelemetrySampler(0, uuid="GPU-b"), 0)
    assert summary.median(GPU_UTIL) == 77.0


class OldUuidPynvml(FakePynvml):
    """Like nvidia-ml-py before it encoded strings: ``c_char_p(uuid)`` refuses a ``str``."""

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> int:  # type: ignore[override]
        if isinstance(uuid, str):
            raise TypeError("bytes or integer address expected instead of str instance")
        return super().nvmlDeviceGetHandleByUUID(uuid.decode())


def test_select_device_by_uuid_with_bindings_that_want_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus = [FakeGpu(uuid="GPU-a", gpu_util=(11,)), FakeGpu(uuid="GPU-b", gpu_util=(77,))]
    inject(monkeypatch, OldUuidPynvml(gpus))
    summary = run_manual(TelemetrySampler(0, uuid="GPU-b"), 0)
    assert summary.available and summary.median(GPU_UTIL) == 77.0
    missing = run_manual(TelemetrySampler(0, uuid="GPU-zz"), 0)
    assert missing.reason == "telemetry unavailable: no NVML device GPU-zz: Not Found"


# ----------------------------------------------------------------------------- windows


class FakeTime:
    """One fake time source for the sampler's monotonic clock and its wall clock."""

    def __init__(self) -> None:
        self.ms = 0

    def mono(self) -> float:
        return self.ms / 1e3

    def wall(self) -> int:
        return self.ms * 1_000_000


INSIDE_SAMPLES = 22  # 0.25 s .. 1.25 s every 50 ms, plus the one at mark_end


def _decode_window_gpu() -> FakeGpu:
    """Readings that differ inside the decode window (95 %, DRAM 60 %) and outside it
    (5 %, DRAM 2 %), in the order the script below takes them."""
    return FakeGpu(
        gpu_util=(5,) * 2 + (95,) * INSIDE_SAMPLES + (5,) * 3,
        sm_clock=(1000,) * 2 + (1980,) * INSIDE_SAMPLES + (1000,) * 3,
        reasons=(0x1,) * 2 + (0,) * INSIDE_SAMPLES + (0x1,) * 3,
        gpm={2: (1.0,) + (70.0,) * 7 + (1.0,) * 2, 5: (0.0,) * 10,
             10: (2.0,) + (60.0,) * 7 + (2.0,) * 2},
    )


def _summary_around_a_window(monkeypatch: pytest.MonkeyPatch, *, marks: bool) -> TelemetrySummary:
    """The summary of samples every 50 ms of :func:`_decode_window_gpu`; a window from 0.2 s
    to 1.3 s (marked), or 0.25 s to 1.25 s given afterwards as two step spans 2 ms apart."""
    inject(monkeypatch, FakePynvml([_decode_window_gpu()]))
    t = FakeTime()
    sampler = TelemetrySampler(0, clock=t.mono, wall_clock=t.wall)
    sampler.start(background=False)
    for t.ms in (50, 100):
        sampler.sample_once()
    t.ms = 200
    if marks:
        sampler.mark_start()
    else:
        sampler.sample_once()  # stands for the GPM sample mark_start takes
    for t.ms in range(250, 1300, 50):
        sampler.sample_once()
    t.ms = 1300
    if marks:
        sampler.mark_end()
    else:
        sampler.sample_once()
        sampler.add_windows([(250_000_000, 700_000_000), (702_000_000, 1_250_000_000)])
    for t.ms in (1400, 1500):
        sampler.sample_once()
    t.ms = 1600
    return sampler.stop()


def test_marked_window_keeps_only_readings_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    summary = _summary_around_a_window(monkeypatch, marks=True)
    assert summary.available and summary.windows == 1
    assert summary.window_s == pytest.approx(1.1)
    assert summary.samples == INSIDE_SAMPLES and summary.outside_samples == 5
    util = summary.metrics[GPU_UTIL]
    assert (util.min, util.max, util.n) == (95.0, 95.0, INSIDE_SAMPLES)
    assert summary.metrics[SM_CLOCK].min == 1980.0
    dram = summary.metrics[DRAM_UTIL]  # GPM intervals inside the window only
    assert (dram.min, dram.max) == (60.0, 60.0) and dram.n == 7
    assert summary.median(SM_UTIL) == 70.0
    assert summary.throttle_reasons == {} and summary.reason_samples == INSIDE_SAMPLES
    assert "in 1 window(s) of 1.1 s" in summary.describe()
    assert summary.to_dict()["outside_samples"] == 5


def test_windows_from_decode_steps_are_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step spans given after the fact (2 ms apart: one window) restrict the same way."""
    summary = _summary_around_a_window(monkeypatch, marks=False)
    assert summary.windows == 1 and summary.window_s == pytest.approx(1.0)
    util = summary.metrics[GPU_UTIL]
    assert (util.min, util.n) == (95.0, INSIDE_SAMPLES - 1)
    dram = summary.metrics[DRAM_UTIL]  # [0.2 s, 0.35 s] is only two thirds inside
    assert (dram.min, dram.max, dram.n) == (60.0, 60.0, 6)


def test_without_windows_every_reading_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above can fail: unrestricted, the outside readings dilute the figures."""
    inject(monkeypatch, FakePynvml([_decode_window_gpu()]))
    t = FakeTime()
    sampler = TelemetrySampler(0, clock=t.mono, wall_clock=t.wall)
    sampler.start(background=False)
    for t.ms in range(50, 1550, 50):
        sampler.sample_once()
    summary = sampler.stop()
    assert summary.windows == 0 and summary.metrics[GPU_UTIL].min == 5.0
    assert summary.metrics[DRAM_UTIL].min == 2.0
    assert summary.throttle_reasons["gpu_idle"] >= 5


def test_window_with_no_reading_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, FakePynvml([FakeGpu()]))
    t = FakeTime()
    sampler = TelemetrySampler(0, clock=t.mono, wall_clock=t.wall)
    sampler.start(background=False)
    sampler.add_windows([(5_000_000_000, 6_000_000_000)])
    summary = sampler.stop()
    assert summary.reason == (
        "telemetry unavailable: no telemetry reading inside the 1 marked window(s) "
        "(1.000 s in all; the sampling interval is 0.05 s)"
    )


def test_window_marks_misuse_is_refused() -> None:
    sampler = TelemetrySampler(0)
    with pytest.raises(RuntimeError, match="without mark_start"):
        sampler.mark_end()
    sampler.mark_start()
    with pytest.raises(RuntimeError, match="while a window is open"):
        sampler.mark_start()
    with pytest.raises(ValueError, match="window ends before it starts"):
        sampler.add_windows([(10, 5)])


def test_background_thread_samples_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon thread samples on its own; no timing assertion, only 'it sampled'."""
    enough = threading.Event()
    fake = FakePynvml([FakeGpu()], sample_event=(3, enough))
    inject(monkeypatch, fake)
    with TelemetrySampler(0, interval_s=0.001) as sampler:
        assert enough.wait(timeout=30), "sampler thread took no samples"
    summary = sampler.summary
    assert summary is not None and summary.available
    assert summary.samples >= 3
    assert fake.inits == fake.shutdowns == 1
    assert fake.gpm_alive == set()
    assert sampler.stop() is summary  # idempotent


def test_lifecycle_errors() -> None:
    sampler = TelemetrySampler(0)
    assert sampler.stop().reason == "telemetry unavailable: sampler was never started"
    started = TelemetrySampler(0)
    started.start(background=False)
    with pytest.raises(RuntimeError, match="twice"):
        started.start()
    started.stop()
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler(0, interval_s=0)
    with pytest.raises(ValueError, match="gpm_interval_s"):
        TelemetrySampler(0, gpm_interval_s=-1)


def test_summary_to_dict_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(processes=((4242,),), gpm_supported=False)
    inject(monkeypatch, FakePynvml([gpu]))
    summary = run_manual(TelemetrySampler(0, classify_pid=classifier(set(), {4242})), 0)
    data = summary.to_dict()
    assert data["foreign_pids"] == {"4242": 1}
    assert data["metrics"][GPU_UTIL] == {"median": 90.0, "min": 90.0, "max": 90.0, "n": 1}
    assert TelemetrySummary.unavailable("x\ny").reason == "telemetry unavailable: x y"


# ----------------------------------------------------------------------------- warnings


def _write_module(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(body)


def test_pynvml_shim_future_warning_is_silenced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _write_module(
        tmp_path,
        "pynvml",
        "import warnings\n"
        "warnings.warn('The pynvml package is deprecated. Please install nvidia-ml-py "
        "instead.', FutureWarning, stacklevel=2)\n"
        "FAKE = True\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    # Control: imported plainly under -W error, this module fails.
    del sys.modules["pynvml"]
    with warnings.catch_warnings(), pytest.raises(FutureWarning):
        warnings.simplefilter("error")
        __import__("pynvml")
    sys.modules.pop("pynvml", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        imported = load_pynvml()
        assert imported.module is not None, imported.reason
        assert imported.module.FAKE is True
        # The filter was scoped to the import: other FutureWarnings still raise.
        with pytest.raises(FutureWarning):
            warnings.warn("something else", FutureWarning, stacklevel=1)


def test_torch_import_ignores_only_the_pynvml_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _write_module(
        tmp_path,
        "torch",
        "import warnings\n"
        "warnings.warn('The pynvml package is deprecated. Please install nvidia-ml-py "
        "instead.', FutureWarning, stacklevel=2)\n"
        "FAKE_TORCH = True\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)
    del sys.modules["torch"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch = loader.import_torch()
    assert torch is not None and torch.FAKE_TORCH is True


# ----------------------------------------------------------------------------- device identity


class _FakeCuda:
    def __init__(self, gpus: Sequence[FakeGpu], available: bool = True) -> None:
        self._gpus = list(gpus)
        self._available = available

    def is_available(self) -> bool:
        return self._available

    def device_count(self) -> int:
        return len(self._gpus) if self._available else 0

    def current_device(self) -> int:
        return 0

    def get_device_name(self, index: int) -> str:
        return self._gpus[index].name

    def get_device_properties(self, index: int) -> Any:
        gpu = self._gpus[index]
        return types.SimpleNamespace(
            name=gpu.name,
            total_memory=gpu.memory,
            major=gpu.cc[0],
            minor=gpu.cc[1],
            uuid=gpu.uuid.removeprefix("GPU-"),  # torch reports it bare
        )


def _fake_torch(gpus: Sequence[FakeGpu], available: bool = True) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.cuda = _FakeCuda(gpus, available)  # type: ignore[attr-defined]
    return torch


@pytest.fixture
def gpu_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's device node present, whatever this machine has: torch and NVML are asked."""
    from pytest_specperf.telemetry import device

    monkeypatch.setattr(device, "gpu_device_nodes", lambda: ["/dev/nvidiactl"])


@pytest.mark.usefixtures("gpu_nodes")
def test_detect_device_matches_nvml_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    a = FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000")
    b = FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000")
    monkeypatch.setattr(loader, "import_torch", lambda: _fake_torch([b, a]))  # CUDA order
    inject(monkeypatch, FakePynvml([a, b]))  # NVML (PCI) order differs
    info = detect_device()
    assert info.kind == "cuda" and info.is_cuda
    assert info.name == "NVIDIA H200"
    assert info.slug == "2x-nvidia-h200" and info.count == 2
    assert info.cuda_index == 0 and info.nvml_index == 1
    assert info.uuid == b.uuid
    assert info.driver == "550.54.15"
    assert info.compute_capability == "9.0"
    assert info.memory_bytes == 150_000_000_000
    assert info.cpu_cores >= 1 and info.cpu_model
    assert info.to_dict()["slug"] == "2x-nvidia-h200"


@pytest.mark.usefixtures("gpu_nodes")
def test_detect_device_without_nvml_still_names_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", cc=(12, 0))
    monkeypatch.setattr(loader, "import_torch", lambda: _fake_torch([gpu]))
    inject(monkeypatch, None, "pynvml not importable (No module named 'pynvml')")
    info = detect_device()
    assert info.slug == "nvidia-rtx-pro-6000-blackwell-workstation-edition"
    assert info.driver is None and info.nvml_index is None
    assert info.uuid == gpu.uuid
    assert any(n.startswith("NVML unavailable: pynvml not importable") for n in info.notes)


@pytest.mark.usefixtures("gpu_nodes")
def test_detect_device_nvml_only_honours_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loader, "import_torch", lambda: None)
    gpus = [
        FakeGpu(name="NVIDIA L40S", uuid="GPU-0"),
        FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-1"),
    ]
    inject(monkeypatch, FakePynvml(gpus))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    info = detect_device()
    assert info.kind == "cuda"
    assert info.name == "NVIDIA H100 80GB HBM3" and info.nvml_index == 1
    assert info.slug == "nvidia-h100-80gb-hbm3" and info.count == 1


@pytest.mark.usefixtures("gpu_nodes")
def test_detect_device_cpu_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "import_torch", lambda: _fake_torch([], available=False))
    info = detect_device()
    assert info.kind == "cpu" and not info.is_cuda
    assert info.slug.startswith("cpu-") and info.slug.endswith(f"-{info.cpu_cores}c")
    assert info.memory_bytes is None and info.driver is None
    assert "torch reports no CUDA device" in info.notes
    assert detect_device(prefer_cuda=False).kind == "cpu"


def test_without_a_gpu_device_node_torch_is_not_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_specperf.telemetry import device

    def no_import() -> None:
        raise AssertionError("torch imported on a host without a GPU device node")

    monkeypatch.setattr(device, "gpu_device_nodes", lambda: [])
    monkeypatch.setattr(loader, "import_torch", no_import)
    inject(monkeypatch, FakePynvml([FakeGpu()]))  # never asked either
    info = detect_device()
    assert info.kind == "cpu" and info.slug.startswith("cpu-")
    assert any(n.startswith("no GPU device node or driver (/dev/nvidia*")
               and n.endswith("not asked")
               for n in info.notes)  # fmt: skip
    # off Linux the absence of nodes proves nothing: torch is asked
    monkeypatch.setattr(device, "gpu_device_nodes", lambda: None)
    monkeypatch.setattr(loader, "import_torch", lambda: _fake_torch([FakeGpu()]))
    assert detect_device().kind == "cuda"


def test_gpu_device_nodes_are_read_from_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specperf.telemetry import device

    seen = {"/dev/nvidia*": ["/dev/nvidia0", "/dev/nvidiactl"], "/dev/kfd": ["/dev/kfd"]}
    monkeypatch.setattr(device.glob, "glob", lambda pattern: seen.get(pattern, []))
    monkeypatch.setattr(device.sys, "platform", "linux")
    assert device.gpu_device_nodes() == ["/dev/kfd", "/dev/nvidia0", "/dev/nvidiactl"]
    monkeypatch.setattr(device.sys, "platform", "darwin")
    assert device.gpu_device_nodes() is None
    # the NVIDIA driver loaded, its nodes not made yet (made by CUDA's first start)
    seen = {"/sys/module/nvidia": ["/sys/module/nvidia"]}
    monkeypatch.setattr(device.sys, "platform", "linux")
    assert device.gpu_device_nodes() == ["/sys/module/nvidia"]
    # a /dev that cannot be listed proves nothing
    monkeypatch.setattr(device.os, "access", lambda path, mode: False)
    assert device.gpu_device_nodes() is None


@pytest.mark.usefixtures("gpu_nodes")
def test_detect_device_override_slug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "import_torch", lambda: None)
    inject(monkeypatch, None, "absent")
    assert detect_device(override_slug="my-box_1.2").slug == "my-box_1.2"
    with pytest.raises(ValueError, match=r"'\.\./x'"):
        detect_device(override_slug="../x")


# ----------------------------------------------------------------------------- API drift guard


def test_fake_matches_real_api() -> None:
    real = load_pynvml().module
    if real is None:
        pytest.skip("nvidia-ml-py not installed")
    names = [
        n for n in dir(FakePynvml) if n.startswith(("nvml", "NVML_", "c_nvml")) or n == "NVMLError"
    ]
    missing = [n for n in names if not hasattr(real, n)]
    assert missing == []
    for name in (
        "NVML_GPM_METRIC_SM_UTIL",
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        "NVML_GPM_METRIC_DRAM_BW_UTIL",
        "NVML_CLOCK_SM",
        "NVML_CLOCK_MEM",
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_NO_PERMISSION",
    ):
        assert getattr(real, name) == getattr(FakePynvml, name), name
    assert real.NVMLError(NOT_SUPPORTED).value == NOT_SUPPORTED
    assert str(real.NVMLError(LIBRARY_NOT_FOUND)) == _ERROR_TEXT[LIBRARY_NOT_FOUND]
