"""The run pipeline's judging step (``run.cases``) on small named data: case keys, the
baseline looked up in the run's inputs, one case judged and stamped for recording. The
server is a test double holding only what the step reads (fingerprint, info, backend)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

import pytest_specperf.run.cases as cases_module
from pytest_specperf.judging.ab import abba_order, describe_order
from pytest_specperf.judging.significance import MAX_LOOKS, Family
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.run.cases import (
    CaseRefused,
    CaseRequest,
    Policy,
    Reference,
    judge_ab,
    judge_one,
    undecided_ab,
)
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
    of Pocock's constant boundary (the extension's own counter; at most the last look);
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


def test_an_ab_case_is_judged_at_its_looks_not_its_processes_rounds(
    monkeypatch, make_run, reference_fp
):
    """With one process a side (order ``A1 B1 B1 A1``) B's process has 2 rounds at the
    first look: the case is judged at look ``len(order)`` (one entry per look), so the
    first look gets look 1's level, not look 2's; the extension asks at the same look."""
    order = describe_order(abba_order(1, 1))
    server = _server(reference_fp)
    reference = Reference(_server(reference_fp), "url=http://127.0.0.1:1")
    extended = dataclasses.replace(REQUEST, looks=MAX_LOOKS)
    seen: list[Family] = []
    real = cases_module.more_steps_would_decide

    def spy(case, base):  # a test double around the real function: records the family
        seen.append(case.family)
        return real(case, base)

    monkeypatch.setattr(cases_module, "more_steps_would_decide", spy)
    for looks, rounds in ((1, 2), (2, 4), (3, 6), (4, 8)):
        b = dataclasses.replace(make_run(), rounds=rounds)
        a = dataclasses.replace(make_run(seed=1), rounds=rounds)
        judged = judge_ab(_inputs(), extended, server, b, reference, a, KEY, NOT_STRICT, None,
                          order=(order,) * looks)  # fmt: skip
        assert judged.case.family == Family(looks=MAX_LOOKS, look=looks)
        undecided_ab(_inputs(), extended, server, reference, [])(a, b, looks)
        assert seen[-1] == Family(looks=MAX_LOOKS, look=looks)


def test_a_case_with_a_non_finite_step_median_is_named_when_it_cannot_be_reported(
    make_run, reference_fp
):
    """``CaseRecord.of`` (every report of a judged case) refuses a step median that JSON
    cannot hold, naming the case, not with a bare ``float()`` error."""
    from pytest_specperf.judging.metrics import STEP
    from pytest_specperf.store.report import CaseRecord

    judged = judge_one(_inputs(), REQUEST, _server(reference_fp), make_run(), KEY, "b.yaml",
                       NOT_STRICT, None)  # fmt: skip
    run = judged.outcome.run
    step = dataclasses.replace(run.summaries[STEP], median=float("nan"))
    broken = dataclasses.replace(run, summaries={**run.summaries, STEP: step})
    outcome = dataclasses.replace(judged.outcome, run=broken)
    with pytest.raises(ValueError, match=rf"{TEST} \[{KEY}\]: the case cannot be reported: "
                       "step_ms.median"):  # fmt: skip
        CaseRecord.of(outcome)
    assert CaseRecord.of(judged.outcome).step_median_ms == run.summaries[STEP].median


def test_history_runs_go_to_runs_of_the_mode_they_were_measured_in(make_run, reference_fp):
    """``--specperf-history``: an A/B run takes the earlier A/B runs' tested processes as
    evidence of the between-process noise, beside its own; a stored-baseline run the
    earlier stored-baseline runs; neither takes the other's (an A/B run's processes live
    side by side and spread otherwise)."""
    from pytest_specperf.judging.baselines import fingerprint_hash
    from pytest_specperf.judging.judge import HistoryRun
    from pytest_specperf.store.history_runs import History

    h = fingerprint_hash(reference_fp)
    ab_run = HistoryRun(h, "ab.json [k]", make_run(seed=5).summaries, "report ab.json", ab=True)
    stored_run = HistoryRun(h, "n.json [k]", make_run(seed=6).summaries, "report n.json")
    history = History({(TEST, KEY): (ab_run, stored_run)}, 2, ())
    inputs = RunInputs(None, Path("b.yaml"), None, None, history, (), None)  # type: ignore[arg-type]
    assert inputs.history_of(TEST, KEY) == (stored_run,)
    assert inputs.history_of(TEST, KEY, ab=True) == (ab_run,)
    server, reference = _server(reference_fp), Reference(_server(reference_fp), "url=http://127.0.0.1:1")
    order = (describe_order(abba_order(1, 1)),)
    b, a = make_run(), make_run(seed=1)
    with_history = judge_ab(inputs, REQUEST, server, b, reference, a, KEY, NOT_STRICT, None,
                            order=order)  # fmt: skip
    alone = judge_ab(_inputs(), REQUEST, server, b, reference, a, KEY, NOT_STRICT, None,
                     order=order)  # fmt: skip
    assert with_history.case.history[-1] is ab_run
    assert stored_run not in with_history.case.history
    assert len(with_history.case.history) == len(alone.case.history) + 1
    counted = {m.metric: m.history_runs for m in with_history.outcome.verdict.metrics}
    before = {m.metric: m.history_runs for m in alone.outcome.verdict.metrics}
    assert any(counted[k] == before[k] + 1 for k in before)  # the verdict counts it
    stored = judge_one(inputs, REQUEST, server, make_run(), KEY, "b.yaml", NOT_STRICT, None)
    assert stored.case.history == (stored_run,)
