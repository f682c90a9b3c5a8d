"""``specperf compare``: saved runs judged again by the gate's own code.

Runs are built from synthetic step records through the real summarizing and judging code
(``make_run`` in conftest), written as reports, read back and rebuilt.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
from pathlib import Path

import pytest

from pytest_specperf.cli import compare
from pytest_specperf.judging.judge import Case, as_baseline, judge_case
from pytest_specperf.judging.metrics import RUNQ_SHARE, STEP, cpu_form
from pytest_specperf.judging.noise import DevicePrior, LevelPrior
from pytest_specperf.judging.samples import build_run
from pytest_specperf.judging.significance import Family
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.settings import ToleranceSpec, parse_tolerance
from pytest_specperf.store.baselines import utc_now
from pytest_specperf.store.rebuild import run_from_case
from pytest_specperf.store.report import read_report, report_payload, write_report
from pytest_specperf.telemetry.summary import MetricSummary, TelemetrySummary

TEST = "perf_tests/t.py::test_d"
KEY = "ctx=8192 kv=contiguous bs=1"
TOL = Tolerances(phase=0.07, step=0.25)


def _case(run, fp, key=KEY, gates=None):
    return Case(nodeid=f"{TEST}[x]", test=TEST, key=key, run=run, fingerprint=fp,
                tolerances=TOL, gates=gates)


def _write(path: Path, *cases) -> Path:
    outcomes = [judge_case(c, None, Path("b.yaml")) for c in cases]
    header = {"tolerance": 0.07, "step_tolerance": 0.25, "datetime": "2026-05-01T02:00:00+00:00",
              "commit_info": {"id": "abc1234def", "dirty": False}}
    write_report(path, report_payload(header, outcomes))
    return path


def _args(a: Path, b: Path, **kw) -> argparse.Namespace:
    return argparse.Namespace(a=str(a), b=str(b), storage=Path("."), tolerance=None, **kw)


def test_a_rebuilt_run_has_the_summaries_the_gate_computed(tmp_path, make_run, reference_fp):
    run = make_run(steps=32, factors={"verify": 1.1})
    path = _write(tmp_path / "r.json", _case(run, reference_fp))
    rebuilt = run_from_case(path, read_report(path).cases[0])
    assert rebuilt.steps == run.steps and rebuilt.blocks == run.blocks
    assert set(rebuilt.summaries) == set(run.summaries)  # step/ref, verify/rest, ... too
    for name, s in run.summaries.items():
        r = rebuilt.summaries[name]
        assert r.n == s.n and math.isclose(r.value, s.value, rel_tol=1e-9), name
        assert all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(r.blocks, s.blocks)), name


def _with_cpu_and_runq(run):
    """``run``'s steps as a busy CPU run measures them: the thread's CPU time per phase
    and step, and the part of its wait spent runnable without a CPU (run-queue time)."""
    records = [
        dataclasses.replace(
            r,
            cpu_ns={p: v // 2 for p, v in r.host_ns.items()},
            step_cpu_ns=r.step_ns // 2,
            step_runq_ns=r.step_ns // (5 + i % 3),
        )
        for i, r in enumerate(run.records)
    ]
    return build_run(records, run.blocks, context_len=run.context_len,
                     batch_size=run.batch_size, layout=run.kv_layout)  # fmt: skip


def test_a_rebuilt_run_keeps_its_run_queue_and_cpu_time(tmp_path, make_run, reference_fp):
    """The saved case carries the probe's records: run-queue and CPU time survive
    ``specperf compare`` (an older report, without them, rebuilds from its samples)."""
    run = _with_cpu_and_runq(make_run(steps=32))
    assert RUNQ_SHARE in run.summaries and cpu_form(STEP) in run.summaries
    path = _write(tmp_path / "r.json", _case(run, reference_fp))
    rebuilt = run_from_case(path, read_report(path).cases[0])
    assert set(rebuilt.summaries) == set(run.summaries)
    for name in (RUNQ_SHARE, cpu_form(STEP)):
        assert rebuilt.summaries[name] == run.summaries[name], name
    assert [r.step_runq_ns for r in rebuilt.records] == [r.step_runq_ns for r in run.records]
    older = json.loads(path.read_text())
    del older["cases"][0]["records"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    again = run_from_case(tmp_path / "old.json", read_report(tmp_path / "old.json").cases[0])
    assert RUNQ_SHARE not in again.summaries and again.summaries[STEP] == rebuilt.summaries[STEP]


def test_compare_gives_the_verdicts_the_gate_gives(tmp_path, make_run, reference_fp):
    base, now = make_run(steps=32), make_run(steps=32, factors={"verify": 1.3}, seed=1)
    a = _write(tmp_path / "a.json", _case(base, reference_fp))
    b = _write(tmp_path / "b.json", _case(now, reference_fp))
    [got] = compare.compare_runs(read_report(a), read_report(b))
    gate = judge_case(_case(now, reference_fp), as_baseline(_case(base, reference_fp), at=utc_now()), a)
    assert got.verdict.verdict is gate.verdict.verdict is Verdict.SLOWER
    assert got.verdict.culprit == gate.verdict.culprit == "verify"
    pairs = zip(got.verdict.metrics, gate.verdict.metrics, strict=True)
    for m, g in pairs:
        assert (m.metric, m.verdict) == (g.metric, g.verdict)
        assert math.isclose(m.change, g.change, rel_tol=1e-6, abs_tol=1e-9), m.metric
        assert math.isclose(m.noise, g.noise, rel_tol=1e-6, abs_tol=1e-9), m.metric


def test_cli_exits_1_on_slower_and_prints_the_summary_table(tmp_path, make_run, reference_fp):
    a = _write(tmp_path / "a.json", _case(make_run(steps=32), reference_fp))
    b = _write(tmp_path / "b.json", _case(make_run(steps=32, factors={"verify": 1.3}), reference_fp))
    out = io.StringIO()
    assert compare.run(_args(a, b), out) == 1
    text = out.getvalue()
    assert "step ms (base -> now)" in text and "verify/rest +" in text  # the change judged
    assert "test_d ctx=8192 kv=contiguous bs=1" in text and "SLOWER" in text
    assert compare.run(_args(a, a), io.StringIO()) == 0  # a run against itself: SAME


def test_gates_and_tolerances_come_from_the_saved_case(tmp_path, make_run, reference_fp):
    base, now = make_run(steps=32), make_run(steps=32, factors={"verify": 1.3})
    a = _write(tmp_path / "a.json", _case(base, reference_fp, gates=("draft",)))
    b = _write(tmp_path / "b.json", _case(now, reference_fp, gates=("draft",)))
    [got] = compare.compare_runs(read_report(a), read_report(b))
    assert [m.metric for m in got.verdict.metrics] == ["draft"]
    wide = compare.compare_runs(read_report(a), read_report(a), ToleranceSpec(0.5, 0.9))
    assert wide[0].tolerances == Tolerances(0.5, 0.9)
    # a part not given is the case's own (TOL: 7%, step 25%)
    step_only = compare.compare_runs(read_report(a), read_report(a), parse_tolerance("step=40%"))
    assert step_only[0].tolerances == Tolerances(0.07, 0.4)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tolerance", "2"], "argument --tolerance: invalid value '2': phase '2' is not a fraction"),
    (["--tolerance", "5%,stp=1%"], "argument --tolerance: invalid value '5%,stp=1%': unknown part "
     "'stp' (known: phase, step)"),
    (["--step-tolerance", "30%"], "argument --step-tolerance: was replaced by --tolerance "
     "PHASE[,step=STEP]"),
])
def test_tolerance_is_parsed_by_the_plugins_parser(capsys, argv, message):
    from pytest_specperf.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["compare", "a.json", "b.json", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_other_engine_is_invalid_and_missing_cases_are_named(tmp_path, make_run, reference_fp):
    other = {**reference_fp, "dtype": "bfloat16"}  # same engine, another build of it
    a = _write(tmp_path / "a.json", _case(make_run(), reference_fp),
               _case(make_run(), reference_fp, key="ctx=1 kv=contiguous bs=1"))
    b = _write(tmp_path / "b.json", _case(make_run(), other),
               _case(make_run(), reference_fp, key="ctx=2 kv=contiguous bs=1"))
    outs = compare.compare_runs(read_report(a), read_report(b))
    assert [o.verdict.verdict for o in outs] == [Verdict.INVALID, Verdict.NO_BASELINE]
    assert "engine fingerprint differs" in outs[0].verdict.reasons[0]
    assert "not in run A (a.json)" in outs[1].verdict.reasons[0]
    lines = compare.compare_lines(read_report(a), read_report(b), outs)
    assert f"only in A: {TEST} ctx=1 kv=contiguous bs=1" in lines


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 9, "cases": []}', "schema_version 9 is not one"),
        ('{"schema_version": 1, "cases": [', "not JSON (truncated or corrupt?)"),
        ('{"schema_version": 1, "cases": [{"test": "t", "key": "k", "verdict": "SAME", '
         '"step_ms": {"median": 1}}]}', "t k: samples"),
    ],
)
def test_unusable_runs_exit_2_naming_the_file(tmp_path, make_run, reference_fp, capsys,
                                              content, message):
    good = _write(tmp_path / "good.json", _case(make_run(), reference_fp))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert compare.run(_args(good, bad), io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and message in err


def test_runs_are_found_by_number_in_the_storage(tmp_path, make_run, reference_fp, capsys):
    store = tmp_path / ".benchmarks" / "Linux-CPython-3.11-64bit"
    store.mkdir(parents=True)
    _write(store / "0001_first.json", _case(make_run(), reference_fp))
    _write(store / "0002_second.json", _case(make_run(), reference_fp))
    assert compare.resolve_run("0002", tmp_path / ".benchmarks").name == "0002_second.json"
    with pytest.raises(compare.RunNotFound, match="names 2 runs"):
        compare.resolve_run("000", tmp_path / ".benchmarks")
    with pytest.raises(compare.RunNotFound, match="no such file"):
        compare.resolve_run("0009", tmp_path / ".benchmarks")
    args = _args(Path("0001"), Path("0002"))
    args.storage = tmp_path / ".benchmarks"
    assert compare.run(args, io.StringIO()) == 0


def test_a_throttled_run_is_invalid_in_compare_too(tmp_path, make_run, reference_fp):
    """The telemetry round-trips, so the gate's validity rules hold for saved runs."""
    import dataclasses

    tele = TelemetrySummary(available=True, samples=10, reason_samples=10,
                            throttle_reasons={"sw_thermal_slowdown": 9},
                            metrics={"sm_util_pct": MetricSummary(50.0, 40.0, 60.0, 10)})
    assert TelemetrySummary.from_dict(json.loads(json.dumps(tele.to_dict()))) == tele
    hot = dataclasses.replace(make_run(), telemetry=tele)
    a = _write(tmp_path / "a.json", _case(make_run(), reference_fp))
    b = _write(tmp_path / "b.json", _case(hot, reference_fp))
    [o] = compare.compare_runs(read_report(a), read_report(b))
    assert o.verdict.verdict is Verdict.INVALID
    assert any("throttled" in r for r in o.verdict.reasons)


def test_telemetry_reader_names_bad_fields():
    with pytest.raises(ValueError, match="telemetry"):
        TelemetrySummary.from_dict({"available": True, "metrics": {"x": {"median": "a"}}})
    with pytest.raises(ValueError, match="telemetry: expected an object"):
        TelemetrySummary.from_dict({"metrics": {}})


def test_runs_from_a_slower_machine_compare_same_and_the_machine_is_named(
    tmp_path, make_run, reference_fp
):
    """Run B on a machine 2.8x slower (every phase and the KV read): no regression, and the
    output says the raw times come from another machine."""
    a = _write(tmp_path / "a.json", _case(make_run(steps=32), reference_fp))
    b = _write(tmp_path / "b.json", _case(make_run(steps=32, scale=2.8), reference_fp))
    out = io.StringIO()
    assert compare.run(_args(a, b), out) == 0
    text = out.getvalue()
    # no regression; the step may be UNSTABLE: two reports are two sittings, and without a
    # measured device prior the provisional sitting term (6% on the step) is wide
    assert "SLOWER" not in text and "FASTER" not in text
    assert "machine: KV reads took 2.80x as long as in the baselines" in text


def _processes(make_run, n, seed, **kw):
    """One case measured in ``n`` server processes (each its own steps), as the pool
    hands it to the judge: the first process's run, the others its siblings."""
    runs = [dataclasses.replace(make_run(steps=32, seed=seed + i, **kw), server_pid=100 + i)
            for i in range(n)]  # fmt: skip
    return dataclasses.replace(runs[0], siblings=tuple(runs[1:]))


def test_every_process_is_rebuilt_and_judged_as_the_gate_did(tmp_path, make_run, reference_fp):
    """A baseline of 3 processes, a run of 2 at the extension's second look in a run of 3
    tests: ``specperf compare`` judges the same runs on each side, at the same look, and
    gives every gate's verdict, change and noise the gate gave (an older report, which
    saved the first process's steps only, is re-judged from it and says so)."""
    fam = Family(tests=3, cases=1, looks=4, look=2)
    # a measured device prior (a step sitting variance known exactly: an infinite df)
    prior = DevicePrior(LevelPrior(0.02, 3.0, 0.03, 5.0), LevelPrior(0.04, 4.0, 0.05, math.inf),
                        "a calibration of the test box", provisional=False)  # fmt: skip
    base = dataclasses.replace(_case(_processes(make_run, 3, 0), reference_fp), family=fam)
    now = dataclasses.replace(
        _case(_processes(make_run, 2, 5, factors={"verify": 1.15}), reference_fp),
        family=fam,
        prior=prior,
    )
    a, b = _write(tmp_path / "a.json", base), _write(tmp_path / "b.json", now)
    gate = judge_case(now, as_baseline(base, at=utc_now()), a)
    rebuilt = run_from_case(b, read_report(b).cases[0])
    assert [r.server_pid for r in rebuilt.processes] == [100, 101]
    for r, m in zip(rebuilt.processes, now.run.processes, strict=True):
        assert r.summaries[STEP] == m.summaries[STEP] and r.blocks == m.blocks
    [got] = compare.compare_runs(read_report(a), read_report(b))
    assert got.family == fam and got.prior == prior
    assert got.verdict.verdict is gate.verdict.verdict
    assert got.verdict.culprit == gate.verdict.culprit
    assert len(gate.verdict.metrics) > 3  # the default gates: step, phases, accept_len, ...
    assert (got.verdict.metrics[0].metric, got.verdict.metrics[0].base_runs,
            got.verdict.metrics[0].now_runs) == (STEP, 3, 2)  # fmt: skip
    for m, g in zip(got.verdict.metrics, gate.verdict.metrics, strict=True):
        assert (m.metric, m.verdict, m.base_runs, m.now_runs) == (
            g.metric, g.verdict, g.base_runs, g.now_runs)  # fmt: skip
        assert m.alpha == g.alpha, m.metric
        for name in ("change", "noise", "between"):
            x, y = getattr(m, name), getattr(g, name)
            assert (x is None and y is None) or math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9), (
                m.metric, name)  # fmt: skip
    # a report from before the other processes' steps were saved
    older = json.loads(b.read_text())
    del older["cases"][0]["siblings"], older["cases"][0]["family"], older["cases"][0]["prior"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = read_report(tmp_path / "old.json")
    [o] = compare.compare_runs(read_report(a), old)
    assert {m.now_runs for m in o.verdict.metrics} == {1}
    lines = compare.compare_lines(read_report(a), old, [o])
    assert (f"note: {TEST} {KEY} in old.json was measured in 2 server processes, but the "
            "report (written before pytest-specperf saved every process's steps) holds the "
            "first one's: it is re-judged from that process alone") in lines  # fmt: skip
    assert (f"note: {TEST} {KEY} in old.json did not save the share of the false-alarm budget "
            "it was judged at (judged as a lone comparison's 5% one-sided, shared by the "
            "report's 1 test(s)) nor the device prior (judged under the provisional one); a "
            "report of an older pytest-specperf") in lines  # fmt: skip
    assert not any(line.startswith("note:") for line in compare.compare_lines(
        read_report(a), read_report(b), [got]))  # fmt: skip


def test_a_benchmark_case_keeps_every_process_without_its_records(tmp_path, make_run, reference_fp):
    """A pytest-benchmark result carries each process's samples, not its records: the
    case is rebuilt with both processes from them."""
    from pytest_specperf.reporting.benchmark import history_case
    from pytest_specperf.store.report import CaseRecord

    now = _case(_processes(make_run, 2, 5), reference_fp)
    record = CaseRecord.of(judge_case(now, None, Path("b.yaml")))
    carried = history_case(record)
    assert "records" not in carried and "records" not in carried["siblings"][0]
    rebuilt = run_from_case(tmp_path / "bench.json", CaseRecord.from_json(carried))
    assert len(rebuilt.processes) == 2
    for r, m in zip(rebuilt.processes, now.run.processes, strict=True):
        assert r.summaries[STEP] == m.summaries[STEP] and r.server_pid == m.server_pid


def test_a_sibling_without_steps_is_refused_not_judged_as_a_copy(tmp_path, make_run, reference_fp):
    """A truncated or edited report whose second process lost its steps: rebuilding it
    from the first process's would judge two identical processes (no spread between
    them). The rebuild names the case and the process instead."""
    from pytest_specperf.store.report import ReportError

    path = _write(tmp_path / "b.json", _case(_processes(make_run, 2, 5), reference_fp))
    data = json.loads(path.read_text())
    sib = data["cases"][0]["siblings"][0]
    sib.pop("samples")  # its records alone: the blocks and KV reads would be the first's
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match="server process 2 has no samples of its own"):
        run_from_case(path, read_report(path).cases[0])


def _budgeted(case, **limits):
    from pytest_specperf.judging.budgets import Budgets

    return dataclasses.replace(case, budgets=Budgets(**limits))


def test_a_breached_budget_fails_compare_as_it_failed_the_test(tmp_path, make_run, reference_fp):
    """B's test set a step budget its run breached: the pytest run failed the case
    (OVER_BUDGET (SAME)), and compare, which judges the same budgets on the rebuilt run,
    says so in the table and in a line per budget, and exits 1 though the verdict is SAME."""
    run = make_run(steps=32)
    step = run.summaries[STEP].median
    a = _write(tmp_path / "a.json", _case(run, reference_fp))
    now = _budgeted(_case(run, reference_fp), max_step_ms=step / 2, min_accept_len=1.0)
    b = _write(tmp_path / "b.json", now)
    gate = judge_case(now, as_baseline(_case(run, reference_fp), at=utc_now()), a)
    assert gate.verdict.verdict is Verdict.SAME and gate.failed  # the pytest run's verdict
    [got] = compare.compare_runs(read_report(a), read_report(b))
    assert [c.describe() for c in got.budgets] == [c.describe() for c in gate.budgets]
    assert got.failed and got.verdict.verdict is Verdict.SAME
    out = io.StringIO()
    assert compare.run(_args(a, b), out) == 1
    text = out.getvalue()
    assert "OVER_BUDGET (SAME)" in text
    over, within = (c.describe() for c in gate.budgets)
    assert over.startswith("over budget: step") and within.startswith("within budget:")
    assert f"BUDGET {TEST} {KEY}: {over}" in text.splitlines()
    assert f"BUDGET {TEST} {KEY}: {within}" in text.splitlines()  # every budget judged


def test_a_report_without_saved_budgets_compares_as_before(tmp_path, make_run, reference_fp,
                                                            capsys):
    """A report written before budgets were saved has none to judge: the same lines and exit
    status as a run that set none. A saved budget that cannot be read is refused, naming the
    file, the case and the budget: dropping it would pass a case its test failed."""
    from pytest_specperf.store.report import saved_budgets

    run = make_run(steps=32)
    a = _write(tmp_path / "a.json", _case(run, reference_fp))
    b = _write(tmp_path / "b.json", _budgeted(_case(run, reference_fp), max_step_ms=1.0))
    assert compare.run(_args(a, b), io.StringIO()) == 1
    data = json.loads(b.read_text())
    del data["cases"][0]["budgets"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert saved_budgets(read_report(old).cases[0]) is None
    out, plain = io.StringIO(), io.StringIO()
    assert compare.run(_args(a, old), out) == 0
    assert compare.run(_args(a, a), plain) == 0
    assert "BUDGET" not in out.getvalue()
    assert out.getvalue().splitlines()[2:] == plain.getvalue().splitlines()[2:]  # less A, B
    data["cases"][0]["budgets"] = [{"budget": "max_step_ms", "limit": "fast"}]
    old.write_text(json.dumps(data))
    assert compare.run(_args(a, old), io.StringIO()) == 2
    assert (f"old.json: {TEST} {KEY}: budgets[0]: max_step_ms's limit 'fast' is not a "
            "positive number") in capsys.readouterr().err


def test_compare_s_unstable_advice_is_to_measure_again_and_compare(tmp_path, make_run,
                                                                  reference_fp):
    """Two saved runs are two sittings: B on a 15% slower machine is UNSTABLE under the
    provisional prior. The advice is compare's (measure again, compare again), not the
    recording's (update or re-record the baseline)."""
    a = _write(tmp_path / "a.json", _case(make_run(steps=12), reference_fp))
    b = _write(tmp_path / "b.json", _case(make_run(steps=12, scale=1.15, seed=2), reference_fp))
    out = io.StringIO()
    assert compare.run(_args(a, b), out) == 0
    [line] = [x for x in out.getvalue().splitlines() if x.startswith("UNSTABLE")]
    assert "(runs A and B are two sittings; docs/statistics.md)" in line, line
    assert ("specperf calibrate, then measure B again with it beside the baselines (pytest "
            "... --specperf-json FILE, or --benchmark-save) and compare again") in line
    assert "record" not in line and "baseline run" not in line


def _unstable(**fields):
    from pytest_specperf.judging.verdict import MetricVerdict

    m = MetricVerdict(STEP, Verdict.UNSTABLE, 50.0, 52.0, 0.04, 0.1, 0.25, "ms",
                      within=0.01, floor=0.05, base_runs=3, critical=2.9)
    return dataclasses.replace(m, **fields)


@pytest.mark.parametrize(("fields", "remedy"), [
    ({"steps_to_decide": 120}, "measure A and B again with --specperf-steps 120 (or the "
     "marker's steps=)"),
    ({"processes_to_decide": 3}, "about 3 processes would decide: measure B again with "
     "--specperf-processes 3"),
    ({"processes_to_decide": 5}, "about 5 processes would decide: measure A and B again with "
     "--specperf-processes 5"),
    ({}, "no practical number of processes would: measure A and B again on a quiet machine"),
    ({"scatter_ratio": 4.4}, "run B's blocks scatter 4.4x more than the other's: the machine "
     "was busy or disturbed while B ran; measure B again on a quiet machine"),
    ({"scatter_ratio": 1 / 4.4}, "while A ran; measure A again on a quiet machine"),
])
def test_unstable_advice_in_compare_names_compare_s_remedy(fields, remedy):
    """Every kind of UNSTABLE: compare's advice (``compared``) says which saved run to
    measure again with which pytest option; the run's own advice stays the recording's."""
    from pytest_specperf.reporting.terminal import unstable_advice

    m = _unstable(**fields)
    text = unstable_advice(m, compared=True)
    assert remedy in text and text.endswith(
        "(pytest ... --specperf-json FILE, or --benchmark-save) and compare again"), text
    assert "record" not in text and "baseline" not in text
    assert "compare again" not in unstable_advice(m)
