"""Judge one measured case against its baseline: gates, verdicts, diagnosis, recording.

``judge_case`` is the one place a case's verdict is decided. It takes what the plugin
knows about a case (a frozen ``Case``) and its baseline, and returns a frozen
``CaseOutcome`` that every report reads. Recording policy lives here too: which runs may
become baselines (``recording_refusal``) and what is stored (``as_baseline``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_specperf.judging.baselines import (
    CaseBaseline,
    CaseProblem,
    NotGated,
    fingerprint_mismatch,
    run_centers,
)
from pytest_specperf.judging.bottleneck import Bottleneck
from pytest_specperf.judging.budgets import BudgetCheck, Budgets, check_budgets
from pytest_specperf.judging.diagnosis import diagnose, time_went
from pytest_specperf.judging.gates import invalid_reasons
from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    CENTER_ROWS,
    DEFAULT_POINT_GATES,
    MIN_PHASE_SHARE,
    STEP,
    TOKENS_PER_S,
    MetricKind,
    device_form,
    is_stored,
    rest_form,
    spec,
)
from pytest_specperf.judging.noise import (
    MAX_PROCESSES,
    PROVISIONAL_PRIOR,
    DevicePrior,
    anova_between,
    anova_f,
    log_rows,
)
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.significance import (
    LONE,
    MIRROR_SHARE,
    Family,
    critical,
    holm_levels,
    p_worse,
)
from pytest_specperf.judging.stats import Summary, f_sf, stable
from pytest_specperf.judging.verdict import (
    QUIET_SCATTER,
    CaseVerdict,
    MetricVerdict,
    Runs,
    Tolerances,
    Verdict,
    center_of_runs,
    combine,
    downgrade_disturbed,
    judge_runs,
    judged_form,
    noisiest_phase,
    runs_disturbance,
    runs_scatter,
)
from pytest_specperf.probe.inject import CONTROL_FILE
from pytest_specperf.probe.phases import PHASES, UNACCOUNTED


@dataclass(frozen=True)
class HistoryRun:
    """A run of a case from an earlier session's report: its engine fingerprint (by hash),
    where it came from, and its metrics as compact summaries."""

    fingerprint_hash: str
    source: str
    metrics: Mapping[str, Summary]
    #: the sitting it was measured in (``store.history_runs``: its report's; None: a
    #: sitting of its own)
    sitting: str | None = None
    #: a process of an A/B run's tested side: evidence for A/B runs only, whose server
    #: processes live side by side (a stored-baseline run's, for stored baselines only)
    ab: bool = False
    #: the steps of one of its rounds (None: unknown): only a run of the baseline's
    #: steps a round measured the baseline's blocks (``_history_of``)
    round_steps: int | None = None


@dataclass(frozen=True)
class Case:
    """One measured case, as the plugin hands it to the judge."""

    nodeid: str
    test: str
    key: str
    run: DecodeRun
    fingerprint: Mapping[str, Any]
    tolerances: Tolerances
    #: the marker's ``gate=`` list; None: the default gates
    gates: tuple[str, ...] | None = None
    speculative: bool = True
    #: for the KV-read bandwidth of the bottleneck verdict (None where unknown); a
    #: server's KV traffic model (``/server_info["kv_read"]``) wins over the per-token size
    kv_bytes_per_token: float | None = None
    kv_traffic: Mapping[str, Any] | None = None
    peak_bandwidth_bytes_per_s: float | None = None
    #: the server process that measured the case (recorded with a baseline run)
    server_pid: int | None = None
    #: earlier runs of the case from other sessions (nightly reports), for the
    #: between-process part of the noise only (``--specperf-history``)
    history: tuple[HistoryRun, ...] = ()
    #: absolute limits checked whatever the baseline says (None: none)
    budgets: Budgets | None = None
    #: the share of the run's false-alarm budget the case may spend (``significance``)
    family: Family = LONE
    #: the device's level priors (process and sitting variances) from the file beside the
    #: baselines, or the provisional ones
    prior: DevicePrior = PROVISIONAL_PRIOR
    #: this session's sitting id (recorded with a baseline run; None: a fresh sitting)
    sitting: str | None = None


@dataclass(frozen=True)
class CaseOutcome:
    """One judged case, as every report sees it."""

    nodeid: str
    test: str
    key: str
    run: DecodeRun
    verdict: CaseVerdict
    baseline: CaseBaseline | None
    baseline_path: Path
    fingerprint: Mapping[str, Any]
    recorded: bool = False
    notes: tuple[str, ...] = ()
    bottleneck: Bottleneck | None = None
    time_went: str | None = None
    #: the gates and tolerances the case was judged with (None: default gates)
    gates: tuple[str, ...] | None = None
    tolerances: Tolerances | None = None
    #: every budget set for the case, checked on its run
    budgets: tuple[BudgetCheck, ...] = ()
    #: an A/B run's reference side, as typed (``python=...``): the baseline is its runs of
    #: this sitting, not a stored one (None: a stored baseline)
    reference: str | None = None
    #: an A/B case's order of server processes, round by round (``A1 B1 B2 A2``)
    ab_order: tuple[str, ...] = ()
    #: the share of the run's false-alarm budget the case was judged at (``Case.family``)
    family: Family = LONE
    #: the device's level priors the case was judged with (``Case.prior``)
    prior: DevicePrior = PROVISIONAL_PRIOR

    @property
    def over_budget(self) -> tuple[BudgetCheck, ...]:
        """The budgets the run breached (or could not be checked against)."""
        return tuple(b for b in self.budgets if b.failed)

    @property
    def failed(self) -> bool:
        """Whether the case fails its test: a regression, or a budget breached."""
        return self.verdict.verdict is Verdict.SLOWER or bool(self.over_budget)

    @property
    def where(self) -> str:
        r = self.run
        s = f"ctx={r.context_len} kv={r.kv_layout.label}"
        return s + (f" bs={r.batch_size}" if r.batch_size != 1 else "")

    @property
    def base_metrics(self) -> Mapping[str, Summary] | None:
        return self.baseline.metrics if self.baseline is not None else None

    @functools.cached_property
    def now_centers(self) -> Mapping[str, float]:
        """Per step part, accepted length and tokens/s (``CENTER_ROWS``), this
        measurement's center over its server processes: the one source of every "now" a
        report shows (the verdict's raw now is the same center), and the value its
        recorded runs give a later verdict."""
        runs = [r.summaries for r in self.run.processes]
        return MappingProxyType(
            {n: center_of_runs([r[n] for r in runs if n in r]) for n in CENTER_ROWS if n in runs[0]}
        )

    @functools.cached_property
    def base_centers(self) -> Mapping[str, float] | None:
        """Per ``CENTER_ROWS`` figure, the baseline's center over its runs (what the
        verdict compared against); None without a baseline."""
        if self.baseline is None:
            return None
        centers = run_centers(self.baseline.runs)
        return MappingProxyType({n: centers[n] for n in CENTER_ROWS if n in centers})


class RecordingRefused(Exception):
    """A run that must not become a baseline; the message says why and what to do."""


def default_gates(base: Mapping[str, Summary], run: DecodeRun, speculative: bool) -> list[str]:
    """step, unaccounted, accept_len (speculative), every phase that takes at least
    ``MIN_PHASE_SHARE`` of the baseline step, and on a GPU the device-busy share and
    SM/DRAM utilization (when both runs have them)."""
    gates = [STEP, UNACCOUNTED]
    gates += [m for m in DEFAULT_POINT_GATES if m in base and run.judged(m) is not None]
    if speculative:
        gates.append(ACCEPT_LEN)
    step = base[STEP].median if STEP in base else 0.0
    for p in PHASES:
        b = base.get(p)
        if b is not None and step and b.median / step >= MIN_PHASE_SHARE:
            gates.append(p)
    return gates


def fixed_accept(base: Mapping[str, Summary], run: DecodeRun) -> bool:
    """Whether the accept length is the same, block by block, in the latest baseline run
    and every current run (greedy tokens): ``tokens_per_s`` is then the step's test again.
    The same at the store's precision (``stats.stable``, 6 significant digits): a stored
    run's 2.66667 is this run's 8/3."""
    b = base.get(ACCEPT_LEN)
    if b is None or not b.blocks:
        return False
    for r in run.processes:
        n = r.summaries.get(ACCEPT_LEN)
        if n is None or len(n.blocks) % len(b.blocks):
            return False
        k = len(b.blocks)
        if any(stable(x) != stable(b.blocks[i % k]) for i, x in enumerate(n.blocks)):
            return False
    return True


def mirror_pairs(base: Mapping[str, Summary], phases: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs of gated phases whose judged forms mirror each other: each takes at least
    ``MIRROR_SHARE`` of the other's rest of the step (the named phases' total minus it),
    so ``a/rest`` is about ``1 / (b/rest)``: one quantity seen from both ends."""
    named = {p: base[p].median for p in PHASES if p in base}
    total = sum(named.values())
    out = []
    gated = [p for p in phases if p in named]
    for i, a in enumerate(gated):
        for b in gated[i + 1 :]:
            rest_a, rest_b = total - named[a], total - named[b]
            if (
                rest_a > 0
                and rest_b > 0
                and min(named[b] / rest_a, named[a] / rest_b) >= (MIRROR_SHARE)
            ):
                out.append((a, b))
    return out


def _holm(
    judged: list[MetricVerdict], alpha: float, level: Callable[[float], float] | None = None
) -> list[MetricVerdict]:
    """Holm's step-down over the case's gates at the case's level ``alpha``: a gate whose
    one-sided p-value clears its Holm level is judged at that level's critical value (a
    SLOWER needs the change beyond the tolerance too). The first pass judged every gate
    at Bonferroni's ``alpha / m``, the level of the first step; later steps only widen.
    ``level``: a step's share to its nominal level at this look (``Family.level``)."""
    ps = [
        p_worse(m.change, m.noise, m.df if m.df is not None else math.inf,
                higher_is_better=spec(m.metric).higher_is_better, relative=not m.in_points)
        for m in judged
    ]  # fmt: skip
    levels = holm_levels(ps, alpha) if level is None else holm_levels(ps, alpha, level)
    order = sorted(range(len(judged)), key=lambda i: ps[i])
    out = list(judged)
    for i in order:
        if ps[i] > levels[i]:
            break
        m = judged[i]
        df = m.df if m.df is not None else math.inf
        z = critical(levels[i], df)
        if m.verdict is Verdict.SLOWER or m.disturbed or z >= m.critical:
            continue
        v = m.rejudged(m.tolerance, z=z)
        if v is Verdict.SLOWER:
            out[i] = replace(m, verdict=v, critical=z, alpha=levels[i], steps_to_decide=None,
                             processes_to_decide=None)  # fmt: skip
    return out


def _untie_mirrors(
    judged: list[MetricVerdict], pairs: Sequence[tuple[str, str]]
) -> list[MetricVerdict]:
    """Name each mirror pair's partner; the FASTER of a phase whose partner is SLOWER is
    the same evidence seen from the other end: SAME."""
    by = {m.metric: i for i, m in enumerate(judged)}
    out = list(judged)
    for a, b in pairs:
        if a not in by or b not in by:
            continue
        ia, ib = by[a], by[b]
        out[ia] = replace(out[ia], mirror_of=b)
        out[ib] = replace(out[ib], mirror_of=a)
        for x, y in ((ia, ib), (ib, ia)):
            if out[x].verdict is Verdict.SLOWER and out[y].verdict is Verdict.FASTER:
                out[y] = replace(out[y], verdict=Verdict.SAME)
    return out


def exact_notes(judged: Sequence[MetricVerdict]) -> list[str]:
    """A note per exact gate (``noise.exact_sides``): why it was judged with no noise (a
    note, not a reason: it explains no undecided verdict)."""
    return [
        f"{m.metric} {m.exact_reason}: deterministic on this engine, judged with zero noise "
        "(no device prior; docs/statistics.md)"
        for m in judged
        if m.exact_runs
    ]


def compare(
    base: Mapping[str, Summary],
    run: DecodeRun,
    gates: Sequence[str],
    tolerances: Tolerances,
    *,
    base_runs: Sequence[Mapping[str, Summary]] = (),
    history: Sequence[Mapping[str, Summary]] = (),
    family: Family = LONE,
    prior: DevicePrior = PROVISIONAL_PRIOR,
    base_sittings: Sequence[str | None] = (),
    history_sittings: Sequence[str | None] = (),
    sitting: str | None = None,
) -> CaseVerdict:
    """Judge every gate of a case; a disturbed case's time verdicts become UNSTABLE.

    ``base`` is the latest baseline run, ``base_runs`` all of them (oldest first; default:
    ``base`` alone); ``run`` is judged with its siblings (one run per server process), in
    the sitting ``sitting``. The case spends ``family.case_alpha`` over its looks: each
    of its ``m`` gates is judged at this look's level of ``alpha / m``, then Holm's
    step-down (``significance``). A gate whose runs are identical block by block within
    each side is exact (zero noise, no prior: ``noise.exact_sides``; ``judge_case`` notes
    it).
    ``tokens_per_s`` beside ``step`` with a fixed accept length is the step's test again:
    not judged twice."""
    runs = Runs(
        tuple(base_runs) or (base,),
        tuple(r.summaries for r in run.processes),
        tuple(history),
        tuple(base_sittings) if base_runs else (),
        (sitting,) * len(run.processes) if sitting is not None else (),
        tuple(history_sittings),
    )
    reasons: list[str] = []
    gates = list(gates)
    if TOKENS_PER_S in gates and STEP in gates and fixed_accept(base, run):
        gates.remove(TOKENS_PER_S)
        reasons.append(
            "tokens_per_s not judged apart from step: the accept length is the same block by "
            "block, so tokens/s is the step's test again"
        )
    alpha = family.gate_alpha(len(gates))
    judged: list[MetricVerdict] = []
    missing = []
    for m in gates:
        mv = judge_runs(m, runs, tolerances, now_util=run.utilizations, prior=prior, alpha=alpha)
        if mv is None:
            missing.append(m)
        else:
            judged.append(mv)
    judged = _holm(judged, family.case_alpha, family.level)
    judged = downgrade_disturbed(judged, runs_disturbance(runs), runs_scatter(runs))
    judged = _untie_mirrors(judged, mirror_pairs(base, [m.metric for m in judged]))
    if missing:
        reasons.insert(0, f"gated metric(s) {', '.join(missing)} missing in the baseline")
    return CaseVerdict(combine([m.verdict for m in judged]), tuple(judged), tuple(reasons))


def matching_history(case: Case, base: CaseBaseline) -> tuple[Mapping[str, Summary], ...]:
    """The case's history runs of the baseline's engine (same fingerprint hash)."""
    return tuple(h.metrics for h in _history_of(case, base))


def _history_of(case: Case, base: CaseBaseline) -> list[HistoryRun]:
    """The case's history runs of the baseline's engine (same fingerprint hash) that
    measured its blocks: a run of another number of steps a round measured other
    requests (block ``j`` is the request of seed ``j``), which do not fold onto these."""
    steps = baseline_round_steps(base)
    return [
        h for h in case.history
        if h.fingerprint_hash == base.fingerprint_hash
        and (steps is None or h.round_steps is None or h.round_steps == steps)
    ]  # fmt: skip


def first_round_steps(run: DecodeRun) -> int | None:
    """The steps of the first round of ``run`` (the decoder's count; a run of one round's
    steps); None for a run of several rounds that does not say (a report from before
    2026-12-07 read back): a later round can measure fewer steps than the first."""
    return run.round_steps or (run.steps if run.rounds <= 1 else None)


def baseline_round_steps(base: CaseBaseline) -> int | None:
    """The steps a round of the baseline's runs measured: the one count its runs know
    (an A/B reference side's processes, a run read back by ``specperf compare``), else the
    case's ``steps`` where every run is one round (a recording); None when unknown or
    when its runs disagree."""
    known = {r.round_steps for r in base.runs if r.round_steps is not None}
    if known:
        return known.pop() if len(known) == 1 else None
    return base.steps if all(r.rounds <= 1 for r in base.runs) else None


def steps_mismatch(case: Case, base: CaseBaseline, *, recording: bool = False) -> str | None:
    """Why ``case`` cannot be compared with ``base`` block by block: its rounds measured
    another number of steps than the baseline's. Block ``j`` is a request of its own
    prompt (seed ``j``), so a run of 64 steps measures 16 blocks of which only the first 8
    are a 32-step baseline's: folded onto them as two rounds, blocks 9-16 would be paired
    with other prompts' blocks, and in 48 steps the blocks would not pair at all. None
    when the steps agree or either side's are unknown. ``recording``: an update at the new
    steps, which replaces the baseline's runs."""
    was, now = baseline_round_steps(base), first_round_steps(case.run)
    if was is None or now is None or now == was:
        return None
    why = (
        f"the baseline was recorded at {was} steps a round and this run measured {now}: a "
        "block is a request with its own prompt, so the two runs' blocks are not the same "
        "blocks and do not pair"
    )
    if recording:
        return why + f" (this update records the case at {now} steps and drops the old runs)"
    return why + (
        f"; measure it at {was} steps (--specperf-steps, or the marker's or "
        f"specperf.decode's steps= where the test sets them), or re-record the baseline at "
        f"{now} steps with --specperf-update-baselines"
    )


def _verdict(case: Case, base: CaseBaseline | CaseProblem | None, missing: str, *,
             recording: bool = False) -> CaseVerdict:  # fmt: skip
    if isinstance(base, CaseProblem):  # a stored case that fails validation: never compared
        return CaseVerdict(Verdict.INVALID, reasons=(base.message,))
    if base is None:
        return CaseVerdict(Verdict.NO_BASELINE, reasons=(missing,))
    mismatch = fingerprint_mismatch(base.fingerprint, dict(case.fingerprint))
    if mismatch:
        return CaseVerdict(
            Verdict.INVALID,
            reasons=(
                "engine fingerprint differs from the baseline's: "
                + "; ".join(mismatch)
                + " (re-record with --specperf-update-baselines if the change is intended)",
            ),
        )
    other_steps = steps_mismatch(case, base, recording=recording)
    if other_steps is not None:
        return CaseVerdict(Verdict.INVALID, reasons=(other_steps,))
    gates = case.gates or default_gates(base.metrics, case.run, case.speculative)
    skipped: tuple[str, ...] = ()
    if base.not_gated is not None:
        skipped = tuple(g for g in gates if g in base.not_gated.gates)
        gates = [g for g in gates if g not in base.not_gated.gates]
    runs = tuple(base.run_metrics(i) for i in range(len(base.runs)))
    hist = _history_of(case, base)
    judged = compare(
        base.metrics, case.run, gates, case.tolerances, base_runs=runs,
        history=tuple(h.metrics for h in hist), family=case.family, prior=case.prior,
        base_sittings=tuple(r.sitting_label for r in base.runs),
        history_sittings=tuple(h.sitting or h.source for h in hist), sitting=case.sitting,
    )  # fmt: skip
    if not skipped or base.not_gated is None:
        return judged
    return replace(judged, reasons=(*judged.reasons, not_gated_reason(base.not_gated, skipped)))


def not_gated_reason(mark: NotGated, gates: Sequence[str]) -> str:
    """The line that says a case's gates are not gated, once, with the measured spread."""
    spread = ", ".join(f"{g} {mark.gates[g]:.1%}" for g in gates)
    state = "accepted in the baseline file" if mark.accepted else "not accepted in the file"
    return f"not gated: {spread} between server processes ({mark.reason}; {state})"


def judge_case(
    case: Case,
    found: CaseBaseline | CaseProblem | None,
    baseline_path: Path,
    *,
    missing: str = "no baseline",
    record: bool = False,
) -> CaseOutcome:
    """The verdict of ``case`` against its baseline as found (``missing`` says why there
    is none; a stored case that fails validation is INVALID).

    Throttled clocks or another process on the GPU make a compared case INVALID, never
    SLOWER. With ``record``, the outcome is marked recorded; ``recording_refusal`` must
    have been checked first.
    """
    verdict = _verdict(case, found, missing, recording=record)
    base = found if isinstance(found, CaseBaseline) else None
    run = case.run
    if verdict.verdict is not Verdict.NO_BASELINE:
        bad = _telemetry_problems(run)
        if bad:
            verdict = CaseVerdict(Verdict.INVALID, verdict.metrics, (*verdict.reasons, *bad))
    outcome = CaseOutcome(
        nodeid=case.nodeid,
        test=case.test,
        key=case.key,
        run=run,
        verdict=verdict,
        baseline=base,
        baseline_path=baseline_path,
        fingerprint=case.fingerprint,
        recorded=record,
        notes=(
            *(f"cross-check: {line}" for line in run.cross_check),
            *exact_notes(verdict.metrics),
        ),
        bottleneck=diagnose(
            run,
            kv_bytes_per_token=case.kv_bytes_per_token,
            kv_traffic=case.kv_traffic,
            peak_bandwidth_bytes_per_s=case.peak_bandwidth_bytes_per_s,
        ),
        gates=case.gates,
        tolerances=case.tolerances,
        family=case.family,
        prior=case.prior,
    )
    # the step, accept length and tokens/s budgets read the centers every report shows
    budgets = check_budgets(run, case.budgets, outcome.now_centers)
    went = time_went(run, outcome.base_centers, outcome.now_centers, outcome.verdict.culprit)
    return replace(outcome, budgets=budgets, time_went=went)


def _telemetry_problems(run: DecodeRun) -> list[str]:
    """Why the telemetry of any of the run's processes makes it untrustworthy."""
    out: list[str] = []
    for i, r in enumerate(run.processes):
        bad = invalid_reasons(r.telemetry) if r.telemetry is not None else []
        prefix = f"server process {i + 1}: " if run.siblings else ""
        out += [prefix + b for b in bad]
    return out


def recording_refusal(run: DecodeRun, key: str) -> str | None:
    """Why ``run`` (with its siblings) must not be recorded as a baseline, or None."""
    bad = _telemetry_problems(run)
    if bad:
        return (
            f"refusing to record {key} as a baseline: the measurement is not "
            f"trustworthy: {'; '.join(bad)}"
        )
    if run.injected:
        return (
            f"refusing to record {key} as a baseline: the server injected a canary "
            f"slowdown ({run.injected}); restart it without SPECPERF_INJECT, or remove "
            f"{CONTROL_FILE} from its run directory"
        )
    return None


def as_baseline(case: Case, *, at: str) -> CaseBaseline:
    """What an update stores for ``case``: one run per server process (its siblings
    included), each with its utilization medians, recorded ``at`` (an ISO timestamp),
    and the gates no setting can decide (``not_gated_mark``). The runs' sitting is stamped
    by the writer (the update is the sitting: a pytest-xdist controller stamps its
    workers' runs with its own)."""
    recorded: list[CaseBaseline] = []
    for run in case.run.processes:
        metrics: dict[str, Summary] = {k: v for k, v in run.summaries.items() if is_stored(k)}
        for name, u in run.utilizations.items():
            metrics[name] = Summary.compact(u.median, (), u.n)
        recorded.append(
            CaseBaseline.from_run(
                test=case.test,
                key=case.key,
                fingerprint=case.fingerprint,
                steps=run.steps,
                metrics=metrics,
                at=at,
                pid=run.server_pid if run.server_pid is not None else case.server_pid,
                rounds=run.rounds,
                round_steps=first_round_steps(run),
            )
        )
    return replace(
        recorded[0],
        runs=tuple(r for c in recorded for r in c.runs),
        not_gated=not_gated_mark(case),
    )


#: A recording marks a gate not gated when its processes differ significantly (the runs x
#: blocks F test at this level) and so much that ``BIMODAL_Z`` x the process noise stays
#: above the tolerance even with ``MAX_PROCESSES`` processes against the recorded runs.
BIMODAL_P = 0.001
BIMODAL_Z = 3.0


def _judged_rows(runs: Sequence[Mapping[str, Summary]], metric: str) -> list[list[float]] | None:
    """The folded log block rows of ``metric``'s judged form in every run, or None."""
    form, basis = judged_form(metric)
    if basis is not None and spec(metric).kind is MetricKind.PHASE:
        dev = rest_form(device_form(metric))
        form = dev if all(dev in r for r in runs) else form
    if not all(form in r for r in runs):
        return None
    period = len(runs[0][form].blocks)
    rows = [log_rows(r[form].blocks, period) for r in runs]
    return [x for x in rows if x is not None] if all(x is not None for x in rows) else None


def not_gated_mark(case: Case) -> NotGated | None:
    """What a recording of ``case`` (2 or more server processes) marks as not gated: the
    step and phase gates whose processes disagree beyond any tolerance (``BIMODAL_P``,
    ``BIMODAL_Z``), each with its measured spread ``tau_hat``; None when there is none."""
    procs = [r.summaries for r in case.run.processes]
    k = len(procs)
    if k < 2:
        return None
    gates = case.gates or default_gates(procs[0], case.run, case.speculative)
    found: dict[str, float] = {}
    for g in gates:
        if spec(g).kind not in (MetricKind.PHASE, MetricKind.TIME):
            continue
        rows = _judged_rows(procs, g)
        f = anova_f(rows) if rows else None
        if rows is None or f is None or f_sf(*f) >= BIMODAL_P:
            continue
        tau = math.sqrt(anova_between(rows) or 0.0)
        # tau is of a log: against the tolerance on that scale
        limit = math.log1p(case.tolerances.of(g))
        if BIMODAL_Z * tau * math.sqrt(1 / MAX_PROCESSES + 1 / k) > limit:
            found[g] = tau
    if not found:
        return None
    return NotGated(
        found,
        f"bimodal between server processes: recorded in {k} processes, {BIMODAL_Z:g} x the "
        f"process noise exceeds the tolerance even with {MAX_PROCESSES} processes a side "
        "(docs/statistics.md)",
    )


def more_steps_would_decide(case: Case, found: CaseBaseline | CaseProblem | None) -> list[str]:
    """The gated metrics of ``case`` that are UNSTABLE only because its runs have too few
    blocks so far (``MetricVerdict.fixable``): what the automatic extension measures more
    rounds for. Empty without a comparable baseline, or for a disturbed case."""
    if not isinstance(found, CaseBaseline) or fingerprint_mismatch(
        found.fingerprint, dict(case.fingerprint)
    ):
        return []
    verdict = _verdict(case, found, "")
    return [m.metric for m in verdict.metrics if m.fixable]


def noisy_baseline_note(case: Case) -> str | None:
    """A warning when a run about to become a baseline scatters like a busy machine."""
    found = [n for n in (noisiest_phase(r.summaries) for r in case.run.processes) if n]
    noisy = max(found, key=lambda n: n[1], default=None)
    if noisy is None or noisy[1] <= QUIET_SCATTER:
        return None
    return (
        f"noisy baseline: {case.test} {case.key}: {noisy[0]} blocks scatter "
        f"{noisy[1]:.0%} (a quiet machine gives about 2%); re-record it when the "
        "machine is quiet, or its comparisons will come out UNSTABLE"
    )
