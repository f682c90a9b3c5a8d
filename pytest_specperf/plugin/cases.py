"""Judge the runs of a test when it ends, and tell pytest: a failure, a warning, a section.

The verdict itself is ``judging.judge.judge_case``; this module gathers what it needs from
the test item, the session and the server, and turns the outcome into pytest's terms.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_specperf.judging.baselines import CaseBaseline, CaseProblem, identity_of
from pytest_specperf.judging.judge import (
    Case,
    CaseOutcome,
    HistoryRun,
    as_baseline,
    judge_case,
    more_steps_would_decide,
    noisy_baseline_note,
    recording_refusal,
)
from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP
from pytest_specperf.judging.noise import DevicePrior
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.significance import MAX_LOOKS, Family
from pytest_specperf.judging.strict import Unjudged, unjudged
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.plugin.session import SpecperfSession, SpecperfWarning, get_session
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.reporting.terminal import failure_message, phase_table, unstable_advice
from pytest_specperf.reporting.view import CaseView, diagnosis_lines
from pytest_specperf.store.baselines import BaselineError, utc_now

if TYPE_CHECKING:
    from pytest_specperf.plugin.fixtures import SpecperfHandle

#: Parameters that are already part of the case key (or are the layout fixture).
_KEYED_PARAMS = {"context_len", "batch_size", "fragmented_kv"}


def test_id(item: pytest.Item) -> str:
    """The node id without its parametrization: the baseline's test key."""
    return re.sub(r"\[.*\]$", "", item.nodeid)


def case_key(item: pytest.Item, run: DecodeRun) -> str:
    """``ctx=<tokens> kv=<layout> bs=<batch>`` plus the test's other parameters."""
    return case_key_of(item, run.context_len, run.kv_layout.label, run.batch_size)


def case_key_of(item: pytest.Item, context_len: int, layout: str, batch_size: int) -> str:
    """The key of a case of ``item`` before it runs (see :func:`case_key`)."""
    key = f"ctx={context_len} kv={layout} bs={batch_size}"
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        extra = sorted((k, v) for k, v in callspec.params.items() if k not in _KEYED_PARAMS)
        key += "".join(f" {k}={v}" for k, v in extra)
    return key


def _peak_bandwidth(sess: SpecperfSession) -> float | None:
    dev = sess.device()
    if dev.kind != "cuda":
        return None
    from pytest_specperf.telemetry.bandwidth import peak_bandwidth

    pb = peak_bandwidth(dev.name, dev.nvml_index)
    return pb.bytes_per_s if pb is not None else None


def _case(sess: SpecperfSession, item: pytest.Item, handle: SpecperfHandle, run: DecodeRun,
          key: str) -> Case:  # fmt: skip
    srv = handle.server
    opts, s = handle.options, sess.settings
    return Case(
        nodeid=item.nodeid,
        test=test_id(item),
        key=key,
        run=run,
        fingerprint=srv.fingerprint,
        tolerances=Tolerances(
            phase=opts.tolerance or s.tolerance, step=opts.step_tolerance or s.step_tolerance
        ),
        gates=opts.gate,
        speculative=srv.speculative,
        kv_bytes_per_token=srv.backend.kv_bytes_per_token(srv.server_info),
        peak_bandwidth_bytes_per_s=_peak_bandwidth(sess),
        server_pid=_pid(srv.server_info.get("pid")),
        history=_history(sess, test_id(item), key),
        kv_traffic=_mapping(srv.server_info.get("kv_read")),
        budgets=s.budgets().over(opts.budgets),
        family=Family(
            tests=sess.judged_tests,
            cases=max(1, len(handle.runs)),
            looks=MAX_LOOKS if s.max_time_s > 0 and not s.update_baselines else 1,
        ),
        prior=_prior(sess),
        sitting=sess.sitting,
    )


def _prior(sess: SpecperfSession) -> DevicePrior:
    try:
        return sess.prior()
    except BaselineError as e:
        raise pytest.fail(str(e), pytrace=False) from None


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _history(sess: SpecperfSession, test: str, key: str) -> tuple[HistoryRun, ...]:
    history = sess.history()
    return history.of(test, key) if history is not None else ()


def undecided_metrics(
    sess: SpecperfSession, item: pytest.Item, handle: SpecperfHandle
) -> Callable[[DecodeRun], list[str]]:
    """For the automatic extension: the metrics a run measured so far in this test leaves
    UNSTABLE that more rounds would decide (judged as at the end of the test)."""

    def undecided(run: DecodeRun) -> list[str]:
        key = _keys(item, [*handle.runs, run])[-1]
        case = _case(sess, item, handle, run, key)
        found, _ = _baseline(sess, case)
        return more_steps_would_decide(case, found)

    return undecided


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _baseline(
    sess: SpecperfSession, case: Case
) -> tuple[CaseBaseline | CaseProblem | None, str]:
    """The case's baseline (or the problem with it) and, when there is none, why: a
    file another device recorded is a problem of every case (INVALID, never compared)."""
    problem = None
    try:
        bf = sess.baselines()
        foreign = sess.foreign_baselines()
    except BaselineError as e:
        problem = str(e)
    if problem is not None:  # failed here, not in the handler: no chained traceback
        pytest.fail(problem, pytrace=False)
    where = sess.display_path(sess.baseline_path)
    if bf is None:
        return None, f"no baseline file {where}"
    if foreign is not None:
        fix = f"this run is never judged against it: {FOREIGN_FIX}"
        return CaseProblem(bf.path, "device", case.test, case.key, foreign, fix), ""
    identity = identity_of(case.fingerprint)
    found = bf.lookup(identity, case.test, case.key)
    if found is not None:
        return found, ""
    held = ", ".join(i.key for i in bf.identities()) or "none"
    return None, (
        f"no baseline for {case.key} ({identity.key}) in {where}; the file holds baselines "
        f"of {held[:300]}"
    )


#: What to do about a baseline file another device recorded.
FOREIGN_FIX = (
    "move the file away (or point --specperf-baselines elsewhere) and record this "
    "device's with --specperf-update-baselines"
)


def baseline_refusal(sess: SpecperfSession) -> str | None:
    """Why the session must not measure anything, read before its first server starts:
    an unusable baseline file (the message names the file, the place and the fix), or
    an update into a file another device recorded."""
    try:
        sess.baselines()
        foreign = sess.foreign_baselines()
    except BaselineError as e:
        return f"specperf: refused before measuring anything: {e}"
    if foreign is not None and sess.settings.update_baselines:
        return (
            f"specperf: refused before measuring anything: {sess.baseline_path}: {foreign}; "
            f"an update would mix the two devices' runs: {FOREIGN_FIX}"
        )
    return None


def baseline_step_ms(
    sess: SpecperfSession, item: pytest.Item, fingerprint: dict[str, Any], key: str
) -> float | None:
    """The baseline's median step time (ms) of a case about to run, for its deadlines;
    None without a usable one (the judge reports an unusable baseline after the run)."""
    try:
        bf = sess.baselines()
        if bf is None or sess.foreign_baselines() is not None:
            return None
        found = bf.lookup(identity_of(fingerprint), test_id(item), key)
    except (BaselineError, ValueError):
        return None
    step = found.metrics.get(STEP) if isinstance(found, CaseBaseline) else None
    if step is None or not math.isfinite(step.value) or step.value <= 0:
        return None
    return step.value


def judge(sess: SpecperfSession, case: Case) -> CaseOutcome:
    """Judge one case (with --specperf-update-baselines, refuse a run that must not be
    recorded; ``queue_record`` queues the others)."""
    base, missing = _baseline(sess, case)
    record = sess.settings.update_baselines
    if record:
        refusal = recording_refusal(case.run, case.key)
        if refusal:
            pytest.fail(refusal, pytrace=False)
    outcome = judge_case(case, base, sess.baseline_path, missing=missing, record=record)
    if outcome.run.telemetry is not None and not outcome.run.telemetry.available:
        sess.telemetry_note = outcome.run.telemetry.reason
    return outcome


def queue_record(sess: SpecperfSession, case: Case) -> None:
    """Queue a case for --specperf-update-baselines (written at the end of the session)."""
    sess.to_record.append(as_baseline(case, at=utc_now()))
    note = noisy_baseline_note(case)
    if note:
        sess.notes.append(note)


def _profile(sess: SpecperfSession, item: pytest.Item, handle: SpecperfHandle,
             outcome: CaseOutcome) -> str:  # fmt: skip
    """Profile a re-run of a regressed case; the note names the trace."""
    json_path = sess.settings.json_path
    where = json_path.parent if json_path else sess.config.rootpath / "specperf-profiles"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{item.name}-{outcome.key}")[:150]
    trace = where / f"{name}-{stamp}.json"
    try:
        files = handle.profile(outcome.run, trace)
    except Exception as e:  # the regression is the news; a failed profile is a footnote
        return f"profile of a re-run failed: {type(e).__name__}: {e}"
    shown = ", ".join(sess.display_path(f) for f in files) or "(no trace written)"
    return f"profile of a re-run of this case: {shown}"


def _keys(item: pytest.Item, runs: list[DecodeRun]) -> list[str]:
    """Case keys of a test's runs; a repeated case gets ``#2``, ``#3``."""
    seen: dict[str, int] = {}
    keys = []
    for run in runs:
        key = case_key(item, run)
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return keys


def _report(sess: SpecperfSession, item: pytest.Item, handle: SpecperfHandle,
            outcome: CaseOutcome) -> tuple[CaseOutcome, list[str]]:  # fmt: skip
    """The outcome (with a profile note when asked) and the failure lines it gives."""
    failures = []
    run, v = outcome.run, outcome.verdict.verdict
    if handle.expect_graphs and (run.eager_forwards or run.captures):
        graphs = {k: dict(v) for k, v in run.graphs.items()}
        failures.append(
            f"CUDA graphs were warmed but {run.eager_forwards} measured forward(s) ran "
            f"eagerly and {run.captures} captured at {outcome.where}: {graphs}"
        )
    regression = v is Verdict.SLOWER and not sess.settings.update_baselines
    if regression or outcome.over_budget:  # a budget fails the case even in an update
        if regression and sess.settings.profile_on_regression:
            note = _profile(sess, item, handle, outcome)
            outcome = dataclasses.replace(outcome, notes=(*outcome.notes, note))
        where = sess.display_path(outcome.baseline_path)
        failures.append(failure_message(outcome, where, regression=regression))
        return outcome, failures
    if v is Verdict.INVALID:
        reasons = "; ".join(outcome.verdict.reasons)
        item.warn(SpecperfWarning(f"{outcome.key}: INVALID: {reasons}"))
    section = "\n".join(
        [f"{outcome.key}: {v.value}", *diagnosis_lines(outcome), "", *phase_table(outcome)]
    )
    item.add_report_section("call", "specperf", section)
    return outcome, failures


def record_command(config: pytest.Config) -> str:
    """This run's command line as an update: what records the missing baselines."""
    out: list[str] = []
    args = iter(config.invocation_params.args)
    for a in args:
        if a == "--specperf-inject":  # an injected run is never recorded
            next(args, None)
        elif a != "--specperf-strict" and not a.startswith("--specperf-inject="):
            out.append(a)
    return shlex.join(["pytest", *out, "--specperf-update-baselines"])


def _mapped_phases(handle: SpecperfHandle) -> frozenset[str] | None:
    srv = handle.server
    mapped = getattr(srv.backend, "mapped_phases", None)  # a third-party backend may lack it
    return mapped(srv.server_info) if mapped is not None else None


def _strict(sess: SpecperfSession, handle: SpecperfHandle, outcome: CaseOutcome
            ) -> tuple[Unjudged, ...]:  # fmt: skip
    """Under --specperf-strict, why the case does not count as judged."""
    if not sess.settings.strict:
        return ()
    return unjudged(
        outcome,
        mapped=_mapped_phases(handle),
        gpu_run=sess.device().kind == "cuda",
        recording=sess.settings.update_baselines,
        telemetry_note=sess.telemetry_note,
    )


def strict_failure(config: pytest.Config, outcome: CaseOutcome,
                   problems: tuple[Unjudged, ...]) -> str:  # fmt: skip
    """The strict run's failure lines for a case that was not judged."""
    lines = [f"--specperf-strict: {outcome.key} was not judged"]
    for p in problems:
        detail = p.detail
        if p.label == Verdict.NO_BASELINE.value:
            detail += f"; record it with: {record_command(config)}"
        lines.append(f"  {detail}")
        if p.label == Verdict.UNSTABLE.value:
            undecided = outcome.verdict.worst(Verdict.UNSTABLE)
            s = get_session(config).settings
            budget = None if s.update_baselines else s.max_time_s
            lines += [f"    {unstable_advice(m, max_time_s=budget)}" for m in undecided]
    return "\n".join(lines)


def junit_properties(outcome: CaseOutcome, baseline_file: str,
                     problems: tuple[Unjudged, ...]) -> list[tuple[str, str]]:  # fmt: skip
    """The case's figures as test properties (``--junitxml`` writes them); a test with
    several cases repeats the group, each starting with ``specperf.case``."""
    run = outcome.run
    props = [
        ("specperf.case", outcome.key),
        ("specperf.verdict", outcome.verdict.verdict.value),
        (f"specperf.{STEP}_ms", f"{run.summaries[STEP].median:.4f}"),
    ]
    props += [
        (f"specperf.phase.{p}_ms", f"{run.summaries[p].median:.4f}")
        for p in ALL_PHASES
        if p in run.summaries
    ]
    props += [
        (f"specperf.{ACCEPT_LEN}", f"{run.accept_len:.3f}"),
        ("specperf.baseline", baseline_file),
    ]
    if problems:
        props.append(("specperf.not_judged", "; ".join(p.label for p in problems)))
    return props


def judge_item(sess: SpecperfSession, item: pytest.Item, handle: SpecperfHandle) -> None:
    """Judge every run of a test that completed; fail it on a regression, and under
    --specperf-strict on a case that was not judged."""
    failures = []
    for run, key in zip(handle.runs, _keys(item, handle.runs)):
        case = _case(sess, item, handle, run, key)
        outcome = judge(sess, case)
        outcome, lines = _report(sess, item, handle, outcome)
        problems = _strict(sess, handle, outcome)
        if problems:
            lines.append(strict_failure(sess.config, outcome, problems))
            outcome = dataclasses.replace(outcome, recorded=False)
        elif sess.settings.update_baselines:  # strict: an incomplete run is not recorded
            queue_record(sess, case)
        shown = sess.display_path(outcome.baseline_path)
        item.user_properties.extend(junit_properties(outcome, shown, problems))
        sess.outcomes.append(outcome)
        sess.cases.append(
            CaseView.of(
                outcome,
                baseline_file=shown,
                failure="\n\n".join(lines),
                unjudged=tuple(p.label for p in problems),
            )
        )
        failures += lines
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
