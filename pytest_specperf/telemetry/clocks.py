"""Decoding NVML clock-event ("throttle") reason bitmasks.

``nvmlDeviceGetCurrentClocksEventReasons`` (formerly ``...ClocksThrottleReasons``) returns a
bitmask saying why the clocks are below their maximum right now. Some reasons are benign
for a measurement and some mean the figures were taken on a slowed-down GPU:

* ``gpu_idle`` (0x001), benign: nothing running, clocks parked.
* ``applications_clocks_setting`` (0x002), benign: clocks pinned by ``nvidia-smi -ac``.
* ``sw_power_cap`` (0x004), throttling: software power cap reached.
* ``hw_slowdown`` (0x008), throttling: hardware slowdown (thermal or power brake).
* ``sync_boost`` (0x010), throttling: held down to match a sync-boost group.
* ``sw_thermal_slowdown`` (0x020), throttling: software thermal limit.
* ``hw_thermal_slowdown`` (0x040), throttling: hardware thermal limit.
* ``hw_power_brake_slowdown`` (0x080), throttling: external power brake asserted.
* ``display_clock_setting`` (0x100), benign: display clock setting.
* ``board_limit`` (0x200), throttling: board-level limit (older drivers).
* ``reliability`` (0x400), throttling: reliability voltage limit.

Bits not in this list are reported as ``unknown_0x...`` and treated as benign (we cannot
tell, and an unexplained INVALID is worse than a reported oddity). Bit values are from the
``nvmlClocksEventReason*`` / ``nvmlClocksThrottleReason*`` constants of nvidia-ml-py.
"""

from __future__ import annotations

from typing import Final

#: (bit, name, is_throttling) for every known reason.
CLOCK_EVENT_REASONS: Final[tuple[tuple[int, str, bool], ...]] = (
    (0x001, "gpu_idle", False),
    (0x002, "applications_clocks_setting", False),
    (0x004, "sw_power_cap", True),
    (0x008, "hw_slowdown", True),
    (0x010, "sync_boost", True),
    (0x020, "sw_thermal_slowdown", True),
    (0x040, "hw_thermal_slowdown", True),
    (0x080, "hw_power_brake_slowdown", True),
    (0x100, "display_clock_setting", False),
    (0x200, "board_limit", True),
    (0x400, "reliability", True),
)

#: Names of the reasons that mean the clocks were really held down.
THROTTLING_REASONS: Final[frozenset[str]] = frozenset(
    name for _, name, real in CLOCK_EVENT_REASONS if real
)
#: Names of the reasons that do not disturb a measurement.
BENIGN_REASONS: Final[frozenset[str]] = frozenset(
    name for _, name, real in CLOCK_EVENT_REASONS if not real
)


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """Names of the reasons set in ``mask``, in bit order; unknown bits as ``unknown_0x..``."""
    names = [name for bit, name, _ in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#05x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def is_throttling(reason: str) -> bool:
    """True for a reason that means the GPU ran below its clocks for a reason not chosen by
    the user (power, thermal, hardware slowdown, sync boost)."""
    return reason in THROTTLING_REASONS
