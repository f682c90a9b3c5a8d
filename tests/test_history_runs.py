"""``--specperf-history``: earlier runs read back from our JSON reports (no servers)."""

from __future__ import annotations

import json
import os

from pytest_specperf.judging.baselines import fingerprint_hash
from pytest_specperf.judging.judge import Case, judge_case
from pytest_specperf.judging.verdict import Tolerances
from pytest_specperf.store.history_runs import load_history
from pytest_specperf.store.report import run_record_json

TEST, KEY = "perf_tests/t.py::test_d", "ctx=8192 kv=contiguous bs=1"


def _report(path, runs, *, verdict="SAME", created=None, inject=None, fp, key=KEY):
    case = {"test": TEST, "key": key, "verdict": verdict, "step_ms": {"median": 40.0},
            "metrics": [], "fingerprint": fp, "labels": {"inject": inject} if inject else {},
            "runs": [run_record_json(r) for r in runs]}  # fmt: skip
    data = {"schema_version": 1, "cases": [case]}
    if created:
        data["datetime"] = created
    path.write_text(json.dumps(data))


def test_runs_are_read_and_unusable_ones_skipped_with_the_reason(tmp_path, make_run, reference_fp):
    fp = reference_fp
    _report(tmp_path / "n1.json", [make_run(seed=1)], created="2026-11-01T00:00:00+00:00", fp=fp)
    _report(tmp_path / "n2.json", [make_run(seed=2), make_run(seed=3)], fp=fp,
            created="2026-11-02T00:00:00+00:00")  # fmt: skip
    _report(tmp_path / "canary.json", [make_run(seed=4)], inject="verify=1.1", fp=fp)
    _report(tmp_path / "regressed.json", [make_run(seed=5)], verdict="SLOWER", fp=fp)
    (tmp_path / "torn.json").write_text('{"schema_version": 1, "cases": [')
    old = {"schema_version": 1, "cases": [{"test": TEST, "key": KEY, "verdict": "SAME",
                                           "step_ms": {"median": 1.0}}]}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    bad = run_record_json(make_run(seed=6))
    bad["values"]["step"] = -1.0
    data = json.loads((tmp_path / "n1.json").read_text())
    data["cases"][0]["runs"] = [bad]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    history = load_history(tmp_path)
    runs = history.of(TEST, KEY)
    assert len(runs) == 3  # n1 (1 run) and n2 (2 runs); the rest left out
    assert {r.fingerprint_hash for r in runs} == {fingerprint_hash(fp)}
    assert [r.source.split(" ")[0] for r in runs] == ["n1.json", "n2.json", "n2.json"]
    # a report's server processes share its sitting: their spread is process noise
    assert [r.sitting for r in runs] == ["report n1.json", "report n2.json", "report n2.json"]
    skipped = " | ".join(history.skipped)
    assert "torn.json" in skipped and "old.json" in skipped and "older than" in skipped
    assert "bad.json" in skipped and "values.step: must be > 0" in skipped
    assert "regressed.json [ctx=8192 kv=contiguous bs=1]: judged SLOWER, not noise" in skipped
    assert "history: 3 run(s) of 1 case(s)" in history.describe("nightly")


def test_a_runs_rounds_are_read_back_and_a_bad_count_is_skipped(tmp_path, make_run, reference_fp):
    """A night whose automatic extension measured 2 rounds keeps them (the levels fold its
    blocks onto one round); a rounds count that is not a whole number >= 1 leaves the
    run out, naming the field; a report from before runs carried rounds reads as 1."""
    def night(name, rounds):
        rec = run_record_json(make_run(seed=1))
        if rounds is None:
            del rec["rounds"]
        else:
            rec["rounds"] = rounds
        data = {"schema_version": 1, "datetime": f"2026-11-0{len(name)}T00:00:00+00:00",
                "cases": [{"test": TEST, "key": KEY, "verdict": "SAME", "step_ms": {"median": 40.0},
                           "metrics": [], "fingerprint": reference_fp, "labels": {},
                           "runs": [rec]}]}  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(data))

    night("two", 2)
    night("zero", 0)
    night("older", None)
    history = load_history(tmp_path)
    runs = history.of(TEST, KEY)
    assert sorted(r.metrics["step"].rounds for r in runs) == [1, 2]
    assert "zero.json" in " | ".join(history.skipped)
    assert "runs[0].rounds: expected a whole number of at least 1, got 0" in " | ".join(history.skipped)


def test_a_count_metric_is_range_checked_as_a_count_not_as_tokens(tmp_path, make_run,
                                                                   reference_fp):  # fmt: skip
    """``runq.slices`` counts CPU timeslices per step (unit ``1/step``): a case averaging
    2e4 of them is a measurement, not a token count out of range; 1e12 is not one."""
    from pytest_specperf.judging.metrics import ACCEPT_LEN, RUNQ_SLICES
    from pytest_specperf.store.baseline_schema import range_kind

    assert range_kind(RUNQ_SLICES) == "count" and range_kind(ACCEPT_LEN) == "length"
    for name, slices in (("busy.json", 2e4), ("absurd.json", 1e12)):
        run = run_record_json(make_run(seed=1))
        run["values"][RUNQ_SLICES] = slices
        _report(tmp_path / name, [make_run(seed=1)], fp=reference_fp)
        data = json.loads((tmp_path / name).read_text())
        data["cases"][0]["runs"] = [run]
        (tmp_path / name).write_text(json.dumps(data))
    history = load_history(tmp_path)
    assert [r.source.split(" ")[0] for r in history.of(TEST, KEY)] == ["busy.json"]
    skipped = " | ".join(history.skipped)
    assert "busy.json" not in skipped
    assert "absurd.json" in skipped and "physical range of a count" in skipped
    assert "tokens" not in skipped


def test_only_the_newest_reports_are_read(tmp_path, make_run, reference_fp):
    for i in range(5):
        path = tmp_path / f"night{i}.json"
        _report(path, [make_run(seed=i)], fp=reference_fp)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # no "created": file times
    history = load_history(tmp_path, limit=2)
    assert history.reports == 2
    assert [r.source.split(" ")[0] for r in history.of(TEST, KEY)] == ["night3.json", "night4.json"]


def test_a_canary_report_does_not_push_a_night_out(tmp_path, make_run, reference_fp):
    """The newest ``limit`` reports that hold runs: a canary's (every case injected) is
    read and left out without counting; an A/B report's runs are marked as such."""
    _report(tmp_path / "night1.json", [make_run(seed=1)], fp=reference_fp,
            created="2026-11-01T00:00:00+00:00")  # fmt: skip
    _report(tmp_path / "night2.json", [make_run(seed=2), make_run(seed=3)], fp=reference_fp,
            created="2026-11-02T00:00:00+00:00")  # fmt: skip
    _report(tmp_path / "canary.json", [make_run(seed=4)], inject="verify=1.05", fp=reference_fp,
            created="2026-11-03T00:00:00+00:00")  # fmt: skip
    data = json.loads((tmp_path / "night2.json").read_text())
    data["cases"][0]["ab"] = {"reference": "python=/opt/release/bin/python"}
    (tmp_path / "night2.json").write_text(json.dumps(data))
    history = load_history(tmp_path, limit=2)
    assert history.reports == 2
    runs = history.of(TEST, KEY)
    assert [(r.source.split(" ")[0], r.ab) for r in runs] == [
        ("night1.json", False), ("night2.json", True), ("night2.json", True)]  # fmt: skip


def test_each_mode_keeps_its_own_newest_reports(tmp_path, make_run, reference_fp):
    """A folder holding both A/B and stored-baseline reports: ``limit`` of each are read,
    so a newer stored-baseline night does not push an A/B night out of the A/B history
    (each mode reads only its own)."""
    for i in range(6):  # nights 0-5 alternate A/B (even) and stored-baseline (odd)
        path = tmp_path / f"night{i}.json"
        _report(path, [make_run(seed=i)], fp=reference_fp,
                created=f"2026-11-0{i + 1}T00:00:00+00:00")  # fmt: skip
        if i % 2 == 0:
            data = json.loads(path.read_text())
            data["cases"][0]["ab"] = {"reference": "python=/opt/release/bin/python"}
            path.write_text(json.dumps(data))
    history = load_history(tmp_path, limit=2)
    assert history.reports == 4
    runs = history.of(TEST, KEY)
    assert [(r.source.split(" ")[0], r.ab) for r in runs] == [
        ("night2.json", True), ("night3.json", False), ("night4.json", True),
        ("night5.json", False)]  # fmt: skip


def test_newer_nights_of_one_mode_leave_the_others_and_a_mixed_report_is_split(
    tmp_path, make_run, reference_fp
):
    """Two A/B nights, three newer stored-baseline nights, and newest of all a report holding
    both modes (one case each): with ``limit`` 2 the mixed report counts once for each
    mode, the stored mode is full one night later, and the older stored nights are neither
    read nor named (one judged SLOWER), while the scan goes on to the newer A/B night."""

    def night(name, day, ab, key=KEY, verdict="SAME"):
        _night(tmp_path / name, make_run(seed=day), reference_fp, day, ab, key, verdict)

    night("ab1.json", 1, True)
    night("ab2.json", 2, True)
    night("stored3.json", 3, False, verdict="SLOWER")  # its note must not show: not read
    night("stored4.json", 4, False)
    night("stored5.json", 5, False)
    night("mixed.json", 6, False)
    _add_ab_case(tmp_path / "mixed.json", "ctx=4096 kv=contiguous bs=1")
    history = load_history(tmp_path, limit=2)
    assert (history.reports, history.ab_reports, history.stored_reports) == (3, 2, 2)
    runs = history.of(TEST, KEY)
    assert [(r.source.split(" ")[0], r.ab) for r in runs] == [
        ("ab2.json", True), ("stored5.json", False), ("mixed.json", False)]  # fmt: skip
    assert [r.ab for r in history.of(TEST, "ctx=4096 kv=contiguous bs=1")] == [True]
    assert history.skipped == ()
    assert "from 3 report(s) (2 with A/B runs, 2 with stored-baseline runs)" in (
        history.describe("nightly")
    )


def test_a_mixed_report_beyond_a_full_mode_names_none_of_that_modes_cases(
    tmp_path, make_run, reference_fp
):
    """With the stored mode full, an older report holding both modes gives its A/B case and
    says nothing of its stored case, not even that it was judged SLOWER."""
    _night(tmp_path / "stored2.json", make_run(seed=2), reference_fp, 2, False)
    _night(tmp_path / "mixed1.json", make_run(seed=1), reference_fp, 1, False, verdict="SLOWER")
    _add_ab_case(tmp_path / "mixed1.json", "ctx=4096 kv=contiguous bs=1")
    history = load_history(tmp_path, limit=1)
    assert history.skipped == ()
    assert [r.ab for r in history.of(TEST, "ctx=4096 kv=contiguous bs=1")] == [True]
    assert [r.ab for r in history.of(TEST, KEY)] == [False]  # stored2's
    assert (history.reports, history.ab_reports, history.stored_reports) == (2, 1, 1)


def _night(path, run, fp, day, ab, key=KEY, verdict="SAME"):
    """One night's report of one case, dated ``day`` of 2026-11, an A/B run's if ``ab``."""
    _report(path, [run], fp=fp, key=key, verdict=verdict,
            created=f"2026-11-{day:02d}T00:00:00+00:00")  # fmt: skip
    if ab:
        data = json.loads(path.read_text())
        data["cases"][0]["ab"] = {"reference": "python=/opt/release/bin/python"}
        path.write_text(json.dumps(data))


def _add_ab_case(path, key):
    """``path``'s report with an A/B case of ``key`` besides its own (a mixed report)."""
    data = json.loads(path.read_text())
    other = {**data["cases"][0], "key": key, "verdict": "SAME",
             "ab": {"reference": "python=/opt/release/bin/python"}}  # fmt: skip
    data["cases"].append(other)
    path.write_text(json.dumps(data))


def test_the_judge_uses_history_runs_of_the_baselines_engine_only(
    tmp_path, make_run, make_case, reference_fp
):
    other = {**reference_fp, "engine_version": "9.9.9"}
    _report(tmp_path / "a.json", [make_run(seed=s) for s in (1, 2, 3)], fp=reference_fp)
    _report(tmp_path / "b.json", [make_run(seed=s, scale=2.0) for s in (4, 5)], fp=other)
    history = load_history(tmp_path)
    base = make_case(seed=0)
    case = Case(nodeid=TEST, test=TEST, key=KEY, run=make_run(seed=9), fingerprint=reference_fp,
                tolerances=Tolerances(0.07, 0.25), history=history.of(TEST, KEY))  # fmt: skip
    outcome = judge_case(case, base, tmp_path / "b.yaml")
    verify = next(m for m in outcome.verdict.metrics if m.metric == "verify")
    assert verify.history_runs == 3 and verify.between_runs == 4 and verify.base_runs == 1
