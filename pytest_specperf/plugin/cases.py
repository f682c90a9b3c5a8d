"""Judge the runs of a test when it ends, and tell pytest: a failure, a warning, a section.

The case is assembled and judged in ``run.cases`` (the verdict itself is
``judging.judge.judge_case``); this module says what the test item asks (its
``CaseRequest``) and turns the outcome into pytest's terms.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import shlex
from typing import TYPE_CHECKING

import pytest

from pytest_specperf.judging.ab import rounds_per_look
from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP
from pytest_specperf.judging.strict import Unjudged
from pytest_specperf.judging.verdict import Verdict, verdict_label
from pytest_specperf.plugin.session import SpecperfSession, SpecperfWarning, get_session
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.reporting.terminal import failure_message, phase_table, unstable_advice
from pytest_specperf.reporting.view import CaseView, diagnosis_lines
from pytest_specperf.run.cases import CaseRefused, Judged, Policy, judge_ab, judge_one

if TYPE_CHECKING:
    from pytest_specperf.plugin.fixtures import SpecperfHandle
    from pytest_specperf.run.inputs import RunInputs


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
        if outcome.reference is not None:
            where = f"A/B in this run against A: {outcome.reference}"
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
            ab = outcome.reference is not None
            a = len(outcome.baseline.runs) if ab and outcome.baseline is not None else 1
            per_look = rounds_per_look(a, len(outcome.run.processes)) if ab else 1
            lines += [
                "    " + unstable_advice(m, max_time_s=budget, ab=ab, per_look=per_look,
                                         looks=outcome.family, rounds=outcome.run.rounds)
                for m in undecided
            ]  # fmt: skip
    return "\n".join(lines)


def junit_properties(outcome: CaseOutcome, baseline_file: str,
                     problems: tuple[Unjudged, ...]) -> list[tuple[str, str]]:  # fmt: skip
    """The case's figures as test properties (``--junitxml`` writes them); a test with
    several cases repeats the group, each starting with ``specperf.case``."""
    now = outcome.now_centers  # over the server processes: the summary's numbers
    verdict = verdict_label(outcome.verdict.verdict, over_budget=bool(outcome.over_budget),
                            recorded=outcome.recorded)  # fmt: skip
    props = [
        ("specperf.case", outcome.key),
        ("specperf.verdict", verdict),
        (f"specperf.{STEP}_ms", f"{now[STEP]:.4f}"),
    ]
    props += [(f"specperf.phase.{p}_ms", f"{now[p]:.4f}") for p in ALL_PHASES if p in now]
    props += [
        (f"specperf.{ACCEPT_LEN}", f"{now[ACCEPT_LEN]:.3f}"),
        ("specperf.baseline", baseline_file),
    ]
    if outcome.reference is not None:  # A/B in this run: the reference side, as typed
        props.append(("specperf.ab_reference", outcome.reference))
    if problems:
        props.append(("specperf.not_judged", "; ".join(p.label for p in problems)))
    return props


def _policy(sess: SpecperfSession, inputs: RunInputs) -> Policy:
    s = sess.settings
    return Policy(record=s.update_baselines, strict=s.strict, gpu_run=inputs.device.kind == "cuda")


def judge_item(sess: SpecperfSession, item: pytest.Item, handle: SpecperfHandle) -> None:
    """Judge every run of a test that completed; fail it on a regression, and under
    --specperf-strict on a case that was not judged."""
    failures: list[str] = []
    inputs = sess.inputs()
    policy, request = _policy(sess, inputs), handle.request
    reference = sess.reference
    shown = sess.display_path(inputs.baseline_path) if reference is None else reference.shown
    for i, (run, key) in enumerate(zip(handle.runs, request.keys(handle.runs))):
        judged: Judged
        try:
            if reference is not None:
                judged = judge_ab(inputs, request, handle.server, run, reference,
                                  handle.references[i], key, policy, sess.telemetry_note,
                                  len(handle.runs), handle.orders[i])  # fmt: skip
            else:
                judged = judge_one(inputs, request, handle.server, run, key, shown, policy,
                                   sess.telemetry_note, len(handle.runs))  # fmt: skip
        except CaseRefused as e:  # with what the test's earlier cases failed on
            raise pytest.fail("\n\n".join([*failures, str(e)]), pytrace=False) from None
        sess.telemetry_note = judged.telemetry_note
        outcome, lines = _report(sess, item, handle, judged.outcome)
        problems = judged.unjudged
        if problems:
            lines.append(strict_failure(sess.config, outcome, problems))
        try:  # before the case counts anywhere (recorded included): every report reads it
            view = CaseView.of(
                outcome,
                baseline_file=shown,
                failure="\n\n".join(lines),
                unjudged=tuple(p.label for p in problems),
            )
        except ValueError as e:  # names the case (a non-finite step median)
            raise pytest.fail("\n\n".join([*failures, f"specperf: {e}"]), pytrace=False) from None
        if judged.to_record is not None:
            sess.to_record.append(judged.to_record)
            sess.notes += [judged.record_note] if judged.record_note else []
        item.user_properties.extend(junit_properties(outcome, shown, problems))
        sess.outcomes.append(outcome)
        sess.cases.append(view)
        failures += lines
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
