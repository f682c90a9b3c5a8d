"""Canaries that prove each activity verdict end to end on a CPU (real reference server).

* ``verify_wait=MS``: the phase's thread sleeps inside verify: wall time grows, CPU time
  does not -> "the thread waited inside verify";
* ``verify=1.10``: busy work inside verify -> "busy on the CPU";
* ``host_stall=MS``: a busy stall outside every phase -> "host stall";
* the founding incident's shape (most of the step idle inside verify) on a first run with
  no baseline fails a ``min_active_share`` budget.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
from e2e import SHORT_RUN

pytestmark = pytest.mark.timeout(600)

CASE = """
import pytest

@pytest.mark.specperf(gate=["verify"]{budget})
@pytest.mark.parametrize("context_len", [2048])
def test_decode(specperf, context_len):
    specperf.decode(context_len=context_len)
"""
ARGS = (*SHORT_RUN, "--specperf-json=report.json", "-rP")


def _run(pytester, inject: str, budget: str = "", extra: tuple[str, ...] = ()):
    pytester.makepyfile(test_case=CASE.format(budget=budget))
    result = pytester.runpytest_subprocess(*ARGS, f"--specperf-inject={inject}", *extra,
                                           timeout=300)  # fmt: skip
    report = json.loads((pytester.path / "report.json").read_text())
    return result, report["cases"][0]


def _busy(case, part: str) -> bool:
    """Whether the one rule (``bottleneck.cpu_activity_kind``) answers "cannot tell" for
    ``part``: the machine was busy (the step's run-queue time most of its time off the
    CPU) and the part itself spent a material share of its span off the CPU."""
    from pytest_specperf.judging.bottleneck import StepFigures, cpu_activity_kind

    f = case["bottleneck"]["figures"]
    figures = StepFigures(step_ms=f["step_ms"], cpu_ms={"step": f.get("cpu_ms.step", 0.0)},
                          runq_ms=f.get("runq_ms"))  # fmt: skip
    p = case["activity"]["phases"][part]
    return cpu_activity_kind(figures, p["span_ms"], p["active_ms"]) == "busy"


def _waited_or_busy(case) -> str:
    """A sleep inside verify reads as waiting inside it; on a machine so busy that the
    run-queue time could hold the sleep, the one rule says it cannot tell."""
    if _busy(case, "verify"):
        return "cannot tell: the machine was busy*"
    return "the thread waited inside verify (waits, not work)"


def test_verify_wait_reads_as_waiting_inside_verify(pytester):
    result, case = _run(pytester, "verify_wait=40")
    # no baseline, no budget: the test passes, and says why; but the run fails, a canary
    # that no gate named (there was no baseline to judge), as a failed check of its own
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["ERROR: canary not detected: verify_wait=40 was injected and "
                                 "no gate named verify (no case had a baseline*"])  # fmt: skip
    # (-rP: pytest's short test summary lists passes only; FAILURES holds the check)
    result.stdout.fnmatch_lines(["*_ specperf::canary _*", "canary not detected: verify_wait=40*"])
    # ... and the JSON report says so, for a nightly job that reads it instead of the log
    canary = json.loads((pytester.path / "report.json").read_text())["canary"]
    assert canary["inject"] == "verify_wait=40" and canary["caught"] is False
    assert canary["missed"].startswith("canary not detected: verify_wait=40 was injected")
    result.stdout.fnmatch_lines(
        [
            "*bottleneck: host only (no device timing): step * ms, CPU time *% of it*",
            "*verify: span * ms, CPU * ms (*%)*: " + _waited_or_busy(case),
            "*phase*now ms*cpu ms*waited ms*",
        ]
    )
    verify = case["activity"]["phases"]["verify"]
    assert verify["span_ms"] >= 40 and verify["cpu_ms"] < 0.5 * verify["span_ms"]
    assert verify["idle_ms"] == pytest.approx(verify["span_ms"] - verify["active_ms"])
    assert case["activity"]["source"] == "cpu"
    # one line per phase of at least MIN_LINE_SHARE of the step, in phase order: draft
    # (about 6% of this step on a slower box) may come first; verify's must say it waited
    (verify_line,) = [x for x in case["bottleneck"]["lines"] if x.startswith("verify: span")]
    assert _waited_or_busy(case).rstrip("*") in verify_line


def test_busy_verify_reads_as_work(pytester):
    result, case = _run(pytester, "verify=1.10")
    result.assert_outcomes(passed=1, failed=1)  # the canary: no baseline named verify
    # by the one rule: work, or on a busy machine "cannot tell", never "waited"
    verdict = "cannot tell: the machine was busy" if _busy(case, "verify") else "busy on the CPU (work, not waits)"
    result.stdout.fnmatch_lines([f"*verify: span * ms, CPU * ms (*%)*: {verdict}*"])
    assert "waited inside verify" not in result.stdout.str()
    assert case["labels"] == {"inject": "verify=1.1"}


def test_host_stall_reads_as_a_stall_outside_the_phases(pytester):
    result, case = _run(pytester, "host_stall=20")
    result.assert_outcomes(passed=1, failed=1)  # the canary: no baseline named unaccounted
    # a busy spin: a stall by the one rule, or "cannot tell" on a machine too busy to say
    stall = "host stall (work outside the mapped phases)"
    verdict = "cannot tell: the machine was busy*" if _busy(case, "unaccounted") else stall
    result.stdout.fnmatch_lines([f"*unaccounted * ms outside every phase, CPU * ms (*%)*: {verdict}"])
    assert "the thread waited outside every phase" not in result.stdout.str()
    unacc = case["activity"]["phases"]["unaccounted"]
    assert unacc["span_ms"] >= 20


def test_incident_shape_fails_a_first_run_on_its_active_share_budget(pytester):
    """Most of the step idle inside verify, no baseline: NO_BASELINE would pass, the
    budget fails the case with the diagnosis. Measured in two server processes, every
    output (terminal, Markdown, JUnit, JSON, picture) names one verdict and shows one step
    time and one accepted length (the centers over the processes), and the bottleneck
    quotes the run line's active share."""
    result, case = _run(pytester, "verify_wait=60", budget=', min_active_share="50%"',
                        extra=("--specperf-processes=2", "--specperf-markdown=summary.md",
                               "--junitxml=junit.xml"))  # fmt: skip
    assert result.ret == 1
    result.assert_outcomes(failed=2)  # the case, on its budget; the canary, named by no gate
    result.stdout.fnmatch_lines(
        [
            "*over budget: active_share *% < min 50.0% (min_active_share) at ctx=2048 "
            "kv=contiguous [[]baselines/test-box.yaml[]] [[]injected: verify_wait=60[]]",
            "*bottleneck (server process 1 of 2): host only*",  # the first process's figures
            "*verify: span * ms, CPU * ms*" + _waited_or_busy(case),
            "*test_decode ctx=2048 kv=contiguous bs=1*OVER_BUDGET (NO_BASELINE) [[]injected[]]*",
        ]
    )
    assert case["verdict"] == "NO_BASELINE" and case["failed"] is True
    (budget,) = case["budgets"]
    assert budget["budget"] == "min_active_share" and budget["failed"] is True
    assert budget["value"] < 0.5
    _every_output_agrees(pytester, result.stdout.str(), case)


def _every_output_agrees(pytester, out: str, case) -> None:
    name, label = "test_decode ctx=2048 kv=contiguous bs=1", "OVER_BUDGET (NO_BASELINE)"
    assert len(case["runs"]) == 2  # two processes: a center is not the first's median
    now = case["centers"]["now"]
    step, accept = now["step"], now["accept_len"]
    (row,) = [line for line in out.splitlines() if line.startswith(name) and label in line]
    assert f"- -> {step:.2f}" in row and f" {accept:.2f} " in row, row
    md = (pytester.path / "summary.md").read_text()
    (md_row,) = [line for line in md.splitlines() if line.startswith(f"| {name} ")]
    cells = [c.strip() for c in md_row.strip("|").split(" | ")]
    assert cells[1] == f"- -> {step:.2f}" and cells[4] == f"{accept:.2f}", cells
    assert cells[-1].startswith(label) and f"#### {name}: {label}" in md, cells
    root = ET.parse(pytester.path / "junit.xml").getroot()
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["specperf.verdict"] == label
    assert props["specperf.step_ms"] == f"{step:.4f}"
    assert props["specperf.accept_len"] == f"{accept:.3f}"
    assert props["specperf.phase.verify_ms"] == f"{now['verify']:.4f}"
    svg = (pytester.path / "report.svg").read_text()
    assert f">{label}</text>" in svg and f">now {step:.2f} ms</text>" in svg
    # the bottleneck's "CPU time N% of it" is the run line's "active N%": one figure
    cpu = re.search(r"CPU time (\d+)% of it", out)
    active = re.search(r"active (\d+)% \(CPU time of the step\)", out)
    assert cpu and active and cpu.group(1) == active.group(1), (cpu, active)
    assert f"{case['bottleneck']['figures']['step_active_share']:.0%}" == f"{active.group(1)}%"
