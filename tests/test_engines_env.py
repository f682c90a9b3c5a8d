"""The one probe-from-environment setup (engines/env.py), used by both server kinds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rawhttp import run_reference

from pytest_specperf.engines import env
from pytest_specperf.engines.env import ProbeEnvError, probe_setup, run_dir_from_env
from pytest_specperf.probe import NullProbe, RunDirSink, StepProbe, read_records


def test_no_environment_means_no_injection_and_no_nvtx() -> None:
    setup = probe_setup(device="cpu", labels={"engine": "x"}, environ={})
    assert dict(setup.labels) == {"engine": "x"}
    assert setup.injector is None and setup.nvtx is False and setup.inject == ""


def test_inject_and_nvtx_come_from_the_environment(tmp_path: Path) -> None:
    environ = {env.ENV_INJECT: " host_stall=1 ", env.ENV_NVTX: "1"}
    setup = probe_setup(device="cpu", labels={"engine": "x"}, environ=environ)
    assert setup.inject == "host_stall=1" and setup.nvtx is True
    assert dict(setup.labels) == {"engine": "x", "inject": "host_stall=1"}
    probe = setup.build(RunDirSink(tmp_path), use_cuda=False)
    assert isinstance(probe, StepProbe)
    probe.begin_step(context_len=4, batch_size=1, rids=["r"])
    with probe.phase("draft"):
        pass
    with probe.phase("verify"):
        pass
    probe.end_step(accepted_tokens=1)
    probe.close()
    (rec,) = read_records(tmp_path)
    assert rec.labels["inject"] == "host_stall=1"
    assert rec.unaccounted_ns >= 1_000_000  # the injected stall really happened


def test_a_bad_inject_spec_names_the_variable() -> None:
    with pytest.raises(ProbeEnvError, match=r"^SPECPERF_INJECT='verify=fast': "):
        probe_setup(device="cpu", environ={env.ENV_INJECT: "verify=fast"})


def test_without_a_sink_the_probe_is_off() -> None:
    assert isinstance(probe_setup(device="cpu", environ={}).build(None, use_cuda=False), NullProbe)


def test_run_dir_from_env() -> None:
    assert run_dir_from_env({}) is None and run_dir_from_env({env.ENV_RUN_DIR: ""}) is None
    assert run_dir_from_env({env.ENV_RUN_DIR: "/x"}) == "/x"


def test_env_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys; import pytest_specperf.engines.env\n"
        "ours = sorted(m for m in sys.modules if m.startswith('pytest_specperf'))\n"
        "heavy = [m for m in ('torch', 'yaml', 'sglang', 'numpy') if m in sys.modules]\n"
        "print(ours, heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    # the package, the engines registry and the (standard-library only) protocol in server/
    assert out == (
        "['pytest_specperf', 'pytest_specperf.engines', 'pytest_specperf.engines.env', "
        "'pytest_specperf.server', 'pytest_specperf.server.protocol'] []"
    )


def test_reference_server_refuses_a_bad_inject_spec_in_one_line(tmp_path: Path) -> None:
    out = run_reference(
        "--device", "cpu", "--port", "0", "--run-dir", str(tmp_path / "run"),
        env={env.ENV_INJECT: "verify=fast"},
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: SPECPERF_INJECT='verify=fast': ")
