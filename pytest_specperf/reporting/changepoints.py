"""Change points of a case's history: the runs after which a figure moved and stayed.

Detection is ruptures' ``KernelCPD`` (PELT search, linear kernel: the least-squares cost
of a shift in the mean; its C implementation takes well under a millisecond for a year of
nightly runs). Each figure is put on a scale where its noise is 1 before the search:
times and accept length as logarithms (a change is relative), divided by the run-to-run
noise estimated robustly from consecutive differences (so a single outlier does not
inflate it); the unaccounted time as its share of the step. The penalty per change point
is ``PENALTY * ln(n)`` (a BIC-like penalty, made stricter). The search sees the series
through a 3-run median filter and each new segment needs at least ``min_size`` runs, so a
single bad night is not a change; a change smaller than ``min_change`` (relative), or
``min_points`` for the unaccounted share (points of the step), is not reported. Where a
figure is its first server process's on some nights and the center over the processes on
others (``Point.first_process``), each stretch of one kind is searched on its own: the
change of kind is no change point.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pytest_specperf.judging.metrics import ACCEPT_LEN, MIN_PHASE_SHARE, STEP
from pytest_specperf.probe.phases import PHASES, UNACCOUNTED
from pytest_specperf.reporting.history import MissingExtra, Series

#: Penalty per change point, in units of ln(runs) on the unit-noise scale.
PENALTY: Final = 3.0
#: Fewest runs of a new segment.
MIN_SIZE: Final = 2
#: Smallest relative change reported (times, accept length): under the gate's default
#: phase tolerance, so that a creeping regression shows before it fails a night.
MIN_CHANGE: Final = 0.05
#: Smallest change of the unaccounted share reported, in fractions of the step (1 point).
MIN_POINTS: Final = 0.01
#: Run-to-run noise below this (relative) counts as this much: a series quieter than
#: the clock's resolution does not turn every rounding into a change.
NOISE_FLOOR: Final = 0.002
#: The same floor for the unaccounted share, in fractions of the step (0.05 points).
SHARE_NOISE_FLOOR: Final = 0.0005


@dataclass(frozen=True)
class Detection:
    """How change points are searched and which are reported (the module's defaults)."""

    min_change: float = MIN_CHANGE
    min_points: float = MIN_POINTS
    min_size: int = MIN_SIZE
    penalty: float = PENALTY


@dataclass(frozen=True)
class ChangePoint:
    """A figure of one case that moved at one run (the first run of the new level)."""

    metric: str
    index: int  # into the series' points
    before: float  # median of the segment before
    after: float  # median of the segment from ``index`` on
    #: judged in points of the step (the unaccounted share), not relatively
    in_points: bool = False

    @property
    def change(self) -> float:
        """Relative change (or points of the step, as a fraction)."""
        if self.in_points:
            return self.after - self.before
        return self.after / self.before - 1 if self.before else math.inf

    def describe(self) -> str:
        unit = "%" if not self.in_points else " pp of step"
        if self.in_points:
            return (f"{self.metric} {self.change * 100:+.1f}{unit} "
                    f"({self.before * 100:.1f}% -> {self.after * 100:.1f}%)")  # fmt: skip
        return (f"{self.metric} {self.change * 100:+.1f}{unit} "
                f"({self.before:.3g} -> {self.after:.3g})")  # fmt: skip


def _noise(xs: Sequence[float]) -> float:
    """Robust run-to-run noise: MAD of consecutive differences over sqrt(2), as sigma."""
    diffs = [b - a for a, b in itertools.pairwise(xs)]
    m = statistics.median(diffs)
    mad = statistics.median(abs(d - m) for d in diffs)
    return 1.4826 * mad / math.sqrt(2)


def despike(xs: Sequence[float]) -> list[float]:
    """``xs`` through a 3-run median filter (the first and last runs take the median of
    the three runs at their end): one bad night is dropped, a level that holds for two
    runs or more is kept, edges and all."""
    n = len(xs)
    if n < 3:
        return list(xs)
    windows = [min(max(i - 1, 0), n - 3) for i in range(n)]
    return [statistics.median(xs[w : w + 3]) for w in windows]


def segment_starts(xs: Sequence[float], *, min_size: int = MIN_SIZE,
                   penalty: float = PENALTY, floor: float = NOISE_FLOOR) -> list[int]:  # fmt: skip
    """Where the mean of ``xs`` shifts: the first index of each new segment.

    The search runs on the despiked series (``despike``), so single outliers do not count."""
    if len(xs) < 2 * min_size + 1:
        return []
    try:
        import numpy as np
        from ruptures import KernelCPD
    except ImportError as e:
        raise MissingExtra("ruptures", "change points", e) from None

    sigma = max(_noise(xs), floor)  # of the series as measured: the filter hides noise
    signal = (np.asarray(despike(xs), dtype=float) / sigma).reshape(-1, 1)
    algo = KernelCPD(kernel="linear", min_size=min_size, jump=1).fit(signal)
    ends: list[int] = [int(b) for b in algo.predict(pen=penalty * math.log(len(xs)))]
    return ends[:-1]


def tracked_metrics(s: Series) -> list[str]:
    """What is searched: the step, the phases that take at least ``MIN_PHASE_SHARE`` of
    the step (median over the history), the unaccounted share and the accept length."""
    step = statistics.median(s.values(STEP))
    phases = [p for p in PHASES if step and _median(s.values(p)) / step >= MIN_PHASE_SHARE]
    accept = [ACCEPT_LEN] if all(p.accept_len for p in s.points) else []
    return [STEP, *phases, UNACCOUNTED, *accept]


def _median(xs: Sequence[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return statistics.median(finite) if finite else 0.0


def _scaled(s: Series, metric: str) -> tuple[list[float], list[float], bool] | None:
    """The metric's raw values, its unit-noise-ready form, and whether it is a share."""
    raw = s.values(metric)
    if metric == UNACCOUNTED:
        raw = [u / st if st else 0.0 for u, st in zip(raw, s.values(STEP))]
        return (raw, raw, True) if all(math.isfinite(x) for x in raw) else None
    if not all(math.isfinite(x) and x > 0 for x in raw):
        return None
    return raw, [math.log(x) for x in raw], False


def _kinds(s: Series, metric: str) -> list[bool]:
    """Per point, whether ``metric`` as searched is a first-process figure (the
    unaccounted share: either of its parts)."""
    kinds = s.first_process(metric)
    if metric == UNACCOUNTED:
        kinds = [a or b for a, b in zip(kinds, s.first_process(STEP))]
    return kinds


def series_change_points(s: Series, metric: str, d: Detection = Detection(), *,
                         upto: int | None = None) -> list[ChangePoint]:  # fmt: skip
    """The change points of one figure of ``s`` (its first ``upto`` runs only, if given),
    within each stretch of points of one kind of figure (``_kinds``)."""
    scaled = _scaled(s, metric)
    if scaled is None:
        return []
    raw, xs, share = scaled
    raw, xs = raw[:upto], xs[:upto]
    floor = SHARE_NOISE_FLOOR if share else NOISE_FLOOR
    out = []
    for _, group in itertools.groupby(enumerate(_kinds(s, metric)[:upto]), key=lambda t: t[1]):
        at = [i for i, _ in group]
        lo, hi = at[0], at[-1] + 1
        starts = segment_starts(xs[lo:hi], min_size=d.min_size, penalty=d.penalty, floor=floor)
        bounds = [0, *starts, hi - lo]
        for k, start in enumerate(starts):
            before = statistics.median(raw[lo + bounds[k] : lo + start])
            after = statistics.median(raw[lo + start : lo + bounds[k + 2]])
            cp = ChangePoint(metric, lo + start, before, after, in_points=share)
            if abs(cp.change) >= (d.min_points if share else d.min_change):
                out.append(cp)
    return out


def change_points(s: Series, d: Detection = Detection()) -> list[ChangePoint]:
    """Every reported change point of every tracked figure of ``s``, oldest first."""
    found = [cp for m in tracked_metrics(s) for cp in series_change_points(s, m, d)]
    return sorted(found, key=lambda cp: (cp.index, cp.metric))


def new_change_points(s: Series, last_runs: int = 1,
                      d: Detection = Detection()) -> list[ChangePoint]:  # fmt: skip
    """The change points that the last ``last_runs`` runs of ``s`` brought to light: found
    with them, and not (within ``min_size`` runs) without them."""
    n = len(s.points)
    if last_runs < 1 or n <= last_runs:
        return []
    new = []
    for m in tracked_metrics(s):
        now = series_change_points(s, m, d)
        before = series_change_points(s, m, d, upto=n - last_runs)
        new += [cp for cp in now if all(abs(cp.index - b.index) > d.min_size for b in before)]
    return sorted(new, key=lambda cp: (cp.index, cp.metric))
