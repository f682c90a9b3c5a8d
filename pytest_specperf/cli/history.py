"""``specperf history [STORAGE]``: every case's figures over the saved runs, and where they moved.

STORAGE is pytest-benchmark's storage (default ``.benchmarks``, filled by
``pytest perf_tests --benchmark-autosave``), a folder of JSON reports
(``--specperf-json``), or one file. For each case it prints the last runs (date, commit,
step, verify, draft, unaccounted, accept length, verdict) and the change points found by
ruptures (``reporting.changepoints``); it draws one trend picture per case and one HTML
page with all of them (``--out``). ``--markdown PATH`` appends a summary naming the change
points that last night's runs brought to light (for ``$GITHUB_STEP_SUMMARY``). Files that
cannot be used are named and skipped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from pytest_specperf import plain_text
from pytest_specperf.judging.verdict import parse_fraction
from pytest_specperf.reporting.changepoints import (
    MIN_CHANGE,
    ChangePoint,
    Detection,
    change_points,
    new_change_points,
)
from pytest_specperf.reporting.history import (
    History,
    MissingExtra,
    Series,
    history_table,
    load_history,
    recent_points,
)
from pytest_specperf.reporting.table import render_table

DEFAULT_STORAGE = Path(".benchmarks")
DEFAULT_OUT = Path("specperf-history")
#: Runs within this many hours of the newest are "last night's" (a nightly job's runs).
NEW_HOURS = 20.0
Changes = Mapping[tuple[str, str, str], Sequence[ChangePoint]]


def _at(h: History, s: Series, cp: ChangePoint) -> str:
    run = h.runs[s.points[cp.index].run]
    return f"{run.date} ({run.short_commit})"


def case_lines(h: History, series: Sequence[Series], changes: Changes, last: int) -> list[str]:
    """Per case: a title, its last runs, its change points."""
    lines = []
    for s in series:
        lines += ["", f"{s.name}  [{s.engine}]  {len(s.points)} run(s)"]
        lines += history_table(h, s, last)
        for cp in changes.get(s.ident, ()):
            lines.append(f"change point: {cp.describe()} from {_at(h, s, cp)}")
    return lines


def new_table(h: History, series: Sequence[Series], new: Changes) -> list[list[str]]:
    """Rows of the change points the last run(s) brought to light."""
    return [
        [s.name, s.engine, cp.describe(), _at(h, s, cp)]
        for s in series
        for cp in new.get(s.ident, ())
    ]


def _what(hours: float) -> str:
    return f"the runs of the last {hours:g} h"


def markdown(h: History, series: Sequence[Series], new: Changes, hours: float) -> str:
    """The step summary: the store, the last run, the new change points (or none)."""
    rows = new_table(h, series, new)
    last = h.runs[-1] if h.runs else None
    out = [f"### specperf history: {len(h.runs)} run(s), {len(series)} case(s) in `{h.store}`", ""]
    if last is not None:
        out += [f"Last run: {last.date} UTC, commit `{last.short_commit}` ({last.path.name})", ""]
    what = _what(hours)
    if rows:
        out += [f"**Change points that {what} brought to light** (ruptures):", "",
                "| case | engine | change | from run |", "|---|---|---|---|"]  # fmt: skip
        out += [f"| {' | '.join(r)} |" for r in rows]
    else:
        out.append(f"No new change point in {what}.")
    if h.skipped:
        out += ["", f"{len(h.skipped)} file(s) skipped:", *(f"- {x}" for x in h.skipped[:20])]
    return "\n".join(out) + "\n"


def _plots(args: argparse.Namespace, h: History, series: Sequence[Series], changes: Changes,
           out: TextIO) -> int:  # fmt: skip
    """Write the pictures and the page."""
    from pytest_specperf.reporting.trend import write_case, write_html

    pics = [write_case(h, s, changes.get(s.ident, ()), args.out, args.svg) for s in series]
    page = args.out / "index.html"
    write_html(page, h, pics, changes, args.last)
    kinds = "PNG and SVG" if args.svg else "PNG"
    print(f"trend pictures: {len(pics)} {kinds} in {args.out}; page: {page}", file=out)
    return 0


def _report(args: argparse.Namespace, h: History, out: TextIO) -> int:
    d = Detection(min_change=args.min_change)
    series = [s for s in h.series if args.case is None or args.case in s.name]
    changes = {s.ident: change_points(s, d) for s in series}
    new = {
        s.ident: new_change_points(s, recent_points(h, s, args.new_hours), d) for s in series
    }
    for line in case_lines(h, series, changes, args.last):
        print(line, file=out)
    rows = new_table(h, series, new)
    what = _what(args.new_hours)
    print("", file=out)
    if rows:
        print(f"change points that {what} brought to light:", file=out)
        for line in render_table(("case", "engine", "change", "from run"), rows):
            print(line, file=out)
    else:
        print(f"no new change point in {what}", file=out)
    if args.markdown is not None:
        with open(args.markdown, "a", encoding="utf-8") as fh:
            fh.write(markdown(h, series, new, args.new_hours))
    return 0 if args.no_plots or not series else _plots(args, h, series, changes, out)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``specperf history``; 2 when the store does not exist or a package of the
    ``history`` extra is missing."""
    out = out or sys.stdout
    if not args.storage.exists():
        print(f"specperf history: {args.storage}: no such store (run pytest with "
              "--benchmark-autosave, or give a folder of --specperf-json reports)",
              file=sys.stderr)  # fmt: skip
        return 2
    h = load_history(args.storage)
    for line in h.skipped:
        print(f"skipped {line}", file=out)
    print(f"specperf history: {len(h.runs)} run(s), {len(h.series)} case(s) in {h.store}",
          file=out)  # fmt: skip
    try:
        return _report(args, h, out)
    except MissingExtra as e:
        print(f"specperf history: {e}", file=sys.stderr)
        return 2


def _fraction(text: str) -> float:
    try:
        return parse_fraction(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid fraction {text!r}; e.g. 0.03 or 3%") from None


def _hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid hours {text!r}; expected a number > 0")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}; expected an integer >= 1")
    return int(text)


def add_parser(sub: Any) -> None:
    c = sub.add_parser("history", help="trends and change points of the saved runs",
                       description=plain_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    c.add_argument("storage", metavar="STORAGE", nargs="?", type=Path, default=DEFAULT_STORAGE,
                   help="pytest-benchmark storage, folder of reports or one file "
                   "(default .benchmarks)")  # fmt: skip
    c.add_argument("--last", type=_positive, default=10, metavar="N",
                   help="runs per case in the table (default 10)")
    c.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="folder for the pictures and index.html (default specperf-history)")
    c.add_argument("--no-plots", action="store_true", help="print only")
    c.add_argument("--svg", action="store_true", help="an SVG beside each PNG")
    c.add_argument("--markdown", type=Path, metavar="PATH",
                   help="append a summary of the new change points (e.g. $GITHUB_STEP_SUMMARY)")
    c.add_argument("--new-hours", type=_hours, default=NEW_HOURS, metavar="H",
                   help="name the change points that the runs of the last H hours before "
                   f"the newest run brought to light (default {NEW_HOURS:g}: last night's)")
    c.add_argument("--min-change", type=_fraction, default=MIN_CHANGE, metavar="F",
                   help=f"smallest change point reported (default {MIN_CHANGE * 100:g}%%)")
    c.add_argument("-k", "--case", metavar="TEXT", help="only cases whose name contains TEXT")
