"""Canary injection: spec parsing, option errors, real slowdowns of the named phase."""

from __future__ import annotations

import time

import pytest

from pytest_specperf.probe import StepProbe
from pytest_specperf.probe.inject import Injector, InjectSpec, parse_inject


def test_parse_spec():
    spec = parse_inject("verify=1.10, draft=1.5,host_stall=20")
    assert spec == InjectSpec({"verify": 1.1, "draft": 1.5}, 20.0)
    assert str(spec) == "draft=1.5,verify=1.1,host_stall=20"


def test_parse_wait_spec():
    spec = parse_inject("verify_wait=20,verify=1.1,draft_wait=0.5")
    assert spec == InjectSpec({"verify": 1.1}, 0.0, {"verify": 20.0, "draft": 0.5})
    assert str(spec) == "verify=1.1,draft_wait=0.5,verify_wait=20"
    assert parse_inject(str(spec)) == spec


@pytest.mark.parametrize(("text", "message"), [
    ("verfy=1.1", "unknown phase 'verfy'; choose one of: schedule, draft"),
    ("verfy_wait=3", "unknown phase 'verfy_wait'"),
    ("unaccounted_wait=3", "unknown phase 'unaccounted_wait'"),
    ("verify_wait=0", "verify_wait: 0 ms must be in (0, 10000]"),
    ("verify_wait=20000", "verify_wait: 20000 ms must be in (0, 10000]"),
    ("verify_wait=1,verify_wait=2", "verify_wait is given twice"),
    ("unaccounted=1.2", "unknown phase 'unaccounted'"),
    ("verify=fast", "verify: 'fast' is not a number"),
    ("verify=0.9", "factor 0.9 must be in (1, 10]"),
    ("verify=1", "factor 1 must be in (1, 10]"),
    ("verify=50", "factor 50 must be in (1, 10]"),
    ("verify", "is not NAME=VALUE"),
    ("verify=1.1,verify=1.2", "verify is given twice"),
    ("host_stall=-3", "host_stall: -3 ms must be in (0, 10000]"),
    ("", "empty spec"),
])
def test_bad_specs_name_the_fix(text, message):
    with pytest.raises(ValueError) as e:
        parse_inject(text)
    assert message in str(e.value)


@pytest.mark.parametrize(("args", "message"), [
    (["--specperf-inject=verify=0.5"], "*--specperf-inject: invalid value 'verify=0.5': verify: factor 0.5 must be in (1, 10]*"),
    (["--specperf-inject=kv=2"], "*unknown phase 'kv'*"),
    (["--specperf-inject=verify=1.1", "--specperf-update-baselines"],
     "*--specperf-inject cannot be combined with --specperf-update-baselines*"),
    (["--specperf-inject=verify=1.1", "--specperf-server-url=http://127.0.0.1:1"],
     "*needs a server launched by the plugin*"),
])
def test_option_errors(pytester, args, message):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_phase_factor_stretches_the_phase_itself():
    probe = StepProbe(None, injector=Injector(parse_inject("verify=1.5")))
    for _ in range(3):
        probe.begin_step(context_len=1, batch_size=1, rids=[])
        with probe.phase("draft"):
            _busy(0.010)
        with probe.phase("verify"):
            _busy(0.020)
        probe.end_step(accepted_tokens=1)
    recs = probe.take_completed()
    for r in recs:
        assert r.host_ns["verify"] == pytest.approx(30e6, rel=0.15)  # 20 ms x 1.5
        assert r.host_ns["draft"] == pytest.approx(10e6, rel=0.15)  # untouched
        assert r.unaccounted_ns < 1e6


def test_host_stall_lands_in_unaccounted():
    probe = StepProbe(None, injector=Injector(parse_inject("host_stall=15")))
    probe.begin_step(context_len=1, batch_size=1, rids=[])
    with probe.phase("prepare_for_verify"):
        _busy(0.002)
    with probe.phase("verify"):
        _busy(0.010)
    probe.end_step(accepted_tokens=1)
    (r,) = probe.take_completed()
    assert r.unaccounted_ns == pytest.approx(15e6, rel=0.15)
    assert r.host_ns["verify"] == pytest.approx(10e6, rel=0.15)


def test_engine_records_are_labelled(tiny_engine_factory):
    from pytest_specperf.engines.reference.engine import GenRequest

    probe = StepProbe(None, labels={"inject": "verify=1.1"},
                      injector=Injector(parse_inject("verify=1.1")))
    eng = tiny_engine_factory("DFLASH", 8, probe=probe)
    eng.generate([GenRequest(rid="i", max_new_tokens=20, context_len=2048, ignore_eos=True)])
    recs = probe.take_completed()
    assert recs and all(r.labels == {"inject": "verify=1.1"} for r in recs)
