"""A check of the whole run that failed, reported as a failed test of its own.

A canary that no gate named, or a baseline file or report that could not be written, fails
the run after every test has passed (``run.finish.end_run``). Without more, pytest's
summary line and ``--junitxml`` would still say "7 passed" beside a red exit status, and a
dashboard that reads the JUnit file would show a green night. So each such failure is also
a failed test report, ``specperf::canary`` (``::baselines``, ``::json-report``,
``::markdown``), with the summary's ERROR line as its reason:

- ``--junitxml`` holds a failed testcase (classname ``specperf``, name ``canary``);
- pytest's summary line counts it ("1 failed, 7 passed"), its short test summary names it
  (``FAILED specperf::canary - canary not detected: ...``) and FAILURES shows the reason;
- every other ``pytest_runtest_logreport`` implementation (reportlog, pytest-html, ...)
  sees it as it sees any failed test.

It is not a collected item: the terminal gets it in its counts only (no progress letter
after "[100%]"); pytest's last-failed and stepwise caches do not get it (``--lf`` and
``--sw`` select collected tests; a name no test has would stay in them for good), nor does
its session's failure count (``-x`` would say "stopping after 1 failures" of a run that
stopped nowhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import pytest
from _pytest._code.code import TerminalRepr

from pytest_specperf.run.finish import RunFailure

if TYPE_CHECKING:
    from _pytest._io import TerminalWriter

#: The node id's first part: ``specperf::canary``.
PREFIX = "specperf"

#: pytest's plugins that are given the report some other way, or not at all: the terminal
#: reporter (counted through its ``stats``), the last-failed and stepwise caches, the
#: session's failure count (``--maxfail``).
_NOT_TOLD = ("terminalreporter", "lfplugin", "stepwiseplugin", "session")


class CheckFailure(TerminalRepr):
    """A failed check's reason as pytest's reports read a failure: ``toterminal`` (the
    FAILURES section), ``reprcrash.message`` (the short summary line, JUnit's ``message``),
    ``str`` (JUnit's text, a serialised report)."""

    def __init__(self, message: str) -> None:
        self.message = message

    @property
    def reprcrash(self) -> CheckFailure:
        return self

    def toterminal(self, tw: TerminalWriter) -> None:
        for line in self.message.splitlines():
            tw.line(line)


def run_check_reports(failure: RunFailure) -> tuple[pytest.TestReport, pytest.TestReport]:
    """The failed ``call`` report of one failed run check, and the ``teardown`` report
    that closes its JUnit testcase."""
    nodeid = f"{PREFIX}::{failure.check}"
    location = (PREFIX, None, nodeid)
    keywords: dict[str, Literal[1]] = {PREFIX: 1, failure.check: 1}
    why = CheckFailure(failure.why)
    call = pytest.TestReport(nodeid, location, keywords, "failed", why, "call", user_properties=[])
    teardown = pytest.TestReport(
        nodeid, location, keywords, "passed", None, "teardown", user_properties=[]
    )
    return call, teardown


def report_run_failures(config: pytest.Config, failures: Sequence[RunFailure]) -> None:
    """Report each failed run check as a failed test (the module's doc). Call it before
    junitxml writes its file, in ``pytest_sessionfinish`` (``tryfirst``)."""
    pm = config.pluginmanager
    skip = [p for p in (pm.get_plugin(name) for name in _NOT_TOLD) if p is not None]
    logreport = pm.subset_hook_caller("pytest_runtest_logreport", remove_plugins=skip)
    terminal: Any = pm.get_plugin("terminalreporter")
    for failure in failures:
        call, teardown = run_check_reports(failure)
        for report in (call, teardown):
            logreport(report=report)
        if terminal is not None:
            _count(terminal, call)


def _count(terminal: Any, report: pytest.TestReport) -> None:
    """The terminal reporter's count of failed tests, and its closing line's colour (which
    pytest before 8.3 may not work out again at the end when progress is not shown)."""
    add = getattr(terminal, "_add_stats", None)
    if callable(add):
        add("failed", [report])
    else:
        terminal.stats.setdefault("failed", []).append(report)
