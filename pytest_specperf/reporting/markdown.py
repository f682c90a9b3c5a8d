"""The run's summary as Markdown, for CI pages (``--specperf-markdown``, GitHub's step
summary): the terminal summary's content, with the table as a Markdown table and each
failing case's lines in a code block."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pytest_specperf.reporting.terminal import (
    SUMMARY_HEADERS,
    RunSummary,
    case_notes,
    head_lines,
    machine_note,
    no_baseline_hint,
    strict_line,
    summary_rows,
    svg_path,
)
from pytest_specperf.reporting.view import CaseView

#: Right-aligned columns of the summary table (as in the terminal).
_RIGHT = {1, 2, 4}


def _cell(text: str) -> str:
    """A table cell: pipes escaped, no line breaks."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured Markdown table."""
    rule = ["---:" if i in _RIGHT else "---" for i in range(len(headers))]
    return [
        "| " + " | ".join(_cell(h) for h in headers) + " |",
        "| " + " | ".join(rule) + " |",
        *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows),
    ]


def _code(lines: Sequence[str]) -> list[str]:
    """A fenced block long enough that no line of ``lines`` can close it."""
    fence = "```"
    while any(fence in line for line in lines):
        fence += "`"
    return [fence, *lines, fence]


def _failures(cases: Sequence[CaseView]) -> list[str]:
    out: list[str] = []
    for c in cases:
        if c.failure:
            title = f"#### {_cell(c.name)}: {c.record.verdict_text(recorded=True)}"
            out += ["", title, "", *_code(c.failure.split("\n"))]
    return out


def _diagnoses(cases: Sequence[CaseView]) -> list[str]:
    """Every passing case's diagnosis (bottleneck, per phase worked or waited), folded."""
    out: list[str] = []
    for c in cases:
        if c.diagnosis and not c.failure:
            title = f"{_cell(c.name)}: {c.record.verdict_text(recorded=True)}"
            out += ["", f"<details><summary>{title}</summary>", "", *_code(list(c.diagnosis))]
            out += ["", "</details>"]
    return out


def _files(s: RunSummary) -> list[str]:
    if not s.json_path:
        return []
    return ["", f"JSON report: `{s.json_path}`, picture: `{svg_path(s.json_path)}`"]


def markdown_summary(s: RunSummary, cases: Sequence[CaseView]) -> str:
    """The summary of a run as one Markdown document."""
    head = head_lines(s)
    lines = [f"### {head[0].removeprefix('specperf: ')}", *head[1:], ""]
    if cases:
        lines += markdown_table(SUMMARY_HEADERS, summary_rows(cases))
    else:
        lines.append("No case was measured.")
    hint = no_baseline_hint(s, cases)
    machine = machine_note(cases, recording=s.update)
    notes = [*([hint] if hint else []), *([machine] if machine else []),
             *case_notes(cases, s.max_time_s)]  # fmt: skip
    notes += [s.telemetry_note] if s.telemetry_note else []
    notes += [*s.backend_notes, *s.notes, *s.written, *(f"ERROR: {e}" for e in s.errors)]
    if notes:
        lines += ["", *_code(notes)]
    lines += _failures(cases)
    lines += _diagnoses(cases)
    lines += _files(s)
    last = strict_line(s, cases)
    if last:
        lines += ["", f"**{last}**"]
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_markdown(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` (GitHub's step summary file collects every step's)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
