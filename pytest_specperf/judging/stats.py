"""Robust summaries of per-step samples, keeping the run's block structure.

Steps inside one run are correlated (the machine's speed drifts), so the unit of
evidence is a block of consecutive steps (one request), not a single step. A summary
keeps the median of every block; the noise of the median is estimated from the spread
of those block medians.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Scale factor that makes the MAD a consistent estimator of a normal sigma.
_MAD_TO_SIGMA = 1.4826


def stable(x: float) -> float:
    """Round to 6 significant digits, so stored numbers diff cleanly."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.6g}")


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted data."""
    if not sorted_xs:
        raise ValueError("quantile of no data")
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def mad(xs: Sequence[float]) -> float:
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


@dataclass(frozen=True)
class Summary:
    """Summary of one metric over the measured steps of one case."""

    n: int
    median: float
    mean: float
    stdev: float
    mad: float
    q10: float
    q90: float
    min: float
    max: float
    blocks: tuple[float, ...] = ()
    center: str = "median"
    #: False for a compact summary (one stored baseline run): only ``n``, the center and
    #: the block centers are known; the other fields are NaN and never trusted
    full: bool = True
    #: where ``blocks`` fold several rounds of the same blocks (an A/B reference process,
    #: ``judging.ab.fold_reference``): the blocks as measured, which the scatter checks read
    measured_blocks: tuple[float, ...] = ()
    #: rounds of the same blocks ``blocks`` holds, one after the other (the automatic
    #: extension measures the first round's blocks again): ``noise`` folds them onto the
    #: first round's where a run's rounds must meet runs of one round (the history)
    rounds: int = 1

    @classmethod
    def compact(
        cls, value: float, blocks: Sequence[float], n: int, center: str = "median",
        measured_blocks: Sequence[float] = (), rounds: int = 1,
    ) -> Summary:  # fmt: skip
        """A summary known only by its center and block centers (a stored baseline run).

        Its spread figures are unknown, so with fewer than three blocks its noise is
        unknown too (``rel_se`` is infinite: UNSTABLE), never estimated from made-up data.
        """
        if center not in ("median", "mean"):
            raise ValueError(f"center must be median or mean, got {center!r}")
        nan = math.nan
        return cls(
            n=n,
            median=value if center == "median" else nan,
            mean=value if center == "mean" else nan,
            stdev=nan,
            mad=nan,
            q10=nan,
            q90=nan,
            min=nan,
            max=nan,
            blocks=tuple(blocks),
            center=center,
            full=False,
            measured_blocks=tuple(measured_blocks),
            rounds=rounds,
        )

    @property
    def value(self) -> float:
        """The center judged and reported: the median, or the mean for count-like metrics
        (accepted tokens per step is an integer per step; its median is too coarse)."""
        return self.mean if self.center == "mean" else self.median

    @property
    def rel_spread(self) -> float:
        """Robust coefficient of variation of single steps (MAD-based); infinite when the
        spread is unknown (a compact summary)."""
        if not self.full:
            return math.inf
        return _MAD_TO_SIGMA * self.mad / abs(self.median) if self.median else math.inf

    def rel_se(self) -> float:
        """Relative standard error of the median, from the spread of block medians.

        With fewer than three blocks it falls back to the step spread over the square
        root of the number of steps, which ignores correlation and so is optimistic (and
        is unknown, infinite, for a compact summary).
        """
        if not self.value:
            return math.inf
        k = len(self.blocks)
        if k >= 3:
            sd = statistics.stdev(self.blocks)
            return sd / math.sqrt(k) / abs(self.value)
        if self.n >= 2 and self.full:
            return 1.2533 * self.rel_spread / math.sqrt(self.n)
        return math.inf

    def to_dict(self) -> dict[str, Any]:
        if not self.full:
            return {
                "n": self.n,
                self.center: stable(self.value),
                "blocks": [stable(b) for b in self.blocks],
                "center": self.center,
            }
        return {
            "n": self.n,
            "median": stable(self.median),
            "mean": stable(self.mean),
            "stdev": stable(self.stdev),
            "mad": stable(self.mad),
            "q10": stable(self.q10),
            "q90": stable(self.q90),
            "min": stable(self.min),
            "max": stable(self.max),
            "blocks": [stable(b) for b in self.blocks],
            "center": self.center,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Summary:
        """Parse a stored summary; raise ``ValueError`` naming ``where`` on bad data."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(d).__name__}")
        fields = ("median", "mean", "stdev", "mad", "q10", "q90", "min", "max")
        missing = [f for f in ("n", *fields) if f not in d]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        n = d["n"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}.n: expected a positive integer, got {_shown(n)}")
        vals = {}
        for f in fields:
            v = d[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{where}.{f}: expected a finite number, got {_shown(v)}")
            vals[f] = float(v)
        blocks = d.get("blocks", [])
        if not isinstance(blocks, list) or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) for b in blocks
        ):
            raise ValueError(f"{where}.blocks: expected a list of numbers")
        center = d.get("center", "median")
        if center not in ("median", "mean"):
            raise ValueError(f"{where}.center: expected median or mean, got {_shown(center)}")
        return cls(
            n=n,
            median=vals["median"],
            mean=vals["mean"],
            stdev=vals["stdev"],
            mad=vals["mad"],
            q10=vals["q10"],
            q90=vals["q90"],
            min=vals["min"],
            max=vals["max"],
            blocks=tuple(float(b) for b in blocks),
            center=center,
        )


def _shown(v: Any) -> str:
    """A number or short string as written; anything else by its type (no big reprs)."""
    if isinstance(v, float) or (isinstance(v, int) and abs(v) < 10**40):
        return repr(v)
    if isinstance(v, str) and len(v) <= 40:
        return repr(v)
    return f"a {type(v).__name__}"


def summarize(
    samples: Sequence[float], blocks: Sequence[int] | None = None, *, center: str = "median"
) -> Summary:
    """Summarize ``samples``; ``blocks[i]`` names the block (request) of sample ``i``.

    ``center`` ("median" or "mean") is the statistic judged, per block and overall.
    """
    if center not in ("median", "mean"):
        raise ValueError(f"center must be median or mean, got {center!r}")
    block_stat = statistics.median if center == "median" else statistics.fmean
    if not samples:
        raise ValueError("cannot summarize an empty sample")
    xs = sorted(samples)
    block_medians: list[float] = []
    if blocks is not None:
        if len(blocks) != len(samples):
            raise ValueError("blocks and samples differ in length")
        groups: dict[int, list[float]] = {}
        for b, x in zip(blocks, samples):
            groups.setdefault(b, []).append(x)
        block_medians = [block_stat(groups[b]) for b in sorted(groups)]
    return Summary(
        n=len(xs),
        median=statistics.median(xs),
        mean=statistics.fmean(xs),
        stdev=statistics.stdev(xs) if len(xs) > 1 else 0.0,
        mad=mad(xs),
        q10=quantile(xs, 0.1),
        q90=quantile(xs, 0.9),
        min=xs[0],
        max=xs[-1],
        blocks=tuple(block_medians),
        center=center,
    )


def center_of_centers(values: Sequence[float]) -> float:
    """The center of several runs' centers: their geometric mean (the only one's value;
    the last one's when one is not positive). Every report of a case and the verdict
    take a center over runs this way, so their numbers agree."""
    if not values:
        return math.nan
    if len(values) == 1 or any(not v > 0 for v in values):
        return values[-1]
    return math.exp(statistics.fmean(math.log(v) for v in values))


# -- Student's t: the critical values of a verdict ---------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    lbt += b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom (``df`` may be a
    Satterthwaite fraction; infinite: the normal distribution)."""
    if math.isnan(t) or math.isnan(df) or df <= 0:
        return math.nan
    if math.isinf(df):
        return statistics.NormalDist().cdf(-t)
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def f_sf(f: float, d1: float, d2: float) -> float:
    """``P(F > f)`` for Fisher's F with ``(d1, d2)`` degrees of freedom."""
    if math.isnan(f) or not (d1 > 0 and d2 > 0):
        return math.nan
    if f <= 0:
        return 1.0
    if math.isinf(f):
        return 0.0
    return _betainc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * f))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``p`` in (0, 1));
    ``t_quantile(0.975, 10) = 2.228``, ``t_quantile(0.99865, inf) = 3.0``."""
    if not 0.0 < p < 1.0 or math.isnan(df) or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p!r}, df={df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    z = statistics.NormalDist().inv_cdf(p)
    if math.isinf(df) or df > 1e7:
        return z
    tail = 1.0 - p
    lo, hi = 0.0, max(2.0 * z, 1.0)
    while t_sf(hi, df) > tail:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):  # bisection: monotone and exact to double precision
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2.0


def satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates, each given
    as ``(variance, its degrees of freedom)``: ``(sum v)^2 / sum(v^2 / df)``. Parts of
    zero variance add nothing; a part with infinite df (a known variance) adds no
    uncertainty; no uncertain part at all gives ``inf``."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts if v > 0 and df > 0 and math.isfinite(df))
    if total <= 0 or denom <= 0:
        return math.inf
    return total * total / denom
