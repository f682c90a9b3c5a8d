"""The noise of a comparison, level by level: blocks, server processes, sittings.

Model, on the log scale, for one judged form (``verify/rest``, ``step/ref``, ...). Block
``b`` of run ``i`` (one server process) of sitting ``s`` (one pytest session's servers, at
one time on one machine) is

    x[s][i][b] = mu + beta[b] + v[s] + u[i] + e[i][b]

``beta[b]`` is the block's own effect (its prompt and layout seed, the same in every run:
it cancels when blocks are paired), ``v[s] ~ N(0, sigma_s^2)`` the sitting's offset (the
machine's state that hour: clocks, memory, neighbours; the same for every process of the
sitting), ``u[i] ~ N(0, tau^2)`` the process effect (where the pool's pages landed: the
same for every block of a run), and ``e[i][b] ~ N(0, sigma^2)`` the block-to-block noise.

A baseline holds ``K`` runs of ``B`` blocks from ``S`` sittings; the current measurement
``N`` runs of ``R`` rounds of the same ``B`` blocks, in one new sitting. The change is the
mean over blocks of the paired log differences ``d[b]`` (each side averaged over its runs
and rounds): the statistic judged is the one whose noise is computed. Its noise is

    noise^2 = w^2 + tau^2 * (1/N + 1/K) + sigma_s^2 * c_s

* ``w = stdev(d) / sqrt(B)``: the paired block noise (``B - 1`` degrees of freedom).
* ``tau^2``: the between-process variance, from the runs of each sitting (a two-way
  ANOVA runs x blocks, pooled within sittings: sitting offsets do not count as process
  noise), ``tau_hat^2 = max(0, (MS_runs - MS_blocks) / B)`` on ``sum(k_s - 1)`` degrees of
  freedom, pooled with a device prior ``tau0`` worth ``nu_tau`` degrees of freedom:
  ``tau^2 = (nu_tau tau0^2 + df tau_hat^2) / (nu_tau + df)``.
* ``sigma_s^2``: the sitting variance, from the sittings' means (``S - 1`` degrees of
  freedom, what the runs within them explain taken off), pooled the same way with the
  device prior ``sigma_s0`` worth ``nu_s``. One sitting: the prior alone.
* ``c_s = sum over sittings of (a_s - b_s)^2``, ``a_s`` and ``b_s`` the share of the current
  and the baseline runs from sitting ``s``: ``1 + 1/S`` for a new sitting against ``S``
  sittings of equal size, ``0`` when both sides share one sitting (an A/B run).

A metric the data show to be deterministic (``exact_sides``: every block of every run
identical, at the store's precision, within its side) has no sampling noise at any level:
its noise is zero, no prior is imposed on it, and its change is exact (docs/statistics.md,
"When the prior is not applied").

The priors never come from the tolerance: they are the device's, measured by ``specperf
calibrate`` and stored beside the baselines, or the documented provisional values below.
The verdict's critical value is Student's t on the Welch-Satterthwaite degrees of freedom
of the three parts (``judging.significance``).

More rounds shrink only the current runs' share of ``w``; the rest (the baseline's blocks,
the process and sitting terms) is the floor that only more processes or sittings lower.
``Noise`` predicts both, for the automatic extension and for an UNSTABLE verdict's advice.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_specperf.judging.stats import satterthwaite, stable

#: Most server processes a measurement spans (``--specperf-processes``).
MAX_PROCESSES = 16
#: Rounds per run beyond which no advice is given (``Noise.rounds_to_decide``).
MAX_ROUNDS = 1_000_000
#: Fewest paired blocks for a paired noise (two degrees of freedom).
MIN_PAIRED_BLOCKS = 3
#: The sitting of runs stored without one (baselines before schema 4): all one sitting.
LEGACY_SITTING = "legacy"
#: The sitting of current runs that carry none: a sitting of its own.
CURRENT_SITTING = "<current>"


@dataclass(frozen=True)
class LevelPrior:
    """What a comparison assumes, for one kind of judged form, about the levels its own
    runs cannot estimate: the between-process and the sitting standard deviations (log
    units, about fractions), each worth some degrees of freedom, and where they came from."""

    between: float
    between_df: float
    sitting: float
    sitting_df: float

    def __post_init__(self) -> None:
        for name in ("between", "sitting"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"LevelPrior.{name} must be a finite number >= 0, got {v!r}")
        for name in ("between_df", "sitting_df"):  # inf: a known variance
            v = getattr(self, name)
            if not v >= 0:
                raise ValueError(f"LevelPrior.{name} must be a number >= 0, got {v!r}")


#: The kinds of judged forms a device prior holds, in ``DevicePrior``'s field order (the
#: tolerance kinds of ``metrics.MetricSpec``).
PRIOR_KINDS = ("phase", "step")


@dataclass(frozen=True)
class DevicePrior:
    """The level priors of one device: for the phases' forms (``verify/rest``, accept
    length, shares) and for the step's (``step/ref``, tokens/s), with their source."""

    phase: LevelPrior
    step: LevelPrior
    #: where the numbers come from (a calibration's work dir and date, or "provisional")
    source: str
    #: True until ``specperf calibrate`` has measured them on this device
    provisional: bool

    def of(self, kind: str) -> LevelPrior:
        """The prior of a tolerance kind (``phase`` or ``step``, ``metrics.spec().tolerance``)."""
        return self.step if kind == PRIOR_KINDS[1] else self.phase

    def describe(self) -> str:
        p, s = self.phase, self.step
        state = "PROVISIONAL" if self.provisional else "measured"
        return (
            f"noise prior ({state}, {self.source}): between processes {p.between:.1%} "
            f"(phases), {s.between:.1%} (step); between sittings {p.sitting:.1%} (phases), "
            f"{s.sitting:.1%} (step)"
        )


#: The prior used until ``specperf calibrate`` measures one on the device. Derived from the
#: README's measured figures (2-core AMD EPYC and Intel Xeon boxes, 2026-12-01/03;
#: docs/statistics.md shows the arithmetic): between processes, the median ``tau_hat`` of
#: the 5-run baselines over their non-bimodal cases (phases 0.8% AMD, 1.1% Intel; step/ref
#: 2.5% and 2.8%) rounded up to 1.2% and 3.0%, worth 4 degrees of freedom; between
#: sittings, the largest offset of a one-sitting baseline from the median of 20 later A/A
#: runs over 6 cases (1.7% phases, 9.5% step/ref) divided by 1.6, the median of the
#: largest of 6 half-normal draws, rounded up: 1.1% and 6.0%, worth 6 degrees of freedom
#: (6 cases, one pair of sittings). Conservative: those offsets include the baseline's
#: own process noise.
PROVISIONAL_PRIOR = DevicePrior(
    phase=LevelPrior(between=0.012, between_df=4.0, sitting=0.011, sitting_df=6.0),
    step=LevelPrior(between=0.030, between_df=4.0, sitting=0.060, sitting_df=6.0),
    source="derived from the README's 2026-12 figures, docs/statistics.md; measure this "
    "device's with specperf calibrate",
    provisional=True,
)
#: A prior that assumes no process or sitting noise (tests of the block noise alone).
NO_PRIOR = DevicePrior(
    phase=LevelPrior(0.0, math.inf, 0.0, math.inf),
    step=LevelPrior(0.0, math.inf, 0.0, math.inf),
    source="none (block noise only)",
    provisional=False,
)


@dataclass(frozen=True)
class RunBlocks:
    """One run of a judged form: its center and its block centers (both > 0), the
    sitting it was measured in (None: unknown), and the rounds of the same blocks that
    ``blocks`` hold one after the other (the automatic extension's)."""

    value: float
    blocks: tuple[float, ...]
    #: the center's relative standard error alone, for comparisons whose blocks do not pair
    rel_se: float = math.inf
    sitting: str | None = None
    rounds: int = 1

    @property
    def round_blocks(self) -> int:
        """The blocks of one round (all of them when they do not split into whole rounds)."""
        n = len(self.blocks)
        return n // self.rounds if self.rounds > 1 and n % self.rounds == 0 else n


@dataclass(frozen=True)
class Noise:
    """The relative noise of a comparison and its parts (log units, about fractions)."""

    total: float
    #: paired block noise of this comparison (``w``)
    within: float
    #: between-process standard deviation of one run's center (``tau``, after the prior)
    between: float
    #: the parts of ``within^2`` due to the current runs' blocks and the baseline's
    #: (``now_var + base_var = within^2``; NaN when the blocks do not pair)
    now_var: float
    base_var: float
    blocks: int
    rounds: int
    base_runs: int
    now_runs: int
    #: runs behind ``between`` besides the baseline's (history)
    history_runs: int = 0
    #: the raw estimate ``tau_hat^2`` (None: no run of a sitting had a sibling) and the
    #: runs ``K'`` behind it
    between_hat2: float | None = None
    between_runs: int = 1
    #: sitting standard deviation (after the prior), its coefficient ``c_s``, the raw
    #: estimate (None: one sitting) and the sittings behind it
    sitting: float = 0.0
    sitting_coef: float = 0.0
    sitting_hat2: float | None = None
    sittings: int = 1
    #: degrees of freedom of each part and of the total (Welch-Satterthwaite)
    within_df: float = math.inf
    between_df: float = math.inf
    sitting_df: float = math.inf
    #: the statistic judged: mean paired log difference (NaN: unpaired, the centers' ratio)
    log_change: float = math.nan
    #: runs whose blocks were identical within their side (``exact_sides``): the noise is
    #: zero and no prior was applied; 0: the comparison is not exact
    exact_runs: int = 0
    #: the two sides' centers as the statistic sees them: the mean log block of the
    #: baseline's runs and of the current runs (``log_change`` is their difference); NaN
    #: when unpaired. Reports show ``exp`` of these beside the change, so the two agree.
    log_centers: tuple[float, float] = (math.nan, math.nan)
    #: the baseline was measured in the current runs' sitting, beside them (A/B: the
    #: reference side, ``sitting_coef`` 0): the extension's rounds are measured on both
    #: sides (mirrored), and each side's blocks of a round pair with the other's of that
    #: round (``blocks`` counts them all, ``rounds`` is 1), so more rounds shrink its block
    #: part too and add degrees of freedom to the block term, as new blocks do
    alongside: bool = False

    @property
    def paired(self) -> bool:
        return math.isfinite(self.now_var)

    @property
    def df(self) -> float:
        """Welch-Satterthwaite degrees of freedom of ``total^2``."""
        return satterthwaite(self._parts(self.within**2, self.now_runs, self.base_runs))

    def _parts(self, w2: float, now_runs: int, base_runs: int) -> list[tuple[float, float]]:
        return [
            (w2, self.within_df),
            (self.between**2 * (1 / now_runs + 1 / base_runs), self.between_df),
            (self.sitting**2 * self.sitting_coef, self.sitting_df),
        ]

    @property
    def _level_part(self) -> float:
        """The process and sitting parts of ``total^2``."""
        return (
            self.between**2 * (1 / self.now_runs + 1 / self.base_runs)
            + self.sitting**2 * self.sitting_coef
        )

    @property
    def floor(self) -> float:
        """The noise with unlimited rounds: what more steps cannot lower (the process and
        the sitting parts, and a stored baseline's blocks; not a baseline measured
        ``alongside``, whose rounds grow with the run's); the noise itself when
        unpaired."""
        if not self.paired:
            return self.total
        return math.sqrt(self._fixed_blocks + self._level_part)

    @property
    def _fixed_blocks(self) -> float:
        """The part of ``within^2`` that more rounds leave as it is: the stored baseline's."""
        return 0.0 if self.alongside else self.base_var

    def _blocks_at(self, rounds: float) -> float:
        """``within^2`` with ``rounds`` rounds per current run (and per baseline run, when
        it is measured ``alongside``)."""
        shrinking = self.now_var + (self.base_var if self.alongside else 0.0)
        return self._fixed_blocks + shrinking * self.rounds / rounds

    def predicted(self, rounds: float) -> float:
        """The noise with ``rounds`` rounds per current run, from the same estimates."""
        if not self.paired:
            return self.total
        return math.sqrt(self._blocks_at(rounds) + self._level_part)

    def df_at_rounds(self, rounds: float) -> float:
        """The degrees of freedom of ``predicted(rounds)``. More rounds shrink the block
        term, so where the process term rests on fewer degrees of freedom the total's fall.
        Against a stored baseline the block term keeps today's (rounds of its blocks pair
        with its one measurement of each); ``alongside``, each round's blocks pair anew, so
        they grow with the blocks measured."""
        parts = self._parts(self._blocks_at(rounds), self.now_runs, self.base_runs)
        if self.alongside:
            parts[0] = (parts[0][0], (self.within_df + 1) * rounds / self.rounds - 1)
        return satterthwaite(parts)

    def rounds_to_decide(self, band: float, critical: Callable[[float], float]) -> int | None:
        """The fewest rounds per current run whose noise times the critical value at their
        degrees of freedom (``critical(df)``) comes within ``band`` (log scale); None if no
        number up to ``MAX_ROUNDS`` does. More rounds shrink the noise, but where the
        process term rests on fewer degrees of freedom they also lower the total's, so
        ``t x noise`` can fall and then rise again toward its value at unlimited rounds: a
        ternary search finds its lowest point (one dip assumed), and a bisection the first
        count before it that comes within the band."""
        if not self.paired or not band > 0:
            return None

        def reach(rounds: float) -> float:
            return critical(self.df_at_rounds(rounds)) * self.predicted(rounds)

        lo, hi = 1, MAX_ROUNDS
        while hi - lo > 2:
            third = (hi - lo) // 3
            if reach(lo + third) <= reach(hi - third):
                hi = hi - third
            else:
                lo = lo + third
        lowest = min(range(lo, hi + 1), key=reach)
        if not reach(lowest) <= band:
            return None
        lo, hi = 0, lowest  # reach(lo) > band (or lo = 0), reach(hi) <= band
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if reach(mid) <= band else (mid, hi)
        return hi

    def _parts_at(self, processes: int) -> list[tuple[float, float]]:
        """``_parts`` with ``processes`` current runs of one round each, against a baseline
        of as many runs (or its own, if it has more). The process term's degrees of freedom
        grow, at least, by one for each process beyond both sides' counts today (A/B: both
        sides' processes feed it, so it gains more; stored: only the baseline's do, and one
        re-recorded in ``processes`` runs of one sitting has ``processes - 1``, at least
        today's plus ``processes - base_runs``)."""
        base = max(self.base_runs, processes)
        per_run_now = self.now_var * self.rounds * self.now_runs
        w2 = per_run_now / processes + self.base_var * self.base_runs / base
        (w, w_df), (tau, tau_df), sitting = self._parts(w2, processes, base)
        extra = max(0, processes - max(self.base_runs, self.now_runs))
        return [(w, w_df), (tau, tau_df + extra), sitting]

    def with_processes(self, processes: int) -> float:
        """The noise with ``processes`` current runs (``_parts_at``), from the same
        estimates (the sitting part stays: more processes of one sitting cannot lower it)."""
        return math.sqrt(sum(v for v, _ in self._parts_at(processes)))

    def df_with_processes(self, processes: int) -> float:
        """The degrees of freedom of ``with_processes(processes)`` (at least)."""
        return satterthwaite(self._parts_at(processes))

    def processes_for(self, band: float, critical: Callable[[float], float]) -> int | None:
        """Processes (current runs; the baseline recorded in as many, if it has fewer) whose
        noise times the critical value at their degrees of freedom (``critical(df)``)
        comes within ``band`` (log scale): more processes narrow the noise and, where the
        process term rests on few degrees of freedom, the critical value too. None if
        ``MAX_PROCESSES`` (the most ``--specperf-processes`` takes) cannot."""
        if not self.paired or band <= 0:
            return None
        for p in range(1, MAX_PROCESSES + 1):
            if critical(self.df_with_processes(p)) * self.with_processes(p) <= band:
                return p
        return None


def log_rows(blocks: Sequence[float], period: int) -> list[float] | None:
    """Log block centers folded into ``period`` blocks (the mean over rounds of each), or
    None when they do not fold (a length that is not a multiple, a center <= 0)."""
    if period < 1 or not blocks or len(blocks) % period or any(b <= 0 for b in blocks):
        return None
    rounds = len(blocks) // period
    logs = [math.log(b) for b in blocks]
    return [statistics.fmean(logs[r * period + b] for r in range(rounds)) for b in range(period)]


def anova_between(rows: Sequence[Sequence[float]]) -> float | None:
    """Method-of-moments between-run variance from log block rows (runs x blocks):
    ``max(0, (MS_runs - MS_blocks) / B)``; None with fewer than 2 runs or 2 blocks.
    (All rows one sitting: ``LevelEstimate`` with one label gives the same.)"""
    est = level_estimate(rows, [""] * len(rows))
    return est.between_hat2 if est is not None else None


def anova_f(rows: Sequence[Sequence[float]]) -> tuple[float, int, int] | None:
    """The runs x blocks F statistic ``MS_runs / MS_blocks`` of log block rows (one
    sitting) and its degrees of freedom ``(K - 1, (K - 1)(B - 1))``; None with fewer than 2
    runs or 2 blocks, or no residual."""
    est = level_estimate(rows, [""] * len(rows))
    if est is None or est.between_hat2 is None or est.ms_blocks <= 0:
        return None
    k, b = len(rows), est.blocks
    means = [statistics.fmean(r) for r in rows]
    ms_runs = b * statistics.variance(means)
    return ms_runs / est.ms_blocks, k - 1, (k - 1) * (b - 1)


@dataclass(frozen=True)
class LevelEstimate:
    """What runs of several sittings say about the levels (before any prior)."""

    #: ``tau_hat^2`` on ``between_df`` degrees of freedom (None: no sitting had 2 runs)
    between_hat2: float | None
    between_df: int
    #: block-to-block residual mean square (``MS_blocks``) and the blocks per run
    ms_blocks: float
    blocks: int
    #: the sittings' means (log units) and runs per sitting, in label order
    sitting_means: tuple[float, ...]
    sitting_runs: tuple[int, ...]

    @property
    def sittings(self) -> int:
        return len(self.sitting_means)

    def sitting_hat2(self, tau2: float) -> float | None:
        """``sigma_s_hat^2`` given the process variance ``tau2`` (after its prior):
        ``max(0, var(sitting means) - mean(1/k_s) * (tau2 + MS_blocks / B))``; None with
        one sitting."""
        if self.sittings < 2:
            return None
        per_run = tau2 + self.ms_blocks / self.blocks
        explained = statistics.fmean(1 / k for k in self.sitting_runs) * per_run
        return max(0.0, statistics.variance(self.sitting_means) - explained)


def level_estimate(rows: Sequence[Sequence[float]], labels: Sequence[str]) -> LevelEstimate | None:
    """The nested ANOVA of log block rows (runs x blocks), each run labelled by its
    sitting: ``MS_blocks`` from the two-way residual, ``MS_runs`` from the run means'
    spread within each sitting (pooled), the sittings' means. None with fewer than 2 runs
    or 2 blocks."""
    k = len(rows)
    b = len(rows[0]) if rows else 0
    if k < 2 or b < 2 or any(len(r) != b for r in rows) or len(labels) != k:
        return None
    run_means = [statistics.fmean(r) for r in rows]
    block_means = [statistics.fmean(r[j] for r in rows) for j in range(b)]
    grand = statistics.fmean(run_means)
    resid = sum(
        (rows[i][j] - run_means[i] - block_means[j] + grand) ** 2
        for i in range(k)
        for j in range(b)
    )
    ms_blocks = resid / ((k - 1) * (b - 1))
    groups: dict[str, list[float]] = {}
    for label, m in zip(labels, run_means):
        groups.setdefault(label, []).append(m)
    df = sum(len(g) - 1 for g in groups.values())
    hat2 = None
    if df > 0:
        ss = sum((m - statistics.fmean(g)) ** 2 for g in groups.values() for m in g)
        hat2 = max(0.0, (b * ss / df - ms_blocks) / b)
    order = sorted(groups)
    return LevelEstimate(
        hat2, df, ms_blocks, b,
        tuple(statistics.fmean(groups[s]) for s in order), tuple(len(groups[s]) for s in order),
    )  # fmt: skip


def value_between(values: Sequence[float]) -> float | None:
    """Between-run variance from run centers alone (no blocks to separate the noise of
    each center: an upper bound); None with fewer than 2 runs."""
    logs = [math.log(v) for v in values if v > 0]
    return statistics.variance(logs) if len(logs) >= 2 else None


def pooled(hat2: float | None, df: float, prior: float, prior_df: float) -> tuple[float, float]:
    """A variance estimate on ``df`` degrees of freedom pooled with the prior ``prior^2``
    worth ``prior_df``: ``((prior_df prior^2 + df hat2) / (prior_df + df), prior_df + df)``.
    Without an estimate (or ``df`` 0): the prior, on its own degrees of freedom."""
    if hat2 is None or df <= 0:
        return prior**2, prior_df
    if math.isinf(prior_df):
        return prior**2, prior_df
    total = prior_df + df
    return (prior_df * prior**2 + df * hat2) / total, total


def geometric_center(runs: Sequence[RunBlocks]) -> float:
    """The geometric mean of the runs' centers (NaN if one is <= 0)."""
    if not runs or any(r.value <= 0 for r in runs):
        return math.nan
    return math.exp(statistics.fmean(math.log(r.value) for r in runs))


def sitting_coefficient(base: Sequence[str], now: Sequence[str]) -> float:
    """``c_s = sum_s (a_s - b_s)^2``: the sitting variance's weight in the variance of
    the current runs' mean minus the baseline runs' mean (equal weight per run)."""
    shares: dict[str, float] = {}
    for s in now:
        shares[s] = shares.get(s, 0.0) + 1 / len(now)
    for s in base:
        shares[s] = shares.get(s, 0.0) - 1 / len(base)
    return sum(x * x for x in shares.values())


def _sittings(runs: Sequence[RunBlocks], default: str) -> list[str]:
    return [r.sitting if r.sitting is not None else default for r in runs]


def _sitting_terms(base: Sequence[RunBlocks], now: Sequence[RunBlocks]) -> tuple[float, bool]:
    """``c_s``, and whether the baseline was measured beside the current runs, in their one
    sitting (A/B: ``Noise.alongside``)."""
    b, n = _sittings(base, LEGACY_SITTING), _sittings(now, CURRENT_SITTING)
    return sitting_coefficient(b, n), len(set(b) | set(n)) == 1


@dataclass(frozen=True)
class _Levels:
    tau2: float
    tau_df: float
    hat2: float | None
    runs: int
    history: int
    sit2: float
    sit_df: float
    sit_hat2: float | None
    sittings: int


def _levels(base: Sequence[RunBlocks], history: Sequence[RunBlocks], prior: LevelPrior) -> _Levels:
    """The process and sitting variances from the folded rows of the baseline's and the
    history's runs (or, when fewer than two have blocks that fold, from all their
    centers: an upper bound for the process part, the sitting part from the prior).
    The rows are folded onto one round of the latest baseline run's blocks, not onto all
    of them: an A/B run that extended measured both sides' rounds, and the history's
    nights of one round must still count beside them."""
    runs = [*base, *history]
    labels = _sittings(base, LEGACY_SITTING) + [
        h.sitting if h.sitting is not None else f"history {i}" for i, h in enumerate(history)
    ]
    rows = [(log_rows(r.blocks, base[-1].round_blocks), s) for r, s in zip(runs, labels)]
    folded = [(r, s) for r, s in rows if r is not None]
    hist = sum(1 for r, _ in rows[len(base) :] if r is not None)
    est = level_estimate([r for r, _ in folded], [s for _, s in folded])
    if est is None:
        hat2 = value_between([r.value for r in runs])
        tau2, tau_df = pooled(hat2, len(runs) - 1, prior.between, prior.between_df)
        sit2, sit_df = pooled(None, 0, prior.sitting, prior.sitting_df)
        return _Levels(tau2, tau_df, hat2, len(runs), len(history), sit2, sit_df, None, 1)
    tau2, tau_df = pooled(est.between_hat2, est.between_df, prior.between, prior.between_df)
    sit_hat2 = est.sitting_hat2(tau2)
    sit2, sit_df = pooled(sit_hat2, est.sittings - 1, prior.sitting, prior.sitting_df)
    return _Levels(tau2, tau_df, est.between_hat2, len(folded), hist, sit2, sit_df, sit_hat2,
                   est.sittings)  # fmt: skip


def _stored_rounds(blocks: Sequence[float], period: int) -> tuple[float, ...] | None:
    """A run's blocks as stored (``stats.stable``: 6 significant digits), when every round
    of its ``period`` blocks is the same, else None (or when they do not fold, or a block
    is not a positive finite number)."""
    if period < 1 or not blocks or len(blocks) % period:
        return None
    if not all(math.isfinite(b) and b > 0 for b in blocks):
        return None
    rounded = tuple(stable(b) for b in blocks)
    first = rounded[:period]
    if any(rounded[i : i + period] != first for i in range(period, len(rounded), period)):
        return None
    return first


def exact_sides(
    base: Sequence[RunBlocks], now: Sequence[RunBlocks], history: Sequence[RunBlocks] = ()
) -> tuple[tuple[float, ...], tuple[float, ...], int] | None:
    """The two sides' blocks, and the runs behind them, when the data show no spread at
    any level: every baseline run's blocks identical (as stored: ``stats.stable``) to the
    others', every current run's (each of its rounds) to the others', and every history
    run's of these blocks to one side's; at least ``MIN_PAIRED_BLOCKS`` blocks; and either
    both sides the same (A/A: the baseline's runs and this run's, two at least) or each
    side at least two server processes (a difference between sides repeated in each).
    None otherwise: the metric is not shown deterministic, and the levels and the prior
    apply.

    A continuous noisy quantity essentially never qualifies: two block means agree to 6
    significant digits with a chance of about ``1e-5 / spread`` each, and this asks it of
    every block of every repeated run (docs/statistics.md, "When the prior is not
    applied")."""
    if not base or not now:
        return None
    period = base[-1].round_blocks  # one round: each run's rounds must repeat it
    if period < MIN_PAIRED_BLOCKS:
        return None
    sides = []
    for runs in (base, now):
        rows = [_stored_rounds(r.blocks, period) for r in runs]
        first = rows[0]
        if first is None or any(r != first for r in rows):
            return None
        sides.append(first)
    a, b = sides
    if a != b and (len(base) < 2 or len(now) < 2):
        return None
    if len(base) + len(now) < 2:
        return None
    # history runs of other blocks say nothing of these (the levels leave them out too;
    # a night of one round is of these blocks when the sides measured several)
    hist = [h for h in history if log_rows(h.blocks, period) is not None]
    if any(_stored_rounds(h.blocks, period) not in (a, b) for h in hist):
        return None
    # a history run that is one of the current runs (A/B's tested side as the evidence of
    # the between-process noise, ``judging.ab.tested_evidence``) is not another run
    others = [h for h in hist if not any(h.blocks is n.blocks for n in now)]
    return a, b, len(base) + len(now) + len(others)


def _unpaired_within(base: RunBlocks, now: RunBlocks) -> float:
    """Independent standard errors of the latest baseline run's and the first current
    run's centers (their blocks do not pair)."""
    return math.hypot(base.rel_se, now.rel_se)


def relative_noise(
    base: Sequence[RunBlocks],
    now: Sequence[RunBlocks],
    *,
    prior: LevelPrior,
    history: Sequence[RunBlocks] = (),
) -> Noise:
    """The noise of ``now`` (N runs) against ``base`` (K runs), see the module docstring.

    ``prior`` holds ``tau0`` and ``sigma_s0``, assumed without evidence. Blocks pair when
    every baseline run has the latest run's ``B`` blocks and every current run a multiple
    of ``B``; otherwise the two latest runs' standard errors are combined unpaired (no
    prediction, ``log_change`` NaN: the centers' ratio is judged).
    """
    if not base or not now:
        raise ValueError("a comparison needs at least one baseline run and one current run")
    period = len(base[-1].blocks)
    base_rows = [r for r in (log_rows(b.blocks, period) for b in base) if r is not None]
    now_rows = [r for r in (log_rows(n.blocks, period) for n in now) if r is not None]
    k, n = len(base), len(now)
    coef, alongside = _sitting_terms(base, now)
    exact = exact_sides(base, now, history)
    if exact is not None:  # no spread at any level: no noise, and no prior imposed
        a, b, runs = exact
        change = statistics.fmean(math.log(y) - math.log(x) for x, y in zip(a, b))
        rounds = min(len(r.blocks) for r in now) // period
        hist = runs - k - n
        centers = (statistics.fmean(map(math.log, a)), statistics.fmean(map(math.log, b)))
        return Noise(0.0, 0.0, 0.0, 0.0, 0.0, period, rounds, k, n, hist, 0.0, k + hist, 0.0,
                     coef, None, 1, math.inf, math.inf, math.inf, change, runs,
                     centers)  # fmt: skip
    lv = _levels(base, history, prior)
    level_var = lv.tau2 * (1 / n + 1 / k) + lv.sit2 * coef

    def noise(within: float, now_var: float, base_var: float, rounds: int, within_df: float,
              log_change: float, centers: tuple[float, float] = (math.nan, math.nan),
              ) -> Noise:  # fmt: skip
        return Noise(
            math.sqrt(within**2 + level_var), within, math.sqrt(lv.tau2), now_var, base_var,
            period, rounds, k, n, lv.history, lv.hat2, lv.runs, math.sqrt(lv.sit2), coef,
            lv.sit_hat2, lv.sittings, within_df, lv.tau_df, lv.sit_df, log_change,
            log_centers=centers, alongside=alongside,
        )  # fmt: skip

    paired = period >= MIN_PAIRED_BLOCKS and len(base_rows) == k and len(now_rows) == n
    if not paired:
        within = _unpaired_within(base[-1], now[0])
        df = len(now[0].blocks) - 1 if len(now[0].blocks) >= 2 else math.inf
        return noise(within, math.nan, math.nan, 1, df, math.nan)
    rounds = min(len(r.blocks) for r in now) // period
    q = [statistics.fmean(r[j] for r in now_rows) for j in range(period)]
    p = [statistics.fmean(r[j] for r in base_rows) for j in range(period)]
    d = [a - b for a, b in zip(q, p)]
    var_d = statistics.variance(d)
    # var(q) = var(beta) + now part, var(p) = var(beta) + base part, var(d) = both parts:
    # the block effects cancel in var(q) - var(p)
    now_part = min(max((var_d + statistics.variance(q) - statistics.variance(p)) / 2, 0.0), var_d)
    within = math.sqrt(var_d / period)
    return noise(within, now_part / period, (var_d - now_part) / period, rounds, period - 1,
                 statistics.fmean(d), (statistics.fmean(p), statistics.fmean(q)))  # fmt: skip


def pooled_df(estimates: Sequence[LevelEstimate]) -> tuple[int, int]:
    """The degrees of freedom the cases' estimates pool for the device-wide mean:
    ``(between processes, between sittings)``."""
    return (
        sum(e.between_df for e in estimates if e.between_hat2 is not None),
        sum(e.sittings - 1 for e in estimates if e.sittings >= 2),
    )


def level_spread_df(
    estimates: Sequence[LevelEstimate], tau2: float
) -> tuple[float | None, float | None]:
    """What a device-wide between-process and sitting variance are worth as predictors of
    one case (``case_spread_df`` over the cases' estimates; the sitting ones given the
    process variance ``tau2``): ``(between, sitting)``, None where the cases agree within
    their sampling."""
    tau = [(e.between_hat2, float(e.between_df)) for e in estimates if e.between_hat2 is not None]
    sit = [(e.sitting_hat2(tau2) or 0.0, float(e.sittings - 1))
           for e in estimates if e.sittings >= 2]  # fmt: skip
    return case_spread_df(tau), case_spread_df(sit)


def _capped(df: float, cap: float | None) -> float:
    """``df`` no more than ``cap`` (to 0.1), and no less than 1 for a cap: a device value
    is worth at least one case's observation of it."""
    return df if cap is None else min(df, max(1.0, round(cap, 1)))


def measured_prior(
    estimates: Mapping[str, Sequence[LevelEstimate]], source: str, *, fallback: DevicePrior
) -> DevicePrior:
    """The device prior a calibration measured: per kind (``PRIOR_KINDS``), the level
    estimates of its cases (``level_estimate`` of each case's judged form over runs from
    several sittings) pooled by degrees of freedom: ``tau^2 = sum(df_i tau_hat_i^2) /
    sum(df_i)``, then ``sigma_s^2`` likewise from each case's sittings (what the pooled
    ``tau^2`` explains taken off). Each is worth, for one case, no more than the cases'
    spread allows (``level_spread_df``): ``sum(df_i)`` is what the device-wide mean rests
    on, but a case whose own variance differs from it learns that mean, not its own. A kind,
    or a level, with no degrees of freedom keeps ``fallback``'s value (and the result stays
    provisional)."""
    levels: list[LevelPrior] = []
    provisional = fallback.provisional and not estimates
    for kind in PRIOR_KINDS:
        ests = list(estimates.get(kind, ()))
        old = fallback.of(kind)
        tau_df, sit_df = pooled_df(ests)
        if tau_df > 0:
            tau2 = sum(e.between_df * (e.between_hat2 or 0.0) for e in ests) / tau_df
        else:
            tau2, provisional = old.between**2, True
        sits = [(e.sittings - 1, e.sitting_hat2(tau2)) for e in ests if e.sittings >= 2]
        if sit_df > 0:
            sit2 = sum(df * (h or 0.0) for df, h in sits) / sit_df
        else:
            sit2, provisional = old.sitting**2, True
        cap_tau, cap_sit = level_spread_df(ests, tau2)
        tau_w = _capped(float(tau_df), cap_tau) if tau_df else old.between_df
        sit_w = _capped(float(sit_df), cap_sit) if sit_df else old.sitting_df
        levels.append(LevelPrior(math.sqrt(tau2), tau_w, math.sqrt(sit2), sit_w))
    return DevicePrior(levels[0], levels[1], source, provisional)


def case_spread_df(parts: Sequence[tuple[float, float]]) -> float | None:
    """How many degrees of freedom one device-wide value is worth as a predictor of one
    case's variance, given each case's estimate ``(v_i, df_i)``: were the cases' true
    variances ``m x chi2_nu / nu`` around the pooled ``m = sum(df_i v_i) / sum(df_i)``,
    their spread would be ``2 m^2 / nu``; the spread is the variance of the ``v_i`` over the
    cases less what their own sampling adds (``mean(2 v_i^2 / df_i)``). None with fewer
    than 3 cases, or where the cases differ no more than their sampling says (the pooled
    degrees of freedom then stand)."""
    usable = [(v, df) for v, df in parts if df > 0 and math.isfinite(v) and v >= 0]
    if len(usable) < 3:
        return None
    m = sum(df * v for v, df in usable) / sum(df for _, df in usable)
    spread = statistics.variance([v for v, _ in usable])
    spread -= statistics.fmean(2 * v * v / df for v, df in usable)
    if spread <= 0 or m <= 0:
        return None
    return 2 * m * m / spread
