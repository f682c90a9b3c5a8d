"""The calibration harness's bookkeeping, on recorded reports (no timing, no servers)."""

from __future__ import annotations

import math

import pytest

from pytest_specperf import __main__ as cli
from pytest_specperf.cli.calibrate import CalibrateOptions, format_table, judge_report
from pytest_specperf.judging.calibration import (
    Condition,
    outcome_at,
    pair_sweep,
    recommend,
    slower_at,
    sweep,
)
from pytest_specperf.judging.verdict import MetricVerdict, Verdict, Z
from pytest_specperf.store.report import read_report


def _case(key, verdict, metrics, culprit=None):
    return {"key": key, "test": "t", "verdict": verdict, "culprit": culprit,
            "step_ms": {"median": 40.0}, "metrics": [
        {"metric": m, "verdict": v, "change": c, "noise": n, "share_based": m == "unaccounted"}
        for m, v, c, n in metrics]}


def _report(cases, tmp_path_factory=None):
    """A report as ``read_report`` gives it (written to a temporary file and read back)."""
    import json
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="specperf-cal-test-")) / "r.json"
    path.write_text(json.dumps({"schema_version": 1, **cases}))
    return read_report(path)


def _run_outcome(data, expect, tolerances=None):
    return judge_report(_report(data), expect, tolerances)


AA = {"cases": [
    _case("ctx=46000", "SAME", [("verify", "SAME", 0.012, 0.003), ("step", "SAME", 0.06, 0.01)]),
    _case("ctx=32768", "SAME", [("verify", "SAME", -0.02, 0.004), ("step", "SAME", 0.03, 0.01)]),
]}
INJ = {"cases": [
    _case("ctx=46000", "SLOWER", [("verify", "SLOWER", 0.088, 0.005), ("step", "SAME", 0.07, 0.01)],
          culprit="verify"),
    _case("ctx=32768", "SAME", [("verify", "SAME", 0.041, 0.004), ("step", "SAME", 0.02, 0.01)]),
]}


def test_run_outcome_detects_and_attributes():
    out = _run_outcome(INJ, "verify")
    assert out.detected and out.named_right
    [slow] = out.slower_cases
    assert (slow.key, slow.head, slow.metrics, slow.gated) == (
        "ctx=46000", "verify", ("verify",), ("verify", "step"))
    assert not _run_outcome(AA, None).slower_cases


def test_the_judged_change_says_what_the_canary_really_moved():
    """A verify=1.05 canary that moved the judged verify form by +4.1% and +8.8%: the
    median over every case of every run (here +6.45%), in the verdict table beside the
    detections, so a canary that leaks into the rest of the step shows; A/A has none."""
    inj = Condition("verify=1.05", inject="verify=1.05", expect="verify")
    inj.runs = [_run_outcome(INJ, "verify")]
    assert inj.moved() == pytest.approx((0.088 + 0.041) / 2)
    aa = Condition("A/A")
    aa.runs = [_run_outcome(AA, None)]
    assert aa.moved() is None
    from pytest_specperf.cli.calibrate import _condition_row, _verdict_table

    text = "\n".join(_verdict_table({"conditions": [_condition_row(aa), _condition_row(inj)]}))
    assert "judged change" in text and "+6.5%" in text
    (aa_row,) = [line for line in text.splitlines() if line.startswith("A/A ")]
    assert aa_row.rstrip().endswith("-")
    # a half-percent tolerance is said as given, not rounded to a whole percent
    at = _verdict_table({"conditions": [_condition_row(aa)], "judged_at": [0.045, 0.25]})
    assert at[0] == "verdicts at tolerance 4.5% (phases), 25% (step)", at[0]


def test_attribution_ignores_cases_that_do_not_gate_the_phase():
    step_only = _case("accept-test", "SLOWER", [("step", "SLOWER", 0.2, 0.01)], culprit="step")
    out = _run_outcome({"cases": [*INJ["cases"], step_only]}, "verify")
    assert out.detected and out.named_right
    wrong = _case("ctx=8192", "SLOWER", [("verify", "SAME", 0.01, 0.01), ("draft", "SLOWER", 0.2, 0.01)],
                  culprit="draft")
    assert not _run_outcome({"cases": [*INJ["cases"], wrong]}, "verify").named_right


def test_slower_at_uses_the_verdict_rule():
    judged = _run_outcome(INJ, "verify").judged
    assert slower_at(judged, 0.05, "phase") == [["verify"], []]
    assert slower_at(judged, 0.03, "phase") == [["verify"], ["verify"]]
    assert slower_at(judged, 0.10, "phase") == [[], []]
    assert slower_at(judged, 0.05, "step") == [["step"], []]  # raw step carries drift
    # the noise condition: a change within 3x the noise is not SLOWER at any tolerance
    noisy = ((MetricVerdict.from_json({"metric": "verify", "change": 0.09, "noise": 0.04}),),)
    assert slower_at(noisy, 0.02, "phase") == [[]]


def test_sweep_and_recommendation():
    aa, inj = Condition("A/A"), Condition("verify=1.10", inject="verify=1.10", expect="verify")
    aa.runs = [_run_outcome(AA, None) for _ in range(20)]
    inj.runs = [_run_outcome(INJ, "verify") for _ in range(20)]
    rows = sweep([aa, inj], [0.01, 0.02, 0.05, 0.1], "phase")
    assert [r["A/A"]["failed"] for r in rows] == [20, 0, 0, 0]
    assert [r["verify=1.10"]["detected"] for r in rows] == [20, 20, 20, 0]
    assert recommend(rows, [aa, inj]) == 0.02
    step_rows = sweep([aa, inj], [0.05, 0.07], "step")
    assert [r["A/A"]["failed"] for r in step_rows] == [20, 0]


def test_pairs_of_tolerances_count_failures_detections_and_unstable_runs():
    wobbly = _case("ctx=8192", "UNSTABLE", [("verify", "UNSTABLE", 0.02, 0.02)])
    aa, inj = Condition("A/A"), Condition("verify=1.10", inject="verify=1.10", expect="verify")
    aa.runs = [_run_outcome({"cases": [*AA["cases"], wobbly]}, None) for _ in range(4)]
    inj.runs = [_run_outcome(INJ, "verify") for _ in range(4)]
    judged = aa.runs[0].judged
    # step +6% (noise 1%) fails at a 5% step tolerance; verify's 2% noise band (6%) is
    # wider than 5% (UNSTABLE) and within 7% (SAME)
    assert outcome_at(judged, 0.05, 0.05, None) == (True, False, True)
    assert outcome_at(judged, 0.05, 0.08, None) == (False, False, True)
    assert outcome_at(judged, 0.07, 0.08, None) == (False, False, False)
    rows = {(r["tolerance"], r["step_tolerance"]): r for r in pair_sweep([aa, inj])}
    assert rows[(0.05, 0.05)]["A/A"] == {"failed": 4, "detected": 0, "unstable": 4, "runs": 4}
    assert rows[(0.07, 0.08)]["A/A"] == {"failed": 0, "detected": 0, "unstable": 0, "runs": 4}
    assert rows[(0.07, 0.08)]["verify=1.10"]["detected"] == 4  # +8.8% at 7%
    summary = {"conditions": [{"condition": "A/A", "expect": None},
                              {"condition": "verify=1.10", "expect": "verify"}],
               "pairs": list(rows.values())}  # fmt: skip
    from pytest_specperf.cli.calibrate import _pair_table

    text = "\n".join(_pair_table(summary))
    assert "7%      8%    0/4 fail, 0/4 U  4/4" in text, text
    # the phase grid goes by half a percent from 3% to 5%, written as a user writes it
    assert sorted({tp for tp, _ in rows}) == [0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.07]
    assert "4.5%    25%   " in text, text


def test_progress_says_how_long_is_left():
    from pytest_specperf.cli.calibrate import _eta

    assert _eta([], 10) == "" and _eta([60.0], 0) == ""
    assert _eta([50.0, 70.0, 1000.0], 79) == "  (about 1h 32m left)"  # median 70 s x 79
    assert _eta([20.0], 1) == "  (about 1m left)"


def test_table_is_readable():
    aa = Condition("A/A")
    aa.runs = [_run_outcome(AA, None)]
    summary = {"conditions": [{"condition": "A/A", "inject": None, "hog": False, "expect": None,
                               "runs": 1, "slower_runs": 0, "detected": 0, "named_right": 0,
                               "unstable_runs": 0}],
               "sweep": {"phase": sweep([aa], [0.05], "phase")},
               "recommended_tolerance": {"phase": 0.05},
               "smallest_detected_95": None, "host_stall_ms": 9.0,
               "reference_step_ms": 45.0, "wall_s": 3725.0, "repetitions": 1}
    text = "\n".join(format_table(summary))
    assert "A/A        1     0/1 false alarms" in text
    assert "smallest tolerance with at most 1 false alarm per 20 A/A runs: 5%" in text
    assert "wall time: 1h 2m 5s" in text
    assert "smallest injected factor" not in text  # nothing was injected (--inject none)
    summary["comparison"] = {"mode": "ab", "reference": "python=/v/bin/python"}
    assert "side python=/v/bin/python\n" in "\n".join(format_table(summary)) + "\n"
    from pytest_specperf.cli.calibrate import _slowed

    assert not _slowed(summary)
    summary["conditions"].append({**summary["conditions"][0], "condition": "verify=1.05",
                                  "inject": "verify=1.05", "expect": "verify"})  # fmt: skip
    assert _slowed(summary)  # then both lines are printed, as before --inject none


@pytest.mark.parametrize(("argv", "message"), [
    (["calibrate", "--repetitions", "0"], "--repetitions must be at least 1"),
    (["calibrate", "--record-attempts", "0"], "--record-attempts 0: must be at least 1 (1 keeps "
     "the first recording, noisy or not)"),
    (["calibrate", "-k", "20"], "specperf calibrate has no -k; repetitions are --repetitions N, "
     "and pytest's -k selects tests after --"),
    (["calibrate", "--inject", "verify=0.5"], "factor 0.5 must be in"),
    (["calibrate", "--inject", "verify=1.1,draft=1.1"], "give one PHASE=FACTOR (or all=FACTOR) per --inject"),
    (["calibrate", "--host-stall-share", "-0.1"], "--host-stall-share -0.1: must be in [0, 5)"),
    (["calibrate", "--inject", "none", "--inject", "verify=1.05"],
     "--inject none leaves every injection out, but 'verify=1.05' was given too"),
])
def test_cli_errors(capsys, argv, message):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--attach", "ftp://h:1"], "argument --attach: invalid value 'ftp://h:1': server URL "
     "'ftp://h:1' must look like"),
    (["--tolerance", "seven"], "argument --tolerance: invalid value 'seven': phase 'seven' is "
     "not a fraction in (0, 1); expected PHASE[,step=STEP]"),
    (["--processes", "0"], "argument --processes: invalid value '0': processes 0 is not in [1, 16]"),
    (["--max-time", "-1"], "argument --max-time: invalid value '-1': out of range; expected seconds"),
    (["--step-tolerance", "5%"], "argument --step-tolerance: was replaced by --tolerance "
     "PHASE[,step=STEP]"),
    (["--server-url", "http://127.0.0.1:3"], "argument --server-url: was replaced by --attach URL"),
])
def test_cli_values_are_parsed_by_the_shared_parsers(capsys, argv, message):
    """--tolerance, --attach, --processes, --max-time: the plugin's parsers, as argparse's
    type=, so the error names the flag; the old spellings name the new one."""
    with pytest.raises(SystemExit) as e:
        cli.main(["calibrate", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_tolerance_and_attach_reach_every_run_in_the_new_spelling(tmp_path):
    from pytest_specperf.settings import parse_attach, parse_tolerance

    opts = _args(tmp_path, resume=False, tolerance=parse_tolerance("5%"),
                 attach=parse_attach("http://127.0.0.1:3,run-dir=/tmp/r"))
    assert opts.tolerances == (0.05, 0.25)  # the step part not given: the default
    assert opts.run_args() == ["--specperf-tolerance=5%,step=25%",
                               "--specperf-attach=http://127.0.0.1:3,run-dir=/tmp/r"]


def test_host_stall_share_zero_leaves_the_stall_condition_out(tmp_path):
    from pytest_specperf.cli.calibrate import Calibration

    names = [c.name for c in Calibration(_args(tmp_path, host_stall_share=0.0)).conditions(9.0)]
    assert names == ["A/A", "verify=1.10"]
    names = [c.name for c in Calibration(_args(tmp_path)).conditions(9.0)]
    assert names == ["A/A", "verify=1.10", "host_stall=9ms"]


def _args(tmp_path, resume=True, **kw):
    import argparse

    ns = dict(repetitions=1, inject=["verify=1.10"], host_stall_share=0.2, hog=False,
              json=None, work_dir=tmp_path, resume=resume, pytest_args=[], tolerance=None,
              attach=None)
    ns.update(kw)
    return CalibrateOptions.from_args(argparse.Namespace(**ns))


@pytest.mark.parametrize(("attempts", "recorded"), [(None, 3), (1, 1), (2, 2)])
def test_a_noisy_baseline_is_recorded_again_at_most_record_attempts_times(
    tmp_path, monkeypatch, attempts, recorded
):
    """A box whose every recording comes out noisy: calibrate records the baseline
    ``--record-attempts`` times in all (default 3) and keeps the last; with 1 it keeps the
    first, as on the Zen 3 box of 2026-12-07, where one recording of 5 processes took 868 s.
    The recording run and the noise check are test doubles here."""
    from pytest_specperf.cli.calibrate import Calibration

    kw = {} if attempts is None else {"record_attempts": attempts}
    cal = Calibration(_args(tmp_path, resume=False, **kw))
    runs: list[list[str]] = []

    def fake_pytest(tag, extra):  # a test double for the recording's pytest run
        runs.append(extra)
        return 0, _report(AA), 1.0

    monkeypatch.setattr(cal, "_pytest", fake_pytest)
    monkeypatch.setattr(cal, "_noisy_cases", lambda: ["ctx=2048 run 1 (verify 8%)"])
    cal.record()
    assert len(runs) == recorded
    assert all("--specperf-update-baselines" in extra for extra in runs)


def test_inject_none_calibrates_the_quiet_runs_alone(tmp_path):
    """``--inject none``: A/A only (with the host stall and the hog if asked); no --inject at
    all: the default factors."""
    from pytest_specperf.cli.calibrate import DEFAULT_FACTORS, Calibration

    quiet = _args(tmp_path, inject=["none"], host_stall_share=0.0)
    assert quiet.injects == ()
    assert [c.name for c in Calibration(quiet).conditions(9.0)] == ["A/A"]
    hog = _args(tmp_path, inject=["none"], host_stall_share=0.2, hog=True)
    assert [c.name for c in Calibration(hog).conditions(9.0)] == [
        "A/A", "host_stall=9ms", "A/A + CPU hog"]  # fmt: skip
    assert _args(tmp_path, inject=None).injects == DEFAULT_FACTORS
    assert _args(tmp_path, inject=["none", "none"]).injects == ()


def test_a_resume_without_inject_keeps_the_work_dirs_injections(tmp_path):
    """``--resume`` with no ``--inject`` reads the plan's injections (``conditions.json``)
    rather than adding the default factors; a new work dir gets the defaults."""
    import json

    from pytest_specperf.cli.calibrate import DEFAULT_FACTORS

    assert _args(tmp_path, inject=None).injects == DEFAULT_FACTORS  # no plan yet
    plan = tmp_path / "conditions.json"
    plan.write_text(json.dumps(["A/A", "verify=1.05", "host_stall=9ms", "A/A + CPU hog"]))
    assert _args(tmp_path, inject=None).injects == ("verify=1.05",)
    assert _args(tmp_path, inject=None, resume=False).injects == DEFAULT_FACTORS
    plan.write_text(json.dumps(["A/A"]))
    assert _args(tmp_path, inject=None).injects == ()
    assert _args(tmp_path, inject=["verify=1.10"]).injects == ("verify=1.10",)  # as given


def test_history_gives_every_repetition_the_earlier_repetitions_reports(tmp_path, monkeypatch):
    """``--history``: each repetition reads the work dir's compacted reports (the earlier
    repetitions') as ``--specperf-history``, as a nightly job keeping its reports does;
    without it, none."""
    from pytest_specperf.cli.calibrate import Calibration

    for history, want in ((True, [f"--specperf-history={tmp_path}"]), (False, [])):
        seen = []
        cal = Calibration(_args(tmp_path, resume=False, history=history))

        def fake_pytest(tag, extra, seen=seen):  # a test double for the repetition's pytest
            seen.append((tag, extra))
            return 1, None, 0.1

        monkeypatch.setattr(cal, "_pytest", fake_pytest)
        cond = cal.conditions(9.0)[1]
        assert cal.repetition(cond, 0) == (None, 1, 0.1)
        assert seen == [("rep00-verify_1.10", ["--specperf-inject=verify=1.10", *want])]


def test_resume_reuses_finished_runs_and_their_exit_status(tmp_path):
    import json

    from pytest_specperf.cli.calibrate import Calibration

    cal = Calibration(_args(tmp_path))
    (tmp_path / "rep00-A_A.json").write_text(json.dumps({"schema_version": 1, **AA}))
    (tmp_path / "rep00-A_A.rc").write_text("0 61.5\n")
    rc, report, wall = cal._resumed("rep00-A_A")
    assert (rc, wall, [c.key for c in report.cases]) == (0, 61.5, ["ctx=46000", "ctx=32768"])
    # A run of an older version without its .rc: the exit status is read off the verdicts.
    (tmp_path / "rep00-verify_1.10.json").write_text(json.dumps({"schema_version": 1, **INJ}))
    rc, report, wall = cal._resumed("rep00-verify_1.10")
    assert (rc, wall) == (1, None)
    # A report of an unknown version is named and skipped, never a crash.
    (tmp_path / "rep02-A_A.json").write_text(json.dumps({"schema_version": 99, **AA}))
    assert cal._resumed("rep02-A_A") is None
    # Interrupted mid-run (no report) or a torn report: run it again.
    assert cal._resumed("rep01-A_A") is None
    (tmp_path / "rep01-A_A.json").write_text('{"cases": [')
    assert cal._resumed("rep01-A_A") is None
    # Without --resume nothing is reused.
    assert Calibration(_args(tmp_path, resume=False))._resumed("rep00-A_A") is None


def test_resume_refuses_other_conditions(tmp_path, monkeypatch):
    import json

    from pytest_specperf.cli.calibrate import Calibration

    (tmp_path / "baselines").mkdir()
    (tmp_path / "baseline.json").write_text(json.dumps({"schema_version": 1, "cases": [
        {"key": "k", "test": "t", "verdict": "SAME", "step_ms": {"median": 40.0}}]}))
    (tmp_path / "conditions.json").write_text(json.dumps(["A/A", "verify=1.05"]))
    cal = Calibration(_args(tmp_path))
    with pytest.raises(SystemExit, match=r"--resume: this work dir was calibrated with "
                       r"conditions \['A/A', 'verify=1.05'\].*without \['verify=1.05'\]"):
        cal.run()
    assert json.loads((tmp_path / "conditions.json").read_text()) == ["A/A", "verify=1.05"]


def test_resume_may_add_conditions(tmp_path, capsys):
    import json

    from pytest_specperf.cli.calibrate import Calibration

    (tmp_path / "conditions.json").write_text(json.dumps(["A/A", "verify=1.10"]))
    cal = Calibration(_args(tmp_path, hog=True, host_stall_share=0.0))
    cal._check_plan(cal.conditions(9.0))
    assert "added condition(s) ['A/A + CPU hog']" in capsys.readouterr().out
    assert json.loads((tmp_path / "conditions.json").read_text()) == [
        "A/A", "verify=1.10", "A/A + CPU hog"]


def test_resume_needs_a_work_dir(capsys):
    assert cli.main(["calibrate", "--resume"]) == 2
    assert "--resume needs --work-dir" in capsys.readouterr().err


def test_run_outcome_judges_stored_metrics_by_the_current_rule():
    # Judged at other tolerances than the run used: the same stored changes and noises.
    assert not _run_outcome(INJ, "verify", (0.10, 0.15)).slower_cases
    both = _run_outcome(INJ, "verify", (0.05, 0.05)).slower_cases
    assert both[0].metrics == ("verify", "step") and both[0].head == "verify"
    # A case whose draft scattered far more than the baseline's: its verify cannot fail
    # (a report of an older version said SLOWER; the current rule says UNSTABLE).
    shaken = _case("ctx=131072", "SLOWER", [("verify", "SLOWER", 0.09, 0.005),
                                             ("draft", "UNSTABLE", -0.3, 0.04)], culprit="verify")
    shaken["metrics"][1]["scatter_ratio"] = 3.7
    out = _run_outcome({"cases": [shaken]}, "verify")
    assert not out.slower_cases and out.unstable_cases == ("ctx=131072",)


def test_unstable_is_rejudged_at_the_tolerance_too():
    wobbly = _case("ctx=32768", "UNSTABLE", [("verify", "UNSTABLE", 0.02, 0.02)])
    assert _run_outcome({"cases": [wobbly]}, None, (0.05, 0.15)).unstable_cases == ("ctx=32768",)
    assert _run_outcome({"cases": [wobbly]}, None, (0.07, 0.15)).unstable_cases == ()


def test_all_condition_expects_the_step_and_blames_no_phase():
    from pytest_specperf.cli.calibrate import expected_metric

    assert expected_metric("all=1.10") == "step" and expected_metric("verify=1.05") == "verify"
    uniform = {"cases": [
        _case("ctx=46000", "SLOWER", [("verify", "SAME", 0.004, 0.005),
                                      ("step", "SLOWER", 0.101, 0.02)], culprit="step"),
        _case("ctx=32768", "SAME", [("verify", "SAME", -0.01, 0.004), ("step", "SAME", 0.08, 0.03)]),
    ]}  # fmt: skip
    out = _run_outcome(uniform, "step", (0.07, 0.08))
    assert out.detected and out.named_right
    blamed = {"cases": [_case("ctx=46000", "SLOWER", [("verify", "SLOWER", 0.09, 0.005),
                                                      ("step", "SLOWER", 0.12, 0.02)])]}
    out = _run_outcome(blamed, "step", (0.07, 0.08))
    assert out.detected and not out.named_right  # a phase was blamed for a uniform slowdown


def test_processes_and_max_time_reach_every_run(tmp_path):
    opts = _args(tmp_path, resume=False, inject=["all=1.10"], processes=3, max_time=20.0)
    assert (opts.processes, opts.max_time) == (3, 20.0)
    assert opts.run_args() == ["--specperf-max-time=20"]


def test_the_baselines_process_noise_is_shown(tmp_path, make_case):
    """Three runs of a case: one process ran verify 10% slower (its verify/rest is about
    +10%): tau_hat of verify/rest shows it, step/ref (the reference scaled alike) not."""
    import dataclasses

    from pytest_specperf.cli.calibrate import baseline_noise
    from pytest_specperf.store.baselines import write_baselines

    runs = [make_case(seed=1, factors=f) for f in ({}, {"verify": 1.1}, {})]
    case = dataclasses.replace(runs[0], runs=tuple(r.runs[0] for r in runs))
    write_baselines(tmp_path / "box.yaml", {"name": "box"}, [case])
    [row] = baseline_noise(tmp_path)
    assert row["runs"] == 3
    # run means 0, ln(1.1), 0: sd 0.055 (no residual: every block moved alike)
    assert row["verify/rest"] == pytest.approx(math.log(1.1) / math.sqrt(3), rel=0.05)
    assert row["draft/rest"] == pytest.approx(row["verify/rest"], rel=0.2)  # its rest grew
    assert row["step/ref"] < row["verify/rest"]
    summary = {"baseline_noise": [row]}
    from pytest_specperf.cli.calibrate import _noise_table

    lines = _noise_table(summary)
    assert "noise between server processes in the baseline" in lines[1]
    assert any(line.startswith("test_d ctx=8192 kv=contiguous bs=1  3") for line in lines)


def test_a_killed_calibrate_takes_its_running_pytest_down(tmp_path):
    """Before, a calibrate ended by SIGTERM or SIGKILL (a CI job's timeout) left the suite's
    pytest running to its end, minutes later; now that pytest gets SIGTERM at once."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from e2e import alive

    pid_file = tmp_path / "pytest.pid"
    (tmp_path / "test_slow.py").write_text(
        "import os, pathlib, time\n"
        "def test_slow():\n"
        f"    pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "    time.sleep(120)\n"
    )
    cal = subprocess.Popen(
        [sys.executable, "-m", "pytest_specperf", "calibrate", "--repetitions", "1",
         "--work-dir", str(tmp_path / "work"), "--", str(tmp_path / "test_slow.py")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert cal.poll() is None and time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        cal.kill()
        cal.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not alive(child):
                return
            time.sleep(0.1)
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the calibration's pytest (pid {child}) outlived the killed calibrate")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cal.pid, signal.SIGKILL)


def test_unstable_parts_say_which_case_and_what_more_steps_could_fix():
    from pytest_specperf.cli.calibrate import Condition, _unstable_table, unstable_parts

    def wide(key, within):
        c = _case(key, "UNSTABLE", [("verify", "UNSTABLE", 0.01, 0.03), ("step", "SAME", 0.0, 0.01)])
        c["metrics"][0].update(within=within, between=0.02, between_hat2=0.0004, between_runs=3,
                               base_runs=3, now_runs=1, tolerance=0.07)
        return c

    runs = [_run_outcome({"cases": [wide("ctx=131072", w), _case("ctx=32768", "SAME", [
        ("verify", "SAME", 0.01, 0.004)])]}, None, (0.07, 0.25)) for w in (0.02, 0.025, 0.03)]
    rows = unstable_parts(Condition("A/A", runs=runs))
    assert [(r["case"], r["metric"], r["unstable"], r["runs"]) for r in rows] == [
        ("t ctx=131072", "verify", 3, 3)]  # the quiet case and the SAME step are not listed
    noise = rows[0]["noise"]
    assert math.isfinite(noise) and rows[0]["within"] == pytest.approx(0.025)
    assert rows[0]["between"] == pytest.approx(math.sqrt(noise**2 - 0.025**2), rel=0.1)
    text = "\n".join(_unstable_table({"unstable_parts": rows}))
    assert "t ctx=131072" in text and "3/3" in text and "> 6.77% (tol 7%)" in text
    # UNSTABLE from a disturbed run, whose band fits the tolerance: the table says so.
    calm = dict(rows[0], noise=0.01)
    assert "3.0% <= 6.77% (tol 7%)" in "\n".join(_unstable_table({"unstable_parts": [calm]}))
    # the band is of a log change: 6.9% is wider than ln 1.07 = 6.77%, though under 7%
    edge = dict(rows[0], noise=0.069 / (rows[0].get("critical") or Z))
    assert "6.9% > 6.77% (tol 7%)" in "\n".join(_unstable_table({"unstable_parts": [edge]}))


def test_chi2_quantile_is_wilson_hilferty_within_a_percent_of_the_tables():
    from pytest_specperf.judging.calibration import chi2_quantile

    # exact values from the chi-square tables (k = 6, 10, 20)
    for p, k, exact in ((0.95, 6, 12.592), (0.05, 6, 1.635), (0.95, 10, 18.307),
                        (0.05, 20, 10.851), (0.95, 20, 31.410)):  # fmt: skip
        assert chi2_quantile(p, k) == pytest.approx(exact, rel=0.012)
    for bad in ((0.0, 6), (1.0, 6), (0.5, 0)):
        with pytest.raises(ValueError, match="chi2_quantile needs"):
            chi2_quantile(*bad)


def test_the_noise_fit_says_whether_the_a_a_changes_were_as_wide_as_the_gates_said():
    """RMS of ln(1 + change) / noise over the quiet runs' gates against the model's
    sqrt(mean df/(df-2)): 1 fits; 2 is UNDERSTATED and 0.3 overstated over 20 runs of 6
    cases (range from n = 6); gates without a usable noise are left out; the farthest
    case carries its pooled between-process estimate beside the one judged with."""
    from pytest_specperf.cli.calibrate import _fit_table
    from pytest_specperf.judging.calibration import noise_fit

    def runs(z, df=None, worst=None, extra=()):
        out = []
        for i in range(20):
            sign = 1 if i % 2 else -1
            cases = []
            for j in range(6):
                zz = worst if worst is not None and j == 0 else z
                c = _case(f"ctx={j}", "SAME", [("verify", "SAME", math.expm1(sign * zz * 0.01),
                                                0.01), *extra])  # fmt: skip
                c["metrics"][0].update(df=df, between=0.005, between_hat2=0.0001 * (1 + i % 2))
                cases.append(c)
            out.append(_run_outcome({"cases": cases}, None))
        return out

    (fits,) = noise_fit(runs(1.0), "all")
    assert (fits["metric"], fits["gates"], fits["cases"], fits["independent"]) == (
        "verify", 120, 6, 6)  # fmt: skip
    assert fits["ratio"] == pytest.approx(1.0) and fits["fit"] == "fits"
    assert fits["high"] == pytest.approx(math.sqrt(12.592 / 6), rel=0.01)
    assert noise_fit(runs(2.0), "all")[0]["fit"] == "UNDERSTATED"
    assert noise_fit(runs(0.3), "all")[0]["fit"] == "overstated"
    # Student's t on 10 df: a z of 1 is 1/sqrt(10/8) of what the model allows
    t10 = noise_fit(runs(1.0, df=10.0), "all")[0]
    assert t10["expected"] == pytest.approx(math.sqrt(10 / 8)) and t10["ratio"] < 1
    # not usable: t on 2 df (no variance), a deterministic metric, a share in points
    assert noise_fit(runs(1.0, df=2.0), "all") == []
    shares = noise_fit(runs(1.0, extra=[("unaccounted", "SAME", 0.5, 0.01)]), "all")
    assert [r["metric"] for r in shares] == ["verify"]
    far = noise_fit(runs(1.0, worst=3.0), "A/B")[0]
    assert far["worst_case"] == "t ctx=0" and far["worst_rms_z"] == pytest.approx(3.0)
    assert far["worst_between_hat"] == pytest.approx(math.sqrt(0.00015))
    assert far["worst_between"] == pytest.approx(0.005)
    text = "\n".join(_fit_table({"noise_fit": [far]}))
    assert "verify/rest" in text and "UNDERSTATED" in text and "t ctx=0 3.00" in text
    assert "1.22% / 0.50%" in text and "120 (6)" in text
    assert noise_fit([], "all") == [] and _fit_table({"noise_fit": []}) == []


def test_ab_levels_project_the_measured_process_spread_to_more_processes_a_side():
    """Per case of A/B's A/A runs: w (median), tau measured (between_hat2 pooled over the
    runs, 2 df a run at 2 + 2 processes) beside tau judged, and at P a side the noise
    sqrt((w^2 + tau^2 x 1) x (2/P) / 1), its band at the median critical value and the
    smallest change caught 19/20 by exp(max(ln 1.07, t x noise) + 1.645 x noise) - 1;
    stored-mode gates (not between the sides) are left out."""
    from pytest_specperf.cli.calibrate import _ab_levels_table
    from pytest_specperf.judging.calibration import ab_levels

    def run(i, ab=True):
        c = _case("ctx=1", "SAME", [("verify", "SAME", 0.001, 0.015)])
        c["metrics"][0].update(ab_sides=ab, within=0.005, between=0.005, base_runs=2,
                               now_runs=2, critical=3.7, tolerance=0.07, df=25.0,
                               between_hat2=0.0001 if i % 2 else 0.0003)  # fmt: skip
        return _run_outcome({"cases": [c]}, None)

    (row,) = ab_levels([run(i) for i in range(4)])
    assert (row["case"], row["metric"], row["runs"], row["between_df"]) == ("t ctx=1", "verify", 4, 8)
    assert row["between_hat"] == pytest.approx(math.sqrt(0.0002))
    assert row["within"] == pytest.approx(0.005) and row["between_judged"] == pytest.approx(0.005)
    two, four = row["processes"]["2"], row["processes"]["4"]
    assert two["noise"] == pytest.approx(0.015) and two["band"] == pytest.approx(3.7 * 0.015)
    assert two["decided"] and two["smallest_caught"] == pytest.approx(
        math.expm1(math.log1p(0.07) + 1.6448536 * 0.015))  # fmt: skip
    assert four["noise"] == pytest.approx(0.015 / math.sqrt(2))
    text = "\n".join(_ab_levels_table({"ab_levels": [row], "run_wall_s": {"median": 228.0}}))
    assert "1.41% (8)" in text and "5.5%, +9.7%" in text and "228 s" in text
    wide = dict(row, processes={**row["processes"], "2": {**two, "decided": False}})
    assert "5.5% U, +9.7%" in "\n".join(_ab_levels_table({"ab_levels": [wide]}))
    assert row["run_band"] == pytest.approx({"median": 3.7 * 0.015, "widest": 3.7 * 0.015})
    assert "5.5%, 5.5%" in text  # the bands the runs judged with, median and widest
    assert ab_levels([run(i, ab=False) for i in range(4)]) == []
    assert _ab_levels_table({"ab_levels": []}) == []


def test_a_tolerance_is_read_from_each_runs_least_deciding_one_not_a_cases_typical_band():
    """A run has an UNSTABLE case when any one of its gates' bands passes the tolerance, and
    the widest gate moves from case to case with each run's noise: 20 A/A runs whose cases
    are each wide in one run in four have a typical verify band per case of 3.7 x 1% = 3.7%,
    yet every run needs e^(3.7 x 2%) - 1 = 7.7% to decide all its phase gates; one run's
    accept length (higher is better) needs 1 - e^-(3.7 x 3%) = 10.507%, shown rounded up
    (10.6%: rounded down it would not decide). Step gates: runs 0-19
    with noise 3.0-4.9%, the 18th of 20 by rank decides from e^(3.7 x 4.7%) - 1. Gates of a
    stored-mode run (not between the sides) do not count."""
    from pytest_specperf.cli.calibrate import _ab_levels_table
    from pytest_specperf.judging.calibration import ab_deciding_tolerances, ab_levels

    def run(i, ab=True):
        cases = []
        for k in range(4):
            wide = 0.02 if (i + k) % 4 == 0 else 0.01
            gates = [("verify", "SAME", 0.0, wide), ("draft", "SAME", 0.0, 0.01),
                     ("step", "SAME", 0.0, 0.03 + 0.001 * i)]  # fmt: skip
            if i == 5 and k == 0:
                gates.append(("accept_len", "SAME", 0.0, 0.03))
            c = _case(f"ctx={k}", "SAME", gates)
            for m in c["metrics"]:
                m.update(ab_sides=ab, within=0.005, between=0.005, base_runs=2, now_runs=2,
                         critical=3.7, tolerance=0.25 if m["metric"] == "step" else 0.07,
                         df=25.0, between_hat2=0.0001)  # fmt: skip
            cases.append(c)
        return _run_outcome({"cases": cases}, None)

    runs = [run(i) for i in range(20)]
    need = ab_deciding_tolerances(runs)
    phase, step = need["phase"], need["step"]
    assert phase == pytest.approx({"runs": 20, "median": math.expm1(0.074), "share": 0.9,
                                   "within_share": math.expm1(0.074),
                                   "widest": -math.expm1(-3.7 * 0.03)})  # fmt: skip
    assert step["within_share"] == pytest.approx(math.expm1(3.7 * 0.047))  # 18th of 20 by rank
    assert step["widest"] == pytest.approx(math.expm1(3.7 * 0.049))
    assert step["median"] == pytest.approx(
        (math.expm1(3.7 * 0.039) + math.expm1(3.7 * 0.040)) / 2)  # fmt: skip
    verify = [r for r in ab_levels(runs) if r["metric"] == "verify"]
    assert [r["run_band"]["median"] for r in verify] == pytest.approx([0.037] * 4)
    assert [r["run_band"]["widest"] for r in verify] == pytest.approx([0.074] * 4)
    text = "\n".join(_ab_levels_table({"ab_levels": verify, "ab_deciding_tolerances": need}))
    assert "phase gates: median 7.7%, 18 of 20 runs from 7.7%, all 20 from 10.6%" in text  # up
    few = ab_deciding_tolerances(runs[:7])  # the rank of 90% of 7 is the widest: said once
    assert "phase gates: median 7.7%, all 7 from 10.6%;" in "\n".join(
        _ab_levels_table({"ab_levels": verify, "ab_deciding_tolerances": few}))  # fmt: skip
    assert f"18 of 20 runs from {math.ceil(math.expm1(3.7 * 0.047) * 1000) / 10:.1f}%" in text
    assert ab_deciding_tolerances([run(i, ab=False) for i in range(20)]) == {}


def test_case_spread_df_says_what_one_device_value_is_worth_for_one_case():
    """Cases whose variances differ by far more than their sampling: one pooled value
    predicts a case as well as 2 m^2 / (var(v) - mean(2 v^2 / df)) degrees of freedom;
    cases that agree within their sampling, or too few cases, give None."""
    from pytest_specperf.cli.calibrate import _spread_lines
    from pytest_specperf.judging.noise import case_spread_df

    parts = [(1e-4, 40), (4e-4, 40), (9e-4, 40), (36e-4, 40)]
    m = sum(v for v, _ in parts) / 4
    var = sum((v - m) ** 2 for v, _ in parts) / 3 - sum(2 * v * v / 40 for v, _ in parts) / 4
    assert case_spread_df(parts) == pytest.approx(2 * m * m / var)
    assert case_spread_df(parts) < 2  # a 6x spread of sd: barely 1-2 df
    assert case_spread_df([(1e-4, 40), (1.01e-4, 40), (0.99e-4, 40)]) is None
    assert case_spread_df(parts[:2]) is None
    line = "\n".join(_spread_lines({"verify": 1.23, "step": None}))
    assert "verify/rest about 1.2 df" in line and "step" not in line
    assert _spread_lines({"step": None}) == []


def test_the_prior_lines_say_what_the_pooled_values_are_worth_for_one_case():
    from pytest_specperf.cli.calibrate import _prior_lines

    level = {"between": 0.005, "between_df": 21.0, "sitting": 0.022, "sitting_df": 434.0}
    prior = {"provisional": False, "phase": level, "step": level,
             "case_spread_df": {"phase": {"between": 1.2, "sitting": 4.5, "between_pooled": 28.0,
                                          "sitting_pooled": 581.0},
                                "step": {"between": None, "sitting": 1.6, "between_pooled": 28.0,
                                         "sitting_pooled": 581.0}}}  # fmt: skip
    text = "\n".join(_prior_lines({"prior": prior}))
    assert ("between 1.2 df of 28 (phase), sitting 4.5 df of 581 (phase), sitting 1.6 df of 581 "
            "(step); the prior carries the lesser") in text
    del prior["case_spread_df"]
    assert "predictor of one case" not in "\n".join(_prior_lines({"prior": prior}))


# -- a calibration over sittings (issue 28, item 5) -------------------------------------


def test_kalibera_jones_counts_and_the_sittings_a_target_needs():
    """The figures of docs/statistics.md section 7: verify/rest with block scatter 2%,
    processes 0.8%, sittings 1.1%, at 2 s a block, 15 s a process, 72 s a sitting: 7 blocks
    per process (sqrt(15/2 x 4/0.64) = 6.85), 2 processes per sitting (sqrt(72/15 x
    0.64/1.21) = 1.59). One sitting of 2 x 7 blocks: V1 = 1.21 + 0.32 + 4/14 = 1.816
    (x 1e-4), noise floor (z 3.32 at the default suite's gate level 4.46e-4 + 1.645) x 1.35%
    = 6.7%: +5% is out of reach of any
    stored baseline, +10% needs 1 baseline sitting (room (100 ln 1.10 / 4.97)^2 / 1.816 =
    2.03: S >= 1/1.03), +9% 2 and +8% 4 (the sitting term shrinks only as 1/S)."""
    from pytest_specperf.judging.levels import DEFAULT_COSTS, FormLevels, plan

    lv = FormLevels("verify/rest", 6, 8, 0.02**2, 42, 0.008**2, 12, 0.011**2, 6)
    p = plan(lv, DEFAULT_COSTS, 0.05)
    assert (p.blocks_per_process, p.processes_per_sitting) == (7, 2)
    assert p.floor == pytest.approx(0.0669, abs=0.0005)
    assert p.sittings is None
    assert [plan(lv, DEFAULT_COSTS, t).sittings for t in (0.10, 0.09, 0.08)] == [1, 2, 4]
    assert p.run_cost_s == 2 * (15 + 7 * 2)
    # No measurable process variance: as many blocks as the cap, never a division by zero.
    flat = FormLevels("step/ref", 6, 8, 0.02**2, 42, 0.0, 12, None, 0)
    assert plan(flat, DEFAULT_COSTS, 0.05).blocks_per_process == 64


def test_levels_pool_over_cases_by_degrees_of_freedom():
    """Two cases, two sittings of two runs of two blocks each. Case a: runs (0, 0.02) in
    sitting s1 and (0.10, 0.12) in s2, every block alike (no residual): within each
    sitting the run means are 0.01 +- 0.01, SS 2 x 2e-4 on 2 df: tau_hat^2 = 2e-4; case b:
    the same without the sitting step (sitting means equal). Pooled tau^2 = 2e-4 on 4 df;
    case a's sitting means 0.01 and 0.11: variance 0.005, minus mean(1/2) x (2e-4 + 0) =
    1e-4: 0.0049; case b's: 0; pooled over 1 + 1 df: 0.00245."""
    from pytest_specperf.judging.levels import case_estimate, pool

    def runs(offset):
        return [("s1", (math.exp(0.0),) * 2), ("s1", (math.exp(0.02),) * 2),
                ("s2", (math.exp(offset),) * 2), ("s2", (math.exp(offset + 0.02),) * 2)]

    a, b = case_estimate(runs(0.10), 2), case_estimate(runs(0.0), 2)
    lv = pool("verify/rest", [a, b])
    assert lv.cases == 2 and lv.between_df == 4 and lv.sitting_df == 2
    assert lv.between_var == pytest.approx(2e-4)
    assert lv.sitting_var == pytest.approx((0.005 - 1e-4) / 2)
    assert lv.block_var == pytest.approx(0.0, abs=1e-15) and lv.block_df == 6
    assert pool("verify/rest", []) is None


def test_costs_parse_and_errors_name_the_fix(capsys):
    from pytest_specperf.judging.levels import parse_costs

    c = parse_costs("process=20, sitting=90")
    assert (c.block, c.process, c.sitting) == (2.0, 20.0, 90.0)
    for bad in ("blocks=2", "block=x", "block=0"):
        with pytest.raises(ValueError, match=r"block|seconds"):
            parse_costs(bad)
    assert cli.main(["calibrate", "--work-dir", "/nonexistent", "--summarize", "--costs",
                     "sitting=-1"]) == 2  # fmt: skip
    assert "--costs" in capsys.readouterr().err
    assert cli.main(["calibrate", "--sitting", "2"]) == 2
    assert "--sitting and --summarize need --work-dir" in capsys.readouterr().err
    assert cli.main(["calibrate", "--write-prior", "baselines"]) == 2
    assert "--write-prior needs --sitting or --summarize" in capsys.readouterr().err
    assert cli.main(["calibrate", "--work-dir", "x", "--sitting", "1", "--target", "150%"]) == 2
    assert "--target '150%'" in capsys.readouterr().err


def test_a_compacted_report_keeps_what_the_calibration_reads(tmp_path):
    import json

    from pytest_specperf.cli.calibrate_sittings import compact_report

    case = _case("ctx=46000", "SAME", [("verify", "SAME", 0.012, 0.003)])
    case |= {"samples": {"step_ms": [40.0] * 5000}, "kernels": {"k": 1},
             "siblings": [{"samples": {"step_ms": [40.0] * 5000}}],
             "records": [{"v": 1, "step": i, "phases": {"verify": 1.0}} for i in range(500)],
             "runs": [{"blocks": {"verify/rest": [1.0, 1.1, 0.9]}}]}  # fmt: skip
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"schema_version": 1, "cases": [case]}, indent=1))
    size = compact_report(raw, tmp_path / "rep00-A_A.json")
    assert size < raw.stat().st_size / 10
    back = read_report(tmp_path / "rep00-A_A.json")
    assert [m.metric for m in back.cases[0].metrics] == ["verify"]
    assert "samples" not in back.cases[0].data and back.cases[0].data["runs"]
    assert "siblings" not in back.cases[0].data and "records" not in back.cases[0].data


def test_a_sitting_starts_from_the_previous_sittings_baseline(tmp_path):
    from pytest_specperf.cli.calibrate_sittings import prepare_sitting, sitting_dir

    dest = sitting_dir(tmp_path, 2) / "baselines"
    with pytest.raises(SystemExit, match=r"--sitting 2: sitting 1 has no recorded baseline"):
        prepare_sitting(tmp_path, 2, dest)
    s1 = sitting_dir(tmp_path, 1)
    (s1 / "baselines").mkdir(parents=True)
    (s1 / "baselines" / "box.yaml").write_text("runs: 1\n")
    (s1 / "baselines" / "box.prior.yaml").write_text("x: 1\n")
    (s1 / "baseline.json").write_text("{}")
    dest.mkdir(parents=True)
    (dest / "stale.yaml").write_text("")
    prepare_sitting(tmp_path, 2, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["box.yaml"]
    prepare_sitting(tmp_path, 1, sitting_dir(tmp_path, 1) / "baselines")  # the first: empty
    assert not (s1 / "baselines").exists()


def test_conditions_read_back_from_a_work_dir_and_merge_over_sittings():
    from pytest_specperf.cli.calibrate import conditions_from_names
    from pytest_specperf.cli.calibrate_sittings import merge_conditions

    one = conditions_from_names(["A/A", "verify=1.05", "all=1.10", "host_stall=8.1ms"])
    assert [(c.inject, c.expect) for c in one] == [
        (None, None), ("verify=1.05", "verify"), ("all=1.10", "step"),
        ("host_stall=8.1", "unaccounted")]  # fmt: skip
    two = conditions_from_names(["A/A", "host_stall=9ms", "A/A + CPU hog"])
    for c in (*one, *two):
        c.runs.append(_run_outcome(AA, c.expect))
    merged = merge_conditions([one, two])
    assert [(c.name, len(c.runs)) for c in merged] == [
        ("A/A", 2), ("verify=1.05", 1), ("all=1.10", 1), ("host_stall=8.1ms", 2),
        ("A/A + CPU hog", 1)]  # fmt: skip


def _sitting_files(root, k, make_case, sittings, offsets):
    """Sitting ``k`` of a calibration as it is committed: its baseline file (runs of every
    sitting so far), the recording's report, conditions and one A/A repetition whose
    process ran at ``offsets[-1]``."""
    import dataclasses
    import json

    from pytest_specperf.cli.calibrate_sittings import sitting_dir
    from pytest_specperf.store.baselines import write_baselines

    d = sitting_dir(root, k)
    (d / "baselines").mkdir(parents=True)
    for s, off in zip(sittings, offsets):
        runs = [make_case(seed=i + 3 * len(s), factors={"verify": off * (1 + 0.01 * i)})
                for i in range(2)]  # fmt: skip
        case = dataclasses.replace(runs[0], runs=tuple(r.runs[0] for r in runs))
        write_baselines(d / "baselines" / "box.yaml", {"name": "box"}, [case], keep_runs=6,
                        sitting=s)  # fmt: skip
    base = {"key": "ctx=8192 kv=contiguous bs=1", "test": "perf_tests/t.py::test_d",
            "verdict": "SAME", "step_ms": {"median": 40.0}, "recorded": True}  # fmt: skip
    (d / "baseline.json").write_text(json.dumps({"schema_version": 1, "cases": [base]}))
    (d / "conditions.json").write_text(json.dumps(["A/A", "verify=1.05"]))
    now = make_case(seed=11 + k, factors={"verify": offsets[-1]}).runs[0]
    aa = _case(base["key"], "SAME", [("verify", "SAME", 0.01, 0.004)])
    aa["metrics"][0] |= {"sitting": 0.01, "sitting_coef": 1 + 1 / k}  # as judged
    aa |= {"test": base["test"], "runs": [{"blocks": {m: list(b) for m, b in now.blocks.items()}}]}
    (d / "rep00-A_A.json").write_text(json.dumps({"schema_version": 1, "cases": [aa]}))
    (d / "rep00-A_A.rc").write_text("0 70.0\n")
    inj = _case(base["key"], "SLOWER", [("verify", "SLOWER", 0.09, 0.004)], culprit="verify")
    (d / "rep00-verify_1.05.json").write_text(json.dumps({"schema_version": 1, "cases": [inj]}))
    (d / "rep00-verify_1.05.rc").write_text("1 71.0\n")


def test_the_summary_and_the_prior_come_from_the_committed_files_alone(tmp_path, make_case, capsys):
    """Two sittings (the second's baseline holds both), one A/A and one verify=1.05 run
    each: --summarize runs nothing, merges the runs, measures the levels and writes a
    prior the plugin reads back, measured (not provisional)."""
    import json

    from pytest_specperf.store.prior import load_prior

    _sitting_files(tmp_path, 1, make_case, ["s1"], [1.0])
    _sitting_files(tmp_path, 2, make_case, ["s1", "s2"], [1.0, 1.03])
    out_json, prior_dir = tmp_path / "summary.json", tmp_path / "baselines"
    assert cli.main(["calibrate", "--work-dir", str(tmp_path), "--summarize", "--write-prior",
                     str(prior_dir), "--json", str(out_json)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    summary = json.loads(out_json.read_text())
    aa = next(c for c in summary["conditions"] if c["condition"] == "A/A")
    inj = next(c for c in summary["conditions"] if c["condition"] == "verify=1.05")
    assert (aa["runs"], aa["slower_runs"], inj["runs"], inj["detected"]) == (2, 0, 2, 2)
    assert [(r["sitting"], r["baseline_sittings"]) for r in summary["sittings"]] == [
        (1, 1), (2, 2)]  # fmt: skip
    forms = {r["form"]: r for r in summary["levels"]}
    assert forms["verify/rest"]["between_df"] == 2  # 2 sittings x (2 runs - 1)
    assert forms["verify/rest"]["sitting_df"] == 3  # 2 baseline sittings + 2 A/A runs - 1
    assert forms["verify/rest"]["sitting_sd"] > 0.005  # the 3% step between sittings
    assert "Kalibera & Jones" in text and "per sitting" in text
    # each sitting's A/A run read +1% against sqrt(1 + 1/k) x 1% as judged (provisional:
    # the runs name no measured prior)
    assert [(r["sitting"], r["form"], r["prior"]) for r in summary["offsets"]] == [
        (1, "verify/rest", "provisional"), (2, "verify/rest", "provisional")]  # fmt: skip
    assert [r["ratio"] for r in summary["offsets"]] == pytest.approx(
        [math.log1p(0.01) / (0.01 * math.sqrt(1 + 1 / k)) for k in (1, 2)])  # fmt: skip
    assert "each sitting's offset against the sitting term" in text
    # the noise fit, per sitting then over all: one A/A gate each at ln(1.01) / 0.004
    assert [(r["runs"], r["metric"]) for r in summary["noise_fit"]] == [
        ("sitting 1", "verify"), ("sitting 2", "verify"), ("all", "verify")]  # fmt: skip
    assert [r["rms_z"] for r in summary["noise_fit"]] == pytest.approx(
        [math.log1p(0.01) / 0.004] * 3)  # fmt: skip
    assert "does the stated noise fit the quiet A/A runs?" in text
    # one case: no spread over cases to weigh the pooled values by
    assert summary["prior"]["case_spread_df"] == {
        kind: {"between": None, "sitting": None, "between_pooled": 2.0, "sitting_pooled": 3.0}
        for kind in ("phase", "step")}  # fmt: skip
    prior = load_prior(prior_dir / "box.yaml")
    assert not prior.provisional and "2 sittings, 2 A/A runs" in prior.source
    assert prior.phase.sitting == pytest.approx(summary["prior"]["phase"]["sitting"], rel=1e-3)
    assert not list(tmp_path.glob("sitting-*/raw"))  # nothing was run


def test_a_sittings_offsets_are_read_against_the_sitting_term_its_runs_were_judged_with():
    """Held-out check of a prior: per case the median A/A log change (one outlying run
    does not move it), against sqrt(c_s) x sigma_s as judged; cases without the term and
    recorded cases are left out; the ratio and the farthest case are the table's."""
    from pytest_specperf.cli.calibrate_sittings import offsets_table, sitting_offsets

    def case(key, changes, sitting=0.02, coef=1.25, provisional=False):
        return {"test": "perf_tests/t.py::test_d", "key": key, "verdict": "SAME",
                "step_ms": {"median": 40.0}, "prior": {"provisional": provisional},
                "metrics": [{"metric": m, "change": c, "sitting": sitting,
                             "sitting_coef": coef} for m, c in changes]}  # fmt: skip

    runs = [
        {"cases": [case("a", [("verify", 0.02), ("step", 0.0)]),
                   case("b", [("verify", -0.01)]),
                   case("c", [("verify", 0.5)], sitting=None),
                   {**case("d", [("verify", 0.5)]), "recorded": True}]}
        for _ in range(3)
    ]  # fmt: skip
    runs[0]["cases"][0]["metrics"][0]["change"] = 0.30  # one outlying run of case a
    rows = {r["form"]: r for r in sitting_offsets(4, [_report(r) for r in runs])}
    assert set(rows) == {"verify/rest", "step/ref"}
    v = rows["verify/rest"]
    assert (v["sitting"], v["cases"], v["runs"], v["prior"]) == (4, 2, 3, "measured")
    want = math.sqrt((math.log1p(0.02) ** 2 + math.log1p(-0.01) ** 2) / 2)
    assert v["offset_rms"] == pytest.approx(want)
    assert v["predicted_rms"] == pytest.approx(0.02 * math.sqrt(1.25))
    assert v["ratio"] == pytest.approx(want / (0.02 * math.sqrt(1.25)))
    assert v["farthest"] == "test_d a" and v["farthest_z"] == pytest.approx(
        math.log1p(0.02) / (0.02 * math.sqrt(1.25)))  # fmt: skip
    assert rows["step/ref"]["offset_rms"] == 0.0
    runs[1]["cases"][1]["prior"]["provisional"] = True
    assert sitting_offsets(4, [_report(r) for r in runs])[0]["prior"] == "provisional"
    text = "\n".join(offsets_table(list(rows.values())))
    assert "verify/rest" in text and "test_d a +2.00% (+0.9 sd)" in text and "2 x 3" in text
    assert sitting_offsets(1, []) == [] and offsets_table([]) == []


def test_a_prior_given_is_put_beside_the_baseline_and_checked(tmp_path, capsys):
    from pytest_specperf.cli.calibrate import Calibration
    from pytest_specperf.judging.noise import PROVISIONAL_PRIOR
    from pytest_specperf.store.prior import write_prior

    measured = tmp_path / "measured"
    write_prior(measured / "box.yaml", PROVISIONAL_PRIOR)
    cal = Calibration(_args(tmp_path / "w", prior=measured / "box.prior.yaml"))
    cal.baselines.mkdir(parents=True)
    (cal.baselines / "box.yaml").write_text("")
    first = _report({"device": {"slug": "box"}, **AA})
    cal.use_prior(first)
    assert (cal.baselines / "box.prior.yaml").read_text() == (
        measured / "box.prior.yaml").read_text()  # fmt: skip
    assert "noise prior (PROVISIONAL" in capsys.readouterr().out
    (tmp_path / "bad.yaml").write_text("schema_version: 7\n")
    cal = Calibration(_args(tmp_path / "w", prior=tmp_path / "bad.yaml"))
    with pytest.raises(SystemExit, match=r"--prior .*bad.yaml: .*schema_version is 7"):
        cal.use_prior(first)
    assert not (cal.baselines / "box.prior.yaml").exists()


def test_a_prior_given_in_ab_mode_is_put_where_the_runs_read_it(tmp_path, capsys):
    """A/B records no baseline file: the prior goes beside the one the runs would read,
    named by the first A/A run's device (before 2026-12-05 it was silently left out, and
    the A/B repetitions were judged under the provisional prior). A prior measured for
    another device is refused, and so is a first run that names none."""
    from pytest_specperf.cli.calibrate import Calibration, baseline_noise
    from pytest_specperf.cli.calibrate_sittings import baseline_runs, baseline_sittings
    from pytest_specperf.judging.noise import PROVISIONAL_PRIOR
    from pytest_specperf.store.prior import load_prior, write_prior

    measured = tmp_path / "measured"
    write_prior(measured / "box.yaml", PROVISIONAL_PRIOR)
    cal = Calibration(_args(tmp_path / "w", prior=measured / "box.prior.yaml", ab="args=-x"))
    assert not cal.baselines.exists()
    cal.use_prior(_report({"device": {"slug": "box"}, **AA}))
    assert load_prior(cal.baselines / "box.yaml") == PROVISIONAL_PRIOR
    assert [p.name for p in cal.baselines.iterdir()] == ["box.prior.yaml"]
    assert "noise prior (PROVISIONAL" in capsys.readouterr().out
    # the summary reads the directory's baseline files, not the prior beside them (the
    # first A/B calibration under a prior crashed there, after its last run)
    assert baseline_noise(cal.baselines) == [] and cal._noisy_cases() == []
    assert baseline_sittings(cal.baselines) == 0 and baseline_runs(cal.baselines) == {}
    other = Calibration(_args(tmp_path / "o", prior=measured / "box.prior.yaml", ab="args=-x"))
    with pytest.raises(SystemExit, match=r"measured for another device than this one "
                       r"\(cpu-amd-epyc-2c\); give cpu-amd-epyc-2c.prior.yaml"):  # fmt: skip
        other.use_prior(_report({"device": {"slug": "cpu-amd-epyc-2c"}, **AA}))
    with pytest.raises(SystemExit, match=r"names no device, so no run would read the prior"):
        other.use_prior(_report(AA))
    assert not other.baselines.exists()  # nothing written


def test_one_sitting_runs_for_real_and_resumes_from_its_committed_files(tmp_path):
    """The orchestration on the reference engine (one case of 8 steps): sitting 1 records
    its baseline, runs one A/A and one verify=1.5 repetition, and leaves what a commit
    keeps (compacted reports, exit files, the baseline with its sitting) beside a
    .gitignore'd raw/; run again with --resume it runs nothing and says the same."""
    import subprocess
    import sys

    from e2e import SHORT_RUN, VERIFY_CASE

    (tmp_path / "test_case.py").write_text(VERIFY_CASE)
    cmd = [sys.executable, "-m", "pytest_specperf", "calibrate", "--work-dir", "cal",
           "--sitting", "1", "--repetitions", "1", "--inject", "verify=1.5",
           "--host-stall-share", "0", "--", "test_case.py", *SHORT_RUN]  # fmt: skip
    first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    d = tmp_path / "cal" / "sitting-1"
    kept = sorted(p.name for p in d.iterdir() if p.is_file())
    assert kept == [".gitignore", "baseline.json", "baseline.rc", "conditions.json",
                    "rep00-A_A.json", "rep00-A_A.rc", "rep00-verify_1.5.json",
                    "rep00-verify_1.5.rc"]  # fmt: skip
    assert (d / "raw" / "rep00-A_A.log").exists() and "raw/" in (d / ".gitignore").read_text()
    assert "samples" not in (d / "rep00-A_A.json").read_text()
    assert "sitting: " in next((d / "baselines").glob("*.yaml")).read_text()
    assert "per sitting" in first.stdout and "Kalibera & Jones" in first.stdout
    stamps = {p.name: p.stat().st_mtime_ns for p in d.glob("*.rc")}
    again = subprocess.run([*cmd[:4], "--resume", *cmd[4:]], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming: baseline" in again.stdout and "2 runs resumed" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in d.glob("*.rc")} == stamps  # nothing re-ran


def test_a_report_judged_at_one_tests_share_is_read_at_its_runs_share():
    """Before 2026-12-05 pytest never called the hook that counts a run's tests: every
    case was judged at one test's share (``family.tests`` 1). Read again, each gate gets
    the first Holm step of its run's share, on its own degrees of freedom; a case that
    saved its run's share is left as stored."""
    from pytest_specperf.cli.calibrate import at_report_share
    from pytest_specperf.cli.compare import _fallback_notes
    from pytest_specperf.judging.significance import Family, critical

    one = {"run_alpha": 0.05, "tests": 1, "cases": 1, "looks": 4, "look": 2}
    loose = Family(tests=1, looks=4, look=2).gate_alpha(2)

    def case(n, family):
        c = _case(f"ctx={n}", "SLOWER", [("verify", "SLOWER", 0.075, 0.02),
                                         ("step", "SAME", 0.01, 0.03)])  # fmt: skip
        for m in c["metrics"]:  # as the run judged it: at one test's share
            m.update(alpha=loose, df=12.0, critical=critical(loose, 12.0), tolerance=0.07)
        return {**c, "test": f"t{n}", "nodeid": f"t{n}[x]", "family": family}

    # +7.5% at a noise of 2%: log 0.0723 = 3.6 noises, beyond one test's t (2.73 on 12 df,
    # look 2 of 4, 2 gates) but not seven tests' (3.85), whose band 3.85 x 2% = 7.7% is
    # wider than ln 1.07 = 6.77%: UNSTABLE, where the run said SLOWER
    report = _report({"cases": [case(n, one) for n in range(7)]})
    assert report.tests == 7
    stored = {m.rejudged(0.07) for c in report.cases for m in c.metrics if m.metric == "verify"}
    assert stored == {Verdict.SLOWER}  # what the run itself said
    level = Family(tests=7, looks=4, look=2).gate_alpha(2)
    for c in at_report_share(report):
        for m in c.metrics:
            assert m.alpha == pytest.approx(level)
            assert m.critical == pytest.approx(critical(level, 12.0))
    reread = judge_report(report, "verify")  # every report at its run's share
    assert reread.slower_cases == () and len(reread.unstable_cases) == 7
    (note,) = [n for n in _fallback_notes(report) if "larger share" in n]
    assert "its cases are judged here at the share of 7 tests" in note

    # a report that saved its run's share (written since): read as stored
    report = _report({"cases": [case(n, {**one, "tests": 7}) for n in range(7)]})
    assert [c.metrics for c in at_report_share(report)] == [c.metrics for c in report.cases]
    assert len(judge_report(report, "verify").slower_cases) == 7
    assert not [n for n in _fallback_notes(report) if "larger share" in n]
