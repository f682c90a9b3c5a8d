"""A run is compared block by block only with runs of its own steps a round.

Block ``j`` of a case is the request of seed ``j`` (``server.decoder``), ``BLOCK_STEPS``
steps each: a 32-step run measures blocks 0-7, a 64-step run blocks 0-15. Folding the
longer run onto the shorter's blocks as two rounds would pair the requests of seeds 8-15
with those of seeds 0-7. So a stored baseline is judged only at its own steps (INVALID
otherwise, naming both and the two ways out), and a history run of other steps a round
does not count toward the noise between processes.

Runs are built from synthetic step records through the real summarizing and judging code
(``make_run`` in conftest: 4 steps a block).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_specperf.cli import compare
from pytest_specperf.judging.judge import Case, judge_case, steps_mismatch
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.store.history_runs import load_history
from pytest_specperf.store.rebuild import run_from_case
from pytest_specperf.store.report import read_report, report_payload, run_record_json, write_report

TEST, KEY = "perf_tests/t.py::test_d", "ctx=8192 kv=contiguous bs=1"
TOL = Tolerances(0.07, 0.25)


def _case(run, fp, history=()):
    return Case(nodeid=TEST, test=TEST, key=KEY, run=run, fingerprint=fp, tolerances=TOL,
                history=tuple(history))  # fmt: skip


def test_a_run_of_other_steps_than_the_baselines_is_invalid_naming_both_and_the_fix(
    make_run, make_case, reference_fp
):
    base = make_case(steps=16, seed=0)  # 4 blocks
    longer = judge_case(_case(make_run(steps=32, seed=1), reference_fp), base, Path("b.yaml"))
    assert longer.verdict.verdict is Verdict.INVALID
    assert not longer.verdict.metrics  # nothing was compared
    (why,) = longer.verdict.reasons
    assert "the baseline was recorded at 16 steps a round and this run measured 32" in why
    assert "measure it at 16 steps (--specperf-steps, or the marker's or specperf.decode's" in why
    assert "re-record the baseline at 32 steps with --specperf-update-baselines" in why
    # an update at the new steps is what the line asks: it says what the update does
    update = judge_case(_case(make_run(steps=32, seed=1), reference_fp), base, Path("b.yaml"),
                        record=True)  # fmt: skip
    assert update.verdict.verdict is Verdict.INVALID and update.recorded
    assert update.verdict.reasons[0].endswith(
        "(this update records the case at 32 steps and drops the old runs)"
    )
    # 24 steps (6 blocks) would not even fold: the same refusal, not an unpaired verdict
    odd = judge_case(_case(make_run(steps=24, seed=1), reference_fp), base, Path("b.yaml"))
    assert odd.verdict.verdict is Verdict.INVALID
    assert "this run measured 24" in odd.verdict.reasons[0]
    # the baseline's own steps: compared as ever
    same = judge_case(_case(make_run(steps=16, seed=1), reference_fp), base, Path("b.yaml"))
    assert same.verdict.verdict is not Verdict.INVALID and same.verdict.metrics


def test_an_extended_run_is_compared_by_its_first_rounds_steps(make_run, make_case, reference_fp):
    """The automatic extension measures the first round's blocks again: 2 rounds of 16
    steps are 32 steps of the baseline's 4 blocks, not a run of 32 steps."""
    base = make_case(steps=16, seed=0)
    extended = dataclasses.replace(make_run(steps=32, seed=1), rounds=2, round_steps=16)
    assert steps_mismatch(_case(extended, reference_fp), base) is None
    other = dataclasses.replace(make_run(steps=64, seed=1), rounds=2, round_steps=32)
    assert "this run measured 32" in (steps_mismatch(_case(other, reference_fp), base) or "")
    # several rounds whose first round's steps are unknown (a report from before they
    # were written): no claim either way
    unknown = dataclasses.replace(make_run(steps=64, seed=1), rounds=2, round_steps=0)
    assert steps_mismatch(_case(unknown, reference_fp), base) is None


def _night(path: Path, runs, fp, day: int) -> None:
    case = {"test": TEST, "key": KEY, "verdict": "SAME", "step_ms": {"median": 40.0},
            "metrics": [], "fingerprint": fp, "labels": {},
            "runs": [run_record_json(r) for r in runs]}  # fmt: skip
    data = {"schema_version": 1, "datetime": f"2026-11-{day:02d}T00:00:00+00:00",
            "cases": [case]}  # fmt: skip
    path.write_text(json.dumps(data))


def test_history_runs_of_other_steps_do_not_count(tmp_path, make_run, make_case, reference_fp):
    """Nights at 32 steps (8 blocks) fold onto a 16-step baseline's 4 blocks by length
    alone; they are other requests, and the judge leaves them out."""
    _night(tmp_path / "a.json", [make_run(steps=16, seed=s) for s in (1, 2)], reference_fp, 1)
    _night(tmp_path / "b.json", [make_run(steps=32, seed=s) for s in (3, 4, 5)], reference_fp, 2)
    history = load_history(tmp_path).of(TEST, KEY)
    assert sorted(h.round_steps for h in history) == [16, 16, 32, 32, 32]
    base = make_case(steps=16, seed=0)
    outcome = judge_case(_case(make_run(steps=16, seed=9), reference_fp, history), base,
                         Path("b.yaml"))  # fmt: skip
    verify = next(m for m in outcome.verdict.metrics if m.metric == "verify")
    assert verify.history_runs == 2  # a.json's two; b.json's three measured other blocks


def test_a_reports_round_steps_are_read_back_and_a_bad_one_is_skipped(
    tmp_path, make_run, reference_fp
):
    def night(name, day, **fields):
        rec = run_record_json(make_run(steps=16, seed=1))
        for k, v in fields.items():
            if v is None:
                rec.pop(k, None)
            else:
                rec[k] = v
        data = {"schema_version": 1, "datetime": f"2026-11-{day:02d}T00:00:00+00:00",
                "cases": [{"test": TEST, "key": KEY, "verdict": "SAME",
                           "step_ms": {"median": 40.0}, "metrics": [],
                           "fingerprint": reference_fp, "labels": {}, "runs": [rec]}]}  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(data))

    night("written", 1)  # round_steps as the report writes it: the run's 16
    night("older", 2, round_steps=None)  # before round_steps: one round, its steps
    night("older-extended", 3, round_steps=None, rounds=2)  # unknown: kept, no claim
    night("bad", 4, round_steps=0)
    history = load_history(tmp_path)
    runs = history.of(TEST, KEY)
    assert sorted((r.round_steps or 0) for r in runs) == [0, 16, 16]
    skipped = " | ".join(history.skipped)
    assert "bad.json" in skipped
    assert "runs[0].round_steps: expected a whole number of at least 1, got 0" in skipped


def test_compare_refuses_runs_of_other_steps_and_reads_an_extended_runs_first_round(
    tmp_path, make_run, reference_fp
):
    def write(path, run):
        outcome = judge_case(_case(run, reference_fp), None, Path("b.yaml"))
        header = {"tolerance": 0.07, "step_tolerance": 0.25,
                  "datetime": "2026-05-01T02:00:00+00:00"}  # fmt: skip
        write_report(path, report_payload(header, [outcome]))
        return read_report(path)

    a = write(tmp_path / "a.json", make_run(steps=16, seed=0))
    longer = write(tmp_path / "b.json", make_run(steps=32, seed=1))
    (out,) = compare.compare_runs(a, longer)
    assert out.verdict.verdict is Verdict.INVALID
    assert "recorded at 16 steps a round and this run measured 32" in out.verdict.reasons[0]
    extended = dataclasses.replace(make_run(steps=32, seed=1), rounds=2, round_steps=16)
    b = write(tmp_path / "c.json", extended)
    assert run_from_case(b.path, b.cases[0]).round_steps == 16  # read back from the report
    (out,) = compare.compare_runs(a, b)
    assert out.verdict.verdict is not Verdict.INVALID, out.verdict.reasons
    # run A extended (2 rounds of 16): its rounds' steps, not its total, meet B's
    (out,) = compare.compare_runs(b, longer)
    assert "recorded at 16 steps a round and this run measured 32" in out.verdict.reasons[0]
    (out,) = compare.compare_runs(b, a)
    assert out.verdict.verdict is not Verdict.INVALID, out.verdict.reasons


def test_a_reference_whose_processes_took_other_rounds_is_one_rounds_steps(
    make_run, reference_fp
):
    """The extension can give a case's first process a second round and stop before the
    next's: the processes' totals differ (32 and 16 steps), their rounds' steps do not."""
    from pytest_specperf.judging.judge import as_baseline, baseline_round_steps

    first = dataclasses.replace(make_run(steps=32, seed=0), rounds=2, round_steps=16)
    second = make_run(steps=16, seed=1)
    ref = as_baseline(_case(dataclasses.replace(first, siblings=(second,)), reference_fp),
                      at="2026-12-07T12:00:00+00:00")  # fmt: skip
    assert [r.round_steps for r in ref.runs] == [16, 16] and ref.steps == 32
    assert baseline_round_steps(ref) == 16
    assert steps_mismatch(_case(make_run(steps=16, seed=2), reference_fp), ref) is None
