#!/usr/bin/env python
"""The probe's own cost, resolved to well under 1% on a shared machine.

    python scripts/probe_overhead.py [--context 8192] [--tokens 200] [--reps 10]
        [--processes 8] [--threads 1] [--control 1%] [--json out.json]

Method (README, "Measured figures"): the reference engine decodes the same request again
and again in one process, with the probe switched **between every two decode steps**
among three arms, in a rotating order (off, on, control; on, control, off; control, off,
on; ...), so that the three arms share every moment of the machine's drift and every
burst of contention (``--interleave request`` switches per request instead):

* ``off``: ``NullProbe`` (no probe);
* ``on``: the server's probe as it runs there: ``StepProbe`` with its wall and thread-CPU
  timers on every phase, writing records to a run directory (kernel sampling off, as on a
  CPU server);
* ``control``: ``NullProbe`` plus a known cost: a spin of ``--control`` (default 1%) of the
  median off-arm decode step's CPU time, burnt once per step. It proves the method sees a
  1% cost: if ``control/off`` does not come out at 1.01 within its interval, no ``on/off``
  figure of this run is to be trusted.

Every decode step is timed on its own, in **CPU time of the process**
(``time.process_time_ns``) and in wall time, by a wrapper around the engine's step function
that is the same in every arm (the probe's work, records and sink writes included, happens
inside the step; only its one flush per request lies outside). CPU time does not count the
time the thread waits for a core another process holds, which on a shared 2-core machine is
most of the noise of wall time; the probe's cost is CPU work (and the cache misses it
causes, which stall the CPU and so count too). A generate's figure is the **median** of its
steps (a burst of contention hits a few steps, not the median); the per-repetition ratios
``on/off`` and ``control/off`` (adjacent runs: the machine's drift cancels) are summarized
by their geometric mean and a 95% bootstrap interval (seeded). Fresh processes differ from
each other by more than the repetitions of one process do (code and data land at other
addresses, the probe's objects in other cache sets): with ``--processes K`` the script runs
itself in K fresh processes, one after the other, and the verdict is taken across them
(the geometric mean of the K per-process ratios, and a 95% bootstrap interval over the
processes). The probe's own cost is
also timed alone, in CPU time: a microbenchmark of begin/7 phases/end with the sink, once
with warm caches and once with 16 MB of memory touched inside every phase (the model's
work between two probe calls evicts the probe's code and data from the caches, which is
why the probe costs several times more in a real step than in a tight loop).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics as st
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from probe_micro import empty_steps_us

from pytest_specperf.engines.reference.config import get_config
from pytest_specperf.engines.reference.engine import Engine, GenRequest
from pytest_specperf.probe import PHASES, NullProbe, RunDirSink, StepProbe

ARMS = ("off", "on", "control")


def _work(iterations: int) -> int:
    x = 1
    for _ in range(iterations):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return x


class ControlProbe(NullProbe):
    """No probe, but a known CPU cost per decode step: the positive control (a fixed amount
    of integer work, no system calls, sized once from its measured CPU time)."""

    def __init__(self, spin_ns: int) -> None:
        n = 200_000
        t = time.thread_time_ns()
        _work(n)
        per_iteration = (time.thread_time_ns() - t) / n
        self.iterations = max(int(spin_ns / per_iteration), 1)

    def end_step(self, *, accepted_tokens: int) -> None:
        _work(self.iterations)


def geo_ci(ratios: list[float], seed: int = 1, n_boot: int = 10000) -> tuple[float, float, float]:
    """Geometric mean of ``ratios`` and its 95% bootstrap percentile interval."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(seed)
    boots = sorted(st.fmean(rng.choices(logs, k=len(logs))) for _ in range(n_boot))
    lo, hi = boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]
    return math.exp(st.fmean(logs)), math.exp(lo), math.exp(hi)


class StepTimer:
    """Times every call of the engine's decode-step function (CPU and wall ns), and with
    ``probes`` set, switches the engine's probe before every step (rotating arms)."""

    def __init__(self, eng: Engine) -> None:
        self.cpu: dict[str, list[int]] = {a: [] for a in ARMS}
        self.wall: dict[str, list[int]] = {a: [] for a in ARMS}
        self.probes: dict[str, Any] | None = None
        self.arm = "off"
        self._k = 0
        inner = eng._step_dflash

        def step(batch: Any) -> None:
            if self.probes is not None:
                cycle, pos = divmod(self._k, len(ARMS))
                self.arm = ARMS[(pos + cycle) % len(ARMS)]
                eng.probe = self.probes[self.arm]
                self._k += 1
            c0, w0 = time.process_time_ns(), time.perf_counter_ns()
            inner(batch)
            self.wall[self.arm].append(time.perf_counter_ns() - w0)
            self.cpu[self.arm].append(time.process_time_ns() - c0)

        eng._step_dflash = step  # type: ignore[method-assign]

    def take(self, arm: str) -> tuple[float, float]:
        """Median CPU and wall ms of ``arm``'s steps since the last take."""
        cpu, wall = self.cpu[arm], self.wall[arm]
        self.cpu[arm], self.wall[arm] = [], []
        return st.median(cpu) / 1e6, st.median(wall) / 1e6


def generate(eng: Engine, ctx: int, tokens: int) -> None:
    eng.generate([GenRequest("m", tokens, context_len=ctx, ignore_eos=True, seed=3)])


def microbenchmark(n: int = 20000) -> float:
    """The probe's own cost per step (us), caches warm: begin, 7 phases, end, sink."""
    probe = StepProbe(RunDirSink(tempfile.mkdtemp(prefix="specperf-micro-")))
    return empty_steps_us(probe, n, clock=time.process_time_ns)


def cold_microbenchmark(n: int = 400) -> float:
    """The probe's cost per step (us) when every phase evicts the caches (16 MB touched),
    from interleaved steps with and without the probe."""
    buf = torch.empty(4_000_000)
    on = StepProbe(RunDirSink(tempfile.mkdtemp(prefix="specperf-micro-")))
    off = NullProbe()
    times: dict[str, list[int]] = {"on": [], "off": []}
    for i in range(2 * n):
        name, probe = ("on", on) if i % 2 == (i // 2) % 2 else ("off", off)
        c = time.process_time_ns()
        probe.begin_step(context_len=8192, batch_size=1, rids=["r"])
        for ph in PHASES:
            with probe.phase(ph):
                buf.add_(1.0)
        probe.end_step(accepted_tokens=3)
        times[name].append(time.process_time_ns() - c)
    on.close()
    return (st.median(times["on"]) - st.median(times["off"])) / 1e3


def control_spin_ns(eng: Engine, timer: StepTimer, args: argparse.Namespace) -> int:
    """``--control`` of the off arm's median CPU time per decode step (warm-up runs)."""
    eng.probe = NullProbe()
    cpu = []
    for _ in range(3):
        generate(eng, args.context, args.tokens)
        cpu.append(timer.take("off")[0])
    return int(st.median(cpu) * 1e6 * args.control)


def run_arms(eng: Engine, timer: StepTimer, probes: dict[str, Any], args: argparse.Namespace,
             log: Callable[[str], None]) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    out: dict[str, dict[str, list[float]]] = {a: {"cpu": [], "wall": []} for a in ARMS}
    for rep in range(args.reps):
        if args.interleave == "step":
            timer.probes = probes
            generate(eng, args.context, args.tokens)
        else:
            for arm in ARMS[rep % 3 :] + ARMS[: rep % 3]:
                eng.probe, timer.arm = probes[arm], arm
                generate(eng, args.context, args.tokens)
        for arm in ARMS:
            cpu, wall = timer.take(arm)
            out[arm]["cpu"].append(cpu)
            out[arm]["wall"].append(wall)
        log(f"rep {rep + 1}/{args.reps}: " + ", ".join(
            f"{a} {out[a]['cpu'][-1]:.3f} ms cpu" for a in ARMS))  # fmt: skip
    return out


def summarize(out: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for clock in ("cpu", "wall"):
        off = out["off"][clock]
        for arm in ("on", "control"):
            ratios = [a / b for a, b in zip(out[arm][clock], off)]
            g, lo, hi = geo_ci(ratios)
            res[f"{arm}/off {clock}"] = {
                "ratio": g, "ci95": [lo, hi], "min": min(ratios), "max": max(ratios),
                "n": len(ratios),
            }  # fmt: skip
        res[f"off {clock} ms/step"] = st.median(off)
    return res


def across_processes(args: argparse.Namespace) -> None:
    """Run this script in ``--processes`` fresh processes and judge across them."""
    import subprocess

    per: list[dict[str, Any]] = []
    for i in range(args.processes):
        out = os.path.join(tempfile.mkdtemp(prefix="specperf-overhead-"), "run.json")
        cmd = [sys.executable, __file__, "--processes", "1", "--json", out]
        cmd += [f"--{k}={v}" for k, v in _passed(args).items()]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as fh:
            per.append(json.load(fh))
        r = per[-1]["on/off cpu"]["ratio"]
        print(f"process {i + 1}/{args.processes}: on/off {r:.4f}", file=sys.stderr, flush=True)
    res: dict[str, Any] = {"processes": per, "context": args.context, "reps": args.reps}
    print(f"probe overhead at {args.context} tokens across {args.processes} fresh processes x "
          f"{args.reps} repetitions (CPU time per decode step; load average now "
          f"{os.getloadavg()[0]:.2f})")  # fmt: skip
    for arm in ("on", "control"):
        ratios = [p[f"{arm}/off cpu"]["ratio"] for p in per]
        g, lo, hi = geo_ci(ratios)
        res[f"{arm}/off cpu"] = {"ratio": g, "ci95": [lo, hi], "per_process": ratios}
        print(f"    {arm}/off {g:.4f} (95% CI {lo:.4f}-{hi:.4f}; per process "
              + ", ".join(f"{r:.4f}" for r in ratios) + ")")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


def _passed(args: argparse.Namespace) -> dict[str, Any]:
    keep = ("context", "tokens", "reps", "threads", "interleave")
    out: dict[str, Any] = {k: getattr(args, k) for k in keep}
    out["control"] = f"{args.control * 100:g}%"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--control", type=lambda s: float(s.rstrip("%")) / 100, default=0.01)
    ap.add_argument("--interleave", choices=("step", "request"), default="step")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.processes > 1:
        across_processes(args)
        return
    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    eng = Engine(get_config("tiny"))
    eng.set_kv_layout("contiguous", 1.0, 0)
    timer = StepTimer(eng)
    spin = control_spin_ns(eng, timer, args)
    probes = {
        "off": NullProbe(),
        "on": StepProbe(RunDirSink(tempfile.mkdtemp(prefix="specperf-overhead-"))),
        "control": ControlProbe(spin),
    }
    t0 = time.monotonic()
    out = run_arms(eng, timer, probes, args, lambda s: print(s, file=sys.stderr, flush=True))
    res = summarize(out)
    micro = microbenchmark()
    cold = cold_microbenchmark()
    res.update(
        context=args.context, tokens=args.tokens, threads=args.threads, reps=args.reps,
        interleave=args.interleave,
        control_share=args.control, control_spin_us=spin / 1e3, probe_micro_us=micro,
        probe_micro_cold_us=cold,
        loadavg_before=load0, loadavg_after=os.getloadavg(),
        seconds=round(time.monotonic() - t0, 1), torch=torch.__version__, raw=out,
    )  # fmt: skip
    report(res)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


def report(res: dict[str, Any]) -> None:
    print(f"probe overhead at {res['context']} tokens, {res['reps']} repetitions x 3 arms "
          f"(switched per {res['interleave']}), "
          f"{res['threads']} thread(s), {res['seconds']} s; load average "
          f"{res['loadavg_before'][0]:.2f} before, "
          f"{res['loadavg_after'][0]:.2f} after")  # fmt: skip
    for clock in ("cpu", "wall"):
        print(f"  {clock} time per decode step (median), off arm: "
              f"{res[f'off {clock} ms/step']:.3f} ms")
        for arm in ("on", "control"):
            r = res[f"{arm}/off {clock}"]
            print(f"    {arm}/off {r['ratio']:.4f} (95% CI {r['ci95'][0]:.4f}-{r['ci95'][1]:.4f}, "
                  f"range {r['min']:.4f}-{r['max']:.4f}, n {r['n']})")  # fmt: skip
    step_us = res["off cpu ms/step"] * 1e3
    print(f"  control: {res['control_share']:.1%} of a step = {res['control_spin_us']:.0f} us of "
          f"CPU per step; probe alone (microbenchmark, CPU time per step): "
          f"{res['probe_micro_us']:.1f} us with warm caches "
          f"({res['probe_micro_us'] / step_us:.3%} of the off arm's step), "
          f"{res['probe_micro_cold_us']:.1f} us with caches evicted in every phase "
          f"({res['probe_micro_cold_us'] / step_us:.3%})")  # fmt: skip


if __name__ == "__main__":
    main()
