"""The noise of a comparison: within a run (paired blocks) and between server processes.

Model, on the log scale, for one judged form (``verify/rest``, ``step/ref``, ...). Block
``b`` of run ``i`` (one server process) is

    x[i][b] = mu + beta[b] + u[i] + e[i][b]

``beta[b]`` is the block's own effect (its prompt and layout seed, the same in every run:
it cancels when blocks are paired), ``u[i] ~ N(0, tau^2)`` the process effect (where the
pool's pages landed, clocks, the process's luck: the same for every block of a run), and
``e[i][b] ~ N(0, sigma^2)`` the block-to-block noise inside a run.

A baseline holds ``K`` runs of ``B`` blocks; the current measurement ``N`` runs of ``R``
rounds of the same ``B`` blocks (block ``r*B + b`` repeats block ``b``'s prompt and seed).
The change is judged on the geometric mean of the current runs' centers over the
geometric mean of the baseline runs' centers, and its noise is

    noise^2 = w^2 + tau^2 * (1/N + 1/K)

* ``w``: the paired block noise, the standard error of the mean of
  ``d[b] = mean over current runs and rounds of x[b] - mean over baseline runs of x[b]``
  (``stdev(d) / sqrt(B)``): what the blocks themselves say; for ``K = N = R = 1`` this
  is the paired noise of one run against one run.
* ``tau^2``: the between-process variance, a method-of-moments (two-way ANOVA, runs x
  blocks) estimate from the baseline's runs and any history runs ``K'`` in all:
  ``tau_hat^2 = max(0, (MS_runs - MS_blocks) / B)``, shrunk towards a prior ``tau0``
  worth ``PRIOR_RUNS`` runs: ``tau^2 = (PRIOR_RUNS * tau0^2 + (K' - 1) * tau_hat^2) /
  (PRIOR_RUNS + K' - 1)``. With one run there is no evidence and ``tau = tau0``; runs
  that agree pull it below ``tau0``, runs that disagree far above.

More rounds shrink only the current runs' share of ``w``; the rest (the baseline's blocks
and the between-process term) is the floor that only more processes lower. ``Noise``
predicts both, for the automatic extension and for the advice of an UNSTABLE verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Weight of the prior between-process variance, in runs: with K' runs the estimate is
#: ``(PRIOR_RUNS * tau0^2 + (K' - 1) * tau_hat^2) / (PRIOR_RUNS + K' - 1)``.
PRIOR_RUNS = 2.0
#: Most server processes a measurement spans (``--specperf-processes``).
MAX_PROCESSES = 16
#: Fewest paired blocks for a paired noise (two degrees of freedom).
MIN_PAIRED_BLOCKS = 3


@dataclass(frozen=True)
class RunBlocks:
    """One run of a judged form: its center and its block centers (both > 0)."""

    value: float
    blocks: tuple[float, ...]
    #: the center's relative standard error alone, for comparisons whose blocks do not pair
    rel_se: float = math.inf


@dataclass(frozen=True)
class Noise:
    """The relative noise of a comparison and its parts (log units, about fractions)."""

    total: float
    #: paired block noise of this comparison (``w``)
    within: float
    #: between-process standard deviation of one run's center (``tau``)
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
    #: the raw estimate ``tau_hat^2`` (None: fewer than 2 runs) and the runs ``K'`` behind it
    between_hat2: float | None = None
    between_runs: int = 1

    @property
    def paired(self) -> bool:
        return math.isfinite(self.now_var)

    @property
    def _process_part(self) -> float:
        return self.between**2 * (1 / self.now_runs + 1 / self.base_runs)

    @property
    def floor(self) -> float:
        """The noise with unlimited rounds: what more steps cannot lower (the baseline's
        blocks and the between-process part); the noise itself when unpaired."""
        if not self.paired:
            return self.total
        return math.sqrt(self.base_var + self._process_part)

    def predicted(self, rounds: float) -> float:
        """The noise with ``rounds`` rounds per current run, from the same estimates."""
        if not self.paired:
            return self.total
        return math.sqrt(self.floor**2 + self.now_var * self.rounds / rounds)

    def rounds_for(self, target: float) -> int | None:
        """Rounds per current run that bring the noise to ``target``; None if none can."""
        room = target**2 - self.floor**2
        if not self.paired or room <= 0:
            return None
        return max(1, math.ceil(self.now_var * self.rounds / room))

    def with_processes(self, processes: int) -> float:
        """The noise with ``processes`` current runs of one round each, against a baseline
        of as many runs (or its own, if it has more), from the same estimates."""
        base = max(self.base_runs, processes)
        per_run_now = self.now_var * self.rounds * self.now_runs
        per_run_base = self.base_var * self.base_runs
        var = per_run_now / processes + per_run_base / base
        return math.sqrt(var + self.between**2 * (1 / processes + 1 / base))

    def processes_for(self, target: float) -> int | None:
        """Processes (current runs; the baseline recorded in as many, if it has fewer) that
        bring the noise to ``target``; None if up to ``4 * MAX_PROCESSES`` cannot."""
        if not self.paired or target <= 0:
            return None
        for p in range(1, 4 * MAX_PROCESSES + 1):
            if self.with_processes(p) <= target:
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
    ``max(0, (MS_runs - MS_blocks) / B)``; None with fewer than 2 runs or 2 blocks."""
    k = len(rows)
    b = len(rows[0]) if rows else 0
    if k < 2 or b < 2 or any(len(r) != b for r in rows):
        return None
    run_means = [statistics.fmean(r) for r in rows]
    block_means = [statistics.fmean(r[j] for r in rows) for j in range(b)]
    grand = statistics.fmean(run_means)
    ms_runs = b * sum((m - grand) ** 2 for m in run_means) / (k - 1)
    resid = sum(
        (rows[i][j] - run_means[i] - block_means[j] + grand) ** 2
        for i in range(k)
        for j in range(b)
    )
    ms_blocks = resid / ((k - 1) * (b - 1))
    return max(0.0, (ms_runs - ms_blocks) / b)


def value_between(values: Sequence[float]) -> float | None:
    """Between-run variance from run centers alone (no blocks to separate the noise of
    each center: an upper bound); None with fewer than 2 runs."""
    logs = [math.log(v) for v in values if v > 0]
    return statistics.variance(logs) if len(logs) >= 2 else None


def shrunk_between(tau_hat2: float | None, runs: int, prior: float) -> float:
    """``tau^2`` pooled with the prior ``prior^2`` worth ``PRIOR_RUNS`` runs."""
    if tau_hat2 is None or runs < 2:
        return prior**2
    return (PRIOR_RUNS * prior**2 + (runs - 1) * tau_hat2) / (PRIOR_RUNS + runs - 1)


def geometric_center(runs: Sequence[RunBlocks]) -> float:
    """The geometric mean of the runs' centers (NaN if one is <= 0)."""
    if not runs or any(r.value <= 0 for r in runs):
        return math.nan
    return math.exp(statistics.fmean(math.log(r.value) for r in runs))


@dataclass(frozen=True)
class _Between:
    tau: float
    hat2: float | None
    runs: int
    history: int


def _between(
    base: Sequence[RunBlocks], history: Sequence[RunBlocks], period: int, prior: float
) -> _Between:
    """``tau`` from the folded rows of the baseline's and the history's runs (or, when
    fewer than two have blocks that fold, from all their centers: an upper bound)."""
    base_rows = [r for r in (log_rows(b.blocks, period) for b in base) if r is not None]
    hist_rows = [r for r in (log_rows(h.blocks, period) for h in history) if r is not None]
    rows = base_rows + hist_rows
    if len(rows) >= 2:
        hat2 = anova_between(rows)
        tau = math.sqrt(shrunk_between(hat2, len(rows), prior))
        return _Between(tau, hat2, len(rows), len(hist_rows))
    runs = [*base, *history]
    hat2 = value_between([r.value for r in runs])
    return _Between(math.sqrt(shrunk_between(hat2, len(runs), prior)), hat2, len(runs),
                    len(history))  # fmt: skip


def _unpaired_within(base: RunBlocks, now: RunBlocks) -> float:
    """Independent standard errors of the latest baseline run's and the first current
    run's centers (their blocks do not pair)."""
    return math.hypot(base.rel_se, now.rel_se)


def relative_noise(
    base: Sequence[RunBlocks],
    now: Sequence[RunBlocks],
    *,
    prior: float,
    history: Sequence[RunBlocks] = (),
) -> Noise:
    """The noise of ``now`` (N runs) against ``base`` (K runs), see the module docstring.

    ``prior`` is ``tau0``, the between-process standard deviation assumed without evidence.
    Blocks pair when every baseline run has the latest run's ``B`` blocks and every
    current run a multiple of ``B``; otherwise the two latest runs' standard errors are
    combined unpaired (``sigma`` NaN: no prediction).
    """
    if not base or not now:
        raise ValueError("a comparison needs at least one baseline run and one current run")
    period = len(base[-1].blocks)
    base_rows = [r for r in (log_rows(b.blocks, period) for b in base) if r is not None]
    now_rows = [r for r in (log_rows(n.blocks, period) for n in now) if r is not None]
    k, n = len(base), len(now)
    btw = _between(base, history, period, prior)
    paired = period >= MIN_PAIRED_BLOCKS and len(base_rows) == k and len(now_rows) == n
    if not paired:
        within = _unpaired_within(base[-1], now[0])
        total = math.sqrt(within**2 + btw.tau**2 * (1 / n + 1 / k))
        return Noise(total, within, btw.tau, math.nan, math.nan, period, 1, k, n, btw.history,
                     btw.hat2, btw.runs)  # fmt: skip
    rounds = min(len(r.blocks) for r in now) // period
    q = [statistics.fmean(r[j] for r in now_rows) for j in range(period)]
    p = [statistics.fmean(r[j] for r in base_rows) for j in range(period)]
    var_d = statistics.variance([a - b for a, b in zip(q, p)])
    # var(q) = var(beta) + now part, var(p) = var(beta) + base part, var(d) = both parts:
    # the block effects cancel in var(q) - var(p)
    now_part = min(max((var_d + statistics.variance(q) - statistics.variance(p)) / 2, 0.0), var_d)
    within = math.sqrt(var_d / period)
    total = math.sqrt(within**2 + btw.tau**2 * (1 / n + 1 / k))
    return Noise(total, within, btw.tau, now_part / period, (var_d - now_part) / period, period,
                 rounds, k, n, btw.history, btw.hat2, btw.runs)  # fmt: skip
