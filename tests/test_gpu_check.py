"""scripts/gpu-check.sh and scripts/gpu_check.py on a CPU: the plan, its budget, its node
ids, the leftover-server cleanup and the summary of partial results."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import gpu_check

    return gpu_check


def _dry_run(out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    return subprocess.run(
        ["bash", str(SCRIPTS / "gpu-check.sh"), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )


def test_dry_run_prints_a_plan_within_the_budget(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _dry_run(out)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    limits = [int(x) for x in re.findall(r"timeout\s+(\d+) s", text)]
    assert len(limits) >= 10 and sum(limits) < 480
    assert f"{sum(limits)} s of timeouts (budget 480 s)" in text
    outputs = re.findall(r"^\s+out\s+(\S+)$", text, re.M)
    assert outputs and all(o.startswith(str(out)) for o in outputs)
    assert str(out / "baselines" / "nvidia-h200.yaml") in outputs
    for step in ("preflight", "telemetry", "engine", "record", "canary", "aa1", "v105c"):
        assert str(out / "logs" / f"{step}.log") in outputs
    assert not out.exists()  # a dry run writes nothing


def test_dry_run_node_ids_are_collected_exactly(tmp_path: Path) -> None:
    """Cases are selected by node id (not -k): each one names exactly one test."""
    nodeids = sorted(set(re.findall(r"^\s+node\s+(\S+)$", _dry_run(tmp_path).stdout, re.M)))
    assert any("test_cuda_graph_replay" in n for n in nodeids)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *nodeids],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert sorted(collected) == nodeids


def test_bad_argument_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    result = subprocess.run(["bash", str(SCRIPTS / "gpu-check.sh"), "--fast"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "unknown argument '--fast'" in result.stderr
    env["PYTHON"] = str(tmp_path / "no-such-python")
    result = subprocess.run(["bash", str(SCRIPTS / "gpu-check.sh")], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "set PYTHON=" in result.stderr


def test_pytest_steps_load_the_plugin_from_the_checkout(
    gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = gpu_check.step_named("record")
    monkeypatch.setattr(gpu_check, "plugin_installed", lambda: False)
    argv = gpu_check.pytest_argv(record, tmp_path)
    assert argv[:3] == [sys.executable, "-m", "pytest"]
    assert argv[argv.index("-p") : argv.index("-p") + 2] == ["-p", "pytest_specperf.plugin"]
    assert "-k" not in argv and all(n in argv for n in record.nodeids)
    assert f"--specperf-json={tmp_path / 'record.json'}" in argv
    monkeypatch.setattr(gpu_check, "plugin_installed", lambda: True)
    assert "pytest_specperf.plugin" not in gpu_check.pytest_argv(record, tmp_path)


def test_leftover_servers_are_killed_by_pid(gpu_check: ModuleType, tmp_path: Path) -> None:
    """A server left by a killed pytest (own process group, pid in its run directory)."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)
    try:
        run = tmp_path / "tmp" / "record" / "specperf0" / "run"
        run.mkdir(parents=True)
        (run / "server-rank0.json").write_text(json.dumps({"pid": server.pid}))
        (run / "server-rank1.json").write_text("{broken")
        assert gpu_check.kill_servers(tmp_path / "tmp" / "record") == [server.pid]
        assert server.wait(timeout=10) != 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _case(nodeid: str, device_step: float, verify: float, verdict: str = "SAME") -> dict:
    return {"nodeid": nodeid, "test": nodeid.split("[")[0], "key": "ctx=46000",
            "context_len": 46000, "kv_layout": "contiguous", "verdict": verdict,
            "device_step_ms": {"median": device_step},
            "device_phases": {"verify": {"median": verify}},
            "metrics": [{"metric": "verify", "verdict": verdict}]}


def test_summary_of_partial_results(gpu_check: ModuleType, tmp_path: Path) -> None:
    """Only some steps left output (others timed out): the summary says what there is."""
    from gpu_check_summary import summarize

    head = gpu_check.HEADLINE
    gpu_check.write_json(tmp_path / "record.json", {"cases": [_case(head, 5.0, 3.0)]})
    gpu_check.write_json(tmp_path / "aa1.json", {"cases": [_case(head, 5.05, 3.0)]})
    gpu_check.write_json(tmp_path / "v105a.json", {"cases": [_case(head, 5.2, 3.15, "SLOWER")]})
    gpu_check.write_json(tmp_path / "engine.json", {
        "probe_on_off": {"result": {"ratio_on_off": 1.004}},
        "layouts_and_bandwidth": {"error": "RuntimeError: out of time"},
    })
    assert summarize(tmp_path) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["arms"]["aa1"]["device_step_change"] == pytest.approx(0.01)
    assert s["arms"]["v105a"]["device_verify_change"] == pytest.approx(0.05)
    assert s["arms"]["v105a"]["metric_verdicts"] == {"verify": "SLOWER"}
    assert s["arms"]["aa2"]["present"] is False
    assert s["goals"]["probe_on_off"] == {"value": 1.004, "goal": "<= 1.01", "met": True}
    assert s["goals"]["verify_kv_read_vs_copy"]["met"] is None  # not measured
    assert "probe_on_off" in (tmp_path / "summary.txt").read_text()


def test_results_keep_finished_parts_when_one_fails(gpu_check: ModuleType, tmp_path: Path) -> None:
    res = gpu_check.Results(tmp_path / "engine.json")
    res.part("first", lambda: {"x": 1})

    def broken() -> None:
        raise RuntimeError("CUDA error: out of memory")

    assert res.part("second", broken) is None
    data = json.loads((tmp_path / "engine.json").read_text())
    assert data["first"]["result"] == {"x": 1}
    assert data["second"]["error"] == "RuntimeError: CUDA error: out of memory"


def test_engine_check_names_its_ranges_as_the_probe_reads_them(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    """The engine step's profiled decode and the probe's trace reader agree on the range
    names: on the CPU, a decode under the annotating probe gives each phase its torch ops."""
    torch = pytest.importorskip("torch")
    import gpu_check_engine
    from torch.profiler import ProfilerActivity, profile

    importlib.import_module("gpu_check_canaries")  # the engine step's other half imports
    probe = gpu_check_engine.annotating_probe(use_cuda=False)
    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            probe.begin_step(context_len=1, batch_size=1, rids=["r"])
            with probe.phase("draft"):
                x @ x
            with probe.phase("verify"):
                torch.relu(x @ x)
            probe.end_step(accepted_tokens=1)
    trace = gpu_check_engine.save_trace(prof, tmp_path / "traces" / "cpu.json.gz")
    summary = gpu_check_engine.kernels_and_spans(trace, probe.take_completed())
    assert (tmp_path / "traces" / "cpu.json.gz").is_file()
    assert summary["source"] == "cpu"
    assert summary["steps_recorded"] == summary["steps_in_trace"] == 2
    draft, verify = summary["per_phase"]["draft"], summary["per_phase"]["verify"]
    assert draft["ops"] == 2 and draft["top"][0]["name"] == "aten::matmul"
    assert {t["name"] for t in verify["top"]} == {"aten::matmul", "aten::relu"}
    assert 0 < verify["active_ns"] <= verify["kernel_ns"]
    assert summary["busy_share_from_kernels"] is None  # no device step time on a CPU
