"""``specperf sglang-check`` against the installed SGLang 0.5.23 and a fork-shaped tree.

The fork (``tests/data/sglang_ddtree_fork``) is a DFlash fork with DDTree verification,
named like the founding incident's; the shipped example map
(``example_dflash_ddtree_fork.yaml``) is written for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_specperf.engines.sglang.check import (
    CheckError,
    CheckReport,
    StepReport,
    build_report,
    locate_source,
    render_text,
)
from pytest_specperf.engines.sglang.phase_map import example_fork_map_path
from pytest_specperf.engines.sglang.source import sglang_root
from pytest_specperf.probe.phases import PHASES, SCHEDULER_PHASES

FORK = Path(__file__).parent / "data" / "sglang_ddtree_fork"
FORK_WORKER = "sglang.srt.speculative.dflash_worker.DFlashWorker"
EXAMPLE = str(example_fork_map_path())
installed = pytest.mark.skipif(
    sglang_root() is None,
    reason="sglang is not installed; CI runs these with `pip install --no-deps sglang==0.5.23`",
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_specperf", "sglang-check", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def step(report: CheckReport, target: str) -> StepReport:
    (found,) = [s for s in report.steps if s.target == target]
    return found


# -- the fork ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fork_report() -> CheckReport:
    return build_report(str(FORK), EXAMPLE, "DFLASH")


def test_unit_fork_with_the_example_map_is_complete(fork_report: CheckReport) -> None:
    assert fork_report.version == "0.5.9+ddtree"
    assert fork_report.source_root == str((FORK / "python" / "sglang").resolve())
    assert fork_report.ok
    assert [e.target for e in fork_report.entries if e.status != "found"] == []
    (dflash,) = [a for a in fork_report.algorithms if a["algorithm"] == "DFLASH"]
    assert dflash["worker"] == FORK_WORKER and dflash["mapped"]
    assert [s.target for s in fork_report.steps] == [f"{FORK_WORKER}.forward_batch_generation"]


def test_unit_fork_step_phases_and_the_calls_no_phase_covers(fork_report: CheckReport) -> None:
    s = step(fork_report, f"{FORK_WORKER}.forward_batch_generation")
    assert s.where == "sglang/srt/speculative/dflash_worker.py:14"
    assert set(s.phases_reached) == set(PHASES) - set(SCHEDULER_PHASES)
    assert s.phases_reached["prepare_for_verify"] == "verify_input.prepare_for_verify (line 21)"
    assert s.phases_reached["build_verify_input"] == "self._build_ddtree_verify_input (line 20)"
    uncovered = {c.where: c for c in s.calls if c.status == "uncovered"}
    assert set(uncovered) == {"sglang/srt/speculative/dflash_worker.py:17",
                              "sglang/srt/speculative/dflash_worker.py:24"}
    stats = uncovered["sglang/srt/speculative/dflash_worker.py:24"]
    assert stats.call == "self._update_acceptance_stats"
    assert "may wait for the GPU: .tolist() at line 55" in stats.detail
    assert stats.suggestion == {"target": f"{FORK_WORKER}._update_acceptance_stats",
                                "role": "phase", "phase": "accept",
                                "params": ["self", "verify_input", "accepted"]}
    (reaches,) = [c for c in s.calls if c.status == "reaches"]
    assert reaches.call == "self._forward_prefill"  # the prefill path's target forward


def test_unit_fork_without_a_map_shows_what_to_write(tmp_path: Path) -> None:
    """With the built-in map alone: the fork's differences, each with file and line."""
    r = build_report(str(FORK), None, "DFLASH")
    assert not r.ok
    status = {e.target.rsplit(".", 2)[-2] + "." + e.target.rsplit(".", 1)[1]: e for e in r.entries}
    changed = status["ModelRunner.forward"]
    assert changed.status == "signature"
    assert changed.where == "sglang/srt/model_executor/model_runner.py:5"
    assert changed.actual == ["self", "forward_batch", "skip_attn_backend_init",
                              "pp_proxy_tensors"]
    assert status["TpModelWorker.forward_batch_generation"].status == "signature"
    assert status["DFlashWorkerV2.forward_batch_generation"].status == "missing"
    assert status["DecodeCudaGraphRunner.execute"].status == "missing"
    # the built-in optional fork entries: step found, prepare_for_verify not on the worker
    assert status["DFlashWorker.forward_batch_generation"].status == "found"
    assert status["DFlashWorker.prepare_for_verify"].status == "missing"
    fork_step = step(r, f"{FORK_WORKER}.forward_batch_generation")
    calls = {c.call: c for c in fork_step.calls}
    assert calls["self._ddtree_accept"].status == "uncovered"
    assert calls["self._ddtree_accept"].suggestion["phase"] == "accept"  # type: ignore[index]
    assert calls["self._build_ddtree_verify_input"].status == "covered"
    text = render_text(r)
    assert "PARAMETERS  sglang.srt.model_executor.model_runner.ModelRunner.forward" in text
    assert "at sglang/srt/model_executor/model_runner.py:5" in text
    assert "MISSING     sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2" in text


def test_unit_a_signature_the_fork_changed_is_named_with_file_and_line(tmp_path: Path) -> None:
    fork = tmp_path / "fork"
    shutil.copytree(FORK, fork)
    worker = fork / "python/sglang/srt/speculative/dflash_worker.py"
    worker.write_text(worker.read_text().replace(
        "def _ddtree_accept(self, verify_input, result):",
        "def _ddtree_accept(self, verify_input, result, *, greedy=True):"))
    r = build_report(str(fork / "python"), EXAMPLE, "DFLASH")
    (bad,) = [e for e in r.entries if e.status != "found"]
    assert bad.target == f"{FORK_WORKER}._ddtree_accept" and bad.status == "signature"
    assert bad.where == "sglang/srt/speculative/dflash_worker.py:50"
    assert bad.source.endswith("example_dflash_ddtree_fork.yaml:70")
    assert bad.actual == ["self", "verify_input", "result", "*", "greedy"] and not r.ok


def test_cli_on_the_fork(tmp_path: Path) -> None:
    res = cli("--source", str(FORK), "--phase-map", EXAMPLE, "--algorithm", "DFLASH")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "sglang-check: SGLang 0.5.9+ddtree at" in out
    assert "Map entries: 21 checked, 0 missing, 0 with other parameters" in out
    assert "sglang/srt/speculative/dflash_worker.py:24" in out and "_update_acceptance_stats" in out
    assert out.rstrip().endswith("OK")
    data = json.loads(cli("--source", str(FORK), "--phase-map", EXAMPLE, "--algorithm",
                          "DFLASH", "--format", "json").stdout)
    assert data["ok"] is True and data["steps"][0]["target"].startswith(FORK_WORKER)
    bare = cli("--source", str(FORK), "--algorithm", "DFLASH")
    assert bare.returncode == 1 and "PROBLEMS FOUND" in bare.stdout


# -- bad input -----------------------------------------------------------------------------------
def test_cli_bad_input_is_refused_with_the_reason(tmp_path: Path) -> None:
    res = cli("--source", str(tmp_path))
    assert res.returncode == 2 and f"--source {tmp_path}: no SGLang source there" in res.stderr
    bad = tmp_path / "map.yaml"
    bad.write_text("schema: 1\nentries:\n - {target: sglang.a.B.c, role: phase, phase: drafting}\n")
    res = cli("--source", str(FORK), "--phase-map", str(bad))
    assert res.returncode == 2 and f"phase map {bad}:3: entry 0 (sglang.a.B.c)" in res.stderr
    res = cli("--source", str(FORK), "--step", "myfork.Worker.step")
    assert res.returncode == 2 and "--step 'myfork.Worker.step'" in res.stderr
    with pytest.raises(CheckError, match="no SGLang source"):
        locate_source(str(tmp_path / "nowhere"))


def test_unit_phase_map_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPERF_PHASE_MAP", EXAMPLE)
    res = cli("--source", str(FORK / "python" / "sglang"), "--algorithm", "DFLASH")
    assert res.returncode == 0 and f"phase map: phase_map_0_5_23.yaml + {EXAMPLE}" in res.stdout


# -- the installed SGLang ------------------------------------------------------------------------
@installed
def test_installed_sglang_matches_the_built_in_map() -> None:
    r = build_report(None, None)
    assert r.ok and r.version == "0.5.23"
    assert [e.target for e in r.entries if e.status != "found" and not e.optional] == []
    rows = {(a["algorithm"], a["condition"]): a for a in r.algorithms}
    assert rows[("NGRAM", "always")]["mapped"] is False
    assert rows[("EAGLE3", "enable_multi_layer_eagle=True")]["worker"].endswith(
        "MultiLayerEagleWorkerV2")
    for s in r.steps:
        expected = set(PHASES) - set(SCHEDULER_PHASES)
        if s.target.endswith("DFlashWorkerV2.forward_batch_generation"):
            expected -= {"build_verify_input"}  # chain verification upstream
        assert set(s.phases_reached) == expected, s.target
    eagle = step(r, "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation")
    assert eagle.phases_reached["draft"] == "self.draft_worker.draft (line 1480)"
    assert eagle.phases_reached["accept"] == "inside self.verify (line 1483)"


@installed
def test_installed_sglang_step_of_an_unmapped_worker() -> None:
    """--step lists the calls of a worker the map does not cover yet (NGRAM here)."""
    ngram = "sglang.srt.speculative.ngram_worker.NGRAMWorker.forward_batch_generation"
    r = build_report(None, None, "NGRAM", (ngram,))
    s = step(r, ngram)
    assert s.where is not None and s.where.startswith("sglang/srt/speculative/ngram_worker.py:")
    resolved = {c.definition for c in s.calls if c.status == "uncovered"}
    assert "sglang.srt.speculative.ngram_worker.NGRAMWorker._prepare_for_speculative_decoding" in (
        resolved)
    res = cli("--algorithm", "NGRAM", "--step", ngram)
    assert res.returncode == 0 and f"Step {ngram}" in res.stdout
    assert "NO STEP ENTRY for " + ngram in res.stdout
