"""Verdicts: compare a measured case with its baseline, metric by metric.

A metric is ``SLOWER`` (or ``FASTER``) only when its relative change exceeds both the
tolerance and ``Z`` times the noise of the comparison. Both runs measure the same blocks
(the same prompts and layouts, in the same order), so the noise is that of the paired
block ratios: the standard error of the mean log ratio of block ``b`` now to block ``b``
in the baseline. Differences between blocks (a prompt that accepts more tokens, a layout
seed) cancel out; only what varies between runs remains. When the noise is too large to
tell a change of the tolerance's size from no change, the verdict is ``UNSTABLE``, with
the number of steps that would decide. Shares of the step (``unaccounted``) and
utilizations are judged in percentage points (``judging.metrics``).

A judged metric is a frozen ``MetricVerdict``; it serializes itself (``to_json`` /
``from_json``) and can be re-decided at another tolerance by the same rule
(``MetricVerdict.rejudged``), which is what ``specperf calibrate`` does with stored runs.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypedDict

from pytest_specperf.judging.metrics import (
    DISTURBABLE_METRICS,
    MIN_PHASE_SHARE,
    STEP,
    STEP_PER_REF,
    MetricKind,
    device_form,
    is_phase,
    rest_form,
    spec,
)
from pytest_specperf.judging.stats import Summary
from pytest_specperf.probe.phases import ALL_PHASES, PHASES

#: Noise multiplier: a change must exceed Z combined standard errors.
Z = 3.0


class Verdict(str, enum.Enum):
    SAME = "SAME"
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    UNSTABLE = "UNSTABLE"
    NO_BASELINE = "NO_BASELINE"
    INVALID = "INVALID"

    def __str__(self) -> str:
        return self.value


#: Order used to pick the verdict of a case from those of its metrics.
_SEVERITY = {
    Verdict.INVALID: 5,
    Verdict.SLOWER: 4,
    Verdict.UNSTABLE: 3,
    Verdict.FASTER: 2,
    Verdict.SAME: 1,
    Verdict.NO_BASELINE: 0,
}


class Centered(Protocol):
    """What a verdict compares: a center and, when there are blocks, their centers."""

    @property
    def value(self) -> float: ...

    @property
    def blocks(self) -> tuple[float, ...]: ...


def fmt_value(x: float) -> str:
    """8.91, 10.53, 192.0, 0.046: about four significant digits, fixed decimals."""
    if abs(x) < 1:
        return f"{x:.3f}"
    if abs(x) < 100:
        return f"{x:.2f}"
    return f"{x:.1f}"


class MetricVerdictJSON(TypedDict):
    """A judged metric as the JSON report stores it (non-finite numbers as null)."""

    metric: str
    verdict: str
    base: float | None
    now: float | None
    change: float | None
    noise: float | None
    tolerance: float
    unit: str
    share_based: bool
    points_based: bool
    scatter_ratio: float | None
    basis: str | None
    raw_change: float | None
    steps_to_decide: int | None


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _number(x: Any, missing: float) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return missing
    return float(x)


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    verdict: Verdict
    base: float
    now: float
    change: float  # relative change (or percentage points, see share/points_based)
    noise: float  # Z-free combined standard error, in the change's unit
    tolerance: float
    unit: str
    steps_to_decide: int | None = None
    #: judged in percentage points of the step (``unaccounted``)
    share_based: bool = False
    #: what the change was judged relative to (None: the raw value)
    basis: str | None = None
    raw_change: float | None = None
    #: judged in absolute percentage points of a utilization (device busy, SM, DRAM)
    points_based: bool = False
    #: this run's block scatter over the baseline's (see ``disturbance``)
    scatter_ratio: float | None = None

    @property
    def disturbed(self) -> bool:
        return is_disturbed(self.scatter_ratio)

    @property
    def in_points(self) -> bool:
        return self.share_based or self.points_based

    def describe(self) -> str:
        b, n = fmt_value(self.base), fmt_value(self.now)
        if self.points_based:
            return (
                f"{self.metric} {self.change * 100:+.1f} points ({self.base:.1f}% -> "
                f"{self.now:.1f}%, tol {self.tolerance * 100:.0f} points)"
            )
        if self.share_based:
            return (
                f"{self.metric} {self.change * 100:+.1f} pp of step ({b} -> {n} {self.unit}, "
                f"tol {self.tolerance * 100:.0f} pp)"
            )
        text = (
            f"{self.metric} {self.change * 100:+.1f}% ({b} -> {n} {self.unit}, "
            f"tol {self.tolerance * 100:.0f}%, noise +-{self.noise * 100:.1f}%"
        )
        if self.basis and self.raw_change is not None:
            text += f"; judged {self.basis}, raw {self.raw_change * 100:+.1f}%"
        return text + ")"

    def rejudged(self, tolerance: float, *, case_disturbed: bool = False, z: float = Z) -> Verdict:
        """The verdict this comparison gets at ``tolerance``: the rule of ``judge_gate``
        and ``downgrade_disturbed`` applied to the stored change, noise and scatter."""
        higher = spec(self.metric).higher_is_better
        v = decide(self.change, self.noise, tolerance, higher_is_better=higher, z=z)
        disturbed = self.disturbed or (case_disturbed and self.metric in DISTURBABLE_METRICS)
        return _undecided_if_disturbed(v, disturbed)

    def to_json(self) -> MetricVerdictJSON:
        return {
            "metric": self.metric,
            "verdict": self.verdict.value,
            "base": _finite_or_none(self.base),
            "now": _finite_or_none(self.now),
            "change": _finite_or_none(self.change),
            "noise": _finite_or_none(self.noise),
            "tolerance": self.tolerance,
            "unit": self.unit,
            "share_based": self.share_based,
            "points_based": self.points_based,
            "scatter_ratio": _finite_or_none(self.scatter_ratio),
            "basis": self.basis,
            "raw_change": _finite_or_none(self.raw_change),
            "steps_to_decide": self.steps_to_decide,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MetricVerdict:
        """Read a stored judged metric; ``ValueError`` naming the field if it is unusable.

        A null change or noise (a non-finite number when it was written) reads as NaN,
        which ``decide`` treats as undecidable."""
        if not isinstance(d, Mapping) or not isinstance(d.get("metric"), str):
            raise ValueError(f"a judged metric needs a 'metric' name, got {str(d)[:80]}")
        try:
            verdict = Verdict(d.get("verdict", Verdict.SAME.value))
        except ValueError:
            raise ValueError(f"{d['metric']}: unknown verdict {d.get('verdict')!r}") from None
        sr, raw, std = d.get("scatter_ratio"), d.get("raw_change"), d.get("steps_to_decide")
        return cls(
            metric=d["metric"],
            verdict=verdict,
            base=_number(d.get("base"), math.nan),
            now=_number(d.get("now"), math.nan),
            change=_number(d.get("change"), math.nan),
            noise=_number(d.get("noise"), math.nan),
            tolerance=_number(d.get("tolerance"), math.nan),
            unit=str(d.get("unit", "ms")),
            steps_to_decide=std if isinstance(std, int) and not isinstance(std, bool) else None,
            share_based=bool(d.get("share_based")),
            basis=d.get("basis") if isinstance(d.get("basis"), str) else None,
            raw_change=None if raw is None else _number(raw, math.nan),
            points_based=bool(d.get("points_based")),
            scatter_ratio=None if sr is None else _number(sr, math.nan),
        )


@dataclass(frozen=True)
class CaseVerdict:
    verdict: Verdict
    metrics: tuple[MetricVerdict, ...] = ()
    reasons: tuple[str, ...] = ()

    def worst(self, verdict: Verdict) -> list[MetricVerdict]:
        """Metrics with ``verdict``: phases first (the cause), then the rest (the
        symptoms: step, tokens/s), each by the size of the change."""
        ms = [m for m in self.metrics if m.verdict is verdict]
        return sorted(ms, key=lambda m: (m.metric not in ALL_PHASES, -abs(m.change)))

    @property
    def culprit(self) -> str | None:
        """The metric a failing case is blamed on (a phase when one is slower)."""
        slower = self.worst(Verdict.SLOWER)
        return slower[0].metric if slower else None


def paired_noise(base: Summary, now: Summary) -> float:
    """Relative noise of ``now / base`` from paired block centers (see module docstring).

    Falls back to the two runs' independent standard errors when the blocks do not pair.
    """
    k = len(base.blocks)
    if k >= 3 and len(now.blocks) == k and all(b > 0 for b in base.blocks + now.blocks):
        logs = [math.log(n / b) for b, n in zip(base.blocks, now.blocks)]
        return statistics.stdev(logs) / math.sqrt(k)
    return math.hypot(base.rel_se(), now.rel_se())


#: A run whose blocks scatter this many times more than its baseline's was disturbed.
DISTURBED_RATIO = 3.0
#: Fewest blocks per run for comparing scatters: with 6 blocks a 3x ratio arises by chance
#: about 2% of the time, with 8 (32 steps, the default) 0.4%, with 4 already 5%.
MIN_SCATTER_BLOCKS = 6
#: Block scatter below this (log units, 2%) counts as this much, so that ordinary
#: variation does not look like a disturbance (the README's calibration gives the
#: scatter of quiet and disturbed runs).
SCATTER_FLOOR = 0.02
#: Block scatter above this in a baseline means it was recorded on a busy machine.
QUIET_SCATTER = DISTURBED_RATIO * SCATTER_FLOOR


def scatter(blocks: tuple[float, ...]) -> float | None:
    """Standard deviation of the log block centers (about the relative scatter)."""
    if len(blocks) < 3 or any(b <= 0 for b in blocks):
        return None
    return statistics.stdev(math.log(b) for b in blocks)


def disturbance(base: Summary, now: Summary) -> float | None:
    """The current run's block scatter over the baseline's (both floored).

    Both runs measure the same blocks, so their scatter is comparable whatever the
    prompts. A code regression moves the blocks together; a noisy neighbour, a CPU hog
    or the host's memory management moves some blocks more than others. Far above 1 the
    run was disturbed, far below 1 the baseline was: either way the comparison says more
    about the machine than about the code (see ``is_disturbed``).
    """
    if min(len(base.blocks), len(now.blocks)) < MIN_SCATTER_BLOCKS:
        return None  # too few blocks: the ratio of two scatters would itself be noise
    sb, sn = scatter(base.blocks), scatter(now.blocks)
    if sb is None or sn is None:
        return None
    return max(sn, SCATTER_FLOOR) / max(sb, SCATTER_FLOOR)


def is_disturbed(ratio: float | None) -> bool:
    return ratio is not None and (ratio > DISTURBED_RATIO or ratio < 1 / DISTURBED_RATIO)


def _undecided_if_disturbed(verdict: Verdict, disturbed: bool) -> Verdict:
    """SLOWER or FASTER of a disturbed run or case becomes UNSTABLE (the one place)."""
    if disturbed and verdict in (Verdict.SLOWER, Verdict.FASTER):
        return Verdict.UNSTABLE
    return verdict


def _large_phases(metrics: Mapping[str, Summary]) -> list[str]:
    """Phases that take at least ``MIN_PHASE_SHARE`` of the step in ``metrics``."""
    step = metrics.get(STEP)
    if step is None or not step.median:
        return []
    return [
        p for p in PHASES if p in metrics and metrics[p].median / step.median >= MIN_PHASE_SHARE
    ]


def noisiest_phase(metrics: Mapping[str, Summary]) -> tuple[str, float] | None:
    """The phase (judged form) whose blocks scatter most in one run, and that scatter."""
    worst: tuple[str, float] | None = None
    for p in _large_phases(metrics):
        form = metrics.get(rest_form(p))
        sc = scatter(form.blocks) if form is not None else None
        if sc is not None and (worst is None or sc > worst[1]):
            worst = (p, sc)
    return worst


def case_disturbance(base: Mapping[str, Summary], now: Mapping[str, Summary]) -> float | None:
    """The most extreme ``disturbance`` over the phases of a case (judged forms, phases
    that take at least ``MIN_PHASE_SHARE`` of the baseline step), gated or not: the
    case's machine-noise gauge, a ratio like ``disturbance`` (far from 1 = disturbed)."""
    worst: float | None = None
    for p in _large_phases(base):
        form = rest_form(p)
        if form in base and form in now:
            r = disturbance(base[form], now[form])
            if r is not None and (worst is None or max(r, 1 / r) > max(worst, 1 / worst)):
                worst = r
    return worst


def downgrade_disturbed(
    metrics: Sequence[MetricVerdict], case_ratio: float | None
) -> list[MetricVerdict]:
    """In a case whose phases scatter far more (or far less) than the baseline's, a SLOWER
    or FASTER phase or step says more about the machine than about the code: UNSTABLE.

    A CPU hog or the host's memory management can slow one phase in some blocks; the
    other phases, judged against a rest made mostly of the disturbed one, then move too,
    without scattering. ``unaccounted`` (points of the step), accept length and
    utilizations keep their own verdicts."""
    if not is_disturbed(case_ratio):
        return list(metrics)
    out = []
    for m in metrics:
        if m.metric not in DISTURBABLE_METRICS:
            out.append(m)
            continue
        v = _undecided_if_disturbed(m.verdict, True)
        steps = None if v is not m.verdict else m.steps_to_decide
        ratio = m.scatter_ratio if m.disturbed else case_ratio
        out.append(replace(m, verdict=v, steps_to_decide=steps, scatter_ratio=ratio))
    return out


def case_disturbed(judged: Sequence[MetricVerdict]) -> bool:
    """Whether a judged case was disturbed: ``downgrade_disturbed`` leaves the case's
    ratio on each metric it applies to."""
    return any(m.metric in DISTURBABLE_METRICS and m.disturbed for m in judged)


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    return max(verdicts, key=lambda v: _SEVERITY[v]) if verdicts else Verdict.SAME


def decide(
    change: float,
    noise: float,
    tolerance: float,
    *,
    higher_is_better: bool = False,
    z: float = Z,
) -> Verdict:
    """The one verdict rule, for relative, share and points changes alike.

    SLOWER/FASTER when the change exceeds both the tolerance and ``z`` times the noise;
    UNSTABLE when the noise band (``z * noise``) is wider than the tolerance, so that a
    change of the tolerance's size could not be told from none, or when the change or
    the noise cannot be estimated; SAME otherwise. No change at all is SAME whatever the
    noise.
    """
    if change == 0:
        return Verdict.SAME
    if math.isnan(change) or not math.isfinite(noise):
        return Verdict.UNSTABLE
    worse = -change if higher_is_better else change
    if abs(change) > tolerance and abs(change) > z * noise:
        return Verdict.SLOWER if worse > 0 else Verdict.FASTER
    if z * noise > tolerance:
        return Verdict.UNSTABLE
    return Verdict.SAME


def steps_to_decide(
    n: int, change: float, noise: float, tolerance: float, z: float = Z
) -> int | None:
    """Steps that would shrink the noise band to the tolerance (or to the change, if
    larger), since the noise of a median over blocks shrinks as 1/sqrt(steps)."""
    target = max(tolerance, abs(change)) if math.isfinite(change) else tolerance
    if not math.isfinite(noise) or target <= 0:
        return None
    return math.ceil(n * (z * noise / target) ** 2)


def _verdict(
    metric: str, change: float, noise: float, tolerance: float, n: int, z: float
) -> tuple[Verdict, int | None]:
    v = decide(change, noise, tolerance, higher_is_better=spec(metric).higher_is_better, z=z)
    steps = steps_to_decide(n, change, noise, tolerance, z) if v is Verdict.UNSTABLE else None
    return v, steps


def judge_metric(
    metric: str, base: Summary, now: Summary, tolerance: float, *, z: float = Z
) -> MetricVerdict:
    """Relative-change verdict for one metric or derived form (times: lower is better)."""
    if base.value == 0:
        change = 0.0 if now.value == 0 else math.inf
    else:
        change = now.value / base.value - 1.0
    noise = paired_noise(base, now)
    ratio = disturbance(base, now)
    higher = spec(metric).higher_is_better
    verdict = decide(change, noise, tolerance, higher_is_better=higher, z=z)
    # the machine, not the code, moved a disturbed run
    verdict = _undecided_if_disturbed(verdict, is_disturbed(ratio))
    steps = (
        steps_to_decide(now.n, change, noise, tolerance, z) if verdict is Verdict.UNSTABLE else None
    )
    unit = spec(metric).unit
    return MetricVerdict(
        metric, verdict, base.value, now.value, change, noise, tolerance, unit, steps,
        scatter_ratio=ratio,
    )  # fmt: skip


def _paired_point_noise(base: Sequence[float], now: Sequence[float]) -> float | None:
    """Standard error of the mean paired difference of per-block values, or None."""
    k = len(base)
    if k < 3 or len(now) != k:
        return None
    return statistics.stdev([n - b for b, n in zip(base, now)]) / math.sqrt(k)


def _block_shares(part: Summary, whole: Summary) -> list[float] | None:
    if len(part.blocks) != len(whole.blocks):
        return None
    return [m / s if s else 0.0 for m, s in zip(part.blocks, whole.blocks)]


def judge_share(
    metric: str,
    base: Summary,
    now: Summary,
    base_step: Summary,
    now_step: Summary,
    tolerance: float,
    *,
    z: float = Z,
) -> MetricVerdict:
    """Verdict on ``metric``'s share of the step (percentage points), e.g. unaccounted.

    The noise is that of the paired per-block shares when both runs have the same blocks.
    """
    b = base.median / base_step.median if base_step.median else 0.0
    n = now.median / now_step.median if now_step.median else 0.0
    change = n - b
    bs, ns = _block_shares(base, base_step), _block_shares(now, now_step)
    noise = _paired_point_noise(bs, ns) if bs is not None and ns is not None else None
    if noise is None:
        noise = math.hypot(base.rel_se() * b, now.rel_se() * n) if b or n else 0.0
    verdict, steps = _verdict(metric, change, noise, tolerance, now.n, z)
    return MetricVerdict(
        metric, verdict, base.median, now.median, change, noise, tolerance, "ms", steps,
        share_based=True,
    )  # fmt: skip


def judge_points(
    metric: str, base: Centered, now: Centered, tolerance: float, n: int, *, z: float = Z
) -> MetricVerdict:
    """A utilization (higher is better) judged on its change in percentage points.

    ``tolerance`` 0.05 allows a drop of 5 points. Utilizations are bounded, so a relative
    rule would fire on 2% -> 1%; points do not. The noise is that of paired blocks when
    both runs have them (device-busy share); NVML/GPM utilization is one median per run,
    judged against the tolerance alone.
    """
    scale = spec(metric).to_percent
    b, now_pct = base.value * scale, now.value * scale
    change = (now_pct - b) / 100.0  # in fractions of 100 points: -0.12 is a 12-point drop
    paired = _paired_point_noise(
        [x * scale / 100 for x in base.blocks], [x * scale / 100 for x in now.blocks]
    )
    noise = paired if paired is not None else 0.0
    verdict, steps = _verdict(metric, change, noise, tolerance, n, z)
    return MetricVerdict(
        metric, verdict, b, now_pct, change, noise, tolerance, "%", steps, points_based=True
    )


#: Chosen from ``specperf calibrate`` on the 2-core development box (README, "Why these
#: statistics and defaults"); on a GPU, calibrate there and set the ini values.
DEFAULT_TOLERANCE = 0.07
DEFAULT_STEP_TOLERANCE = 0.25


def parse_fraction(text: str) -> float:
    """``0.08``, ``8%`` -> 0.08; ``ValueError`` unless it lies in (0, 1)."""
    s = text.strip()
    value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    if not (0.0 < value < 1.0):
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class Tolerances:
    """Allowed change: ``phase`` for phases judged against the rest of their step
    (drift cancels out, so it can be tight), accept length and the points-judged metrics;
    ``step`` for the step time and tokens/s, which carry the machine's drift."""

    phase: float
    step: float

    def of(self, metric: str) -> float:
        return self.step if spec(metric).tolerance == "step" else self.phase

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> Tolerances | None:
        """Read back ``to_json``; None unless every tolerance is a fraction in (0, 1)."""
        if not isinstance(d, Mapping):
            return None
        values = {f.name: d.get(f.name) for f in dataclasses.fields(cls)}
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1
            for v in values.values()
        ):
            return None
        return cls(**{k: float(v) for k, v in values.items()})  # type: ignore[arg-type]


def judged_form(metric: str) -> tuple[str, str | None]:
    """The drift-free form a gate is judged on, and how to say so.

    A phase is judged relative to the other named phases of its own step: a slower
    machine slows them alike, an injected or real slowdown of the phase does not. The
    step is judged relative to the time the server took to read the request's KV through
    its page table (same memory, same layout), when the backend reports it. Everything
    else is judged as it is.
    """
    if is_phase(metric):
        return rest_form(metric), "against the rest of the step"
    if metric == STEP:
        return STEP_PER_REF, "against the request's KV read time"
    return metric, None


def _judge_form(
    metric: str, base: Mapping[str, Summary], now: Mapping[str, Summary], tolerance: float
) -> MetricVerdict:
    """Judge a time on its drift-free form when both runs have it, else as it is."""
    b, n = base[metric], now[metric]
    form, basis = judged_form(metric)
    device = device_form(metric)
    if basis is not None and rest_form(device) in base and rest_form(device) in now:
        # On a GPU a phase's host time includes waits for earlier GPU work: judge its
        # device time (CUDA events around the phase on the stream) instead.
        form, basis = rest_form(device), "on device time, against the rest of the step"
        b, n = base[device], now[device]
    if basis is None or form not in base or form not in now:
        return judge_metric(metric, b, n, tolerance)
    mv = judge_metric(form, base[form], now[form], tolerance)
    raw = n.value / b.value - 1.0 if b.value else math.inf
    return replace(mv, metric=metric, basis=basis, base=b.value, now=n.value, raw_change=raw)


def judge_gate(
    metric: str,
    base: Mapping[str, Summary],
    now: Mapping[str, Summary],
    tolerances: Tolerances,
    *,
    base_util: Mapping[str, Centered] | None = None,
    now_util: Mapping[str, Centered] | None = None,
) -> MetricVerdict | None:
    """Judge one gated metric; ``None`` if either run lacks it.

    ``base`` and ``now`` are the summaries of the baseline and of the run;
    ``base_util`` / ``now_util`` their telemetry utilizations (one median per run)."""
    tolerance = tolerances.of(metric)
    kind = spec(metric).kind
    if kind is MetricKind.UTILIZATION:
        b = base.get(metric) or (base_util or {}).get(metric)
        n = now.get(metric) or (now_util or {}).get(metric)
        if b is None or n is None:
            return None
        steps = now[metric].n if metric in now else 1
        return judge_points(metric, b, n, tolerance, steps)
    if metric not in base or metric not in now:
        return None
    if kind is MetricKind.SHARE:
        return judge_share(metric, base[metric], now[metric], base[STEP], now[STEP], tolerance)
    return _judge_form(metric, base, now, tolerance)
