"""Strict judging, the case view workers send, Markdown rendering, GPU pinning and the
recorded-case wire form: pure logic on small named data (no server, no pytest run)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_specperf.judging.judge import Case, judge_case
from pytest_specperf.judging.strict import silent_phases, unjudged
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.plugin.xdist import order_cases, worker_gpu
from pytest_specperf.reporting.markdown import markdown_summary, markdown_table
from pytest_specperf.reporting.terminal import RunSummary, run_summary
from pytest_specperf.reporting.view import CaseView
from pytest_specperf.store.baselines import case_from_json, case_to_json
from pytest_specperf.store.report import (
    CaseRecord,
    case_json,
    payload_of_cases,
    read_report,
    strict,
    write_report,
)
from pytest_specperf.telemetry.summary import TelemetrySummary

ROOT = Path(__file__).resolve().parents[1]
TEST = "perf_tests/t.py::test_d"
KEY = "ctx=8192 kv=contiguous bs=1"
ALL_SEVEN = frozenset(
    ("schedule", "draft", "build_verify_input", "prepare_for_verify", "verify", "accept",
     "kv_commit")
)  # fmt: skip


def _case(run, reference_fp, key=KEY):
    return Case(nodeid=f"{TEST}[x]", test=TEST, key=key, run=run, fingerprint=reference_fp,
                tolerances=Tolerances(phase=0.07, step=0.25))  # fmt: skip


@pytest.fixture
def outcome_of(make_run, make_case, reference_fp):
    """Judge a synthetic run (``make_run`` keywords) against a baseline of the same
    synthetic case (or none), through the real judge. The baseline holds three sittings
    (as one updated on three days does): a one-sitting baseline's step band carries the
    device prior's sitting term and may read UNSTABLE (docs/statistics.md)."""

    def judge(base=True, **run_kw):
        found = None
        if base:
            sittings = [make_case(seed=100 + i, sitting=f"s{i}") for i in range(3)]
            found = dataclasses.replace(
                sittings[0], runs=tuple(r for c in sittings for r in c.runs)
            )
        run = make_run(**run_kw)
        return judge_case(_case(run, reference_fp), found, Path("baselines/box.yaml"),
                          missing="no baseline file baselines/box.yaml")  # fmt: skip

    return judge


# -- strict -------------------------------------------------------------------------------


def test_a_compared_whole_case_counts_as_judged(outcome_of):
    o = outcome_of(seed=0)
    assert o.verdict.verdict is Verdict.SAME
    assert unjudged(o, mapped=ALL_SEVEN, gpu_run=False) == ()


def test_no_baseline_is_not_judged_unless_recording(outcome_of):
    o = outcome_of(base=False)
    (problem,) = unjudged(o, mapped=ALL_SEVEN, gpu_run=False)
    assert problem.label == "NO_BASELINE"
    assert "no baseline file baselines/box.yaml" in problem.detail
    assert unjudged(o, mapped=ALL_SEVEN, gpu_run=False, recording=True) == ()


def test_invalid_and_unstable_are_not_judged(outcome_of):
    o = outcome_of()
    for v in (Verdict.INVALID, Verdict.UNSTABLE):
        changed = dataclasses.replace(o, verdict=dataclasses.replace(o.verdict, verdict=v))
        assert [p.label for p in unjudged(changed, mapped=None, gpu_run=False)] == [v.value]


def test_a_mapped_phase_that_recorded_nothing_is_named(outcome_of):
    o = outcome_of(factors={"build_verify_input": 0.0})
    assert silent_phases(o, ALL_SEVEN) == ["build_verify_input"]
    labels = [p.label for p in unjudged(o, mapped=ALL_SEVEN, gpu_run=False, recording=True)]
    assert labels == ["no time recorded for build_verify_input"]
    # a phase the backend does not map (NONE: no drafter) may be zero
    assert silent_phases(o, ALL_SEVEN - {"build_verify_input"}) == []
    assert unjudged(o, mapped=None, gpu_run=False, recording=True) == ()


def test_missing_telemetry_fails_only_a_gpu_run(outcome_of):
    o = outcome_of()
    assert unjudged(o, mapped=None, gpu_run=False) == ()
    (problem,) = unjudged(o, mapped=None, gpu_run=True,
                          telemetry_note="telemetry unavailable: pynvml is not installed")  # fmt: skip
    assert problem.label == "telemetry unavailable"
    assert "on a GPU run: pynvml is not installed" in problem.detail
    run = dataclasses.replace(o.run, telemetry=TelemetrySummary(True, samples=10))
    assert unjudged(dataclasses.replace(o, run=run), mapped=None, gpu_run=True) == ()


def test_backends_say_which_phases_they_map(tmp_path):
    from pytest_specperf.engines.reference.backend import ReferenceBackend
    from pytest_specperf.engines.sglang.backend import SGLangBackend

    ref = ReferenceBackend()
    assert ref.mapped_phases({"fingerprint": {"speculative_algorithm": "DFLASH"}}) == ALL_SEVEN
    assert ref.mapped_phases({"fingerprint": {"speculative_algorithm": "NONE"}}) == (
        ALL_SEVEN - {"draft", "build_verify_input"}
    )
    sgl = SGLangBackend()
    sgl.bind(tmp_path)
    assert sgl.mapped_phases({}) is None  # no scheduler reported yet: nothing to check
    report = {"installed": [
        {"target": "w.verify", "role": "phase", "phase": "verify"},
        {"target": "w.sample", "role": "phase", "phase": "draft", "optional": True},
        {"target": "w.step", "role": "step"},
    ]}  # fmt: skip
    (tmp_path / "hooks-pid1-rank0.json").write_text(json.dumps(report))
    assert sgl.mapped_phases({}) == {"verify"}


# -- the case view --------------------------------------------------------------------------


def test_case_view_survives_the_wire(outcome_of):
    """What a worker sends is what the controller reports (through real JSON text)."""
    o = outcome_of(factors={"verify": 1.5})
    view = CaseView.of(o, baseline_file="baselines/box.yaml", failure="verify +50%",
                       unjudged=("UNSTABLE",))  # fmt: skip
    back = CaseView.from_json(json.loads(json.dumps(view.to_json(), allow_nan=False)))
    assert back.to_json() == view.to_json()
    assert back.metrics == view.metrics and back.verdict is o.verdict.verdict
    assert back.record.data["key"] == KEY and back.record.data["samples"]["step_ms"]
    summary = RunSummary("reference", "box", "baselines/box.yaml", 0.07, 0.25, False)
    assert run_summary(summary, [back]) == run_summary(summary, [view])


def test_case_view_refuses_a_broken_form(outcome_of):
    data = CaseView.of(outcome_of(), baseline_file="b.yaml").to_json()
    del data["record"]["verdict"]
    with pytest.raises(ValueError, match="not a case view"):
        CaseView.from_json(data)


def test_recorded_case_survives_the_wire(make_case):
    case = make_case(pid=4711, at="2026-01-02T03:04:05+00:00")
    back = case_from_json(json.loads(json.dumps(case_to_json(case))))
    assert back == case
    # pytest-xdist's wire (execnet) takes plain types only, not dict subclasses
    from execnet.gateway_base import dumps_internal, loads_internal

    assert case_from_json(loads_internal(dumps_internal(case_to_json(case)))) == case
    broken = case_to_json(case)
    broken["fingerprint"]["engine_version"] = "9.9"  # no longer the hash the case names
    with pytest.raises(ValueError, match="fingerprint hash"):
        case_from_json(broken)


def test_one_record_is_written_sent_and_read_back(outcome_of, tmp_path):
    """The view's record is the JSON report's case, and ``read_report`` gives back that
    record type; the view's reasons are the verdict's, the judge's notes written after."""
    o = dataclasses.replace(outcome_of(factors={"verify": 1.5}), notes=("cross-check: x",))
    view = CaseView.of(o, baseline_file="b.yaml")
    assert view.record.to_json() == strict(case_json(o))
    assert view.reasons == o.verdict.reasons and view.record.data["reasons"][-1] == o.notes[0]
    path = tmp_path / "run.json"
    write_report(path, payload_of_cases({}, [view.record]))
    (back,) = read_report(path).cases
    assert isinstance(back, CaseRecord) and back.to_json() == view.record.to_json()
    assert back.verdict_reasons == view.reasons and back.key == view.key


def test_the_views_words_are_read_from_its_record(outcome_of):
    """Budgets and diagnosis: what the terminal and Markdown print of a worker's case is
    read from the record it sent, the same words as of the judged case."""
    from pytest_specperf.judging.budgets import Budgets, check_budgets
    from pytest_specperf.reporting.view import diagnosis_lines

    o = outcome_of(factors={"verify": 1.5})
    limits = Budgets(max_step_ms=1e-3, max_unaccounted_share=1.0, min_active_share=0.99)
    o = dataclasses.replace(o, budgets=check_budgets(o.run, limits))
    assert o.bottleneck is not None and len(o.over_budget) == 2  # step, active share
    view = CaseView.of(o, baseline_file="b.yaml")
    back = CaseView.from_json(json.loads(json.dumps(view.to_json(), allow_nan=False)))
    assert back.diagnosis == tuple(diagnosis_lines(o)) and len(back.diagnosis) > 4
    assert back.over_budget == tuple(b.describe() for b in o.over_budget)


def _renamed(view: CaseView, nodeid: str, key: str) -> CaseView:
    data = {**view.record.data, "nodeid": nodeid, "key": key}
    return dataclasses.replace(view, record=CaseRecord.from_json(data))


def test_cases_are_reported_in_collection_order(outcome_of):
    views = [
        _renamed(CaseView.of(outcome_of(), baseline_file="b"), n, k)
        for n, k in (("t.py::b", "2"), ("t.py::a", "1"), ("t.py::b", "3"))
    ]
    ordered = order_cases(views, ["t.py::a", "t.py::b"])
    assert [v.key for v in ordered] == ["1", "2", "3"]


# -- Markdown ---------------------------------------------------------------------------------


def _table_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown document's table rows (header and rule included)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| "):
            cells = [c.strip().replace("\\|", "|") for c in line.strip("|").split(" | ")]
            rows.append(cells)
    return rows


def test_markdown_table_escapes_pipes():
    rows = _table_rows("\n".join(markdown_table(["a", "b|c"], [["x|y", "1"]])))
    assert rows[0] == ["a", "b|c"] and rows[2] == ["x|y", "1"]


def test_markdown_summary_holds_table_failure_telemetry_files_and_strict(outcome_of):
    slower = outcome_of(factors={"verify": 1.5})
    assert slower.verdict.verdict is Verdict.SLOWER
    views = [
        CaseView.of(slower, baseline_file="baselines/box.yaml",
                    failure="verify +50.0% (...)\nwhere the time went: ...\nbottleneck: ..."),
        CaseView.of(outcome_of(base=False), baseline_file="baselines/box.yaml",
                    unjudged=("NO_BASELINE",)),
    ]  # fmt: skip
    s = RunSummary("reference", "box", "baselines/box.yaml", 0.07, 0.25, False,
                   telemetry_note="telemetry unavailable: no CUDA device (CPU run); host-side view",
                   json_path="out/report.json", strict=True)  # fmt: skip
    text = markdown_summary(s, views)
    rows = _table_rows(text)
    assert rows[0][0] == "case" and rows[0][-1] == "verdict"
    assert rows[2][0] == f"test_d {KEY}" and rows[2][-1] == "SLOWER"
    assert rows[3][-1] == "NO_BASELINE"
    assert "#### test_d ctx=8192 kv=contiguous bs=1: SLOWER" in text
    assert "where the time went: ..." in text and "bottleneck: ..." in text
    assert "telemetry unavailable: no CUDA device (CPU run); host-side view" in text
    assert "JSON report: `out/report.json`, picture: `out/report.svg`" in text
    last = text.rstrip().splitlines()[-1]
    assert last == f"**strict: judged 1 of 2 cases; not judged: test_d {KEY} (NO_BASELINE)**"


def test_strict_summary_line_is_last_and_absent_without_strict(outcome_of):
    views = [CaseView.of(outcome_of(), baseline_file="b", unjudged=())]
    s = RunSummary("reference", "box", "b", 0.07, 0.25, False, errors=("boom",), strict=True)
    lines = run_summary(s, views)
    assert lines[-2] == "ERROR: boom" and lines[-1] == "strict: judged 1 of 1 cases"
    assert not any(line.startswith("strict:") for line in run_summary(dataclasses.replace(s, strict=False), views))


# -- GPU per worker ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("worker", "workers", "visible", "expected"),
    [
        ("gw0", 2, None, "0"),
        ("gw1", 2, None, "1"),
        ("gw1", 2, "4,6", "6"),
        ("gw0", 2, "GPU-aaa, GPU-bbb", "GPU-aaa"),
        ("gw3", 2, None, "1"),  # a restarted worker takes over a slot
        ("gw0", 2, "", None),  # every GPU hidden: a CPU run, left alone
    ],
)
def test_each_worker_gets_its_own_gpu(worker, workers, visible, expected):
    assert worker_gpu(worker, workers, visible) == expected


# -- packaging ----------------------------------------------------------------------------------


def test_core_requirements_leave_a_users_sglang_alone():
    """Only the sglang extra names SGLang: pip install pytest-specperf (no extra) never
    replaces a user's own SGLang build or fork (.ci/run checks it with pip itself)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(r.lower().startswith("sglang") for r in project["dependencies"])
    extras = project["optional-dependencies"]
    assert [name for name, reqs in extras.items()
            if any(r.lower().startswith("sglang") for r in reqs)] == ["sglang"]  # fmt: skip
    assert any(r.startswith("pytest-xdist") for r in extras["perf"])  # dev takes perf via test
    assert "pytest-specperf[test]" in extras["dev"] and "pytest-specperf[perf,history]" in extras["test"]


def test_the_ab_header_counts_each_side_as_run():
    """Two server processes a side, or one running server as A (measured again in turn):
    the header says which, as the JSON's ``reference_processes`` does."""
    from pytest_specperf.reporting.terminal import RunSummary, head_lines

    both = RunSummary("reference", "box", "b", 0.07, 0.25, False, processes=2,
                      ab="args=--draft-steps 3")  # fmt: skip
    assert head_lines(both)[0].endswith(", 2 server processes per side, alternating A B B A")
    url = dataclasses.replace(both, ab="url=http://127.0.0.1:9")
    assert head_lines(url)[0].endswith(
        ", A one running server, B 2 server process(es), alternating A B B A"
    )
