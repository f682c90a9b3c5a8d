"""The pytest-benchmark side of the bridge: each judged case handed to its session.

pytest-benchmark registers its ``BenchmarkSession`` as the plugin ``pytest-benchmark``.
A judged case becomes one of its ``Metadata`` results: built from a ``BenchmarkFixture``
made for the test item as pytest-benchmark's own ``benchmark`` fixture makes one (the
session's options, its logger), renamed to the case, with one ``stats.update`` per
measured step (seconds), and appended to the session's ``benchmarks``. pytest-benchmark
then writes (``--benchmark-json``), saves (``--benchmark-save``, ``--benchmark-autosave``),
compares (``--benchmark-compare``) and displays them with its own code, next to the
results of any ``benchmark`` fixture of the same session. Its hooks add the device to
``machine_info`` and the run's header to the file (``BenchmarkBridge``).

Cases are handed over only when pytest-benchmark will write, compare or draw something
(one of ``OUTPUT_OPTIONS``) and is not disabled (``--benchmark-disable``: no stats, as
for its own fixture). The specperf tests run and are judged the same either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import pytest

from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.plugin.session import SpecperfSession
from pytest_specperf.reporting.benchmark import benchmark_entry, machine_entries, run_header
from pytest_specperf.store.report import SPECPERF_KEY

#: The name pytest-benchmark registers its session under (``pytest_benchmark.plugin``).
BENCHMARK_SESSION: Final = "pytest-benchmark"
#: The name pytest-benchmark's plugin module is registered under (``-p no:benchmark``).
BENCHMARK_PLUGIN: Final = "benchmark"
#: The name ``BenchmarkBridge`` is registered under.
BRIDGE: Final = "specperf-benchmark"
#: pytest-benchmark options (dests) that make it write, compare or draw results.
OUTPUT_OPTIONS: Final = (
    "benchmark_json",
    "benchmark_save",
    "benchmark_autosave",
    "benchmark_compare",
    "benchmark_csv",
    "benchmark_histogram",
)


def benchmark_session(config: pytest.Config) -> Any | None:
    """pytest-benchmark's session, or None where it is not installed or is disabled
    (``-p no:benchmark``)."""
    if not config.pluginmanager.hasplugin(BENCHMARK_PLUGIN):
        return None
    from pytest_benchmark.session import BenchmarkSession

    bs = config.pluginmanager.get_plugin(BENCHMARK_SESSION)
    return bs if isinstance(bs, BenchmarkSession) else None


def wanted(config: pytest.Config, bs: Any) -> bool:
    """Whether cases go to pytest-benchmark: it is enabled and will use them."""
    if bs.disabled:
        return False
    return any(config.getoption(name, None) for name in OUTPUT_OPTIONS)


def add_case(bs: Any, item: pytest.Item, outcome: CaseOutcome) -> None:
    """Append ``outcome`` to pytest-benchmark's session as one result."""
    from pytest_benchmark.fixture import BenchmarkFixture
    from pytest_benchmark.stats import Metadata

    entry = benchmark_entry(outcome)
    # pytest-benchmark's code is untyped
    fixture = BenchmarkFixture(  # type: ignore[no-untyped-call]
        item,
        add_stats=bs.benchmarks.append,
        logger=bs.logger,
        warner=item.warn,
        disabled=bs.disabled,
        **bs.options,
    )
    fixture.name, fixture.fullname, fixture.group = entry.name, entry.fullname, entry.group
    fixture.param, fixture.params = entry.param, dict(entry.params)
    fixture.extra_info.update(entry.extra_info)
    stats = Metadata(fixture, iterations=1, options=dict(entry.options))  # type: ignore[no-untyped-call]
    for seconds in entry.step_seconds:
        stats.update(seconds)  # type: ignore[no-untyped-call]
    fixture.stats = stats
    bs.benchmarks.append(stats)


def add_cases(config: pytest.Config, item: pytest.Item, outcomes: Sequence[CaseOutcome]) -> None:
    """Hand a test's judged cases to pytest-benchmark, where it is active and wants them."""
    bs = benchmark_session(config) if outcomes else None
    if bs is not None and wanted(config, bs):
        for outcome in outcomes:
            add_case(bs, item, outcome)


def commit_info(config: pytest.Config) -> dict[str, Any] | None:
    """The commit as pytest-benchmark records it (its hooks: ``id``, ``time``, ``dirty``,
    ``branch``, ...), or None where pytest-benchmark is not active."""
    if benchmark_session(config) is None:
        return None
    info: dict[str, Any] = config.hook.pytest_benchmark_generate_commit_info(config=config)
    config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=info)
    return info


class BenchmarkBridge:
    """pytest-benchmark's hooks: the device in ``machine_info``, the run's header in the
    file. Registered only where pytest-benchmark is active (``register``)."""

    def __init__(self, sess: SpecperfSession, header: Callable[[], dict[str, Any]]) -> None:
        self._sess = sess
        self._header = header

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(
        self, config: pytest.Config, machine_info: dict[str, Any]
    ) -> None:
        # --benchmark-compare asks before any case ran, to compare with the saved run's
        # machine_info (which carries the device): give it the device then too, or every
        # comparison warns that the machine differs
        if self._sess.outcomes or config.getoption("benchmark_compare", None):
            machine_info.update(machine_entries(self._sess.device().to_dict()))

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_json(
        self, config: pytest.Config, benchmarks: list[Any], output_json: dict[str, Any]
    ) -> None:
        if self._sess.outcomes:
            output_json[SPECPERF_KEY] = run_header(self._header())


def register(config: pytest.Config, sess: SpecperfSession,
             header: Callable[[], dict[str, Any]]) -> None:  # fmt: skip
    """Register ``BenchmarkBridge`` where pytest-benchmark is installed and enabled."""
    if config.pluginmanager.hasplugin(BENCHMARK_PLUGIN):
        config.pluginmanager.register(BenchmarkBridge(sess, header), BRIDGE)
