"""scripts/gpu-check.sh and scripts/gpu_check.py on a CPU: the plan, its budget, its node
ids, the leftover-server cleanup, the summary of partial results, the interrupt before the
kill at a step's limit, preflight's imports, the margins, and the rehearsal's stand-ins.

The whole rehearsal (``bash scripts/gpu-check.sh --rehearse``, a few minutes) runs in
``.ci/run``; here, its in-process steps one at a time."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
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
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
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
    for step in ("preflight", "telemetry", "engine", "record", "canary", "aa1", "v105c", "profile"):
        assert str(out / "logs" / f"{step}.log") in outputs
    assert not out.exists()  # a dry run writes nothing


def test_dry_run_node_ids_are_collected_exactly(tmp_path: Path) -> None:
    """Cases are selected by node id (not -k): each one names exactly one test."""
    nodeids = sorted(set(re.findall(r"^\s+node\s+(\S+)$", _dry_run(tmp_path).stdout, re.M)))
    assert any("test_cuda_graph_replay" in n for n in nodeids)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *nodeids,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert sorted(collected) == nodeids


def test_bad_argument_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(SCRIPTS / "gpu-check.sh"), "--fast"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "unknown argument '--fast'" in result.stderr
    assert "--rehearse" in result.stderr  # the usage names every mode
    env["PYTHON"] = str(tmp_path / "no-such-python")
    result = subprocess.run(
        ["bash", str(SCRIPTS / "gpu-check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
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
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
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
    return {
        "nodeid": nodeid,
        "test": nodeid.split("[")[0],
        "key": "ctx=46000",
        "context_len": 46000,
        "kv_layout": "contiguous",
        "verdict": verdict,
        "device_step_ms": {"median": device_step},
        "device_phases": {"verify": {"median": verify}},
        "metrics": [{"metric": "verify", "verdict": verdict}],
    }


def test_summary_of_partial_results(gpu_check: ModuleType, tmp_path: Path) -> None:
    """Only some steps left output (others timed out): the summary says what there is,
    and which steps finished, were stopped at their limit, or did not run."""
    from gpu_check_summary import summarize

    (tmp_path / "steps.tsv").write_text(
        "preflight 0 4.0\nrecord 0 50.2\ncanary 1 20.0\naa1 124 30.0\nv105a 137 30.0\n"
    )
    head = gpu_check.HEADLINE
    gpu_check.write_json(tmp_path / "record.json", {"cases": [_case(head, 5.0, 3.0)]})
    gpu_check.write_json(tmp_path / "aa1.json", {"cases": [_case(head, 5.05, 3.0)]})
    gpu_check.write_json(tmp_path / "v105a.json", {"cases": [_case(head, 5.2, 3.15, "SLOWER")]})
    gpu_check.write_json(
        tmp_path / "engine.json",
        {
            "probe_on_off": {"result": {"ratio_on_off": 1.004}},
            "layouts_and_bandwidth": {"error": "RuntimeError: out of time"},
        },
    )
    assert summarize(tmp_path) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["arms"]["aa1"]["device_step_change"] == pytest.approx(0.01)
    assert s["arms"]["v105a"]["device_verify_change"] == pytest.approx(0.05)
    assert s["arms"]["v105a"]["metric_verdicts"] == {"verify": "SLOWER"}
    assert s["arms"]["aa2"]["present"] is False
    assert s["goals"]["probe_on_off"] == {"value": 1.004, "goal": "<= 1.01", "met": True}
    assert s["goals"]["verify_kv_read_vs_copy"]["met"] is None  # not measured
    assert s["steps"]["finished"] == ["preflight", "record", "canary"]  # canary: tests failed
    assert s["steps"]["stopped"] == {
        "aa1": "stopped at its limit (interrupted)",
        "v105a": "killed at its limit",
    }
    assert "telemetry" in s["steps"]["not_run"] and "profile" in s["steps"]["not_run"]
    text = (tmp_path / "summary.txt").read_text()
    assert "probe_on_off" in text and "== steps finished: preflight, record, canary" in text
    assert "== step aa1: stopped at its limit (interrupted)" in text
    assert "REHEARSAL" not in text


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


def test_arms_run_with_the_extension_off(gpu_check: ModuleType) -> None:
    """The A/A and verify=1.05 arms and the canary measure a fixed amount of work: the
    automatic extension is off, by the flag the plugin registers on this checkout."""
    arms = [s for s in gpu_check.PLAN if s.name.startswith(("aa", "v105")) or s.name == "canary"]
    assert len(arms) == 7
    assert all(gpu_check.NO_EXTENSION in s.pytest_args for s in arms)
    flag = gpu_check.NO_EXTENSION.split("=")[0]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert flag in result.stdout, f"{flag} is not an option of the plugin on this checkout"
    record = gpu_check.step_named("record")  # recording never extends
    assert gpu_check.NO_EXTENSION not in record.pytest_args


def test_profiler_parts_run_last(gpu_check: ModuleType) -> None:
    """The parts under torch.profiler are a step of their own, after every measurement:
    a profiler hang loses only that step; the engine step has none of them."""
    import gpu_check_engine
    from gpu_check_device import CpuStandIns

    names = [s.name for s in gpu_check.PLAN]
    assert names[-2:] == ["profile", "summarize"]
    side = CpuStandIns()
    assert {"kernels_vs_spans", "small_cuda_trace"} == {
        key for key, _, _ in gpu_check_engine.profile_parts(None, Path("."), side)
    }
    engine = {key for key, _, _ in gpu_check_engine.engine_parts(None, side)}
    assert engine.isdisjoint({"kernels_vs_spans", "small_cuda_trace"}) and len(engine) == 9


def test_plan_budget_and_margins(gpu_check: ModuleType) -> None:
    """Every step's limit leaves room for its grace; the desk estimates are named."""
    assert sum(s.timeout_s for s in gpu_check.PLAN) <= gpu_check.BUDGET_S
    for s in gpu_check.PLAN:
        assert s.timeout_s > 2 * s.grace_s, s.name
        assert all(d.seconds > 0 and d.why for d in s.desk), s.name
    assert gpu_check.step_named("aa1").grace_s == gpu_check.INTERRUPT_GRACE_S
    assert gpu_check.step_named("engine").grace_s == gpu_check.IN_PROCESS_GRACE_S


def test_margins_against_each_limit(gpu_check: ModuleType, tmp_path: Path) -> None:
    """A rehearsal's step time plus its desk estimate, against its limit: 30% unused or
    it is short; a step stopped at its limit, or not run, is never within its margin."""
    aa1, engine = gpu_check.step_named("aa1"), gpu_check.step_named("engine")
    fits = 0.7 * aa1.timeout_s - aa1.desk_s - 0.5
    (tmp_path / "steps.tsv").write_text(
        f"aa1 0 {fits:.1f} 3.0\nengine 0 {0.7 * engine.timeout_s:.1f}\nrecord 124 72.0\n"
    )
    rows = {r["step"]: r for r in gpu_check.margin_rows(tmp_path, rehearsal=True)}
    assert rows["aa1"]["ok"] and rows["aa1"]["estimate_s"] == pytest.approx(fits + aa1.desk_s)
    assert rows["aa1"]["cpu_s"] == 3.0 and rows["engine"]["cpu_s"] is None
    assert rows["aa1"]["cpu_margin"] == pytest.approx(
        1 - (3.0 + aa1.desk_s) / aa1.timeout_s, abs=1e-3
    )
    assert not rows["engine"]["ok"]  # 70% of the limit plus the desk's GPU work
    (tmp_path / "steps.tsv").write_text(f"aa1 0 {2 * aa1.timeout_s} 3.0\n")
    slow_wall = {r["step"]: r for r in gpu_check.margin_rows(tmp_path, rehearsal=True)}["aa1"]
    assert slow_wall["ok"] and slow_wall["margin"] < 0  # judged on its own CPU time
    (tmp_path / "steps.tsv").write_text(
        f"aa1 0 {fits:.1f} 3.0\nengine 0 {0.7 * engine.timeout_s:.1f}\nrecord 124 72.0\n"
    )
    assert not rows["record"]["ok"] and rows["record"]["status"].startswith("stopped")
    assert not rows["canary"]["ok"] and rows["canary"]["status"] == "not run"
    on_gpu = {r["step"]: r for r in gpu_check.margin_rows(tmp_path, rehearsal=False)}
    assert on_gpu["engine"]["desk_s"] == 0 and on_gpu["engine"]["margin"] == pytest.approx(0.3)
    assert gpu_check.margins(tmp_path, rehearsal=True) == 1
    text = (tmp_path / "margins.txt").read_text()
    assert "REHEARSAL on the CPU" in text and "not GPU results" in text
    assert re.search(r"^aa1 .* ok: finished$", text, re.M)
    assert re.search(r"^record .* SHORT: stopped at its limit", text, re.M)


def test_preflight_names_every_missing_import(
    gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    modules = [m for m, _, _ in gpu_check.IMPORTS]
    assert {"torch", "pytest", "yaml", "filelock", "pynvml", "pytest_benchmark"} <= set(modules)
    missing = ("specperf_no_such_module", "no-such-dist", "recording baselines")
    monkeypatch.setattr(gpu_check, "IMPORTS", (*gpu_check.IMPORTS, missing))
    assert gpu_check.preflight(tmp_path, rehearse=True) == 2
    data = json.loads((tmp_path / "preflight.json").read_text())
    assert data["imports"]["specperf_no_such_module"] is None
    assert data["imports"]["filelock"] not in (None, "")
    [problem] = data["problems"]
    assert "cannot import specperf_no_such_module" in problem
    assert "install no-such-dist" in problem and "needed by recording baselines" in problem


def _interrupt_run(tmp_path: Path, body: str, limit: int, grace: int) -> tuple[int, Path]:
    """A pytest step of a test file of our own under the shell's ``timeout`` (SIGINT to
    the group at limit - grace, SIGKILL at the limit), as gpu-check.sh runs a step."""
    (tmp_path / "test_slow.py").write_text(body)
    out = tmp_path / "out"
    code = (
        "import sys, gpu_check; from pathlib import Path; "
        f"step = gpu_check.Step('slow', {limit}, 'test', ('slow.json',), "
        f"({str(tmp_path / 'test_slow.py')!r},)); "
        "gpu_check.INTERRUPT_GRACE_S = %d; "
        f"sys.exit(gpu_check.run_pytest(step, Path({str(out)!r})))" % grace
    )
    env = {**os.environ, "PYTHONPATH": f"{SCRIPTS}{os.pathsep}{REPO}"}
    result = subprocess.run(
        ["timeout", "-s", "INT", "-k", str(grace), str(limit - grace), sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, out / "slow.json"


SLOW_CASES = """\
import time
from pathlib import Path


def test_measured(specperf):
    run = specperf.decode(context_len=512)
    assert run.steps >= 1


def test_slow():
    Path("{marker}").write_text("started")
    time.sleep(300)
"""


def test_a_step_at_its_limit_is_interrupted_and_writes_its_report(tmp_path: Path) -> None:
    """The interrupt at a step's limit (SIGINT to its process group, as ``timeout -s INT``
    sends it) while a test runs: pytest stops, stops its server and writes the
    ``--specperf-json`` report of the case it finished; the step exits 124."""
    marker = tmp_path / "slow-started"
    (tmp_path / "test_slow.py").write_text(SLOW_CASES.format(marker=marker))
    out = tmp_path / "out"
    code = (
        "import sys, gpu_check; from pathlib import Path; "
        f"step = gpu_check.Step('slow', 60, 'test', ('slow.json',), "
        f"({str(tmp_path / 'test_slow.py')!r},)); "
        f"sys.exit(gpu_check.run_pytest(step, Path({str(out)!r}), rehearse=True))"
    )
    env = {**os.environ, "PYTHONPATH": f"{SCRIPTS}{os.pathsep}{REPO}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the slow test never started"
        os.killpg(proc.pid, signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 124, stdout
    assert "interrupted at its limit" in stdout
    assert (out / "slow.json").is_file(), stdout
    report = json.loads((out / "slow.json").read_text())
    assert [c["test"].rsplit("::", 1)[-1] for c in report["cases"]] == ["test_measured"]
    assert not any(
        p.read_text().strip() for p in (out / "tmp" / "slow").rglob("server.pid") if p.is_file()
    )


def test_a_step_that_ignores_the_interrupt_is_killed_at_its_limit(tmp_path: Path) -> None:
    body = (
        "import signal, time\n\ndef test_stuck():\n"
        "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    time.sleep(60)\n"
    )
    t0 = time.monotonic()
    rc, report = _interrupt_run(tmp_path, body, limit=14, grace=4)
    # the wrapper's own kill after the grace (124), or timeout's SIGKILL to the group at the
    # limit, timeout included (137 in a shell, -9 as a subprocess's return code)
    assert rc in (124, 137, -9) and time.monotonic() - t0 < 30
    assert not report.is_file()


def test_rehearsal_stand_ins_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rehearsal's telemetry step on the CPU: every CUDA-only call it made is a named
    stand-in, listed in the step's JSON, which says it is a rehearsal."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import gpu_check_device

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "gpu_check.py"),
            "run",
            "telemetry",
            "--rehearse",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REHEARSAL of telemetry on the CPU" in result.stdout
    data = json.loads((tmp_path / "telemetry.json").read_text())
    assert "not GPU results" in data["rehearsal"]
    assert set(data["stand_ins"]) == {"cuda-events", "sleep-calibration", "device-copy"}
    assert set(data["stand_ins"]) <= set(gpu_check_device.STAND_INS)
    copy = data["copy_vs_gpm"]["result"]["copy"]
    assert copy["stand_in"] == "device-copy" and copy["copy_gb_per_s"] > 0
    assert data["sleep_calibration_idle"]["result"]["stand_in"] == "sleep-calibration"


def test_profile_step_is_skipped_by_the_fallback(tmp_path: Path) -> None:
    """SPECPERF_KERNEL_EVERY=0: no profiler in the run; the profile step says so."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECPERF_KERNEL_EVERY": "0"}
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "gpu_check.py"),
            "run",
            "profile",
            "--rehearse",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "profile.json").read_text())
    assert data["skipped"] == "skipped: SPECPERF_KERNEL_EVERY=0 (no profiler in this run)"


def test_rehearsal_ok_wants_every_step_and_part(gpu_check: ModuleType, tmp_path: Path) -> None:
    """CI's check after a rehearsal: every step ran to its end, no part failed, every
    in-process step's JSON says it is a rehearsal; a stand-in is not a failure."""
    lines = [f"{s.name} {1 if s.name == 'canary' else 0} 1.0 0.5" for s in gpu_check.PLAN]
    (tmp_path / "steps.tsv").write_text("\n".join(lines) + "\n")
    label = "CPU rehearsal with stand-ins: not GPU results"
    for step in ("telemetry", "engine", "profile"):
        gpu_check.write_json(
            tmp_path / f"{step}.json",
            {"rehearsal": label, "part": {"s": 0.1, "result": 1, "stand_ins": ["device-copy"]}},
        )
    assert gpu_check.rehearsal_ok(tmp_path) == 0
    gpu_check.write_json(
        tmp_path / "engine.json",
        {"rehearsal": label, "layouts": {"s": 0.1, "error": "RuntimeError: boom"}},
    )
    (tmp_path / "steps.tsv").write_text("\n".join(lines[:-2]) + "\nprofile 124 35.0\n")
    assert gpu_check.rehearsal_ok(tmp_path) == 1


def test_a_rehearsal_runs_each_repeated_arm_once(gpu_check: ModuleType, tmp_path: Path) -> None:
    """aa2/aa3 and v105b/v105c repeat aa1's and v105a's nodes and arguments under other
    names: a rehearsal runs each once (``plan --names --rehearse``), its margins give a
    repeat its first's time, and rehearsal-ok does not miss them; the GPU run keeps all."""
    repeats = {s.name: s.repeat_of for s in gpu_check.PLAN if s.repeat_of}
    assert repeats == {"aa2": "aa1", "aa3": "aa1", "v105b": "v105a", "v105c": "v105a"}
    for name, first in repeats.items():
        a, b = gpu_check.step_named(name), gpu_check.step_named(first)
        assert (a.nodeids, a.pytest_args, a.desk, a.timeout_s) == (
            b.nodeids, b.pytest_args, b.desk, b.timeout_s)  # fmt: skip
    names = [s.name for s in gpu_check.PLAN]
    assert [s.name for s in gpu_check.rehearsed(False)] == names
    assert [s.name for s in gpu_check.rehearsed(True)] == [n for n in names if n not in repeats]
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_check.py"), "plan", "--names", "--rehearse"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[0] for line in lines] == [s.name for s in gpu_check.rehearsed(True)]
    aa1 = gpu_check.step_named("aa1")
    factor = gpu_check.REHEARSAL_LIMIT_FACTOR
    assert ["aa1", str(aa1.timeout_s * factor), str(aa1.grace_s), str(aa1.timeout_s)] in lines
    # a rehearsal's steps.tsv: every step once, the repeats absent
    rows = [f"{n} 0 1.0 0.5" for n in names if n not in repeats]
    (tmp_path / "steps.tsv").write_text("\n".join(rows) + "\n")
    margins = {r["step"]: r for r in gpu_check.margin_rows(tmp_path, rehearsal=True)}
    assert margins["aa3"]["ok"] and margins["aa3"]["cpu_s"] == 0.5
    assert margins["aa3"]["status"] == "finished (as aa1: a repeat, rehearsed once)"
    on_gpu = {r["step"]: r for r in gpu_check.margin_rows(tmp_path, rehearsal=False)}
    assert not on_gpu["aa3"]["ok"] and on_gpu["aa3"]["status"] == "not run"
    assert gpu_check.step_report(tmp_path)["not_run"] == list(repeats)
    assert gpu_check.step_report(tmp_path, rehearsal=True)["not_run"] == []
    label = "CPU rehearsal with stand-ins: not GPU results"
    for step in ("telemetry", "engine", "profile"):
        gpu_check.write_json(tmp_path / f"{step}.json", {"rehearsal": label})
    assert gpu_check.rehearsal_ok(tmp_path) == 0
    (tmp_path / "steps.tsv").write_text("\n".join(r for r in rows if "v105a" not in r) + "\n")
    assert gpu_check.rehearsal_ok(tmp_path) == 1  # a first is never skipped
