"""Peak DRAM bandwidth of a GPU, to judge how close the verify phase gets to the roof.

Order of sources (:func:`peak_bandwidth`):

1. NVML: ``nvmlDeviceGetMemoryBusWidth`` (bits) and ``nvmlDeviceGetMaxClockInfo(...,
   NVML_CLOCK_MEM)`` (MHz). NVML reports the memory clock such that the data rate per pin
   is **twice** that clock for every memory type NVIDIA ships (HBM2/2e/3/3e and
   GDDR6/6X/7 alike: the DDR factor), so

       peak bytes/s = max_mem_clock_MHz * 1e6 * 2 * bus_width_bits / 8

   Worked examples with the max memory clocks nvidia-smi shows for these parts: H100 SXM
   2619 MHz x 5120 bit -> 3.35 TB/s; A100 80GB SXM 1593 MHz x 5120 bit -> 2.04 TB/s; L40S
   (GDDR6, 18 Gbps) 9001 MHz x 384 bit -> 864 GB/s; GDDR7 at 28 Gbps 14001 MHz x 512 bit ->
   1.79 TB/s. Each matches the data-sheet figure in the table below to within a few %.
2. A table of known GPUs (:data:`KNOWN_PEAK_BANDWIDTH`), matched on the model name, from
   the vendor's data sheets (figures as marketed, decimal units).
3. Otherwise ``None``: callers then say "peak unknown" rather than guess.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pytest_specperf.telemetry import loader
from pytest_specperf.telemetry.device import nvml_session

#: DDR factor between NVML's reported memory clock and the per-pin data rate.
DDR_FACTOR: Final = 2

# (regex on the lowercased model name, bytes/s). First match wins, specific before general.
# Sources (NVIDIA data sheets / product pages):
#   H200 SXM and H200 NVL: 4.8 TB/s (H200 product page / data sheet)
#   H100 SXM5 80GB HBM3: 3.35 TB/s; H100 PCIe 80GB: 2.0 TB/s (H100 data sheet,
#     product brief PB-11133-001 "greater than 2,000 GBps"); H100 NVL: 3.9 TB/s
#   B200 (HGX/DGX B200): 8 TB/s (DGX B200 data sheet: 64 TB/s for 8 GPUs)
#   A100 80GB SXM4: 2,039 GB/s; A100 80GB PCIe: 1,935 GB/s; A100 40GB: 1,555 GB/s
#     (A100 data sheet nvidia-a100-datasheet-us-nvidia-1758950-r4)
#   L40S: 864 GB/s (L40S data sheet)
#   RTX PRO 6000 Blackwell (Workstation, Max-Q, Server): 1,792 GB/s, 512-bit GDDR7 at
#     28 Gbps (RTX PRO 6000 Blackwell data sheet)
KNOWN_PEAK_BANDWIDTH: Final[tuple[tuple[str, float], ...]] = (
    (r"\bh200\b", 4.8e12),
    (r"\bh100\b.*\bnvl\b", 3.9e12),
    (r"\bh100\b.*\bpcie\b", 2.0e12),
    (r"\bh100\b", 3.35e12),
    (r"\bb200\b", 8.0e12),
    (r"\ba100\b.*\b80gb\b.*\bpcie\b", 1.935e12),
    (r"\ba100\b.*\b80gb\b", 2.039e12),
    (r"\ba100\b", 1.555e12),
    (r"\bl40s\b", 864e9),
    (r"\brtx pro 6000 blackwell\b", 1.792e12),
)

BandwidthSource = Literal["nvml", "table"]


@dataclass(frozen=True)
class PeakBandwidth:
    """A device's theoretical peak DRAM bandwidth and where the figure came from."""

    bytes_per_s: float
    source: BandwidthSource
    detail: str

    def describe(self) -> str:
        return f"{self.bytes_per_s / 1e12:.2f} TB/s ({self.source}: {self.detail})"


def bandwidth_from_bus(bus_width_bits: int, max_mem_clock_mhz: float) -> float:
    """Peak bytes/s from bus width and NVML's max memory clock (see module docstring)."""
    if bus_width_bits <= 0 or max_mem_clock_mhz <= 0:
        raise ValueError(
            f"bus width and memory clock must be positive, got {bus_width_bits} bit, "
            f"{max_mem_clock_mhz} MHz"
        )
    return max_mem_clock_mhz * 1e6 * DDR_FACTOR * bus_width_bits / 8


def known_peak_bandwidth(name: str) -> float | None:
    """Table figure (bytes/s) for a GPU model name such as ``"NVIDIA H200"``, else None."""
    text = " ".join(re.sub(r"[^a-z0-9]+", " ", name.lower()).split())
    for pattern, value in KNOWN_PEAK_BANDWIDTH:
        if re.search(pattern, text):
            return value
    return None


def nvml_peak_bandwidth(nvml_index: int) -> PeakBandwidth | None:
    """Peak from NVML bus width and max memory clock of device ``nvml_index``; None when
    NVML, the device or either query is unavailable."""
    imported = loader.load_pynvml()
    if imported.module is None:
        return None
    pynvml = imported.module
    with nvml_session(pynvml) as failure:
        if failure:
            return None
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
            bus = int(pynvml.nvmlDeviceGetMemoryBusWidth(handle))
            clock = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM))
            value = bandwidth_from_bus(bus, clock)
        except Exception:
            return None
    return PeakBandwidth(value, "nvml", f"{bus}-bit bus, {clock:.0f} MHz max memory clock, x2")


def peak_bandwidth(name: str, nvml_index: int | None = None) -> PeakBandwidth | None:
    """Peak DRAM bandwidth of a GPU: NVML first (when ``nvml_index`` is given), then the
    table of known GPUs by ``name``, else None."""
    if nvml_index is not None:
        measured = nvml_peak_bandwidth(nvml_index)
        if measured is not None:
            return measured
    value = known_peak_bandwidth(name)
    if value is None:
        return None
    return PeakBandwidth(value, "table", f"known figure for {name}")


# -- KV bytes a verify really moves ------------------------------------------------------

#: Passes over gathered KV: the gather reads the pages, writes a contiguous copy, and
#: attention reads the copy again.
GATHER_PASSES: Final = 3


def padded_pages(pages: int, minimum: int, linear_step: int) -> int:
    """``pages`` rounded up to a bucket: ``minimum`` doubled up to ``linear_step``, then
    multiples of ``linear_step`` (the reference engine's CUDA-graph page buckets)."""
    b = minimum
    while b < pages and b < linear_step:
        b *= 2
    if b >= pages:
        return b
    return -(-pages // linear_step) * linear_step


def kv_read_bytes(
    traffic: Mapping[str, Any], context_len: int, batch_size: int, gathered_share: float
) -> float | None:
    """KV bytes one verify forward moves, from a server's ``kv_read`` description.

    ``traffic`` (the reference engine's ``/server_info["kv_read"]``): ``bytes_per_token``
    (K and V over the target's layers), ``page_size``, ``gather_passes`` and, when the
    verify runs as a CUDA graph, ``padded_bucket`` = ``{"min_pages", "linear_step_pages"}``:
    the graph gathers the whole padded page bucket (``gather_passes`` times its bytes).
    Without it (eager), runs of adjacent pages are read in place once and the rest, a
    share ``gathered_share`` of the context (the measured fragmentation is a fair
    estimate), is gathered. None when ``traffic`` lacks what is needed.
    """
    try:
        per_token = float(traffic["bytes_per_token"])
        page = int(traffic["page_size"])
        passes = float(traffic.get("gather_passes", GATHER_PASSES))
    except (KeyError, TypeError, ValueError):
        return None
    if per_token <= 0 or page <= 0 or context_len <= 0 or not math.isfinite(per_token):
        return None
    bucket = traffic.get("padded_bucket")
    if isinstance(bucket, Mapping):
        pages = padded_pages(
            -(-context_len // page), int(bucket["min_pages"]), int(bucket["linear_step_pages"])
        )
        return passes * pages * page * per_token * batch_size
    share = min(max(gathered_share, 0.0), 1.0)
    return per_token * context_len * batch_size * (1.0 + (passes - 1.0) * share)
