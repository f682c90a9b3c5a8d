"""Trend pictures of a history: one PNG (and optionally SVG) per case, one HTML page.

Per case: the step and each phase over the runs (ms, logarithmic axis, so that a 0.02 ms
phase and a 40 ms step are both readable), the accept length below; a grey dashed line
where the baseline was updated, a red marker and label where a change point was found
(``reporting.changepoints``), a ring on a figure that is its first server process's, not
the center over the case's processes (``Point.first_process``). matplotlib is imported
here only (the ``history`` extra), with its Agg backend: no display is needed. The HTML
page embeds every picture, so it is one file to keep as a CI artifact.
"""

from __future__ import annotations

import base64
import html
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.reporting.changepoints import ChangePoint
from pytest_specperf.reporting.history import (
    HISTORY_HEADERS,
    History,
    MissingExtra,
    Series,
    first_process_note,
    history_rows,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D


#: Factor of the largest time that the axis reaches: a decade above, for the legend.
_HEADROOM = 12.0
#: Figure margins (fractions), fixed for the figure size below.
_MARGINS = {"left": 0.08, "right": 0.98, "top": 0.94, "bottom": 0.07, "hspace": 0.06}


def _figure_class() -> type[Figure]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MissingExtra("matplotlib", "trend pictures (or --no-plots)", e) from None
    return Figure


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_stem(s: Series) -> str:
    """A file name for a case: ``test_decode-ctx=32768-kv=contiguous-bs=1``."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", s.name).strip("-")[:150]


def _date_ticks(ax: Axes, h: History, s: Series) -> None:
    n = len(s.points)
    step = max(1, n // 8)
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks)
    ax.set_xticklabels([h.runs[s.points[i].run].date[:10] for i in ticks], fontsize=7)


def _draw_times(ax: Axes, s: Series, changes: Sequence[ChangePoint]) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    xs = range(len(s.points))
    top = 0.0
    for metric in (STEP, *ALL_PHASES):
        ys = [y if y > 0 else float("nan") for y in s.values(metric)]
        if any(y > 0 for y in ys):
            [line] = ax.plot(xs, ys, lw=2.0 if metric == STEP else 1.0, label=metric)
            _ring_first_process(ax, s, metric, ys, line)
            top = max(top, *(y for y in ys if y > 0))
    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())  # labelled minor ticks cost more than the lines
    # "0.01 ms", not mathtext's 10^-2: plainer, and mathtext's parser is slow
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    if top > 0:
        ax.set_ylim(top=top * _HEADROOM)  # room for the legend above the lines
    ax.set_ylabel("ms (median of the run)")
    _mark_changes(ax, s, [c for c in changes if c.metric != ACCEPT_LEN])
    ax.legend(fontsize=7, ncol=5, loc="upper left")


def _ring_first_process(ax: Axes, s: Series, metric: str, ys: Sequence[float],
                        line: Line2D) -> None:  # fmt: skip
    """A ring on each point whose ``metric`` is its first server process's figure."""
    at = [i for i, first in enumerate(s.first_process(metric)) if first]
    if at:
        ax.plot(at, [ys[i] for i in at], "o", mfc="none", color=line.get_color(), markersize=6)


def _mark_changes(ax: Axes, s: Series, changes: Sequence[ChangePoint]) -> None:
    """A red marker on each moved line, one label per run that moved ("step +7.6%, ...")."""
    at: dict[int, list[ChangePoint]] = {}
    for cp in changes:
        at.setdefault(cp.index, []).append(cp)
    for k, (index, cps) in enumerate(sorted(at.items())):
        ys = [s.values(cp.metric)[index] for cp in cps]
        ax.plot([index] * len(ys), ys, "v", color="red", markersize=8)
        text = ", ".join(cp.describe().split(" (")[0] for cp in cps)
        right = index > 0.6 * len(s.points)  # near the right edge: the label goes left
        ax.annotate(text, (index, max(ys)), fontsize=7, color="red",
                    xytext=(-4 if right else 4, 6 + 11 * (k % 2)),  # neighbours staggered
                    textcoords="offset points", ha="right" if right else "left")  # fmt: skip


def _draw_accept(ax: Axes, s: Series, changes: Sequence[ChangePoint]) -> None:
    ys = s.values(ACCEPT_LEN)
    [line] = ax.plot(range(len(s.points)), ys, lw=1, color="tab:green")
    _ring_first_process(ax, s, ACCEPT_LEN, ys, line)
    ax.set_ylabel("accept len", fontsize=8)
    for cp in changes:
        if cp.metric == ACCEPT_LEN:
            ax.plot([cp.index], [cp.after], marker="v", color="red", markersize=8)


def _mark_baselines(axes: Sequence[Axes], s: Series) -> None:
    for i, p in enumerate(s.points):
        if p.baseline_update:
            for ax in axes:
                ax.axvline(i, color="grey", ls="--", lw=0.8)


def draw_case(h: History, s: Series, changes: Sequence[ChangePoint]) -> Figure:
    """The trend figure of one case."""
    figure = _figure_class()
    fig = figure(figsize=(9, 5), dpi=80)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    _draw_times(top, s, changes)
    _draw_accept(bottom, s, changes)
    _mark_baselines((top, bottom), s)
    _date_ticks(bottom, h, s)
    rings = "; ring: first process only" if first_process_note(h, s) else ""
    top.set_title(f"{s.name}  ({s.engine}; dashed: baseline updated, red: change point{rings})",
                  fontsize=9)  # fmt: skip
    fig.subplots_adjust(**_MARGINS)  # fixed: tight_layout would double the drawing time
    return fig


@dataclass(frozen=True)
class Picture:
    """One case's written picture(s)."""

    series: Series
    png: Path
    svg: Path | None
    png_bytes: bytes


def write_case(h: History, s: Series, changes: Sequence[ChangePoint], out: Path,
               svg: bool = False) -> Picture:  # fmt: skip
    """Draw ``s`` and write ``<out>/<case>.png`` (and ``.svg``)."""
    import io

    fig = draw_case(h, s, changes)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    stem = out / file_stem(s)
    png = stem.with_suffix(".png")
    atomic_write(png, buf.getvalue())
    svg_path = None
    if svg:
        sbuf = io.BytesIO()
        fig.savefig(sbuf, format="svg")
        svg_path = stem.with_suffix(".svg")
        atomic_write(svg_path, sbuf.getvalue())
    return Picture(s, png, svg_path, buf.getvalue())


def _html_table(h: History, s: Series, last: int) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in HISTORY_HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in history_rows(h, s, last)
    )
    note = first_process_note(h, s)
    return f"<table><tr>{head}</tr>{body}</table>" + (f"<p>{html.escape(note)}</p>" if note else "")


def _html_case(h: History, pic: Picture, changes: Sequence[ChangePoint], last: int) -> str:
    s = pic.series
    img = base64.b64encode(pic.png_bytes).decode("ascii")
    items = "".join(
        f"<li>{html.escape(h.runs[s.points[cp.index].run].date)}: {html.escape(cp.describe())}"
        "</li>"
        for cp in changes
    )
    return (
        f"<h2>{html.escape(s.name)}</h2><p>{html.escape(s.engine)}, {len(s.points)} runs</p>"
        f'<img alt="trend of {html.escape(s.name)}" src="data:image/png;base64,{img}">'
        f"<p>change points:</p><ul>{items or '<li>none</li>'}</ul>"
        + _html_table(h, s, last)
    )


_STYLE = (
    "body{font-family:sans-serif;margin:1em 2em}table{border-collapse:collapse;font-size:12px}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
)


def write_html(path: Path, h: History, pictures: Sequence[Picture],
               changes: Mapping[tuple[str, str, str], Sequence[ChangePoint]],
               last: int) -> None:  # fmt: skip
    """One page with every case's picture, change points and last runs."""
    skipped = "".join(f"<li>{html.escape(x)}</li>" for x in h.skipped)
    parts: list[Any] = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>specperf history</title>"
        f"<style>{_STYLE}</style></head><body><h1>specperf history: {len(h.runs)} runs, "
        f"{len(h.series)} cases</h1><p>store: {html.escape(str(h.store))}</p>",
        f"<details><summary>{len(h.skipped)} file(s) skipped</summary><ul>{skipped}</ul>"
        "</details>" if h.skipped else "",
        *(_html_case(h, p, changes.get(p.series.ident, ()), last) for p in pictures),
        "</body></html>",
    ]
    atomic_write(path, "".join(parts).encode("utf-8"))
