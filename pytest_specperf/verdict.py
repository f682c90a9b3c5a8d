"""Verdicts: compare a measured case with its baseline, metric by metric.

A metric is ``SLOWER`` (or ``FASTER``) only when its relative change exceeds both the
tolerance and ``Z`` times the noise of the comparison. Both runs measure the same blocks
(the same prompts and layouts, in the same order), so the noise is that of the paired
block ratios: the standard error of the mean log ratio of block ``b`` now to block ``b``
in the baseline. Differences between blocks (a prompt that accepts more tokens, a layout
seed) cancel out; only what varies between runs remains. When the noise is too large to tell
a change of the tolerance's size from no change, the verdict is ``UNSTABLE``, with the
number of steps that would decide. ``unaccounted`` is judged on its share of the step
(percentage points), since its baseline is often near zero.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass, field

from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED
from pytest_specperf.stats import Summary

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

#: Metrics where a larger value is better.
HIGHER_IS_BETTER = frozenset({"accept_len", "tokens_per_s", "device_busy"})


def fmt_value(x: float) -> str:
    """8.91, 10.53, 192.0, 0.046: about four significant digits, fixed decimals."""
    if abs(x) < 1:
        return f"{x:.3f}"
    if abs(x) < 100:
        return f"{x:.2f}"
    return f"{x:.1f}"


@dataclass
class MetricVerdict:
    metric: str
    verdict: Verdict
    base: float
    now: float
    change: float  # relative change (or percentage points of the step for unaccounted)
    noise: float  # Z-free combined relative standard error
    tolerance: float
    unit: str
    steps_to_decide: int | None = None
    share_based: bool = False
    #: what the change was judged relative to (None: the raw value)
    basis: str | None = None
    raw_change: float | None = None

    def describe(self) -> str:
        b, n = fmt_value(self.base), fmt_value(self.now)
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


@dataclass
class CaseVerdict:
    verdict: Verdict
    metrics: list[MetricVerdict] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def worst(self, verdict: Verdict) -> list[MetricVerdict]:
        """Metrics with ``verdict``: phases first (the cause), then the rest (the
        symptoms: step, tokens/s), each by the size of the change."""
        ms = [m for m in self.metrics if m.verdict is verdict]
        return sorted(ms, key=lambda m: (m.metric not in ALL_PHASES, -abs(m.change)))


def paired_noise(base: Summary, now: Summary) -> float:
    """Relative noise of ``now / base`` from paired block centers (see module docstring).

    Falls back to the two runs' independent standard errors when the blocks do not pair.
    """
    k = len(base.blocks)
    if k >= 3 and len(now.blocks) == k and all(b > 0 for b in base.blocks + now.blocks):
        logs = [math.log(n / b) for b, n in zip(base.blocks, now.blocks)]
        return statistics.stdev(logs) / math.sqrt(k)
    return math.hypot(base.rel_se(), now.rel_se())


def combine(verdicts: list[Verdict]) -> Verdict:
    return max(verdicts, key=lambda v: _SEVERITY[v]) if verdicts else Verdict.SAME


def judge_metric(
    metric: str,
    base: Summary,
    now: Summary,
    tolerance: float,
    *,
    unit: str = "ms",
    z: float = Z,
) -> MetricVerdict:
    """Relative-change verdict for one metric (times: lower is better)."""
    higher_better = metric in HIGHER_IS_BETTER
    if base.value == 0:
        change = 0.0 if now.value == 0 else math.inf
    else:
        change = now.value / base.value - 1.0
    noise = paired_noise(base, now)
    worse = -change if higher_better else change
    threshold = z * noise
    steps = None
    if abs(change) > tolerance and abs(change) > threshold:
        verdict = Verdict.SLOWER if worse > 0 else Verdict.FASTER
    elif threshold > tolerance:
        verdict = Verdict.UNSTABLE
        # Noise shrinks with the square root of the steps: how many steps would make the
        # noise band as narrow as the tolerance (or the observed change, if larger).
        target = max(tolerance, abs(change)) if math.isfinite(change) else tolerance
        if math.isfinite(noise) and target > 0:
            steps = math.ceil(now.n * (threshold / target) ** 2)
    else:
        verdict = Verdict.SAME
    return MetricVerdict(
        metric, verdict, base.value, now.value, change, noise, tolerance, unit, steps
    )


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
    """Verdict on ``metric``'s share of the step (percentage points), e.g. unaccounted."""
    b = base.median / base_step.median if base_step.median else 0.0
    n = now.median / now_step.median if now_step.median else 0.0
    change = n - b
    # noise of the share, in points: the metric's own absolute spread over the step
    noise = math.hypot(base.rel_se() * b, now.rel_se() * n) if b or n else 0.0
    if not math.isfinite(noise):
        noise = 0.0
    if change > tolerance and change > z * noise:
        verdict = Verdict.SLOWER
    elif change < -tolerance and -change > z * noise:
        verdict = Verdict.FASTER
    else:
        verdict = Verdict.SAME
    return MetricVerdict(
        metric,
        verdict,
        base.median,
        now.median,
        change,
        noise,
        tolerance,
        "ms",
        None,
        share_based=True,
    )


#: Units of the metrics that are not times.
UNITS = {"accept_len": "tok/step", "tokens_per_s": "tok/s", "device_busy": "share"}


@dataclass(frozen=True)
class Tolerances:
    """Allowed relative change: ``phase`` for phases judged against the rest of their
    step (drift cancels out, so it can be tight), accept length and the unaccounted share
    (percentage points); ``step`` for raw step time and tokens/s, which carry the
    machine's drift between runs."""

    phase: float
    step: float

    def of(self, metric: str) -> float:
        return self.step if metric in RAW_TIME_METRICS else self.phase


#: Metrics judged as raw times or rates (with the step tolerance).
RAW_TIME_METRICS = frozenset({"step", "tokens_per_s"})


def judged_form(metric: str) -> tuple[str, str | None]:
    """The drift-free form a gate is judged on, and how to say so.

    A phase is judged relative to the other named phases of its own step: a slower
    machine slows them alike, an injected or real slowdown of the phase does not.
    Everything else is judged as it is.
    """
    if metric in PHASES:
        return f"{metric}/rest", "against the rest of the step"
    return metric, None


def judge_gate(
    metric: str, base: dict[str, Summary], now: dict[str, Summary], tolerances: Tolerances
) -> MetricVerdict | None:
    """Judge one gated metric; ``None`` if either run lacks it."""
    b, n = base.get(metric), now.get(metric)
    if b is None or n is None:
        return None
    tolerance = tolerances.of(metric)
    if metric == UNACCOUNTED:
        return judge_share(metric, b, n, base["step"], now["step"], tolerance)
    unit = UNITS.get(metric, "ms")
    form, basis = judged_form(metric)
    if basis is None or form not in base or form not in now:
        return judge_metric(metric, b, n, tolerance, unit=unit)
    mv = judge_metric(form, base[form], now[form], tolerance, unit=unit)
    mv.metric, mv.basis = metric, basis
    mv.base, mv.now = b.value, n.value
    mv.raw_change = n.value / b.value - 1.0 if b.value else math.inf
    return mv
