"""Each measured case is a real pytest-benchmark result (end to end, real reference server).

Two real sessions save their results through pytest-benchmark (``--benchmark-json``,
``--benchmark-autosave``, ``--benchmark-save``); the tests read what pytest-benchmark
wrote, run its own ``pytest-benchmark compare``, check the fields github-action-benchmark
reads, and read the runs back with ``specperf compare`` and ``specperf history``. The
pytester tests check that pytest-benchmark's switches leave the specperf tests as they
were; they attach to one reference server of the module (a server start each is what they
would otherwise pay: the bridge does not depend on who launched the server).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import SHORT_RUN, VERIFY_CASE
from rawhttp import launch_reference

from pytest_specperf.judging.verdict import Verdict
from pytest_specperf.probe.phases import ALL_PHASES, HOST_PHASES
from pytest_specperf.store.report import read_report

pytestmark = pytest.mark.timeout(600)

CASE = VERIFY_CASE + """
def test_user(benchmark):
    assert benchmark(sum, range(100)) == 4950
"""
NAME = "test_decode[ctx=2048 kv=contiguous bs=1]"
FULLNAME = f"test_case.py::{NAME}"
PYTEST_BENCHMARK = Path(sys.executable).with_name("pytest-benchmark")


def _git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A git checkout where two real sessions saved their benchmarks: the first with
    ``--benchmark-json=b.json --benchmark-autosave``, the second ``--benchmark-save=second``."""
    d = tmp_path_factory.mktemp("bridge")
    (d / "test_case.py").write_text(CASE)
    _git(d, "init", "-q")
    _git(d, "add", "test_case.py")
    _git(d, "commit", "-qm", "case")
    for extra in (("--benchmark-json=b.json", "--benchmark-autosave"),
                  ("--benchmark-save=second",)):  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "pytest", "test_case.py", *SHORT_RUN, *extra],
                             cwd=d, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    return d


def _ours(data: dict) -> dict:
    [bench] = [b for b in data["benchmarks"] if b["group"] == "specperf"]
    return bench


def test_each_case_is_one_benchmark_with_its_steps_as_rounds(saved):
    data = json.loads((saved / "b.json").read_text())
    bench = _ours(data)
    assert (bench["name"], bench["fullname"]) == (NAME, FULLNAME)
    assert bench["param"] == "ctx=2048 kv=contiguous bs=1"
    assert bench["params"] == {"ctx": "2048", "kv": "contiguous", "bs": "1"}
    stats, extra = bench["stats"], bench["extra_info"]
    steps_ms = extra["specperf"]["samples"]["step_ms"]
    assert stats["rounds"] == len(stats["data"]) == 8 and stats["iterations"] == 1
    assert stats["data"] == pytest.approx([ms / 1e3 for ms in steps_ms], rel=1e-12)
    assert stats["median"] * 1e3 == pytest.approx(extra["step_ms"], rel=1e-5)
    assert stats["ops"] == pytest.approx(1 / stats["mean"])  # decode steps per second
    assert bench["options"]["timer"].startswith("perf_counter_ns in the model server")


def test_extra_info_machine_info_and_commit_info(saved):
    data = json.loads((saved / "b.json").read_text())
    extra = _ours(data)["extra_info"]
    for phase in ALL_PHASES:  # the embedded engine has no scheduler host phases
        if phase not in HOST_PHASES:
            assert extra[f"{phase}_ms"] >= 0
        else:
            assert f"{phase}_ms" not in extra
    assert extra["verify_ms"] > 0 and extra["accept_len"] >= 1 and extra["tokens_per_s"] > 0
    assert extra["kv_fragmentation"] == 0.0
    assert extra["verdict"] in {v.value for v in Verdict}
    assert extra["fingerprint"]["backend"] == "reference"
    assert extra["engine"] == "reference tiny DFLASH"
    device = data["machine_info"]["specperf_device"]
    assert (device["slug"], device["kind"]) == ("test-box", "cpu") and device["cpu_cores"] >= 1
    assert data["commit_info"]["id"] == _git(saved, "rev-parse", "HEAD")
    assert data["specperf"]["schema_version"] == 1


def test_autosave_and_save_write_storage_that_reads_back(saved):
    machine = next((saved / ".benchmarks").iterdir())
    first, second = sorted(machine.glob("*.json"))
    assert first.name.startswith("0001_") and second.name == "0002_second.json"
    for path in (first, second):
        run = read_report(path)
        assert run.source == "pytest-benchmark" and [c.key for c in run.cases] == [
            "ctx=2048 kv=contiguous bs=1"]
        assert run.commit["id"] == _git(saved, "rev-parse", "HEAD")


def test_pytest_benchmark_compare_prints_our_cases(saved):
    out = subprocess.run([str(PYTEST_BENCHMARK), "compare", "0001", "0002", "--columns=median,rounds"],
                         cwd=saved, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    text = out.stdout
    assert "benchmark 'specperf': 2 tests" in text and "Name (time in ms)" in text
    machine = next((saved / ".benchmarks").iterdir())
    for path in sorted(machine.glob("*.json")):
        median_ms = _ours(json.loads(path.read_text()))["stats"]["median"] * 1e3
        [line] = [ln for ln in text.splitlines() if ln.startswith(NAME) and path.stem[:10] in ln]
        assert re.search(rf"\s{median_ms:.4f} \(\d", line), (line, median_ms)
        assert line.rstrip().endswith(" 8"), line  # rounds: the measured steps


def test_json_holds_what_github_action_benchmark_reads(saved):
    """github-action-benchmark (``tool: 'pytest'``), src/extract.ts ``extractPytestResult``:
    for each of ``benchmarks`` it takes ``fullname`` as the name, ``stats.ops`` as the value
    (unit ``iter/sec``; here decode steps per second), ``stats.stddev`` for the range and
    ``stats.mean`` and ``stats.rounds`` for the extra text."""
    data = json.loads((saved / "b.json").read_text())
    bench = _ours(data)
    assert isinstance(bench["fullname"], str) and bench["fullname"] == FULLNAME
    stats = bench["stats"]
    for field in ("ops", "stddev", "mean"):
        assert isinstance(stats[field], float) and math.isfinite(stats[field])
    assert isinstance(stats["rounds"], int) and stats["rounds"] == 8
    assert stats["ops"] > 0 and 0 < stats["mean"] < 10  # seconds per step


def test_specperf_compare_and_history_read_the_storage(saved, tmp_path):
    from pytest_specperf.__main__ import main

    out = subprocess.run([sys.executable, "-m", "pytest_specperf", "compare", "0001", "0002",
                          "--tolerance", "0.9,step=0.95"],
                         cwd=saved, capture_output=True, text=True, timeout=120)  # fmt: skip
    # two real runs on a shared machine: SLOWER is possible, and then the exit status is 1
    assert out.returncode == (1 if "SLOWER" in out.stdout else 0), out.stdout + out.stderr
    assert "test_decode ctx=2048 kv=contiguous bs=1" in out.stdout
    assert "B (judged against A): " in out.stdout and "0002_second.json" in out.stdout
    assert main(["history", str(saved / ".benchmarks"), "--out", str(tmp_path), "--no-plots"]) == 0


@pytest.fixture(scope="module")
def attach(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``--specperf-attach`` to one running reference server (tiny, CPU, one thread)."""
    proc, client = launch_reference(tmp_path_factory.mktemp("server"))
    yield f"--specperf-attach={client.base_url}"
    proc.stop()


def _setup(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_case=CASE)


def test_a_users_benchmark_lands_next_to_ours(pytester, attach):
    _setup(pytester)
    result = pytester.runpytest_subprocess(*SHORT_RUN, attach, "--benchmark-json=j.json",
                                           timeout=300)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*benchmark: 1 tests*", "*test_user*",
                                 "*benchmark 'specperf': 1 tests*",
                                 NAME.replace("[", "[[]") + "*"])  # fmt: skip  ([ is fnmatch's
    data = json.loads((pytester.path / "j.json").read_text())
    assert sorted(b["name"] for b in data["benchmarks"]) == [NAME, "test_user"]
    [user] = [b for b in data["benchmarks"] if b["name"] == "test_user"]
    assert user["group"] is None and user["stats"]["rounds"] > 1  # timed in-process, as ever
    assert user["extra_info"] == {}


def test_benchmark_skip_skips_only_benchmark_fixture_tests(pytester, attach):
    _setup(pytester)
    result = pytester.runpytest_subprocess(*SHORT_RUN, attach, "--benchmark-skip", "--benchmark-json=s.json",
                                           timeout=300)  # fmt: skip
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*test_decode ctx=2048 kv=contiguous bs=1*NO_BASELINE*"])
    data = json.loads((pytester.path / "s.json").read_text())
    assert [b["name"] for b in data["benchmarks"]] == [NAME]


def test_benchmark_disable_keeps_the_gate_and_hands_nothing_over(pytester, attach):
    _setup(pytester)
    result = pytester.runpytest_subprocess(*SHORT_RUN, attach, "--benchmark-disable", "--benchmark-json=d.json",
                                           timeout=300)  # fmt: skip
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_decode ctx=2048 kv=contiguous bs=1*NO_BASELINE*"])
    assert not (pytester.path / "d.json").exists()  # pytest-benchmark: nothing to save
    assert "benchmark 'specperf'" not in result.stdout.str()


def test_without_benchmark_options_the_output_is_ours_alone(pytester, attach):
    _setup(pytester)
    result = pytester.runpytest_subprocess(*SHORT_RUN, attach, timeout=300)
    result.assert_outcomes(passed=2)
    text = result.stdout.str()
    assert "benchmark 'specperf'" not in text and "test_user" in text  # the user's table only
    assert list((pytester.path / ".benchmarks").iterdir()) == []  # nothing saved


def test_pytest_benchmark_disabled_as_a_plugin(pytester, attach):
    _setup(pytester)
    result = pytester.runpytest_subprocess(*SHORT_RUN, attach, "-p", "no:benchmark", "-k", "decode",
                                           "--specperf-json=r.json", timeout=300)  # fmt: skip
    result.assert_outcomes(passed=1, deselected=1)
    report = read_report(pytester.path / "r.json")
    assert report.commit == {} and report.datetime is not None  # no pytest-benchmark: no commit
    result.stdout.fnmatch_lines(["specperf: reference backend*"])


def test_benchmark_compare_does_not_warn_about_the_same_machine(saved):
    """``--benchmark-compare`` compares machine_info before any case ran: the device is
    given then too, so a run on the saved run's machine gets no machine_info warning."""
    out = subprocess.run([sys.executable, "-m", "pytest", "test_case.py", *SHORT_RUN,
                          "--benchmark-compare=0001"],
                         cwd=saved, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Comparing against benchmarks from" in out.stdout + out.stderr
    assert "machine_info is different" not in out.stdout + out.stderr
