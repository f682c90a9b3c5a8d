"""How sure a verdict must be: a per-run false-alarm budget shared by every gate.

A run judges many gates (every default gate of every case, at every look of the automatic
extension). Each is a one-sided test "this metric got worse", so a fixed 3-sigma cut per
gate would let the chance of *some* false alarm grow with their number. Instead the run
has one budget, ``RUN_ALPHA`` (5%: at most one quiet run in 20 fails anywhere), split so
that each case's decision is final when the case ends:

1. **Over cases (Bonferroni)**: each of the run's ``T`` specperf tests gets ``alpha / T``
   (``T`` is known when collection ends); a test that measures ``c`` cases gives each
   ``alpha / (T c)``.
2. **Over looks (Bonferroni, Pocock-shaped)**: the automatic extension judges a case
   after each round, at most ``MAX_LOOKS`` times; each look gets an equal share, ``1 /
   looks`` of the case's budget: a constant boundary over the looks (Pocock's shape), with
   Bonferroni's bound in place of Pocock's exact constant, which is slightly smaller and
   needs the looks' correlation (a recursive integral) a reviewer cannot redo by hand.
3. **Over a case's gates (Holm)**: the ``m`` one-sided p-values of the case at one look,
   sorted, are compared with ``a/m, a/(m-1), ..., a/1`` in turn; the gates up to the
   first that fails the comparison are significant. A gate is SLOWER when it is
   significant **and** its change exceeds the tolerance.

Each p-value is Student's t: ``p = P(T_df > change / noise)`` on the noise's
Welch-Satterthwaite degrees of freedom (``judging.noise``). The family-wise guarantee:
with no real change anywhere, P(any SLOWER in the run) <= ``RUN_ALPHA``.

Mirror gates: when two phases make up nearly all of each other's rest of the step
(``verify/rest`` and ``draft/rest``), their judged forms are one quantity seen from both
ends. Their two one-sided tests are its two tails: both count in ``m`` (a two-sided test
at twice the one-sided level), and when one is SLOWER the other's FASTER is its mirror
image, not news (``MIRROR_SHARE``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_specperf.judging.stats import t_quantile, t_sf

#: The chance, per run, that a run with no real change fails somewhere.
RUN_ALPHA = 0.05
#: Most looks the automatic extension takes at a case (its first round included).
MAX_LOOKS = 4
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
    #: looks per case (1 without the automatic extension, else ``MAX_LOOKS``)
    looks: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.run_alpha < 1:
            raise ValueError(f"run_alpha must be in (0, 1), got {self.run_alpha!r}")
        for name in ("tests", "cases", "looks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Family.{name} must be a positive integer, got {v!r}")

    @property
    def case_alpha(self) -> float:
        """The budget of one look at one case: ``run_alpha / (tests x cases x looks)``."""
        return self.run_alpha / (self.tests * self.cases * self.looks)

    def gate_alpha(self, gates: int) -> float:
        """A gate's level in the worst case (the first Holm step, Bonferroni's level)."""
        return self.case_alpha / max(1, gates)

    def describe(self) -> str:
        return (
            f"false alarms <= {self.run_alpha:.0%} per run: {self.tests} test(s) x "
            f"{self.cases} case(s) x {self.looks} look(s), Holm over each case's gates"
        )


#: The family of a lone comparison (one gate of one case, one look): 5% one-sided.
LONE = Family()


def critical(alpha: float, df: float) -> float:
    """The one-sided critical value: Student's t quantile at ``1 - alpha`` on ``df``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not df > 0:
        return math.inf
    return t_quantile(1.0 - alpha, df)


def p_worse(change: float, noise: float, df: float, *, higher_is_better: bool = False) -> float:
    """One-sided p-value of "got worse": ``P(T_df > worse / noise)``; 1 for no evidence
    (a NaN change, an unknown or zero noise with no change)."""
    worse = -change if higher_is_better else change
    if math.isnan(worse) or not math.isfinite(noise) or not df > 0:
        return 1.0
    if noise <= 0:
        return 0.0 if worse > 0 else 1.0
    return t_sf(worse / noise, df)


def holm(pvalues: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down: which of ``pvalues`` are significant at family level ``alpha``."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [False] * m
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (m - rank):
            break
        out[i] = True
    return out


def holm_levels(pvalues: Sequence[float], alpha: float) -> list[float]:
    """Each p-value's Holm level ``alpha / (m - rank)`` (rank 0: the smallest p)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    levels = [alpha / m] * m
    for rank, i in enumerate(order):
        levels[i] = alpha / (m - rank)
    return levels
