"""Fault suite of the plugin's baseline handling, end to end against the real reference
server: a broken baseline file refused once before any server starts; a failed read
never repeated; a file of another device INVALID (and an update into it refused before
measuring), one of another engine NO_BASELINE saying whose it is; long and non-ASCII test
ids and case keys through record and judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fault_table
import pytest
import yaml
from e2e import SHORT_RUN

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

#: A test id of 430 characters with non-ASCII letters, and a case key of 900 (its
#: parameter): both are keys of the baseline file.
NAME = "test_décodé_長い文脈_" + "x" * 400
CASE = f"""
import pytest

LABEL = "ü" * 600 + "長" * 300

@pytest.mark.specperf(gate=["verify"])
@pytest.mark.parametrize("label", [LABEL], ids=["long"])
def {NAME}(specperf, label):
    specperf.decode(context_len=1024)
"""
FILE = "test_dé.py"


def _row(test: str, outcome: str, by: str = "") -> None:
    fault_table.row(test, 1, outcome, True, by=by)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> str:
    """YAML text of a baseline recorded by a real run of ``CASE``."""
    d = tmp_path_factory.mktemp("record")
    (d / FILE).write_text(CASE, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", FILE, "--specperf-update-baselines", *SHORT_RUN],
        cwd=d, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return (d / "baselines" / "test-box.yaml").read_text(encoding="utf-8")


def _setup(pytester: pytest.Pytester, text: str | None, case: str = CASE) -> Path:
    (pytester.path / FILE).write_text(case, encoding="utf-8")
    path = pytester.path / "baselines" / "test-box.yaml"
    if text is not None:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def _run(pytester: pytest.Pytester, *extra: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*SHORT_RUN, *extra, timeout=300)


def _no_server_started(pytester: pytest.Pytester) -> bool:
    """No server work directory under the run's basetemp (the fixture makes one first)."""
    return not list(pytester.path.glob("runpytest-*/**/specperf*"))


def test_long_and_non_ascii_ids_round_trip_through_record_and_judge(pytester, recorded):
    data = yaml.safe_load(recorded)
    (entry,) = data["engines"].values()
    (test,) = entry["cases"]
    (key,) = entry["cases"][test]
    assert test == f"{FILE}::{NAME}" and key.endswith(" label=" + "ü" * 600 + "長" * 300)
    _setup(pytester, recorded)
    result = _run(pytester, "--specperf-tolerance=90%,step=90%")
    out = result.stdout.str()
    assert "NO_BASELINE" not in out and "INVALID" not in out, out
    result.assert_outcomes(passed=1)
    _row(f"test id of {len(test)} characters and case key of {len(key)}, non-ASCII: record, "
         "then judge", "found and judged (not NO_BASELINE)")  # fmt: skip


def _foreign(text: str) -> str:
    data = yaml.safe_load(text)
    data["device"].update(slug="nvidia-h200", kind="cuda", name="NVIDIA H200")
    return yaml.safe_dump(data, allow_unicode=True)


def test_a_baseline_of_another_device_is_invalid_saying_whose_it_is(pytester, recorded):
    _setup(pytester, _foreign(recorded))
    result = _run(pytester, "-W", "default")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*SpecperfWarning*INVALID*the file was recorded on 'nvidia-h200' ('cuda', 'NVIDIA H200'); "
         "this run is on 'test-box' ('cpu'*this run is never judged against it*"]
    )  # fmt: skip
    _row("baseline file of another device (slug nvidia-h200, kind cuda)",
         "INVALID naming whose it is")  # fmt: skip


def test_an_update_into_another_devices_file_is_refused_before_measuring(pytester, recorded):
    path = _setup(pytester, _foreign(recorded))
    before = path.read_bytes()
    result = _run(pytester, "--specperf-update-baselines")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert out.count("refused before measuring anything") == 1, out
    assert "an update would mix the two devices' runs" in out
    assert path.read_bytes() == before and _no_server_started(pytester)
    _row("update into another device's file",
         "refused before any server, one message, file unchanged")  # fmt: skip


def test_a_baseline_of_another_engine_is_no_baseline_saying_whose(pytester, recorded):
    data = yaml.safe_load(recorded)
    (name,) = data["engines"]
    entry = data["engines"].pop(name)
    entry["identity"]["model"] = "big"
    for fp in entry["fingerprints"].values():
        fp["config"] = "big"
    data["engines"]["reference big DFLASH"] = entry
    _setup(pytester, yaml.safe_dump(data, allow_unicode=True))
    result = _run(pytester, "--specperf-json=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*NO_BASELINE*"])
    report = json.loads((pytester.path / "report.json").read_text(encoding="utf-8"))
    reasons = " ".join(r for case in report["cases"] for r in case["reasons"])
    assert "(reference tiny DFLASH)" in reasons, reasons
    assert "the file holds baselines of reference big DFLASH" in reasons, reasons
    _row("baseline file of another engine (model)", "NO_BASELINE naming the engines it holds")


BROKEN = {
    "malformed YAML": ("schema_version: 3\nengines: {a: [}\n", "malformed YAML"),
    "unknown schema version": ("schema_version: 99\n", "schema_version is 99"),
    "over the node limit": (
        "schema_version: 3\nengines: [" + "1," * 100_001 + "1]\n",
        "more than 100000 YAML nodes",
    ),
}


@pytest.mark.parametrize("what", [*BROKEN, "malformed YAML, 2 xdist workers"])
def test_a_broken_baseline_is_refused_once_before_any_server_starts(pytester, what):
    text, fragment = BROKEN[what.split(",")[0]]
    two = CASE + CASE.replace(f"def {NAME}", "def test_second").split("\n", 3)[3]
    path = _setup(pytester, text, case=two)
    result = _run(pytester, *(["-n", "2"] if "xdist" in what else []))
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert out.count(fragment) == 1 and out.count(str(path.name)) == 1, out
    assert "During handling of the above exception" not in out
    assert "Traceback" not in out and _no_server_started(pytester)
    _row(f"broken baseline file ({what}), 2 cases", "refused before any server started, one "
         "message naming file, place and fix, no case measured")  # fmt: skip


READ_TWICE = """
import pytest
from pathlib import Path
from pytest_specperf.store.baseline_io import BaselineError
from pytest_specperf.plugin.session import get_session

def test_read(request):
    sess = get_session(request.config)
    with pytest.raises(BaselineError) as first:
        sess.baselines()
    Path("baselines/test-box.yaml").write_text("schema_version: 3\\n")  # fixed meanwhile
    with pytest.raises(BaselineError) as again:
        sess.baselines()
    assert str(again.value) == str(first.value)
"""


def test_a_failed_read_is_not_repeated(pytester):
    by = fault_table.current_test()  # (the inner run below clears the variable it reads)
    _setup(pytester, "schema_version: [\n", case=READ_TWICE)
    result = pytester.runpytest_inprocess("--specperf-device=test-box", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    _row("broken baseline file fixed during the session", "the same error again: read once", by)
