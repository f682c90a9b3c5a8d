"""Group-sequential boundaries: how the automatic extension's looks share a case's budget.

The extension judges a case after each round, at most ``K`` times. The statistic of
look ``k`` is ``Z_k = change_k / se_k``; with no real change, the sequence behaves as a
Brownian motion ``W`` seen at the looks' information fractions ``t_k`` (the look's share
of the case's final information): ``Z_k = W(t_k) / sqrt(t_k)``, so
``corr(Z_j, Z_k) = sqrt(t_j / t_k)`` for ``j < k``. An **alpha-spending function**
``alpha(t)`` (Lan & DeMets 1983), rising from 0 at ``t = 0`` to the overall level at
``t = 1``, fixes how much of the level the looks up to ``t`` may spend; each look's
nominal boundary ``c_k`` is then the one with

    P(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c_k) = alpha(t_k) - alpha(t_{k-1}),

computed by the recursive numerical integration of Armitage, McPherson & Rowe (1969):
the density of ``W(t_k)`` on the continuation region (below the boundary) is carried
from look to look by convolving with the increment's normal density, on a grid of
points ``STEP_SD`` standard deviations apart, integrated by Simpson's rule (Jennison &
Turnbull, "Group Sequential Methods", 2000, chapter 19). The two spending functions:

- **Pocock-type** ``alpha ln(1 + (e - 1) t)``: about a flat boundary; spends most early.
- **O'Brien-Fleming-type** ``2 - 2 Phi(z_{alpha/2} / sqrt(t))``: spends almost nothing
  early, keeps nearly the whole level for the last look.

Both are written for a one-sided level (``sides=1``: only crossings of the upper
boundary count, the region below is unbounded); ``sides=2`` (a symmetric two-sided
boundary, each tail spending ``alpha(t)`` at ``alpha / 2``) is here so that the
published two-sided tables can check the integration.

Pure arithmetic (``math`` and ``statistics``): no files, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

POCOCK = "pocock"
OBRIEN_FLEMING = "obrien-fleming"
#: Grid step of the integration, in standard deviations of the look's ``W(t)`` (or of
#: the increment, whichever is smaller). Simpson's error is ``O(step^4)``: at 0.05 the
#: published constants come back to 4 decimals.
STEP_SD = 0.05
#: The continuation region's lower end (one-sided) and the grid's ends: this many
#: standard deviations (the mass beyond, ``< 1e-15``, does not count).
WIDTH_SD = 8.5

_NORMAL = NormalDist()
_SQRT2 = math.sqrt(2.0)


def upper_tail(z: float) -> float:
    """``P(Z > z)`` for a standard normal ``Z``, accurate far into the tail."""
    return 0.5 * math.erfc(z / _SQRT2)


def z_upper(p: float) -> float:
    """The ``z`` with ``P(Z > z) = p``; infinite for ``p <= 0``."""
    if p <= 0.0:
        return math.inf
    if p >= 1.0:
        return -math.inf
    return -_NORMAL.inv_cdf(p)


def pocock_spending(alpha: float, t: float) -> float:
    """Lan-DeMets' Pocock-type spending function: ``alpha ln(1 + (e - 1) t)``."""
    return alpha * math.log1p((math.e - 1.0) * min(max(t, 0.0), 1.0))


def obrien_fleming_spending(alpha: float, t: float) -> float:
    """Lan-DeMets' O'Brien-Fleming-type spending function:
    ``2 - 2 Phi(z_{alpha/2} / sqrt(t))`` (``alpha`` at ``t = 1``)."""
    if t <= 0.0:
        return 0.0
    return 2.0 * upper_tail(z_upper(alpha / 2.0) / math.sqrt(min(t, 1.0)))


SPENDING: dict[str, Callable[[float, float], float]] = {
    POCOCK: pocock_spending,
    OBRIEN_FLEMING: obrien_fleming_spending,
}


def equal_fractions(looks: int) -> tuple[float, ...]:
    """``1/K, 2/K, ..., 1``: the information fractions of ``K`` equal rounds."""
    if looks < 1:
        raise ValueError(f"looks must be at least 1, got {looks!r}")
    return tuple(k / looks for k in range(1, looks + 1))


@dataclass(frozen=True)
class Boundary:
    """A group-sequential boundary: per look, the nominal critical value on the normal
    scale (``inf``: the look spends nothing) and the level spent by then."""

    alpha: float
    fractions: tuple[float, ...]
    z: tuple[float, ...]
    spent: tuple[float, ...]
    sides: int = 1

    @property
    def nominal(self) -> tuple[float, ...]:
        """Each look's nominal level: the single-look tail its critical value cuts
        (one-sided; both tails for ``sides=2``)."""
        return tuple(self.sides * upper_tail(z) for z in self.z)


# -- the recursive integration --------------------------------------------------------------

#: A density on a grid, as (points, Simpson weight x density at the point).
_Density = tuple[list[float], list[float]]


def _simpson(lo: float, hi: float, sd: float) -> tuple[list[float], list[float]]:
    """Points from ``lo`` to ``hi`` at most ``STEP_SD x sd`` apart (an even number of
    intervals) and Simpson's weights."""
    n = max(2, 2 * math.ceil((hi - lo) / (2.0 * STEP_SD * sd)))
    h = (hi - lo) / n
    xs = [lo + i * h for i in range(n + 1)]
    ws = [h / 3.0 * (1.0 if i in (0, n) else 4.0 if i % 2 else 2.0) for i in range(n + 1)]
    return xs, ws


def _region(b: float, t: float, sides: int) -> tuple[float, float]:
    """The continuation region of ``W(t)`` below the boundary ``b`` (on ``W``'s scale),
    cut at ``WIDTH_SD`` standard deviations."""
    half = WIDTH_SD * math.sqrt(t)
    return (-min(b, half) if sides == 2 else -half), min(b, half)


def _first(b: float, t: float, sides: int) -> _Density:
    """The density of ``W(t)`` (normal, variance ``t``) on its continuation region."""
    sd = math.sqrt(t)
    lo, hi = _region(b, t, sides)
    xs, ws = _simpson(lo, hi, sd)
    c = 1.0 / (sd * math.sqrt(2.0 * math.pi))
    return xs, [w * c * math.exp(-0.5 * (x / sd) ** 2) for x, w in zip(xs, ws, strict=True)]


def _advance(dens: _Density, b: float, t: float, delta: float, sides: int) -> _Density:
    """The density of ``W(t)`` on its continuation region, for paths that stayed in the
    previous look's region (``dens``), the increment normal with variance ``delta``."""
    sd = math.sqrt(delta)
    lo, hi = _region(b, t, sides)
    ys, ws = _simpson(lo, hi, min(sd, math.sqrt(t)))
    c = 1.0 / (sd * math.sqrt(2.0 * math.pi))
    inv = 1.0 / (2.0 * delta)
    xs, fs = dens
    out = []
    for y, w in zip(ys, ws, strict=True):
        s = 0.0
        for x, f in zip(xs, fs, strict=True):
            d = y - x
            s += f * math.exp(-d * d * inv)
        out.append(w * c * s)
    return ys, out


def _cross(dens: _Density, b: float, delta: float, sides: int) -> float:
    """The probability of staying in the previous regions and crossing ``b`` now."""
    sd = math.sqrt(delta)
    xs, fs = dens
    p = sum(f * upper_tail((b - x) / sd) for x, f in zip(xs, fs, strict=True))
    if sides == 2:
        p += sum(f * upper_tail((b + x) / sd) for x, f in zip(xs, fs, strict=True))
    return p


def _check(alpha: float, fractions: Sequence[float], sides: int) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, got {sides!r}")
    if not fractions or any(
        not 0.0 < t <= 1.0 or (i and t <= fractions[i - 1]) for i, t in enumerate(fractions)
    ):
        raise ValueError(f"information fractions must rise within (0, 1], got {tuple(fractions)!r}")


def _solve(dens: _Density, t: float, delta: float, target: float, sides: int) -> float:
    """The critical value (z scale) whose crossing probability now is ``target``."""
    if target <= 0.0:
        return math.inf
    sq = math.sqrt(t)
    lo, hi = 0.0, 40.0  # z; crossing falls as the boundary rises
    for _ in range(80):
        mid = (lo + hi) / 2.0
        if _cross(dens, mid * sq, delta, sides) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9:
            break
    return (lo + hi) / 2.0


def boundary(
    alpha: float,
    fractions: Sequence[float],
    spending: str = POCOCK,
    *,
    sides: int = 1,
) -> Boundary:
    """The boundary that spends ``alpha`` over looks at ``fractions`` by ``spending``
    (``POCOCK`` or ``OBRIEN_FLEMING``). The last fraction need not be 1: the boundary
    then spends ``alpha(t_K)`` (a plan cut short keeps the promise)."""
    _check(alpha, fractions, sides)
    if spending not in SPENDING:
        raise ValueError(f"spending must be one of {sorted(SPENDING)}, got {spending!r}")
    fn = SPENDING[spending]
    spent = [sides * fn(alpha / sides, t) for t in fractions]  # two-sided: each tail alpha/2
    z = [z_upper(spent[0] / sides)]
    dens = _first(z[0] * math.sqrt(fractions[0]), fractions[0], sides)
    for k in range(1, len(fractions)):
        t, delta = fractions[k], fractions[k] - fractions[k - 1]
        z.append(_solve(dens, t, delta, spent[k] - spent[k - 1], sides))
        if k + 1 < len(fractions):
            dens = _advance(dens, z[k] * math.sqrt(t), t, delta, sides)
    return Boundary(alpha, tuple(fractions), tuple(z), tuple(spent), sides)


def crossing(z: Sequence[float], fractions: Sequence[float], *, sides: int = 1) -> float:
    """The probability, with no real change, that some look crosses its critical value
    ``z[k]`` (normal scale) at the information fractions ``fractions``."""
    _check(0.5, fractions, sides)
    if len(z) != len(fractions):
        raise ValueError(f"{len(z)} critical values for {len(fractions)} looks")
    total = sides * upper_tail(z[0])
    dens = _first(z[0] * math.sqrt(fractions[0]), fractions[0], sides)
    for k in range(1, len(fractions)):
        t, delta = fractions[k], fractions[k] - fractions[k - 1]
        b = z[k] * math.sqrt(t)
        total += _cross(dens, b, delta, sides)
        if k + 1 < len(fractions):
            dens = _advance(dens, b, t, delta, sides)
    return total


@lru_cache(maxsize=512)
def look_level(alpha: float, look: int, looks: int, spending: str = POCOCK) -> float:
    """The one-sided nominal level of look ``look`` of at most ``looks`` equal rounds
    that together spend ``alpha`` (``alpha`` itself for a single look)."""
    if not 1 <= look <= looks:
        raise ValueError(f"look must be from 1 to {looks}, got {look!r}")
    if looks == 1:
        return alpha
    return boundary(alpha, equal_fractions(looks), spending).nominal[look - 1]
