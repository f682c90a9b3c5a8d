"""How sure a verdict must be: a per-run false-alarm budget shared by every gate.

A run judges many gates (every default gate of every case, at every look of the automatic
extension). Each is a one-sided test "this metric got worse", so a fixed 3-sigma cut per
gate would let the chance of *some* false alarm grow with their number. Instead the run
has one budget, ``RUN_ALPHA`` (5%: at most one quiet run in 20 fails anywhere), split so
that each case's decision is final when the case ends:

1. **Over cases (Bonferroni)**: each of the run's ``T`` specperf tests gets ``alpha / T``
   (``T`` is known when collection ends); a test that measures ``c`` cases gives each
   ``alpha / (T c)``.
2. **Over looks (a group-sequential boundary)**: the automatic extension judges a case
   after each round, at most ``MAX_LOOKS`` times. The looks' statistics are strongly
   correlated (each look's data include the earlier looks'), so instead of an equal
   Bonferroni share each look gets the nominal level of Pocock's constant boundary
   (``judging.spending.pocock_boundary``: the one critical value whose crossing over
   ``MAX_LOOKS`` equal looks, fixed in advance, is the share). By Bonferroni's inequality
   every look gets at least ``1 / MAX_LOOKS`` of the share at any share (about 0.31 of it
   at the default suite's), and the case still spends at most its share over all its
   looks, however many of them the extension takes.
3. **Over a case's gates (Holm)**: the ``m`` one-sided p-values of the case at one look,
   sorted, are compared with the look's nominal levels of ``a/m, a/(m-1), ..., a/1``
   (``a`` the case's share, each spent over the looks) in turn; the gates up to the first
   that fails the comparison are significant. A gate is SLOWER when it is
   significant **and** its change exceeds the tolerance.

Each p-value is Student's t: ``p = P(T_df > ln(1 + change) / noise)`` (a share's or
points change itself, not its log) on the noise's
Welch-Satterthwaite degrees of freedom (``judging.noise``); the boundary's normal
critical values enter as nominal levels (the single-look tail they cut), at which the
t statistic is judged (the usual "nominal p" use of a boundary with estimated noise).
The family-wise guarantee: with no real change anywhere, P(any SLOWER in the run) <=
``RUN_ALPHA``, exactly for normal statistics; for Student's t on Welch-Satterthwaite df
approximately (simulated 2.9-3.3% of quiet runs, 6.8% when the block noise dominates a
gate: docs/statistics.md, section 3).

Mirror gates: when two phases make up nearly all of each other's rest of the step
(``verify/rest`` and ``draft/rest``), their judged forms are one quantity seen from both
ends. Their two one-sided tests are its two tails: both count in ``m`` (a two-sided test
at twice the one-sided level), and when one is SLOWER the other's FASTER is its mirror
image, not news (``MIRROR_SHARE``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pytest_specperf.judging.spending import POCOCK_CONSTANT, look_level
from pytest_specperf.judging.stats import t_quantile, t_sf

#: The chance, per run, that a run with no real change fails somewhere.
RUN_ALPHA = 0.05
#: Most looks the automatic extension takes at a case (its first round included).
MAX_LOOKS = 4
#: The boundary over the looks (``judging.spending``): Pocock's constant boundary, the
#: same level at every look, never below Bonferroni's (docs/statistics.md, section 3).
LOOK_RULE = POCOCK_CONSTANT
#: Two phases mirror each other when each takes at least this share of the other's rest.
MIRROR_SHARE = 0.8


@dataclass(frozen=True)
class Family:
    """The share of the run's false-alarm budget one case may spend."""

    #: the run's budget
    run_alpha: float = RUN_ALPHA
    #: specperf tests the run judges (known when collection ends)
    tests: int = 1
    #: cases this test measures
    cases: int = 1
    #: looks per case (1 without the automatic extension, else those it planned from the
    #: case's first round, ``planned_looks``, at most ``MAX_LOOKS``)
    looks: int = 1
    #: the look being judged (1 to ``looks``): the run's rounds so far
    look: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.run_alpha < 1:
            raise ValueError(f"run_alpha must be in (0, 1), got {self.run_alpha!r}")
        for name in ("tests", "cases", "looks", "look"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Family.{name} must be a positive integer, got {v!r}")
        if self.look > self.looks:
            raise ValueError(f"Family.look must be at most looks ({self.looks}), got {self.look}")

    @property
    def case_alpha(self) -> float:
        """One case's budget over all its looks: ``run_alpha / (tests x cases)``."""
        return self.run_alpha / (self.tests * self.cases)

    def level(self, alpha: float) -> float:
        """The nominal level, at this look, of a test that spends ``alpha`` over the looks
        (``alpha`` itself with one look)."""
        return look_level(alpha, self.look, self.looks, LOOK_RULE)

    def gate_alpha(self, gates: int) -> float:
        """A gate's level at this look in the worst case (the first Holm step,
        Bonferroni's share of the case spent over the looks)."""
        return self.level(self.case_alpha / max(1, gates))

    def describe(self) -> str:
        looks = f"{self.looks} look(s) (Pocock's constant boundary)" if self.looks > 1 else "1 look"
        return (
            f"false alarms <= {self.run_alpha:.0%} per run: {self.tests} test(s) x "
            f"{self.cases} case(s) x {looks}, Holm over each case's gates"
        )


#: The family of a lone comparison (one gate of one case, one look): 5% one-sided.
LONE = Family()


def planned_looks(max_time_s: float, first_round_s: float) -> int:
    """The looks the automatic extension plans for a case once its first round took
    ``first_round_s`` of ``max_time_s`` (``MAX_LOOKS`` at most, 1 at least): as many as
    fit if every round takes as long as the first. Fixed before any verdict is seen, from
    the clock, not the judged change (docs/statistics.md, section 3, says where the two
    can go together); a case whose rounds cannot fit a second look is judged at one
    look's level instead of paying Pocock's boundary for looks it would never take."""
    if not first_round_s > 0 or not math.isfinite(first_round_s):
        return MAX_LOOKS
    if not max_time_s > 0:
        return 1
    return max(1, min(MAX_LOOKS, math.floor(max_time_s / first_round_s)))


def share_of_run(family: Family, tests: int) -> Family:
    """``family`` shared by at least ``tests`` tests. A report written before 2026-12-05
    saved ``tests = 1`` for every case of a run of many tests (pytest never called
    ``pytest_collection_finish``, which counts them), and its cases were judged at that
    looser share; read again, they are judged at the share their run's tests give."""
    return family if family.tests >= tests else replace(family, tests=tests)


def critical(alpha: float, df: float) -> float:
    """The one-sided critical value: Student's t quantile at ``1 - alpha`` on ``df``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not df > 0:
        return math.inf
    return t_quantile(1.0 - alpha, df)


def log_stat(change: float, relative: bool) -> float:
    """The statistic whose standard error the noise is: ``log(1 + change)`` for a relative
    change (the noise is that of a mean log difference), the change itself for a share or
    points change. A relative change of -100% or less (a time of zero) is ``-inf``."""
    if not relative:
        return change
    return math.log1p(change) if change > -1 else -math.inf


def p_worse(
    change: float, noise: float, df: float, *, higher_is_better: bool = False,
    relative: bool = False,
) -> float:  # fmt: skip
    """One-sided p-value of "got worse": ``P(T_df > worse / noise)``, ``worse`` on the
    statistic's scale (``relative``: ``log(1 + change)``, the noise being a log's standard
    error); 1 for no evidence (a NaN change, an unknown or zero noise with no change)."""
    if not math.isnan(change):
        change = log_stat(change, relative)
    worse = -change if higher_is_better else change
    if math.isnan(worse) or not math.isfinite(noise) or not df > 0:
        return 1.0
    if noise <= 0:
        return 0.0 if worse > 0 else 1.0
    return t_sf(worse / noise, df)


def _same(alpha: float) -> float:
    return alpha


def holm(
    pvalues: Sequence[float], alpha: float, level: Callable[[float], float] = _same
) -> list[bool]:
    """Holm's step-down: which of ``pvalues`` are significant at family level ``alpha``
    (``level``: a step's share to the nominal level it is judged at, e.g. a look's)."""
    levels = holm_levels(pvalues, alpha, level)
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out = [False] * len(pvalues)
    for i in order:
        if pvalues[i] > levels[i]:
            break
        out[i] = True
    return out


def holm_levels(
    pvalues: Sequence[float], alpha: float, level: Callable[[float], float] = _same
) -> list[float]:
    """Each p-value's Holm level ``level(alpha / (m - rank))`` (rank 0: the smallest p)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    levels = [level(alpha / m)] * m
    for rank, i in enumerate(order):
        levels[i] = level(alpha / (m - rank))
    return levels
