"""The nightly CI gate end to end against real reference servers: --specperf-strict, the
Markdown summary (and GitHub's step summary), JUnit properties, unusable destinations, and
pytest-xdist (-n 2: one server per worker, the controller writes once and reports all).

Verdicts that depend on this machine's noise are not asserted here (the e2e and
calibration tests deal with them): the runs below are NO_BASELINE or update runs, whose
outcome does not depend on timing.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from e2e import SHORT_RUN

pytestmark = pytest.mark.timeout(600)

CASES = """
import pytest

@pytest.mark.parametrize("context_len", [1024, 2048])
def test_decode(specperf, context_len):
    specperf.decode(context_len=context_len)
"""
KEYS = ("ctx=1024 kv=contiguous bs=1", "ctx=2048 kv=contiguous bs=1")
ENGINE = "reference tiny DFLASH"


def _run(pytester, *extra):
    return pytester.runpytest_subprocess(*SHORT_RUN, *extra, timeout=300)


def _last_summary_line(result) -> str:
    """The last line of the plugin's summary (pytest's short summary and closing line
    follow it)."""
    lines = result.stdout.lines
    end = next(i for i, line in enumerate(lines) if line.startswith("specperf: ") and
               "backend, device" in line)  # fmt: skip
    while end + 1 < len(lines) and not lines[end + 1].startswith("="):
        end += 1
    return lines[end]


def _table_rows(text: str) -> list[list[str]]:
    """Cells of the Markdown table rows (header and rule included)."""
    return [
        [c.strip() for c in line.strip("|").split(" | ")]
        for line in text.splitlines()
        if line.startswith("| ")
    ]


def _properties(junit: Path) -> dict[str, list[tuple[str, str]]]:
    """JUnit test case name -> its properties, in order."""
    root = ET.parse(junit).getroot()
    return {
        tc.get("name"): [(p.get("name"), p.get("value")) for p in tc.iter("property")]
        for tc in root.iter("testcase")
    }


def test_strict_run_without_baselines_fails_every_case_and_reports_it(pytester, monkeypatch):
    pytester.makepyfile(test_ci=CASES)
    step_summary = pytester.path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    result = _run(pytester, "--specperf-strict", "--specperf-markdown=out/summary.md",
                  "--junitxml=junit.xml", "--specperf-json=out/report.json")  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*--specperf-strict: ctx=1024 kv=contiguous bs=1 was not judged",
        "  NO_BASELINE: no baseline file baselines/test-box.yaml; record it with: pytest "
        "*--specperf-steps=8,warmup=2 * --specperf-markdown=out/summary.md * --specperf-update-baselines",
    ])  # fmt: skip
    command = result.stdout.str().split("record it with: ")[1].split("\n")[0]
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert [c["family"]["tests"] for c in report["cases"]] == [2, 2]  # the run's 2 tests
    assert "--specperf-strict" not in command
    assert _last_summary_line(result) == (
        "strict: judged 0 of 2 cases; not judged: test_decode ctx=1024 kv=contiguous bs=1 "
        "(NO_BASELINE), test_decode ctx=2048 kv=contiguous bs=1 (NO_BASELINE)"
    )

    md = (pytester.path / "out" / "summary.md").read_text()
    rows = _table_rows(md)
    assert rows[0] == ["case", "step ms (base -> now)", "step (judged)", "most changed", "accept", "verdict"]
    assert [r[0] for r in rows[2:]] == [f"test_decode {k}" for k in KEYS]
    assert all(r[-1] == "NO_BASELINE" and float(r[4]) > 1.0 for r in rows[2:])
    assert "telemetry unavailable: no CUDA device (CPU run); host-side view" in md
    assert "#### test_decode ctx=1024 kv=contiguous bs=1: NO_BASELINE" in md
    assert "report.json`, picture: `" in md and "report.svg`" in md
    assert md.rstrip().endswith("(NO_BASELINE)**")
    assert step_summary.read_text() == "earlier step\n" + md  # appended, not replaced

    props = _properties(pytester.path / "junit.xml")
    assert set(props) == {"test_decode[1024]", "test_decode[2048]"}
    p = dict(props["test_decode[1024]"])
    assert p["specperf.case"] == KEYS[0] and p["specperf.verdict"] == "NO_BASELINE"
    assert float(p["specperf.step_ms"]) > 0 and float(p["specperf.phase.verify_ms"]) > 0
    assert {f"specperf.phase.{ph}_ms" for ph in ("draft", "kv_commit", "unaccounted")} <= set(p)
    assert float(p["specperf.accept_len"]) > 1.0
    assert p["specperf.baseline"] == "baselines/test-box.yaml"
    assert p["specperf.not_judged"] == "NO_BASELINE"


def test_strict_update_records_whole_measurements(pytester):
    pytester.makepyfile(test_ci=CASES)
    result = _run(pytester, "--specperf-strict", "--specperf-update-baselines", "-rP")
    result.assert_outcomes(passed=2)
    assert _last_summary_line(result) == "strict: recorded 2 of 2 cases"
    # the passing case's report section carries the bottleneck verdict and phase table
    result.stdout.fnmatch_lines([
        "*ctx=1024 kv=contiguous bs=1: NO_BASELINE",
        # (", waiting for a CPU N% (a busy machine)" follows "of it" on a loaded box)
        "bottleneck: host only (no device timing): step * ms, CPU time * of it*, unaccounted * ms (*)*",
        "phase*base ms*now ms*change*share*",
    ])  # fmt: skip
    data = yaml.safe_load((pytester.path / "baselines" / "test-box.yaml").read_text())
    assert set(data["engines"][ENGINE]["cases"]["test_ci.py::test_decode"]) == set(KEYS)


def test_a_missed_canary_is_a_failed_test_of_its_own_in_the_summary_and_junit(pytester):
    """Both tests pass (no baseline: NO_BASELINE) and the canary goes unnamed: the exit
    status, pytest's closing line, its short summary and the JUnit file all say one check
    failed, ``specperf::canary``, with the summary's reason (the caches: test_run_checks)."""
    pytester.makepyfile(test_ci=CASES)
    result = _run(pytester, "--specperf-inject=verify=1.5", "--junitxml=junit.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*_ specperf::canary _*",
        "canary not detected: verify=1.5 was injected and no gate named verify*",
        "ERROR: canary not detected: verify=1.5 was injected*",
        "FAILED specperf::canary - canary not detected: verify=1.5 was injected*",
        "*1 failed, 2 passed*",
    ])  # fmt: skip
    root = ET.parse(pytester.path / "junit.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    cases = {(tc.get("classname"), tc.get("name")): tc for tc in root.iter("testcase")}
    assert set(cases) == {("test_ci", "test_decode[1024]"), ("test_ci", "test_decode[2048]"),
                          ("specperf", "canary")}  # fmt: skip
    failure = cases[("specperf", "canary")].find("failure")
    assert failure is not None
    assert failure.get("message", "").startswith("canary not detected: verify=1.5 was injected")
    assert all(tc.find("failure") is None for key, tc in cases.items() if key[0] == "test_ci")


@pytest.mark.parametrize(
    ("option", "make"),
    [
        ("--specperf-markdown", lambda d: (d / "out.md").mkdir() or "out.md"),
        ("--specperf-markdown", lambda d: (d / "afile").write_text("x") and "afile/out.md"),
        ("--specperf-json", lambda d: (d / "afile").write_text("x") and "afile/r.json"),
        ("--junitxml", lambda d: (d / "afile").write_text("x") and "afile/junit.xml"),
    ],
    ids=["markdown-directory", "markdown-under-a-file", "json-under-a-file", "junit-under-a-file"],
)
def test_unusable_destination_is_a_usage_error_before_any_server(pytester, option, make):
    pytester.makepyfile(test_ci=CASES)
    dest = make(pytester.path)
    result = pytester.runpytest(*SHORT_RUN, f"{option}={dest}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}: invalid value '{dest}'; expected a file path*"])
    assert "starting reference server" not in result.stdout.str()


def test_unwritable_destination_is_a_usage_error(pytester):
    pytester.makepyfile(test_ci=CASES)
    target = "/proc/specperf-summary.md"  # not writable, even for root
    result = pytester.runpytest(*SHORT_RUN, f"--specperf-markdown={target}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--specperf-markdown: invalid value '{target}'; expected a "
                                 "file path this user may write (*)"])  # fmt: skip


def test_more_workers_than_gpus_is_refused(pytester, monkeypatch):
    def fake_one_gpu() -> int:
        return 1

    monkeypatch.setattr("pytest_specperf.plugin.xdist.visible_gpus", fake_one_gpu)
    pytester.makepyfile(test_ci=CASES)
    result = pytester.runpytest(*SHORT_RUN, "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-n 2: only 1 GPU(s) visible*use -n 1 or fewer*"])


def test_workers_cannot_share_an_attached_server(pytester):
    pytester.makepyfile(test_ci=CASES)
    result = pytester.runpytest(*SHORT_RUN, "-n", "2", "--specperf-attach=http://127.0.0.1:3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*-n 2 with --specperf-attach*attach without -n*"])


def test_xdist_workers_measure_and_the_controller_writes_once(pytester):
    """-n 2 on a CPU: one reference server (one thread) per worker; the update is written
    once by the controller, and every report holds both workers' cases."""
    pytester.makepyfile(test_ci=CASES)
    result = _run(pytester, "-n", "2", "--specperf-update-baselines", "--specperf-json=r.json",
                  "--specperf-markdown=s.md", "--junitxml=j.xml")  # fmt: skip
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert out.count("baselines written:") == 1
    result.stdout.fnmatch_lines([
        "specperf: reference backend, device test-box, baselines baselines/test-box.yaml, "
        "tolerance 7% (phases), 25% (step time), 2 xdist workers",
        "test_decode ctx=1024 kv=contiguous bs=1 * NO_BASELINE (recorded)",
        "test_decode ctx=2048 kv=contiguous bs=1 * NO_BASELINE (recorded)",
        "baselines written: baselines/test-box.yaml (2 case(s) recorded, 0 kept); what moved:",
    ])  # fmt: skip
    data = yaml.safe_load((pytester.path / "baselines" / "test-box.yaml").read_text())
    assert set(data["engines"][ENGINE]["cases"]["test_ci.py::test_decode"]) == set(KEYS)

    report = json.loads((pytester.path / "r.json").read_text())
    assert [c["key"] for c in report["cases"]] == list(KEYS)
    assert report["xdist_workers"] == 2
    servers = report["servers"]
    assert len(servers) == 2 and servers[0]["pid"] != servers[1]["pid"]
    assert (pytester.path / "r.svg").read_text().count("test_decode ctx=") == 2
    rows = _table_rows((pytester.path / "s.md").read_text())
    assert [r[0] for r in rows[2:]] == [f"test_decode {k}" for k in KEYS]
    props = _properties(pytester.path / "j.xml")
    assert {dict(p)["specperf.case"] for p in props.values()} == set(KEYS)

    # the workers read what was written: both cases judged against it. Two workers with a
    # server each contend for 2 cores, so a verdict may be SLOWER (a CI run saw draft +80%
    # at tolerance 60%): this test is about the plumbing, not the timing
    again = _run(pytester, "-n", "2", "--specperf-tolerance=60%,step=90%",
                 "--specperf-json=again.json")  # fmt: skip
    outcomes = again.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 2, outcomes
    assert "NO_BASELINE" not in again.stdout.str()
    judged = json.loads((pytester.path / "again.json").read_text())["cases"]
    assert sorted(c["key"] for c in judged) == sorted(KEYS)
    # each worker collected both tests: each case was judged at half the run's budget
    assert [c["family"]["tests"] for c in judged] == [2, 2]
    assert all(c["baseline"] is not None for c in judged), [c["verdict"] for c in judged]
