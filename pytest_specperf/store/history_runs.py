"""Earlier runs of each case, from a folder of our JSON reports (``--specperf-history``).

A nightly job that writes ``--specperf-json nightly/<date>.json`` every night has, after a
few nights, several runs of every case, each from its own server process: the between-
process part of the noise can come from them instead of from extra processes now (a big
SGLang model is slow to start). This module is the interface: it reads the reports
through the one reader (``read_report``) and hands each case's runs of the last
``HISTORY_REPORTS`` reports of each mode that hold any (by their ``datetime``, else the
file's time) to the judge as ``HistoryRun`` records, each report's runs of one sitting (its server
processes: their spread is process noise) and marked when they were an A/B run's tested
side (``HistoryRun.ab``: an A/B run reads only those, a stored-baseline run only the
others). They inform the between-process estimate only: the verdict's change is always
against the baseline (or A/B's reference side).

A run is left out when it cannot be noise of the same engine: an injected canary run, a
case judged SLOWER (a regression is not noise) or INVALID (a throttled GPU, another
engine), a report from before this format carried runs, or a run that fails the baseline
store's own validation. The judge keeps only runs of the baseline's engine fingerprint
and of its steps a round (``round_steps``: block ``j`` is the request of seed ``j``, so a
run of other steps measured other blocks).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_specperf.judging.baselines import fingerprint_hash, make_run
from pytest_specperf.judging.judge import HistoryRun
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import Verdict
from pytest_specperf.store.baseline_schema import Invalid, check_run, number
from pytest_specperf.store.report import CaseRecord, Report, ReportError, read_report

#: Reports read, the newest: about two weeks of nightly runs.
HISTORY_REPORTS = 14
#: Verdicts whose runs are not noise of the baseline's engine.
_LEFT_OUT = (Verdict.SLOWER, Verdict.INVALID)

CaseId = tuple[str, str]
#: The store's field names as a report's run spells them.
_FIELDS = {"value": "values", "blocks": "blocks"}


@dataclass(frozen=True)
class History:
    """Runs by case (test id, case key), oldest first, and what was skipped and why."""

    runs: Mapping[CaseId, tuple[HistoryRun, ...]]
    reports: int
    skipped: tuple[str, ...]
    #: of ``reports``, those read for A/B runs and those read for stored-baseline runs (a
    #: report that holds both modes counts in each)
    ab_reports: int = 0
    stored_reports: int = 0

    def of(self, test: str, key: str) -> tuple[HistoryRun, ...]:
        return self.runs.get((test, key), ())

    def describe(self, where: str) -> str:
        n = sum(len(v) for v in self.runs.values())
        text = f"history: {n} run(s) of {len(self.runs)} case(s) from {self.reports} report(s)"
        if self.ab_reports:
            text += (
                f" ({self.ab_reports} with A/B runs, {self.stored_reports} with "
                "stored-baseline runs)"
            )
        text += f" in {where}, for the noise between processes"
        return text + (f"; skipped: {'; '.join(self.skipped)[:300]}" if self.skipped else "")


def _when(report: Report) -> datetime.datetime:
    created = report.data.get("datetime")
    if isinstance(created, str):
        try:
            when = datetime.datetime.fromisoformat(created)
            return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            pass
    mtime = report.path.stat().st_mtime
    return datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc)


def _by_time(directory: Path, skipped: list[str]) -> list[Report]:
    reports = []
    for path in sorted(directory.glob("*.json")):
        try:
            reports.append(read_report(path))
        except (ReportError, OSError) as e:
            skipped.append(str(e)[:200])
    reports.sort(key=_when)
    return reports


def _runs_of(case: CaseRecord, where: str, sitting: str) -> list[HistoryRun]:
    """The runs of one report case, of the report's ``sitting`` (its server processes
    share it: their spread is process noise, not sitting noise); ``Invalid`` naming the
    field if one is unusable."""
    data = case.data
    labels = data.get("labels")
    if isinstance(labels, Mapping) and labels.get("inject"):
        return []
    fp = data.get("fingerprint")
    raw_runs = data.get("runs")
    if not isinstance(fp, Mapping) or not isinstance(raw_runs, list):
        raise Invalid("no fingerprint or runs (a report older than --specperf-history)")
    h, ab = fingerprint_hash(fp), isinstance(data.get("ab"), Mapping)
    out = []
    for i, r in enumerate(raw_runs):
        metrics = _summaries(r, f"runs[{i}]")  # checks that the run is an object first
        steps = _round_steps(r, f"runs[{i}]")
        out.append(HistoryRun(h, where, metrics, sitting=sitting, ab=ab, round_steps=steps))
    return out


def _whole(raw: Mapping[str, Any], key: str, where: str) -> int | None:
    """``raw[key]`` as a whole number of at least 1; None when absent; ``Invalid`` naming
    the field otherwise."""
    v = raw.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise Invalid(f"{where}.{key}: expected a whole number of at least 1, got {v!r}")
    return v


def _steps(raw: Mapping[str, Any]) -> int | None:
    """The run's measured steps, where a usable count (read leniently, as ever)."""
    steps = raw.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None


def _round_steps(raw: Mapping[str, Any], where: str) -> int | None:
    """The steps of one round of a report's run: written since 2026-12-07; before, a run of
    one round's steps, and None (unknown) for one of several rounds."""
    given = _whole(raw, "round_steps", where)
    if given is not None:
        return given
    return _steps(raw) if (_whole(raw, "rounds", where) or 1) == 1 else None


def _summaries(raw: Any, where: str) -> Mapping[str, Summary]:
    if not isinstance(raw, Mapping):
        raise Invalid(f"{where}: expected an object")
    values, blocks = raw.get("values"), raw.get("blocks") or {}
    if not isinstance(values, Mapping) or not isinstance(blocks, Mapping):
        raise Invalid(f"{where}: values and blocks must be objects")
    rounds = _whole(raw, "rounds", where) or 1  # a report from before runs carried rounds: 1
    run = make_run(
        "history",
        None,
        {str(m): number(v, f"{where}.values.{m}") for m, v in values.items()},
        {str(m): [number(x, f"{where}.blocks.{m}") for x in _list(b)] for m, b in blocks.items()},
        rounds=rounds,
    )
    check_run(run, lambda kind, m: f"{where}.{_FIELDS[kind]}" + (f".{m}" if m else ""))
    return MappingProxyType(run.summaries(_steps(raw) or 1))


def _list(x: Any) -> Sequence[Any]:
    if not isinstance(x, list):
        raise Invalid(f"expected a list of block centers, got {type(x).__name__}")
    return x


def load_history(directory: Path, *, limit: int = HISTORY_REPORTS) -> History:
    """The runs of every case in the newest ``limit`` reports of ``directory`` that hold
    any, counted per mode: ``limit`` A/B reports and ``limit`` stored-baseline reports (a
    folder that holds both still gives each mode its own two weeks; each mode reads only
    its own). A canary's report, every case injected, does not count: it would push a night
    out. Unusable reports and cases within their mode's newest are skipped and named in
    ``History.skipped``, never an error."""
    skipped: list[str] = []
    kept: list[list[tuple[CaseId, list[HistoryRun]]]] = []
    per_mode = {True: 0, False: 0}  # reports kept, by HistoryRun.ab
    for report in reversed(_by_time(directory, skipped)):  # the newest first
        if min(per_mode.values()) >= limit:
            break
        open_modes = {m for m, n in per_mode.items() if n < limit}
        found_here = _report_runs(report, skipped, open_modes)
        if not found_here:  # beyond its mode's newest (not read, not named), or unusable
            continue
        for m in {r.ab for _, f in found_here for r in f}:
            per_mode[m] += 1
        kept.append(found_here)
    runs: dict[CaseId, list[HistoryRun]] = {}
    for found_here in reversed(kept):  # oldest first
        for case_id, found in found_here:
            runs.setdefault(case_id, []).extend(found)
    frozen = {k: tuple(v) for k, v in runs.items()}
    return History(MappingProxyType(frozen), len(kept), tuple(skipped), per_mode[True],
                   per_mode[False])  # fmt: skip


def _report_runs(report: Report, skipped: list[str],
                 modes: set[bool]) -> list[tuple[CaseId, list[HistoryRun]]]:  # fmt: skip
    """The usable runs of each case of one report of a mode in ``modes`` (``HistoryRun.ab``:
    the modes that still take reports); what is left out of those, named in ``skipped``
    (a case of a full mode is neither read nor named)."""
    found_here = []
    for case in report.cases:
        if isinstance(case.data.get("ab"), Mapping) not in modes:
            continue
        where = f"{report.path.name} [{case.key}]"
        if case.verdict in _LEFT_OUT:
            skipped.append(f"{where}: judged {case.verdict.value}, not noise")
            continue
        try:
            found = _runs_of(case, where, f"report {report.path.name}")
        except Invalid as e:
            skipped.append(f"{where}: {e}")
            continue
        if found:
            found_here.append(((case.test, case.key), found))
    return found_here
