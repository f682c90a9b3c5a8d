"""Verdicts: compare a measured case with its baseline, metric by metric.

A metric is ``SLOWER`` (or ``FASTER``) only when its relative change exceeds both the
tolerance and a critical multiple of the noise of the comparison: Student's t on the
noise's degrees of freedom, at the level the run's false-alarm budget leaves the gate
(``judging.significance``). Both runs measure the same blocks
(the same prompts and layouts, in the same order), so the noise is that of the paired
block ratios: the standard error of the mean log ratio of block ``b`` now to block ``b``
in the baseline. Differences between blocks (a prompt that accepts more tokens, a layout
seed) cancel out; only what varies between runs remains. When the noise is too large to
tell a change of the tolerance's size from no change, the verdict is ``UNSTABLE``, with
the number of steps that would decide. Shares of the step (``unaccounted``) and
utilizations are judged in percentage points (``judging.metrics``).

A baseline may hold several runs of a case (one per server process) and a measurement
may span several processes and several rounds of the same blocks: the noise then adds
the between-process and between-sitting components estimated from the runs
(``judging.noise``: random-effects estimates pooled with the device's prior, never with
the tolerance), so a case whose runs agree gets a narrow band and one whose runs disagree
a wide one.

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
    ACCEPT_LEN,
    DISTURBABLE_METRICS,
    MIN_PHASE_SHARE,
    STEP,
    STEP_PER_REF,
    TOKENS_PER_REF,
    TOKENS_PER_S,
    MetricKind,
    device_form,
    is_phase,
    rest_form,
    spec,
)
from pytest_specperf.judging.noise import (
    MIN_PAIRED_BLOCKS,
    NO_PRIOR,
    PROVISIONAL_PRIOR,
    DevicePrior,
    Noise,
    RunBlocks,
    relative_noise,
)
from pytest_specperf.judging.significance import LONE, critical, log_stat
from pytest_specperf.judging.stats import Summary, center_of_centers
from pytest_specperf.probe.phases import ALL_PHASES, PHASES

#: The noise multiplier of reports written before the critical value was Student's t at
#: the gate's level (``MetricVerdict.critical`` reads as this when a report lacks it).
Z = 3.0
#: A lone comparison's gate level (one gate, one case, one look): see ``significance``.
LONE_ALPHA = LONE.gate_alpha(1)


class Verdict(str, enum.Enum):
    SAME = "SAME"
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    UNSTABLE = "UNSTABLE"
    NO_BASELINE = "NO_BASELINE"
    INVALID = "INVALID"

    def __str__(self) -> str:
        return self.value


def verdict_label(verdict: Verdict, *, over_budget: bool, recorded: bool = False) -> str:
    """A case's verdict as every report names it: ``OVER_BUDGET (SAME)`` where a budget
    failed the test whatever the comparison said, ``NO_BASELINE (recorded)`` for a
    recording (``recorded``)."""
    text = verdict.value + (" (recorded)" if recorded else "")
    return f"OVER_BUDGET ({text})" if over_budget else text


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


def _fmt_judged(x: float) -> str:
    """A judged ratio (``verify/rest`` 3.20, ``tokens/ref`` 0.5175): four digits below 1."""
    return f"{x:.4f}" if abs(x) < 1 else fmt_value(x)


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
    block_scatter: float | None
    basis: str | None
    raw_change: float | None
    steps_to_decide: int | None
    within: float | None
    between: float | None
    between_hat2: float | None
    between_runs: int
    floor: float | None
    base_runs: int
    now_runs: int
    history_runs: int
    rounds: int
    processes_to_decide: int | None
    judged_base: float | None
    judged_now: float | None
    critical: float | None
    df: float | None
    alpha: float | None
    sitting: float | None
    sitting_coef: float | None
    sittings: int
    mirror_of: str | None
    exact_runs: int | None
    ab_sides: bool


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
    #: the largest block scatter of the runs compared (log units, ``largest_scatter``): how
    #: far a disturbance could have moved a center (``beyond_disturbance``)
    block_scatter: float | None = None
    #: the noise's parts (``judging.noise``): paired block noise, between-process
    #: standard deviation (after the prior), its raw estimate and the runs behind it,
    #: and the noise that more steps cannot lower
    within: float | None = None
    between: float | None = None
    between_hat2: float | None = None
    between_runs: int = 1
    floor: float | None = None
    #: runs compared: the baseline's, this measurement's, history runs used for ``between``
    base_runs: int = 1
    now_runs: int = 1
    history_runs: int = 0
    #: rounds of the baseline's blocks measured per current run (automatic extension)
    rounds: int = 1
    #: UNSTABLE that more steps cannot decide: the processes that would (the run's, and the
    #: baseline's too when it has fewer runs)
    processes_to_decide: int | None = None
    #: the judged centers: the geometric means of the judged form's blocks (``verify/rest``:
    #: 3.20 -> 3.55; their ratio is ``change``) when the blocks pair; with ``basis`` set,
    #: ``base`` and ``now`` are the raw metric's (ms); a share (``share_based``): the two
    #: mean shares of the step, whose difference is ``change``
    judged_base: float | None = None
    judged_now: float | None = None
    #: the multiple of the noise a change must exceed (Student's t at ``alpha`` on ``df``
    #: degrees of freedom; ``Z`` for reports written before it was recorded)
    critical: float = Z
    df: float | None = None
    alpha: float | None = None
    #: the sitting part of the noise: its standard deviation, coefficient and sittings
    sitting: float | None = None
    sitting_coef: float | None = None
    sittings: int = 1
    #: the phase whose judged form mirrors this one's (one quantity, both tails gated)
    mirror_of: str | None = None
    #: the runs whose blocks were all identical within their side (``noise.exact_sides``):
    #: a deterministic metric, judged with zero noise and no prior; None: not exact
    exact_runs: int | None = None
    #: judged against the reference side of this run (A/B): ``base_runs`` are A's server
    #: processes, ``now_runs`` B's, and the history runs B's again, as the evidence of the
    #: between-process noise (``judging.ab.tested_evidence``)
    ab_sides: bool = False

    @property
    def disturbed(self) -> bool:
        return is_disturbed(self.scatter_ratio)

    @property
    def fixable(self) -> bool:
        """UNSTABLE, and more steps of this run would decide it (not a disturbed machine,
        not between-process noise)."""
        return (
            self.verdict is Verdict.UNSTABLE
            and not self.disturbed
            and self.steps_to_decide is not None
        )

    @property
    def in_points(self) -> bool:
        return self.share_based or self.points_based

    @property
    def band(self) -> float:
        """The noise band the gate was judged with: ``critical x noise`` (on the log scale
        for a relative change; ``tolerance_for_band`` turns it into a tolerance)."""
        return self.critical * self.noise

    def describe(self) -> str:
        b, n = fmt_value(self.base), fmt_value(self.now)
        if self.points_based:
            return (
                f"{self.metric} {self.change * 100:+.1f} points ({self.base:.1f}% -> "
                f"{self.now:.1f}%, tol {self.tolerance * 100:.0f} points)"
            )
        if self.share_based:
            shares = ""
            if self.judged_base is not None and self.judged_now is not None:
                # the shares judged, whose difference is the change, then the milliseconds
                shares = f"{self.judged_base * 100:.1f}% -> {self.judged_now * 100:.1f}% of step; "
            return (
                f"{self.metric} {self.change * 100:+.1f} pp of step ({shares}{b} -> {n} "
                f"{self.unit}, tol {self.tolerance * 100:.0f} pp)"
            )
        spread = (
            self.exact_reason
            if self.exact_runs
            else f"noise +-{self.noise * 100:.1f}%{self._runs_text()}"
        )
        noise = f"tol {self.tolerance * 100:.0f}%, {spread}{self._beyond_text()}"
        if self.basis and self.judged_base is not None and self.judged_now is not None:
            # the judged quantity first, in its own units; the raw milliseconds second
            jb, jn = _fmt_judged(self.judged_base), _fmt_judged(self.judged_now)
            text = f"{self.judged_label} {jb} -> {jn} ({self.change * 100:+.1f}%, {noise})"
            if self.raw_change is not None:
                text += (
                    f"; raw {self.metric} {b} -> {n} {self.unit} ({self.raw_change * 100:+.1f}%)"
                )
            return text
        text = f"{self.metric} {self.change * 100:+.1f}% ({b} -> {n} {self.unit}"
        text += f"{self._blocks_text()}, {noise}"
        if self.basis and self.raw_change is not None:
            text += f"; judged {self.basis}, raw {self.raw_change * 100:+.1f}%"
        return text + ")"

    def _beyond_text(self) -> str:
        """A disturbed comparison that kept its verdict: why (``beyond_disturbance``)."""
        r, sc = self.scatter_ratio, self.block_scatter
        if not self.disturbed or r is None or sc is None or self.verdict not in (
            Verdict.SLOWER, Verdict.FASTER):  # fmt: skip
            return ""
        return (
            f"; one side's blocks scatter {max(r, 1 / r):.1f}x the other's, but a disturbance "
            f"moves a center at most {reach_text(sc)}, far less than this change"
        )

    def _blocks_text(self) -> str:
        """Where the centers shown (the runs' medians) move otherwise than the change
        judged (the mean log difference of the blocks, a slow block weighing in): the
        blocks' geometric means too, whose ratio is the change."""
        jb, jn = self.judged_base, self.judged_now
        if self.basis or jb is None or jn is None or jb <= 0 or self.base <= 0:
            return ""
        if abs((self.now / self.base - 1) - self.change) < 0.005:
            return ""
        center = spec(self.metric).center
        return f" {center}; blocks' geometric mean {fmt_value(jb)} -> {fmt_value(jn)}"

    @property
    def exact_reason(self) -> str:
        """Why an exact comparison has no noise (empty when it is not exact)."""
        if not self.exact_runs:
            return ""
        return f"exact: every block identical in {self.exact_runs} runs"

    @property
    def judged_label(self) -> str:
        """What the change was judged on, as a quantity: ``verify / rest of step``."""
        return judged_label(self.metric, self.basis)

    def _runs_text(self) -> str:
        """`` over 3 baseline runs x 2 processes, 2 rounds``: what the noise was taken over,
        when more than one run against one run."""
        parts = []
        if self.ab_sides:  # the history runs are B's processes again: not more runs
            parts.append(f"{self.base_runs} reference and {self.now_runs} tested processes")
            if self.rounds > 1:
                parts.append(f"{self.rounds} rounds")
            return f" over {', '.join(parts)}"
        if self.base_runs > 1 or self.history_runs:
            parts.append(f"{self.base_runs} baseline runs")
        if self.history_runs:
            parts.append(f"{self.history_runs} history runs")
        if self.now_runs > 1:
            parts.append(f"{self.now_runs} processes")
        if self.rounds > 1:
            parts.append(f"{self.rounds} rounds")
        return f" over {', '.join(parts)}" if parts else ""

    def rejudged(
        self, tolerance: float, *, case_disturbed: bool = False, z: float | None = None
    ) -> Verdict:
        """The verdict this comparison gets at ``tolerance``: the rule of ``judge_gate``
        and ``downgrade_disturbed`` applied to the stored change, noise, critical value
        and scatter (the noise does not depend on the tolerance: its priors are the
        device's). ``z`` replaces the stored critical value."""
        higher = spec(self.metric).higher_is_better
        crit = self.critical if z is None else z
        v = decide(self.change, self.noise, tolerance, higher_is_better=higher, z=crit,
                   relative=not self.in_points)  # fmt: skip
        disturbed = self.disturbed or (case_disturbed and self.metric in DISTURBABLE_METRICS)
        beyond = disturbed and beyond_disturbance(
            v, self.change, self.noise, tolerance, higher_is_better=higher, z=crit,
            relative=not self.in_points, scatter=self.block_scatter)  # fmt: skip
        return _undecided_if_disturbed(v, disturbed, beyond=beyond)

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
            "block_scatter": _finite_or_none(self.block_scatter),
            "basis": self.basis,
            "raw_change": _finite_or_none(self.raw_change),
            "steps_to_decide": self.steps_to_decide,
            "within": _finite_or_none(self.within),
            "between": _finite_or_none(self.between),
            "between_hat2": _finite_or_none(self.between_hat2),
            "between_runs": self.between_runs,
            "floor": _finite_or_none(self.floor),
            "base_runs": self.base_runs,
            "now_runs": self.now_runs,
            "history_runs": self.history_runs,
            "rounds": self.rounds,
            "processes_to_decide": self.processes_to_decide,
            "judged_base": _finite_or_none(self.judged_base),
            "judged_now": _finite_or_none(self.judged_now),
            "critical": _finite_or_none(self.critical),
            "df": _finite_or_none(self.df),
            "alpha": self.alpha,
            "sitting": _finite_or_none(self.sitting),
            "sitting_coef": _finite_or_none(self.sitting_coef),
            "sittings": self.sittings,
            "mirror_of": self.mirror_of,
            "exact_runs": self.exact_runs,
            "ab_sides": self.ab_sides,
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
        sr, raw = d.get("scatter_ratio"), d.get("raw_change")
        return cls(
            **_noise_parts(d),
            metric=d["metric"],
            verdict=verdict,
            base=_number(d.get("base"), math.nan),
            now=_number(d.get("now"), math.nan),
            change=_number(d.get("change"), math.nan),
            noise=_number(d.get("noise"), math.nan),
            tolerance=_number(d.get("tolerance"), math.nan),
            unit=str(d.get("unit", "ms")),
            steps_to_decide=_int_or_none(d.get("steps_to_decide")),
            share_based=bool(d.get("share_based")),
            basis=d.get("basis") if isinstance(d.get("basis"), str) else None,
            raw_change=None if raw is None else _number(raw, math.nan),
            points_based=bool(d.get("points_based")),
            scatter_ratio=None if sr is None else _number(sr, math.nan),
            block_scatter=_optional(d.get("block_scatter")),
            judged_base=_optional(d.get("judged_base")),
            judged_now=_optional(d.get("judged_now")),
            ab_sides=d.get("ab_sides") is True,
        )


def _count(x: Any, default: int) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else default


def _optional(x: Any) -> float | None:
    return None if x is None else _number(x, math.nan)


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _noise_parts(d: Mapping[str, Any]) -> dict[str, Any]:
    """The noise's parts of a stored judged metric (absent in older reports: unknown)."""
    return {
        "within": _optional(d.get("within")),
        "between": _optional(d.get("between")),
        "between_hat2": _optional(d.get("between_hat2")),
        "between_runs": max(1, _count(d.get("between_runs"), 1)),
        "floor": _optional(d.get("floor")),
        "base_runs": max(1, _count(d.get("base_runs"), 1)),
        "now_runs": max(1, _count(d.get("now_runs"), 1)),
        "history_runs": _count(d.get("history_runs"), 0),
        "rounds": max(1, _count(d.get("rounds"), 1)),
        "processes_to_decide": _int_or_none(d.get("processes_to_decide")),
        "critical": _number(d.get("critical"), Z) if d.get("critical") is not None else Z,
        "df": _optional(d.get("df")),
        "alpha": _optional(d.get("alpha")),
        "sitting": _optional(d.get("sitting")),
        "sitting_coef": _optional(d.get("sitting_coef")),
        "sittings": max(1, _count(d.get("sittings"), 1)),
        "mirror_of": d.get("mirror_of") if isinstance(d.get("mirror_of"), str) else None,
        "exact_runs": _count(d.get("exact_runs"), 0) or None,
    }


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
    """Relative noise of ``now / base`` from paired block centers of one run each, without
    the between-process part (``judging.noise``: the ``within`` of one run against one).

    Falls back to the two runs' independent standard errors when the blocks do not pair.
    """
    return relative_noise([_blocks_of(base)], [_blocks_of(now)], prior=NO_PRIOR.phase).within


def _blocks_of(s: Summary, sitting: str | None = None) -> RunBlocks:
    return RunBlocks(s.value, s.blocks, s.rel_se(), sitting, s.rounds)


def _seq(x: Summary | Sequence[Summary]) -> tuple[Summary, ...]:
    return (x,) if isinstance(x, Summary) else tuple(x)


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


def disturbance(
    base: Summary | Sequence[Summary], now: Summary | Sequence[Summary]
) -> float | None:
    """This measurement's block scatter over the baseline's (both floored): the most
    scattered current run over the median baseline run.

    Both measure the same blocks, so their scatter is comparable whatever the prompts. A
    code regression moves the blocks together; a noisy neighbour, a CPU hog or the host's
    memory management moves some blocks more than others. Far above 1 the run was
    disturbed, far below 1 the baseline was: either way the comparison says more about
    the machine than about the code (see ``is_disturbed``).
    """
    sb = _scatters(_seq(base))
    sn = _scatters(_seq(now))
    if not sb or not sn:
        return None  # too few blocks: the ratio of two scatters would itself be noise
    return max(max(sn), SCATTER_FLOOR) / max(statistics.median(sb), SCATTER_FLOOR)


def _scatters(runs: Sequence[Summary]) -> list[float]:
    out = []
    for r in runs:
        blocks = r.measured_blocks or r.blocks  # a folded run's as measured
        sc = scatter(blocks) if len(blocks) >= MIN_SCATTER_BLOCKS else None
        if sc is not None:
            out.append(sc)
    return out


def is_disturbed(ratio: float | None) -> bool:
    return ratio is not None and (ratio > DISTURBED_RATIO or ratio < 1 / DISTURBED_RATIO)


#: How far a disturbance can move a run's center, in multiples of the block scatter it
#: leaves: one that slows a share ``f`` of the blocks by ``d`` (log) moves their mean by
#: ``f d`` and scatters them by ``d sqrt(f (1 - f))``, a ratio of ``sqrt(f / (1 - f))``:
#: 3 when it hits 90% of the blocks (1 at half, 1.7 for a slowdown spread evenly from
#: nothing to ``d``). One that hits every block alike scatters nothing and is not seen
#: as a disturbance at all (the sitting's noise, or A/B, answers it).
DISTURBANCE_REACH = 3.0


def reach_text(scatter: float) -> str:
    """How far a disturbance can move a center, as the failure line and the UNSTABLE
    advice both say it: ``3 x 9.0% = 27% (log)``."""
    return (
        f"{DISTURBANCE_REACH:g} x {scatter * 100:.1f}% = "
        f"{DISTURBANCE_REACH * scatter * 100:.0f}% (log)"
    )


def largest_scatter(
    base: Summary | Sequence[Summary], now: Summary | Sequence[Summary]
) -> float | None:
    """The largest block scatter (log units) of any run on either side (runs of at least
    ``MIN_SCATTER_BLOCKS`` blocks): the disturbed side's, whichever it is."""
    found = _scatters(_seq(base)) + _scatters(_seq(now))
    return max(found) if found else None


def beyond_disturbance(
    verdict: Verdict,
    change: float,
    noise: float,
    tolerance: float,
    *,
    higher_is_better: bool,
    z: float,
    relative: bool,
    scatter: float | None,
) -> bool:
    """Whether ``verdict`` (SLOWER or FASTER, as ``decide`` gave it for ``change``) holds
    even after taking off the most that a disturbance of ``scatter`` could explain
    (``DISTURBANCE_REACH`` x ``scatter`` off the change's log): a 2.5x slowdown beside
    blocks that scatter 9% is the code, not the machine."""
    if verdict not in (Verdict.SLOWER, Verdict.FASTER):
        return False
    if not relative or scatter is None or not scatter >= 0:
        return False  # a share or points change has no log scatter to weigh it against
    if not math.isfinite(change) or not math.isfinite(noise):
        return False
    stat = log_stat(change, True)
    left = math.copysign(max(abs(stat) - DISTURBANCE_REACH * scatter, 0.0), stat)
    after = decide(math.expm1(left), noise, tolerance, higher_is_better=higher_is_better, z=z,
                   relative=True)  # fmt: skip
    return after is verdict


def _undecided_if_disturbed(verdict: Verdict, disturbed: bool, *, beyond: bool = False) -> Verdict:
    """SLOWER or FASTER of a disturbed run or case becomes UNSTABLE (the one place), unless
    the change is ``beyond_disturbance``."""
    if disturbed and not beyond and verdict in (Verdict.SLOWER, Verdict.FASTER):
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
    """``runs_disturbance`` of one baseline run and one current run."""
    return runs_disturbance(Runs((base,), (now,)))


def runs_disturbance(runs: Runs) -> float | None:
    """The most extreme ``disturbance`` over the phases of a case (judged forms, phases
    that take at least ``MIN_PHASE_SHARE`` of the latest baseline step), gated or not: the
    case's machine-noise gauge, a ratio like ``disturbance`` (far from 1 = disturbed)."""
    worst: float | None = None
    for p in _large_phases(runs.latest):
        found = runs.of(rest_form(p))
        r = disturbance(found[0], found[1]) if found is not None else None
        if r is not None and (worst is None or max(r, 1 / r) > max(worst, 1 / worst)):
            worst = r
    return worst


def runs_scatter(runs: Runs) -> float | None:
    """``largest_scatter`` over the judged forms of the phases ``runs_disturbance`` looks
    at: how far the case's disturbance could have moved any of its centers."""
    found = []
    for p in _large_phases(runs.latest):
        pair = runs.of(rest_form(p))
        sc = largest_scatter(pair[0], pair[1]) if pair is not None else None
        if sc is not None:
            found.append(sc)
    return max(found) if found else None


def downgrade_disturbed(
    metrics: Sequence[MetricVerdict], case_ratio: float | None, case_scatter: float | None = None
) -> list[MetricVerdict]:
    """In a case whose phases scatter far more (or far less) than the baseline's, a SLOWER
    or FASTER phase or step says more about the machine than about the code: UNSTABLE,
    unless the change is ``beyond_disturbance`` of the largest block scatter (the case's
    ``case_scatter``, or the metric's own).

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
        ratio = m.scatter_ratio if m.disturbed else case_ratio
        # the case's scatter, and the metric's own beside it; without the case's, its own
        # only where it is the disturbed one (a case-level disturbance's reach is unknown)
        own = m.block_scatter if (m.disturbed or case_scatter is not None) else None
        found = [x for x in (own, case_scatter) if x is not None]
        scatter = max(found) if found else None  # unknown: no change is beyond it
        marked = replace(m, scatter_ratio=ratio, block_scatter=scatter)
        v = marked.rejudged(m.tolerance, z=m.critical) if m.verdict in (
            Verdict.SLOWER, Verdict.FASTER) else m.verdict  # fmt: skip
        steps = None if v is not m.verdict else m.steps_to_decide
        out.append(replace(marked, verdict=v, steps_to_decide=steps))
    return out


def case_disturbed(judged: Sequence[MetricVerdict]) -> bool:
    """Whether a judged case was disturbed: ``downgrade_disturbed`` leaves the case's
    ratio on each metric it applies to."""
    return any(m.metric in DISTURBABLE_METRICS and m.disturbed for m in judged)


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    return max(verdicts, key=lambda v: _SEVERITY[v]) if verdicts else Verdict.SAME


def band_limit(
    tolerance: float, *, higher_is_better: bool = False, relative: bool = False
) -> float:
    """The tolerance on the statistic's scale, in the worse direction: ``log(1 + tol)`` for
    a time (``log(1 - tol)``'s size for a higher-is-better quantity), ``tol`` itself for a
    share or points change. A noise band ``z * noise`` wider than this cannot tell a change
    of the tolerance's size from none."""
    if not relative:
        return tolerance
    return -math.log1p(-tolerance) if higher_is_better else math.log1p(tolerance)


def tolerance_for_band(
    band: float, *, higher_is_better: bool = False, relative: bool = False
) -> float:
    """The least tolerance whose ``band_limit`` a noise band ``band`` does not pass: its
    inverse (a gate with that band is decided from this tolerance on)."""
    if not relative:
        return band
    return -math.expm1(-band) if higher_is_better else math.expm1(band)


def decide(
    change: float,
    noise: float,
    tolerance: float,
    *,
    higher_is_better: bool = False,
    z: float = Z,
    relative: bool = False,
) -> Verdict:
    """The one verdict rule, for relative, share and points changes alike.

    SLOWER/FASTER when the change exceeds the tolerance and its statistic exceeds ``z``
    times the noise; UNSTABLE when the noise band (``z * noise``) is wider than the
    tolerance (on the statistic's scale, ``band_limit``), so that a change of the
    tolerance's size could not be told from none, or when the change or the noise cannot
    be estimated; SAME otherwise. No change at all is SAME whatever the noise.

    ``relative``: ``change`` is a ratio minus one and ``noise`` the standard error of its
    log (``judging.noise``), so the significance is judged on ``log(1 + change)``: a +30%
    change against a noise of 9% is ``0.262 / 0.09 = 2.9`` standard errors, not 3.3 (the
    ratio would over-state a slowdown, and more so the larger the noise). The tolerance is
    a ratio, judged on the change itself.
    """
    if change == 0:
        return Verdict.SAME
    if math.isnan(change) or not math.isfinite(noise):
        return Verdict.UNSTABLE
    worse = -change if higher_is_better else change
    if abs(change) > tolerance and abs(log_stat(change, relative)) > z * noise:
        return Verdict.SLOWER if worse > 0 else Verdict.FASTER
    if z * noise > band_limit(tolerance, higher_is_better=higher_is_better, relative=relative):
        return Verdict.UNSTABLE
    return Verdict.SAME


def steps_to_decide(
    n: int,
    change: float,
    noise: float,
    tolerance: float,
    z: float = Z,
    *,
    higher_is_better: bool = False,
    relative: bool = False,
) -> int | None:
    """Steps that would shrink the noise band to the tolerance (or to the change, if
    larger; both on the statistic's scale), since the noise of a median over blocks
    shrinks as 1/sqrt(steps)."""
    target = _band_target(change, tolerance, higher_is_better, relative)
    if not math.isfinite(noise) or target <= 0:
        return None
    return math.ceil(n * (z * noise / target) ** 2)


def _band_target(change: float, tolerance: float, higher_is_better: bool, relative: bool) -> float:
    """What the noise band must shrink to: the tolerance, or the change if larger, on the
    statistic's scale."""
    limit = band_limit(tolerance, higher_is_better=higher_is_better, relative=relative)
    if not math.isfinite(change):
        return limit
    return max(limit, abs(log_stat(change, relative)))


def _verdict(
    metric: str, change: float, noise: float, tolerance: float, n: int, z: float
) -> tuple[Verdict, int | None]:
    """A verdict on ``z`` (the critical value) and, for UNSTABLE, the steps to decide."""
    v = decide(change, noise, tolerance, higher_is_better=spec(metric).higher_is_better, z=z)
    steps = steps_to_decide(n, change, noise, tolerance, z) if v is Verdict.UNSTABLE else None
    return v, steps


def _to_decide(noise: Noise, change: float, tolerance: float, steps: int, z: float,
               alpha: float, higher_is_better: bool) -> tuple[int | None, int | None]:  # fmt: skip
    """Steps per run that would decide (None: more steps cannot), else processes that
    would, for a relative change judged on ``z`` at the gate's level ``alpha``. ``steps``:
    the steps measured per current run. Each count's critical value is taken at its own
    degrees of freedom: more rounds shrink the block term (and, A/B, add to its degrees
    of freedom), so the total leans on the process term's (often fewer); more processes
    add to the process term's."""
    if not noise.paired:  # unpaired: assume all the noise shrinks with steps
        return steps_to_decide(steps, change, noise.total, tolerance, z,
                               higher_is_better=higher_is_better, relative=True), None  # fmt: skip
    band = _band_target(change, tolerance, higher_is_better, True)
    rounds = noise.rounds_to_decide(band, lambda df: critical(alpha, df))
    if rounds is not None:
        return rounds * max(1, steps // noise.rounds), None
    return None, noise.processes_for(band, lambda df: critical(alpha, df))


def _change(base: float, now: float) -> float:
    if base == 0:
        return 0.0 if now == 0 else math.inf
    return now / base - 1.0


def _like_latest(runs: Sequence[Summary]) -> list[int]:
    """The indices of the baseline runs with as many blocks as the latest (a run that
    measured other blocks cannot be paired with this measurement's, nor pooled with the
    others)."""
    period = len(runs[-1].blocks)
    return [i for i, r in enumerate(runs) if len(r.blocks) == period]


def center_of_runs(runs: Sequence[Summary]) -> float:
    """The center of several runs of a metric: the geometric mean of their centers (the
    only run's center; the latest's when one is not positive)."""
    return center_of_centers([r.value for r in runs])


def _labels(labels: Sequence[str | None], n: int) -> list[str | None]:
    return list(labels) if len(labels) == n else [None] * n


def judge_metric(
    metric: str,
    base: Summary | Sequence[Summary],
    now: Summary | Sequence[Summary],
    tolerance: float,
    *,
    history: Sequence[Summary] = (),
    prior: DevicePrior = PROVISIONAL_PRIOR,
    alpha: float = LONE_ALPHA,
    sittings: tuple[Sequence[str | None], Sequence[str | None], Sequence[str | None]] = (
        (),
        (),
        (),
    ),
) -> MetricVerdict:
    """Relative-change verdict for one metric or derived form (times: lower is better),
    with the noise of ``judging.noise`` (``history`` runs inform the process and sitting
    parts only). The change judged is the mean paired log difference of the blocks (the
    statistic whose noise is computed); unpaired, the runs' centers' ratio. ``alpha`` is
    the gate's one-sided level; ``sittings`` label the baseline's, the current and the
    history runs (None: unknown; a stored run without one is of the legacy sitting). A
    metric whose runs are identical block by block within each side
    (``noise.exact_sides``: deterministic on this engine) has zero noise and no prior: its
    change is exact, judged against the tolerance alone."""
    all_base = _seq(base)
    keep = _like_latest(all_base)
    bs, ns = tuple(all_base[i] for i in keep), _seq(now)
    base_lab = _labels(sittings[0], len(all_base))
    b, n = center_of_runs(bs), center_of_runs(ns)
    noise = relative_noise(
        [_blocks_of(bs[j], base_lab[i]) for j, i in enumerate(keep)],
        [_blocks_of(x, s) for x, s in zip(ns, _labels(sittings[1], len(ns)))],
        prior=prior.of(spec(metric).tolerance),
        history=[_blocks_of(x, s) for x, s in zip(history, _labels(sittings[2], len(history)))],
    )
    change = math.expm1(noise.log_change) if math.isfinite(noise.log_change) else _change(b, n)
    ratio, spread = disturbance(bs, ns), largest_scatter(bs, ns)
    higher = spec(metric).higher_is_better
    z = critical(alpha, noise.df)
    verdict = decide(change, noise.total, tolerance, higher_is_better=higher, z=z, relative=True)
    # the machine, not the code, moved a disturbed run (unless it moved far beyond it)
    beyond = is_disturbed(ratio) and beyond_disturbance(
        verdict, change, noise.total, tolerance, higher_is_better=higher, z=z, relative=True,
        scatter=spread)  # fmt: skip
    verdict = _undecided_if_disturbed(verdict, is_disturbed(ratio), beyond=beyond)
    steps = procs = None
    if verdict is Verdict.UNSTABLE and not is_disturbed(ratio):
        steps, procs = _to_decide(noise, change, tolerance, ns[0].n, z, alpha, higher)
    return MetricVerdict(
        metric, verdict, b, n, change, noise.total, tolerance, spec(metric).unit, steps,
        scatter_ratio=ratio, block_scatter=spread, within=noise.within, between=noise.between,
        between_hat2=noise.between_hat2, between_runs=noise.between_runs,
        floor=noise.floor, base_runs=noise.base_runs, now_runs=noise.now_runs,
        history_runs=noise.history_runs, rounds=noise.rounds, processes_to_decide=procs,
        critical=z, df=noise.df, alpha=alpha, sitting=noise.sitting,
        sitting_coef=noise.sitting_coef, sittings=noise.sittings,
        exact_runs=noise.exact_runs or None,
        judged_base=_exp_or_none(noise.log_centers[0]),
        judged_now=_exp_or_none(noise.log_centers[1]),
    )  # fmt: skip


def _exp_or_none(log_value: float) -> float | None:
    return math.exp(log_value) if math.isfinite(log_value) else None


def _folded(values: Sequence[float], k: int) -> list[float] | None:
    """A run of several rounds of ``k`` blocks folded onto them (each block's mean over the
    rounds); None when it does not fold, or ``k`` is under ``MIN_PAIRED_BLOCKS``."""
    if k < MIN_PAIRED_BLOCKS or not values or len(values) % k:
        return None
    rounds = len(values) // k
    return [statistics.fmean(values[r * k + j] for r in range(rounds)) for j in range(k)]


def _paired_point_diffs(base: Sequence[float], now: Sequence[float]) -> list[float] | None:
    """The paired per-block differences (a run of several rounds of the baseline's blocks
    folded first, ``_folded``), or None when they do not pair."""
    folded = _folded(now, len(base))
    return None if folded is None else [n - b for b, n in zip(base, folded)]


def _mean_and_se(d: Sequence[float]) -> tuple[float, float, float]:
    """The mean of paired differences, its standard error and degrees of freedom."""
    return statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d)), len(d) - 1.0


def _block_shares(part: Summary, whole: Summary) -> list[float] | None:
    if len(part.blocks) != len(whole.blocks):
        return None
    return [m / s if s else 0.0 for m, s in zip(part.blocks, whole.blocks)]


def _run_share(part: Summary, whole: Summary) -> tuple[float, float]:
    """A run's share of the step (the ratio of its medians) and that share's standard
    error, from the part's (the step's is small beside it); a share of none has none."""
    share = part.median / whole.median if whole.median else 0.0
    return share, part.rel_se() * share if share else 0.0


def judge_share(
    metric: str,
    base: Summary | Sequence[Summary],
    now: Summary | Sequence[Summary],
    base_step: Summary | Sequence[Summary],
    now_step: Summary | Sequence[Summary],
    tolerance: float,
    *,
    alpha: float = LONE_ALPHA,
) -> MetricVerdict:
    """Verdict on ``metric``'s share of the step (percentage points), e.g. unaccounted,
    over every run of each side (``base_step`` / ``now_step``: the same runs' steps).

    The runs are those a relative form pairs (``judge_metric``): the baseline's with as
    many blocks as its latest (``_like_latest``), and every current run, each folded onto
    those ``B`` blocks (a run of several rounds). Paired when every run has them: per
    block the mean share over each side's runs, and the change is the mean of the ``B``
    differences, its noise their standard error on ``B - 1`` degrees of freedom. Otherwise
    each run's share is the ratio of its medians, a side's share their mean, and its
    standard error is taken as known. Either way the change is exactly the difference of
    the two shares shown (``judged_base`` / ``judged_now``), and ``base`` / ``now`` are the
    milliseconds every report shows: the centers over each side's runs."""
    all_base, all_steps = _seq(base), _seq(base_step)
    keep = _like_latest(all_base)
    parts = ([all_base[i] for i in keep], list(_seq(now)))
    steps = ([all_steps[i] for i in keep], list(_seq(now_step)))
    k = len(all_base[-1].blocks)
    profiles = [
        [_folded(x, k) if (x := _block_shares(p, w)) is not None else None
         for p, w in zip(parts[i], steps[i])]
        for i in (0, 1)
    ]  # fmt: skip
    if all(f is not None for side in profiles for f in side):
        b_prof, n_prof = (
            [statistics.fmean(f[j] for f in side if f is not None) for j in range(k)]
            for side in profiles
        )
        d = [n - b for b, n in zip(b_prof, n_prof)]
        change, noise, df = _mean_and_se(d)  # the statistic whose noise is computed
        b, n = statistics.fmean(b_prof), statistics.fmean(n_prof)
    else:
        (b, b_se), (n, n_se) = (
            _side_share([_run_share(p, w) for p, w in zip(parts[i], steps[i])]) for i in (0, 1)
        )
        change, noise, df = n - b, math.hypot(b_se, n_se), math.inf
    z = critical(alpha, df)
    verdict, to_decide = _verdict(metric, change, noise, tolerance, parts[1][0].n, z)
    return MetricVerdict(
        metric, verdict, center_of_runs(parts[0]), center_of_runs(parts[1]), change, noise,
        tolerance, "ms", to_decide, share_based=True, critical=z, df=df, alpha=alpha,
        judged_base=b, judged_now=n, base_runs=len(parts[0]), now_runs=len(parts[1]),
    )  # fmt: skip


def _side_share(runs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The mean of runs' shares and its standard error (each run's taken as known)."""
    mean = statistics.fmean(s for s, _ in runs)
    return mean, math.sqrt(sum(se * se for _, se in runs)) / len(runs)


def judge_points(
    metric: str,
    base: Centered,
    now: Centered,
    tolerance: float,
    n: int,
    *,
    alpha: float = LONE_ALPHA,
) -> MetricVerdict:
    """A utilization (higher is better) judged on its change in percentage points.

    ``tolerance`` 0.05 allows a drop of 5 points. Utilizations are bounded, so a relative
    rule would fire on 2% -> 1%; points do not. The noise is that of paired blocks when
    both runs have them (device-busy share); NVML/GPM utilization is one median per run,
    judged against the tolerance alone.
    """
    scale = spec(metric).to_percent
    b, now_pct = base.value * scale, now.value * scale
    d = _paired_point_diffs(
        [x * scale / 100 for x in base.blocks], [x * scale / 100 for x in now.blocks]
    )
    if d is not None:  # fractions of 100 points: -0.12 is a 12-point drop
        change, noise, df = _mean_and_se(d)
    else:
        change, noise, df = (now_pct - b) / 100.0, 0.0, math.inf
    z = critical(alpha, df)
    verdict, steps = _verdict(metric, change, noise, tolerance, n, z)
    return MetricVerdict(
        metric, verdict, b, now_pct, change, noise, tolerance, "%", steps, points_based=True,
        critical=z, df=df, alpha=alpha,
    )  # fmt: skip


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
    ``step`` for the step time and tokens/s, which carry the machine's drift (less of it
    judged against the KV read time, but more noise between processes)."""

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


#: basis (``judged_form``'s words) -> the judged quantity's name for a metric
_JUDGED_LABELS: dict[str, str] = {
    "against the rest of the step": "{metric} / rest of step",
    "on device time, against the rest of the step": "{metric} device time / rest of step",
    "against the request's KV read time": "step / KV read time",
    "per the request's KV read time": "tokens per KV read time",
}


def judged_label(metric: str, basis: str | None) -> str:
    """The judged quantity of ``metric``: ``verify / rest of step``, ``step / KV read
    time``; the metric itself when judged raw."""
    if basis is None:
        return metric
    return _JUDGED_LABELS.get(basis, f"{metric} ({basis})").format(metric=metric)


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
    if metric == TOKENS_PER_S:
        return TOKENS_PER_REF, "per the request's KV read time"
    return metric, None


@dataclass(frozen=True)
class Runs:
    """What a case's verdicts compare, each run a mapping of metric -> summary: the
    baseline's runs (oldest first), this measurement's runs (one per server process, the
    first shown), and history runs (nightly reports: the process and sitting parts only),
    each optionally labelled with its sitting (empty: unknown)."""

    base: tuple[Mapping[str, Summary], ...]
    now: tuple[Mapping[str, Summary], ...]
    history: tuple[Mapping[str, Summary], ...] = ()
    base_sittings: tuple[str | None, ...] = ()
    now_sittings: tuple[str | None, ...] = ()
    history_sittings: tuple[str | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.base or not self.now:
            raise ValueError("a comparison needs at least one baseline run and one current run")
        for runs, labels in (
            (self.base, self.base_sittings),
            (self.now, self.now_sittings),
            (self.history, self.history_sittings),
        ):
            if labels and len(labels) != len(runs):
                raise ValueError("sitting labels must be given for every run or none")

    @property
    def latest(self) -> Mapping[str, Summary]:
        """The latest baseline run."""
        return self.base[-1]

    @property
    def primary(self) -> Mapping[str, Summary]:
        """The first current run (the one tests get back and tables show)."""
        return self.now[0]

    def of(self, name: str) -> tuple[list[Summary], list[Summary], list[Summary]] | None:
        """Every run's summary of ``name``: baseline, current, history (None when the
        latest baseline run or the first current run lacks it; other runs that lack it
        are left out)."""
        if name not in self.latest or name not in self.primary:
            return None
        return (
            [r[name] for r in self.base[:-1] if name in r] + [self.latest[name]],
            [self.primary[name]] + [r[name] for r in self.now[1:] if name in r],
            [r[name] for r in self.history if name in r],
        )

    def sittings_of(self, name: str) -> tuple[list[str | None], list[str | None], list[str | None]]:
        """The sitting labels of the runs ``of(name)`` returns, in the same order."""

        def pick(
            runs: tuple[Mapping[str, Summary], ...], labels: tuple[str | None, ...]
        ) -> list[str | None]:
            full = labels or (None,) * len(runs)
            return [s for r, s in zip(runs, full) if name in r]

        return (
            pick(self.base, self.base_sittings),
            pick(self.now, self.now_sittings),
            pick(self.history, self.history_sittings),
        )


def tokens_per_ref(metrics: Mapping[str, Summary]) -> Summary | None:
    """``tokens/ref`` of one run: its mean accept length over its ``step/ref``, the run's
    center and each block's alike; None without both, or when their blocks differ.

    Derived from the two stored forms (never stored itself), so a baseline recorded
    before it existed is judged on it too, by the same arithmetic as the current run.
    """
    acc, spr = metrics.get(ACCEPT_LEN), metrics.get(STEP_PER_REF)
    if acc is None or spr is None or len(acc.blocks) != len(spr.blocks) or spr.value <= 0:
        return None
    if any(b <= 0 for b in spr.blocks):
        return None
    blocks = [a / b for a, b in zip(acc.blocks, spr.blocks)]
    rounds = acc.rounds if acc.rounds == spr.rounds else 1
    return Summary.compact(acc.value / spr.value, blocks, min(acc.n, spr.n), "mean",
                           rounds=rounds)  # fmt: skip


def _with_derived(runs: Runs, form: str) -> Runs:
    """``runs`` with the derived ``form`` (``tokens/ref``) added to every run that has
    what it is derived from."""
    if form != TOKENS_PER_REF:
        return runs

    def add(rs: tuple[Mapping[str, Summary], ...]) -> tuple[Mapping[str, Summary], ...]:
        out: list[Mapping[str, Summary]] = []
        for r in rs:
            derived = tokens_per_ref(r)
            out.append(r if derived is None else {**r, form: derived})
        return tuple(out)

    return dataclasses.replace(
        runs, base=add(runs.base), now=add(runs.now), history=add(runs.history)
    )


def _judge_form(
    metric: str, runs: Runs, tolerance: float, prior: DevicePrior, alpha: float
) -> MetricVerdict | None:
    """Judge a time on its drift-free form when both sides have it, else as it is."""
    form, basis = judged_form(metric)
    runs = _with_derived(runs, form)
    raw = metric
    device = device_form(metric)
    if basis is not None and runs.of(rest_form(device)) is not None:
        # On a GPU a phase's host time includes waits for earlier GPU work: judge its
        # device time (CUDA events around the phase on the stream) instead.
        form, basis, raw = rest_form(device), "on device time, against the rest of the step", device
    raw_runs = runs.of(raw)
    if raw_runs is None:
        return None
    judged = runs.of(form) if basis is not None else None
    if judged is None:
        return judge_metric(metric, raw_runs[0], raw_runs[1], tolerance, history=raw_runs[2],
                            prior=prior, alpha=alpha, sittings=runs.sittings_of(raw))  # fmt: skip
    mv = judge_metric(form, judged[0], judged[1], tolerance, history=judged[2], prior=prior,
                      alpha=alpha, sittings=runs.sittings_of(form))  # fmt: skip
    b, n = center_of_runs(raw_runs[0]), center_of_runs(raw_runs[1])
    return replace(
        mv,
        metric=metric,
        basis=basis,
        base=b,
        now=n,
        raw_change=_change(b, n),
        # the judged form's centers as its statistic sees them (the geometric mean of its
        # blocks, whose ratio is the change judged); unpaired, its runs' centers
        judged_base=mv.base if mv.judged_base is None else mv.judged_base,
        judged_now=mv.now if mv.judged_now is None else mv.judged_now,
    )


def judge_gate(
    metric: str,
    base: Mapping[str, Summary],
    now: Mapping[str, Summary],
    tolerances: Tolerances,
    *,
    base_util: Mapping[str, Centered] | None = None,
    now_util: Mapping[str, Centered] | None = None,
    prior: DevicePrior = PROVISIONAL_PRIOR,
    alpha: float = LONE_ALPHA,
) -> MetricVerdict | None:
    """``judge_runs`` of one baseline run and one current run."""
    runs = Runs((base,), (now,))
    return judge_runs(metric, runs, tolerances, base_util=base_util, now_util=now_util,
                      prior=prior, alpha=alpha)  # fmt: skip


def judge_runs(
    metric: str,
    runs: Runs,
    tolerances: Tolerances,
    *,
    base_util: Mapping[str, Centered] | None = None,
    now_util: Mapping[str, Centered] | None = None,
    prior: DevicePrior = PROVISIONAL_PRIOR,
    alpha: float = LONE_ALPHA,
) -> MetricVerdict | None:
    """Judge one gated metric at the one-sided level ``alpha``; ``None`` if either side
    lacks it.

    ``base_util`` / ``now_util``: the telemetry utilizations (one median per run) of the
    latest baseline run and of the first current run. Utilizations are judged on those
    two runs, shares on every run (``judge_share``), both in points, where the
    between-process noise is small against the tolerance; everything else on every run
    (``judge_metric``), with the device's level ``prior``."""
    tolerance = tolerances.of(metric)
    kind = spec(metric).kind
    base, now = runs.latest, runs.primary
    if kind is MetricKind.UTILIZATION:
        b = base.get(metric) or (base_util or {}).get(metric)
        n = now.get(metric) or (now_util or {}).get(metric)
        if b is None or n is None:
            return None
        steps = now[metric].n if metric in now else 1
        return judge_points(metric, b, n, tolerance, steps, alpha=alpha)
    if metric not in base or metric not in now:
        return None
    if kind is MetricKind.SHARE:
        # every run of each side, as the phase table's centers are taken over them
        b_runs, n_runs = ([r for r in side if metric in r and STEP in r]
                          for side in (runs.base, runs.now))  # fmt: skip
        return judge_share(metric, [r[metric] for r in b_runs], [r[metric] for r in n_runs],
                           [r[STEP] for r in b_runs], [r[STEP] for r in n_runs], tolerance,
                           alpha=alpha)  # fmt: skip
    return _judge_form(metric, runs, tolerance, prior, alpha)
