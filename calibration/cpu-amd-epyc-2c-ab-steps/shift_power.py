"""The power A/B at 64 steps should have, predicted from the committed A/A runs alone:
each run's `verify` change moved by the injection (ln 1.05 added to its log change; its
noise, critical value and scatter kept, judged at one look as one_look.py does) and judged
again at several phase tolerances (step 25%). A run detects when a case fails naming
verify, as `specperf calibrate` counts it (judging.calibration.judge_run). The A/A rows
beside it are the same runs unshifted: their UNSTABLE counts are the price of each
tolerance.

    cd calibration/cpu-amd-epyc-2c-ab-steps
    /work/venv/bin/python shift_power.py steps64 1.05 > shift_power.txt

Written before the verify=1.05 runs (docs/calibration.md, "A/B power at 64 steps").
"""

import glob
import sys
from dataclasses import replace
from pathlib import Path

from one_look import at_plan

from pytest_specperf.judging.calibration import judge_run
from pytest_specperf.store.report import read_report

HERE = Path(__file__).parent
TOLS = (0.04, 0.045, 0.05, 0.06, 0.07)


def shifted(cases, factor):
    out = []
    for c in cases:
        ms = tuple(
            replace(m, change=(1 + m.change) * factor - 1) if m.metric == "verify" else m
            for m in c.metrics
        )
        out.append(replace(c, metrics=ms))
    return out


def main(name, factor):
    files = sorted(glob.glob(str(HERE / name / "rep*-A_A.json")))
    runs = [[c for c, _ in at_plan(read_report(Path(f)))] for f in files]
    print(f"== {name}: {len(runs)} A/A runs at one look; verify x{factor} added to each")
    print("phase tol  A/A fail  A/A UNSTABLE  verify detected  named right  "
          "cases caught (median of 6)")
    for tol in TOLS:
        aa = [judge_run(r, None, tol, 0.25) for r in runs]
        inj = [judge_run(shifted(r, factor), "verify", tol, 0.25) for r in runs]
        per = sorted(sum(1 for s in o.slower_cases if "verify" in s.metrics) for o in inj)
        print(
            f"{tol:8.1%}  {sum(1 for o in aa if o.slower_cases):2d}/{len(aa)}     "
            f"{sum(1 for o in aa if o.unstable_cases):2d}/{len(aa)}         "
            f"{sum(o.detected for o in inj):2d}/{len(inj)}            "
            f"{sum(o.named_right for o in inj):2d}/{len(inj)}        {per[len(per) // 2]}"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "steps64",
         float(sys.argv[2]) if len(sys.argv) > 2 else 1.05)
