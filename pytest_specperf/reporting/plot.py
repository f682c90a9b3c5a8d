"""An SVG picture of where each case's step time goes, baseline against now.

Written beside the JSON report (``report.json`` -> ``report.svg``): one pair of stacked
bars per case (phases in a fixed colour order, ``unaccounted`` grey), the baseline's bar
above the current one, so a phase that grew stands out at a glance. Each bar is the
phases' centers over the server processes (the phase table's numbers); its label is the
step's own center, the summary's "step ms", which the phases' centers need not add up
to exactly. Plain SVG, no plotting library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.reporting.view import CaseView

#: One colour per phase, in the order of ``ALL_PHASES`` (unaccounted last, grey).
COLOURS = dict(
    zip(
        ALL_PHASES,
        (
            "#ffffb3",
            "#8dd3c7",
            "#d9d9d9",
            "#80b1d3",
            "#bebada",
            "#fdb462",
            "#fb8072",
            "#b3de69",
            "#fccde5",
            "#bc80bd",
            "#ccebc5",
            "#9e9e9e",
        ),
        strict=True,
    )
)
LABEL_W, BAR_W, ROW_H, BAR_H, TOP = 330, 560, 58, 18, 46


def _bar(x0: float, y: float, values: Mapping[str, float], scale: float) -> list[str]:
    out, x = [], x0
    for p in ALL_PHASES:
        w = values.get(p, 0.0) * scale
        if w <= 0:
            continue
        title = f"{p}: {values[p]:.3f} ms"
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BAR_H}" '
            f'fill="{COLOURS[p]}"><title>{escape(title)}</title></rect>'
        )
        x += w
    return out


def render(cases: Sequence[CaseView], title: str) -> str:
    rows = []
    peak = 0.0
    for c in cases:
        now, base = c.phases, c.base_phases
        peak = max(peak, sum(now.values()), sum(base.values()) if base else 0.0)
        rows.append((c, base, now))
    # the labels stand at the end of the longer of the bar and the step it is labelled with
    steps = [s for c in cases for s in (c.step_ms, c.base_step_ms) if s is not None and s == s]
    peak = max([peak, *steps])
    scale = BAR_W / peak if peak else 1.0
    height = TOP + ROW_H * len(rows) + 40
    width = LABEL_W + BAR_W + 150
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="10" y="20" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    lx = 10
    for p in ALL_PHASES:
        svg.append(f'<rect x="{lx}" y="28" width="10" height="10" fill="{COLOURS[p]}"/>')
        svg.append(f'<text x="{lx + 14}" y="37">{p}</text>')
        lx += 14 + 7 * len(p) + 16
    for i, (c, base, now) in enumerate(rows):
        y = TOP + i * ROW_H
        svg.append(f'<text x="10" y="{y + 16}">{escape(c.name)}</text>')
        svg.append(
            f'<text x="10" y="{y + 34}" fill="#555">'
            f"{escape(c.record.verdict_text(recorded=True))}</text>"
        )
        b_step = c.base_step_ms
        if base:
            svg += _bar(LABEL_W, y + 2, base, scale)
            if b_step is not None:
                x = LABEL_W + max(sum(base.values()), b_step) * scale + 6
                svg.append(
                    f'<text x="{x:.1f}" y="{y + 16}" fill="#555">base {b_step:.2f} ms</text>'
                )
        svg += _bar(LABEL_W, y + 4 + BAR_H, now, scale)
        x = LABEL_W + max(sum(now.values()), c.step_ms) * scale + 6
        svg.append(f'<text x="{x:.1f}" y="{y + 18 + BAR_H}">now {c.step_ms:.2f} ms</text>')
    svg.append(
        f'<text x="{LABEL_W}" y="{height - 14}" fill="#555">phases (ms, centers; label: the '
        "step's center); upper bar: baseline, lower bar: this run</text>"
    )
    svg.append("</svg>")
    return "\n".join(svg) + "\n"


def write_svg(path: Path, cases: Sequence[CaseView], title: str) -> None:
    path.write_text(render(cases, title), encoding="utf-8")
