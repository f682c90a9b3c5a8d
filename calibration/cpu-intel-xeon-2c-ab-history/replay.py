"""Replay an A/B calibration's committed reports under two rules for the device prior's
between-process term: worth its pooled 28 degrees of freedom (the rule before the cap), or
capped at what it is worth for one case (1.2 for the phases, 1.6 for the step: the rule
since b87b60c), each at a phase tolerance of 7% and 4% (step 25%).

Each gate's stored change, paired block noise ``within`` (on 8 degrees of freedom: the
suite's 9 blocks) and raw process estimate ``between_hat2`` (the run's own processes and
the history's, on ``(N_A - 1) + (N_B - 1)`` plus ``N_B - 1`` per earlier report) are pooled
with the prior by ``judging.noise.pooled``; Student's t on the Welch-Satterthwaite
degrees of freedom at the gate's stored level; ``judging.verdict.decide``. With the capped
figures it reproduces every stored verdict and calibrate's noise fit.

    python calibration/cpu-intel-xeon-2c-ab-history/replay.py \
        calibration/cpu-intel-xeon-2c-ab-history [FIRST_REP [LAST_REP]]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_specperf.judging.noise import pooled
from pytest_specperf.judging.significance import critical
from pytest_specperf.judging.stats import satterthwaite
from pytest_specperf.judging.verdict import decide

PRIOR = {"verify": 0.003944, "step": 0.007749}
RULES = {
    "pooled 28 df": {"verify": 28.0, "step": 28.0},
    "capped 1.2 / 1.6 df": {"verify": 1.2, "step": 1.6},
}
WITHIN_DF = 8.0


def judge(m: dict[str, Any], prior_df: float, tol: float) -> tuple[str, float, float]:
    """The verdict, noise and degrees of freedom of one stored gate under ``prior_df``."""
    p = PRIOR[m["metric"]]
    reports = (m["history_runs"] - m["now_runs"]) // max(m["now_runs"], 1)
    own = (m["base_runs"] - 1) + (m["now_runs"] - 1) + reports * (m["now_runs"] - 1)
    tau2, tau_df = pooled(m["between_hat2"], own, p, prior_df)
    w2 = m["within"] ** 2
    part = tau2 * (1 / m["now_runs"] + 1 / m["base_runs"])
    noise = math.sqrt(w2 + part)
    df = satterthwaite([(w2, WITHIN_DF), (part, tau_df)])
    z = critical(m["alpha"], df)
    return decide(m["change"], noise, tol, z=z, relative=True).value, noise, df


def gates(path: Path) -> Iterator[dict[str, Any]]:
    for case in json.loads(path.read_text())["cases"]:
        for m in case["metrics"]:
            if m["metric"] in PRIOR and m.get("noise") is not None and m.get("within") is not None:
                yield m


def row(aa: list[Path], inj: list[Path], prior_df: dict[str, float], tol: float) -> str:
    fa = unstable = caught = 0
    z2: dict[str, list[float]] = {"verify": [], "step": []}
    model: dict[str, list[float]] = {"verify": [], "step": []}
    for f in aa:
        verdicts = []
        for m in gates(f):
            v, noise, df = judge(m, prior_df[m["metric"]], tol if m["metric"] == "verify" else 0.25)
            verdicts.append(v)
            z2[m["metric"]].append((math.log1p(m["change"]) / noise) ** 2)
            if df > 2:
                model[m["metric"]].append(df / (df - 2))
        fa += any(v in ("SLOWER", "FASTER") for v in verdicts)
        unstable += "UNSTABLE" in verdicts
    for f in inj:
        caught += any(
            judge(m, prior_df["verify"], tol)[0] == "SLOWER"
            for m in gates(f)
            if m["metric"] == "verify"
        )
    cells = []
    for k in ("verify", "step"):
        rms, mod = math.sqrt(statistics.fmean(z2[k])), math.sqrt(statistics.fmean(model[k]))
        cells.append(f"{rms:.2f} / {mod:.2f} = {rms / mod:.2f}")
    return (
        f"{fa:>3d}/{len(aa):<3d} {unstable:>9d}/{len(aa):<3d} {caught:>7d}/{len(inj):<3d}  "
        + "   ".join(cells)
    )


def main() -> None:
    d = Path(sys.argv[1])
    lo = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    hi = int(sys.argv[3]) if len(sys.argv) > 3 else 99

    def pick(cond: str) -> list[Path]:
        return [f for f in sorted(d.glob(f"rep*-{cond}.json")) if lo <= int(f.name[3:5]) <= hi]

    aa, inj = pick("A_A"), pick("verify_1.05")
    print(f"rounds {lo + 1}-{lo + len(aa)}: {len(aa)} A/A, {len(inj)} verify=1.05")
    print("rule                 tol  A/A fail  A/A UNSTABLE  +5% caught  "
          "RMS z / model = fit: verify/rest   step/ref")  # fmt: skip
    for rule, prior_df in RULES.items():
        for tol in (0.07, 0.04):
            print(f"{rule:20s} {tol:3.0%}  {row(aa, inj, prior_df, tol)}")


if __name__ == "__main__":
    main()
