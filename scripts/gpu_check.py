#!/usr/bin/env python3
"""The first GPU run's measurements, step by step, each with its own time limit.

    python3 scripts/gpu_check.py plan [--out DIR] [--names]   # the plan (no torch needed)
    python3 scripts/gpu_check.py run STEP [--out DIR]         # one step of the plan
    bash scripts/gpu-check.sh [--dry-run]                      # every step, under `timeout`

Steps (``PLAN``; the shell script runs them in this order, each under ``timeout``):

``preflight``  interpreter, torch, CUDA, NVML, pytest: what this machine has.
``telemetry``  NVML identity, peak bandwidth, throttle reasons, process list; a 4 GB
               device-to-device copy's GB/s against GPM DRAM_BW_UTIL over >= 1 s; the
               canary's ``_sleep`` calibration at idle, with the SM clock.
``engine``     the medium reference engine in this process (see ``gpu_check_engine``):
               graphs vs eager on the same seeds at 32k and 46k, event spans vs kernels
               (torch.profiler) over 10 steps at 46k, a sync census over 3 steps,
               per-phase host/device times and KV-read bandwidth at 32k/46k contiguous
               and fragmented, 10 s of back-to-back decode with GPM and the ``_sleep``
               calibration before and after it, the verify=1.10 and host_stall canaries
               as changes in device verify / unaccounted time, probe on/off interleaved.
``record``     the plugin records baselines (medium, 32k/46k, contiguous/fragmented, the
               CUDA-graph replay test) into ``OUT/baselines/<device>.yaml``.
``canary``     ``--specperf-inject verify=1.10,host_stall=2`` against those baselines:
               must fail on verify and unaccounted.
``aa1``..      A/A (fresh processes, no change) and ``verify=1.05`` arms, interleaved,
               against the same baselines: the GPU noise and detection figures.
``summarize``  one summary (``summary.json``, ``summary.txt``) from whatever the steps left.

Every step writes under ``OUT`` (default ``./gpu-check-out``) as it goes, so a step that
runs out of time still leaves its partial results and its log.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: The whole run must end within this many seconds (the GPU machine's budget per try).
BUDGET_S = 480
#: The shell's ``timeout`` sends SIGTERM this many seconds before a step's limit and
#: SIGKILL at the limit; on SIGTERM a pytest step kills the servers it left.
KILL_MARGIN_S = 3
#: Seconds an interrupted pytest (SIGINT) gets to write its report and stop its server.
INTERRUPT_GRACE_S = 8
CONFIG = "medium"
STEPS_PER_CASE = 32
DECODE = "perf_tests/test_decode.py::test_decode[kv={layout}-ctx={ctx}]"
REPLAY = "perf_tests/test_decode.py::test_cuda_graph_replay[ctx=32768]"
HEADLINE = DECODE.format(layout="contiguous", ctx=46000)
CANARY_SPEC = "verify=1.10,host_stall=2"
ARM_SPEC = "verify=1.05"
DEVICE_SLUG = "nvidia-h200"
LAYOUTS = ("contiguous", "fragmented")


@dataclass(frozen=True)
class Step:
    """One step of the plan: its time budget, what it measures and what it writes."""

    name: str
    timeout_s: int
    what: str
    outputs: tuple[str, ...]
    nodeids: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    #: pytest steps: SIGINT this many seconds before the limit (the plugin writes its
    #: report of the finished cases and stops its server); 0: no early interrupt
    interrupt_s: int = 0

    @property
    def is_pytest(self) -> bool:
        return bool(self.nodeids)


def _arm(name: str, inject: str | None) -> Step:
    args = (f"--specperf-inject={inject}",) if inject else ()
    what = f"fresh process, {inject or 'no change (A/A)'} vs the recorded baseline"
    return Step(name, 30, what, (f"{name}.json",), (HEADLINE,), args)


PLAN: tuple[Step, ...] = (
    Step("preflight", 15, "interpreter, torch, CUDA, NVML, pytest", ("preflight.json",)),
    Step(
        "telemetry",
        30,
        "NVML identity, peak bandwidth, throttle reasons, processes; 4 GB copy vs GPM "
        "DRAM_BW_UTIL over >= 1 s; _sleep calibration at idle",
        ("telemetry.json",),
    ),
    Step(
        "engine",
        110,
        "in-process medium engine: graphs vs eager 32k/46k, kernels vs spans at 46k, sync "
        "census, phases and KV-read bandwidth per layout, 10 s load with GPM and _sleep "
        "recalibration, verify=1.10 and host_stall canaries, probe on/off",
        ("engine.json", "traces/engine-46k.json.gz", "traces/cuda-small.json.gz"),
    ),
    Step(
        "record",
        80,
        "plugin: record baselines (medium, 32k/46k, contiguous/fragmented, graph replay)",
        ("record.json", f"baselines/{DEVICE_SLUG}.yaml"),
        (
            *(DECODE.format(layout=lay, ctx=ctx) for ctx in (32768, 46000) for lay in LAYOUTS),
            REPLAY,
        ),
        ("--specperf-update-baselines",),
        interrupt_s=KILL_MARGIN_S + INTERRUPT_GRACE_S + 2,
    ),
    Step(
        "canary",
        30,
        f"plugin: {CANARY_SPEC} vs the baseline (must fail on verify and unaccounted)",
        ("canary.json",),
        (HEADLINE,),
        (f"--specperf-inject={CANARY_SPEC}",),
    ),
    _arm("aa1", None),
    _arm("v105a", ARM_SPEC),
    _arm("aa2", None),
    _arm("v105b", ARM_SPEC),
    _arm("aa3", None),
    _arm("v105c", ARM_SPEC),
    Step("summarize", 10, "one summary from every step's output", ("summary.json", "summary.txt")),
)


def plan_lines(out: Path) -> list[str]:
    """The plan in words: step, timeout, node ids, output files."""
    total = sum(s.timeout_s for s in PLAN)
    lines = [f"gpu-check plan: {len(PLAN)} steps, {total} s of timeouts (budget {BUDGET_S} s)"]
    lines.append(f"output directory: {out}")
    for s in PLAN:
        lines.append(f"{s.name:10s} timeout {s.timeout_s:4d} s  {s.what}")
        for nodeid in s.nodeids:
            lines.append(f"{'':12s}node  {nodeid}")
        if s.pytest_args:
            lines.append(f"{'':12s}args  {' '.join(s.pytest_args)}")
        for o in step_outputs(s):
            lines.append(f"{'':12s}out   {out / o}")
    return lines


def step_outputs(step: Step) -> tuple[str, ...]:
    """Everything a step leaves under OUT: its results, its log (stdout and stderr) and,
    for pytest steps, pytest's temporary directory (server logs, step records)."""
    extra = (f"tmp/{step.name}/",) if step.is_pytest else ()
    return (*step.outputs, f"logs/{step.name}.log", *extra)


def step_named(name: str) -> Step:
    for s in PLAN:
        if s.name == name:
            return s
    raise SystemExit(f"gpu_check: unknown step {name!r}; steps: {', '.join(s.name for s in PLAN)}")


# -- writing results --------------------------------------------------------------------


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (a killed step leaves the previous complete file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class Results:
    """A step's result document, rewritten after every part (partial results survive)."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        write_json(self.path, self.data)

    def part(self, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one part; its result, or its error, lands under ``key``."""
        t0 = time.monotonic()
        print(f"-- {key}", flush=True)
        try:
            value = fn(*args, **kwargs)
        except Exception as e:  # one failing part must not lose the others
            import traceback

            traceback.print_exc()
            self.put(key, {"error": f"{type(e).__name__}: {e}", "s": time.monotonic() - t0})
            return None
        self.put(key, {"s": round(time.monotonic() - t0, 3), "result": value})
        return value


# -- steps --------------------------------------------------------------------------------


def preflight(out: Path) -> int:
    """What this machine has; exit 2 (the run stops) without torch or CUDA."""
    info: dict[str, Any] = {"python": sys.executable, "version": sys.version.split()[0]}
    for dist in ("torch", "pytest", "pytest-benchmark", "PyYAML", "nvidia-ml-py"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    info["plugin_installed"] = plugin_installed()
    write_json(out / "preflight.json", info)
    try:
        import torch
    except ImportError as e:
        print(f"gpu-check: {sys.executable} cannot import torch ({e}); set PYTHON", file=sys.stderr)
        return 2
    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    if info["cuda_available"]:
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        free, total = torch.cuda.mem_get_info(0)
        info["memory_free_total"] = [free, total]
    write_json(out / "preflight.json", info)
    print(json.dumps(info, indent=1))
    if not info["cuda_available"]:
        print(f"gpu-check: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    return 0


def plugin_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(e.value.startswith("pytest_specperf") for e in eps)


def pytest_argv(step: Step, out: Path) -> list[str]:
    """The pytest command of a plugin step (the plugin loaded from the checkout when the
    package is not installed)."""
    argv = [sys.executable, "-m", "pytest", *step.nodeids]
    if not plugin_installed():
        argv += ["-p", "pytest_specperf.plugin"]
    argv += [
        "-p", "no:cacheprovider", "-rA",
        "--basetemp", str(out / "tmp" / step.name),
        # option=value: pytest picks its rootdir before plugin options are known, so an
        # existing path given as a separate word would move the rootdir and rename the cases
        f"--specperf-baselines={out / 'baselines'}",
        f"--specperf-model={CONFIG}",
        f"--specperf-steps={STEPS_PER_CASE}",
        f"--specperf-json={out / f'{step.name}.json'}",
        *step.pytest_args,
    ]  # fmt: skip
    return argv


def run_pytest(step: Step, out: Path) -> int:
    """Run a plugin step. With ``interrupt_s``, interrupt it (SIGINT: the plugin writes
    its report and stops its server) that long before the limit; on the shell's SIGTERM
    (or when the interrupt is not enough), kill it and any server it left."""
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    soft = step.timeout_s - step.interrupt_s if step.interrupt_s else None
    print("$", " ".join(pytest_argv(step, out)), flush=True)
    proc = subprocess.Popen(pytest_argv(step, out), cwd=REPO, env=env)
    basetemp = out / "tmp" / step.name
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(_stop(proc, basetemp, 0)))
    try:
        return proc.wait(timeout=soft)
    except subprocess.TimeoutExpired:
        print(f"gpu-check: {step.name} still running after {soft} s: interrupting", flush=True)
        return _stop(proc, basetemp, INTERRUPT_GRACE_S)


def _pythonpath() -> str:
    rest = os.environ.get("PYTHONPATH", "")
    return str(REPO) + (os.pathsep + rest if rest else "")


def _stop(proc: subprocess.Popen[bytes], basetemp: Path, grace_s: float) -> int:
    if proc.poll() is None and grace_s > 0:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    kill_servers(basetemp)
    return 124


def kill_servers(basetemp: Path) -> list[int]:
    """Kill the process groups of reference servers a killed pytest left behind (their
    pids are in ``server-rank*.json`` of their run directories under ``basetemp``)."""
    killed = []
    for meta in basetemp.rglob("server-rank*.json") if basetemp.is_dir() else ():
        try:
            pid = int(json.loads(meta.read_text(encoding="utf-8"))["pid"])
            if os.getpgid(pid) == pid:  # it leads its own group, as the plugin starts it
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return killed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["plan", "run"])
    ap.add_argument("step", nargs="?")
    ap.add_argument("--out", default=os.environ.get("OUT") or "./gpu-check-out")
    ap.add_argument("--names", action="store_true", help="plan: 'name timeout' per line")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.command == "plan":
        text = [f"{s.name} {s.timeout_s}" for s in PLAN] if args.names else plan_lines(out)
        print("\n".join(text))
        return 0
    if not args.step:
        ap.error("run needs a STEP")
    step = step_named(args.step)
    out.mkdir(parents=True, exist_ok=True)
    if step.is_pytest:
        return run_pytest(step, out)
    if step.name == "preflight":
        return preflight(out)
    if step.name == "summarize":
        from gpu_check_summary import summarize

        return summarize(out)
    import gpu_check_engine

    return gpu_check_engine.STEPS[step.name](out, CONFIG)


if __name__ == "__main__":
    sys.exit(main())
