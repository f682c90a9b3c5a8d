"""Clock-event decoding, peak bandwidth, process classification and NVTX ranges."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from pytest_specperf.telemetry import (
    BENIGN_REASONS,
    THROTTLING_REASONS,
    NvtxRanges,
    bandwidth_from_bus,
    decode_clock_event_reasons,
    is_throttling,
    known_peak_bandwidth,
    load_pynvml,
    loader,
    nvtx_range,
    peak_bandwidth,
)
from pytest_specperf.telemetry.clocks import CLOCK_EVENT_REASONS
from pytest_specperf.telemetry.loader import PynvmlImport
from pytest_specperf.telemetry.processes import ProcessClassifier, parent_pid

# ----------------------------------------------------------------------------- clocks


def test_decode_clock_event_reasons() -> None:
    assert decode_clock_event_reasons(0) == ()
    assert decode_clock_event_reasons(0x1 | 0x40 | 0x1000) == (
        "gpu_idle",
        "hw_thermal_slowdown",
        "unknown_0x1000",
    )
    assert is_throttling("sw_power_cap") and is_throttling("sync_boost")
    assert not is_throttling("gpu_idle") and not is_throttling("applications_clocks_setting")
    assert not is_throttling("unknown_0x1000")
    assert BENIGN_REASONS.isdisjoint(THROTTLING_REASONS)


def test_reason_bits_match_nvidia_ml_py() -> None:
    real = load_pynvml().module
    if real is None:
        pytest.skip("nvidia-ml-py not installed")
    camel = {
        "gpu_idle": "GpuIdle",
        "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
        "board_limit": "BoardLimit",
        "reliability": "Reliability",
    }
    for bit, name, _ in CLOCK_EVENT_REASONS:
        value = getattr(real, f"nvmlClocksEventReason{camel[name]}", None)
        if value is None:
            value = getattr(real, f"nvmlClocksThrottleReason{camel[name]}")
        assert value == bit, name


# ----------------------------------------------------------------------------- bandwidth


def test_bandwidth_from_bus_ddr_factor() -> None:
    assert bandwidth_from_bus(5120, 2619) == pytest.approx(3.35e12, rel=0.01)  # H100 SXM
    assert bandwidth_from_bus(384, 9001) == pytest.approx(864e9, rel=0.01)  # L40S GDDR6
    assert bandwidth_from_bus(512, 14001) == pytest.approx(1.792e12, rel=0.01)  # GDDR7
    with pytest.raises(ValueError):
        bandwidth_from_bus(0, 1000)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA H200 NVL", 4.8e12),
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA H100 NVL", 3.9e12),
        ("NVIDIA B200", 8.0e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA A100 80GB PCIe", 1.935e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("NVIDIA L40S", 864e9),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1.792e12),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 1.792e12),
        ("NVIDIA GeForce GTX 1080", None),
        ("AMD EPYC", None),
    ],
)
def test_known_peak_bandwidth(name: str, expected: float | None) -> None:
    assert known_peak_bandwidth(name) == expected


class _BandwidthNvml(types.ModuleType):
    NVML_CLOCK_MEM = 2

    def __init__(self, bus: int) -> None:
        super().__init__("pynvml")
        self.bus = bus
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return self.bus

    def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
        assert kind == self.NVML_CLOCK_MEM
        return 3201


def test_peak_bandwidth_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _BandwidthNvml(6144)
    monkeypatch.setattr(loader, "load_pynvml", lambda: PynvmlImport(fake, ""))
    nvml = peak_bandwidth("NVIDIA H200", 0)
    assert nvml is not None and nvml.source == "nvml"
    assert nvml.bytes_per_s == pytest.approx(3201e6 * 2 * 6144 / 8)
    assert "6144-bit" in nvml.describe() and fake.shutdowns == 1
    # NVML answers nonsense (bus width 0): fall back to the table
    monkeypatch.setattr(loader, "load_pynvml", lambda: PynvmlImport(_BandwidthNvml(0), ""))
    table = peak_bandwidth("NVIDIA H200", 0)
    assert table is not None and (table.source, table.bytes_per_s) == ("table", 4.8e12)
    # NVML absent
    monkeypatch.setattr(loader, "load_pynvml", lambda: PynvmlImport(None, "absent"))
    absent = peak_bandwidth("NVIDIA L40S", 0)
    assert absent is not None and absent.source == "table"
    assert peak_bandwidth("Some Future GPU", 0) is None
    assert peak_bandwidth("NVIDIA B200") == peak_bandwidth("NVIDIA B200", None)


# ----------------------------------------------------------------------------- processes


def test_process_classifier(tmp_path: Path) -> None:
    for pid, ppid in ((100, 1), (200, 100), (300, 200), (400, 1)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tp\nPPid:\t{ppid}\n")
    assert parent_pid(300, tmp_path) == 200
    assert parent_pid(999, tmp_path) is None
    pids = ProcessClassifier({100}, tmp_path)
    assert [pids.classify(p) for p in (100, 200, 300, 400, 999)] == [
        "own",
        "own",
        "own",
        "foreign",
        "unresolved",
    ]
    pids.add_own_pid(400)
    assert pids.classify(400) == "own" and 400 in pids.own_pids


# ----------------------------------------------------------------------------- NVTX


def test_nvtx_is_a_noop_without_cuda() -> None:
    with nvtx_range("verify"):
        pass
    with nvtx_range("verify", enabled=False):
        pass
    ranges = NvtxRanges(enabled=False)
    assert not ranges.active
    assert ranges.range("a") is ranges.range("b")  # shared no-op, no allocation
    with ranges.range("verify"):
        pass


def _cuda_torch(log: list[str]) -> types.ModuleType:
    nvtx = types.ModuleType("torch.cuda.nvtx")
    nvtx.range_push = lambda name: log.append(f"push {name}")  # type: ignore[attr-defined]
    nvtx.range_pop = lambda: log.append("pop")  # type: ignore[attr-defined]
    cuda = types.SimpleNamespace(is_available=lambda: True, nvtx=nvtx)
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


def test_nvtx_ranges_push_and_pop_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    monkeypatch.setitem(sys.modules, "torch", _cuda_torch(log))
    with nvtx_range("draft"):
        log.append("body")
    ranges = NvtxRanges()
    assert ranges.active
    with pytest.raises(RuntimeError), ranges.range("verify"):
        raise RuntimeError("boom")
    assert log == ["push draft", "body", "pop", "push verify", "pop"]
