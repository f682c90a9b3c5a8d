"""Cross-check our probe against SGLang's own Prometheus metrics (``GET /metrics``).

With ``--enable-metrics`` and ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`` (both set by our
launcher) SGLang exports, per scheduler:

- ``sglang:cuda_graph_passes_total{mode}``: decode batches whose target forward replayed a
  CUDA graph (``decode_cuda_graph``) or ran eagerly (``decode_none``);
- ``sglang:forward_execution_seconds_total{category}``: GPU time of model forward passes
  by forward mode (``decode``, ``target_verify``, ``draft_extend``, ... and the prefill
  modes), measured with CUDA events around the forwards;
- ``sglang:fwd_occupancy``: a gauge, GPU-busy percentage of wall time over SGLang's last
  log window.

Scrape once before and once after a measured window; :func:`cross_check` compares the
counter deltas with the step records of the same window and returns one readable line
per disagreement beyond the tolerance. Counters cover every request in the window (warm-up
included), so pass all decode records of the window, not only one request's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specperf.probe.record import StepRecord
    from pytest_specperf.server.client import ServerClient

GRAPH_PASSES = "sglang:cuda_graph_passes_total"
FORWARD_SECONDS = "sglang:forward_execution_seconds_total"
FWD_OCCUPANCY = "sglang:fwd_occupancy"

#: forward_execution_seconds_total categories that belong to prefill, not decode steps.
PREFILL_CATEGORIES = frozenset(
    {"extend", "mixed", "split_prefill", "prefill", "dllm_extend", "prebuilt"}
)
#: Phases whose device time is model forward passes (what SGLang's device timer covers).
FORWARD_PHASES = ("draft", "verify", "kv_commit")
#: Per algorithm where that differs: DFlash's kv_commit projects target hidden states into
#: the draft KV layer by layer, outside any model forward SGLang times.
FORWARD_PHASES_BY_ALGORITHM = {"DFLASH": ("draft", "verify")}
#: Runner counters that mean "the target forward replayed a graph" / "ran eagerly".
TARGET_GRAPH_RUNNERS = ("DecodeCudaGraphRunner",)
TARGET_EAGER_RUNNERS = ("EagerRunner",)
#: Graph counters of the drafter end with this (runners of a draft model runner, and the
#: map's draft-side labels).
DRAFT_COUNTER_SUFFIX = "[draft]"
#: Algorithms whose eager draft forwards SGLang times in the same category as their graph
#: replays (DFlash drafts in TARGET_VERIFY mode: ``target_verify`` either way).
EAGER_DRAFT_TIMED_ALIKE = frozenset({"DFLASH"})


class MetricsParseError(ValueError):
    """The /metrics text is not in the Prometheus text exposition format."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


class MetricsSnapshot:
    """Parsed samples of one scrape."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self.samples = list(samples)

    def select(self, name: str, **labels: str) -> list[Sample]:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.label(k) == v for k, v in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float | None:
        """Sum over every series of ``name`` matching ``labels`` (None: metric absent)."""
        found = self.select(name, **labels)
        return sum(s.value for s in found) if found else None

    def by_label(self, name: str, key: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.select(name):
            k = s.label(key) or ""
            out[k] = out.get(k, 0.0) + s.value
        return out


def _parse_labels(text: str, lineno: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="x",b="y"}`` starting at text[0] == '{'; return labels and end index."""
    labels: list[tuple[str, str]] = []
    i, n = 1, len(text)
    while True:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return tuple(labels), i + 1
        j = i
        while j < n and (text[j].isalnum() or text[j] == "_"):
            j += 1
        key = text[i:j]
        if not key or j >= n or text[j] != "=" or j + 1 >= n or text[j + 1] != '"':
            raise MetricsParseError(f"line {lineno}: malformed label set")
        i = j + 2
        value = []
        while i < n and text[i] != '"':
            if text[i] == "\\" and i + 1 < n:
                nxt = text[i + 1]
                value.append({"n": "\n", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
                i += 2
            else:
                value.append(text[i])
                i += 1
        if i >= n:
            raise MetricsParseError(f"line {lineno}: unterminated label value")
        labels.append((key, "".join(value)))
        i += 1


def parse_prometheus(text: str) -> MetricsSnapshot:
    """Parse the Prometheus text format (comments and ``# HELP``/``# TYPE`` skipped)."""
    samples = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        i = 0
        while i < len(line) and line[i] not in "{ \t":
            i += 1
        name = line[:i]
        if not name:
            raise MetricsParseError(f"line {lineno}: no metric name")
        labels: tuple[tuple[str, str], ...] = ()
        rest = line[i:]
        if rest.startswith("{"):
            labels, end = _parse_labels(rest, lineno)
            rest = rest[end:]
        parts = rest.split()
        if not parts:
            raise MetricsParseError(f"line {lineno}: {name} has no value")
        try:
            value = float(parts[0])  # accepts NaN, +Inf, -Inf
        except ValueError:
            raise MetricsParseError(f"line {lineno}: bad value {parts[0]!r}") from None
        samples.append(Sample(name, labels, value))
    return MetricsSnapshot(samples)


def scrape(client: ServerClient) -> MetricsSnapshot:
    """``GET /metrics`` and parse it."""
    body = client.get("/metrics", timeout=30.0)
    if not isinstance(body, str):
        raise MetricsParseError(
            "GET /metrics did not return Prometheus text "
            "(is the server started with --enable-metrics?)"
        )
    return parse_prometheus(body)


def _deltas(
    before: MetricsSnapshot, after: MetricsSnapshot, name: str, key: str
) -> dict[str, float]:
    """Growth of counter ``name`` between the scrapes, per value of its label ``key`` (no
    entry: absent after the window)."""
    prev = before.by_label(name, key)
    return {k: v - prev.get(k, 0.0) for k, v in after.by_label(name, key).items()}


def _differs(ours: float, theirs: float, tolerance: float, floor: float) -> bool:
    return abs(ours - theirs) > max(floor, tolerance * max(abs(ours), abs(theirs)))


def cross_check(
    before: MetricsSnapshot,
    after: MetricsSnapshot,
    records: Sequence[StepRecord],
    *,
    wall_s: float | None = None,
    tolerance: float = 0.15,
    rank: int = 0,
) -> list[str]:
    """Disagreements between SGLang's metrics and our records, as readable lines.

    ``records``: our decode-step records of the window between the two scrapes (all
    requests). ``wall_s``: the window's wall time, to compare occupancy. Only records of
    ``rank`` are used (SGLang's metrics come from its stats-logging rank). An empty list
    means everything that could be compared agreed; metrics that are absent, and
    comparisons that would differ only because SGLang times a path differently (see
    :func:`forward_time_mismatch`), are said so instead.
    """
    recs = [r for r in records if r.rank == rank and r.mode == "decode"]
    out = _graph_passes(before, after, recs, tolerance)
    ours_fwd, lines = _forward_time(before, after, recs, tolerance)
    out += lines
    occ = after.total(FWD_OCCUPANCY)
    if occ is None:
        out.append(f"{FWD_OCCUPANCY} is absent (needs SGLANG_ENABLE_METRICS_DEVICE_TIMER=1)")
    elif wall_s and wall_s > 0 and ours_fwd is not None and not math.isnan(occ):
        # SGLang's gauge (percent, over its own last log window) against our
        # forward-phase device time over the window's wall time
        ours_occ = 100.0 * ours_fwd / wall_s
        if _differs(ours_occ, occ, tolerance, 5.0):
            out.append(
                f"forward occupancy: SGLang's gauge says {occ:.1f}% ({FWD_OCCUPANCY}, its "
                f"last log window), our probe gives {ours_occ:.1f}% (forward-phase device "
                f"time {ours_fwd * 1e3:.1f} ms over {wall_s * 1e3:.0f} ms of wall time)"
            )
    return out


def _graph_passes(
    before: MetricsSnapshot, after: MetricsSnapshot, recs: Sequence[StepRecord], tolerance: float
) -> list[str]:
    """Graph replays vs eager target passes, per decode batch."""
    modes = _deltas(before, after, GRAPH_PASSES, "mode")
    if not modes:
        return [f"{GRAPH_PASSES} is absent (server not started with --enable-metrics?)"]
    out = []
    for what, mode, runners, replay, how in (
        ("CUDA-graph", "decode_cuda_graph", TARGET_GRAPH_RUNNERS, True, "replayed a graph"),
        ("eager", "decode_none", TARGET_EAGER_RUNNERS, False, "ran eagerly"),
    ):
        ours = sum(1 for r in recs if _ran(r, runners, replay=replay))
        theirs = modes.get(mode, 0.0)
        if _differs(ours, theirs, tolerance, 1.0):
            out.append(
                f"{what} decode passes: SGLang counted {theirs:.0f} "
                f"({GRAPH_PASSES}{{mode={mode}}}), our probe saw {ours} "
                f"steps whose target forward {how}"
            )
    return out


def _forward_time(
    before: MetricsSnapshot, after: MetricsSnapshot, recs: Sequence[StepRecord], tolerance: float
) -> tuple[float | None, list[str]]:
    """GPU time of forward passes; returns our comparable total (None: not compared)."""
    cats = _deltas(before, after, FORWARD_SECONDS, "category")
    with_dev = [r for r in recs if r.device_ns is not None]
    if not cats:
        return None, [
            f"{FORWARD_SECONDS} is absent (needs --enable-metrics and "
            "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1)"
        ]
    if not with_dev:
        return None, [
            "our records carry no device times (probe ran without CUDA events); "
            "forward GPU time not compared"
        ]
    theirs = sum(v for c, v in cats.items() if c not in PREFILL_CATEGORIES)
    ours_step = sum(r.device_step_ns or 0 for r in with_dev) / 1e9
    if theirs > ours_step * (1 + tolerance) + 1e-3:
        return None, [
            f"forward GPU time: SGLang measured {theirs * 1e3:.1f} ms of decode "
            f"forwards ({FORWARD_SECONDS}), more than the {ours_step * 1e3:.1f} ms of "
            "device time our probe saw for whole steps: the windows do not match "
            "or a forward ran outside the hooked steps"
        ]
    reasons = [why for why in map(forward_time_mismatch, with_dev) if why is not None]
    if reasons:
        return None, [
            f"forward GPU time and occupancy not compared: {len(reasons)} of {len(with_dev)} "
            f"decode steps {reasons[0]}"
        ]
    ours = sum(_forward_ns(r) for r in with_dev) / 1e9
    if _differs(ours, theirs, tolerance, 1e-3):
        phases = "+".join(forward_phases(with_dev[0]))
        return ours, [
            f"forward GPU time: SGLang measured {theirs * 1e3:.1f} ms "
            f"({FORWARD_SECONDS}, decode categories), our probe's {phases} "
            f"device time is {ours * 1e3:.1f} ms (tolerance {tolerance:.0%})"
        ]
    return ours, []


def forward_phases(record: StepRecord) -> tuple[str, ...]:
    """Our phases whose device time SGLang's forward timer covers, for this step."""
    algo = str(record.labels.get("speculative_algorithm", "")).upper()
    return FORWARD_PHASES_BY_ALGORITHM.get(algo, FORWARD_PHASES)


def _forward_ns(record: StepRecord) -> int:
    dev = record.device_ns or {}
    return sum(dev.get(p, 0) for p in forward_phases(record))


def forward_time_mismatch(record: StepRecord) -> str | None:
    """Why SGLang's device timer covers this step's forwards differently from our phases.

    With every forward replayed from a CUDA graph both sides time the same work: SGLang
    times each replay (``target_verify``, ``eagle_draft``, ``eagle_draft_extend``,
    ``frozen_kv_draft``), our ``draft``, ``verify`` and ``kv_commit`` phases contain them.
    On the eager draft path they differ by construction: SGLang files an eager draft
    extend (``DRAFT_EXTEND`` forward mode) under ``extend``, a prefill category, and times
    each eager EAGLE draft forward as ``decode`` but not the top-k/sampling between them.
    DFlash drafts in ``TARGET_VERIFY`` mode, timed as ``target_verify`` graph or eager.
    """
    algo = str(record.labels.get("speculative_algorithm", "")).upper()
    if algo in EAGER_DRAFT_TIMED_ALIKE:
        return None
    eager = sorted(
        name for name, g in record.graphs.items() if g.eager and name.endswith(DRAFT_COUNTER_SUFFIX)
    )
    if not eager:
        return None
    return (
        f"ran draft forwards eagerly ({', '.join(eager)}): SGLang's device timer files an "
        "eager draft extend under 'extend' (a prefill category) and does not time the "
        "sampling between eager draft forwards, so the totals would differ for that reason "
        "alone"
    )


def _ran(record: StepRecord, runners: Sequence[str], *, replay: bool) -> bool:
    # Exact class names: "<Runner>[draft]" counters are the drafter's, not the target's.
    return any(
        name in runners and (g.replay if replay else g.eager) > 0
        for name, g in record.graphs.items()
    )


def summarize(snapshot: MetricsSnapshot) -> dict[str, Any]:
    """The three cross-check metrics of one scrape, for reports."""
    return {
        "cuda_graph_passes": snapshot.by_label(GRAPH_PASSES, "mode"),
        "forward_execution_seconds": snapshot.by_label(FORWARD_SECONDS, "category"),
        "fwd_occupancy": snapshot.total(FWD_OCCUPANCY),
    }


def as_mapping(snapshot: MetricsSnapshot) -> Mapping[str, float]:
    """Flat ``name{labels}`` -> value view (debugging)."""
    return {
        s.name
        + ("{" + ",".join(f'{k}="{v}"' for k, v in s.labels) + "}" if s.labels else ""): s.value
        for s in snapshot.samples
    }
