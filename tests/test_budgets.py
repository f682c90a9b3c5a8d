"""Budgets: absolute limits a case must meet whatever its baseline says."""

from __future__ import annotations

import textwrap

import pytest

from pytest_specperf.judging.budgets import Budgets, check_budgets, parse_budget


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("min_active_share", "50%", 0.5),
        ("min_active_share", 0.5, 0.5),
        ("max_unaccounted_share", "1", 1.0),
        ("max_step_ms", "200", 200.0),
        ("min_accept_len", 2.5, 2.5),
        ("min_tokens_per_s", 40, 40.0),
    ],
)
def test_budget_values_parse(name, raw, value):
    assert parse_budget(name, raw) == pytest.approx(value)


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("min_active_share", "150%", "a share in (0, 1]"),
        ("min_active_share", 0, "a share in (0, 1]"),
        ("max_step_ms", "fast", "a positive number"),
        ("max_step_ms", -1, "a positive number"),
        ("max_step_ms", True, "a positive number"),
        ("max_step_ms", "nan", "a positive number"),
        ("max_steps", 1, "unknown budget 'max_steps'"),
    ],
)
def test_bad_budget_values_say_what_is_valid(name, raw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_budget(name, raw)


def test_marker_budgets_override_ini_budgets():
    ini = Budgets(max_step_ms=100.0, min_active_share=0.3)
    marker = Budgets(min_active_share=0.6)
    merged = ini.over(marker)
    assert merged == Budgets(max_step_ms=100.0, min_active_share=0.6)
    assert merged.any and not Budgets().any


def test_budgets_checked_on_the_run(make_run):
    run = make_run()  # ~48.5 ms steps, unaccounted ~0.03 ms, v1-like records: no CPU times
    budgets = Budgets(
        max_step_ms=40.0, max_unaccounted_share=0.05, min_accept_len=1.0, min_active_share=0.5
    )
    checks = {c.budget: c for c in check_budgets(run, budgets)}
    step = checks["max_step_ms"]
    assert step.failed and step.describe().startswith("over budget: step ")
    assert "> max 40 ms (max_step_ms)" in step.describe()
    assert not checks["max_unaccounted_share"].failed
    assert checks["max_unaccounted_share"].describe().startswith("within budget: unaccounted 0.1%")
    assert not checks["min_accept_len"].failed
    active = checks["min_active_share"]
    assert active.failed and active.value is None  # not measured: never passes
    assert "cannot be checked: the active share was not measured" in active.describe()
    assert check_budgets(run, None) == ()
    # given the centers every report shows, the unaccounted share is the phase table's:
    # the unaccounted center over the step's, not the first process's ratio
    centers = {"step": 50.0, "unaccounted": 4.0}
    (share,) = check_budgets(run, Budgets(max_unaccounted_share=0.05), centers)
    assert share.value == pytest.approx(0.08) and share.failed


MARKED = """
import pytest

@pytest.mark.specperf({marker})
def test_ok(request):
    from pytest_specperf.plugin.markers import parse_marker
    from pytest_specperf.plugin.session import get_session
    budgets = get_session(request.config).settings.budgets().over(parse_marker(request.node).budgets)
    print("BUDGETS", budgets)
"""


def test_budget_keywords_and_ini_twins(pytester):
    pytester.makeini(
        textwrap.dedent("""
        [pytest]
        specperf_budgets =
            max_step_ms=250
            min_active_share=30%
        specperf_profile = kernels=8
    """)
    )
    pytester.makepyfile(MARKED.format(marker="min_active_share='60%', min_tokens_per_s=20"))
    result = pytester.runpytest("-s", "--specperf-budget=min_accept_len=2")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*BUDGETS Budgets(max_unaccounted_share=None, min_active_share=0.6, "
            "max_step_ms=250.0, min_accept_len=2.0, min_tokens_per_s=20.0)"
        ]
    )


@pytest.mark.parametrize(
    ("args", "marker", "message"),
    [
        ((), "min_active_share='lots'", "*min_active_share 'lots' must be a share in (0, 1]*"),
        ((), "max_step_ms=0", "*max_step_ms 0 must be a positive number*"),
        (
            ("--specperf-budget=max_step_ms=abc",),
            "",
            "*--specperf-budget: invalid value 'max_step_ms=abc': max_step_ms 'abc' is not a "
            "positive number*",
        ),
        (
            ("--specperf-profile=kernels=-1",),
            "",
            "*--specperf-profile: invalid value 'kernels=-1': kernels -1 is not in [[]0, *",
        ),
    ],
)
def test_bad_budgets_are_usage_errors(pytester, args, marker, message):
    pytester.makepyfile(MARKED.format(marker=marker))
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
