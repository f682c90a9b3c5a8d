"""Between-process noise: the random-effects estimate, the prior, rounds, processes,
history; on synthetic data (named, seeded), no timing."""

from __future__ import annotations

import math
import random

import pytest

from pytest_specperf.judging.noise import (
    PRIOR_RUNS,
    RunBlocks,
    anova_between,
    log_rows,
    relative_noise,
    shrunk_between,
)
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import (
    MetricVerdict,
    Runs,
    Tolerances,
    Verdict,
    between_prior,
    decide,
    judge_metric,
    judge_runs,
    paired_noise,
)
from pytest_specperf.store.baselines import utc_now


def run_of(logs_pct, value_pct=None):
    """A run from its log block centers in percent (ln x * 100): the README's units."""
    blocks = tuple(math.exp(x / 100) for x in logs_pct)
    center = sum(logs_pct) / len(logs_pct) if value_pct is None else value_pct
    return RunBlocks(math.exp(center / 100), blocks)


def summary_of(logs_pct, n=16):
    r = run_of(logs_pct)
    return Summary.compact(r.value, r.blocks, n)


# The README's worked example ("Noise between server processes"): block effects BETA, a
# residual pattern E (rows and columns sum to zero), process effects that agree or not.
BETA = [0.0, 1.0, -0.6, 0.4]
E = [[0.1, -0.1, 0.0, 0.0], [-0.1, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
NOW = [b + 6.0 + x for b, x in zip(BETA, [0.2, -0.2, 0.1, -0.1])]  # 6.2 6.8 5.5 6.3


def _baseline(process_effects):
    return [[BETA[j] + u + E[i][j] for j in range(4)] for i, u in enumerate(process_effects)]


def test_readme_worked_example_runs_that_agree():
    base = _baseline([-0.3, 0.6, -0.3])
    assert [[round(x, 1) for x in r] for r in base] == [
        [-0.2, 0.6, -0.9, 0.1], [0.5, 1.7, 0.0, 1.0], [-0.3, 0.7, -0.9, 0.1]]  # fmt: skip
    noise = relative_noise([run_of(r) for r in base], [run_of(NOW)], prior=0.05 / 6)
    # MS_runs = 4 * var(-0.1, 0.8, -0.1) = 1.08; MS_blocks = 0.04 / 6; tau_hat^2 = 0.2683
    assert noise.between_hat2 * 1e4 == pytest.approx((1.08 - 0.04 / 6) / 4)
    # tau^2 = (2 * 0.8333^2 + 2 * 0.2683) / 4 = 0.4814 -> tau = 0.694%
    assert noise.between * 100 == pytest.approx(0.694, abs=5e-4)
    # d = 6.2 5.8 6.1 5.9: sd 0.1826, w = 0.0913%; noise^2 = w^2 + tau^2 (1 + 1/3)
    assert noise.within * 100 == pytest.approx(0.0913, abs=5e-5)
    assert noise.total * 100 == pytest.approx(0.806, abs=5e-4)
    change = math.exp((6.2 - 0.2) / 100) - 1  # the centers: 6.2 now, 0.2 the baseline's
    assert decide(change, noise.total, 0.05) is Verdict.SLOWER  # 6.2% > 5% and > 2.42%


def test_readme_worked_example_runs_that_disagree():
    base = _baseline([-1.5, 3.0, -1.5])
    noise = relative_noise([run_of(r) for r in base], [run_of(NOW)], prior=0.05 / 6)
    assert noise.between * 100 == pytest.approx(1.929, abs=5e-4)
    assert noise.total * 100 == pytest.approx(2.229, abs=5e-4)
    change = math.exp(0.06) - 1
    assert decide(change, noise.total, 0.05) is Verdict.UNSTABLE  # band 6.69% > 5%
    assert noise.rounds_for(change / 3) is None  # more steps cannot decide it
    assert noise.processes_for(change / 3) == 2


def test_one_run_against_one_is_the_paired_noise_plus_the_prior():
    base, now = [0.0, 1.2, -0.8, 0.5, 0.1, -0.3], [0.4, 1.3, -0.9, 0.9, 0.2, 0.1]
    noise = relative_noise([run_of(base)], [run_of(now)], prior=0.01)
    assert noise.within == pytest.approx(paired_noise(summary_of(base), summary_of(now)))
    assert noise.between == 0.01  # no evidence: the prior
    assert noise.total**2 == pytest.approx(noise.within**2 + 2 * 0.01**2)


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
    prior = between_prior(0.05)
    narrow = relative_noise([run_of([x * 100 for x in r]) for r in agree], now, prior=prior)
    wide = relative_noise([run_of([x * 100 for x in r]) for r in disagree], now, prior=prior)
    assert narrow.between < prior < wide.between
    assert 3 * narrow.total < 0.05 < 3 * wide.total


def test_the_prior_fades_as_runs_accumulate():
    assert shrunk_between(None, 1, 0.01) == 0.01**2
    assert shrunk_between(0.0, 3, 0.01) == pytest.approx(0.01**2 * PRIOR_RUNS / (PRIOR_RUNS + 2))
    many = shrunk_between(0.02**2, 41, 0.01)
    assert many == pytest.approx((PRIOR_RUNS * 1e-4 + 40 * 4e-4) / (PRIOR_RUNS + 40))


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
    n1 = relative_noise(base, one, prior=0.001)
    n3 = relative_noise(base, three, prior=0.001)
    assert n1.rounds == 1 and n3.rounds == 3
    assert n3.total < n1.total
    assert n1.predicted(1) == pytest.approx(n1.total)
    assert n1.floor < n1.predicted(3) < n1.total
    target = (n1.floor + n1.total) / 2
    rounds = n1.rounds_for(target)
    assert rounds is not None and n1.predicted(rounds) <= target < n1.predicted(rounds - 1)
    assert n1.rounds_for(n1.floor * 0.99) is None


def test_blocks_that_do_not_pair_fall_back_to_unpaired_errors():
    a, b = summary_of([0.0, 1.0, -1.0, 0.5]), summary_of([0.0, 1.0, -1.0])
    noise = relative_noise(
        [RunBlocks(a.value, a.blocks, a.rel_se())], [RunBlocks(b.value, b.blocks, b.rel_se())],
        prior=0.0,
    )  # fmt: skip
    assert not noise.paired
    assert noise.within == pytest.approx(math.hypot(a.rel_se(), b.rel_se()))
    assert noise.floor == noise.total and noise.rounds_for(noise.total / 2) is None


def test_history_runs_inform_the_process_noise_only():
    base = [summary_of([0.0, 1.0, -0.6, 0.4])]
    now = [summary_of([6.0, 7.0, 5.4, 6.4])]
    calm = [summary_of([u, 1.0 + u, -0.6 + u, 0.4 + u]) for u in (0.1, -0.1, 0.0, 0.05)]
    wild = [summary_of([u, 1.0 + u, -0.6 + u, 0.4 + u]) for u in (3.0, -3.0, 2.0, -2.5)]
    alone = judge_metric("verify", base, now, 0.05)
    with_calm = judge_metric("verify", base, now, 0.05, history=calm)
    with_wild = judge_metric("verify", base, now, 0.05, history=wild)
    assert alone.change == with_calm.change == with_wild.change  # against the baseline
    assert with_calm.history_runs == 4 and with_calm.between_runs == 5
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


def test_a_stored_verdict_is_rejudged_with_the_prior_of_the_other_tolerance():
    base = [summary_of([0.0, 1.0, -0.6, 0.4])]
    now = [summary_of([4.1, 5.0, 3.5, 4.3])]
    live = judge_metric("verify", base, now, 0.07)
    stored = MetricVerdict.from_json(live.to_json())
    assert stored.noise_at(0.07) == pytest.approx(live.noise)
    assert stored.rejudged(0.07) is live.verdict
    # at 3% the prior is smaller (0.5% instead of 1.17%): the same rule, recomputed
    again = judge_metric("verify", base, now, 0.03)
    assert stored.noise_at(0.03) == pytest.approx(again.noise)
    assert stored.rejudged(0.03) is again.verdict is Verdict.SLOWER
    # an older report without the parts keeps its stored noise
    old = MetricVerdict.from_json({"metric": "verify", "change": 0.05, "noise": 0.01})
    assert old.noise_at(0.03) == 0.01 and old.base_runs == 1 and old.rounds == 1


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
    write_baselines(path, {"name": "box"}, [as_baseline(measured([4, 5], 200), at=utc_now())], keep_runs=4)
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
