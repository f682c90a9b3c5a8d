"""``plugin.run_checks``: a check of the whole run that failed after its tests (a baseline
or report not written, a missed canary) is a failed test of its own, for pytest's closing
line, its short summary, FAILURES and ``--junitxml``, and not for its ``--lf`` / ``--sw``
caches. Unit tests: a conftest stands in for the end of the run (``run.finish.end_run``);
the real end of a run with a missed canary is ``test_plugin_ci``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from pytest_specperf.plugin.run_checks import run_check_reports
from pytest_specperf.run.finish import RunFailure

END_OF_RUN_STAND_IN = """
import pytest
from pytest_specperf.plugin.run_checks import report_run_failures
from pytest_specperf.run.finish import RunFailure

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    report_run_failures(session.config, [
        RunFailure("markdown", "Markdown summary not written to out/s.md: permission denied"),
        RunFailure("canary", "canary not detected: verify=1.1 was injected and no gate named verify\\n(second line)"),
    ])
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(END_OF_RUN_STAND_IN)
    pytester.makepyfile(test_a="def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    return pytester.runpytest_inprocess(*args)


def test_each_failed_check_is_counted_named_and_explained(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--junitxml=j.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*_ specperf::markdown _*",
        "Markdown summary not written to out/s.md: permission denied",
        "*_ specperf::canary _*",
        "canary not detected: verify=1.1 was injected and no gate named verify",
        "(second line)",
        "FAILED specperf::markdown - Markdown summary not written to out/s.md*",
        "FAILED specperf::canary - canary not detected: verify=1.1 was injected*",
        "*2 failed, 2 passed*",
    ])  # fmt: skip
    # no progress letter after the tests' own (they are not collected items)
    assert "[100%]F" not in out.replace(" ", "") and "%]\nF" not in out

    root = ET.parse(pytester.path / "j.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "2", "0")
    cases = {(tc.get("classname"), tc.get("name")): tc for tc in root.iter("testcase")}
    assert set(cases) == {("test_a", "test_one"), ("test_a", "test_two"),
                          ("specperf", "markdown"), ("specperf", "canary")}  # fmt: skip
    failure = cases[("specperf", "canary")].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("canary not detected: verify=1.1")
    assert failure.text is not None and "(second line)" in failure.text


def test_the_last_failed_and_stepwise_caches_do_not_keep_the_checks(
    pytester: pytest.Pytester,
) -> None:
    _run(pytester, "--sw").assert_outcomes(passed=2, failed=2)
    cache = pytester.path / ".pytest_cache" / "v" / "cache"
    lastfailed = cache / "lastfailed"
    assert not lastfailed.exists() or not any(
        k.startswith("specperf::") for k in json.loads(lastfailed.read_text())
    )
    stepwise = cache / "stepwise"
    assert not stepwise.exists() or "specperf::" not in stepwise.read_text()
    # so --lf does not announce failures that no test of the suite has
    result = pytester.runpytest_inprocess("--lf")
    result.assert_outcomes(passed=2, failed=2)
    assert "known failures not in selected tests" not in result.stdout.str()


def test_maxfail_does_not_say_the_run_stopped(pytester: pytest.Pytester) -> None:
    """Both tests ran: ``-x`` has nothing to say of checks reported after them."""
    result = _run(pytester, "-x")
    result.assert_outcomes(passed=2, failed=2)
    assert "stopping after" not in result.stdout.str()


CHOKES = """
def pytest_runtest_logreport(report):
    if report.nodeid.startswith("specperf::"):
        raise RuntimeError("this plugin chokes on it")
"""


def test_the_real_end_of_a_run_and_a_plugin_that_chokes_on_the_report(
    pytester: pytest.Pytester,
) -> None:
    """The plugin's own hook, no server: a canary with no specperf test is missed ("no case
    was measured"). A plugin that raises on the check's report fails the run with the
    reason said, and junitxml still writes its file."""
    pytester.makepyfile(test_p="def test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("--specperf-inject=verify=1.1", "--junitxml=j.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED specperf::canary - canary not detected: verify=1.1*"])

    pytester.makeconftest(CHOKES)
    result = pytester.runpytest_inprocess("--specperf-inject=verify=1.1", "--junitxml=j.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["ERROR: the failed checks could not be reported as tests: "
                                 "RuntimeError('this plugin chokes on it')"])  # fmt: skip
    root = ET.parse(pytester.path / "j.xml").getroot()
    assert {tc.get("name") for tc in root.iter("testcase")} >= {"test_x"}


def test_a_run_that_collected_nothing_is_not_given_the_checks_as_tests(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_p="")
    result = pytester.runpytest_inprocess("--specperf-inject=verify=1.1")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the missed canary still fails the run
    assert "specperf::canary" not in result.stdout.str()
    result.stdout.fnmatch_lines(["ERROR: canary not detected: verify=1.1*"])


def test_a_check_report_is_a_failed_call_closed_by_a_passed_teardown() -> None:
    call, teardown = run_check_reports(RunFailure("baselines", "baselines not written: full"))
    assert (call.nodeid, call.when, call.outcome) == ("specperf::baselines", "call", "failed")
    assert (teardown.nodeid, teardown.when, teardown.outcome) == (
        "specperf::baselines", "teardown", "passed",
    )  # fmt: skip
    assert call.longreprtext == "baselines not written: full"
    assert call.head_line == "specperf::baselines"
