"""pytest hooks: wiring only.

The work is done elsewhere in this wing: ``options`` (flags and ini), ``markers``,
``fixtures``, ``cases`` (judging each test's runs), ``benchmark`` (each judged case as a
pytest-benchmark result), ``session`` (state); the end of the run (baselines, reports, summary) is
``run.finish``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_specperf.plugin import benchmark as _benchmark
from pytest_specperf.plugin import options as _options
from pytest_specperf.plugin.cases import judge_item
from pytest_specperf.plugin.fixtures import HANDLE_KEY
from pytest_specperf.plugin.markers import MARKERS, case_context_len, parse_marker
from pytest_specperf.plugin.progress import Progress
from pytest_specperf.plugin.run_checks import report_run_failures
from pytest_specperf.plugin.session import SESSION_KEY, SpecperfSession, get_session
from pytest_specperf.plugin.xdist import (
    OUTPUT_KEY,
    check_controller,
    gather,
    order_cases,
    pin_worker,
    worker_id,
    worker_output,
)
from pytest_specperf.run.finish import (
    Gathered,
    end_run,
    report_header,
    server_header,
    summary_lines,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    _options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if config.option.help or getattr(config.option, "version", False):
        return
    settings = _options.load_settings(config)
    pin_worker(config)  # an xdist worker: its own GPU, before anything initializes CUDA
    workers = check_controller(config, settings)
    sess = SpecperfSession(config, settings, Progress(config))
    sess.notes += settings.notes
    if workers:
        sess.gathered = Gathered(workers=workers)
    config.stash[SESSION_KEY] = sess
    _benchmark.register(config, sess, lambda: report_header(sess))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SESSION_KEY not in config.stash:
        return
    threshold = get_session(config).settings.long_context_min
    errors = []
    for item in items:
        try:
            opts = parse_marker(item)
        except ValueError as e:
            errors.append(str(e))
            continue
        ctx = case_context_len(item, opts)
        if ctx is not None and ctx >= threshold and item.get_closest_marker("long_context") is None:
            item.add_marker(pytest.mark.long_context)
    if errors:
        raise pytest.UsageError("\n".join(errors))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The number of specperf tests the run judges: the false-alarm budget's divisor
    (``judging.significance.Family.tests``). A ``gpu`` test on a machine without CUDA is
    skipped at setup (``pytest_runtest_setup``) and judges nothing, so it takes no share;
    every other selected test that uses the ``specperf`` fixture does, even one that
    skips itself later (a conservative count: its share goes unspent)."""
    if SESSION_KEY not in session.config.stash:
        return
    get_session(session.config).judged_tests = judged_tests(session.items)


def judged_tests(items: list[pytest.Item]) -> int:
    """The selected tests that use the ``specperf`` fixture, less the ``gpu`` ones when
    CUDA is unusable here (at least 1). A test that asks for it only at run time
    (``request.getfixturevalue``) is not seen here: name it as an argument."""
    mine = [item for item in items if "specperf" in getattr(item, "fixturenames", ())]
    if any(item.get_closest_marker("gpu") is not None for item in mine):
        from pytest_specperf.telemetry.cuda import cuda_unavailable_reason

        if cuda_unavailable_reason():
            mine = [item for item in mine if item.get_closest_marker("gpu") is None]
    return max(1, len(mine))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        from pytest_specperf.telemetry.cuda import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason:
            pytest.skip(f"needs a CUDA GPU: {reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    result = yield  # a test that raised is not judged
    handle = item.stash.get(HANDLE_KEY, None)
    if handle is not None and handle.runs:
        sess = get_session(item.config)
        judged = len(sess.outcomes)
        try:
            judge_item(sess, item, handle)
        finally:  # a failed (SLOWER) case is a measured result too
            _benchmark.add_cases(item.config, item, sess.outcomes[judged:])
    return result


@pytest.hookimpl(tryfirst=True)  # before junitxml writes its file: a failed check is in it
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write baselines and reports; a failed write or a missed canary fails the run, as a
    failed test of its own (``run_checks``); in an xdist worker, hand the results to the
    controller instead."""
    config = session.config
    if SESSION_KEY not in config.stash:
        return
    sess = get_session(config)
    if worker_id(config) is not None:
        workeroutput: dict[str, Any] = config.workeroutput  # type: ignore[attr-defined]
        workeroutput[OUTPUT_KEY] = worker_output(sess, server_header(sess))
        return
    if sess.gathered is not None:
        sess.cases[:] = order_cases(sess.cases, sess.gathered.order)
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    failures = end_run(sess, interrupted=interrupted, commit=lambda: _benchmark.commit_info(config))
    if not failures:
        return
    # a run that ran its tests gets its failed checks as tests of their own; one that ended
    # otherwise (interrupted, nothing collected, a usage error) keeps pytest's say
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        try:
            report_run_failures(config, failures)
        except Exception as e:  # another plugin's logreport: junitxml and the caches still write
            sess.errors.append(f"the failed checks could not be reported as tests: {e!r}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if SESSION_KEY in config.stash:
        for line in summary_lines(get_session(config)):
            terminalreporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """pytest-xdist controller: the collection order, for the reports; and the baseline
    file read before any worker runs a test (a broken one ends the session here, with
    one message, as the ``model_server`` fixture does without xdist)."""
    config = node.config
    if SESSION_KEY in config.stash:
        sess = get_session(config)
        g = sess.gathered
        if g is not None and not g.order:
            g.order = list(ids)
            refusal = sess.baseline_refusal() if ids else None
            if refusal is not None:
                pytest.exit(refusal, returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist controller: a worker finished (or died); gather its results."""
    config = node.config
    if SESSION_KEY in config.stash:
        worker = str(getattr(getattr(node, "gateway", None), "id", "?"))
        gather(get_session(config), worker, getattr(node, "workeroutput", None), error)
