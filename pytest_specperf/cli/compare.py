"""``specperf compare A B``: judge run B against run A with the gate's own rule.

A and B are saved runs: a JSON report (``--specperf-json``), a pytest-benchmark file
(``--benchmark-json``), or a run of pytest-benchmark's storage named by its number or
name (``0003``, ``0003_nightly``; ``--storage``). Each case of B is rebuilt from its saved
steps (``store.rebuild``), run A's case becomes its baseline exactly as
``--specperf-update-baselines`` would have stored it (``judging.judge.as_baseline``), and
``judging.judge.judge_case`` decides, with the gates and tolerances B was judged with
(or those given here). B's budgets (the absolute limits its tests set, saved with each
case's checks) are checked again on the rebuilt run by the same code
(``judging.budgets.check_budgets``): a breach fails the case as it failed its test,
``OVER_BUDGET (SAME)`` in the table and a ``BUDGET`` line per budget judged. A case of B
that A lacks is NO_BASELINE; a different engine fingerprint is INVALID. Prints the summary
table; exits 1 when a case is SLOWER or over a budget, 2 when a run cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_specperf import plain_text
from pytest_specperf.cli.options import add_replaced_options, add_tolerance_option
from pytest_specperf.judging.budgets import Budgets
from pytest_specperf.judging.judge import Case, CaseOutcome, as_baseline, judge_case
from pytest_specperf.judging.noise import PROVISIONAL_PRIOR
from pytest_specperf.judging.verdict import Tolerances
from pytest_specperf.reporting.terminal import case_notes, machine_note, summary_table
from pytest_specperf.reporting.view import CaseView
from pytest_specperf.server.protocol import is_speculative
from pytest_specperf.settings import DEFAULT_TOLERANCES, TOLERANCE_FORM, ToleranceSpec
from pytest_specperf.store.baselines import utc_now
from pytest_specperf.store.rebuild import first_process_only, run_from_case
from pytest_specperf.store.report import (
    CaseRecord,
    Report,
    ReportError,
    prior_of,
    read_report,
    run_family,
    saved_budgets,
    saved_family,
)

#: Where pytest-benchmark keeps saved runs unless ``--benchmark-storage`` says otherwise.
DEFAULT_STORAGE = Path(".benchmarks")


class RunNotFound(ValueError):
    """A run argument that names no file and no single run of the storage."""


def resolve_run(arg: str, storage: Path) -> Path:
    """``arg`` as a file, or the one run of ``storage`` whose file name starts with it."""
    path = Path(arg)
    if path.is_file():
        return path
    found = sorted(storage.glob(f"**/{arg}*.json")) if storage.is_dir() else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise RunNotFound(
            f"{arg!r}: no such file, and no run named so in {storage} (give a JSON report, "
            "a pytest-benchmark file, or a run number such as 0003 with --storage DIR)"
        )
    names = ", ".join(str(f) for f in found[:5])
    raise RunNotFound(f"{arg!r} names {len(found)} runs in {storage} ({names}); be more precise")


def _tolerances(report: Report, case: CaseRecord, given: ToleranceSpec | None) -> Tolerances:
    """The parts ``given``, the others the case's own (marker and options included), else
    the run's."""
    own = Tolerances.from_json(case.data.get("tolerances"))
    if own is None:
        run = ToleranceSpec(phase=report.tolerance or None, step=report.step_tolerance or None)
        own = run.over(DEFAULT_TOLERANCES)
    return (given or ToleranceSpec()).over(own)


def _budgets(report: Report, c: CaseRecord) -> Budgets | None:
    """The budgets ``c``'s test set (``saved_budgets``); ``ReportError`` naming the file
    and the case for an unusable one."""
    try:
        return saved_budgets(c)
    except ValueError as e:
        raise ReportError(report.path, f"{c.test} {c.key}: {e}") from None


def _case(
    report: Report, c: CaseRecord, tolerances: Tolerances, budgets: Budgets | None = None
) -> Case:
    gates = c.data.get("gates")
    return Case(
        nodeid=str(c.data.get("nodeid") or c.test),
        test=c.test,
        key=c.key,
        run=run_from_case(report.path, c),
        fingerprint=c.fingerprint,
        tolerances=tolerances,
        gates=tuple(str(g) for g in gates) if isinstance(gates, list) and gates else None,
        speculative=is_speculative(c.fingerprint),
        family=run_family(c, report.tests),
        prior=prior_of(c.data) or PROVISIONAL_PRIOR,
        budgets=budgets,
    )


def compare_runs(a: Report, b: Report, given: ToleranceSpec | None = None) -> list[CaseOutcome]:
    """Every case of ``b`` judged against the same case of ``a``, and checked against its
    budgets (``ReportError`` when a case cannot be rebuilt)."""
    in_a = {(c.test, c.key): c for c in a.cases}
    outcomes = []
    for c in b.cases:
        case = _case(b, c, _tolerances(b, c, given), _budgets(b, c))
        base_case = in_a.get((c.test, c.key))
        base = None
        if base_case is not None:
            base = as_baseline(_case(a, base_case, case.tolerances), at=utc_now())
        outcomes.append(judge_case(case, base, a.path, missing=f"not in run A ({a.path.name})"))
    return outcomes


def describe_run(label: str, r: Report) -> str:
    """``A: path (2026-05-01 02:00, commit abc1234)``."""
    when = (r.datetime or "date unknown")[:16].replace("T", " ")
    commit = str(r.commit.get("id") or "unknown")[:12]
    return f"{label}: {r.path} ({when}, commit {commit}, {len(r.cases)} case(s))"


def compare_lines(a: Report, b: Report, outcomes: Sequence[CaseOutcome]) -> list[str]:
    """What ``specperf compare`` prints."""
    lines = [describe_run("A", a), describe_run("B (judged against A)", b)]
    cases = [CaseView.of(o, baseline_file=str(a.path)) for o in outcomes]
    lines += summary_table(cases) if cases else ["run B has no cases"]
    machine = machine_note(cases)  # two runs from two machines: the raw times do not compare
    lines += [machine] if machine else []
    lines += case_notes(cases, compared=True)
    lines += budget_lines(outcomes)
    in_b = {(c.test, c.key) for c in b.cases}
    lines += [f"only in A: {c.test} {c.key}" for c in a.cases if (c.test, c.key) not in in_b]
    lines += [line for r in (a, b) for line in _first_process_notes(r)]
    return lines + _fallback_notes(b)


def budget_lines(outcomes: Sequence[CaseOutcome]) -> list[str]:
    """``BUDGET case: over budget: ...`` (or ``within budget``, or ``cannot be checked``):
    every budget of B's cases, as checked here."""
    return [f"BUDGET {o.test} {o.key}: {b.describe()}" for o in outcomes for b in o.budgets]


def _fallback_notes(b: Report) -> list[str]:
    """Notes on what ``b``'s cases are re-judged without, or with otherwise than in their
    run: a case that did not save its share of the false-alarm budget (a lone comparison's
    5%, shared by the report's tests) or the device prior (the provisional one instead), a
    note each; a report that saved one test's share in a run of many (before 2026-12-05),
    one note."""
    out = []
    n = b.tests
    saved = [saved_family(c) for c in b.cases]
    if any(f is not None and f.tests < n for f in saved):
        out.append(f"note: {b.path.name} saved a larger share of the false-alarm budget "
                   f"than its {n} tests give (a report written before 2026-12-05, when a "
                   "run's tests were not counted, or tests that take specperf only through "
                   f"request.getfixturevalue); its cases are judged here at the share of {n} "
                   "tests")  # fmt: skip
    for c, family in zip(b.cases, saved, strict=True):
        missing = []
        if family is None:
            missing.append("the share of the false-alarm budget it was judged at (judged as a "
                           f"lone comparison's 5% one-sided, shared by the report's {n} "
                           "test(s))")  # fmt: skip
        if prior_of(c.data) is None:
            missing.append("the device prior (judged under the provisional one)")
        if missing:
            what = " nor ".join(missing)
            out.append(f"note: {c.test} {c.key} in {b.path.name} did not save {what}; a "
                       "report of an older pytest-specperf")  # fmt: skip
    return out


def _first_process_notes(r: Report) -> list[str]:
    """A note per case of ``r`` that holds its first server process's steps only."""
    return [
        f"note: {c.test} {c.key} in {r.path.name} was measured in {c.processes} server "
        f"processes, but the report (written before pytest-specperf saved every process's "
        "steps) holds the first one's: it is re-judged from that process alone"
        for c in r.cases
        if first_process_only(c)
    ]


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``specperf compare``; 1 when a case of B fails (SLOWER, or over a budget), 2 when a
    run cannot be used."""
    out = out or sys.stdout
    try:
        given: ToleranceSpec | None = args.tolerance  # parsed by --tolerance's type=
        a = read_report(resolve_run(args.a, args.storage))
        b = read_report(resolve_run(args.b, args.storage))
        outcomes = compare_runs(a, b, given)
    except (ReportError, ValueError) as e:
        print(f"specperf compare: {e}", file=sys.stderr)
        return 2
    for line in compare_lines(a, b, outcomes):
        print(line, file=out)
    return 1 if any(o.failed for o in outcomes) else 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "compare",
        help="judge saved run B against saved run A with the gate's verdict rule",
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("a", metavar="A", help="the run judged against (file or storage run)")
    c.add_argument("b", metavar="B", help="the run judged (file or storage run)")
    c.add_argument(
        "--storage",
        type=Path,
        default=DEFAULT_STORAGE,
        help="pytest-benchmark storage to find runs named by number (default .benchmarks)",
    )
    add_tolerance_option(c.add_argument, "", "tolerances to judge at; a part not given is B's")
    add_replaced_options(
        c.add_argument,
        {"--step-tolerance": (f"was replaced by --tolerance {TOLERANCE_FORM}", True)},
    )
