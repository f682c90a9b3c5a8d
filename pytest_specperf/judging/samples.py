"""From the probe's step records to a frozen ``DecodeRun``: per-step samples and summaries.

A case is measured as blocks (requests) of a few decode steps each (``server.decoder``);
this module turns the records of those blocks into per-step samples of every metric and
its derived forms (``judging.metrics``), and summarizes them keeping the block structure
(``judging.stats``). Nothing here talks to a server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    ACTIVE_SHARE,
    DEVICE_BUSY,
    DEVICE_STEP,
    RECORD_COLUMNS,
    STEP,
    STEP_PER_REF,
    TOKENS_PER_S,
    UTIL_DRAM,
    UTIL_GPU,
    UTIL_SM,
    UTIL_TENSOR,
    active_form,
    center_of,
    cpu_form,
    device_form,
    rest_form,
)
from pytest_specperf.judging.stats import Summary, summarize
from pytest_specperf.probe.kernels import STEP_KEY, TOP_KERNELS
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.probe.phases import ALL_PHASES, CORE_PHASES, HOST_PHASES, PHASES, UNACCOUNTED
from pytest_specperf.probe.record import StepRecord

if TYPE_CHECKING:
    from pytest_specperf.telemetry.summary import TelemetrySummary


@dataclass(frozen=True)
class Utilization:
    """A utilization median over a run's telemetry window (percent, one value per run)."""

    name: str
    median: float
    min: float
    max: float
    n: int

    @property
    def value(self) -> float:
        return self.median

    @property
    def blocks(self) -> tuple[float, ...]:
        """No per-block values: NVML/GPM samples the run as a whole."""
        return ()


#: Telemetry metric (``telemetry.summary``) behind each utilization gate.
_TELEMETRY_KEYS: Mapping[str, str] = {
    UTIL_SM: "sm_util_pct",
    UTIL_DRAM: "dram_util_pct",
    UTIL_TENSOR: "tensor_util_pct",
    UTIL_GPU: "gpu_util_pct",
}


def utilizations(t: TelemetrySummary | None) -> dict[str, Utilization]:
    """The telemetry's utilization medians, by gate name (empty without telemetry)."""
    out: dict[str, Utilization] = {}
    if t is None or not t.available:
        return out
    for name, key in _TELEMETRY_KEYS.items():
        m = t.metrics.get(key)
        if m is not None and m.n:
            out[name] = Utilization(name, m.median, m.min, m.max, m.n)
    return out


@dataclass(frozen=True)
class KernelStat:
    """One kernel (GPU) or op (CPU) of a phase over a run's sampled steps, per step."""

    name: str
    calls: float
    total_ms: float
    #: of the phase's time (its device span on a GPU, its wall time on a CPU)
    share: float


@dataclass(frozen=True)
class KernelView:
    """What kernel sampling saw over a run: top kernels per phase and what it cost."""

    source: str  # cuda | cpu
    steps: int
    #: phase (or ``unaccounted``) -> its largest kernels, largest first
    phases: Mapping[str, tuple[KernelStat, ...]]
    #: sampling's own host time per sampled step, outside the step (ms)
    cost_ms: float


@dataclass(frozen=True)
class DecodeRun:
    """The measured steps of one case, their samples and summaries; immutable once built."""

    context_len: int
    batch_size: int
    kv_layout: KVLayout
    records: tuple[StepRecord, ...]
    blocks: tuple[int, ...]
    samples: Mapping[str, tuple[float, ...]]
    summaries: Mapping[str, Summary]
    fragmentation: float | None
    #: per runner: ``{"replay": n, "eager": n}`` over the measured steps
    graphs: Mapping[str, Mapping[str, int]]
    wall_s: float
    warmup_steps: int
    labels: Mapping[str, str] = field(default_factory=dict)
    #: NVML/GPM telemetry over the measured blocks (GPU runs)
    telemetry: TelemetrySummary | None = None
    utilizations: Mapping[str, Utilization] = field(default_factory=dict)
    #: per block: the request's KV read time (ms), the step's reference (reference engine)
    reference_ms: tuple[float, ...] = ()
    #: where the server's own metrics disagree with the probe over the measured window
    cross_check: tuple[str, ...] = ()
    #: the server process that measured the run (its pid as the server reports it)
    server_pid: int | None = None
    #: the same case measured in the session's other server processes
    #: (``--specperf-processes``), judged together with this run
    siblings: tuple[DecodeRun, ...] = ()
    #: rounds of the first round's blocks (same prompts and seeds) measured: more than one
    #: when the automatic extension measured more; and the first round's steps
    rounds: int = 1
    round_steps: int = 0
    #: the looks the automatic extension planned for this case from its first round
    #: (``significance.planned_looks``); None: the run's options' (no extension: 1)
    looks: int | None = None

    @property
    def processes(self) -> tuple[DecodeRun, ...]:
        """This run and its siblings: one run per server process."""
        return (self, *self.siblings)

    #: what ``active.<phase>`` measures: ``device`` (GPU kernel samples), ``cpu`` (the
    #: thread's CPU time) or None (version 1 records)
    active_source: str | None = None
    #: kernel sampling over the run (None when no step was sampled)
    kernels: KernelView | None = None

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def has_device_times(self) -> bool:
        return DEVICE_STEP in self.summaries

    @property
    def step_ms(self) -> Summary:
        return self.summaries[STEP]

    @property
    def accept_len(self) -> float:
        """Mean accepted tokens per step and request."""
        return self.summaries[ACCEPT_LEN].value

    def phase_ms(self, phase: str) -> float:
        return self.summaries[phase].median

    @property
    def eager_forwards(self) -> int:
        return sum(g["eager"] for g in self.graphs.values())

    @property
    def captures(self) -> int:
        """Graph captures during measured steps (a warm-up that missed a shape)."""
        return sum(g.get("capture", 0) for g in self.graphs.values())

    @property
    def injected(self) -> str | None:
        """The canary slowdown the server injected into this run, if any."""
        return self.labels.get("inject") or None

    def judged(self, name: str) -> Summary | Utilization | None:
        """A metric's summary, or a utilization's median, as the verdicts compare them."""
        return self.summaries.get(name) or self.utilizations.get(name)


def measured_phases(records: Sequence[StepRecord]) -> tuple[str, ...]:
    """The phases a run has metrics for: every core phase, and a serving scheduler's host
    phases (``HOST_PHASES``) only where some step timed them (the embedded engine has none:
    its baselines stay as they were)."""
    timed = {p for p in HOST_PHASES if any(r.host_ns.get(p) for r in records)}
    return tuple(p for p in PHASES if p in CORE_PHASES or p in timed)


def _empty_samples(
    device: bool, use_ref: bool, cpu: bool, active: str | None, phases: tuple[str, ...]
) -> dict[str, list[float]]:
    names = [STEP, UNACCOUNTED, ACCEPT_LEN, TOKENS_PER_S, *phases, *map(rest_form, phases)]
    if device:
        names += [device_form(p) for p in phases] + [rest_form(device_form(p)) for p in phases]
        names += [DEVICE_STEP, DEVICE_BUSY]
    if use_ref:
        names.append(STEP_PER_REF)
    parts = (*phases, UNACCOUNTED, STEP)
    if cpu:
        names += [cpu_form(p) for p in parts]
    if active is not None:
        names += [active_form(p) for p in parts] + [ACTIVE_SHARE]
    return {n: [] for n in names}


def active_source(records: Sequence[StepRecord], device: bool) -> str | None:
    """``device`` on a GPU run with kernel samples, ``cpu`` on a CPU run with CPU times,
    None otherwise (version 1 records; a GPU run without kernel samples)."""
    if not any(r.cpu_ns is not None for r in records):
        return None
    if not device:
        return "cpu"
    return "device" if any(r.kernels is not None for r in records) else None


def _add_cpu(out: dict[str, list[float]], r: StepRecord, phases: tuple[str, ...]) -> None:
    """The thread's CPU time per phase, outside every phase, and over the step (ms; NaN on
    a step that did not read it)."""
    if r.cpu_ns is None:
        for name in (cpu_form(p) for p in (*phases, UNACCOUNTED, STEP)):
            out[name].append(math.nan)
        return
    cpu = r.cpu_ns
    total = sum(cpu.get(p, 0) for p in PHASES)
    step = r.step_cpu_ns or 0
    for p in phases:
        out[cpu_form(p)].append(cpu.get(p, 0) / 1e6)
    # one thread's CPU time cannot exceed the wall time it lies in (clock reads aside)
    out[cpu_form(UNACCOUNTED)].append(max(min(step - total, r.unaccounted_ns), 0) / 1e6)
    out[cpu_form(STEP)].append(step / 1e6)


def _add_columns(out: dict[str, list[float]], records: Sequence[StepRecord]) -> None:
    """The metrics read straight from one record (``metrics.RECORD_COLUMNS``): a column
    where some record measured it, NaN on the steps that did not."""
    for name, sample in RECORD_COLUMNS:
        column = [sample(r) for r in records]
        if any(x is not None for x in column):
            out[name] = [math.nan if x is None else x for x in column]


def _add_active(
    out: dict[str, list[float]], r: StepRecord, source: str, phases: tuple[str, ...]
) -> None:
    """Active ms per part of the step and the step's active share (NaN: not sampled)."""
    if source == "cpu":
        for p in (*phases, UNACCOUNTED, STEP):
            out[active_form(p)].append(out[cpu_form(p)][-1])
        if r.step_cpu_ns is None or not r.step_ns:
            out[ACTIVE_SHARE].append(math.nan)
        else:
            out[ACTIVE_SHARE].append(min(r.step_cpu_ns / r.step_ns, 1.0))
        return
    k = r.kernels
    for p in (*phases, UNACCOUNTED):
        out[active_form(p)].append(k.active_ns(p) / 1e6 if k is not None else math.nan)
    step = k.active_ns(STEP_KEY) if k is not None else None
    out[active_form(STEP)].append(step / 1e6 if step is not None else math.nan)
    share = step / r.step_ns if step is not None and r.step_ns else math.nan
    out[ACTIVE_SHARE].append(min(share, 1.0) if math.isfinite(share) else share)


def _add_phases(
    out: dict[str, list[float]], times: Mapping[str, int], prefix: str, phases: tuple[str, ...]
) -> int:
    """Append each phase's ms and its ratio to the rest of the step; return the total ns."""
    total = sum(times.get(p, 0) for p in PHASES)
    for p in phases:
        ns = times.get(p, 0)
        name = f"{prefix}{p}"
        out[name].append(ns / 1e6)
        rest = total - ns
        out[rest_form(name)].append(ns / rest if rest > 0 else 0.0)
    return total


def samples_from_records(
    records: Sequence[StepRecord],
    blocks: Sequence[int] | None = None,
    reference: Mapping[int, float] | None = None,
) -> dict[str, list[float]]:
    """Per-step samples of every metric: times in ms, accept_len in tokens, tokens/s.

    Also the drift-free forms the verdicts use: each phase's time relative to the other
    named phases of the same step (``verify/rest``; ``unaccounted`` is not part of the
    rest, so a host stall does not move the phases), and with a reference read time per
    block (the request's KV read through its page table), the step relative to it
    (``step/ref``). On a GPU the same for device times, and the device-busy share.

    With version 2 records also the thread's CPU time (``cpu.<part>``) and the active time
    (``active.<part>``, ``active_share``): on a GPU the device's, from the sampled steps
    (NaN on the others), on a CPU the thread's CPU time.
    """
    device = bool(records) and all(r.device_ns is not None for r in records)
    use_ref = bool(reference) and blocks is not None and all(b in (reference or {}) for b in blocks)
    cpu = any(r.cpu_ns is not None for r in records)
    active = active_source(records, device)
    phases = measured_phases(records)
    out = _empty_samples(device, use_ref, cpu, active, phases)
    for i, r in enumerate(records):
        out[STEP].append(r.step_ns / 1e6)
        out[UNACCOUNTED].append(r.unaccounted_ns / 1e6)
        _add_phases(out, r.host_ns, "", phases)
        if use_ref and blocks is not None and reference is not None:
            out[STEP_PER_REF].append(r.step_ns / 1e6 / reference[blocks[i]])
        out[ACCEPT_LEN].append(r.accepted_tokens / max(r.batch_size, 1))
        out[TOKENS_PER_S].append(r.accepted_tokens / (r.step_ns / 1e9) if r.step_ns else 0.0)
        if device and r.device_ns is not None:
            busy = _add_phases(out, r.device_ns, device_form(""), phases)
            out[DEVICE_STEP].append((r.device_step_ns or 0) / 1e6)
            out[DEVICE_BUSY].append(busy / r.step_ns if r.step_ns else 0.0)
        if cpu:
            _add_cpu(out, r, phases)
        if active is not None:
            _add_active(out, r, active, phases)
    _add_columns(out, records)
    return out


def summarize_present(
    values: Sequence[float], blocks: Sequence[int], center: str = "median"
) -> Summary | None:
    """Summary of the finite values (a NaN marks a step without that measurement)."""
    kept = [(b, v) for b, v in zip(blocks, values) if math.isfinite(v)]
    if not kept:
        return None
    return summarize([v for _, v in kept], [b for b, _ in kept], center=center)


def kernel_view(records: Sequence[StepRecord], span_ms: Mapping[str, float]) -> KernelView | None:
    """Top kernels per phase over the sampled steps, per sampled step, with their share of
    the phase's median time (``span_ms``)."""
    sampled = [r.kernels for r in records if r.kernels is not None]
    if not sampled:
        return None
    n = len(sampled)
    sums: dict[str, dict[str, list[int]]] = {}
    for k in sampled:
        for key, pk in k.phases.items():
            if key == STEP_KEY:
                continue
            for t in pk.top:
                c = sums.setdefault(key, {}).setdefault(t.name, [0, 0])
                c[0] += t.calls
                c[1] += t.total_ns
    phases = {}
    for key, by_name in sums.items():
        span = span_ms.get(key, 0.0)
        ranked = sorted(by_name.items(), key=lambda kv: (-kv[1][1], kv[0]))
        phases[key] = tuple(
            KernelStat(name, c / n, t / n / 1e6, (t / n / 1e6) / span if span > 0 else math.nan)
            for name, (c, t) in ranked[:TOP_KERNELS]
        )
    cost = sum(k.cost_ns for k in sampled) / n / 1e6
    return KernelView(sampled[0].source, n, MappingProxyType(phases), cost)


def graph_counters(records: Sequence[StepRecord]) -> dict[str, Mapping[str, int]]:
    """CUDA-graph replays, eager forwards and captures per runner, summed over the records
    (``capture`` only where a step captured: a measured step should never have to)."""
    sums: dict[str, list[int]] = {}
    for r in records:
        for name, g in r.graphs.items():
            c = sums.setdefault(name, [0, 0, 0])
            c[0] += g.replay
            c[1] += g.eager
            c[2] += g.capture
    out: dict[str, Mapping[str, int]] = {}
    for k, (replay, eager, capture) in sums.items():
        counts = {"replay": replay, "eager": eager}
        if capture:
            counts["capture"] = capture
        out[k] = MappingProxyType(counts)
    return out


@dataclass(frozen=True)
class Window:
    """What the decoder measured besides the step records."""

    fragmentation: float | None = None
    wall_s: float = 0.0
    warmup_steps: int = 0
    reference: Mapping[int, float] = field(default_factory=dict)
    telemetry: TelemetrySummary | None = None
    cross_check: tuple[str, ...] = ()
    server_pid: int | None = None
    rounds: int = 1
    round_steps: int = 0


def build_run(
    records: Sequence[StepRecord],
    blocks: Sequence[int],
    *,
    context_len: int,
    batch_size: int,
    layout: KVLayout,
    window: Window | None = None,
) -> DecodeRun:
    """Samples, summaries and counters of one case, frozen into a ``DecodeRun``."""
    w = window or Window()
    samples = samples_from_records(records, blocks, w.reference)
    summaries = {}
    whole = len(set(blocks))  # every round's blocks
    for k, v in samples.items():
        s = summarize_present(v, blocks, center_of(k)) if v else None
        if s is not None:
            # a metric that missed a block in some round has no whole rounds to fold
            whole_rounds = w.rounds > 1 and len(s.blocks) == whole
            summaries[k] = replace(s, rounds=w.rounds) if whole_rounds else s
    device = DEVICE_STEP in summaries
    return DecodeRun(
        context_len=context_len,
        batch_size=batch_size,
        kv_layout=layout,
        records=tuple(records),
        blocks=tuple(blocks),
        samples=MappingProxyType({k: tuple(v) for k, v in samples.items()}),
        summaries=MappingProxyType(summaries),
        fragmentation=w.fragmentation,
        graphs=MappingProxyType(graph_counters(records)),
        wall_s=w.wall_s,
        warmup_steps=w.warmup_steps,
        labels=MappingProxyType(dict(records[0].labels) if records else {}),
        telemetry=w.telemetry,
        utilizations=MappingProxyType(utilizations(w.telemetry)),
        reference_ms=tuple(w.reference[b] for b in sorted(w.reference)),
        cross_check=tuple(w.cross_check),
        server_pid=w.server_pid,
        rounds=w.rounds,
        round_steps=w.round_steps,
        active_source=active_source(records, device),
        kernels=kernel_view(records, _span_ms(summaries, device)),
    )


def _span_ms(summaries: Mapping[str, Summary], device: bool) -> dict[str, float]:
    """Each phase's median time, as kernel shares are taken of (device span on a GPU)."""
    out = {}
    for p in ALL_PHASES:
        name = device_form(p) if device and p in PHASES else p
        if name in summaries:
            out[p] = summaries[name].median
    return out
