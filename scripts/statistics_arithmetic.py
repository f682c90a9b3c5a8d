#!/usr/bin/env python
"""The arithmetic of docs/statistics.md: what the verdict rule predicts, from figures.

    python scripts/statistics_arithmetic.py          # < 1 s, no server, no measurement

Every number comes from the plugin's own code (``judging.noise``, ``judging.significance``,
``judging.stats``) applied to the per-level noise the README measured on the 2-core AMD
EPYC box (the figures below, each with where it comes from). These are predictions, not
measurements: ``specperf calibrate`` measures them (docs/statistics.md, "Calibration
plan"). Change a figure here and the tables follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pytest_specperf.judging.noise import PROVISIONAL_PRIOR, LevelPrior
from pytest_specperf.judging.significance import MAX_LOOKS, Family, critical
from pytest_specperf.judging.spending import (
    OBRIEN_FLEMING,
    POCOCK,
    boundary,
    crossing,
    equal_fractions,
    pocock_boundary,
    z_upper,
)
from pytest_specperf.judging.stats import satterthwaite, t_sf

#: z of the 95th percentile: a change caught 19 times in 20 sits this many noises above
#: the band's edge.
Z95 = 1.6449
#: The default suite: 7 specperf tests (perf_tests -m long_context), one case each.
TESTS = 7
#: Gates a case judges by default on the CPU: step, unaccounted, accept length, verify,
#: draft (phases >= 5% of the step), tokens_per_s where a test gates it.
GATES = 5
#: Blocks per run (32 steps, 4 per block).
BLOCKS = 8


@dataclass(frozen=True)
class Levels:
    """One kind of judged form's noise per level (log units)."""

    name: str
    #: paired block noise of one run against one run (w with K = N = 1)
    w1: float
    #: between processes: the truth assumed, and the prior the rule uses
    tau: float
    #: between sittings: the truth assumed (the prior is PROVISIONAL_PRIOR's)
    sitting: float
    prior: LevelPrior
    tolerance: float


# README, "20 repetitions with the shipped defaults" (AMD EPYC, 2026-12-03): a verify
# verdict's within part 0.75-1.02% on the non-bimodal cases (one run against 3 baseline
# runs: w1 about 1.0%); tau_hat verify/rest 0.2-1.2% (5-run baseline, 2026-12-01; 0.8%
# median); the one-sitting baseline's offset up to 1.7% (phases) and 9.5% (step/ref).
# step/ref: within 2.3% (131072 fragmented, the only step row of the table), tau_hat
# 0.7-3.6% (2.5% median).
PHASE = Levels("verify/rest", 0.010, 0.008, 0.011, PROVISIONAL_PRIOR.phase, 0.07)
STEP = Levels("step/ref", 0.023, 0.025, 0.060, PROVISIONAL_PRIOR.step, 0.25)


def noise_stored(lv: Levels, sittings: int, per_sitting: int, now: int) -> tuple[float, float]:
    """(noise, df) of ``now`` processes against a baseline of ``sittings`` x
    ``per_sitting`` runs, the estimates pooled with the prior as ``judging.noise`` does
    (the estimate taken at its expectation, the truth)."""
    k = sittings * per_sitting
    w2 = lv.w1**2 * (1 / now + 1 / k) / 2  # each side's blocks: half of w1^2 per run
    tau_df = sittings * (per_sitting - 1)
    tau2 = (lv.prior.between_df * lv.prior.between**2 + tau_df * lv.tau**2) / (
        lv.prior.between_df + tau_df
    )
    sit_df = sittings - 1
    sit2 = (lv.prior.sitting_df * lv.prior.sitting**2 + sit_df * lv.sitting**2) / (
        lv.prior.sitting_df + sit_df
    )
    parts = [
        (w2, BLOCKS - 1),
        (tau2 * (1 / now + 1 / k), lv.prior.between_df + tau_df),
        (sit2 * (1 + 1 / sittings), lv.prior.sitting_df + sit_df),
    ]
    return math.sqrt(sum(v for v, _ in parts)), satterthwaite(parts)


def noise_ab(lv: Levels, n: int) -> tuple[float, float]:
    """(noise, df) of an A/B run with ``n`` processes a side: the sitting cancels, tau is
    estimated from both sides' processes."""
    w2 = lv.w1**2 / n
    tau_df = 2 * (n - 1)
    tau2 = (lv.prior.between_df * lv.prior.between**2 + tau_df * lv.tau**2) / (
        lv.prior.between_df + tau_df
    )
    parts = [(w2, BLOCKS - 1), (tau2 * 2 / n, lv.prior.between_df + tau_df)]
    return math.sqrt(sum(v for v, _ in parts)), satterthwaite(parts)


def smallest_caught(noise: float, df: float, alpha: float, tolerance: float) -> float:
    """The smallest change caught 19 times in 20: on the log scale the noise is of, the
    band's edge (``ln(1 + tolerance)`` or critical x noise, the larger) plus 1.645 noises,
    as a change."""
    return math.expm1(max(math.log1p(tolerance), critical(alpha, df) * noise) + Z95 * noise)


def boundary_table(share: float) -> None:
    """Each look's nominal level and normal critical value for a gate's ``share`` of its
    case spent over ``MAX_LOOKS`` equal rounds: Pocock's constant boundary (the rule), the
    Pocock-type and O'Brien-Fleming-type spending functions, and Bonferroni's equal split,
    with the t critical value at 12 df."""
    fractions = equal_fractions(MAX_LOOKS)
    rows = {
        "Pocock constant": pocock_boundary(share, MAX_LOOKS),
        "Pocock-type": boundary(share, fractions, POCOCK),
        "O'Brien-Fleming-type": boundary(share, fractions, OBRIEN_FLEMING),
    }
    print(f"\nthe looks' levels for a gate's share {share:.3e} over {MAX_LOOKS} looks "
          "(t = k/4): nominal level (z; t at 12 df)")  # fmt: skip
    for name, b in rows.items():
        cells = [f"{p:.3g} ({z:.2f}; {critical(p, 12):.2f})" for p, z in zip(b.nominal, b.z)]
        print(f"  {name:<21} " + "  ".join(cells) + f"   spent {b.spent[-1]:.3e}")
    p = share / MAX_LOOKS
    print(f"  {'Bonferroni':<21} {p:.3g} ({z_upper(p):.2f}; {critical(p, 12):.2f}) at every look; "
          f"spends {crossing([z_upper(p)] * MAX_LOOKS, fractions):.3e}")  # fmt: skip


def main() -> None:
    family = Family(tests=TESTS, looks=MAX_LOOKS)
    alphas = [replace(family, look=k).gate_alpha(GATES) for k in range(1, MAX_LOOKS + 1)]
    alpha = min(alphas)  # the strictest look (all equal under the rule): bands at every look
    alpha1 = Family(tests=TESTS, looks=1).gate_alpha(GATES)
    print(
        f"gate level: {', '.join(f'{a:.2e}' for a in alphas)} at the extension's looks 1-"
        f"{MAX_LOOKS} (Pocock's constant boundary over {family.case_alpha / GATES:.2e}), "
        f"{alpha1:.2e} without"
    )
    boundary_table(family.case_alpha / GATES)
    print("\nthe old rule: 3 x noise on about 8 df, 21 independent tails per run")
    p = t_sf(3.0, 8)
    print(f"  one tail {p:.4f}; any of 21: {1 - (1 - p) ** 21:.1%}")
    print(
        "the new rule: any false alarm in a run <= 5% for normal statistics (Bonferroni over "
        "tests, Pocock's constant boundary over looks, Holm over gates); approximately for\n"
        "  Student's t on Welch-Satterthwaite df (simulated 2.9-3.3%, 6.8% when the block term "
        "dominates: docs/statistics.md, section 3)"
    )

    print(
        "\nband = exp(t x noise) - 1 (the noise is of a log change): the tightest tolerance a "
        "quiet run leaves decided (a wider band is UNSTABLE);\ncaught: the smallest change "
        "caught 19 times in 20 at that tolerance and at the shipped one (7% phases, 25% step)"
    )
    header = (
        f"{'mode':<29} {'form':<12} {'noise':>6} {'df':>5} {'t':>5} {'band':>7} "
        f"{'caught@band':>11} {'caught@shipped':>14}"
    )
    print(header)
    for lv in (PHASE, STEP):
        for label, (noise, df) in (
            ("stored, 1 sitting x 3", noise_stored(lv, 1, 3, 1)),
            ("stored, 3 sittings x 2", noise_stored(lv, 3, 2, 1)),
            ("stored, 3 sittings x 2, N=2", noise_stored(lv, 3, 2, 2)),
            ("stored, 5 sittings x 2", noise_stored(lv, 5, 2, 1)),
            *((f"A/B, {n} a side", noise_ab(lv, n)) for n in (1, 2, 3, 4, 6)),
        ):
            t = critical(alpha, df)
            band = math.expm1(t * noise)
            print(
                f"{label:<29} {lv.name:<12} {noise:6.2%} {df:5.1f} {t:5.2f} {band:7.2%} "
                f"{math.expm1((t + Z95) * noise):11.1%} "
                f"{smallest_caught(noise, df, alpha, lv.tolerance):14.1%}"
                + ("  (UNSTABLE at shipped)" if band > lv.tolerance else "")
            )

    print("\nKalibera & Jones: repetitions per level that minimise time for a given precision")
    # costs (s): a block of one case (a request of 4 decode steps after its prefill), a
    # server process (start, warm-up, KV fill), a sitting (a suite run of its own)
    c_block, c_process, c_sitting = 2.0, 15.0, 72.0
    sigma_block = 0.02  # a quiet run's blocks scatter about 2% (verdict.SCATTER_FLOOR)
    for lv in (PHASE, STEP):
        blocks = math.sqrt(c_process / c_block * sigma_block**2 / lv.tau**2)
        procs = math.sqrt(c_sitting / c_process * lv.tau**2 / lv.sitting**2)
        print(
            f"  {lv.name}: blocks per process {blocks:.1f} -> {math.ceil(blocks)}, "
            f"processes per sitting {procs:.1f} -> {math.ceil(procs)}"
        )


if __name__ == "__main__":
    main()
