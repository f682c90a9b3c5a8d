"""The variance at each level a calibration measured, and what it costs to shrink it.

A calibration over several sittings (``specperf calibrate --sitting K``) holds, per case,
runs (server processes) of known sittings: the baseline recorded in each sitting (several
processes each) and every quiet A/A run (one process, a sitting of its own). For each
judged form this module pools, over the cases, the nested ANOVA of ``judging.noise``
(``level_estimate``): the block-to-block variance ``sigma^2`` (``MS_blocks``, per block of
one run), the between-process ``tau^2`` and the sitting ``sigma_s^2``, each on its degrees
of freedom, and derives Kalibera & Jones's cost-optimal repetition counts ("Rigorous
benchmarking in reasonable time", ISMM 2013): at level ``i`` (blocks, then processes)

    r_i = ceil(sqrt(c_{i+1} / c_i * S_i^2 / S_{i+1}^2))

with ``c`` the cost of one more repetition at a level and ``S^2`` its variance; and for a
target effect, the baseline sittings a stored-baseline comparison needs (the current run's
own sitting is a floor no baseline lowers: ``None`` when the target is under it).

Pure arithmetic on numbers; the calibration harness (``cli.calibrate``) feeds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from pytest_specperf.judging.noise import LevelEstimate, level_estimate, log_rows
from pytest_specperf.judging.significance import MAX_LOOKS, Family

#: Largest repetition count the table proposes at a level (a level with no measurable
#: variance above it would otherwise ask for infinitely many of the cheaper one).
MAX_COUNT = 64
#: The default suite's shape (``perf_tests``: 7 tests; a speculative case's gates: step,
#: unaccounted, accept length, draft and verify) and the per-gate level it gives with the
#: automatic extension (docs/statistics.md, 7): the one-sided false-alarm level a single
#: gate is judged at, 4.46e-4 (``Family``'s arithmetic, not a copy of it), where every case
#: plans ``MAX_LOOKS`` (a case too slow for them plans fewer and gets more: the sample
#: sizes planned here are then on the safe side).
DEFAULT_SUITE_TESTS = 7
DEFAULT_SUITE_GATES = 5
DEFAULT_GATE_ALPHA = Family(tests=DEFAULT_SUITE_TESTS, looks=MAX_LOOKS).gate_alpha(
    DEFAULT_SUITE_GATES
)
#: Detection probability the sample sizes aim at (19 times in 20).
DEFAULT_POWER = 0.95


@dataclass(frozen=True)
class Costs:
    """Seconds one more repetition costs at each level: a block (its steps), a server
    process (start, warm-up, KV fill), a sitting (a run of the suite)."""

    block: float
    process: float
    sitting: float

    def __post_init__(self) -> None:
        for name in ("block", "process", "sitting"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"cost of a {name}: expected seconds > 0, got {v!r}")


#: The costs docs/statistics.md section 7 assumes on the 2-core box (a block of 8 steps
#: about 2 s, a process 15 s, a suite run 72 s); ``--costs`` replaces them.
DEFAULT_COSTS = Costs(block=2.0, process=15.0, sitting=72.0)


def parse_costs(text: str) -> Costs:
    """``block=2,process=15,sitting=72`` (any subset; the rest from ``DEFAULT_COSTS``);
    ``ValueError`` naming the part and the fix."""
    vals = {"block": DEFAULT_COSTS.block, "process": DEFAULT_COSTS.process,
            "sitting": DEFAULT_COSTS.sitting}  # fmt: skip
    for part in text.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name not in vals:
            raise ValueError(
                f"{part.strip()!r}: expected block=S, process=S or sitting=S (seconds), "
                "comma-separated, e.g. block=2,process=15,sitting=72"
            )
        try:
            vals[name] = float(value)
        except ValueError:
            raise ValueError(f"{part.strip()!r}: {value!r} is not a number of seconds") from None
    return Costs(**vals)


@dataclass(frozen=True)
class FormLevels:
    """One judged form's variance at each level, pooled over the cases (log units: a
    standard deviation of 0.01 is about 1%)."""

    form: str
    cases: int
    #: blocks per run (the folding period) of the cases, the smallest
    blocks: int
    block_var: float
    block_df: int
    between_var: float | None
    between_df: int
    sitting_var: float | None
    sitting_df: int

    @property
    def sds(self) -> tuple[float, float | None, float | None]:
        def sd(v: float | None) -> float | None:
            return None if v is None else math.sqrt(v)

        return math.sqrt(self.block_var), sd(self.between_var), sd(self.sitting_var)


def case_estimate(runs: Sequence[tuple[str, Sequence[float]]], period: int) -> LevelEstimate | None:
    """One case's nested ANOVA of a form from ``(sitting, block centers)`` runs, folded to
    ``period`` blocks (runs whose blocks do not fold are left out)."""
    rows = [(log_rows(b, period), s) for s, b in runs]
    folded = [(r, s) for r, s in rows if r is not None]
    return level_estimate([r for r, _ in folded], [s for _, s in folded])


def pool(form: str, estimates: Sequence[LevelEstimate]) -> FormLevels | None:
    """The cases' estimates of ``form`` pooled by degrees of freedom, as
    ``noise.measured_prior`` pools them: ``sigma^2`` over the two-way residuals' degrees
    of freedom, ``tau^2`` over the within-sitting ones, then ``sigma_s^2`` per case given
    the pooled ``tau^2``, over ``sittings - 1`` each. None without an estimate."""
    if not estimates:
        return None
    res_df = [(sum(e.sitting_runs) - 1) * (e.blocks - 1) for e in estimates]
    block_df = sum(res_df)
    block_var = sum(df * e.ms_blocks for df, e in zip(res_df, estimates)) / max(block_df, 1)
    tau_df = sum(e.between_df for e in estimates if e.between_hat2 is not None)
    tau2 = (
        sum(e.between_df * (e.between_hat2 or 0.0) for e in estimates) / tau_df if tau_df else None
    )
    sits = [(e.sittings - 1, e.sitting_hat2(tau2 or 0.0)) for e in estimates if e.sittings >= 2]
    sit_df = sum(df for df, _ in sits)
    sit2 = sum(df * (h or 0.0) for df, h in sits) / sit_df if sit_df else None
    return FormLevels(form, len(estimates), min(e.blocks for e in estimates), block_var,
                      block_df, tau2, tau_df, sit2, sit_df)  # fmt: skip


def _ratio_count(cost_up: float, cost: float, var: float, var_up: float | None) -> int:
    """Kalibera & Jones: ``ceil(sqrt(cost_up / cost * var / var_up))``, capped at
    ``MAX_COUNT`` (an upper level with no measured variance: as many as the cap)."""
    if var_up is None or var_up <= 0:
        return MAX_COUNT
    return max(1, min(MAX_COUNT, math.ceil(math.sqrt(cost_up / cost * var / var_up))))


@dataclass(frozen=True)
class Plan:
    """What the levels ask for: blocks per process and processes per sitting (Kalibera
    & Jones), and the baseline sittings a stored-baseline comparison needs for ``target``."""

    blocks_per_process: int
    processes_per_sitting: int
    #: the noise of one new sitting against a baseline of infinitely many (the floor)
    floor: float
    #: baseline sittings needed for ``target`` (None: the floor is above what it needs)
    sittings: int | None
    target: float
    #: seconds of the plan's measurement: one sitting of the current run
    run_cost_s: float


def plan(
    lv: FormLevels,
    costs: Costs,
    target: float,
    *,
    alpha: float = DEFAULT_GATE_ALPHA,
    power: float = DEFAULT_POWER,
) -> Plan:
    """The cost-optimal counts for ``lv`` and the baseline sittings that catch a change of
    ``target`` (a fraction, e.g. 0.05) with probability ``power`` at the one-sided gate
    level ``alpha``: the noise of the current run's mean (one sitting of ``p`` processes
    of ``b`` blocks) against ``S`` baseline sittings like it is
    ``V1 (1 + 1/S)``, ``V1 = sigma_s^2 + tau^2 / p + sigma^2 / (p b)``, and the change is
    caught when ``(z_alpha + z_power) sqrt(V1 (1 + 1/S)) <= log(1 + target)``."""
    if not 0 < target < 1:
        raise ValueError(f"target effect {target!r}: expected a fraction in (0, 1)")
    tau2 = lv.between_var or 0.0
    sit2 = lv.sitting_var or 0.0
    b = _ratio_count(costs.process, costs.block, lv.block_var, tau2)
    p = _ratio_count(costs.sitting, costs.process, tau2, sit2)
    v1 = sit2 + tau2 / p + lv.block_var / (p * b)
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(power)
    room = (math.log1p(target) / z) ** 2 / v1 if v1 > 0 else math.inf
    sittings = None if room <= 1 else max(1, math.ceil(1 / (room - 1)))
    return Plan(b, p, z * math.sqrt(v1), sittings, target, p * (costs.process + b * costs.block))


def form_levels(
    cases: Mapping[str, Sequence[tuple[str, Mapping[str, Sequence[float]]]]],
    forms: Sequence[str],
) -> list[FormLevels]:
    """Per form of ``forms`` (those measured), the levels pooled over ``cases``: each
    case's runs as ``(sitting, {form: block centers})``, folded to the blocks of the case's
    first run that has the form."""
    out = []
    for form in forms:
        ests = []
        for runs in cases.values():
            have = [(s, blocks[form]) for s, blocks in runs if blocks.get(form)]
            if len(have) < 2:
                continue
            est = case_estimate(have, len(have[0][1]))
            if est is not None:
                ests.append(est)
        pooled = pool(form, ests)
        if pooled is not None:
            out.append(pooled)
    return out
