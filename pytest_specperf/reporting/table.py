"""The one table renderer: aligned plain-text columns for terminals and CI logs."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Collection[int] = ()
) -> list[str]:
    """Header, a dashed rule and one line per row; columns in ``right`` right-aligned.

    Cells are separated by two spaces; trailing blanks are stripped.
    """
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]
