"""What the injection control file costs a running server's probe.

    python scripts/measure_control_stat.py [--steps 20000] [--reps 7]

1. ``os.stat`` of the control file, alone (absent, as in every unmeasured run, and present).
2. The probe's whole per-step cost (7 phases, a record, the run-dir sink), without a
   control file reader and with one (looking every ``CONTROL_EVERY_STEPS`` steps, and,
   for comparison, every step), interleaved repetitions; median and range.
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import tempfile
import time
from pathlib import Path

from probe_micro import empty_steps_us

from pytest_specperf.probe import RunDirSink, StepProbe
from pytest_specperf.probe import spans as spans_mod
from pytest_specperf.probe.inject import (
    CONTROL_EVERY_STEPS,
    CONTROL_FILE,
    InjectControl,
    write_control,
)


def stat_ns(path: Path, n: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        try:  # noqa: SIM105 - as the probe does (suppress() costs more)
            os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            pass
    return (time.perf_counter_ns() - t) / n


def step_us(steps: int, control: bool) -> float:
    run_dir = tempfile.mkdtemp(prefix="specperf-ctl-")
    probe = StepProbe(RunDirSink(run_dir), control=InjectControl(run_dir) if control else None)
    return empty_steps_us(probe, steps)


def spread(xs: list[float]) -> str:
    return f"median {st.median(xs):.3f}, min {min(xs):.3f}, max {max(xs):.3f}, n {len(xs)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="specperf-ctl-"))
    absent = [stat_ns(d / CONTROL_FILE, args.steps) for _ in range(args.reps)]
    write_control(d, None)
    present = [stat_ns(d / CONTROL_FILE, args.steps) for _ in range(args.reps)]
    print(f"1. os.stat of the control file, ns per call: absent {spread(absent)}; "
          f"present {spread(present)}")  # fmt: skip
    arms: dict[str, list[float]] = {"off": [], f"every {CONTROL_EVERY_STEPS}": [], "every 1": []}
    for _ in range(args.reps):  # interleaved
        arms["off"].append(step_us(args.steps, control=False))
        arms[f"every {CONTROL_EVERY_STEPS}"].append(step_us(args.steps, control=True))
        spans_mod.CONTROL_EVERY_STEPS = 1  # the probe reads the module constant
        arms["every 1"].append(step_us(args.steps, control=True))
        spans_mod.CONTROL_EVERY_STEPS = CONTROL_EVERY_STEPS
    print(f"2. probe cost per step, us ({args.steps} steps x {args.reps} interleaved reps):")
    for name, xs in arms.items():
        print(f"   control file looked at {name:9s}: {spread(xs)}")
    base = st.median(arms["off"])
    every = st.median(arms[f"every {CONTROL_EVERY_STEPS}"])
    print(f"   the reader as shipped adds {every - base:+.3f} us per step "
          f"(expected from 1.: {st.median(absent) / 1e3 / CONTROL_EVERY_STEPS:.3f} us)")


if __name__ == "__main__":
    main()
