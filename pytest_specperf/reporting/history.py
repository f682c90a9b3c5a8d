"""The history of saved runs: per case, its figures run after run.

A store is a folder of saved runs: pytest-benchmark's storage (``.benchmarks/<machine>/
NNNN_<name>.json``, written by ``--benchmark-autosave`` or ``--benchmark-save``) or a
folder of JSON reports (``--specperf-json``), read through the one reader
``store.report.read_report``. A file that cannot be used (corrupt, truncated,
another tool's, an unknown schema version) is named with the reason and skipped; the rest
is read. Runs are ordered by date; each case (test, case key, engine) becomes a
``Series`` of ``Point`` s, one per run that measured it.

Every figure of a point is the case's center over its server processes, as the run's
summary showed it (``CaseRecord.center``: a report written before the centers were saved
gets them from each process's saved value). A case of several processes whose report
holds its first process's figure alone keeps that figure, named in
``Point.first_process``: the table marks its row and says why under it, the picture rings
it, and change points are searched only within figures of one kind.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_specperf.install import install_hint
from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP
from pytest_specperf.probe.phases import ALL_PHASES, UNACCOUNTED
from pytest_specperf.reporting.benchmark import engine_name
from pytest_specperf.reporting.table import render_table
from pytest_specperf.store.report import (
    CaseRecord,
    ForeignFile,
    Report,
    ReportError,
    read_report,
)


class MissingExtra(RuntimeError):
    """A package of the ``history`` extra is not installed; the message says which."""

    def __init__(self, package: str, what: str, error: ImportError) -> None:
        super().__init__(
            f"{what} needs {package} ({error}): {install_hint('history')}"
        )


@dataclass(frozen=True)
class RunInfo:
    """One saved run: where it is, when it ran, what it measured."""

    path: Path
    datetime: str | None
    commit: str
    dirty: bool
    source: str

    @property
    def date(self) -> str:
        """``2026-05-01 02:00`` (UTC, as saved), or ``?``."""
        return (self.datetime or "?")[:16].replace("T", " ")

    @property
    def short_commit(self) -> str:
        return self.commit[:8] + ("+" if self.dirty else "")


@dataclass(frozen=True)
class Point:
    """One case in one run."""

    run: int  # index into ``History.runs``
    step_ms: float
    phase_ms: Mapping[str, float]
    accept_len: float | None
    verdict: str
    #: this run recorded the baseline, or was judged against a newer one than before
    baseline_update: bool
    baseline_at: str | None
    recorded: bool = False
    #: the canary the run carried (``verify=1.1``): labelled in the table
    injected: str | None = None
    #: the figures (``step``, phases, ``accept_len``) that are the first server process's,
    #: not the center over the case's processes (a report that saved no center of them)
    first_process: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Series:
    """One case's points, oldest first."""

    test: str
    key: str
    engine: str
    points: tuple[Point, ...]

    @property
    def ident(self) -> tuple[str, str, str]:
        """What makes a case: test id, case key, engine."""
        return (self.test, self.key, self.engine)

    @property
    def name(self) -> str:
        """``test_decode ctx=32768 kv=contiguous bs=1`` (as the summary table names it)."""
        return f"{self.test.rsplit('::', 1)[-1]} {self.key}"

    def values(self, metric: str) -> list[float]:
        """The metric over the runs: ``step``, a phase (ms), or ``accept_len``."""
        if metric == STEP:
            return [p.step_ms for p in self.points]
        if metric in ALL_PHASES:
            return [p.phase_ms.get(metric, float("nan")) for p in self.points]
        return [p.accept_len if p.accept_len is not None else float("nan") for p in self.points]

    def first_process(self, metric: str) -> list[bool]:
        """Per point, whether its ``metric`` is a first-process figure (``values``' kinds)."""
        return [metric in p.first_process for p in self.points]


@dataclass(frozen=True)
class History:
    """The readable runs of a store (oldest first), its cases, and what was skipped."""

    store: Path
    runs: tuple[RunInfo, ...]
    series: tuple[Series, ...]
    #: ``path: reason`` of every file that was not read
    skipped: tuple[str, ...]
    #: files that hold no specperf run (another tool's JSON, user benchmarks only)
    foreign: int = 0


def store_files(store: Path) -> list[Path]:
    """The JSON files of a store (a folder, searched recursively, or one file)."""
    if store.is_file():
        return [store]
    return sorted(p for p in store.rglob("*.json") if p.is_file())


@dataclass(frozen=True)
class CaseFigures:
    """One case of a saved run as the history keeps it (the rest of the file is let go)."""

    ident: tuple[str, str, str]  # test id, case key, engine
    step_ms: float
    phase_ms: Mapping[str, float]
    accept_len: float | None
    verdict: str
    recorded: bool
    baseline_at: str | None
    injected: str | None = None
    first_process: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SavedRun:
    info: RunInfo
    cases: tuple[CaseFigures, ...]


def _figures(c: CaseRecord) -> CaseFigures:
    phases = {p: v for p in ALL_PHASES if (v := c.phase_ms(p)) is not None}
    accept = c.accept_len
    shown = (STEP, *phases, *([ACCEPT_LEN] if accept is not None else []))
    return CaseFigures(
        ident=(c.test, c.key, engine_name(c.fingerprint)),
        step_ms=c.step_ms,  # the center over the case's processes, as the summary shows
        phase_ms=phases,
        accept_len=accept,
        verdict=c.verdict_text(recorded=True),  # as its summary: NO_BASELINE (recorded)
        recorded=c.recorded,
        baseline_at=c.baseline_at,
        injected=c.injected,
        first_process=frozenset(m for m in shown if c.first_process_only(m)),
    )


def saved_run(r: Report) -> SavedRun:
    """What the history keeps of a run read by ``read_report``."""
    commit = r.commit.get("id")
    info = RunInfo(
        path=r.path,
        datetime=r.datetime,
        commit=str(commit) if commit else "unknown",
        dirty=r.commit.get("dirty") is True,
        source=r.source,
    )
    return SavedRun(info, tuple(_figures(c) for c in r.cases))


def _read_all(paths: Iterable[Path]) -> tuple[list[SavedRun], list[str], int]:
    """Every usable run (each file let go once its figures are taken), the skipped files
    with their reasons, and how many were foreign."""
    runs, skipped, foreign = [], [], 0
    for path in paths:
        try:
            runs.append(saved_run(read_report(path)))
        except ForeignFile as e:
            foreign += 1
            skipped.append(str(e))
        except ReportError as e:
            skipped.append(str(e))
    return runs, skipped, foreign


def _point(run: int, c: CaseFigures, previous: Point | None) -> Point:
    at = c.baseline_at
    # a baseline recorded elsewhere (a committed YAML); the run after a recording run is
    # judged against what that run recorded, which is no news
    moved = (
        previous is not None
        and at is not None
        and at != previous.baseline_at
        and not previous.recorded
    )
    return Point(
        run=run,
        step_ms=c.step_ms,
        phase_ms=c.phase_ms,
        accept_len=c.accept_len,
        verdict=c.verdict,
        baseline_update=c.recorded or moved,
        baseline_at=at,
        recorded=c.recorded,
        injected=c.injected,
        first_process=c.first_process,
    )


def build_history(store: Path, runs: Sequence[SavedRun], skipped: Sequence[str],
                  foreign: int = 0) -> History:  # fmt: skip
    """Order ``runs`` by date and gather each case's points."""
    ordered = sorted(runs, key=lambda r: (r.info.datetime or "", r.info.path.name))
    points: dict[tuple[str, str, str], list[Point]] = {}
    for i, r in enumerate(ordered):
        for c in r.cases:
            pts = points.setdefault(c.ident, [])
            pts.append(_point(i, c, pts[-1] if pts else None))
    series = tuple(Series(t, k, e, tuple(p)) for (t, k, e), p in points.items())
    return History(
        store=store,
        runs=tuple(r.info for r in ordered),
        series=tuple(sorted(series, key=lambda s: (s.test, s.key, s.engine))),
        skipped=tuple(skipped),
        foreign=foreign,
    )


def _when(run: RunInfo) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(run.datetime) if run.datetime else None
    except ValueError:
        return None


def recent_points(h: History, s: Series, hours: float) -> int:
    """How many of ``s``'s last points come from runs within ``hours`` of the store's
    newest run (last night's runs; a case not measured then has none). Without dates:
    whether its last point is the newest run's."""
    newest = _when(h.runs[-1]) if h.runs else None
    if newest is None:
        return int(bool(s.points) and s.points[-1].run == len(h.runs) - 1)
    since = newest - dt.timedelta(hours=hours)
    count = 0
    for p in reversed(s.points):
        when = _when(h.runs[p.run])
        if when is None or when.tzinfo != newest.tzinfo or when < since:
            break
        count += 1
    return count


def load_history(store: Path) -> History:
    """Read every saved run of ``store``; unusable files are named in ``skipped``."""
    reports, skipped, foreign = _read_all(store_files(store))
    return build_history(store, reports, skipped, foreign)


#: The phases the history table shows, besides the step (the issue's columns).
TABLE_PHASES = ("verify", "draft", UNACCOUNTED)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _cell(p: Point, metric: str, x: float | None) -> str:
    return _ms(x) + ("*" if x is not None and metric in p.first_process else "")


def history_rows(h: History, s: Series, last: int) -> list[list[str]]:
    """The last ``last`` runs of ``s``: date, commit, step, phases, accept, verdict; a
    first-process figure (``Point.first_process``) marked ``*`` (``first_process_note``)."""
    rows = []
    for p in s.points[-last:]:
        run = h.runs[p.run]
        # a run judged against newer baselines than the night before (a recording says so
        # in its verdict, as its summary did)
        moved = p.baseline_update and not p.recorded
        verdict = p.verdict + (" (baseline updated)" if moved else "")
        verdict += f" [injected: {p.injected}]" if p.injected else ""
        rows.append([
            run.date,
            run.short_commit,
            _cell(p, STEP, p.step_ms),
            *(_cell(p, ph, p.phase_ms.get(ph)) for ph in TABLE_PHASES),
            _cell(p, ACCEPT_LEN, p.accept_len),
            verdict,
        ])  # fmt: skip
    return rows


#: Nights a note names before it counts the rest.
_NOTE_NIGHTS = 5


def first_process_note(h: History, s: Series) -> str | None:
    """What a ``*`` means, and on which nights of ``s`` it stands; None when every figure
    is a center over the case's server processes."""
    nights = [h.runs[p.run].date for p in s.points if p.first_process]
    if not nights:
        return None
    named = ", ".join(nights[:_NOTE_NIGHTS])
    more = f" and {len(nights) - _NOTE_NIGHTS} more" if len(nights) > _NOTE_NIGHTS else ""
    return (
        "* the first server process's figure, not the center over the case's processes: "
        f"the report(s) of {named}{more} saved no center of it nor every process's value "
        "(change points are searched within figures of one kind)"
    )


HISTORY_HEADERS = ("date (UTC)", "commit", "step ms", *(f"{p} ms" for p in TABLE_PHASES),
                   "accept", "verdict")  # fmt: skip


def history_table(h: History, s: Series, last: int) -> list[str]:
    """``s``'s last runs as a table (``reporting.table``), ``first_process_note`` below."""
    note = first_process_note(h, s)
    table = render_table(HISTORY_HEADERS, history_rows(h, s, last), right={2, 3, 4, 5, 6})
    return [*table, *([note] if note else [])]
