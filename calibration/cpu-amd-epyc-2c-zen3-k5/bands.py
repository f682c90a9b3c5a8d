"""Predicted phase bands for stored mode, K baseline processes, N judged, one look
(docs/calibration.md, "Five baseline processes"), run from the repository root:

    python calibration/cpu-amd-epyc-2c-zen3-k5/bands.py
"""

import math

from pytest_specperf.judging.noise import satterthwaite
from pytest_specperf.judging.significance import critical

ALPHA = 1.43e-3  # a case's first Holm step at one look
PRIOR_TAU, PRIOR_TAU_DF = 0.0057, 1.8  # the Zen 4 A/B prior at 64 steps (prior64/)
PRIOR_S, PRIOR_S_DF = 0.0044, 1.3
BLOCKS = 17  # a 64-step run's blocks
C_S = 2.0  # the judged run's sitting (+1)^2 and the baseline's (-1)^2

cols = ("K", "N", "s", "tau", "w", "tau_p", "noise", "df", "t", "band")
print(" ".join(f"{c:>6}" for c in cols))
for k, n in ((2, 1), (5, 1), (5, 2)):
    for s in (0.0078, 0.0110, 0.0146):  # per-process block noise: w / sqrt(1/N + 1/K)
        for tau in (0.0057, 0.010, 0.016):  # the case's process term, as its baseline shows it
            w = s * math.sqrt(1 / n + 1 / k)
            tau_df = PRIOR_TAU_DF + (k - 1)
            tau2 = (PRIOR_TAU_DF * PRIOR_TAU**2 + (k - 1) * tau**2) / tau_df
            parts = [
                (w**2, BLOCKS - 1),
                (tau2 * (1 / n + 1 / k), tau_df),
                (PRIOR_S**2 * C_S, PRIOR_S_DF),
            ]
            total = math.sqrt(sum(p for p, _ in parts))
            df = satterthwaite(parts)
            t = critical(ALPHA, df)
            band = math.expm1(t * total)
            cells = (k, n, f"{s:.2%}", f"{tau:.2%}", f"{w:.2%}", f"{math.sqrt(tau2):.2%}",
                     f"{total:.2%}", f"{df:.1f}", f"{t:.2f}", f"{band:.2%}")  # fmt: skip
            print(" ".join(f"{c:>6}" for c in cells))
