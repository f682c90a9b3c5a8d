#!/usr/bin/env python
"""False alarms and power of the change-point search (``reporting.changepoints``).

    python scripts/changepoint_rates.py [--trials 300] [--noise 0.015]

Simulated nightly series (log-normal noise of --noise per run) of 30, 100 and 365 runs:
the share of flat series in which a change point is reported (false alarm), and the
share of series with a 5%, 7% or 10% shift at the middle in which it is found within 2
runs (5% is the smallest change reported: a shift of that size is measured above or
below it about equally often).
"""

from __future__ import annotations

import argparse
import random

from pytest_specperf.reporting.changepoints import Detection, series_change_points
from pytest_specperf.reporting.history import Point, Series

#: Shifts whose detection is counted: at, above and well above the smallest reported one.
SHIFTS = (0.05, 0.07, 0.10)


def _series(values: list[float]) -> Series:
    pts = tuple(Point(i, v, {}, None, "SAME", False, None) for i, v in enumerate(values))
    return Series("t", "k", "e", pts)


def _found(rng: random.Random, n: int, shift: float, noise: float, d: Detection) -> list[int]:
    xs = [40 * rng.lognormvariate(0, noise) for _ in range(n)]
    xs = xs[: n // 2] + [x * (1 + shift) for x in xs[n // 2 :]]
    return [cp.index for cp in series_change_points(_series(xs), "step", d)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--noise", type=float, default=0.015)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng, d = random.Random(args.seed), Detection()
    for n in (30, 100, 365):
        false = sum(bool(_found(rng, n, 0.0, args.noise, d)) for _ in range(args.trials))
        power = {}
        for shift in SHIFTS:
            hits = sum(any(abs(i - n // 2) <= 2 for i in _found(rng, n, shift, args.noise, d))
                       for _ in range(args.trials))  # fmt: skip
            power[shift] = hits / args.trials
        found = ", ".join(f"{s:.0%} {p:.2f}" for s, p in power.items())
        print(f"{n:4d} runs: false alarm {false / args.trials:.3f}; shift found: {found} "
              f"({args.trials} series each, noise {args.noise:.1%})")


if __name__ == "__main__":
    main()
