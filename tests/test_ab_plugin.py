"""A/B in one run end to end with the reference engine: a running reference server as
side A (``--specperf-ab url=``, one server for the module), the build under test launched
as side B (or a second running server, attached: no launch, so the canary test stays
short). A/A passes and every report says it was A/B against which side; a verify canary
injected into B only (through its control file) fails naming verify and its change
against A."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e import SHORT_RUN
from rawhttp import launch_reference

from pytest_specperf.engines.reference.backend import ReferenceBackend
from pytest_specperf.engines.reference.kv import THP_ENV
from pytest_specperf.judging.verdict import is_disturbed
from pytest_specperf.server.client import ServerClient
from pytest_specperf.server.protocol import BackendSettings

pytestmark = pytest.mark.timeout(300)

#: One case gated on verify (as ``e2e.VERIFY_CASE``) and the accept length (the same
#: greedy tokens on both sides: exact); an A/B case measures each process twice with one
#: process a side: 16 steps of 8 per round.
CASE = """
import pytest

@pytest.mark.specperf(gate=["verify", "accept_len"])
def test_decode(specperf):
    run = specperf.decode(context_len=2048)
    assert run.steps == 16 and run.rounds == 2
"""

#: B as the module's reference server runs: one thread, on the CPU, one process per side
#: (the order is then A1 B1 B1 A1: two rounds of each)
SIDE_B = ("--specperf-server-arg=--threads=1", "--specperf-server-arg=--device=cpu",
          "--specperf-processes=1")  # fmt: skip


#: A tolerance wide enough that a false alarm of the A/A run needs a change beyond 30% as
#: well as the 5%-per-run significance (a loaded 2-core box shows +-25% on verify with 16
#: steps), and narrow enough for the canary (verify x2: +100% raw, more against the rest).
WIDE = "--specperf-tolerance=30%"


@pytest.fixture(scope="module")
def side_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerClient]:
    proc, client = launch_reference(tmp_path_factory.mktemp("ab-side-a"))
    yield client
    proc.stop()


@pytest.fixture(scope="module")
def side_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerClient]:
    proc, client = launch_reference(tmp_path_factory.mktemp("ab-side-b"))
    yield client
    proc.stop()


def _ab(pytester: pytest.Pytester, url: str, *extra: str) -> pytest.RunResult:
    pytester.makepyfile(test_case=CASE)
    return pytester.runpytest_subprocess(
        *SHORT_RUN, WIDE, f"--specperf-ab=url={url}", "--specperf-json=r.json",
        "--junitxml=j.xml", "--specperf-markdown=s.md", *extra, timeout=240,
    )  # fmt: skip


def _case(pytester: pytest.Pytester) -> dict:
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["comparison"] == {"mode": "ab", "reference": f"url={report_url(report)}"}
    [case] = report["cases"]
    return case


def report_url(report: dict) -> str:
    return str(report["comparison"]["reference"]).removeprefix("url=")


def _verify(case: dict) -> dict:
    [m] = [m for m in case["metrics"] if m["metric"] == "verify"]
    return m


def test_a_a_against_a_running_reference_passes_and_every_report_says_ab(
    pytester: pytest.Pytester, side_a: ServerClient
) -> None:
    url = side_a.base_url
    result = _ab(pytester, url, *SIDE_B)
    result.assert_outcomes(passed=1)
    against = f"A/B in this run: B (this build) against A (url={url})"
    result.stdout.fnmatch_lines(
        [f"*{against}*A one running server, B 1 server process(es), alternating A B B A*"]
    )
    assert "baselines baselines/test-box.yaml" not in result.stdout.str()
    case = _case(pytester)
    assert case["ab"]["reference"] == f"url={url}"
    assert case["ab"]["order"] == ["A1 B1 B1 A1"]  # one process a side, measured twice
    assert case["baseline"]["file"] is None and case["baseline"]["runs"] == 1
    m = _verify(case)
    assert m["verdict"] != "SLOWER" and m["base_runs"] == 1 and m["now_runs"] == 1
    assert m["sitting_coef"] == 0.0  # both sides in one sitting: no sitting term
    assert m["base"] == case["centers"]["base"]["verify"]  # one number everywhere
    # the same tokens on both sides, every block of every round: exact, no prior imposed
    [accept] = [m for m in case["metrics"] if m["metric"] == "accept_len"]
    assert (accept["verdict"], accept["change"], accept["noise"]) == ("SAME", 0.0, 0.0)
    assert accept["exact_runs"] == 2  # A1 and B1 (B1 again as the tested side's evidence
    assert any(r.startswith("accept_len exact: every block identical in 2 runs")  # is B1)
               for r in case["reasons"])  # fmt: skip
    props = {
        p.get("name"): p.get("value") for p in ET.parse(pytester.path / "j.xml").iter("property")
    }
    assert props["specperf.ab_reference"] == f"url={url}"
    assert props["specperf.baseline"] == f"A/B in this run against A: url={url}"
    assert against in (pytester.path / "s.md").read_text()
    assert not (pytester.path / "baselines").exists()  # an A/B run writes no baseline


def test_a_running_reference_against_two_tested_processes_pairs_its_blocks(
    pytester: pytest.Pytester, side_a: ServerClient
) -> None:
    """``A1 B1 B2 A1``: the running server measures two rounds of the case, each tested
    process one. A's rounds fold onto B's blocks, so the comparison pairs block by block
    (``judged_base``: the paired statistic's centers); unfolded, A's 16 blocks could not
    pair with B's 8 and the case was judged on the unpaired centers."""
    one_round = CASE.replace("run.steps == 16 and run.rounds == 2", "run.steps == 8 and run.rounds == 1")
    assert one_round != CASE
    pytester.makepyfile(test_case=one_round)
    result = pytester.runpytest_subprocess(
        *SHORT_RUN, WIDE, f"--specperf-ab=url={side_a.base_url}", "--specperf-json=r.json",
        *SIDE_B[:2], "--specperf-processes=2", timeout=240,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    case = _case(pytester)
    assert case["ab"]["order"] == ["A1 B1 B2 A1"] and case["ab"]["reference_processes"] == 1
    m = _verify(case)
    assert (m["base_runs"], m["now_runs"]) == (1, 2)
    assert m["judged_base"] is not None and m["judged_now"] is not None  # paired
    assert m["floor"] is not None and m["floor"] < m["noise"]  # blocks that pair can shrink


def test_a_nightly_ab_learns_the_process_spread_from_its_earlier_reports(
    pytester: pytest.Pytester, side_a: ServerClient
) -> None:
    """``--specperf-history`` in A/B mode: the second night reads the first night's report
    and its tested process joins the evidence of the between-process noise (one more
    history run in every noisy gate; the exact accept length counts it too)."""
    url = side_a.base_url
    hist = pytester.path / "ab-history"
    hist.mkdir()
    _ab(pytester, url, *SIDE_B, f"--specperf-history={hist}").assert_outcomes(passed=1)
    first = {m["metric"]: m for m in _case(pytester)["metrics"]}
    (hist / "night1.json").write_text((pytester.path / "r.json").read_text())
    result = _ab(pytester, url, *SIDE_B, f"--specperf-history={hist}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*history: 1 run(s) of 1 case(s) from 1 report(s)*"])
    second = {m["metric"]: m for m in _case(pytester)["metrics"]}
    assert second["verify"]["history_runs"] == first["verify"]["history_runs"] + 1
    assert second["accept_len"]["exact_runs"] == first["accept_len"]["exact_runs"] + 1


def test_a_verify_canary_on_the_tested_side_fails_naming_verify_against_the_reference(
    pytester: pytest.Pytester, side_a: ServerClient, side_b: ServerClient
) -> None:
    url = side_a.base_url
    result = _canary_judged(pytester, url, side_b.base_url)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*verify / rest of step * -> * (+*%, tol 30%*[[]A/B in this run against A: url={url}[]] "
        "[[]injected: verify=2[]]*",
        "*SLOWER [[]injected[]]*",
    ])  # fmt: skip
    case = _case(pytester)
    m = _verify(case)
    assert m["verdict"] == "SLOWER" and m["change"] > 0.5
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["canary"] == {"inject": "verify=2", "caught": True, "missed": None}
    # the canary went into B only: A's verify is the unslowed one. B's verify is twice B's
    # own; A's, measured between B's on two busy cores, has been 36% above B's natural one
    # (a CI run: 8.02 -> 11.86 ms, x1.48), so the bar is the direction with room: canary in
    # A would read below 1, in both about 1
    assert case["centers"]["now"]["verify"] > 1.25 * case["centers"]["base"]["verify"]
    # each pair's B/A change, one process a side: the same ratio, the same bar
    assert case["ab"]["pairs"]["verify"] and min(case["ab"]["pairs"]["verify"]) > 0.25


def _canary_judged(pytester: pytest.Pytester, url: str, b_url: str) -> pytest.RunResult:
    """The verify=2 canary run, once more if the first was UNSTABLE. A side disturbed by the
    machine makes even a 2x canary UNSTABLE, as it should (a CI run: side A's blocks
    scattered 29.6%, 3.2x more than B's, and 3 x 29.6% = 89% (log) of disturbance could
    explain the +105%): that run must still move verify up, say why, and fail the session as
    a canary that was not detected; the rerun is the one judged."""
    for attempt in (1, 2):
        result = _ab(pytester, url, f"--specperf-attach={b_url}", "--specperf-inject=verify=2")
        m = _verify(_case(pytester))
        if m["verdict"] != "UNSTABLE" or attempt == 2:
            return result
        assert m["change"] > 0 and result.ret != 0, m
        # why it is undecided: a side disturbed (its blocks scatter more), or a noise band
        # wider than the change (terminal.unstable_advice says which)
        disturbed = is_disturbed(m["scatter_ratio"])
        why = "but side * scatter *x more than the other's" if disturbed else "within noise"
        result.stdout.fnmatch_lines([
            f"UNSTABLE *: verify / rest of step changed +*{why}*",
            "ERROR: canary not detected: verify=2 was injected*",
        ])  # fmt: skip
    raise AssertionError("unreachable")


def test_an_ab_run_honours_the_files_mark_only_from_a_comparable_recording(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device's baseline file marks the case's verify not gated (by hand here, as a
    recording in several processes marks a split): an A/B run whose sides match the
    recording leaves the gate out and says so once; the same A/B run with huge pages on
    both sides judges it (a split recorded without them says nothing of a run with them).
    (The case's step count differs between a recording and an A/B run: not asserted.)"""
    pytester.makepyfile(
        test_case=CASE.replace("    assert run.steps == 16 and run.rounds == 2\n", "")
    )
    pytester.runpytest_subprocess(*SHORT_RUN, *SIDE_B, "--specperf-update-baselines",
                                  timeout=240).assert_outcomes(passed=1)  # fmt: skip
    path = pytester.path / "baselines" / "test-box.yaml"
    data = yaml.safe_load(path.read_text())
    [engine] = data["engines"].values()
    [entry] = [e for cases in engine["cases"].values() for e in cases.values()]
    entry["not_gated"] = {"accepted": False, "gates": {"verify": 0.12},
                          "reason": "processes split (written by the test)"}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    ab = ("--specperf-ab=args=--threads=1 --device=cpu", *SIDE_B, WIDE, "--specperf-json=r.json")

    def judged() -> tuple[dict, list[str]]:
        report = json.loads((pytester.path / "r.json").read_text())
        assert report["comparison"]["mode"] == "ab"
        [case] = report["cases"]
        return case, [m["metric"] for m in case["metrics"]]

    pytester.runpytest_subprocess(*SHORT_RUN, *ab, timeout=240).assert_outcomes(passed=1)
    case, gates = judged()
    assert "verify" not in gates and "accept_len" in gates
    assert any(r.startswith("not gated: verify") for r in case["reasons"]), case["reasons"]
    monkeypatch.setenv(THP_ENV, "1")
    pytester.runpytest_subprocess(*SHORT_RUN, *ab, timeout=240)
    case, gates = judged()
    assert case["fingerprint"]["huge_pages"] is True
    assert "verify" in gates and not any(r.startswith("not gated") for r in case["reasons"])


def test_a_reference_side_in_another_environment_is_launched_with_its_interpreter(
    tmp_path: Path,
) -> None:
    other = str(Path(sys.executable).with_name("python-release"))
    spec = ReferenceBackend().launch_spec(BackendSettings(python=other), port=1, run_dir=tmp_path)
    assert spec.cmd[:3] == [other, "-m", "pytest_specperf.engines.reference.server"]
    spec = ReferenceBackend().launch_spec(BackendSettings(), port=1, run_dir=tmp_path)
    assert spec.cmd[0] == sys.executable


def test_calibrate_measures_ab_power_against_two_running_servers(
    pytester: pytest.Pytester, side_a: ServerClient, side_b: ServerClient, tmp_path: Path
) -> None:
    """``specperf calibrate --ab``: no baseline recorded, every repetition an A/B run, the
    canary on the tested side only (its control file), the table says A/B mode."""
    import subprocess

    pytester.makepyfile(test_case=CASE)
    work, out = tmp_path / "cal", tmp_path / "cal.json"
    url = side_a.base_url
    cmd = [sys.executable, "-m", "pytest_specperf", "calibrate", "--repetitions", "1",
           "--inject", "verify=3", "--host-stall-share", "0", "--attach", side_b.base_url,
           "--ab", f"url={url}", "--tolerance", "30%", "--work-dir", str(work),
           "--json", str(out), "--", "test_case.py", *SHORT_RUN]  # fmt: skip
    proc = subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"A/B mode: every run against the reference side url={url}" in proc.stdout
    summary = json.loads(out.read_text())
    assert summary["comparison"] == {"mode": "ab", "reference": f"url={url}"}
    rows = {r["condition"]: r for r in summary["conditions"]}
    assert set(rows) == {"A/A", "verify=3"} and all(r["runs"] == 1 for r in rows.values())
    assert rows["A/A"]["slower_runs"] == 0
    # One repetition decides nothing about power: A/B's noise on this CPU leaves even a
    # 3x verify canary UNSTABLE in some runs (a CI run: detected 0 of 1). The canary went
    # into B and showed against A: the verify gate moved up, and was never judged FASTER.
    (case,) = json.loads((work / "rep00-verify_3.json").read_text())["cases"]
    m = _verify(case)
    assert m["change"] > 0.5 and m["verdict"] in ("SLOWER", "UNSTABLE"), m
    assert rows["verify=3"]["detected"] == (m["verdict"] == "SLOWER")
    assert not (work / "baselines").exists()  # A/B mode records none
    logs = {p.name: p.read_text() for p in (work / "raw").glob("*.log")}
    assert "canary injection active: verify=3" in logs["rep00-verify_3.log"]
    assert "starting reference server" not in "".join(logs.values())  # never relaunched


def test_calibrate_refuses_ab_with_the_stored_baseline_options(tmp_path: Path) -> None:
    import subprocess

    cmd = [sys.executable, "-m", "pytest_specperf", "calibrate", "--ab", "args=--threads 1",
           "--sitting", "1", "--work-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--ab args=--threads 1 calibrates A/B mode, which records no baseline; --sitting" in (
        proc.stderr
    )
    assert not any(tmp_path.iterdir())
