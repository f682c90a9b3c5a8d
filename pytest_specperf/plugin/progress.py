"""Progress lines for long work (server start, cases), printed past pytest's capture."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

#: A case shows progress only once it has run this long.
QUIET_FOR_S = 3.0
#: Without a TTY, at most one progress line per this many seconds.
PLAIN_EVERY_S = 10.0


class Progress:
    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._quiet = config.get_verbosity() < 0
        self._last_line = 0.0

    # The terminal reporter registers after our pytest_configure: look it up when used.
    @property
    def _tr(self) -> Any:
        return self._config.pluginmanager.get_plugin("terminalreporter")

    @property
    def _capman(self) -> Any:
        return self._config.pluginmanager.get_plugin("capturemanager")

    @property
    def _tty(self) -> bool:
        tr = self._tr
        return bool(tr is not None and getattr(tr, "isatty", False))

    @contextlib.contextmanager
    def _uncaptured(self) -> Iterator[None]:
        if self._capman is not None:
            with self._capman.global_and_fixture_disabled():
                yield
        else:
            yield

    def line(self, text: str, *, throttle: bool = False) -> None:
        """Print ``specperf: text``; with ``throttle``, at most one per PLAIN_EVERY_S."""
        if self._tr is None or self._quiet:
            return
        now = time.monotonic()
        if throttle and now - self._last_line < PLAIN_EVERY_S:
            return
        self._last_line = now
        with self._uncaptured():
            self._tr.ensure_newline()
            self._tr.write_line(f"specperf: {text}")

    def case(self, label: str) -> CaseProgress:
        return CaseProgress(self, label)


class CaseProgress:
    """Throttled ``case, step n/N, elapsed`` updates for one case."""

    def __init__(self, progress: Progress, label: str) -> None:
        self.p = progress
        self.label = label
        self.t0 = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done: int, total: int, note: str = "") -> None:
        now = time.monotonic()
        elapsed = now - self.t0
        p = self.p
        if p._tr is None or p._quiet or elapsed < QUIET_FOR_S:
            return
        if now - self._last < (0.5 if p._tty else PLAIN_EVERY_S):
            return
        self._last = now
        text = f"specperf: {self.label}  step {min(done, total)}/{total}"
        text += f"  {note}" if note else ""
        text += f"  {elapsed:.0f} s"
        with p._uncaptured():
            if p._tty:
                if not self._shown:
                    p._tr.ensure_newline()
                p._tr.rewrite(text)
            else:
                p._tr.ensure_newline()
                p._tr.write_line(text)
        self._shown = True

    def done(self, summary: str) -> None:
        if not self._shown:
            return
        elapsed = time.monotonic() - self.t0
        with self.p._uncaptured():
            text = f"specperf: {self.label}  {summary}  {elapsed:.0f} s"
            if self.p._tty:
                self.p._tr.rewrite(text)
                self.p._tr.write_line("")
            else:
                self.p._tr.write_line(text)
