"""From the probe's step records to a frozen ``DecodeRun``: per-step samples and summaries.

A case is measured as blocks (requests) of a few decode steps each (``server.decoder``);
this module turns the records of those blocks into per-step samples of every metric and
its derived forms (``judging.metrics``), and summarizes them keeping the block structure
(``judging.stats``). Nothing here talks to a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    DEVICE_BUSY,
    DEVICE_STEP,
    STEP,
    STEP_PER_REF,
    TOKENS_PER_S,
    UTIL_DRAM,
    UTIL_GPU,
    UTIL_SM,
    UTIL_TENSOR,
    center_of,
    device_form,
    rest_form,
)
from pytest_specperf.judging.stats import Summary, summarize
from pytest_specperf.probe.phases import PHASES, UNACCOUNTED
from pytest_specperf.probe.record import StepRecord

if TYPE_CHECKING:
    from pytest_specperf.telemetry.summary import TelemetrySummary


@dataclass(frozen=True)
class KVLayout:
    name: str  # contiguous | fragmented
    level: float

    @property
    def label(self) -> str:
        if self.name == "fragmented" and self.level < 1.0:
            return f"fragmented@{self.level:g}"
        return self.name


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

    @property
    def processes(self) -> tuple[DecodeRun, ...]:
        """This run and its siblings: one run per server process."""
        return (self, *self.siblings)

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


def _empty_samples(device: bool, use_ref: bool) -> dict[str, list[float]]:
    names = [STEP, UNACCOUNTED, ACCEPT_LEN, TOKENS_PER_S, *PHASES, *map(rest_form, PHASES)]
    if device:
        names += [device_form(p) for p in PHASES] + [rest_form(device_form(p)) for p in PHASES]
        names += [DEVICE_STEP, DEVICE_BUSY]
    if use_ref:
        names.append(STEP_PER_REF)
    return {n: [] for n in names}


def _add_phases(out: dict[str, list[float]], times: Mapping[str, int], prefix: str) -> int:
    """Append each phase's ms and its ratio to the rest of the step; return the total ns."""
    total = sum(times.get(p, 0) for p in PHASES)
    for p in PHASES:
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
    """
    device = bool(records) and all(r.device_ns is not None for r in records)
    use_ref = bool(reference) and blocks is not None and all(b in (reference or {}) for b in blocks)
    out = _empty_samples(device, use_ref)
    for i, r in enumerate(records):
        out[STEP].append(r.step_ns / 1e6)
        out[UNACCOUNTED].append(r.unaccounted_ns / 1e6)
        _add_phases(out, r.host_ns, "")
        if use_ref and blocks is not None and reference is not None:
            out[STEP_PER_REF].append(r.step_ns / 1e6 / reference[blocks[i]])
        out[ACCEPT_LEN].append(r.accepted_tokens / max(r.batch_size, 1))
        out[TOKENS_PER_S].append(r.accepted_tokens / (r.step_ns / 1e9) if r.step_ns else 0.0)
        if device and r.device_ns is not None:
            busy = _add_phases(out, r.device_ns, device_form(""))
            out[DEVICE_STEP].append((r.device_step_ns or 0) / 1e6)
            out[DEVICE_BUSY].append(busy / r.step_ns if r.step_ns else 0.0)
    return out


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
    summaries = {k: summarize(v, blocks, center=center_of(k)) for k, v in samples.items() if v}
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
    )
