"""The calibration's analysis: pure statistics over finished, judged runs.

A calibration (``specperf calibrate``, in ``cli.calibrate``) runs the suite under
conditions (A/A, injected slowdowns, a CPU hog) and stores each run's report; this module
re-judges those runs' metric verdicts at other tolerances (``MetricVerdict.rejudged``, the
verdict's own rule) and counts false alarms, detections and undecided runs, so the tables
and the recommended defaults come from the same rule as the gate.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pytest_specperf.judging.metrics import STEP, spec
from pytest_specperf.judging.noise import PRIOR_KINDS
from pytest_specperf.judging.significance import Family, critical
from pytest_specperf.judging.verdict import (
    MetricVerdict,
    Verdict,
    band_limit,
    case_disturbed,
    tolerance_for_band,
)
from pytest_specperf.probe.phases import ALL_PHASES, DRAFT, UNACCOUNTED, VERIFY

_UNCOMPARED = (Verdict.NO_BASELINE, Verdict.INVALID)

Judged = tuple[tuple[MetricVerdict, ...], ...]


class JudgedCase(Protocol):
    """A case as a stored report gives it back (``store.report.CaseRecord``)."""

    @property
    def test(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def verdict(self) -> Verdict: ...
    @property
    def metrics(self) -> tuple[MetricVerdict, ...]: ...


@dataclass(frozen=True)
class SlowCase:
    """A case of a run that failed: its key, the metric it blames, and every slow one."""

    key: str
    head: str
    metrics: tuple[str, ...]
    gated: tuple[str, ...]


@dataclass(frozen=True)
class RunOutcome:
    """One repetition, judged from its stored report."""

    slower_cases: tuple[SlowCase, ...]
    unstable_cases: tuple[str, ...]
    detected: bool
    named_right: bool
    cases: int
    judged: Judged
    #: the compared cases' names (test and key), in the order of ``judged``
    names: tuple[str, ...] = ()
    rep: int = 0
    exit: int = 0
    wall_s: float | None = None
    resumed: bool = False

    def to_json(self) -> dict[str, Any]:
        """The run's outcome for the summary; its judged metrics stay in its compacted
        report (``--summarize`` re-judges from those), not repeated here."""
        return {
            "rep": self.rep,
            "exit": self.exit,
            "wall_s": self.wall_s,
            "resumed": self.resumed,
            "cases": self.cases,
            "detected": self.detected,
            "named_right": self.named_right,
            "unstable_cases": list(self.unstable_cases),
            "names": list(self.names),
            "slower_cases": [c.__dict__ | {"metrics": list(c.metrics), "gated": list(c.gated)}
                             for c in self.slower_cases],
        }  # fmt: skip


@dataclass
class Condition:
    name: str
    inject: str | None = None
    hog: bool = False
    expect: str | None = None  # the phase a detection must name (None: A/A)
    runs: list[RunOutcome] = field(default_factory=list)

    @property
    def slower_runs(self) -> int:
        return sum(1 for r in self.runs if r.slower_cases)

    @property
    def named_right(self) -> int:
        return sum(1 for r in self.runs if r.slower_cases and r.named_right)

    @property
    def detected(self) -> int:
        return sum(1 for r in self.runs if r.detected)

    @property
    def unstable_runs(self) -> int:
        return sum(1 for r in self.runs if r.unstable_cases)

    def moved(self) -> float | None:
        """The median change the runs judged on the metric a detection must name, over
        every case of every run: what the canary really moved (a phase factor moves its
        phase against the rest of the step by less where the rest slows with it). None:
        an A/A condition, or no such gate."""
        want = self.expect
        changes = [m.change for r in self.runs for case in r.judged for m in case
                   if want and m.metric == want and math.isfinite(m.change)]  # fmt: skip
        return statistics.median(changes) if changes else None


def _of_kind(m: MetricVerdict, kind: str) -> bool:
    """Whether ``m`` is judged with the step tolerance (``kind`` "step") or the phase one."""
    return (spec(m.metric).tolerance == "step") == (kind == "step")


def slower_at(judged: Judged, tolerance: float, kind: str) -> list[list[str]]:
    """Per case, the metrics of ``kind`` ("phase" or "step", as ``Tolerances`` splits
    them) that would be SLOWER at ``tolerance``: the verdict's own rule."""
    out = []
    for case in judged:
        disturbed = case_disturbed(case)
        out.append(
            [
                m.metric
                for m in case
                if _of_kind(m, kind)
                and m.rejudged(tolerance, case_disturbed=disturbed) is Verdict.SLOWER
            ]
        )
    return out


def _unstable_at(case: Sequence[MetricVerdict], tol_phase: float, tol_step: float) -> bool:
    disturbed = case_disturbed(case)
    return any(
        m.rejudged(tol_step if _of_kind(m, "step") else tol_phase, case_disturbed=disturbed)
        is Verdict.UNSTABLE
        for m in case
    )


def at_run_share(metrics: Sequence[MetricVerdict], family: Family) -> tuple[MetricVerdict, ...]:
    """A case's gates at ``family``'s share where their stored level is looser (a report
    written before 2026-12-05 judged every case at one test's share: ``share_of_run``):
    each such gate's critical value is recomputed at Bonferroni's first Holm step of that
    share, on its own degrees of freedom (none stored: a known variance). Holm's later
    steps are not applied, so a run read again counts no more SLOWER than the plugin would
    at that share. The rest as stored."""
    level = family.gate_alpha(len(metrics))
    return tuple(
        m if m.alpha is None or m.alpha <= level * (1 + 1e-9)
        else replace(m, alpha=level,
                     critical=critical(level, m.df if m.df is not None else math.inf))
        for m in metrics
    )  # fmt: skip


def judge_run(
    cases: Sequence[JudgedCase], expect: str | None, tol_phase: float, tol_step: float
) -> RunOutcome:
    """One run's compared cases judged by the verdict rule from their stored metrics at
    ``tol_phase`` (phases) and ``tol_step`` (step); ``expect`` is the metric a detection
    must name (None: an A/A run)."""
    compared = [c for c in cases if c.verdict not in _UNCOMPARED]
    judged: Judged = tuple(c.metrics for c in compared)
    slower, unstable = [], []
    for case, metrics in zip(compared, judged):
        bad = (
            slower_at((metrics,), tol_phase, "phase")[0]
            + slower_at((metrics,), tol_step, "step")[0]
        )
        if bad:
            changes = {m.metric: abs(m.change) for m in metrics}
            # The culprit as the report names it: a phase first, then by size of change.
            head = min(bad, key=lambda m: (m not in ALL_PHASES, -changes[m]))
            gated = tuple(m.metric for m in metrics)
            slower.append(SlowCase(case.key, head, tuple(bad), gated))
        elif _unstable_at(metrics, tol_phase, tol_step):
            unstable.append(case.key)
    detected = bool(expect) and any(expect in c.metrics for c in slower)
    # Attribution: the injected phase is named and no failing case blames another phase.
    # A case failing on its step alone (the injected phase grew, but less than the
    # tolerance there) blames no phase; its "where the time went" line names the phase.
    wrong = [c for c in slower if c.head in ALL_PHASES and c.head != expect]
    return RunOutcome(
        slower_cases=tuple(slower),
        unstable_cases=tuple(unstable),
        detected=detected,
        named_right=detected and not wrong,
        cases=len(cases),
        judged=judged,
        names=tuple(f"{c.test.rsplit('::', 1)[-1]} {c.key}" for c in compared),
    )  # fmt: skip


def sweep(conds: list[Condition], tolerances: list[float], kind: str) -> list[dict[str, Any]]:
    """Failed runs and detections each tolerance would have given on the same runs."""
    rows = []
    for tol in tolerances:
        row: dict[str, Any] = {"tolerance": tol}
        for c in conds:
            fails = detect = 0
            for r in c.runs:
                per_case = slower_at(r.judged, tol, kind)
                if any(per_case):
                    fails += 1
                if c.expect and any(c.expect in bad for bad in per_case):
                    detect += 1
            row[c.name] = {"failed": fails, "detected": detect, "runs": len(c.runs)}
        rows.append(row)
    return rows


def outcome_at(
    judged: Judged, tol_phase: float, tol_step: float, expect: str | None
) -> tuple[bool, bool, bool]:
    """One run re-judged at a pair of tolerances, as ``judge_report`` judges it: whether
    it fails, whether a failing case names ``expect``, and whether a case that does not
    fail is UNSTABLE."""
    failed = detected = unstable = False
    for case in judged:
        bad = slower_at((case,), tol_phase, "phase")[0] + slower_at((case,), tol_step, "step")[0]
        if bad:
            failed = True
            detected = detected or (expect is not None and expect in bad)
        elif _unstable_at(case, tol_phase, tol_step):
            unstable = True
    return failed, detected, unstable


#: The pairs of tolerances the calibration re-judges its runs at (phases, step). The phase
#: tolerances go by half a percent from 3% to 5%, where a 2-core box's A/B runs move from
#: undecided to deciding (docs/calibration.md, "What 64 steps should give here").
PAIR_GRID = tuple(
    (tp, st)
    for tp in (0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.07)
    for st in (0.05, 0.08, 0.10, 0.15, 0.25)
)


def pair_sweep(conds: list[Condition]) -> list[dict[str, Any]]:
    """Per pair of tolerances in ``PAIR_GRID``, every condition's failed, detected and
    UNSTABLE runs: the table defaults are chosen from (false alarms, detection and
    undecided runs at once)."""
    rows = []
    for tp, ts in PAIR_GRID:
        row: dict[str, Any] = {"tolerance": tp, "step_tolerance": ts}
        for c in conds:
            outs = [outcome_at(r.judged, tp, ts, c.expect) for r in c.runs]
            row[c.name] = {
                "failed": sum(f for f, _, _ in outs),
                "detected": sum(d for _, d, _ in outs),
                "unstable": sum(u for _, _, u in outs),
                "runs": len(outs),
            }
        rows.append(row)
    return rows


def recommend(rows: list[dict[str, Any]], conds: list[Condition]) -> float | None:
    """Smallest tolerance with at most 1 false alarm per 20 A/A runs (hog runs included)."""
    for row in rows:
        if all(row[c.name]["failed"] <= len(c.runs) // 20 for c in conds if c.expect is None):
            return float(row["tolerance"])
    return None


def unstable_parts(cond: Condition) -> list[dict[str, Any]]:
    """Per case and metric that was UNSTABLE in any run of ``cond`` (at the tolerance the
    run used): in how many, and the medians of its noise, of the part from this run's
    blocks (``within``, what more steps shrink) and of the part between server processes
    (``sqrt(noise^2 - within^2)``, what only more processes shrink): why, case by case."""
    groups: dict[tuple[str, str], list[MetricVerdict]] = {}
    for run in cond.runs:
        for name, case in zip(run.names, run.judged):
            disturbed = case_disturbed(case)
            for m in case:
                if m.rejudged(m.tolerance, case_disturbed=disturbed) is Verdict.UNSTABLE:
                    groups.setdefault((name, m.metric), []).append(m)
    rows = []
    for (name, metric), ms in groups.items():
        noise = [
            (n, m.within)
            for m in ms
            if m.within is not None and math.isfinite(n := m.noise)
        ]
        rows.append({
            "case": name, "metric": metric, "unstable": len(ms), "runs": len(cond.runs),
            "tolerance": ms[0].tolerance,
            "noise": _median([n for n, _ in noise]),
            "within": _median([w for _, w in noise]),
            "between": _median([math.sqrt(max(n**2 - w**2, 0.0)) for n, w in noise]),
            "critical": _median([m.critical for m in ms if math.isfinite(m.critical)]),
        })  # fmt: skip
    return sorted(rows, key=lambda r: (-r["unstable"], r["case"], r["metric"]))


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def smallest_detected(conds: list[Condition]) -> str | None:
    """The smallest injected phase factor detected in at least 95% of its runs."""
    smallest: tuple[str, float] | None = None
    for c in conds:
        if not (c.inject and c.expect in ALL_PHASES and c.expect != UNACCOUNTED and c.runs):
            continue
        if c.detected / len(c.runs) >= 0.95:
            f = float(c.inject.split("=")[1])
            if smallest is None or f < smallest[1]:
                smallest = (c.inject, f)
    return smallest[0] if smallest else None


def detects(expect: str | None, kind: str) -> bool:
    """Whether a sweep table of ``kind`` counts detections of ``expect`` (its metric is
    judged at that kind's tolerance) rather than failed runs."""
    return expect is not None and kind == "phase" and spec(expect).tolerance == "phase"


#: The metrics whose stated noise ``noise_fit`` checks: the judged phase forms (against the
#: rest of the step) and the step (against its reference), each a change on the log scale.
FIT_METRICS = (VERIFY, DRAFT, STEP)
#: The two-sided probability of the fit's range: a ratio outside it says the noise is
#: misstated at the 10% level.
FIT_RANGE = 0.90


def chi2_quantile(p: float, k: float) -> float:
    """The ``p`` quantile of chi-square on ``k`` degrees of freedom, by Wilson and
    Hilferty's cube-root normal approximation (within 1% of the exact one from ``k = 3``
    on: ``chi2_quantile(0.95, 6) = 12.57``, exactly 12.59)."""
    if not 0.0 < p < 1.0 or not k > 0:
        raise ValueError(f"chi2_quantile needs 0 < p < 1 and k > 0, got p={p!r}, k={k!r}")
    z = statistics.NormalDist().inv_cdf(p)
    a = 2.0 / (9.0 * k)
    return k * max(1.0 - a + z * math.sqrt(a), 0.0) ** 3


def _fit_z(m: MetricVerdict) -> tuple[float, float] | None:
    """A gate's standardized change ``ln(1 + change) / noise`` and its variance under the
    model (Student's t on the gate's degrees of freedom: ``df / (df - 2)``; 1 on the normal
    scale); None where the gate states no usable noise (not compared, deterministic, judged
    in points, or t without a variance)."""
    if m.verdict in _UNCOMPARED or m.exact_runs is not None or m.share_based or m.points_based:
        return None
    if not (math.isfinite(m.noise) and m.noise > 0 and math.isfinite(m.change) and m.change > -1):
        return None
    df = math.inf if m.df is None else m.df
    if not df > 2:
        return None
    return math.log1p(m.change) / m.noise, (1.0 if math.isinf(df) else df / (df - 2.0))


def noise_fit(runs: Sequence[RunOutcome], label: str) -> list[dict[str, Any]]:
    """Whether the quiet A/A ``runs`` changed as much as their gates said they could: per
    metric of ``FIT_METRICS``, the root mean square of ``z = ln(1 + change) / noise`` over
    every gate, against the square root of its mean variance under the model (``_fit_z``).

    Their ratio is 1 when the whole stated noise (blocks, processes, sittings) fits the
    changes. Its range (``FIT_RANGE``) is that of ``sqrt(chi2_n / n)`` with ``n`` the fewer
    of the runs and the cases: the gates of one run share its offsets and, against a stored
    baseline, those of one case share the baseline's, so they are not counted as
    independent. Over the range the noise is UNDERSTATED (a tighter tolerance would meet
    false alarms the bands do not foresee); under it, overstated (wider bands than the
    machine needs). Per metric also the case farthest out (its own RMS z) with its
    between-process standard deviation as the runs estimated it (``between_hat2`` pooled
    over the runs) and as they were judged with (the median ``between``, after the prior):
    where they part, the prior's between-process term is what misstates."""
    per: dict[str, dict[str, list[tuple[float, float, MetricVerdict]]]] = {}
    for run in runs:
        for name, case in zip(run.names, run.judged):
            for m in case:
                if m.metric not in FIT_METRICS or (fit := _fit_z(m)) is None:
                    continue
                per.setdefault(m.metric, {}).setdefault(name, []).append((*fit, m))
    rows = []
    for metric in FIT_METRICS:
        cases = per.get(metric)
        if not cases:
            continue
        gates = [g for gs in cases.values() for g in gs]
        rms = math.sqrt(statistics.fmean(z * z for z, _, _ in gates))
        expected = math.sqrt(statistics.fmean(v for _, v, _ in gates))
        n = min(len(runs), len(cases))
        tail = (1.0 - FIT_RANGE) / 2.0
        low, high = (math.sqrt(chi2_quantile(p, n) / n) for p in (tail, 1.0 - tail))
        ratio = rms / expected
        worst, worst_gates = max(
            cases.items(), key=lambda kv: statistics.fmean(z * z for z, _, _ in kv[1])
        )
        hats = [m.between_hat2 for *_, m in worst_gates if m.between_hat2 is not None]
        used = [m.between for *_, m in worst_gates if m.between is not None]
        rows.append({
            "runs": label, "metric": metric, "gates": len(gates), "cases": len(cases),
            "independent": n, "rms_z": rms, "expected": expected, "ratio": ratio,
            "low": low, "high": high,
            "fit": "UNDERSTATED" if ratio > high else "overstated" if ratio < low else "fits",
            "worst_case": worst,
            "worst_rms_z": math.sqrt(statistics.fmean(z * z for z, _, _ in worst_gates)),
            "worst_between_hat": math.sqrt(max(statistics.fmean(hats), 0.0)) if hats else None,
            "worst_between": statistics.median(used) if used else None,
        })  # fmt: skip
    return rows


#: The processes a side ``ab_levels`` projects the A/B noise to.
AB_PROCESSES = (2, 3, 4)
#: The gated forms ``ab_levels`` shows (``draft/rest`` mirrors ``verify/rest``).
AB_LEVEL_METRICS = (VERIFY, STEP)
#: ``z`` of the power a "caught" change is caught with (95%: 19 runs in 20).
Z_POWER = statistics.NormalDist().inv_cdf(0.95)


def ab_levels(runs: Sequence[RunOutcome]) -> list[dict[str, Any]]:
    """A/B's levels per case, from its quiet A/A runs (judged between the sides,
    ``MetricVerdict.ab_sides``): the paired block noise ``w`` (median), the
    between-process standard deviation the runs measured within each side (their
    ``between_hat2`` pooled over the runs, on ``sum(N_A - 1 + N_B - 1)`` degrees of
    freedom) beside the one they were judged with (after the prior), and, were that
    measured ``tau`` right, the noise ``sqrt(w^2 + tau^2 (1/N_A + 1/N_B))`` projected to
    ``P`` processes a side (``AB_PROCESSES``: ``w^2`` and ``tau^2``'s part scale by
    ``(2/P) / (1/N_A + 1/N_B)``), its band at the runs' median critical value against the
    tolerance on the log scale, and the smallest change caught 19 times in 20 by the gate's
    rule (``exp(max(ln(1 + tol), t x noise) + 1.645 x noise) - 1``, docs/statistics.md
    section 7): the sample size A/B needs per case, measured. (Runs that read earlier
    reports, ``--history``, estimate ``between_hat2`` from those too; the degrees of
    freedom shown count their own processes only.)"""
    per: dict[tuple[str, str], list[MetricVerdict]] = {}
    for run in runs:
        for name, case in zip(run.names, run.judged):
            for m in case:
                if (m.metric in AB_LEVEL_METRICS and m.ab_sides and _fit_z(m) is not None
                        and m.within is not None and m.between_hat2 is not None):  # fmt: skip
                    per.setdefault((name, m.metric), []).append(m)
    rows = []
    for (name, metric), ms in sorted(per.items(), key=lambda kv: (kv[0][1] != VERIFY, kv[0])):
        hat2 = max(statistics.fmean(m.between_hat2 or 0.0 for m in ms), 0.0)
        inv = statistics.median(1 / m.base_runs + 1 / m.now_runs for m in ms)
        w = statistics.median(m.within or 0.0 for m in ms)
        crit = statistics.median(m.critical for m in ms)
        tol = ms[0].tolerance
        limit = band_limit(tol, relative=True)
        own = [m.band for m in ms if math.isfinite(m.noise)]
        at = {}
        for p in AB_PROCESSES:
            noise = math.sqrt((w * w + hat2 * inv) * (2 / p) / inv)
            at[str(p)] = {
                "noise": noise, "band": crit * noise, "decided": crit * noise <= limit,
                "smallest_caught": math.expm1(max(limit, crit * noise) + Z_POWER * noise),
            }  # fmt: skip
        rows.append({
            "case": name, "metric": metric, "runs": len(ms), "within": w,
            "between_hat": math.sqrt(hat2),
            "between_df": sum(m.base_runs - 1 + m.now_runs - 1 for m in ms),
            "between_judged": statistics.median(m.between or 0.0 for m in ms),
            "critical": crit, "tolerance": tol, "processes": at,
            "run_band": {"median": statistics.median(own), "widest": max(own)} if own else None,
        })  # fmt: skip
    return rows


#: The share of quiet runs a tolerance should leave with no UNSTABLE case (the A/B row's
#: target: at most 2 in 20), read by ``ab_deciding_tolerances``.
DECIDED_SHARE = 0.9


def _deciding_tolerance(m: MetricVerdict) -> float:
    """The least tolerance at which the gate's band (``critical x noise``) decides it."""
    return tolerance_for_band(m.band, relative=not m.in_points,
                              higher_is_better=spec(m.metric).higher_is_better)  # fmt: skip


def ab_deciding_tolerances(runs: Sequence[RunOutcome]) -> dict[str, dict[str, Any]]:
    """Per tolerance kind (``phase``, ``step``), each of A/B's quiet A/A runs' least
    tolerance that decides every gate of that kind in every case (the largest of its gates'
    ``tolerance_for_band``). A run has an UNSTABLE case when any one gate's band passes the
    tolerance, and which gate is widest changes from run to run, so the tolerance that
    leaves ``DECIDED_SHARE`` of the runs decided is that share's value (by nearest rank),
    not a case's typical band (``ab_levels``). A disturbed case is UNSTABLE at any
    tolerance and is not counted here."""
    out: dict[str, dict[str, Any]] = {}
    for kind in PRIOR_KINDS:
        need = sorted(
            max(tols)
            for run in runs
            if (tols := [_deciding_tolerance(m) for case in run.judged for m in case
                         if _of_kind(m, kind) and m.ab_sides and math.isfinite(m.noise)])
        )  # fmt: skip
        if need:
            out[kind] = {
                "runs": len(need), "median": statistics.median(need), "share": DECIDED_SHARE,
                "within_share": need[math.ceil(DECIDED_SHARE * len(need)) - 1],
                "widest": need[-1],
            }  # fmt: skip
    return out
