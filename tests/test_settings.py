"""The value parsers shared by the plugin, the marker and ``specperf``: pure, tested directly."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pytest_specperf.cli.options import add_replaced_options, add_tolerance_option
from pytest_specperf.judging.verdict import Tolerances
from pytest_specperf.settings import (
    DEFAULT_TOLERANCES,
    Attach,
    BadValue,
    Profile,
    StepsSpec,
    ToleranceSpec,
    parse_attach,
    parse_budgets,
    parse_max_time,
    parse_processes,
    parse_profile,
    parse_steps,
    parse_tolerance,
)


@pytest.mark.parametrize(
    ("raw", "spec"),
    [
        ("7%", ToleranceSpec(phase=0.07)),
        ("0.07", ToleranceSpec(phase=0.07)),
        (0.1, ToleranceSpec(phase=0.1)),
        (" 7% , step=25% ", ToleranceSpec(phase=0.07, step=0.25)),
        ("step=30%", ToleranceSpec(step=0.3)),
        ("phase=5%,step=0.5", ToleranceSpec(phase=0.05, step=0.5)),
        ("step=30%,4%", ToleranceSpec(phase=0.04, step=0.3)),
    ],
)
def test_tolerance_values(raw, spec):
    assert parse_tolerance(raw) == spec


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("", "empty"),
        ("abc", "phase 'abc' is not a fraction in (0, 1)"),
        ("0", "phase '0' is not a fraction in (0, 1)"),
        ("100%", "phase '100%' is not a fraction in (0, 1)"),
        ("nan", "phase 'nan' is not a fraction in (0, 1)"),
        ("7%,step=1.5", "step '1.5' is not a fraction in (0, 1)"),
        ("7%,steps=25%", "unknown part 'steps' (known: phase, step)"),
        ("7%,8%", "phase is given twice"),
        ("7%,,step=25%", "empty part in '7%,,step=25%'"),
        ("7%,step=", "'step' has no value"),
        (True, "not text or a number"),
        (["7%"], "not text or a number"),
    ],
)
def test_tolerance_errors_name_the_value_the_problem_and_the_form(raw, problem):
    with pytest.raises(BadValue) as e:
        parse_tolerance(raw)
    assert str(e.value) == (
        f"invalid value {raw!r}: {problem}; expected PHASE[,step=STEP] with fractions in "
        "(0, 1) or percentages, e.g. 7%, 7%,step=25% or step=30%"
    )
    assert isinstance(e.value, ValueError)  # callers without argparse catch ValueError


def test_a_tolerance_spec_fills_what_it_lacks_and_prints_as_typed():
    assert ToleranceSpec(step=0.4).over(DEFAULT_TOLERANCES) == Tolerances(0.07, 0.4)
    assert ToleranceSpec(phase=0.1).over_spec(ToleranceSpec(0.2, 0.3)) == ToleranceSpec(0.1, 0.3)
    assert str(ToleranceSpec(0.07, 0.25)) == "7%,step=25%"
    assert str(ToleranceSpec(step=0.075)) == "step=7.5%"
    assert parse_tolerance(str(ToleranceSpec(0.033, 0.5))) == ToleranceSpec(0.033, 0.5)


def test_steps():
    assert parse_steps("32") == StepsSpec(32, None)
    assert parse_steps("8,warmup=2") == StepsSpec(8, 2)
    assert parse_steps("warmup=0") == StepsSpec(None, 0)
    assert StepsSpec(warmup=1).over_spec(StepsSpec(16, 4)) == StepsSpec(16, 1)
    for raw, problem in [("3", "steps 3 is not in [4, 100000]"), ("x", "steps 'x' is not an "
                         "integer"), ("8,warmup=-1", "warmup -1 is not in [0, 100000]"),
                         ("8,cooldown=1", "unknown part 'cooldown' (known: steps, warmup)")]:  # fmt: skip
        with pytest.raises(BadValue, match=rf"invalid value '{raw}': {problem[:18]}"):
            parse_steps(raw)


def test_budgets():
    assert parse_budgets("max_step_ms=200,min-active-share=50%") == {
        "max_step_ms": 200.0,
        "min_active_share": 0.5,
    }
    with pytest.raises(BadValue, match="max_step_ms '-1' is not a positive number"):
        parse_budgets("max_step_ms=-1")
    with pytest.raises(BadValue, match=r"min_active_share '150%' is not a share in \(0, 1\]"):
        parse_budgets("min_active_share=150%")
    with pytest.raises(BadValue, match=r"unknown part 'max_step' \(known: max_unaccounted_share"):
        parse_budgets("max_step=3")
    with pytest.raises(BadValue, match="max_step_ms has no limit"):
        parse_budgets("max_step_ms")


def test_attach():
    assert parse_attach("http://127.0.0.1:30000/") == Attach("http://127.0.0.1:30000")
    got = parse_attach("http://127.0.0.1:30000,run-dir=/tmp/r")
    assert got == Attach("http://127.0.0.1:30000", Path("/tmp/r"))
    assert str(got) == "http://127.0.0.1:30000,run-dir=/tmp/r"
    with pytest.raises(BadValue, match="server URL 'localhost:1' must look like http://"):
        parse_attach("localhost:1")
    with pytest.raises(BadValue, match=r"invalid value 'http://h:1,dir=x': unknown part 'dir'"):
        parse_attach("http://h:1,dir=x")


def test_profile():
    assert parse_profile("nvtx") == Profile(nvtx=True)
    assert parse_profile("kernels=0,on-regression") == Profile(kernel_every=0, on_regression=True)
    assert parse_profile("none") == Profile()
    assert Profile(nvtx=True, kernel_every=4, on_regression=True).launch_only == ("nvtx", "kernels")
    for raw, problem in [("nvtx=yes", "nvtx takes no value"), ("kernels", "kernels needs a "
                         "number"), ("kernels=-2", "kernels -2 is not in"), ("none,nvtx",
                         "none with other parts"), ("flame", "unknown part 'flame'")]:  # fmt: skip
        with pytest.raises(BadValue, match=problem):
            parse_profile(raw)


def test_processes_and_max_time():
    assert parse_processes("3") == 3 and parse_max_time("0") == 0.0
    for parse, raw in [(parse_processes, "0"), (parse_processes, "17"), (parse_processes, "x"),
                       (parse_max_time, "-1"), (parse_max_time, "inf"), (parse_max_time, "x")]:  # fmt: skip
        with pytest.raises(BadValue, match=f"invalid value '{raw}'"):
            parse(raw)


def test_shared_definitions_and_old_spellings_through_argparse(capsys):
    """As ``type=``, a parser's error follows the flag's name; an old flag names the new."""
    parser = argparse.ArgumentParser(prog="x")
    add_tolerance_option(parser.add_argument, "", "tolerances")
    add_replaced_options(parser.add_argument, {"--step-tolerance": ("was replaced by X", True)})
    assert parser.parse_args(["--tolerance", "5%,step=30%"]).tolerance == ToleranceSpec(0.05, 0.3)
    for argv, says in [
        (["--tolerance", "5"], "argument --tolerance: invalid value '5': phase '5' is not"),
        (["--step-tolerance", "5%"], "argument --step-tolerance: was replaced by X"),
    ]:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert says in capsys.readouterr().err
    assert "--step-tolerance" not in parser.format_help()
