"""What an all-phases slowdown would do to the A/B step gates, from quiet runs alone.

Adds a shift (log, in percent) to every ``step`` gate's judged change in each A/A report
of a work dir and judges it at step tolerances against the gate's own band
(``critical x noise``): a run is caught when any step gate clears both. Also counts the
A/A runs with a step gate whose band is wider than the tolerance (UNSTABLE).

    python step_power.py WORK_DIR 9.49
"""

from __future__ import annotations

import glob
import json
import math
import sys


def main(work_dir: str, shift_pct: float) -> None:
    shift = shift_pct / 100
    runs = []
    for path in sorted(glob.glob(f"{work_dir}/rep*-A_A.json")):
        with open(path) as f:
            report = json.load(f)
        runs.append([
            (math.log1p(m["change"]), m["critical"] * m["noise"])
            for case in report["cases"]
            for m in case["metrics"]
            if m["metric"] == "step"
        ])
    print(f"{work_dir}: {len(runs)} A/A runs, shift {shift_pct}% (log)")
    for tol in (0.06, 0.07, 0.08, 0.09, 0.10, 0.12):
        lt = math.log1p(tol)
        unstable = sum(any(band > lt for _, band in g) for g in runs)
        past = sorted(sum(c + shift > max(lt, band) for c, band in g) for g in runs)
        caught = sum(n > 0 for n in past)
        print(
            f"step tol {tol:4.0%}: A/A step UNSTABLE {unstable}/{len(runs)}; shifted caught "
            f"{caught}/{len(runs)}; gates past it per run: least {past[0]}, median "
            f"{past[len(past) // 2]}"
        )


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
