#!/usr/bin/env python
"""False alarms over the automatic extension's looks, simulated (docs/statistics.md, 3).

    python scripts/look_false_alarms.py [runs]    # about 6 minutes with 3000 runs

Quiet runs (no real change) of the default suite's shape, 7 cases x 6 gates, each case
judged at every one of 4 looks (the extension's worst case: it always goes on), each look
at the first Holm step of its level. A gate follows ``judging.noise``'s model: its change
is the mean over ``B`` blocks of the paired differences
``d[b] = u + mean over rounds of e[r][b] - base[b]``, with ``u`` the process and sitting
offset (variance 1, its estimate shared by all looks: it comes from the baseline and the
prior, on ``FLOOR_DF`` df), and the block noise re-estimated at every look from the same
blocks (``stdev(d) / sqrt(B)`` on ``B - 1`` df); the df are Welch-Satterthwaite's. The
rows vary the block noise's share of the first look's variance: the docs' modes give
17-35%; a case the extension would help most has more.

Prints, per share, the rate of runs with any false alarm under the Pocock-type boundary
(the rule), Bonferroni's equal split, and no correction over the looks; then how often a
single look of one gate crosses a level of its size (the t on Welch-Satterthwaite df
against its nominal tail).
``tests/test_significance.py`` runs the 50% row (1500 runs, seed 28).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import sys
from collections.abc import Sequence

from pytest_specperf.judging.significance import MAX_LOOKS, Family
from pytest_specperf.judging.stats import satterthwaite, t_quantile

#: blocks, baseline runs, degrees of freedom of the noise's floor (process and sitting)
BLOCKS, BASE_RUNS, FLOOR_DF = 8, 3, 12
#: the default suite's shape: tests (one case each) and gates a case
CASES, GATES = 7, 6


@functools.lru_cache(maxsize=8192)
def _crit(level: float, df_halves: int) -> float:
    return t_quantile(1 - level, df_halves / 2)


def gate_alarms(rng: random.Random, first_steps: Sequence[float], block_share: float) -> bool:
    """One quiet gate judged at each of 4 looks (rounds): does some look's t cross the
    look's first Holm step (df rounded down to a half: a little conservative)?"""
    b = BLOCKS
    block_var = block_share / (1 - block_share) * b / (1 + 1 / BASE_RUNS)
    sd_now, sd_base = math.sqrt(block_var), math.sqrt(block_var / BASE_RUNS)
    u = rng.gauss(0.0, 1.0)
    floor = rng.gammavariate(FLOOR_DF / 2, 2 / FLOOR_DF)
    base = [rng.gauss(0.0, sd_base) for _ in range(b)]
    sums = [0.0] * b
    for k in range(1, len(first_steps) + 1):
        sums = [x + rng.gauss(0.0, sd_now) for x in sums]
        d = [u + x / k - y for x, y in zip(sums, base, strict=True)]
        mean = sum(d) / b
        w2 = sum((x - mean) ** 2 for x in d) / (b - 1) / b
        df = satterthwaite([(w2, b - 1), (floor, FLOOR_DF)])
        if mean / math.sqrt(w2 + floor) > _crit(first_steps[k - 1], int(df * 2)):
            return True
    return False


def quiet_runs_over_looks(
    first_steps: Sequence[float], n: int, seed: int, block_share: float = 0.5
) -> float:
    """The share of ``n`` simulated quiet runs with any false alarm: Holm at a look
    rejects something exactly when some gate's p-value clears its first step,
    ``first_steps[k]`` at look ``k + 1``."""
    rng = random.Random(seed)
    alarms = 0
    for _ in range(n):
        alarms += any(gate_alarms(rng, first_steps, block_share) for _ in range(CASES * GATES))
    return alarms / n


def one_look_rate(level: float, n: int, seed: int, block_share: float) -> float:
    """The share of ``n`` simulated quiet gates whose single look crosses ``level``: how
    far the t on Welch-Satterthwaite df is from its nominal tail at such a level."""
    rng = random.Random(seed)
    return sum(gate_alarms(rng, [level], block_share) for _ in range(n)) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    family = Family(tests=CASES, looks=MAX_LOOKS)
    rules = {
        "Pocock-type": [
            dataclasses.replace(family, look=k).gate_alpha(GATES) for k in range(1, MAX_LOOKS + 1)
        ],
        "Bonferroni": [family.case_alpha / GATES / MAX_LOOKS] * MAX_LOOKS,
        "uncorrected": [family.case_alpha / GATES] * MAX_LOOKS,
    }
    se = math.sqrt(0.05 * 0.95 / n)
    print(f"{n} quiet runs of {CASES} cases x {GATES} gates x {MAX_LOOKS} looks, seed 28 "
          f"(1 sd of chance at 5%: {se:.1%})")  # fmt: skip
    print(f"{'block share':>11} " + " ".join(f"{r:>12}" for r in rules))
    for share in (0.2, 0.5, 0.9):
        rates = [quiet_runs_over_looks(levels, n, 28, share) for levels in rules.values()]
        print(f"{share:>11.0%} " + " ".join(f"{r:>12.1%}" for r in rates), flush=True)
    level = family.case_alpha / 5 / MAX_LOOKS  # a look's Bonferroni level, 5 gates
    gates = 200_000
    print(f"\none look at {level:.3g}, {gates} quiet gates, seed 5: the share that crosses")
    for share in (0.2, 0.5, 0.9):
        rate = one_look_rate(level, gates, 5, share)
        print(f"{share:>11.0%} {rate:.3g} ({rate / level:.2f} x the level)", flush=True)


if __name__ == "__main__":
    main()
