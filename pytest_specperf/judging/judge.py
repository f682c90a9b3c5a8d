"""Judge one measured case against its baseline: gates, verdicts, diagnosis, recording.

``judge_case`` is the one place a case's verdict is decided. It takes what the plugin
knows about a case (a frozen ``Case``) and its baseline, and returns a frozen
``CaseOutcome`` that every report reads. Recording policy lives here too: which runs may
become baselines (``recording_refusal``) and what is stored (``as_baseline``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_specperf.judging.baselines import CaseBaseline, CaseProblem, fingerprint_mismatch
from pytest_specperf.judging.bottleneck import Bottleneck
from pytest_specperf.judging.budgets import BudgetCheck, Budgets, check_budgets
from pytest_specperf.judging.diagnosis import diagnose, time_went
from pytest_specperf.judging.gates import invalid_reasons
from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    DEFAULT_POINT_GATES,
    MIN_PHASE_SHARE,
    STEP,
    is_stored,
)
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import (
    QUIET_SCATTER,
    CaseVerdict,
    MetricVerdict,
    Runs,
    Tolerances,
    Verdict,
    combine,
    downgrade_disturbed,
    judge_runs,
    noisiest_phase,
    runs_disturbance,
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


def is_speculative(fingerprint: Mapping[str, Any]) -> bool:
    """Whether an engine fingerprint names a speculative algorithm (accept length gated)."""
    return str(fingerprint.get("speculative_algorithm", "NONE")).upper() != "NONE"


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


def compare(
    base: Mapping[str, Summary],
    run: DecodeRun,
    gates: Sequence[str],
    tolerances: Tolerances,
    *,
    base_runs: Sequence[Mapping[str, Summary]] = (),
    history: Sequence[Mapping[str, Summary]] = (),
) -> CaseVerdict:
    """Judge every gate of a case; a disturbed case's time verdicts become UNSTABLE.

    ``base`` is the latest baseline run, ``base_runs`` all of them (oldest first; default:
    ``base`` alone); ``run`` is judged with its siblings (one run per server process)."""
    runs = Runs(
        tuple(base_runs) or (base,),
        tuple(r.summaries for r in run.processes),
        tuple(history),
    )
    judged: list[MetricVerdict] = []
    missing = []
    for m in gates:
        mv = judge_runs(m, runs, tolerances, now_util=run.utilizations)
        if mv is None:
            missing.append(m)
        else:
            judged.append(mv)
    judged = downgrade_disturbed(judged, runs_disturbance(runs))
    reasons = (f"gated metric(s) {', '.join(missing)} missing in the baseline",) if missing else ()
    return CaseVerdict(combine([m.verdict for m in judged]), tuple(judged), reasons)


def matching_history(case: Case, base: CaseBaseline) -> tuple[Mapping[str, Summary], ...]:
    """The case's history runs of the baseline's engine (same fingerprint hash)."""
    return tuple(h.metrics for h in case.history if h.fingerprint_hash == base.fingerprint_hash)


def _verdict(case: Case, base: CaseBaseline | CaseProblem | None, missing: str) -> CaseVerdict:
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
    gates = case.gates or default_gates(base.metrics, case.run, case.speculative)
    runs = tuple(base.run_metrics(i) for i in range(len(base.runs)))
    return compare(
        base.metrics, case.run, gates, case.tolerances, base_runs=runs,
        history=matching_history(case, base),
    )  # fmt: skip


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
    verdict = _verdict(case, found, missing)
    base = found if isinstance(found, CaseBaseline) else None
    run = case.run
    if verdict.verdict is not Verdict.NO_BASELINE:
        bad = _telemetry_problems(run)
        if bad:
            verdict = CaseVerdict(Verdict.INVALID, verdict.metrics, (*verdict.reasons, *bad))
    return CaseOutcome(
        nodeid=case.nodeid,
        test=case.test,
        key=case.key,
        run=run,
        verdict=verdict,
        baseline=base,
        baseline_path=baseline_path,
        fingerprint=case.fingerprint,
        recorded=record,
        notes=tuple(f"cross-check: {line}" for line in run.cross_check),
        bottleneck=diagnose(
            run,
            kv_bytes_per_token=case.kv_bytes_per_token,
            kv_traffic=case.kv_traffic,
            peak_bandwidth_bytes_per_s=case.peak_bandwidth_bytes_per_s,
        ),
        time_went=time_went(run, base.metrics if base is not None else None),
        gates=case.gates,
        tolerances=case.tolerances,
        budgets=check_budgets(run, case.budgets),
    )


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
    included), each with its utilization medians, recorded ``at`` (an ISO timestamp)."""
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
            )
        )
    return replace(recorded[0], runs=tuple(r for c in recorded for r in c.runs))


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
