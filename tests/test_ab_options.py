"""``--specperf-ab``: its one parser (``settings.parse_ab``) and the usage errors of the
plugin, each naming the value and the fix, raised before any server starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_specperf.run.servers import ServerSpec, reference_spec
from pytest_specperf.server.protocol import BackendSettings
from pytest_specperf.settings import ABSpec, BadValue, parse_ab

PY = sys.executable


def test_another_environment_with_extra_arguments() -> None:
    spec = parse_ab(f"python={PY},args=--cuda-graph-bs 1,2,4 --attention-backend 'tri ton'")
    assert spec.python == PY and spec.launched
    # args= takes the rest of the value, commas included, split as a shell would
    assert spec.args == ("--cuda-graph-bs", "1,2,4", "--attention-backend", "tri ton")
    assert str(spec) == f"python={PY},args=--cuda-graph-bs 1,2,4 --attention-backend 'tri ton'"


def test_the_same_build_with_other_arguments_and_a_running_server() -> None:
    assert parse_ab("args=--speculative-algorithm EAGLE3") == ABSpec(
        args=("--speculative-algorithm", "EAGLE3")
    )
    url = parse_ab("url=http://127.0.0.1:30000/,run-dir=/tmp/ref-run")
    assert url == ABSpec(url="http://127.0.0.1:30000", run_dir=Path("/tmp/ref-run"))
    assert not url.launched and str(url) == "url=http://127.0.0.1:30000,run-dir=/tmp/ref-run"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("python=/no/such/python", "python '/no/such/python' does not exist"),
        ("python=bin/python", "is not an absolute path"),
        ("url=http://127.0.0.1:30000,args=--x", "give one or the other"),
        ("url=ftp://host", "must look like http://127.0.0.1:30000"),
        ("run-dir=/tmp/x", "run-dir= goes with url= only"),
        ("args=", "args= has no arguments"),
        ("args=--x 'open", "cannot be split"),
        ("pyhton=/usr/bin/python3", "unknown part 'pyhton'"),
        ("release", "unknown part 'release'"),
    ],
)
def test_bad_values_name_the_value_the_problem_and_the_forms(raw: str, problem: str) -> None:
    with pytest.raises(BadValue) as e:
        parse_ab(raw)
    text = str(e.value)
    assert repr(raw) in text and problem in text
    assert "python=PATH[,args=ARGS] | args=ARGS | url=URL[,run-dir=DIR]" in text


def test_the_reference_side_is_never_injected_and_keeps_the_tested_launch() -> None:
    tested = ServerSpec(
        backend="reference",
        settings=BackendSettings(model="tiny", server_args=("--threads=1",), inject="verify=1.1"),
        ready_timeout_s=60.0,
        inject=None,
    )
    ref = reference_spec(tested, parse_ab(f"python={PY},args=--threads=2"))
    assert ref.settings.python == PY and ref.settings.inject is None
    assert ref.settings.server_args == ("--threads=1", "--threads=2")  # the later one wins
    assert ref.settings.model == "tiny" and ref.url is None
    attached = reference_spec(tested, parse_ab("url=http://127.0.0.1:30001"))
    assert attached.url == "http://127.0.0.1:30001" and attached.inject is None


CASE = """
def test_decode(specperf):
    specperf.decode(context_len=2048)
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--specperf-ab=python=/no/such/python"],
            "*--specperf-ab: invalid value 'python=/no/such/python': python '/no/such/python' "
            "does not exist*",
        ),
        (
            ["--specperf-ab=args=--threads 1", "--specperf-update-baselines"],
            "*--specperf-ab cannot be combined with --specperf-update-baselines: an A/B run "
            "judges against the reference side it measures and writes no baseline*",
        ),
        (
            ["--specperf-ab=args=--threads 1", "--specperf-attach=http://127.0.0.1:9"],
            "*--specperf-ab args=--threads 1 launches the reference side with the tested "
            "side's launch settings, and --specperf-attach measures a running server whose "
            "settings the plugin does not know: drop --specperf-attach, or attach to both "
            "sides (--specperf-ab url=URL)*",
        ),
    ],
)
def test_usage_errors_before_any_server_starts(
    pytester: pytest.Pytester, args: list[str], message: str
) -> None:
    pytester.makepyfile(test_case=CASE)
    before = sorted(p.name for p in pytester.path.iterdir())
    result = pytester.runpytest(*args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert sorted(p.name for p in pytester.path.iterdir()) == before  # nothing written


def test_the_ini_twin_and_processes_per_side(pytester: pytest.Pytester) -> None:
    pytester.makeini(f"[pytest]\nspecperf_ab = python={PY}\n")
    pytester.makepyfile(
        test_show="""
def test_show(request):
    from pytest_specperf.plugin.session import get_session
    s = get_session(request.config).settings
    print("AB", s.ab, s.processes)
"""
    )
    pytester.runpytest("-s", "-p", "no:cacheprovider").stdout.fnmatch_lines([f"*AB python={PY} 2"])
    out = pytester.runpytest("-s", "-p", "no:cacheprovider", "--specperf-processes=3")
    out.stdout.fnmatch_lines([f"*AB python={PY} 3"])
