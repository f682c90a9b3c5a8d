"""Between-process noise: the random-effects estimate, the prior, rounds, processes,
history; on synthetic data (named, seeded), no timing."""

from __future__ import annotations

import math
import random

import pytest

from pytest_specperf.judging.noise import (
    CURRENT_SITTING,
    LEGACY_SITTING,
    NO_PRIOR,
    PROVISIONAL_PRIOR,
    DevicePrior,
    LevelPrior,
    Noise,
    RunBlocks,
    anova_between,
    exact_sides,
    level_estimate,
    log_rows,
    pooled,
    relative_noise,
    sitting_coefficient,
)
from pytest_specperf.judging.significance import Family, critical
from pytest_specperf.judging.stats import Summary, satterthwaite, stable
from pytest_specperf.judging.verdict import (
    MetricVerdict,
    Runs,
    Tolerances,
    Verdict,
    _to_decide,
    decide,
    judge_metric,
    judge_runs,
    paired_noise,
)
from pytest_specperf.store.baselines import utc_now

#: The provisional prior of the phases' forms: tau0 1.2% (4 df), sitting 1.1% (6 df).
PHASE = PROVISIONAL_PRIOR.phase


def prior(between=0.0, sitting=0.0, df=math.inf):
    """A level prior of known (infinite df) or weak variances, for tests of one level."""
    return LevelPrior(between, df, sitting, df)


def run_of(logs_pct, value_pct=None, sitting=None):
    """A run from its log block centers in percent (ln x * 100): the README's units."""
    blocks = tuple(math.exp(x / 100) for x in logs_pct)
    center = sum(logs_pct) / len(logs_pct) if value_pct is None else value_pct
    return RunBlocks(math.exp(center / 100), blocks, sitting=sitting)


def summary_of(logs_pct, n=16):
    r = run_of(logs_pct)
    return Summary.compact(r.value, r.blocks, n)


# The worked example of docs/statistics.md: block effects BETA, a residual pattern E (rows
# and columns sum to zero), process effects that agree or not, one sitting.
BETA = [0.0, 1.0, -0.6, 0.4]
E = [[0.1, -0.1, 0.0, 0.0], [-0.1, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
NOW = [b + 6.0 + x for b, x in zip(BETA, [0.2, -0.2, 0.1, -0.1])]  # 6.2 6.8 5.5 6.3


def _baseline(process_effects):
    return [[BETA[j] + u + E[i][j] for j in range(4)] for i, u in enumerate(process_effects)]


def test_worked_example_one_sitting_against_the_provisional_prior():
    base = _baseline([-0.3, 0.6, -0.3])
    assert [[round(x, 1) for x in r] for r in base] == [
        [-0.2, 0.6, -0.9, 0.1], [0.5, 1.7, 0.0, 1.0], [-0.3, 0.7, -0.9, 0.1]]  # fmt: skip
    noise = relative_noise([run_of(r) for r in base], [run_of(NOW)], prior=PHASE)
    # MS_runs = 4 * var(-0.1, 0.8, -0.1) = 1.08; MS_blocks = 0.04 / 6; tau_hat^2 = 0.2683
    assert noise.between_hat2 * 1e4 == pytest.approx((1.08 - 0.04 / 6) / 4)
    # tau^2 = (4 * 1.2^2 + 2 * 0.2683) / 6 = 1.0494 on 6 df -> tau = 1.024%
    assert noise.between * 100 == pytest.approx(1.0244, abs=5e-4)
    assert noise.between_df == 6
    # one sitting: sigma_s = the prior's 1.1% on 6 df, c_s = 1 (now) + 1 (baseline) = 2
    assert noise.sittings == 1 and noise.sitting_hat2 is None
    assert noise.sitting * 100 == pytest.approx(1.1) and noise.sitting_coef == 2.0
    # d = 6.2 5.8 6.1 5.9: sd 0.1826, w = 0.0913% on 3 df
    assert noise.within * 100 == pytest.approx(0.0913, abs=5e-5)
    # noise^2 = 0.0083 + 1.0494 * 4/3 + 1.21 * 2 = 3.8275: 1.956%
    assert noise.total * 100 == pytest.approx(1.9564, abs=5e-4)
    # Satterthwaite: 3.8275^2 / (0.0083^2/3 + 1.3992^2/6 + 2.42^2/6) = 11.25
    assert noise.df == pytest.approx(11.25, abs=0.01)
    # the change judged is the mean of d: 6.0 -> +6.18%
    change = math.expm1(noise.log_change)
    assert change == pytest.approx(math.exp(0.06) - 1)
    # alone (5% one-sided): t = 1.792, band 3.51% < 6.18%: SLOWER
    assert critical(0.05, noise.df) == pytest.approx(1.7923, abs=1e-3)
    assert decide(change, noise.total, 0.05, z=critical(0.05, noise.df)) is Verdict.SLOWER
    # in a run of 7 tests, 6 gates, the extension's first of 4 looks: the gate's share
    # 0.05 / 42 over Pocock's constant boundary, 0.3105 of it at every look: alpha 0.000370,
    # t = 4.586, band 8.97% > 5%
    alpha = Family(tests=7, looks=4).gate_alpha(6)
    assert alpha == pytest.approx(0.05 / 42 * 0.3105, rel=2e-4)
    assert alpha == pytest.approx(0.000370, abs=5e-7)
    z = critical(alpha, noise.df)
    assert z == pytest.approx(4.586, abs=2e-3)
    assert z * noise.total == pytest.approx(0.0897, abs=5e-4)
    assert decide(change, noise.total, 0.05, z=z) is Verdict.UNSTABLE


def test_worked_example_three_sittings_one_run_each():
    """The same runs from three sittings: no sitting has two runs, so tau is the prior's;
    the sittings' means (-0.1, 0.8, -0.1) vary less than tau0 alone explains, so the
    sitting estimate is 0 on 2 df, pooled with the prior: (6 * 1.21 + 0) / 8."""
    base = [run_of(r, sitting=s) for r, s in zip(_baseline([-0.3, 0.6, -0.3]), "abc")]
    noise = relative_noise(base, [run_of(NOW)], prior=PHASE)
    assert noise.between_hat2 is None and noise.between * 100 == pytest.approx(1.2)
    assert noise.sittings == 3 and noise.sitting_hat2 == 0.0
    assert noise.sitting**2 * 1e4 == pytest.approx(6 * 1.21 / 8)
    assert noise.sitting_coef == pytest.approx(1 + 1 / 3)
    assert noise.total * 100 == pytest.approx(1.7715, abs=5e-4)


def test_worked_example_runs_that_disagree_need_processes():
    base = _baseline([-1.5, 3.0, -1.5])
    noise = relative_noise([run_of(r) for r in base], [run_of(NOW)], prior=prior(df=0))
    # a prior worth nothing: tau^2 = tau_hat^2 = (4 * 6.75 - 0.0067) / 4 = 6.748
    assert noise.between**2 * 1e4 == pytest.approx(6.748, abs=1e-3)
    change = math.exp(0.06) - 1
    assert decide(change, noise.total, 0.05) is Verdict.UNSTABLE  # 3 x 3.0% > 5%
    assert noise.rounds_to_decide(change, lambda df: 3.0) is None  # more steps cannot
    assert noise.processes_for(change, lambda df: 3.0) == 4  # 3 x noise(4) <= the change


def test_processes_to_decide_take_the_critical_value_at_their_degrees_of_freedom():
    """The same runs judged with Student's t: the process term rests on the baseline's 2
    degrees of freedom, so today's critical value is large; each process beyond the
    baseline's 3 adds one (at least: a baseline re-recorded in P processes has P - 1), and
    the count that decides is the first whose own t x noise comes within the band.
    Today's t (22 on 2 degrees of freedom at 1e-3) would say no number of processes can."""
    base = _baseline([-1.5, 3.0, -1.5])
    noise = relative_noise([run_of(r) for r in base], [run_of(NOW)], prior=prior(df=0))
    alpha, band = 1e-3, 0.06

    def t(df: float) -> float:
        return critical(alpha, df)

    dfs = [noise.df_with_processes(p) for p in range(1, 10)]
    assert dfs[0] == pytest.approx(noise.df) and dfs == sorted(dfs)
    assert dfs[8] == pytest.approx(dfs[2] + 6, abs=0.1)  # 9 processes: 6 beyond the 3
    today = noise.processes_for(band, lambda df: t(noise.df))
    with_df = noise.processes_for(band, t)
    assert today is None and with_df == 9
    assert t(noise.df_with_processes(with_df)) * noise.with_processes(with_df) <= band
    prev = with_df - 1
    assert t(noise.df_with_processes(prev)) * noise.with_processes(prev) > band
    # never a count --specperf-processes refuses: a band that 20 processes would reach
    from pytest_specperf.judging.noise import MAX_PROCESSES

    more = MAX_PROCESSES + 4
    assert noise.processes_for(t(noise.df_with_processes(more)) * noise.with_processes(more),
                               t) is None  # fmt: skip
    # the verdict's advice is this count, at the gate's level
    weak = DevicePrior(prior(df=0), prior(df=0), "test: a prior worth nothing", False)
    v = judge_metric("verify", [summary_of(r) for r in base], [summary_of(NOW)], 0.05,
                     prior=weak, alpha=alpha)  # fmt: skip
    assert v.verdict is Verdict.UNSTABLE and v.steps_to_decide is None
    band_now = max(math.log1p(0.05), abs(math.log1p(v.change)))
    assert v.processes_to_decide is not None
    assert v.processes_to_decide == noise.processes_for(band_now, t)


def _leaning_on_processes(tau: float) -> Noise:
    """A run of 64 blocks (2 rounds) against one baseline run: a wide block term on 63
    degrees of freedom, the process term ``tau`` on 4."""
    now_var, base_var = 4e-4, 1e-5
    return Noise(total=math.sqrt(now_var + base_var + 2 * tau**2),
                 within=math.sqrt(now_var + base_var), between=tau, now_var=now_var,
                 base_var=base_var, blocks=64, rounds=2, base_runs=1, now_runs=1,
                 within_df=63, between_df=4)  # fmt: skip


def test_rounds_to_decide_take_the_critical_value_at_their_degrees_of_freedom():
    """More rounds shrink the block term, so the total leans on the process term and its
    few degrees of freedom: today's t promised 7 rounds that, at their own t, leave the
    case UNSTABLE (a review's example). The count is the first whose own t x noise comes
    within the band, or none, and then processes are the advice."""
    alpha, band = 1e-3, math.log(1.05)

    def t(df: float) -> float:
        return critical(alpha, df)

    def reach(n: Noise, r: int) -> float:
        return t(n.df_at_rounds(r)) * n.predicted(r)

    noise = _leaning_on_processes(0.007)
    assert noise.df_at_rounds(2) == pytest.approx(noise.df)
    today = noise.rounds_to_decide(band, lambda df: t(noise.df))  # today's t throughout
    assert today == 7 and reach(noise, today) > band  # the promise did not decide
    assert noise.df_at_rounds(today) < noise.df / 2
    assert noise.rounds_to_decide(band, t) is None  # no number of rounds would
    steps, procs = _to_decide(noise, math.expm1(band / 2), 0.05, 16, t(noise.df), alpha, False)
    assert steps is None and procs is not None
    assert t(noise.df_with_processes(procs)) * noise.with_processes(procs) <= band
    dip = noise.rounds_to_decide(math.log(1.055), t)  # t x noise falls, then rises again:
    assert reach(noise, math.inf) > math.log(1.055)  # unlimited rounds would not decide,
    assert dip is not None and reach(noise, dip) <= math.log(1.055) < reach(noise, dip - 1)
    assert reach(noise, 10 * dip) > math.log(1.055)  # and too many do not either
    calmer = _leaning_on_processes(0.005)  # here rounds do decide, at their own t
    r = calmer.rounds_to_decide(band, t)
    assert r is not None and reach(calmer, r) <= band < reach(calmer, r - 1)
    assert _to_decide(calmer, 0.0, 0.05, 16, t(calmer.df), alpha, False) == (r * 8, None)


def _ab_gate(alongside: bool) -> Noise:
    """An A/B gate as the Zen 4 box measured one at 32 steps (2026-12-06, 32768
    fragmented, draft/rest): 8 blocks, 2 processes a side, block noise 1.84% (A's part
    1.44%), tau 0.76% on 12 degrees of freedom; ``alongside``: A measured beside B (A/B),
    else as if A were a stored baseline."""
    now_var, base_var, tau = 1.30e-4, 2.08e-4, 0.0076
    return Noise(total=math.sqrt(now_var + base_var + tau**2), within=math.sqrt(now_var + base_var),
                 between=tau, now_var=now_var, base_var=base_var, blocks=8, rounds=1,
                 base_runs=2, now_runs=2, within_df=7, between_df=12,
                 alongside=alongside)  # fmt: skip


def test_an_ab_reference_side_measured_alongside_shrinks_with_the_rounds_too():
    """A/B measures the extension's rounds on both sides (mirrored), each round's blocks
    paired with the other side's of that round: the reference side's blocks are not a
    floor, as a stored baseline's are. The same gate judged as if A were stored finds no
    number of rounds; measured alongside, a few rounds decide it."""
    alpha, band = 4.46e-4, math.log(1.07)

    def t(df: float) -> float:
        return critical(alpha, df)

    stored, ab = _ab_gate(False), _ab_gate(True)
    assert stored.floor == pytest.approx(math.sqrt(2.08e-4 + 0.0076**2))
    assert ab.floor == pytest.approx(0.0076)  # only the process term stays
    assert t(ab.df) * ab.total > band  # UNSTABLE today (the box's 9.0% band)
    assert stored.rounds_to_decide(band, t) is None
    rounds = ab.rounds_to_decide(band, t)
    assert rounds is not None and 2 <= rounds <= 4
    assert t(ab.df_at_rounds(rounds)) * ab.predicted(rounds) <= band
    assert ab.predicted(2) ** 2 == pytest.approx(ab.between**2 + ab.within**2 / 2)
    # each round's blocks pair anew: the block term's degrees of freedom grow with them,
    # as with new blocks; a stored baseline's rounds keep its 7
    halved = [(ab.within**2 / 2, 2 * 8 - 1), (ab.between**2, 12)]  # 16 paired blocks
    assert ab.df_at_rounds(2) == pytest.approx(satterthwaite(halved)) and ab.df_at_rounds(2) > ab.df
    assert stored.df_at_rounds(2) < ab.df_at_rounds(2)
    assert stored.predicted(2) ** 2 == pytest.approx(ab.between**2 + 2.08e-4 + 1.30e-4 / 2)


def test_relative_noise_knows_a_baseline_measured_in_the_same_sitting():
    base = [run_of(r, sitting="night") for r in _baseline([-0.3, 0.6, -0.3])]
    assert relative_noise(base, [run_of(NOW, sitting="night")], prior=PHASE).alongside
    assert not relative_noise(base, [run_of(NOW, sitting="later")], prior=PHASE).alongside
    assert not relative_noise(base, [run_of(NOW)], prior=PHASE).alongside  # unlabelled: now


def test_one_run_against_one_is_the_paired_noise_plus_the_priors():
    base, now = [0.0, 1.2, -0.8, 0.5, 0.1, -0.3], [0.4, 1.3, -0.9, 0.9, 0.2, 0.1]
    noise = relative_noise([run_of(base)], [run_of(now)], prior=prior(0.01, 0.02))
    assert noise.within == pytest.approx(paired_noise(summary_of(base), summary_of(now)))
    assert noise.between == 0.01 and noise.sitting == 0.02  # no evidence: the priors
    assert noise.total**2 == pytest.approx(noise.within**2 + 2 * 0.01**2 + 2 * 0.02**2)
    assert noise.df > 1e6  # known priors dominate: about as sure as the normal
    alone = relative_noise([run_of(base)], [run_of(now)], prior=prior())
    assert alone.df == 5  # the blocks alone: 6 - 1


def test_the_tolerance_does_not_move_the_noise():
    """The issue's complaint: tau0 = tol/6 made a wider tolerance a wider band."""
    b = [summary_of([0.0, 1.0, -0.6, 0.4])]
    n = [summary_of([4.1, 5.0, 3.5, 4.3])]
    assert judge_metric("verify", b, n, 0.03).noise == judge_metric("verify", b, n, 0.15).noise


def _simulate(rng, runs, blocks, tau, sigma, beta_sd=0.05):
    beta = [rng.gauss(0, beta_sd) for _ in range(blocks)]
    return [
        [b + u + rng.gauss(0, sigma) for b in beta]
        for u in (rng.gauss(0, tau) for _ in range(runs))
    ]


@pytest.mark.parametrize(("tau", "sigma"), [(0.03, 0.01), (0.005, 0.02), (0.0, 0.01)])
def test_the_estimate_recovers_the_process_variance(tau, sigma):
    """Over many simulated baselines of 8 runs x 8 blocks, the method-of-moments estimate
    is unbiased (up to the truncation at 0), and large block effects do not leak in."""
    rng = random.Random(14)
    estimates = [anova_between(_simulate(rng, 8, 8, tau, sigma)) for _ in range(400)]
    mean = sum(estimates) / len(estimates)
    assert mean == pytest.approx(tau**2, abs=0.15 * tau**2 + 0.25 * sigma**2 / 8)


def test_block_effects_do_not_count_as_process_noise():
    rows = [[b + u for b in (0.0, 0.3, -0.4, 0.2)] for u in (0.0, 0.0, 0.0)]
    assert anova_between(rows) == 0.0  # huge prompt effects, identical processes
    shifted = [[b + u for b in (0.0, 0.3, -0.4, 0.2)] for u in (-0.01, 0.0, 0.01)]
    assert anova_between(shifted) == pytest.approx(1e-4)


def test_runs_that_agree_narrow_the_band_and_runs_that_disagree_widen_it():
    rng = random.Random(7)
    agree = _simulate(rng, 5, 8, 0.002, 0.01)
    disagree = _simulate(rng, 5, 8, 0.04, 0.01)
    now = [run_of([x * 100 for x in agree[0]])]
    p = PHASE
    narrow = relative_noise([run_of([x * 100 for x in r]) for r in agree], now, prior=p)
    wide = relative_noise([run_of([x * 100 for x in r]) for r in disagree], now, prior=p)
    assert narrow.between < p.between < wide.between
    assert narrow.total < wide.total


def test_the_prior_fades_as_runs_accumulate():
    assert pooled(None, 0, 0.01, 4) == (0.01**2, 4)
    assert pooled(0.0, 2, 0.01, 4) == (pytest.approx(0.01**2 * 4 / 6), 6)
    many, df = pooled(0.02**2, 40, 0.01, 4)
    assert many == pytest.approx((4 * 1e-4 + 40 * 4e-4) / 44) and df == 44
    assert pooled(0.02**2, 40, 0.01, math.inf) == (0.01**2, math.inf)  # a known variance


def test_the_process_term_is_estimated_within_sittings():
    """Two sittings 4% apart, three quiet processes each: the offset is the sittings',
    not the processes' (pooled within sittings tau_hat is about 0), and the sitting
    estimate recovers it (var of the two means 0.0008, less what the runs explain)."""
    rng = random.Random(5)
    beta = [rng.gauss(0, 0.05) for _ in range(8)]
    rows = [[b + off + rng.gauss(0, 0.002) for b in beta] for off in (0, 0, 0, 0.04, 0.04, 0.04)]
    labels = ["mon"] * 3 + ["tue"] * 3
    est = level_estimate(rows, labels)
    assert est is not None and est.between_df == 4 and est.sittings == 2
    assert est.between_hat2 is not None and est.between_hat2 < 1e-5
    assert est.sitting_hat2(0.0) == pytest.approx(0.04**2 / 2, rel=0.05)
    # the same rows as one sitting: the offset would be taken for process noise
    assert anova_between(rows) > 0.04**2 / 4


def test_the_sitting_coefficient_of_a_comparison():
    assert sitting_coefficient([LEGACY_SITTING] * 3, [CURRENT_SITTING]) == 2.0
    assert sitting_coefficient(["a", "b", "c"], [CURRENT_SITTING]) == pytest.approx(4 / 3)
    assert sitting_coefficient(["a", "a", "b", "b"], [CURRENT_SITTING]) == pytest.approx(1.5)
    # A/B in one sitting: the offset cancels
    assert sitting_coefficient(["x", "x"], ["x", "x", "x"]) == 0.0


def test_an_ab_comparison_in_one_sitting_has_no_sitting_term():
    base = [run_of([0.0, 1.0, -0.6, 0.4], sitting="s1")]
    now = [run_of([0.2, 1.1, -0.5, 0.5], sitting="s1")]
    noise = relative_noise(base, now, prior=prior(0.01, 0.05))
    assert noise.sitting_coef == 0.0
    assert noise.total**2 == pytest.approx(noise.within**2 + 2 * 0.01**2)


def test_rounds_fold_onto_the_baseline_blocks():
    assert log_rows([1.0, math.e, 1.0, math.e**3], 2) == pytest.approx([0.0, 2.0])
    assert log_rows([1.0, 2.0, 3.0], 2) is None  # not whole rounds
    assert log_rows([1.0, -2.0], 2) is None


def test_more_rounds_lower_only_the_current_runs_part():
    """A quiet baseline, a current run whose blocks scatter: more rounds help, down to the
    floor the baseline's blocks and the process noise leave."""
    rng = random.Random(3)
    beta = [rng.gauss(0, 0.05) for _ in range(8)]
    base = [run_of([(b + rng.gauss(0, 0.002)) * 100 for b in beta])]
    one = [run_of([(b + rng.gauss(0, 0.03)) * 100 for b in beta])]
    three = [run_of([(b + rng.gauss(0, 0.03)) * 100 for _ in range(3) for b in beta])]
    n1 = relative_noise(base, one, prior=prior(0.001))
    n3 = relative_noise(base, three, prior=prior(0.001))
    assert n1.rounds == 1 and n3.rounds == 3
    assert n3.total < n1.total
    assert n1.predicted(1) == pytest.approx(n1.total)
    assert n1.floor < n1.predicted(3) < n1.total
    for target in ((n1.floor + n1.total) / 2, n1.floor * 1.0001):  # a few rounds; thousands
        rounds = n1.rounds_to_decide(target, lambda df: 1.0)
        assert rounds is not None and n1.predicted(rounds) <= target < n1.predicted(rounds - 1)
    assert n1.rounds_to_decide(n1.floor * 0.99, lambda df: 1.0) is None


def test_blocks_that_do_not_pair_fall_back_to_unpaired_errors():
    a, b = summary_of([0.0, 1.0, -1.0, 0.5]), summary_of([0.0, 1.0, -1.0])
    noise = relative_noise(
        [RunBlocks(a.value, a.blocks, a.rel_se())], [RunBlocks(b.value, b.blocks, b.rel_se())],
        prior=NO_PRIOR.phase,
    )  # fmt: skip
    assert not noise.paired
    assert noise.within == pytest.approx(math.hypot(a.rel_se(), b.rel_se()))
    assert noise.floor == noise.total
    assert noise.rounds_to_decide(noise.total / 2, lambda df: 1.0) is None


def test_history_runs_inform_the_process_noise_only():
    base = [summary_of([0.0, 1.0, -0.6, 0.4])]
    now = [summary_of([6.0, 7.0, 5.4, 6.4])]
    calm = [summary_of([u, 1.0 + u, -0.6 + u, 0.4 + u]) for u in (0.1, -0.1, 0.0, 0.05)]
    wild = [summary_of([u, 1.0 + u, -0.6 + u, 0.4 + u]) for u in (3.0, -3.0, 2.0, -2.5)]
    alone = judge_metric("verify", base, now, 0.05)
    with_calm = judge_metric("verify", base, now, 0.05, history=calm)
    with_wild = judge_metric("verify", base, now, 0.05, history=wild)
    # history reports are sittings of their own: one run each says nothing of tau
    # within a sitting; labelled as one nightly sitting they do
    same = ("nightly",) * 4
    with_calm = judge_metric("verify", base, now, 0.05, history=calm,
                             sittings=((), (), same))  # fmt: skip
    with_wild = judge_metric("verify", base, now, 0.05, history=wild,
                             sittings=((), (), same))  # fmt: skip
    assert alone.change == with_calm.change == with_wild.change  # against the baseline
    assert with_calm.history_runs == 4 and with_calm.between_runs == 5
    assert with_calm.sittings == 2  # the baseline's and the nightly one
    assert with_calm.between < alone.between < with_wild.between
    assert with_calm.verdict is Verdict.SLOWER and with_wild.verdict is Verdict.UNSTABLE
    assert with_wild.processes_to_decide is not None and with_wild.steps_to_decide is None


def test_several_processes_now_are_judged_together():
    """Three current runs: their geometric mean is judged, the process part shrinks."""
    rows = [[0.0, 1.0, -0.6, 0.4], [0.8, 1.8, 0.2, 1.2], [-0.8, 0.2, -1.4, -0.4]]
    base = [{"verify": summary_of(r), "step": summary_of(r)} for r in rows]
    now = [{"verify": summary_of([x + 5.0 for x in r])} for r in rows]
    one = judge_runs("verify", Runs(tuple(base), (now[0],)), Tolerances(0.04, 0.2))
    three = judge_runs("verify", Runs(tuple(base), tuple(now)), Tolerances(0.04, 0.2))
    assert one is not None and three is not None
    assert three.now_runs == 3 and three.base_runs == 3
    assert three.change == pytest.approx(math.exp(0.05) - 1)
    assert three.noise < one.noise
    assert "over 3 baseline runs, 3 processes" in three.describe()


def test_a_stored_verdict_is_rejudged_at_another_tolerance_with_its_own_noise():
    base = [summary_of([0.0, 1.0, -0.6, 0.4, 0.2, -0.1])]
    now = [summary_of([9.1, 10.0, 8.5, 9.3, 9.2, 8.9])]
    live = judge_metric("verify", base, now, 0.07)
    stored = MetricVerdict.from_json(live.to_json())
    assert stored.noise == pytest.approx(live.noise)
    assert stored.critical == pytest.approx(live.critical) and stored.df == pytest.approx(live.df)
    assert stored.rejudged(0.07) is live.verdict
    for tol in (0.03, 0.12):  # the same rule at another tolerance, recomputed
        again = judge_metric("verify", base, now, tol)
        assert again.noise == pytest.approx(live.noise)
        assert stored.rejudged(tol) is again.verdict
    # an older report without the critical value keeps the rule it was judged by (3x)
    old = MetricVerdict.from_json({"metric": "verify", "change": 0.05, "noise": 0.01})
    assert old.critical == 3.0 and old.base_runs == 1 and old.rounds == 1
    assert old.rejudged(0.03) is Verdict.SLOWER


def test_a_measurement_in_several_processes_is_recorded_as_several_runs(
    tmp_path, make_run, reference_fp
):
    """as_baseline stores one run per process (with its pid); the store keeps the last K."""
    import dataclasses

    from pytest_specperf.judging.judge import Case, as_baseline, judge_case
    from pytest_specperf.store.baselines import load_baselines, write_baselines

    def measured(seeds, pid0):
        runs = [dataclasses.replace(make_run(seed=s), server_pid=pid0 + i)
                for i, s in enumerate(seeds)]  # fmt: skip
        run = dataclasses.replace(runs[0], siblings=tuple(runs[1:]))
        return Case(nodeid="t", test="perf_tests/t.py::test_d", key="ctx=8192 kv=contiguous bs=1",
                    run=run, fingerprint=reference_fp, tolerances=Tolerances(0.07, 0.25))  # fmt: skip

    first = measured([1, 2, 3], 100)
    recorded = as_baseline(first, at=utc_now())
    assert [r.pid for r in recorded.runs] == [100, 101, 102]
    path = tmp_path / "box.yaml"
    write_baselines(path, {"name": "box"}, [recorded], keep_runs=4)
    write_baselines(
        path, {"name": "box"}, [as_baseline(measured([4, 5], 200), at=utc_now())], keep_runs=4
    )
    bf = load_baselines(path)
    assert bf is not None
    [case] = list(bf.all_cases())
    assert [r.pid for r in case.runs] == [101, 102, 200, 201]  # the last 4, newest last
    # judged against all 4 runs, with the 2 processes of this measurement
    outcome = judge_case(measured([6, 7], 300), case, path)
    verify = next(m for m in outcome.verdict.metrics if m.metric == "verify")
    assert (verify.base_runs, verify.now_runs, verify.between_runs) == (4, 2, 4)
    assert verify.verdict is Verdict.SAME


def test_a_baseline_run_of_other_blocks_is_left_out():
    """An older run that measured 5 blocks, not the latest's 4: neither paired nor pooled."""
    odd = summary_of([9.0, 9.0, 9.0, 9.0, 9.0])
    rows = [[0.0, 1.0, -0.6, 0.4], [0.2, 1.2, -0.4, 0.6]]
    base = [odd, *(summary_of(r) for r in rows)]
    now = [summary_of([x + 5.0 for x in rows[0]])]
    v = judge_metric("verify", base, now, 0.04)
    assert v.base_runs == 2 and v.within is not None
    assert v.change == pytest.approx(math.exp(0.05 - 0.001) - 1)


# -- when the prior is not applied: a deterministic metric (docs/statistics.md) -------------

#: Accept length per block of a greedy, seeded engine (the reference engine's case ctx=32768
#: contiguous of the 2026-12-03 calibration): the same in every run of every process. 8/3
#: is stored as 2.66667 (6 significant digits) and held in full by the current run.
ACCEPT = (3.0, 1.5, 3.0, 1.25, 2.0, 8 / 3, 1.5, 1.75, 5.0)
#: That calibration's gate level: 5% per run over 4 tests x 5 gates.
GATE_ALPHA = 0.05 / (4 * 5)


def accept_of(blocks, *, stored=False):
    """An accept_len summary of ``blocks``, as a stored baseline run (rounded) or as this
    run's (full precision)."""
    bl = [stable(b) for b in blocks] if stored else list(blocks)
    return Summary.compact(sum(bl) / len(bl), bl, 32, "mean")


def test_identical_blocks_in_every_run_are_exact_same_with_no_noise():
    """Before the rule: change -1.4e-7 (rounding), noise 2.0% from the prior alone, UNSTABLE."""
    base = [accept_of(ACCEPT, stored=True)] * 2
    v = judge_metric("accept_len", base, [accept_of(ACCEPT)], 0.07, prior=PROVISIONAL_PRIOR,
                     alpha=GATE_ALPHA)  # fmt: skip
    assert v.verdict is Verdict.SAME
    assert (v.change, v.noise, v.between, v.sitting, v.exact_runs) == (0.0, 0.0, 0.0, 0.0, 3)
    assert "exact: every block identical in 3 runs" in v.describe()
    assert "noise" not in v.describe()
    stored = MetricVerdict.from_json(v.to_json())
    assert stored.exact_runs == 3 and stored.rejudged(0.01) is Verdict.SAME


def test_a_deterministic_change_is_judged_against_the_tolerance_alone():
    """Two processes a side, each side identical within itself: the change is exact."""
    base = [accept_of(ACCEPT, stored=True)] * 2
    worse = [accept_of([a * 0.9 for a in ACCEPT])] * 2  # 10% fewer tokens per step
    v = judge_metric("accept_len", base, worse, 0.07, prior=PROVISIONAL_PRIOR)
    assert v.verdict is Verdict.SLOWER and v.noise == 0.0 and v.exact_runs == 4
    assert v.change == pytest.approx(-0.1, abs=1e-5)
    small = [accept_of([a * 0.95 for a in ACCEPT])] * 2
    w = judge_metric("accept_len", base, small, 0.07, prior=PROVISIONAL_PRIOR)
    assert w.verdict is Verdict.SAME and w.exact_runs == 4  # within the tolerance: SAME
    assert MetricVerdict.from_json(w.to_json()).rejudged(0.04) is Verdict.SLOWER
    better = [accept_of([a * 1.1 for a in ACCEPT])] * 2
    assert judge_metric("accept_len", base, better, 0.07).verdict is Verdict.FASTER


def test_a_change_seen_in_one_process_is_not_shown_deterministic():
    """One current run that differs from the baseline: nothing shows this side repeats, so
    the levels and the prior apply as before."""
    base = [accept_of(ACCEPT, stored=True)] * 2
    v = judge_metric("accept_len", base, [accept_of([a * 0.9 for a in ACCEPT])], 0.07)
    assert (
        v.exact_runs is None
        and v.noise > 0
        and v.between == pytest.approx(math.sqrt(4 / 5) * PHASE.between)
    )


def test_a_tiny_spread_between_processes_keeps_the_prior():
    """GPU kernels that are not deterministic: one block of one process accepts one token
    more in 32 steps. That is a spread, so the prior stays and the old rule decides."""
    other = list(ACCEPT)
    other[4] += 1 / 32
    base = [accept_of(ACCEPT, stored=True), accept_of(other, stored=True)]
    v = judge_metric("accept_len", base, [accept_of(ACCEPT)], 0.06, prior=PROVISIONAL_PRIOR,
                     alpha=GATE_ALPHA)  # fmt: skip
    assert v.exact_runs is None and v.between is not None and v.between > 0
    # t 3.5 x 2.0% = 7.1% > 6.2%, a 6% drop on the log scale (-log(0.94))
    assert v.noise > 0.02 and v.verdict is Verdict.UNSTABLE
    # at 7% the band fits: a 7% drop of a higher-is-better quantity is -ln(0.93) = 7.26% on
    # the log scale (ln(1.07) = 6.77%, the slower direction's, would leave it UNSTABLE)
    seven = judge_metric("accept_len", base, [accept_of(ACCEPT)], 0.07, prior=PROVISIONAL_PRIOR,
                         alpha=GATE_ALPHA)  # fmt: skip
    assert 0.0677 < seven.critical * seven.noise < 0.0726 and seven.verdict is Verdict.SAME
    # a difference in the 6th significant digit between processes is a spread too
    nudged = [ACCEPT[0] * (1 + 2e-5), *ACCEPT[1:]]
    base = [accept_of(ACCEPT, stored=True), accept_of(nudged, stored=True)]
    n = judge_metric("accept_len", base, [accept_of(ACCEPT)], 0.07)
    assert n.exact_runs is None and n.noise > 0


def test_what_an_exact_comparison_needs():
    a, b = RunBlocks(1.0, ACCEPT), RunBlocks(1.0, tuple(x * 0.9 for x in ACCEPT))
    assert exact_sides([a], [a]) == (tuple(map(stable, ACCEPT)),) * 2 + (2,)
    assert exact_sides([a, a], [b, b]) is not None
    assert exact_sides([a], [b, b]) is None  # a change needs two processes a side
    assert exact_sides([RunBlocks(1.0, ACCEPT[:2])] * 2, [RunBlocks(1.0, ACCEPT[:2])]) is None
    two_rounds = RunBlocks(1.0, ACCEPT + ACCEPT)
    assert exact_sides([a, a], [two_rounds]) is not None
    drift = RunBlocks(1.0, (*ACCEPT, ACCEPT[0] + 0.25, *ACCEPT[1:]))
    assert exact_sides([a, a], [drift]) is None  # its rounds differ
    # history runs must repeat one side: a third pattern is a spread between sittings
    assert exact_sides([a, a], [a], history=[a]) is not None
    assert exact_sides([a, a], [b, b], history=[b, b]) is not None
    assert exact_sides([a, a], [a], history=[b]) is None
    other_blocks = RunBlocks(1.0, ACCEPT[:5])  # another step count: says nothing of these
    assert exact_sides([a, a], [a], history=[other_blocks]) == exact_sides([a, a], [a])
    assert relative_noise([a, a], [a], prior=PHASE, history=[b]).total > 0


def test_an_exact_gate_is_noted(make_run):
    """The reference engine's synthetic run against itself: accept length exact, and the
    judge's note says so (a note: it explains no undecided verdict, so strict mode's and
    INVALID's reasons do not carry it)."""
    from pytest_specperf.judging.judge import compare, exact_notes

    run = make_run(seed=1)
    verdict = compare(run.summaries, run, ["accept_len", "step"], Tolerances(0.07, 0.25))
    accept = next(m for m in verdict.metrics if m.metric == "accept_len")
    assert accept.verdict is Verdict.SAME and accept.exact_runs == 2
    assert not any("exact" in r for r in verdict.reasons)
    [note] = [n for n in exact_notes(verdict.metrics) if n.startswith("accept_len")]
    assert note.startswith("accept_len exact: every block identical in 2 runs")
