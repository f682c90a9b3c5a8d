"""Canary slowdowns: ``--specperf-inject verify=1.10,host_stall=5``.

``PHASE=FACTOR`` makes the named phase really take ``FACTOR`` times as long: when the
phase is about to end, busy work on the same device runs for ``(FACTOR - 1)`` times the
phase's own duration, inside the phase. On the CPU the busy work is integer arithmetic on
the phase's thread, timed to the phase's measured host time; on a GPU it is a kernel
(``torch.cuda._sleep``) sized from the phase's recent device time (the host part of a GPU
phase is only the launch cost), calibrated at start and clock-corrected as it runs (see
:class:`Injector`).

``all=FACTOR`` makes every phase ``FACTOR`` times as long, each by its own busy work:
the step grows by that factor while every phase keeps its share, the canary of the step
gate (a uniform slowdown that no phase gate sees).

``host_stall=MS`` stalls the host for ``MS`` milliseconds once per step, between two
phases and outside all of them, so the device idles and the time lands in
``unaccounted``: the incident that motivated this project. The stall is busy (the
thread spins), so the thread's CPU time grows with it.

``PHASE_wait=MS`` (``verify_wait=20``) makes the phase's thread sleep ``MS`` milliseconds
inside the phase, just before it ends: the phase's wall time grows, its CPU time does not,
and on a GPU the device idles inside the phase's span. It is the shape of a phase that
waits instead of working (a lock, a blocking copy, a poll), the question the founding
incident asked.

The spec travels to server processes in the ``SPECPERF_INJECT`` environment variable, or
reaches a running server through the control file ``inject.control`` in its run directory
(:class:`InjectControl`: the probe looks at it once every ``CONTROL_EVERY_STEPS`` steps
and before a request's first step, at a step boundary, and a spec there replaces the
environment's; ``none`` turns injection off). Records of injected steps carry the label
``inject=<spec>``.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_specperf.probe.phases import PHASES, VERIFY

HOST_STALL = "host_stall"
#: Every phase alike: ``all=1.10``.
ALL_PHASES_KEY = "all"
#: ``<phase>_wait=MS``: the phase's thread sleeps MS milliseconds inside the phase.
WAIT_SUFFIX = "_wait"
#: The phase before which the host stall happens: the host is late to launch the verify.
STALL_BEFORE = VERIFY
MAX_FACTOR = 10.0
MAX_STALL_MS = 10_000.0
#: Steps whose sleeps wait for their device times (a probe that never resolves its
#: steps cannot grow the queue past this).
PENDING_STEPS = 1024
#: Sleeps shorter than this do not correct the clock (launch gaps would dominate).
MIN_CORRECTION_NS = 20_000.0
#: Weight of the newest achieved sleep in the cycles-per-ns estimate (event-timed sleeps
#: are precise; the rest of the weight damps a one-off outlier).
CLOCK_CORRECTION_WEIGHT = 0.75
#: Calibration: warm-up length, timed sleeps, cycles per timed sleep, and the cycles
#: per ns assumed to size the warm-up (a GPU clock of the right order).
CALIBRATION_WARMUP_MS = 50.0
CALIBRATION_REPS = 5
CALIBRATION_CYCLES = 2_000_000
NOMINAL_CYCLES_PER_NS = 1.5
#: Step-record label that names the injected slowdown (records of canary runs).
INJECT_LABEL = "inject"
#: Step-record label of a control file the probe could not use (what was wrong with it).
INJECT_ERROR_LABEL = "inject_error"
#: The control file in a server's run directory: a spec, or ``none`` for no injection.
CONTROL_FILE = "inject.control"
#: Control-file text that turns injection off (the environment's spec too).
NO_INJECTION = "none"
#: The probe looks at the control file (one ``os.stat``) once every this many steps.
CONTROL_EVERY_STEPS = 16
#: Largest control file read; a spec is a few dozen bytes.
MAX_CONTROL_BYTES = 4096


@dataclass(frozen=True)
class InjectSpec:
    factors: dict[str, float] = field(default_factory=dict)
    host_stall_ms: float = 0.0
    #: phase -> milliseconds its thread sleeps inside it
    waits_ms: dict[str, float] = field(default_factory=dict)

    @property
    def uniform(self) -> float | None:
        """The common factor when every phase is slowed alike (``all=``), else None."""
        values = {self.factors.get(p) for p in PHASES}
        if len(values) == 1 and len(self.factors) == len(PHASES):
            return values.pop()
        return None

    def __str__(self) -> str:
        every = self.uniform
        if every is not None:
            parts = [f"{ALL_PHASES_KEY}={every:g}"]
        else:
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
    """Parse ``PHASE=FACTOR`` (``all=FACTOR``: every phase alike), ``PHASE_wait=MS`` and
    ``host_stall=MS``, comma-separated; ``ValueError`` names the fix."""
    factors: dict[str, float] = {}
    waits: dict[str, float] = {}
    seen: set[str] = set()
    stall = 0.0
    if not text.strip():
        raise ValueError("empty spec; expected PHASE=FACTOR such as verify=1.10")
    for part in text.split(","):
        name, value, x = _part(part)
        phase = name.removesuffix(WAIT_SUFFIX)
        if name in seen:
            raise ValueError(f"{name} is given twice")
        seen.add(name)
        if name == HOST_STALL:
            stall = _milliseconds(name, value, x)
        elif name == ALL_PHASES_KEY or name in PHASES:
            names = PHASES if name == ALL_PHASES_KEY else (name,)
            if any(p in factors for p in names):
                raise ValueError(
                    f"{ALL_PHASES_KEY}= sets every phase: give either {ALL_PHASES_KEY}=FACTOR "
                    "or phase factors, not both"
                )
            factors.update(dict.fromkeys(names, _factor(name, value, x)))
        elif name.endswith(WAIT_SUFFIX) and phase in PHASES:
            waits[phase] = _milliseconds(name, value, x)
        else:
            raise ValueError(
                f"unknown phase {name!r}; choose one of: {', '.join(PHASES)} (PHASE=FACTOR "
                f"or PHASE{WAIT_SUFFIX}=MS), {ALL_PHASES_KEY}=FACTOR (every phase), or "
                f"{HOST_STALL}=MS"
            )
    return InjectSpec(factors, stall, waits)


class SleepDevice(Protocol):
    """Busy work on a GPU, timed by the GPU itself (``torch.cuda._sleep`` and events)."""

    def calibrate(self) -> float:
        """Sleep-kernel cycles per nanosecond now, measured after a warm-up."""

    def sleep(self, cycles: int) -> Any:
        """Enqueue a sleep of ``cycles`` on the current stream; a handle for ``elapsed_ns``."""

    def elapsed_ns(self, handle: Any) -> float | None:
        """The sleep's device duration once it has run, else None (never waits)."""


class Injector:
    """Implements ``probe.PhaseInjector`` for one server process.

    On a GPU the busy work is a sleep kernel of ``cycles``, and cycles per nanosecond
    follow the SM clock. They are calibrated once, after a warm-up and outside every
    measured phase and step record: when the injector is built for ``"cuda:N"`` (server
    start), or, for plain ``"cuda"`` (a process that selects its GPU later, as SGLang's
    schedulers do), right after the first recorded step, on the device current then.
    From there every sleep the GPU reports back corrects them: each stretched step's
    achieved sleep is a measurement at the clock the SM ran at then. The feedback that
    sizes the next sleep subtracts the achieved sleep (not the intended one) from the
    phase's device time.
    """

    def __init__(
        self, spec: InjectSpec, *, device: Any = None, sleeper: SleepDevice | None = None
    ) -> None:
        self.spec = spec
        self._sleeper = sleeper
        cuda = str(device or "")
        if sleeper is None and spec.factors and cuda.startswith("cuda"):
            self._sleeper = CudaSleep(device)
        self._device_ns: dict[str, float] = {}  # phase -> un-stretched device time (EMA)
        self._step: list[tuple[str, int, Any]] = []  # this step's sleeps
        self._pending: deque[list[tuple[str, int, Any]]] = deque(maxlen=PENDING_STEPS)
        self.cycles_per_ns = 0.0
        self.calibrations: list[float] = []
        self._calibrate_later = sleeper is None and cuda == "cuda"
        if self._sleeper is not None and not self._calibrate_later:
            self.recalibrate()

    def recalibrate(self) -> float:
        """Measure the sleep kernel's cycles per nanosecond now (outside any step)."""
        assert self._sleeper is not None
        self.cycles_per_ns = self._sleeper.calibrate()
        self.calibrations.append(self.cycles_per_ns)
        return self.cycles_per_ns

    def baseline_ns(self, phase: str) -> float | None:
        """The phase's un-stretched device time as the feedback currently estimates it."""
        return self._device_ns.get(phase)

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
        if self._sleeper is None:
            _cpu_work(elapsed_ns * (factor - 1.0))
            return
        dev = self._device_ns.get(phase)
        if dev and self.cycles_per_ns > 0:
            cycles = max(int(dev * (factor - 1.0) * self.cycles_per_ns), 1)
            self._step.append((phase, cycles, self._sleeper.sleep(cycles)))

    def end_step(self) -> None:
        """The step's record is made: its sleeps wait for its device times."""
        if self._sleeper is not None:
            self._pending.append(self._step)
            if self._calibrate_later:  # outside every record, on the device current now
                self._calibrate_later = False
                self.recalibrate()
        self._step = []

    def abort_step(self) -> None:
        """The step raised and makes no record: forget its sleeps."""
        self._step = []

    def observe_step(self, device_ns: Mapping[str, int]) -> None:
        """Feed back one resolved step (oldest first) so GPU busy work tracks the phase.

        The sleep achieved inside the phase is subtracted first: feeding back the
        stretched time would make the estimate, and the slowdown, grow step after step.
        """
        sleeps = self._pending.popleft() if self._pending else []
        achieved: dict[str, float] = {}
        for phase, cycles, handle in sleeps:
            ns = self._sleeper.elapsed_ns(handle) if self._sleeper is not None else None
            if ns is None or ns <= 0:
                ns = cycles / self.cycles_per_ns  # not resolvable: take the intended time
            elif ns >= MIN_CORRECTION_NS:
                w = CLOCK_CORRECTION_WEIGHT
                self.cycles_per_ns = (1 - w) * self.cycles_per_ns + w * (cycles / ns)
            achieved[phase] = achieved.get(phase, 0.0) + ns
        for phase in self.spec.factors:
            total = device_ns.get(phase)
            if not total:
                continue
            base = max(total - achieved.get(phase, 0.0), 0.0)
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


class CudaSleep:
    """:class:`SleepDevice` on a CUDA device (``torch.cuda._sleep`` between two events).

    ``"cuda:N"`` pins device N; plain ``"cuda"`` follows whatever device is current at
    each call (a server process that selects its GPU after building the injector)."""

    def __init__(self, device: Any) -> None:
        import torch

        dev = torch.device(device)
        self.device = dev if dev.index is not None else None
        self._torch = torch
        self._events: list[Any] = []

    def _on_device(self) -> Any:
        if self.device is None:
            return contextlib.nullcontext()
        return self._torch.cuda.device(self.device)

    def calibrate(self) -> float:
        """Cycles per ns: a warm-up (``CALIBRATION_WARMUP_MS`` of sleeps, so the SM
        leaves its idle clock), then the median of ``CALIBRATION_REPS`` timed sleeps."""
        torch = self._torch
        with self._on_device():
            warm = int(CALIBRATION_WARMUP_MS * 1e6 * NOMINAL_CYCLES_PER_NS / 10)
            for _ in range(10):
                torch.cuda._sleep(warm)
            rates = []
            for _ in range(CALIBRATION_REPS):
                handle = self.sleep(CALIBRATION_CYCLES)
                handle[1].synchronize()
                ns = handle[0].elapsed_time(handle[1]) * 1e6
                self._events.extend(handle)
                if ns > 0:
                    rates.append(CALIBRATION_CYCLES / ns)
        return statistics.median(rates) if rates else NOMINAL_CYCLES_PER_NS

    def sleep(self, cycles: int) -> tuple[Any, Any]:
        torch = self._torch
        with self._on_device():
            start, end = (self._event(), self._event())
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
        return start, end

    def elapsed_ns(self, handle: Any) -> float | None:
        start, end = handle
        if not end.query():
            return None
        ns = float(start.elapsed_time(end)) * 1e6
        self._events.extend(handle)  # resolved: the pair can be recorded again
        return ns

    def _event(self) -> Any:
        if self._events:
            return self._events.pop()
        return self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


# -- the control file: injection switched in a running server ------------------------------


def parse_control(text: str) -> InjectSpec | None:
    """A control file's text: ``none`` (or nothing) -> None, else a spec (ValueError)."""
    text = text.strip()
    if not text or text == NO_INJECTION:
        return None
    return parse_inject(text)


def write_control(run_dir: str | os.PathLike[str], spec: InjectSpec | None) -> Path:
    """Write the control file of the server whose probe writes to ``run_dir``, atomically
    (a temporary file renamed over it): ``spec``, or ``none`` to turn injection off."""
    target = Path(run_dir) / CONTROL_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{CONTROL_FILE}.", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{spec if spec is not None else NO_INJECTION}\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def remove_control(run_dir: str | os.PathLike[str]) -> bool:
    """Remove the control file (the server's probe goes back to its environment's spec);
    whether there was one."""
    try:
        os.unlink(Path(run_dir) / CONTROL_FILE)
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class ControlChange:
    """What the probe applies after the control file changed."""

    injector: Injector | None
    #: the spec now injected ("" when none): the ``inject`` label of the next records
    label: str
    #: why the control file could not be used ("" when it could)
    error: str = ""


class InjectControl:
    """The injection of a running server, switched by the control file in its run directory.

    ``poll`` costs one ``os.stat`` when nothing changed; the file is read only when its
    identity (inode, size, modification time) differs from the last one seen. Without a
    file the environment's spec (``base``) applies.
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], *, device: Any = None, base: InjectSpec | None = None
    ) -> None:
        self.path = Path(run_dir) / CONTROL_FILE
        self._device = device
        self._base = base
        self._seen: tuple[int, int, int] | None = None  # the file last applied; None: none

    def poll(self) -> ControlChange | None:
        """The change to apply, or None when the control file is as last seen."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:  # no file (or an unreadable directory): the environment's spec
            if self._seen is None:
                return None
            self._seen = None
            return self._change(self._base)
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            spec = parse_control(_read_control(self.path, st))
        except ValueError as e:
            return ControlChange(None, "", f"{CONTROL_FILE}: {e}"[:200])
        return self._change(spec)

    def _change(self, spec: InjectSpec | None) -> ControlChange:
        if spec is None:
            return ControlChange(None, "")
        return ControlChange(Injector(spec, device=self._device), str(spec))


def _read_control(path: Path, st: os.stat_result) -> str:
    """The text of a control file: a small regular file, never through a link."""
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > MAX_CONTROL_BYTES:
        raise ValueError(f"{st.st_size} bytes, over {MAX_CONTROL_BYTES}")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ValueError(f"cannot open ({e.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_CONTROL_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
