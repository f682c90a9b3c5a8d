"""What A/B at 64 steps should give on this box, predicted from the committed 32-step A/A
runs alone: each A/B gate's noise as ``judging.noise.Noise.predicted(2)`` models twice the
rounds of blocks measured alongside (the paired block part ``within^2`` halves, its degrees
of freedom go from ``B - 1`` to ``2B - 1``; the process part ``floor^2`` stays on its own,
backed out of the stored Satterthwaite ``df``), its critical value Student's t at its
stored level on the new degrees of freedom, and its A/A change scaled with the noise (the
same z). Then, per phase tolerance (step 25%): the runs that would fail, the runs with an
UNSTABLE case, and verify +``SHIFT`` (the change the verify=1.05 canary moved
``verify/rest`` by on this box) added to each run's verify change as in
``cpu-amd-epyc-2c-ab-steps/shift_power.py``: the runs that would fail naming verify.

The first block of rows is the runs as stored (scale 1): it must give the committed
summary's counts, which checks the reading; the second is the prediction.

    cd calibration/cpu-intel-xeon-2c-ab-thp
    /work/venv/bin/python steps64.py > steps64.txt

Run with the package installed (the rule's own functions are used).
"""

from __future__ import annotations

import glob
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from pytest_specperf.cli.calibrate import at_report_share
from pytest_specperf.judging.calibration import judge_run
from pytest_specperf.judging.significance import critical
from pytest_specperf.judging.verdict import tolerance_for_band
from pytest_specperf.store.report import read_report

HERE = Path(__file__).parent
TOLS = (0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.07)
SHIFT = 0.047  # the verify=1.05 runs' median judged verify change here (summary.txt)
PHASES = ("verify", "draft")


def scaled(m, factor: int):
    """Gate ``m`` as ``factor`` times the blocks would judge it (A/B: measured alongside)."""
    if factor == 1 or not m.ab_sides or m.noise is None or m.within is None:
        return m
    if m.floor is None or m.df is None or m.alpha is None or not m.noise > 0:
        return m
    # 32 steps: 8 blocks a round (server.decoder.BLOCK_STEPS 4); the paired block term's
    # degrees of freedom are one round's, B - 1, however many rounds (Noise.df_at_rounds)
    blocks = 8
    w2, f2 = m.within**2, m.floor**2
    df_w = blocks - 1.0
    rest = m.noise**4 / m.df - w2**2 / df_w  # the level part's share of 1/df
    df_f = f2**2 / rest if rest > 0 and f2 > 0 else math.inf
    w2_new, df_w_new = w2 / factor, blocks * factor - 1.0
    noise = math.sqrt(w2_new + f2)
    terms = w2_new**2 / df_w_new + (f2**2 / df_f if math.isfinite(df_f) else 0.0)
    df = noise**4 / terms if terms > 0 else math.inf
    return replace(m, noise=noise, within=math.sqrt(w2_new), df=df,
                   critical=critical(m.alpha, df),
                   change=math.expm1(math.log1p(m.change) * noise / m.noise))  # fmt: skip


def runs_at(factor: int):
    files = sorted(glob.glob(str(HERE / "rep*-A_A.json")))
    out = []
    for f in files:
        cases = at_report_share(read_report(Path(f)))
        out.append([replace(c, metrics=tuple(scaled(m, factor) for m in c.metrics))
                    for c in cases])  # fmt: skip
    return out


def shifted(cases, shift: float):
    return [
        replace(c, metrics=tuple(
            replace(m, change=(1 + m.change) * (1 + shift) - 1) if m.metric == "verify" else m
            for m in c.metrics))
        for c in cases
    ]  # fmt: skip


def deciding(run) -> float:
    """The run's least phase tolerance that decides every phase gate of every case."""
    return max(
        (tolerance_for_band(m.critical * m.noise, relative=True)
         for c in run for m in c.metrics
         if m.metric in PHASES and m.ab_sides and m.noise is not None and m.critical),
        default=0.0,
    )  # fmt: skip


def main() -> None:
    for factor, label in ((1, "as stored: 32 steps"), (2, "predicted: 64 steps")):
        runs = runs_at(factor)
        need = sorted(deciding(r) for r in runs)
        n = len(runs)
        print(f"== {label}: {n} A/A runs; verify +{SHIFT:.1%} added for the power column")
        print(f"   each run's least deciding phase tolerance: median {statistics.median(need):.1%}"
              f", {math.ceil(0.9 * n)} of {n} runs from {need[math.ceil(0.9 * n) - 1]:.1%}, "
              f"all from {need[-1]:.1%}")  # fmt: skip
        print("   phase tol  A/A fail  A/A UNSTABLE  verify caught")
        for tol in TOLS:
            aa = [judge_run(r, None, tol, 0.25) for r in runs]
            inj = [judge_run(shifted(r, SHIFT), "verify", tol, 0.25) for r in runs]
            print(f"   {tol:8.1%}  {sum(1 for o in aa if o.slower_cases):3d}/{n}   "
                  f"{sum(1 for o in aa if o.unstable_cases):3d}/{n}        "
                  f"{sum(o.detected for o in inj):3d}/{n}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
