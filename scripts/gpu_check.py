#!/usr/bin/env python3
"""The first GPU run's measurements, step by step, each with its own time limit.

    python3 scripts/gpu_check.py plan [--out DIR] [--names]   # the plan (no torch needed)
    python3 scripts/gpu_check.py run STEP [--out DIR] [--rehearse]  # one step of the plan
    python3 scripts/gpu_check.py margins [--out DIR] [--rehearse]  # each step's time vs limit
    python3 scripts/gpu_check.py rehearsal-ok [--out DIR]     # CI: every step and part ran
    bash scripts/gpu-check.sh [--dry-run | --rehearse]         # every step, under `timeout`

Steps (``PLAN``; the shell script runs them in this order, each under ``timeout``):

``preflight``  interpreter, every import the check needs (torch, pytest, pytest-benchmark,
               PyYAML, filelock, nvidia-ml-py, the plugin), CUDA: what this machine has.
``telemetry``  NVML identity, peak bandwidth, throttle reasons, process list; a 4 GB
               device-to-device copy's GB/s against GPM DRAM_BW_UTIL over >= 1 s; the
               canary's ``_sleep`` calibration at idle, with the SM clock.
``engine``     the medium reference engine in this process (see ``gpu_check_engine``):
               graphs vs eager on the same seeds at 32k and 46k, event spans vs kernels
               a sync census over 3 steps, per-phase host/device times and KV-read
               bandwidth at 32k/46k contiguous and fragmented, 10 s of back-to-back decode
               with GPM and the ``_sleep`` calibration before and after it, the verify=1.10
               and host_stall canaries as changes in device verify / unaccounted time,
               probe on/off interleaved, DFLASH against NONE.
``record``     the plugin records baselines (medium, 32k/46k, contiguous/fragmented, the
               CUDA-graph replay test) into ``OUT/baselines/<device>.yaml``.
``canary``     ``--specperf-inject verify=1.10,host_stall=2`` against those baselines:
               must fail on verify and unaccounted.
``aa1``..      A/A (fresh processes, no change) and ``verify=1.05`` arms, interleaved,
               against the same baselines: the GPU noise and detection figures. The arms
               run with the automatic extension off (``--specperf-max-time=0``): a fixed
               amount of work, so a fixed time.
``profile``    the profiler parts, after every other measurement: event spans against
               kernels (torch.profiler) over 10 steps at 46k, a small CUDA trace. A
               profiler hang (CUPTI with graph replays) costs only this step;
               ``SPECPERF_KERNEL_EVERY=0`` skips it and the servers' kernel sampling.
``summarize``  one summary (``summary.json``, ``summary.txt``) from whatever the steps left,
               with which steps finished and which were stopped at their limit.

Every step writes under ``OUT`` (default ``./gpu-check-out``) as it goes, so a step that
runs out of time still leaves its partial results and its log. At its limit less
``INTERRUPT_GRACE_S`` a step is interrupted (SIGINT: pytest writes its ``--specperf-json``
report and stops its server; an in-process step records the part it was in), and killed
only at its limit.

``--rehearse`` runs every step on the CPU (the ``tiny`` engine; the CUDA-only calls
replaced by the named stand-ins of ``gpu_check_device``) and ``margins`` sets each step's
measured time plus its desk estimate of the GPU-only work against its limit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import os
import re
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
#: The shell's ``timeout`` interrupts a pytest step (SIGINT) this many seconds before its
#: limit and kills it (SIGKILL) at the limit: the time pytest has to write its report and
#: stop its server.
INTERRUPT_GRACE_S = 8
#: The same for an in-process step: the time to record the part it was in.
IN_PROCESS_GRACE_S = 3
#: Each step's estimate (rehearsal time plus desk estimate) must leave this share of its
#: limit unused.
MARGIN = 0.30
#: A rehearsal enforces each limit times this, so that every part runs to its end on a slow
#: or shared CPU; ``margins`` judges each step's time against its real limit.
REHEARSAL_LIMIT_FACTOR = 4
#: Exit status of a step stopped at its limit (``timeout``'s; 137 when it had to be killed).
STOPPED = 124
CONFIG = "medium"
STEPS_PER_CASE = 32
DECODE = "perf_tests/test_decode.py::test_decode[kv={layout}-ctx={ctx}]"
REPLAY = "perf_tests/test_decode.py::test_cuda_graph_replay[ctx=32768]"
HEADLINE = DECODE.format(layout="contiguous", ctx=46000)
CANARY_SPEC = "verify=1.10,host_stall=2"
ARM_SPEC = "verify=1.05"
DEVICE_SLUG = "nvidia-h200"
LAYOUTS = ("contiguous", "fragmented")
#: A rehearsal's plugin steps: the tiny engine on the CPU at this context (the GPU-only
#: graph-replay test skips, saying why), fewer steps.
REHEARSAL_CTX = 8192
REHEARSAL_STEPS = 8
REHEARSAL_WARMUP = 2
#: The automatic extension off: a case measures its steps once, in a known time
#: (``--specperf-max-time``, the option's spelling on this checkout).
NO_EXTENSION = "--specperf-max-time=0"


@dataclass(frozen=True)
class Desk:
    """One piece of a step's GPU-only work that the CPU rehearsal does not do, as estimated
    at the desk (seconds on the H200), with where the figure comes from."""

    what: str
    seconds: float
    why: str


#: Desk figures (replace with the first GPU run's measurements: every step's time is in
#: ``OUT/steps.json``, the engine's build time in ``engine.json``).
CUDA_INIT = Desk("CUDA init", 5.0, "context, cuBLAS handle, lazy module loading (torch 2.x)")
MEDIUM_BUILD = Desk(
    "medium build", 2.5, "886M weights: 5.1 s of CPU time on 2 cores here, chunks on 16 "
    "threads; 1.8 GB to the device in bf16; the drafter's token map (4 TFLOP)")
def _captures(n: int) -> Desk:
    return Desk(f"{n} graph captures", 0.3 * n, "warm-up forward, capture, replay: 0.3 s each")
PROFILER_START = Desk("profiler start", 3.0, "CUPTI initialisation at the first profiled step")
SLEEP_CALIBRATIONS = Desk("_sleep calibrations", 2.0, "four calibrations of the canary kernel")
GPM_WINDOWS = Desk("GPM and copies", 3.0, "4 GB copies over 1.2 s; 1 GB over 0.3 s; GPM ramp")
SERVER = (CUDA_INIT, MEDIUM_BUILD, PROFILER_START)  # + its captures and decode
LOAD_WINDOW = Desk("load window", 10.0, "the engine's 10 s load part (a rehearsal runs 2.5 s)")
TRACE_EXPORT = Desk("trace export", 3.0, "CUDA traces of ~10 medium steps written and parsed")


def _decode(steps: int) -> Desk:
    """The GPU's decode time of a step's full work (a rehearsal decodes less, shorter)."""
    return Desk(f"decode {steps} steps", round(steps * 0.005, 1) or 0.1,
                "at 32k/46k, about 5 ms a step (eager ones ~10 ms); synthetic fills included")


@dataclass(frozen=True)
class Step:
    """One step of the plan: its time budget, what it measures and what it writes."""

    name: str
    timeout_s: int
    what: str
    outputs: tuple[str, ...]
    nodeids: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    #: the GPU-only work the CPU rehearsal does not do (added to its time in ``margins``)
    desk: tuple[Desk, ...] = ()
    #: the earlier step this one repeats under another name (the same nodes, arguments and
    #: desk: another sample of the same measurement); a rehearsal runs it once, as that step
    repeat_of: str | None = None

    @property
    def is_pytest(self) -> bool:
        return bool(self.nodeids)

    @property
    def desk_s(self) -> float:
        return sum(d.seconds for d in self.desk)

    @property
    def grace_s(self) -> int:
        """Seconds between the step's interrupt (SIGINT) and its kill (at its limit)."""
        return INTERRUPT_GRACE_S if self.is_pytest else IN_PROCESS_GRACE_S


def _arm(name: str, inject: str | None, repeat_of: str | None = None) -> Step:
    args = (*((f"--specperf-inject={inject}",) if inject else ()), NO_EXTENSION)
    what = f"fresh process, {inject or 'no change (A/A)'} vs the recorded baseline"
    desk = (*SERVER, _captures(2), _decode(60))
    return Step(name, 34, what, (f"{name}.json",), (HEADLINE,), args, desk, repeat_of)


PLAN: tuple[Step, ...] = (
    Step(
        "preflight",
        20,
        "interpreter, imports (torch, pytest, pytest-benchmark, PyYAML, filelock, "
        "nvidia-ml-py, the plugin), CUDA",
        ("preflight.json",),
        desk=(CUDA_INIT,),
    ),
    Step(
        "telemetry",
        25,
        "NVML identity, peak bandwidth, throttle reasons, processes; 4 GB copy vs GPM "
        "DRAM_BW_UTIL over >= 1 s; _sleep calibration at idle",
        ("telemetry.json",),
        desk=(CUDA_INIT, GPM_WINDOWS),
    ),
    Step(
        "engine",
        90,
        "in-process medium engine: graphs vs eager 32k/46k, sync census, phases and KV-read "
        "bandwidth per layout, 10 s load with GPM and _sleep recalibration, verify=1.10 "
        "and host_stall canaries, probe on/off, DFLASH vs NONE",
        ("engine.json",),
        desk=(CUDA_INIT, MEDIUM_BUILD, MEDIUM_BUILD, _captures(8), SLEEP_CALIBRATIONS,
              GPM_WINDOWS, LOAD_WINDOW, _decode(1600)),
    ),
    Step(
        "record",
        50,
        "plugin: record baselines (medium, 32k/46k, contiguous/fragmented, graph replay)",
        ("record.json", f"baselines/{DEVICE_SLUG}.yaml"),
        (
            *(DECODE.format(layout=lay, ctx=ctx) for ctx in (32768, 46000) for lay in LAYOUTS),
            REPLAY,
        ),
        ("--specperf-update-baselines",),
        (*SERVER, _captures(4), _decode(300)),
    ),
    Step(
        "canary",
        36,
        f"plugin: {CANARY_SPEC} vs the baseline (must fail on verify and unaccounted)",
        ("canary.json",),
        (HEADLINE,),
        (f"--specperf-inject={CANARY_SPEC}", NO_EXTENSION),
        (*SERVER, _captures(2), SLEEP_CALIBRATIONS, _decode(60)),
    ),
    _arm("aa1", None),
    _arm("v105a", ARM_SPEC),
    _arm("aa2", None, "aa1"),
    _arm("v105b", ARM_SPEC, "v105a"),
    _arm("aa3", None, "aa1"),
    _arm("v105c", ARM_SPEC, "v105a"),
    Step(
        "profile",
        35,
        "in-process medium engine under torch.profiler, last (a hang loses only this step): "
        "event spans vs kernels over 10 steps at 46k, a small CUDA trace at 4k",
        ("profile.json", "traces/engine-46k.json.gz", "traces/cuda-small.json.gz"),
        desk=(CUDA_INIT, MEDIUM_BUILD, _captures(4), PROFILER_START, TRACE_EXPORT, _decode(100)),
    ),
    Step("summarize", 10, "one summary from every step's output", ("summary.json", "summary.txt")),
)


def plan_lines(out: Path) -> list[str]:
    """The plan in words: step, timeout, node ids, output files."""
    total = sum(s.timeout_s for s in PLAN)
    lines = [f"gpu-check plan: {len(PLAN)} steps, {total} s of timeouts (budget {BUDGET_S} s)"]
    lines.append(f"output directory: {out}")
    lines.append(
        f"each step: SIGINT at its limit less {INTERRUPT_GRACE_S} s (pytest steps) or "
        f"{IN_PROCESS_GRACE_S} s (in-process steps), SIGKILL at its limit"
    )
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
    """A step's result document, rewritten after every part (partial results survive).

    With a rehearsal's ``side``, the document says it is a rehearsal and lists the
    stand-ins its parts used (``stand_ins``): its figures are CPU figures."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    side: Any = None

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        if self.side is not None and self.side.rehearsal:
            self.data["rehearsal"] = "CPU rehearsal with stand-ins: not GPU results"
            self.data["stand_ins"] = dict(self.side.stand_ins)
        write_json(self.path, self.data)

    def part(self, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one part; its result, or its error, lands under ``key`` (an interrupt at
        the step's limit is recorded, then ends the step)."""
        t0 = time.monotonic()
        used = set(self.side.stand_ins) if self.side is not None else set()
        print(f"-- {key}", flush=True)
        try:
            value = fn(*args, **kwargs)
        except KeyboardInterrupt:
            self.put(key, {"error": "interrupted at the step's limit", "s": _since(t0)})
            raise
        except Exception as e:  # one failing part must not lose the others
            import traceback

            traceback.print_exc()
            self.put(key, {"error": f"{type(e).__name__}: {e}", "s": _since(t0)})
            return None
        entry: dict[str, Any] = {"s": _since(t0), "result": value}
        if self.side is not None and self.side.rehearsal:
            entry["stand_ins"] = sorted(set(self.side.stand_ins) - used) or None
            print(f"   {key}: {entry['s']} s; stand-ins: {entry['stand_ins']}", flush=True)
        self.put(key, entry)
        return value


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


# -- steps --------------------------------------------------------------------------------


#: What the check imports, as (module, distribution to install, needed where): every one
#: is imported by preflight, so a missing one stops the run before any step needs it.
IMPORTS: tuple[tuple[str, str, str], ...] = (
    ("torch", "torch", "every step"),
    ("pytest", "pytest", "the plugin steps"),
    ("pytest_benchmark", "pytest-benchmark", "the plugin (its benchmark fixture)"),
    ("yaml", "PyYAML", "baselines"),
    ("filelock", "filelock", "recording baselines (their lock)"),
    ("pynvml", "nvidia-ml-py", "telemetry (NVML, GPM)"),
    ("pytest_specperf.plugin", "the checkout on PYTHONPATH", "the plugin steps"),
)
#: Imports a CPU rehearsal can do without (its telemetry reports NVML as unavailable).
REHEARSAL_OPTIONAL = frozenset({"pynvml"})


def check_imports(rehearse: bool = False) -> tuple[dict[str, str | None], list[str]]:
    """Each import the check needs: its version (or "ok"), and the problems in words."""
    found: dict[str, str | None] = {}
    problems = []
    for module, dist, needed in IMPORTS:
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # ImportError, or a broken install raising anything
            found[module] = None
            if not (rehearse and module in REHEARSAL_OPTIONAL):
                problems.append(
                    f"{sys.executable} cannot import {module} ({type(e).__name__}: {e}); "
                    f"needed by {needed}: install {dist} into this interpreter, or set PYTHON"
                )
            continue
        found[module] = str(getattr(mod, "__version__", None) or _dist_version(dist) or "ok")
    return found, problems


def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def preflight(out: Path, rehearse: bool = False) -> int:
    """What this machine has; exit 2 (the run stops) when an import the check needs is
    missing, or (not rehearsing) without CUDA."""
    info: dict[str, Any] = {"python": sys.executable, "version": sys.version.split()[0]}
    info["imports"], problems = check_imports(rehearse)
    info["plugin_installed"] = plugin_installed()
    info["rehearsal"] = rehearse
    write_json(out / "preflight.json", info)
    if problems:
        info["problems"] = problems
        write_json(out / "preflight.json", info)
        for line in problems:
            print(f"gpu-check: {line}", file=sys.stderr)
        return 2
    import torch

    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    if info["cuda_available"]:
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        free, total = torch.cuda.mem_get_info(0)
        info["memory_free_total"] = [free, total]
    write_json(out / "preflight.json", info)
    print(json.dumps(info, indent=1))
    if rehearse:
        print("gpu-check: REHEARSAL on the CPU: CUDA is not needed; the CUDA-only calls are "
              "stand-ins (gpu_check_device.STAND_INS)")
        return 0
    if not info["cuda_available"]:
        print(f"gpu-check: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    return 0


def plugin_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(e.value.startswith("pytest_specperf") for e in eps)


def pytest_argv(step: Step, out: Path, rehearse: bool = False) -> list[str]:
    """The pytest command of a plugin step (the plugin loaded from the checkout when the
    package is not installed). A rehearsal runs the ``tiny`` engine on the CPU, where the
    GPU-only test skips with its reason."""
    nodeids = rehearsal_nodeids(step) if rehearse else list(step.nodeids)
    argv = [sys.executable, "-m", "pytest", *nodeids]
    if not plugin_installed():
        argv += ["-p", "pytest_specperf.plugin"]
    argv += [
        "-p", "no:cacheprovider", "-rA",
        "--basetemp", str(out / "tmp" / step.name),
        # option=value: pytest picks its rootdir before plugin options are known, so an
        # existing path given as a separate word would move the rootdir and rename the cases
        f"--specperf-baselines={out / 'baselines'}",
        f"--specperf-model={'tiny' if rehearse else CONFIG}",
        f"--specperf-steps={REHEARSAL_STEPS if rehearse else STEPS_PER_CASE}"
        + (f",warmup={REHEARSAL_WARMUP}" if rehearse else ""),
        f"--specperf-json={out / f'{step.name}.json'}",
        *step.pytest_args,
    ]  # fmt: skip
    return argv


def rehearsal_nodeids(step: Step) -> list[str]:
    """The step's decode cases at ``REHEARSAL_CTX`` (each once), its other tests as they are."""
    out: list[str] = []
    for n in step.nodeids:
        if "::test_decode[" in n:
            n = re.sub(r"ctx=\d+", f"ctx={REHEARSAL_CTX}", n)
        if n not in out:
            out.append(n)
    return out


def run_pytest(step: Step, out: Path, rehearse: bool = False) -> int:
    """Run a plugin step. The shell's ``timeout`` interrupts this process and pytest
    together (SIGINT to the process group) ``step.grace_s`` before the limit: pytest
    writes its report of the finished cases and stops its server while this process waits
    for it; then any server left is killed by its pid. On SIGTERM: the same, at once."""
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    argv = pytest_argv(step, out, rehearse)
    print("$", " ".join(argv), flush=True)
    basetemp = out / "tmp" / step.name
    basetemp.parent.mkdir(parents=True, exist_ok=True)  # pytest makes --basetemp, not its parent
    # a script started in the background (`cmd &` in a non-interactive shell, nohup) inherits
    # SIGINT ignored, and pytest with it: the interrupt at the limit would then reach nobody
    # and the step would end only at its SIGKILL, without its report
    signal.signal(signal.SIGINT, signal.default_int_handler)
    proc = subprocess.Popen(argv, cwd=REPO, env=env)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(_stop(proc, basetemp, 0)))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        print(f"gpu-check: {step.name} interrupted at its limit: waiting up to "
              f"{step.grace_s} s for pytest's report", flush=True)
        return _stop(proc, basetemp, step.grace_s, interrupted=True)


def _pythonpath() -> str:
    rest = os.environ.get("PYTHONPATH", "")
    return str(REPO) + (os.pathsep + rest if rest else "")


def _stop(
    proc: subprocess.Popen[bytes], basetemp: Path, grace_s: float, interrupted: bool = False
) -> int:
    """Stop pytest: SIGINT (unless the group's interrupt already reached it), ``grace_s``
    to finish, then SIGKILL; then kill the servers it left."""
    if proc.poll() is None and grace_s > 0:
        if not interrupted:
            proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.wait(timeout=grace_s)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    kill_servers(basetemp)
    return STOPPED


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


# -- step outcomes and margins ---------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How one step ended, as the shell recorded it in ``OUT/steps.tsv``: its exit status,
    its wall time and the CPU time (user + system) of its processes, its server's too."""

    name: str
    rc: int
    seconds: float
    cpu_s: float | None = None

    @property
    def status(self) -> str:
        if self.rc == STOPPED:
            return "stopped at its limit (interrupted)"
        if self.rc == 128 + signal.SIGKILL:
            return "killed at its limit"
        return "finished" if self.rc in (0, 1) else f"failed (exit {self.rc})"

    @property
    def finished(self) -> bool:
        """Ran to its end (a pytest step that ran its tests exits 1 when one failed, as
        the canary must)."""
        return self.rc in (0, 1)


def outcomes(out: Path) -> dict[str, Outcome]:
    """The steps that ran, from ``OUT/steps.tsv`` (``name rc seconds [cpu]`` per line)."""
    found: dict[str, Outcome] = {}
    path = out / "steps.tsv"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else ():
        parts = line.split()
        with contextlib.suppress(ValueError, IndexError):
            cpu = float(parts[3]) if len(parts) > 3 else None
            found[parts[0]] = Outcome(parts[0], int(parts[1]), float(parts[2]), cpu)
    return found


def rehearsed(rehearsal: bool) -> tuple[Step, ...]:
    """The steps a run runs: all of them on the GPU; in a rehearsal each once, a repeat
    (``Step.repeat_of``: the same nodes and arguments under another name) being the code
    path of its first already rehearsed."""
    return tuple(s for s in PLAN if not (rehearsal and s.repeat_of))


def step_report(out: Path, rehearsal: bool = False) -> dict[str, Any]:
    """Which steps finished, which were stopped at their limit, which did not run (a
    rehearsal's repeats aside: ``rehearsed``)."""
    done = outcomes(out)
    return {
        "finished": [n for n, o in done.items() if o.finished],
        "stopped": {n: o.status for n, o in done.items() if not o.finished},
        "not_run": [s.name for s in rehearsed(rehearsal) if s.name not in done],
        "seconds": {n: o.seconds for n, o in done.items()},
    }


def margin_rows(out: Path, rehearsal: bool) -> list[dict[str, Any]]:
    """Per step: its measured wall and CPU time, the desk estimate of the GPU-only work a
    rehearsal does not do (0 on the GPU itself), their sums against the limit, and whether
    the sum leaves ``MARGIN`` of the limit unused (on the CPU time where measured: on an
    idle machine a step's wall time is its CPU time and its waits, and the waits the
    rehearsal has are covered by the desk, e.g. the load window; on a shared one the wall
    time is mostly other processes')."""
    done = outcomes(out)
    rows = []
    for s in PLAN:
        o = done.get(s.name)
        repeat = rehearsal and o is None and s.repeat_of is not None
        if repeat:  # rehearsed once, as its first: that step's time stands for it
            o = done.get(str(s.repeat_of))
        desk = s.desk_s if rehearsal else 0.0
        est = None if o is None else o.seconds + desk
        cpu_est = None if o is None or o.cpu_s is None else o.cpu_s + desk
        rows.append({
            "step": s.name, "limit_s": s.timeout_s,
            "measured_s": None if o is None else o.seconds,
            "cpu_s": None if o is None else o.cpu_s,
            "desk_s": desk, "estimate_s": est,
            "margin": None if est is None else round(1 - est / s.timeout_s, 3),
            "cpu_margin": None if cpu_est is None else round(1 - cpu_est / s.timeout_s, 3),
            "status": "not run" if o is None
            else f"{o.status} (as {s.repeat_of}: a repeat, rehearsed once)" if repeat
            else o.status,
            # judged on the CPU time where the shell measured it (a shared machine's load
            # lengthens wall time, not a step's own CPU time), else on the wall time
            "ok": o is not None and o.finished and est is not None
            and (cpu_est if cpu_est is not None else est) <= (1 - MARGIN) * s.timeout_s,
        })  # fmt: skip
    return rows


def part_times(out: Path) -> list[tuple[str, str, float | None, str]]:
    """(step, part, seconds, error or stand-ins) of the in-process steps' parts."""
    rows = []
    for step in ("telemetry", "engine", "profile"):
        try:
            data = json.loads((out / f"{step}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key, v in data.items():
            if isinstance(v, dict) and "s" in v:
                note = v.get("error") or ", ".join(v.get("stand_ins") or []) or ""
                rows.append((step, key, v.get("s"), note))
    return rows


def margins(out: Path, rehearsal: bool) -> int:
    """Print each step's time against its limit; 0 when every step finished within its
    limit less ``MARGIN``, 1 otherwise."""
    rows = margin_rows(out, rehearsal)
    head = ("REHEARSAL on the CPU (tiny engine, CUDA-only calls replaced by named stand-ins; "
            "these are not GPU results): step time + desk estimate of the GPU-only work"
            if rehearsal else "GPU run: step time")
    lines = [f"== margins: {head}, against each limit (need >= {MARGIN:.0%} unused)"]
    lines.append("   (cpu: CPU time of the step's processes, its server's included; cpu mgn: cpu + "
                 "desk against the limit: near an idle machine's, waits aside)")
    lines.append(f"{'step':10s} {'limit':>6s} {'time':>7s} {'cpu':>6s} {'desk':>6s} {'est':>7s} "
                 f"{'margin':>7s} {'cpu mgn':>7s}  status")
    for r in rows:
        def f(x: Any, w: int) -> str:
            return f"{x:{w}.1f}" if isinstance(x, float | int) else f"{'-':>{w}s}"

        def pct(x: Any) -> str:
            return f"{x:7.0%}" if x is not None else f"{'-':>7s}"

        lines.append(f"{r['step']:10s} {r['limit_s']:6d} {f(r['measured_s'], 7)} "
                     f"{f(r['cpu_s'], 6)} {f(r['desk_s'], 6)} {f(r['estimate_s'], 7)} "
                     f"{pct(r['margin'])} {pct(r['cpu_margin'])}  "
                     f"{'ok' if r['ok'] else 'SHORT'}: {r['status']}")
    total = sum(r["measured_s"] or 0 for r in rows)
    cpu = sum(r["cpu_s"] or 0 for r in rows)
    lines.append(f"total measured {total:.1f} s ({cpu:.1f} s of CPU); limits "
                 f"{sum(s.timeout_s for s in PLAN)} s (budget {BUDGET_S} s)")
    if rehearsal:
        lines.append("desk estimates (GPU-only work the rehearsal cannot do), and their steps:")
        desks: dict[Desk, list[str]] = {}
        for s in PLAN:
            for d in s.desk:
                desks.setdefault(d, []).append(s.name)
        for d, names in desks.items():
            lines.append(f"  {d.what:20s} {d.seconds:5.1f} s  {d.why} [{' '.join(names)}]")
    parts = part_times(out)
    if parts:
        lines.append("parts of the in-process steps (seconds; error or stand-ins used):")
        for step, key, sec, note in parts:
            lines.append(f"  {step:10s} {key:28s} {sec if sec is not None else '-':>8}  {note}")
    text = "\n".join(lines)
    print(text)
    (out / "margins.txt").write_text(text + "\n", encoding="utf-8")
    write_json(out / "margins.json", {"rehearsal": rehearsal, "margin": MARGIN, "steps": rows})
    return 0 if all(r["ok"] for r in rows) else 1


def rehearsal_ok(out: Path) -> int:
    """After a rehearsal (CI): 0 when every step ran to its end, no part of an in-process
    step failed, and every in-process step's JSON says it is a rehearsal; else 1, saying
    what is wrong. The margins are the report's business, not this check's: a CI machine's
    speed is not the GPU machine's."""
    report = step_report(out, rehearsal=True)
    problems = [f"step {s}: {st}" for s, st in report["stopped"].items()]
    problems += [f"step {s}: not run" for s in report["not_run"]]
    problems += [f"{step}.{key}: {note}" for step, key, _, note in part_times(out)
                 if note and not _stand_in_note(note)]
    for step in ("telemetry", "engine", "profile"):
        try:
            data = json.loads((out / f"{step}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            problems.append(f"{step}.json: missing or unreadable")
            continue
        if "not GPU results" not in str(data.get("rehearsal")):
            problems.append(f"{step}.json does not say it is a rehearsal")
    for line in problems:
        print(f"gpu-check rehearsal: {line}", file=sys.stderr)
    print(f"gpu-check rehearsal: {len(rehearsed(True))} steps (each repeat once, as its "
          f"first), {len(problems)} problems")
    return 1 if problems else 0


def _stand_in_note(note: str) -> bool:
    from gpu_check_device import STAND_INS

    return all(n.strip() in STAND_INS for n in note.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["plan", "run", "margins", "rehearsal-ok"])
    ap.add_argument("step", nargs="?")
    ap.add_argument("--out", default=os.environ.get("OUT") or "./gpu-check-out")
    ap.add_argument("--names", action="store_true",
                    help="plan: 'name limit grace real-limit' per line (--rehearse: the "
                    "rehearsal's enforced limit, and its steps: each repeat once)")
    ap.add_argument("--rehearse", action="store_true",
                    help="on the CPU: tiny engine, named stand-ins for the CUDA-only calls")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.command == "plan":
        factor = REHEARSAL_LIMIT_FACTOR if args.rehearse else 1
        text = (
            [f"{s.name} {s.timeout_s * factor} {s.grace_s} {s.timeout_s}"
             for s in rehearsed(args.rehearse)] if args.names
            else plan_lines(out)
        )
        print("\n".join(text))
        return 0
    if args.command == "margins":
        return margins(out, args.rehearse)
    if args.command == "rehearsal-ok":
        return rehearsal_ok(out)
    if not args.step:
        ap.error("run needs a STEP")
    step = step_named(args.step)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return run_step(step, out, args.rehearse)
    except KeyboardInterrupt:  # the shell's interrupt at the step's limit
        print(f"gpu-check: {step.name} interrupted at its limit", file=sys.stderr, flush=True)
        return STOPPED


def run_step(step: Step, out: Path, rehearse: bool) -> int:
    if rehearse:
        print(f"gpu-check: REHEARSAL of {step.name} on the CPU (stand-ins for CUDA-only "
              "calls; not GPU results)", flush=True)
    if step.is_pytest:
        return run_pytest(step, out, rehearse)
    if step.name == "preflight":
        return preflight(out, rehearse)
    if step.name == "summarize":
        from gpu_check_summary import summarize

        return summarize(out, rehearse)
    import gpu_check_engine
    from gpu_check_device import side_for

    return gpu_check_engine.STEPS[step.name](out, side_for(rehearse))


if __name__ == "__main__":
    sys.exit(main())
