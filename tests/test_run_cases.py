"""The run pipeline's judging step (``run.cases``) on small named data: case keys, the
baseline looked up in the run's inputs, one case judged and stamped for recording. The
server is a test double holding only what the step reads (fingerprint, info, backend)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_specperf.judging.significance import MAX_LOOKS, Family
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.run.cases import CaseRefused, CaseRequest, Policy, judge_one
from pytest_specperf.run.inputs import RunInputs
from pytest_specperf.store.baselines import BaselineError, load_baselines, write_baselines

TEST = "perf_tests/t.py::test_d"
KEY = "ctx=8192 kv=contiguous bs=1"
REQUEST = CaseRequest(
    nodeid=f"{TEST}[8192]", test=TEST, params="", tolerances=Tolerances(0.1, 0.05),
    gates=None, budgets=None,
)  # fmt: skip
NOT_STRICT = Policy(record=False, strict=False, gpu_run=False)


def _server(fingerprint):
    """A test double of a ModelServer: what judging a case reads of it."""
    backend = SimpleNamespace(kv_bytes_per_token=lambda info: None)
    return SimpleNamespace(fingerprint=fingerprint, speculative=True, backend=backend,
                           server_info={"pid": 7})  # fmt: skip


def _inputs(bf=None, error=None, path=Path("b.yaml")):
    return RunInputs(None, path, bf, error, None, (), None)  # type: ignore[arg-type]


def test_case_keys_carry_the_tests_parameters_and_number_repeats(make_run):
    run = make_run()
    request = CaseRequest(TEST, TEST, " model=tiny", Tolerances(0.1, 0.05), None, None)
    assert request.keys([run, run, run]) == [
        f"{KEY} model=tiny", f"{KEY} model=tiny #2", f"{KEY} model=tiny #3",
    ]  # fmt: skip


def test_a_case_is_judged_against_its_baseline_and_stamped_only_when_recording(
    tmp_path, make_case, make_run, reference_fp
):
    path = tmp_path / "b.yaml"
    write_baselines(path, {"name": "box"}, [make_case()])
    inputs, server = _inputs(load_baselines(path), path=path), _server(reference_fp)
    judged = judge_one(inputs, REQUEST, server, make_run(), KEY, "b.yaml", NOT_STRICT, None)
    assert judged.outcome.baseline is not None and judged.outcome.key == KEY
    assert judged.outcome.verdict.verdict is not Verdict.NO_BASELINE
    assert judged.to_record is None and judged.unjudged == ()
    recording = Policy(record=True, strict=False, gpu_run=False)
    judged = judge_one(inputs, REQUEST, server, make_run(), KEY, "b.yaml", recording, None)
    assert judged.to_record is not None
    assert (judged.to_record.test, judged.to_record.key) == (TEST, KEY)


def test_no_baseline_file_and_an_unusable_one(make_run, reference_fp):
    server = _server(reference_fp)
    judged = judge_one(_inputs(), REQUEST, server, make_run(), KEY, "b.yaml", NOT_STRICT, None)
    assert judged.outcome.verdict.verdict is Verdict.NO_BASELINE
    error = BaselineError(Path("b.yaml"), "schema_version is 99")
    with pytest.raises(CaseRefused, match="schema_version is 99"):
        judge_one(_inputs(error=error), REQUEST, server, make_run(), KEY, "b.yaml", NOT_STRICT,
                  None)  # fmt: skip


def test_a_case_is_judged_at_the_look_of_its_rounds(tmp_path, make_case, make_run, reference_fp):
    """With the automatic extension (4 looks) a run of ``r`` rounds is judged at look ``r``
    of the Pocock-type boundary (the extension's own counter; at most the last look);
    without it, one look at the whole share."""
    path = tmp_path / "b.yaml"
    write_baselines(path, {"name": "box"}, [make_case()])
    inputs, server = _inputs(load_baselines(path), path=path), _server(reference_fp)
    extended = dataclasses.replace(REQUEST, looks=MAX_LOOKS)
    for rounds, look in ((1, 1), (2, 2), (4, 4), (9, 4)):
        run = dataclasses.replace(make_run(), rounds=rounds)
        judged = judge_one(inputs, extended, server, run, KEY, "b.yaml", NOT_STRICT, None)
        family = judged.case.family
        assert family == Family(looks=MAX_LOOKS, look=look)
        metrics = judged.outcome.verdict.metrics
        first = family.gate_alpha(len(metrics))
        assert metrics and min(m.alpha for m in metrics) == pytest.approx(first)
    run = dataclasses.replace(make_run(), rounds=3)
    judged = judge_one(inputs, REQUEST, server, run, KEY, "b.yaml", NOT_STRICT, None)
    assert judged.case.family == Family()
