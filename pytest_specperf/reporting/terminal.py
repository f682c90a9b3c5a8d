"""Reports for people: the phase table of a case, its failure message, the run's summary.

``diagnosis_lines(outcome)`` is the one place the diagnosis of a case is put in words
(budgets, where the time went, the bottleneck verdict, whether each phase worked or
waited); the failure message, the ``-rP`` report section and the Markdown summary all
call it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_specperf.judging.baselines import DEFAULT_KEEP_RUNS
from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    ACTIVE_SHARE,
    STEP,
    TABLE_ROWS,
    TOKENS_PER_S,
    active_form,
    device_form,
    rest_form,
    spec,
)
from pytest_specperf.judging.samples import DecodeRun, KernelStat
from pytest_specperf.judging.significance import Family, critical
from pytest_specperf.judging.verdict import MetricVerdict, Verdict, reach_text
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.reporting.table import render_table
from pytest_specperf.reporting.view import CaseView, diagnosis_lines
from pytest_specperf.store.report import saved_family


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _change_cell(base: float, now: float, step: float) -> str:
    """Relative change, or the difference in ms where the base is under 1% of the step
    (``unaccounted`` growing from 0.03 ms to 9.2 ms is "+9.20 ms", not "+35241%")."""
    if base <= 0 or (step and base < 0.01 * step and abs(now - base) > base):
        return f"{now - base:+.2f} ms"
    return _pct(now / base - 1)


def _activity_cells(run: DecodeRun, name: str, now: float) -> list[str]:
    """Active and idle ms of one row: CPU time and waited on a CPU; device active and
    idle inside the device span on a GPU with kernel samples."""
    active = run.summaries.get(active_form(name))
    if run.active_source == "cpu":
        span = now
    else:
        dev = run.summaries.get(device_form(name))
        span = dev.median if dev is not None and name != STEP else now
    if active is None:
        return ["-", "-"]
    return [f"{active.median:.3f}", f"{max(span - active.median, 0.0):.3f}"]


def _activity_headers(run: DecodeRun) -> list[str]:
    """The activity columns' headers; ``(p1)`` where the case ran several server processes:
    they are the first one's (its span split into active and waited), not the centers."""
    p1 = " (p1)" if run.siblings else ""
    if run.active_source == "cpu":
        return [f"cpu ms{p1}", f"waited ms{p1}"]
    if run.active_source == "device":
        return [f"active ms{p1}", f"idle ms{p1}"]
    return []


def _center_cell(centers: Mapping[str, float] | None, name: str) -> str:
    v = centers.get(name) if centers is not None else None
    return f"{v:.3f}" if v is not None else "-"


def _phase_row(
    outcome: CaseOutcome, name: str, b: float | None, now: float, step: float
) -> list[str]:
    run = outcome.run
    row = [
        name,
        f"{b:.3f}" if b is not None else "-",
        f"{now:.3f}",
        _change_cell(b, now, step) if b is not None else "-",
        f"{now / step * 100:.1f}%" if step else "-",
    ]
    if run.has_device_times:
        # the centers a phase verdict's raw device milliseconds are on a GPU
        row += [_center_cell(outcome.base_centers, device_form(name)),
                _center_cell(outcome.now_centers, device_form(name))]  # fmt: skip
    if run.active_source is not None:
        row += _activity_cells(run, name, run.summaries[name].median)
    return row


def _run_line(run: DecodeRun, now: Mapping[str, float]) -> str:
    """Accepted length and tokens/s as centers over the server processes (``now``, the
    numbers the summary and the verdicts show); steps, fragmentation, activity and graphs
    of the first process."""
    acc = now.get(ACCEPT_LEN)
    extra = [
        f"accept_len {acc:.2f} tok/step" if acc is not None else "",
        f"tokens/s {now[TOKENS_PER_S]:.1f}",
        f"steps {run.steps}",
        f"kv fragmentation {run.fragmentation:.2f}" if run.fragmentation is not None else "",
        _active_share_text(run),
    ]
    if run.graphs:
        extra.append(
            "graphs "
            + ", ".join(
                f"{k} {v['replay']} replay/{v['eager']} eager"
                + (f"/{v['capture']} capture" if v.get("capture") else "")
                for k, v in sorted(run.graphs.items())
            )
        )
    return "  ".join(e for e in extra if e)


def _active_share_text(run: DecodeRun) -> str:
    share = run.summaries.get(ACTIVE_SHARE)
    if share is None:
        return ""
    if run.active_source == "cpu":
        return f"active {share.median:.0%} (CPU time of the step)"
    k = run.kernels
    sampled = f", {k.steps} sampled step(s), {k.cost_ms:.1f} ms per sample" if k else ""
    return f"device active {share.median:.0%} of the step (kernel samples{sampled})"


def phase_table(outcome: CaseOutcome) -> list[str]:
    """Per-phase centers now (over the server processes) and at baseline (over its runs),
    the same numbers the verdict compared, with change and share of the step; on a GPU
    the device time's centers likewise (the raw milliseconds of a phase verdict there);
    where measured, the active time and the idle time inside each phase (of the first
    process)."""
    run, base, now = outcome.run, outcome.base_centers, outcome.now_centers
    step = now[STEP]
    headers = ["phase", "base ms", "now ms", "change", "share"]
    if run.has_device_times:
        headers += ["base dev ms", "now dev ms"]
    headers += _activity_headers(run)
    rows = [
        _phase_row(outcome, n, base.get(n) if base else None, now[n], step)
        for n in TABLE_ROWS
        if n in now
    ]
    right = set(range(1, len(headers)))
    return [*render_table(headers, rows, right=right), _run_line(run, now)]


def _kernel_rows(stats: Sequence[tuple[str, KernelStat]]) -> list[list[str]]:
    return [
        [
            name,
            phase,
            f"{k.calls:g}",
            f"{k.total_ms:.3f}",
            f"{k.share * 100:.0f}%" if k.share == k.share else "-",
        ]
        for phase, k in stats
        for name in [k.name if len(k.name) <= 60 else k.name[:57] + "..."]
    ]


def top_kernels(outcome: CaseOutcome, n: int = 5) -> list[str]:
    """The ``n`` largest kernels of the blamed phase (all phases when the blame is not on
    one), per sampled step: calls, ms and share of the phase; empty without samples."""
    kv = outcome.run.kernels
    if kv is None:
        return []
    culprit = outcome.verdict.culprit or ""
    keys = [culprit] if culprit in kv.phases else list(kv.phases)
    stats = sorted(
        ((key, k) for key in keys for k in kv.phases[key]), key=lambda pk: -pk[1].total_ms
    )[:n]
    if not stats:
        return []
    where = f"of {culprit}" if culprit in kv.phases else "of the step"
    head = f"top kernels {where} (per step, {kv.steps} sampled step(s), {kv.source}):"
    table = render_table(
        ["kernel", "phase", "calls", "ms", "share"], _kernel_rows(stats), right={2, 3, 4}
    )
    return [head, *table]


def most_changed_of(metrics: Sequence[MetricVerdict]) -> MetricVerdict | None:
    """The phase to show in the summary: the most grown SLOWER phase if any (phases are
    judged against the rest of their step, so when verify grows, draft's share shrinks and
    can show a larger absolute change), else the phase with the largest change."""
    phases = [m for m in metrics if m.metric in ALL_PHASES]
    slower = [m for m in phases if m.verdict is Verdict.SLOWER]
    return max(slower or phases, key=lambda m: abs(m.change), default=None)


def most_changed(outcome: CaseOutcome) -> MetricVerdict | None:
    """``most_changed_of`` the outcome's judged metrics."""
    return most_changed_of(outcome.verdict.metrics)


def failure_message(outcome: CaseOutcome, baseline_display: str, *, regression: bool = True) -> str:
    """The failed test's message: the regression (with ``regression``) or the breached
    budget, the diagnosis, the top kernels, the phase table."""
    slower = outcome.verdict.worst(Verdict.SLOWER) if regression else []
    over = outcome.over_budget
    first = slower[0].describe() if slower else (over[0].describe() if over else "failed")
    lines = [f"{first} at {outcome.where} [{baseline_display}]"]
    if outcome.run.injected:
        lines[0] += f" [injected: {outcome.run.injected}]"
    lines += [f"  also {m.describe()}" for m in slower[1:]]
    diagnosis = diagnosis_lines(outcome)
    if not slower and over:
        diagnosis.remove(over[0].describe())  # already the first line
    lines += diagnosis
    lines += outcome.notes
    kernels = top_kernels(outcome)
    return "\n".join([*lines, *(["", *kernels] if kernels else []), "", *phase_table(outcome)])


def _change_text(m: MetricVerdict) -> str:
    """``verify/rest +26.5%``: the change judged, named by the form it was judged on (a
    phase against the rest of its step; its raw change is the phase table's)."""
    change = f"{m.change * 100:+.1f}pp" if m.share_based else _pct(m.change)
    name = m.metric
    if m.basis is not None and m.metric in ALL_PHASES:  # on a GPU, its device time's form
        name = rest_form(m.metric) + (" (device)" if "device" in m.basis else "")
    return f"{name} {change}"


def _summary_row(c: CaseView) -> list[str]:
    b = c.base_step_ms
    mc = most_changed_of(c.metrics)
    verdict = c.record.verdict_text(recorded=True)
    if c.injected:
        verdict += " [injected]"
    if c.rounds > 1:
        verdict += f", {c.rounds} rounds"
    if c.processes > 1:
        verdict += f", {c.processes} processes"
    return [
        c.name,
        f"{b:.2f} -> {c.step_ms:.2f}" if b else f"- -> {c.step_ms:.2f}",
        _judged_step_change(c),
        _change_text(mc) if mc else "-",
        f"{c.accept_len:.2f}",
        verdict,
    ]


def _judged_step_change(c: CaseView) -> str:
    """The step's change as its verdict judged it (against the KV read time where the
    backend reports it, so a slower machine does not read as a change); the raw change
    only where the step was not judged (no gate, no baseline: ``-``)."""
    step = next((m for m in c.metrics if m.metric == STEP), None)
    if step is not None and math.isfinite(step.change):
        return _pct(step.change)
    return "-"


SUMMARY_HEADERS = (
    "case",
    "step ms (base -> now)",
    "step (judged)",
    "most changed",
    "accept",
    "verdict",
)


def summary_rows(cases: Sequence[CaseView]) -> list[list[str]]:
    """The summary table's rows (the terminal and the Markdown show the same)."""
    return [_summary_row(c) for c in cases]


def summary_table(cases: Sequence[CaseView]) -> list[str]:
    return render_table(list(SUMMARY_HEADERS), summary_rows(cases), right={1, 2, 4})


def unstable_advice(m: MetricVerdict, *, max_time_s: float | None = None, ab: bool = False,
                    per_look: int = 1, compared: bool = False,
                    looks: Family | None = None, rounds: int | None = None) -> str:  # fmt: skip
    """Why a metric could not be decided, and what would decide it: nothing but a quiet
    machine (disturbed), more processes (the noise between server processes), or more
    steps (the automatic extension's budget, ``max_time_s``, was spent or is off).
    ``ab``: an A/B case (its baseline is the reference side of this run, never recorded);
    ``per_look``: the rounds its first tested process measured a look
    (``judging.ab.rounds_per_look``: 2 with one process a side); ``compared``: judged by
    ``specperf compare`` from two saved runs (A the baseline, B the run): the remedy is
    to measure again with the options that decide it and compare again, not to record.
    ``looks``: the case's share of the run's budget (its planned looks and the look judged),
    and ``rounds`` the rounds it measured: the extension may have stopped on its looks, not
    on its time (None: unknown; a verdict's own ``rounds`` is 1 in A/B)."""
    unit = "pp" if m.in_points else "%"
    # the quantity judged (``verify / rest of step``): its change, not the raw one's
    text = f"{m.judged_label} changed {m.change * 100:+.1f}{unit}"
    if m.disturbed and m.scatter_ratio is not None:
        return text + _disturbed_advice(m, m.scatter_ratio, ab=ab, compared=compared)
    band = m.band
    # a relative change's noise is of its log: the band as a change in the worse direction
    # (a rise of a time, a drop of a higher-is-better quantity), beside the tolerance
    worse = -band if spec(m.metric).higher_is_better else band
    as_change = "" if m.in_points else f" (log), a change of {math.expm1(worse) * 100:+.1f}%"
    text += (
        f" within noise +-{m.noise * 100:.1f}{unit} (t x noise = {m.critical:.2f} x "
        f"{m.noise * 100:.1f}{unit} = {band * 100:.1f}{unit}{as_change} > tol "
        f"{m.tolerance * 100:.0f}{unit})"
    )
    if m.steps_to_decide and compared:  # B's blocks pair with A's: both take the steps
        steps = f"with --specperf-steps {m.steps_to_decide} (or the marker's steps=)"
        decide = f"; about {m.steps_to_decide} steps would decide: "
        return text + decide + measure_again("A and B", steps)
    if m.steps_to_decide:
        return text + _steps_advice(m, max_time_s, per_look, looks, rounds)
    if m.within is not None and m.floor is not None:  # paired: more steps cannot decide
        return text + (_ab_processes_advice(m) if ab else _processes_advice(m, compared))
    return text


def _disturbed_advice(m: MetricVerdict, ratio: float, *, ab: bool, compared: bool) -> str:
    """A disturbed metric: which side's blocks scattered (``ratio``: this run's scatter
    over the baseline's), and that a quiet machine decides it (``unstable_advice``)."""
    reach = ""
    if m.block_scatter is not None:  # beyond_disturbance: what it would have taken
        reach = f", and a disturbance can move a center by {reach_text(m.block_scatter)} at most"
    if ab or compared:  # A/B: both sides of this sitting; compare: two saved runs
        busy = "A" if ratio < 1 else "B"
        remedy = "rerun on a quiet machine" if ab else measure_again(busy, "on a quiet machine")
        return (
            f", but {'side' if ab else 'run'} {busy}'s blocks scatter "
            f"{max(ratio, 1 / ratio):.1f}x more than the other's"
            f"{reach}: the machine was busy or disturbed while {busy} ran; {remedy}"
        )
    if ratio < 1:
        return (
            f", but the baseline's blocks scatter {1 / ratio:.1f}x more than "
            f"this run's{reach}: the baseline was recorded on a busy machine; re-record "
            "it on a quiet one"
        )
    return (
        f", but this run's blocks scatter {ratio:.1f}x more than the "
        f"baseline's{reach}: the machine was busy or disturbed; rerun it on a quiet machine"
    )


def measure_again(runs: str, how: str) -> str:
    """``specperf compare``'s remedy: measure the saved ``runs`` (``A``, ``B``, ``A and B``)
    again ``how``, save them as before, and compare again."""
    return (
        f"measure {runs} again {how} (pytest ... --specperf-json FILE, or --benchmark-save) "
        "and compare again"
    )


#: A critical value this many times the normal one at the same level says the verdict's
#: degrees of freedom, not its noise, widen the band (t at 4.46e-4 on 14 df: 1.25x).
FEW_DF_RATIO = 1.25


def _few_df_advice(m: MetricVerdict) -> str:
    """Where few degrees of freedom widen an A/B band (a capped device prior, and little
    of the case's own evidence yet): the critical value against the normal one, and what
    adds degrees of freedom (earlier A/B reports as history: each adds its tested processes
    less one)."""
    if m.df is None or m.alpha is None or not 0 < m.alpha < 1 or not math.isfinite(m.critical):
        return ""
    normal = critical(m.alpha, math.inf)  # the same level on unlimited degrees of freedom
    if m.critical < FEW_DF_RATIO * normal:
        return ""
    earlier = max(m.history_runs - m.now_runs, 0)  # A/B: the history runs hold B's own
    return (
        f"; its critical value {m.critical:.2f} rests on {m.df:.1f} degrees of freedom "
        f"({normal:.2f} on many), with {earlier} earlier tested process(es) from "
        "--specperf-history: keep the nightly A/B reports and pass their folder as "
        "--specperf-history, each adds this case's own spread between processes"
    )


def _ab_processes_advice(m: MetricVerdict) -> str:
    """An A/B case's noise between server processes: more processes per side decide it."""
    between = f"+-{m.between * 100:.1f}%" if m.between is not None else "unknown"
    text = (
        f"; more steps cannot decide it: the noise between server processes is {between} "
        f"per run ({m.base_runs} reference and {m.now_runs} tested process(es))"
    ) + _few_df_advice(m)
    p = m.processes_to_decide
    if p is not None:
        return text + f"; about {p} processes per side would decide: --specperf-processes {p}"
    if m.between is not None and m.within is not None and m.between > m.within:
        return text + (
            "; no practical number of processes would: its processes differ more than its "
            "blocks do; with the reference engine on a CPU, huge pages took such a split "
            "away on one box (export THP_MEM_ALLOC_ENABLE=1, docs/ab.md); otherwise record "
            "the baseline in 5 processes (--specperf-update-baselines --specperf-processes "
            "5): a split that no setting decides is marked not gated in the file when the "
            "recording finds it, and A/B runs of a comparable setup honour the mark "
            "(docs/statistics.md, section 6)"
        )
    return text + "; no practical number of processes would: run on a quieter machine"


def _processes_advice(m: MetricVerdict, compared: bool = False) -> str:
    """More server processes, or else what lowers the sitting or process noise;
    ``compared``: ``specperf compare``'s remedies (``unstable_advice``)."""
    runs = f"{m.base_runs} {'run(s) of A' if compared else 'baseline run(s)'}"
    if m.history_runs:
        runs += f" and {m.history_runs} history run(s)"
    between = f"+-{m.between * 100:.1f}%" if m.between is not None else "unknown"
    text = (
        f"; more steps cannot decide it: the noise between server processes is {between} "
        f"per run ({runs}), and {'A' if compared else 'the baseline'}'s own blocks add theirs"
    )
    sd = m.sitting if m.sitting is not None and m.sitting_coef else 0.0
    sitting = sd > 0
    if sitting:
        where = ("runs A and B are two sittings" if compared
                 else f"{m.sittings} sitting(s) in the baseline")  # fmt: skip
        text += f"; the offset between sittings is +-{sd * 100:.1f}% ({where}; docs/statistics.md)"
    p = m.processes_to_decide
    if p is None and sitting and compared:
        return text + (
            "; no number of processes would: B is judged under the device prior it saved; "
            "measure a calibrated one with specperf calibrate, then "
            + measure_again("B", "with it beside the baselines")
        )
    if p is None and sitting:
        return text + (
            "; no number of processes would: update the baseline in more sittings (on other "
            "days), or measure a calibrated prior with specperf calibrate"
        )
    if p is None and compared:
        return text + "; no practical number of processes would: " + measure_again(
            "A and B", "on a quiet machine")  # fmt: skip
    if p is None:
        return text + "; no practical number of processes would: re-record on a quiet machine"
    if compared:  # A is the baseline: it needs the processes too when it has fewer
        runs = "B" if p <= m.base_runs else "A and B"
        return text + f"; about {p} processes would decide: " + measure_again(
            runs, f"with --specperf-processes {p}")  # fmt: skip
    run = f"run with --specperf-processes {p}"
    if p <= m.base_runs:
        return text + f"; about {p} processes would decide: {run}"
    keep = f" -o specperf_keep_runs={p}" if p > DEFAULT_KEEP_RUNS else ""
    return text + (
        f"; about {p} processes would decide: record the baseline with "
        f"--specperf-update-baselines --specperf-processes {p}{keep} and {run}"
    )


def _steps_advice(m: MetricVerdict, max_time_s: float | None, per_look: int = 1,
                  looks: Family | None = None, rounds: int | None = None) -> str:  # fmt: skip
    """More steps. ``m.steps_to_decide`` counts the first tested process's steps over its
    rounds; ``--specperf-steps`` sets a round's, and where a look measures that process
    ``per_look`` rounds (A/B with one process a side: ``A1 B1 B1 A1``), a run needs that
    many times fewer. An extension that took every look it planned stopped on them, not
    on its time: more time would not have added a look."""
    steps = m.steps_to_decide
    per_look = per_look if m.ab_sides and per_look > 1 else 1
    per_round = -(-steps // per_look) if steps else steps
    each = f" in the first tested process (it measures {per_look} rounds a look)"
    text = f"; about {steps} steps{each if per_look > 1 else ''} would decide"
    if max_time_s is None:
        return text + (
            f": record the baseline and run with --specperf-steps {steps} (or the marker's "
            "steps=)"
        )
    # a stored baseline is judged at its own steps only: it is recorded at the new ones too
    how = "run" if m.ab_sides else "record the baseline and run"
    if max_time_s <= 0:
        return text + (
            " and the automatic extension is off (--specperf-max-time 0): raise it, or "
            f"{how} with --specperf-steps {per_round}"
        )
    n = m.rounds if rounds is None else rounds
    after = f" after {n} rounds" if n > 1 else ""
    if looks is not None and looks.looks > 1 and looks.look >= looks.looks:
        both = " (both sides)" if m.ab_sides else ""
        return text + (
            f": the automatic extension took all {looks.looks} of its looks{after}; {how} "
            f"with --specperf-steps {per_round}{both} (or the marker's steps=)"
        )
    # A/B: both sides can measure the steps from the start, with no further round
    other = (f", or run with --specperf-steps {per_round} (both sides)" if m.ab_sides
             else " (or rerun on a quieter machine)")  # fmt: skip
    return text + (
        f": the automatic extension stopped{after} at --specperf-max-time {max_time_s:g} s; "
        f"raise it{other}"
    )


@dataclass(frozen=True)
class RunSummary:
    """What the end-of-run summary says, besides the cases."""

    backend: str
    device_slug: str
    baselines: str
    tolerance: float
    step_tolerance: float
    update: bool
    inject: str | None = None
    telemetry_note: str | None = None
    backend_notes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    #: "baselines written: ..." and what moved, after an update
    written: tuple[str, ...] = ()
    json_path: str | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)
    #: --specperf-strict: the last line counts the judged cases
    strict: bool = False
    #: pytest-xdist workers whose cases are merged here (0: none)
    workers: int = 0
    #: the automatic extension's budget per case (``--specperf-max-time``; None: recording)
    max_time_s: float | None = None
    processes: int = 1
    #: ``--specperf-ab``: the reference side as typed (None: baseline files)
    ab: str | None = None


#: How a case's reason that some of its gates are not gated begins (``judge.not_gated_reason``).
NOT_GATED = "not gated: "


def case_notes(
    cases: Sequence[CaseView], max_time_s: float | None = None, *, compared: bool = False
) -> list[str]:
    """``INVALID ...``, ``NOT GATED ...`` and ``UNSTABLE ...`` lines: why a case (or some
    of its gates) could not be compared; ``compared``: by ``specperf compare``, whose
    remedies are its own (``unstable_advice``)."""
    lines = []
    for c in cases:
        if c.verdict is Verdict.INVALID:
            lines.append(f"INVALID {c.test} {c.key}: {'; '.join(c.reasons)}")
        # a bimodal case's gates, marked in the baseline file: said once per case
        lines += [f"NOT GATED {c.test} {c.key}: {r}" for r in c.reasons if r.startswith(NOT_GATED)]
        for m in c.metrics:
            if m.verdict is Verdict.UNSTABLE:
                advice = unstable_advice(m, max_time_s=max_time_s, ab=c.ab_reference is not None,
                                         per_look=c.rounds_per_look, compared=compared,
                                         looks=saved_family(c.record), rounds=c.rounds)  # fmt: skip
                lines.append(f"UNSTABLE {c.test} {c.key}: {advice}")
    return lines


def head_lines(s: RunSummary) -> list[str]:
    """The summary's first line (backend, device, baselines, tolerances) and the canary's."""
    workers = f", {s.workers} xdist workers" if s.workers else ""
    against = f"baselines {s.baselines}"
    procs = f", {s.processes} server processes" if s.processes > 1 else ""
    if s.ab is not None:
        against = f"A/B in this run: B (this build) against A ({s.ab})"
        procs = f", {s.processes} server processes per side, alternating A B B A"
        if s.ab.startswith("url="):  # A is one running server, measured again in turn
            procs = (f", A one running server, B {s.processes} server process(es), "
                     "alternating A B B A")  # fmt: skip
    tolerance = f"tolerance {s.tolerance:.0%} (phases), {s.step_tolerance:.0%} (step time)"
    lines = [f"specperf: {s.backend} backend, device {s.device_slug}, {against}, {tolerance}"]
    lines[0] += workers + procs
    if s.inject:
        lines.append(
            f"canary injection active: {s.inject} (runs are labelled [injected] and never "
            "recorded as baselines)"
        )
    return lines


#: KV reads this many times slower or faster than the baselines' (median over the cases)
#: mean the baselines come from another machine, or this one has changed
MACHINE_RATIO = 1.5


def machine_note(cases: Sequence[CaseView], *, recording: bool = False) -> str | None:
    """A line when the KV read time moved far from the baselines': raw times in the table
    are then not comparable, though the verdicts (judged against the read time and the
    rest of the step) are. The read time's ratio is the raw step's over ``step/ref``'s.

    Not while recording, and not from INVALID cases (a throttled GPU reads slowly too)."""
    if recording:
        return None
    ratios = []
    for c in cases:
        if c.verdict is Verdict.INVALID:
            continue
        for m in c.metrics:
            if m.metric != STEP or not m.basis or m.raw_change is None:
                continue
            if math.isfinite(m.raw_change) and math.isfinite(m.change) and m.change > -1:
                ratios.append((1 + m.raw_change) / (1 + m.change))
    if not ratios:
        return None
    r = statistics.median(ratios)
    if not math.isfinite(r) or r <= 0 or 1 / MACHINE_RATIO <= r <= MACHINE_RATIO:
        return None
    if any(c.ab_reference is not None for c in cases):  # one machine, both sides this run
        return (
            f"A/B: B read the KV in {r:.2f}x the time A took (median of {len(ratios)} "
            "case(s)): the two sides read it differently (their builds or server "
            "arguments), on this one machine. The step is judged against each side's own "
            "read time; the raw step change beside it is what B costs"
        )
    head = (
        f"machine: KV reads took {r:.2f}x as long as in the baselines (median of "
        f"{len(ratios)} case(s))"
    )
    held = "The verdicts hold (steps and tokens/s are judged against the read time, phases "
    held += "against the rest of their step); the raw times are not comparable"
    runq = _runq_share(cases)
    if runq is not None and runq >= LOADED_RUNQ_SHARE:
        return (
            f"{head}: this machine was loaded (the server's thread waited for a CPU "
            f"{runq:.0%} of the step, median over the cases), not necessarily another "
            f"machine. {held}. Rerun on a quiet machine before reading the raw times"
        )
    return (
        f"{head}: another machine, or this one changed. {held}. Record this machine's "
        "baselines under its own name (--specperf-device NAME or --specperf-baselines DIR): "
        "an update of this file would pool both machines' runs"
    )


#: The server thread's run-queue share of the step (median over the cases) from which the
#: machine line blames load rather than another machine.
LOADED_RUNQ_SHARE = 0.10


def _runq_share(cases: Sequence[CaseView]) -> float | None:
    """The median over the cases of the step's run-queue share (Linux schedstat: the
    server's thread runnable without a CPU), where measured."""
    shares = []
    for c in cases:
        b = c.record.data.get("bottleneck")
        figures = b.get("figures") if isinstance(b, Mapping) else None
        x = figures.get("runq_share") if isinstance(figures, Mapping) else None
        if isinstance(x, (int, float)) and math.isfinite(x):
            shares.append(float(x))
    return statistics.median(shares) if shares else None


def no_baseline_hint(s: RunSummary, cases: Sequence[CaseView]) -> str | None:
    missing = [c for c in cases if c.verdict is Verdict.NO_BASELINE]
    if not missing or s.update:
        return None
    return (
        f"hint: {len(missing)} case(s) have no baseline in {s.baselines}; record them "
        "with: pytest perf_tests --specperf-update-baselines"
    )


def strict_line(s: RunSummary, cases: Sequence[CaseView]) -> str | None:
    """``strict: judged N of M cases; not judged: case (why), ...`` under --specperf-strict."""
    if not s.strict:
        return None
    others = [c for c in cases if c.unjudged]
    verb = "recorded" if s.update else "judged"
    line = f"strict: {verb} {len(cases) - len(others)} of {len(cases)} cases"
    if others:
        line += f"; not {verb}: " + ", ".join(f"{c.name} ({'; '.join(c.unjudged)})" for c in others)
    return line


def svg_path(json_path: str) -> str:
    """The picture written beside the JSON report: its path with the suffix ``.svg``."""
    from pathlib import Path

    return str(Path(json_path).with_suffix(".svg"))


def run_summary(s: RunSummary, cases: Sequence[CaseView]) -> list[str]:
    """The lines printed after pytest's own: the table, hints, notes, files, errors; under
    --specperf-strict the last line counts the judged cases."""
    if not cases and not s.errors:
        return []
    lines = [*head_lines(s), *summary_table(cases)] if cases else []
    hint = no_baseline_hint(s, cases)
    lines += [hint] if hint else []
    machine = machine_note(cases, recording=s.update)
    lines += [machine] if machine else []
    lines += case_notes(cases, s.max_time_s)
    if cases:
        lines += [s.telemetry_note] if s.telemetry_note else []
        lines += s.backend_notes
    lines += s.notes
    lines += s.written
    if s.json_path and cases:
        lines.append(f"JSON report: {s.json_path} (picture: {svg_path(s.json_path)})")
    lines += [f"ERROR: {e}" for e in s.errors]
    last = strict_line(s, cases)
    return lines + ([last] if last else [])
