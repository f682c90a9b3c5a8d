"""The bridge's pure half: a judged case as pytest-benchmark's ``Metadata`` reads it.

Round trips go through pytest-benchmark's own ``Metadata`` and JSON generator, and back
through ``read_report``; the plugin half is tested end to end in test_benchmark_bridge.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pytest_benchmark.plugin import pytest_benchmark_generate_json
from pytest_benchmark.stats import Metadata

from pytest_specperf.judging.judge import Case, judge_case
from pytest_specperf.judging.verdict import Tolerances
from pytest_specperf.probe.phases import ALL_PHASES, HOST_PHASES
from pytest_specperf.reporting.benchmark import (
    BENCHMARK_GROUP,
    benchmark_entry,
    case_params,
    engine_name,
    machine_entries,
    run_header,
)
from pytest_specperf.store.rebuild import run_from_case
from pytest_specperf.store.report import read_report

TEST = "perf_tests/test_decode.py::test_decode"
KEY = "ctx=8192 kv=contiguous bs=1 model=x"


@pytest.fixture
def outcome(make_run, reference_fp):
    case = Case(nodeid=f"{TEST}[a]", test=TEST, key=KEY, run=make_run(steps=32),
                fingerprint=reference_fp, tolerances=Tolerances(0.07, 0.25))  # fmt: skip
    return judge_case(case, None, Path("baselines/x.yaml"))


def test_entry_names_rounds_and_options(outcome):
    e = benchmark_entry(outcome)
    assert (e.name, e.fullname, e.group) == (f"test_decode[{KEY}]", f"{TEST}[{KEY}]", "specperf")
    assert e.param == KEY and e.params == {"ctx": "8192", "kv": "contiguous", "bs": "1", "model": "x"}
    steps_ms = outcome.run.samples["step"]
    assert e.step_seconds == pytest.approx([ms / 1e3 for ms in steps_ms], rel=1e-15)
    assert e.options["min_rounds"] == 32 and e.options["warmup"] == outcome.run.warmup_steps


def test_extra_info_is_flat_figures_and_the_case(outcome):
    extra = benchmark_entry(outcome).extra_info
    json.dumps(extra, allow_nan=False)  # strict JSON
    run = outcome.run
    for p in ALL_PHASES:
        if p in run.summaries:
            assert extra[f"{p}_ms"] == pytest.approx(run.summaries[p].median, rel=1e-5)
        else:  # SGLang's scheduler host phases: only where some step timed them
            assert p in HOST_PHASES and f"{p}_ms" not in extra, p
    assert {"draft_ms", "verify_ms", "step_ms"} <= set(extra)
    assert extra["accept_len"] == pytest.approx(run.accept_len, rel=1e-5)
    assert (extra["verdict"], extra["engine"]) == ("NO_BASELINE", "reference tiny DFLASH")
    case = extra["specperf"]
    assert "metrics" not in case and "bottleneck" not in case  # derived, left out
    assert set(case["phases"]["verify"]) == {"n", "median", "mean", "center"}
    assert len(case["samples"]["step_ms"]) == 32


def test_a_case_round_trips_through_pytest_benchmarks_json(outcome, tmp_path):
    """Metadata and JSON written by pytest-benchmark's code, read by ``read_report``, and
    the run rebuilt from it has the gate's summaries."""
    e = benchmark_entry(outcome)
    meta = Metadata(e, iterations=1, options=dict(e.options))
    for s in e.step_seconds:
        meta.update(s)
    data = pytest_benchmark_generate_json(config=None, benchmarks=[meta], include_data=True,
                                          machine_info={"node": "n"}, commit_info={"id": "c0ffee"})
    data["specperf"] = run_header({"tolerance": 0.07, "step_tolerance": 0.25})
    path = tmp_path / "0001_x.json"
    path.write_text(json.dumps(data))
    report = read_report(path)
    assert (report.source, report.commit["id"], report.tolerance) == ("pytest-benchmark", "c0ffee", 0.07)
    [case] = report.cases
    assert (case.test, case.key) == (TEST, KEY)
    assert case.median_ms("verify") == pytest.approx(outcome.run.summaries["verify"].median, rel=1e-5)
    assert data["benchmarks"][0]["stats"]["median"] * 1e3 == pytest.approx(case.step_median_ms, rel=1e-5)
    rebuilt = run_from_case(path, case)
    for name, s in outcome.run.summaries.items():
        assert math.isclose(rebuilt.summaries[name].value, s.value, rel_tol=1e-9), name


def test_small_parts():
    assert case_params("ctx=1 kv=fragmented@0.5 bs=2 #2") == {"ctx": "1", "kv": "fragmented@0.5", "bs": "2"}
    assert engine_name({}) == "?"
    assert machine_entries({"kind": "cuda", "name": "NVIDIA H200"})["gpu"] == "NVIDIA H200"
    assert "gpu" not in machine_entries({"kind": "cpu", "name": "AMD EPYC"})
    assert machine_entries({"kind": "cpu", "x": math.inf})["specperf_device"]["x"] is None
    assert BENCHMARK_GROUP == "specperf" and run_header({})["schema_version"] == 1
