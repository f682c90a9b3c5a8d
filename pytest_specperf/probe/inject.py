"""Canary slowdowns: ``--specperf-inject verify=1.10,host_stall=5``.

``PHASE=FACTOR`` makes the named phase really take ``FACTOR`` times as long: when the
phase is about to end, busy work on the same device runs for ``(FACTOR - 1)`` times the
phase's own duration, inside the phase. On the CPU the busy work is integer arithmetic on
the phase's thread, timed to the phase's measured host time; on a GPU it is a kernel
(``torch.cuda._sleep``) sized from the phase's recent device time (the host part of a GPU
phase is only the launch cost).

``host_stall=MS`` stalls the host for ``MS`` milliseconds once per step, between two
phases and outside all of them, so the device idles and the time lands in
``unaccounted``: the incident that motivated this project. The stall is busy (the
thread spins), so the thread's CPU time grows with it.

``PHASE_wait=MS`` (``verify_wait=20``) makes the phase's thread sleep ``MS`` milliseconds
inside the phase, just before it ends: the phase's wall time grows, its CPU time does not,
and on a GPU the device idles inside the phase's span. It is the shape of a phase that
waits instead of working (a lock, a blocking copy, a poll), the question the founding
incident asked.

The spec travels to server processes in the ``SPECPERF_INJECT`` environment variable;
records of injected steps carry the label ``inject=<spec>``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_specperf.probe.phases import PHASES, VERIFY

HOST_STALL = "host_stall"
#: ``<phase>_wait=MS``: the phase's thread sleeps MS milliseconds inside the phase.
WAIT_SUFFIX = "_wait"
#: The phase before which the host stall happens: the host is late to launch the verify.
STALL_BEFORE = VERIFY
MAX_FACTOR = 10.0
MAX_STALL_MS = 10_000.0


@dataclass(frozen=True)
class InjectSpec:
    factors: dict[str, float] = field(default_factory=dict)
    host_stall_ms: float = 0.0
    #: phase -> milliseconds its thread sleeps inside it
    waits_ms: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        parts = [f"{p}={f:g}" for p, f in sorted(self.factors.items())]
        parts += [f"{p}{WAIT_SUFFIX}={ms:g}" for p, ms in sorted(self.waits_ms.items())]
        if self.host_stall_ms:
            parts.append(f"{HOST_STALL}={self.host_stall_ms:g}")
        return ",".join(parts)


def _milliseconds(name: str, value: str, x: float) -> float:
    if not 0 < x <= MAX_STALL_MS or not math.isfinite(x):
        raise ValueError(f"{name}: {value.strip()} ms must be in (0, {MAX_STALL_MS:g}]")
    return x


def _factor(name: str, value: str, x: float) -> float:
    if not 1.0 < x <= MAX_FACTOR:
        raise ValueError(
            f"{name}: factor {value.strip()} must be in (1, {MAX_FACTOR:g}] "
            "(a slowdown: 1.10 makes the phase 10% slower)"
        )
    return x


def _part(part: str) -> tuple[str, str, float]:
    name, sep, value = part.strip().partition("=")
    name = name.strip()
    if not sep:
        raise ValueError(f"{part.strip()!r} is not NAME=VALUE; expected e.g. verify=1.10")
    try:
        return name, value, float(value)
    except ValueError:
        raise ValueError(f"{name}: {value.strip()!r} is not a number") from None


def parse_inject(text: str) -> InjectSpec:
    """Parse ``PHASE=FACTOR``, ``PHASE_wait=MS`` and ``host_stall=MS``, comma-separated;
    ``ValueError`` names the fix."""
    factors: dict[str, float] = {}
    waits: dict[str, float] = {}
    stall = 0.0
    if not text.strip():
        raise ValueError("empty spec; expected PHASE=FACTOR such as verify=1.10")
    for part in text.split(","):
        name, value, x = _part(part)
        phase = name.removesuffix(WAIT_SUFFIX)
        if name == HOST_STALL:
            stall = _milliseconds(name, value, x)
        elif name in PHASES or (name.endswith(WAIT_SUFFIX) and phase in PHASES):
            target = factors if name in PHASES else waits
            if phase in target:
                raise ValueError(f"{name} is given twice")
            target[phase] = (
                _factor(name, value, x) if name in PHASES else _milliseconds(name, value, x)
            )
        else:
            raise ValueError(
                f"unknown phase {name!r}; choose one of: {', '.join(PHASES)} (PHASE=FACTOR "
                f"or PHASE{WAIT_SUFFIX}=MS), or {HOST_STALL}=MS"
            )
    return InjectSpec(factors, stall, waits)


class Injector:
    """Implements ``probe.PhaseInjector`` for one server process."""

    def __init__(self, spec: InjectSpec, *, device: Any = None) -> None:
        self.spec = spec
        self._cuda = device is not None and str(device).startswith("cuda")
        self._torch: Any = None
        self._work: Any = None
        self._device_ns: dict[str, float] = {}  # phase -> un-stretched device time (EMA)
        self._injected_ns: dict[str, float] = {}  # phase -> busy work added last time
        self._cycles_per_ns = 0.0
        if spec.factors and not self._cuda:
            self._ensure_work()  # on a GPU: at the first stretch (the device is chosen late)

    def _ensure_work(self) -> None:
        if self._torch is not None:
            return
        import torch

        self._torch = torch
        if self._cuda:
            self._cycles_per_ns = _calibrate_cuda_sleep(torch)

    def before_phase(self, phase: str) -> None:
        if phase == STALL_BEFORE and self.spec.host_stall_ms:
            _spin(self.spec.host_stall_ms * 1e6)

    def stretch(self, phase: str, elapsed_ns: int) -> None:
        wait = self.spec.waits_ms.get(phase)
        if wait is not None:
            time.sleep(wait / 1e3)  # the thread waits: wall time grows, CPU time does not
        factor = self.spec.factors.get(phase)
        if factor is None:
            return
        self._ensure_work()
        if self._cuda:
            dev = self._device_ns.get(phase)
            if dev:
                extra = dev * (factor - 1.0)
                self._torch.cuda._sleep(max(int(extra * self._cycles_per_ns), 1))
                self._injected_ns[phase] = extra
            return
        _cpu_work(elapsed_ns * (factor - 1.0))

    def observe_device(self, phase: str, device_ns: int) -> None:
        """Feed back a resolved device time so GPU busy work tracks the phase.

        The busy work added inside the phase is subtracted first: feeding back the
        stretched time would make the estimate, and the slowdown, grow step after step.
        """
        base = max(device_ns - self._injected_ns.get(phase, 0.0), 0.0)
        old = self._device_ns.get(phase)
        self._device_ns[phase] = base if old is None else 0.8 * old + 0.2 * base


def _cpu_work(ns: float) -> None:
    """Real arithmetic on the CPU for ``ns`` nanoseconds, on this thread only (a parallel
    torch kernel would wait for a second core that another process may hold)."""
    end = time.perf_counter_ns() + ns
    x = 1
    while time.perf_counter_ns() < end:
        for _ in range(200):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _spin(ns: float) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def _calibrate_cuda_sleep(torch: Any) -> float:
    """GPU clock cycles per nanosecond for ``torch.cuda._sleep``, measured with events."""
    torch.cuda._sleep(1000)  # warm up
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    ns = start.elapsed_time(end) * 1e6
    return cycles / ns if ns > 0 else 1.0
