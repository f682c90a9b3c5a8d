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
from typing import Any

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
    #: judged in absolute percentage points of a utilization (device busy, SM, DRAM)
    points_based: bool = False
    #: this run's block scatter over the baseline's (see ``disturbance``)
    scatter_ratio: float | None = None

    @property
    def disturbed(self) -> bool:
        return is_disturbed(self.scatter_ratio)

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


#: A run whose blocks scatter this many times more than its baseline's was disturbed.
DISTURBED_RATIO = 3.0
#: Fewest blocks per run for comparing scatters: with 6 blocks a 3x ratio arises by chance
#: about 2% of the time, with 8 (32 steps, the default) 0.4%, with 4 already 5%.
MIN_SCATTER_BLOCKS = 6
#: Block scatter below this (log units, 2%) counts as this much, so that ordinary
#: variation does not look like a disturbance: on the 2-core development box the judged
#: phases scatter 1.6% (median) to 4% (90th percentile) between blocks in quiet runs, and
#: 13-22% while the host's memory management disturbs a fragmented 131k-token case.
SCATTER_FLOOR = 0.02


def scatter(blocks: tuple[float, ...]) -> float | None:
    """Standard deviation of the log block centers (about the relative scatter)."""
    if len(blocks) < 3 or any(b <= 0 for b in blocks):
        return None
    return statistics.stdev(math.log(b) for b in blocks)


def disturbance(base: Summary, now: Summary) -> float | None:
    """The current run's block scatter over the baseline's (both floored at 1%).

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


#: Block scatter above this in a baseline means it was recorded on a busy machine.
QUIET_SCATTER = DISTURBED_RATIO * SCATTER_FLOOR


def is_disturbed(ratio: float | None) -> bool:
    return ratio is not None and (ratio > DISTURBED_RATIO or ratio < 1 / DISTURBED_RATIO)


def _undecided_if_disturbed(verdict: Verdict, disturbed: bool) -> Verdict:
    """SLOWER or FASTER of a disturbed run or case becomes UNSTABLE (the one place)."""
    if disturbed and verdict in (Verdict.SLOWER, Verdict.FASTER):
        return Verdict.UNSTABLE
    return verdict


def noisiest_phase(metrics: dict[str, Summary]) -> tuple[str, float] | None:
    """The phase (judged form) whose blocks scatter most in one run, and that scatter."""
    step = metrics.get("step")
    worst: tuple[str, float] | None = None
    for p in PHASES:
        b, form = metrics.get(p), metrics.get(f"{p}/rest")
        if step is None or b is None or form is None or not step.median:
            continue
        if b.median / step.median < 0.05:
            continue
        sc = scatter(form.blocks)
        if sc is not None and (worst is None or sc > worst[1]):
            worst = (p, sc)
    return worst


def case_disturbance(base: dict[str, Summary], now: dict[str, Summary]) -> float | None:
    """The most extreme ``disturbance`` over the phases of a case (judged forms, phases
    that are at least 5% of the baseline step), gated or not: the case's machine-noise
    gauge. Returned as a ratio like ``disturbance`` (far from 1 either way = disturbed)."""
    step = base.get("step")
    worst: float | None = None
    for p in PHASES:
        b = base.get(p)
        if step is None or b is None or not step.median or b.median / step.median < 0.05:
            continue
        form = f"{p}/rest"
        if form in base and form in now:
            r = disturbance(base[form], now[form])
            if r is not None and (worst is None or max(r, 1 / r) > max(worst, 1 / worst)):
                worst = r
    return worst


#: Metrics that add up the phases: when the phases show a disturbed run, so do these.
COMPOSITE_METRICS = frozenset({"step", "tokens_per_s"})
#: Metrics a disturbed case cannot judge: the named phases (each judged against the rest
#: of its step, so a disturbance of one phase moves the others' ratios too) and the
#: composites. ``unaccounted`` (points of the step), accept length and utilizations keep
#: their own verdicts.
DISTURBABLE_METRICS = COMPOSITE_METRICS | frozenset(PHASES)


def downgrade_disturbed(metrics: list[MetricVerdict], case_ratio: float | None) -> None:
    """In a case whose phases scatter far more (or far less) than the baseline's, a SLOWER
    or FASTER phase or step says more about the machine than about the code: UNSTABLE.

    On the 2-core development box a CPU hog or the host's memory management can slow one
    phase of a 131k-token fragmented case by 30-50% in some blocks; the other phase, judged
    against a rest made mostly of the disturbed one, then moves too, without scattering."""
    if not is_disturbed(case_ratio):
        return
    for m in metrics:
        if m.metric not in DISTURBABLE_METRICS:
            continue
        undecided = _undecided_if_disturbed(m.verdict, True)
        if undecided is not m.verdict:
            m.verdict, m.steps_to_decide = undecided, None
        if not m.disturbed:
            m.scatter_ratio = case_ratio


def stored_case_disturbed(judged: list[dict[str, Any]]) -> bool:
    """Whether a case as stored in the JSON report (its judged metrics) was disturbed:
    ``downgrade_disturbed`` leaves the case's ratio on each metric it applies to."""
    return any(
        m.get("metric") in DISTURBABLE_METRICS
        and isinstance(m.get("scatter_ratio"), (int, float))
        and is_disturbed(float(m["scatter_ratio"]))
        for m in judged
    )


def combine(verdicts: list[Verdict]) -> Verdict:
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
    change of the tolerance's size could not be told from none, or when the noise cannot
    be estimated; SAME otherwise. No change at all is SAME whatever the noise.
    """
    if change == 0:
        return Verdict.SAME
    if not math.isfinite(noise):
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
    if base.value == 0:
        change = 0.0 if now.value == 0 else math.inf
    else:
        change = now.value / base.value - 1.0
    noise = paired_noise(base, now)
    verdict = decide(change, noise, tolerance, higher_is_better=metric in HIGHER_IS_BETTER, z=z)
    ratio = disturbance(base, now)
    # the machine, not the code, moved a disturbed run
    verdict = _undecided_if_disturbed(verdict, is_disturbed(ratio))
    steps = (
        steps_to_decide(now.n, change, noise, tolerance, z) if verdict is Verdict.UNSTABLE else None
    )
    mv = MetricVerdict(
        metric, verdict, base.value, now.value, change, noise, tolerance, unit, steps
    )
    mv.scatter_ratio = ratio
    return mv


def _paired_point_noise(base: list[float], now: list[float]) -> float | None:
    """Standard error of the mean paired difference of per-block values, or None."""
    k = len(base)
    if k < 3 or len(now) != k:
        return None
    return statistics.stdev([n - b for b, n in zip(base, now)]) / math.sqrt(k)


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
    noise: float | None = None
    if len(base.blocks) == len(base_step.blocks) and len(now.blocks) == len(now_step.blocks):
        noise = _paired_point_noise(
            [m / s if s else 0.0 for m, s in zip(base.blocks, base_step.blocks)],
            [m / s if s else 0.0 for m, s in zip(now.blocks, now_step.blocks)],
        )
    if noise is None:
        noise = math.hypot(base.rel_se() * b, now.rel_se() * n) if b or n else 0.0
    verdict = decide(change, noise, tolerance, z=z)
    steps = (
        steps_to_decide(now.n, change, noise, tolerance, z) if verdict is Verdict.UNSTABLE else None
    )
    return MetricVerdict(
        metric,
        verdict,
        base.median,
        now.median,
        change,
        noise,
        tolerance,
        "ms",
        steps,
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
    machine slows them alike, an injected or real slowdown of the phase does not. The
    step is judged relative to the time the server took to read the request's KV through
    its page table (same memory, same layout, plain torch), when the backend reports it.
    Everything else is judged as it is.
    """
    if metric in PHASES:
        return f"{metric}/rest", "against the rest of the step"
    if metric == "step":
        return "step/ref", "against the request's KV read time"
    return metric, None


#: Utilizations judged as drops in absolute percentage points, with their scale to percent.
POINT_METRICS = {
    "device_busy": 100.0,
    "util.sm": 1.0,
    "util.dram": 1.0,
    "util.tensor": 1.0,
    "util.gpu": 1.0,
}


def judge_points(
    metric: str, base: Summary, now: Summary, tolerance: float, *, z: float = Z
) -> MetricVerdict:
    """A utilization (higher is better) judged on its change in percentage points.

    ``tolerance`` 0.05 allows a drop of 5 points. Utilizations are bounded, so a relative
    rule would fire on 2% -> 1%; points do not. The noise is that of paired blocks when
    both runs have them (device-busy share); NVML/GPM utilization is one median per run,
    judged against the tolerance alone.
    """
    scale = POINT_METRICS.get(metric, 1.0)
    b, n = base.value * scale, now.value * scale
    change = (n - b) / 100.0  # in fractions of 100 points: -0.12 is a 12-point drop
    paired = _paired_point_noise(
        [x * scale / 100 for x in base.blocks], [x * scale / 100 for x in now.blocks]
    )
    noise = paired if paired is not None else 0.0
    verdict = decide(change, noise, tolerance, higher_is_better=True, z=z)
    steps = (
        steps_to_decide(now.n, change, noise, tolerance, z) if verdict is Verdict.UNSTABLE else None
    )
    return MetricVerdict(
        metric, verdict, b, n, change, noise, tolerance, "%", steps, points_based=True
    )


def stored_verdict(
    metric: dict[str, Any], tolerance: float, z: float = Z, *, case_disturbed: bool = False
) -> Verdict:
    """The verdict of a judged metric as stored in the JSON report (``change``, ``noise``,
    ``share_based``, ``points_based``, ``scatter_ratio``) at ``tolerance``: the same rule
    as ``judge_metric`` and ``downgrade_disturbed`` (``case_disturbed``: see
    ``stored_case_disturbed``)."""
    higher = bool(metric.get("points_based")) or (
        not metric.get("share_based") and metric["metric"] in HIGHER_IS_BETTER
    )
    v = decide(
        float(metric["change"]), float(metric["noise"]), tolerance, higher_is_better=higher, z=z
    )
    ratio = metric.get("scatter_ratio")
    disturbed = isinstance(ratio, (int, float)) and is_disturbed(float(ratio))
    if case_disturbed and metric["metric"] in DISTURBABLE_METRICS:
        disturbed = True
    return _undecided_if_disturbed(v, disturbed)


def would_be_slower(
    metric: dict[str, Any], tolerance: float, z: float = Z, *, case_disturbed: bool = False
) -> bool:
    """Whether a stored judged metric would be SLOWER at ``tolerance`` (``stored_verdict``)."""
    return stored_verdict(metric, tolerance, z, case_disturbed=case_disturbed) is Verdict.SLOWER


def judge_gate(
    metric: str, base: dict[str, Summary], now: dict[str, Summary], tolerances: Tolerances
) -> MetricVerdict | None:
    """Judge one gated metric; ``None`` if either run lacks it."""
    b, n = base.get(metric), now.get(metric)
    if b is None or n is None:
        return None
    tolerance = tolerances.of(metric)
    if metric in POINT_METRICS:
        return judge_points(metric, b, n, tolerance)
    if metric == UNACCOUNTED:
        return judge_share(metric, b, n, base["step"], now["step"], tolerance)
    unit = UNITS.get(metric, "ms")
    form, basis = judged_form(metric)
    device = f"device.{metric}"
    if basis is not None and f"{device}/rest" in base and f"{device}/rest" in now:
        # On a GPU a phase's host time includes waits for earlier GPU work: judge its
        # device time (CUDA events around the phase on the stream) instead.
        form, basis = f"{device}/rest", "on device time, against the rest of the step"
        b, n = base[device], now[device]
    if basis is None or form not in base or form not in now:
        return judge_metric(metric, b, n, tolerance, unit=unit)
    mv = judge_metric(form, base[form], now[form], tolerance, unit=unit)
    mv.metric, mv.basis = metric, basis
    mv.base, mv.now = b.value, n.value
    mv.raw_change = n.value / b.value - 1.0 if b.value else math.inf
    return mv
