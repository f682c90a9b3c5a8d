"""Verdict statistics on recorded sample sets (deterministic, no timing)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import pytest

from pytest_specperf.judging.noise import NO_PRIOR
from pytest_specperf.judging.significance import Family
from pytest_specperf.judging.stats import Summary, summarize
from pytest_specperf.judging.verdict import (
    MetricVerdict,
    Verdict,
    combine,
    judge_metric,
    judge_share,
    paired_noise,
)

#: A gate's level in a run of the default suite: 7 tests, 6 gates a case, 4 looks (Pocock's
#: constant boundary: the same level at every look, look 1's as look 4's).
RUN_GATE_ALPHA = Family(tests=7, looks=4).gate_alpha(6)

# Per-step verify times (ms) of 4 blocks x 4 steps, as recorded on the 2-core CPU box.
BASE = [
    20.9,
    21.3,
    21.0,
    21.4,
    20.6,
    20.8,
    21.1,
    20.7,
    21.5,
    21.2,
    21.0,
    21.6,
    20.8,
    20.9,
    21.0,
    21.2,
]
BLOCKS = [i // 2 for i in range(16)]  # 8 blocks of 2 steps


def s(xs, factor=1.0, center="median"):
    return summarize([x * factor for x in xs], BLOCKS, center=center)


def test_same_within_tolerance_and_noise():
    v = judge_metric("verify", s(BASE), s(BASE, 1.02), 0.08)
    assert v.verdict is Verdict.SAME
    assert v.change == pytest.approx(0.02, abs=1e-9)


def test_slower_beyond_tolerance_and_noise():
    v = judge_metric("verify", s(BASE), s(BASE, 1.18), 0.08)
    assert v.verdict is Verdict.SLOWER
    assert v.describe().startswith("verify +18.0% (21.00 -> 24.78 ms, tol 8%, noise +-")


def test_faster():
    assert judge_metric("verify", s(BASE), s(BASE, 0.8), 0.08).verdict is Verdict.FASTER


def test_higher_is_better_metrics_regress_downwards():
    acc = [3.0, 4.0, 2.0, 3.0] * 4
    v = judge_metric("accept_len", s(acc, center="mean"), s(acc, 0.8, center="mean"), 0.08)
    assert v.verdict is Verdict.SLOWER and v.change == pytest.approx(-0.2)


#: Per-block factors of a run whose blocks scatter about 4% (twice a quiet run, not a
#: disturbed one): 8 blocks of 2 steps.
WOBBLE = [1.00, 1.07, 0.94, 1.05, 0.96, 1.06, 0.95, 1.04]


def test_change_beyond_tolerance_but_within_noise_is_unstable():
    noisy = [x * WOBBLE[b] for x, b in zip(BASE, BLOCKS)]
    v = judge_metric("verify", s(BASE), s(noisy), 0.05)
    assert v.verdict is Verdict.UNSTABLE and not v.disturbed
    assert v.steps_to_decide is not None and v.steps_to_decide > 16
    assert v.fixable and v.processes_to_decide is None
    # The current run's blocks scatter, the baseline's do not: more rounds of the current
    # run shrink its part of the noise, down to the floor (baseline blocks, processes).
    assert v.steps_to_decide % 16 == 0  # whole rounds of the run's 16 steps
    rounds = v.steps_to_decide // 16
    part = v.noise**2 - v.floor**2  # the current run's part, at one round
    target = max(0.05, abs(v.change))  # the band must shrink to the tolerance (or change)
    assert v.critical * math.sqrt(v.floor**2 + part / rounds) <= target
    assert v.critical * math.sqrt(v.floor**2 + part / (rounds - 1)) > target


def test_paired_blocks_cancel_block_effects():
    """Blocks differ a lot (different prompts) but identically in both runs: no noise."""
    base = [1.0] * 4 + [2.0] * 4 + [3.0] * 4 + [4.0] * 4
    now = [x * 1.1 for x in base]
    assert paired_noise(s(base), s(now)) == pytest.approx(0.0, abs=1e-12)
    # the block noise alone (no process or sitting prior): the pairing is what is tested
    v = judge_metric("step", s(base), s(now), 0.08, prior=NO_PRIOR)
    assert v.verdict is Verdict.SLOWER


def test_unpaired_blocks_fall_back_to_independent_errors():
    a = summarize(BASE, BLOCKS)
    b = summarize(BASE[:12], BLOCKS[:12])
    assert paired_noise(a, b) == pytest.approx(math.hypot(a.rel_se(), b.rel_se()))


def test_unaccounted_is_judged_as_a_share_of_the_step():
    step = s(BASE)
    un_base = s([0.02] * 16)
    un_now = s([4.2] * 16)
    step_now = s(BASE, 1.2)
    v = judge_share("unaccounted", un_base, un_now, step, step_now, 0.08)
    assert v.verdict is Verdict.SLOWER
    assert v.change == pytest.approx(4.2 / (21.05 * 1.2) - 0.02 / 21.05, rel=0.01)
    assert "pp of step" in v.describe()
    tiny = judge_share("unaccounted", un_base, s([0.05] * 16), step, step, 0.08)
    assert tiny.verdict is Verdict.SAME  # +150% of almost nothing is not a regression


def test_a_share_is_judged_on_every_run_and_its_line_adds_up():
    """Unaccounted is judged in points of the step over every baseline run and every
    process (per block, the mean share over each side's runs; the change the mean of the
    differences), and its line shows the two shares judged, whose difference is the
    change, beside the milliseconds of the phase table: the centers over the baseline's
    runs and the processes (geometric means of their medians)."""
    from pytest_specperf.judging.verdict import Runs, Tolerances, judge_runs

    def run(unacc: float, factor: float = 1.0) -> dict[str, Summary]:
        return {"step": s(BASE, factor), "unaccounted": s([unacc] * 16)}

    runs = Runs((run(0.02), run(0.08)), (run(4.0, 1.2), run(1.0, 1.2)))
    v = judge_runs("unaccounted", runs, Tolerances(0.08, 0.2))
    assert v is not None and v.share_based and v.df == 7  # 8 paired blocks
    assert (v.base_runs, v.now_runs) == (2, 2)  # what the report says it was judged over
    steps = s(BASE).blocks
    base = statistics.fmean(0.05 / b for b in steps)  # the mean of 0.02 and 0.08 a block
    now = statistics.fmean(2.5 / (b * 1.2) for b in steps)  # of 4.0 and 1.0
    assert (v.judged_base, v.judged_now) == (pytest.approx(base), pytest.approx(now))
    assert v.change == pytest.approx(now - base)  # not the two runs' 0.155 of before
    assert (v.base, v.now) == (pytest.approx(0.04), pytest.approx(2.0))  # sqrt(.02 x .08), ...
    line = v.describe()
    assert f"({base * 100:.1f}% -> {now * 100:.1f}% of step; 0.040 -> 2.00 ms" in line
    assert f"{v.change * 100:+.1f} pp" in line
    # one run a side is the paired comparison of the two runs, as before
    one = judge_runs("unaccounted", Runs((run(0.08),), (run(4.0, 1.2),)), Tolerances(0.08, 0.2))
    assert one is not None
    assert one.change == pytest.approx(statistics.fmean(4.0 / (b * 1.2) - 0.08 / b for b in steps))


def test_a_share_over_runs_that_do_not_pair_is_the_mean_of_their_ratios():
    from pytest_specperf.judging.verdict import Runs, Tolerances, judge_runs

    short = [0.5] * 6
    base = {"step": s(BASE), "unaccounted": s([0.2] * 16)}
    now = {"step": summarize(BASE[:6], BLOCKS[:6]), "unaccounted": summarize(short, BLOCKS[:6])}
    v = judge_runs("unaccounted", Runs((base,), (now, now)), Tolerances(0.08, 0.2))
    assert v is not None and v.df == math.inf  # 8 blocks against 3: no pairing
    b = 0.2 / s(BASE).median
    n = 0.5 / summarize(BASE[:6], BLOCKS[:6]).median
    assert (v.judged_base, v.judged_now) == (pytest.approx(b), pytest.approx(n))
    assert v.change == pytest.approx(n - b)
    now_se = summarize(short, BLOCKS[:6]).rel_se() * n
    base_se = s([0.2] * 16).rel_se() * b
    # each run's standard error taken as known: the mean of 2 runs has sqrt(2)/2 of one's
    assert v.noise == pytest.approx(math.hypot(base_se, math.sqrt(2) * now_se / 2))
    # a run with no unaccounted time at all has a share of 0 and no error: no NaN
    none = {"step": summarize(BASE[:6], BLOCKS[:6]), "unaccounted": summarize([0.0] * 6, BLOCKS[:6])}
    z = judge_runs("unaccounted", Runs((base,), (none, now)), Tolerances(0.08, 0.2))
    assert z is not None and math.isfinite(z.noise) and math.isfinite(z.change)


def test_a_share_pairs_the_baseline_runs_a_relative_form_pairs():
    """A baseline run with other blocks than the latest (another --specperf-steps) is left
    out, as judge_metric leaves it out: its blocks are other prompts, not rounds."""
    from pytest_specperf.judging.verdict import Runs, Tolerances, judge_runs

    def run(n: int, unacc: float) -> dict[str, Summary]:
        return {"step": summarize(BASE[:n], BLOCKS[:n]), "unaccounted": summarize([unacc] * n, BLOCKS[:n])}

    v = judge_runs("unaccounted", Runs((run(16, 5.0), run(8, 0.2)), (run(8, 0.3),)),
                   Tolerances(0.08, 0.2))  # fmt: skip
    assert v is not None and v.base_runs == 1 and v.df == 3  # the 4 blocks of the latest
    step = summarize(BASE[:8], BLOCKS[:8]).blocks
    assert v.judged_base == pytest.approx(statistics.fmean(0.2 / x for x in step))


def test_combine_order():
    assert combine([Verdict.SAME, Verdict.UNSTABLE, Verdict.FASTER]) is Verdict.UNSTABLE
    assert combine([Verdict.SAME, Verdict.SLOWER, Verdict.UNSTABLE]) is Verdict.SLOWER
    assert combine([]) is Verdict.SAME


def test_summary_round_trip_and_validation():
    x = s(BASE)
    y = Summary.from_dict(x.to_dict(), "here")
    assert y.median == pytest.approx(x.median) and y.blocks == pytest.approx(x.blocks)
    with pytest.raises(ValueError, match=r"here.median: expected a finite number"):
        Summary.from_dict({**x.to_dict(), "median": "fast"}, "here")
    with pytest.raises(ValueError, match="here: missing n"):
        Summary.from_dict({"median": 1.0}, "here")


def test_no_change_is_same_whatever_the_noise():
    zero = s([0.0] * 16)
    v = judge_metric("verify", zero, zero, 0.05)
    assert v.verdict is Verdict.SAME


def test_unmeasurable_noise_is_unstable_not_silent():
    from pytest_specperf.judging.verdict import decide

    assert decide(0.3, math.inf, 0.05) is Verdict.UNSTABLE
    assert decide(0.0, math.inf, 0.05) is Verdict.SAME
    assert decide(-0.3, 0.01, 0.05, higher_is_better=True) is Verdict.SLOWER


def test_share_uses_paired_block_noise_and_can_be_unstable():
    step = s(BASE)
    base = s([0.5, 0.5, 0.5, 0.5] * 4)
    jumpy = summarize([0.5] * 4 + [12.0] * 4 + [0.5] * 4 + [9.0] * 4, BLOCKS)
    # at a gate's level in a run of the default suite (7 tests, 4 looks, 6 gates)
    v = judge_share("unaccounted", base, jumpy, step, step, 0.05, alpha=RUN_GATE_ALPHA)
    assert v.verdict is Verdict.UNSTABLE and v.steps_to_decide
    steady = judge_share("unaccounted", base, s([5.0] * 16), step, step, 0.05)
    assert steady.verdict is Verdict.SLOWER and steady.noise < 0.01


def test_utilization_drop_in_points():
    from pytest_specperf.judging.verdict import judge_points

    busy = [0.9] * 16
    v = judge_points("device_busy", s(busy), s([0.6] * 16), 0.05, 16)
    assert v.verdict is Verdict.SLOWER and v.change == pytest.approx(-0.30)
    assert v.describe() == "device_busy -30.0 points (90.0% -> 60.0%, tol 5 points)"
    up = judge_points("device_busy", s([0.6] * 16), s(busy), 0.05, 16)
    assert up.verdict is Verdict.FASTER
    assert judge_points("device_busy", s(busy), s([0.88] * 16), 0.05, 16).verdict is Verdict.SAME


def _stored(**d):
    return MetricVerdict.from_json(d)


def _slower(d, tol, **kw):
    return _stored(**d).rejudged(tol, **kw) is Verdict.SLOWER


def test_calibration_rule_is_the_verdict_rule():
    assert _slower({"metric": "verify", "change": 0.09, "noise": 0.01}, 0.05)
    assert not _slower({"metric": "verify", "change": 0.09, "noise": 0.04}, 0.05)
    assert _slower({"metric": "accept_len", "change": -0.2, "noise": 0.0}, 0.05)
    assert not _slower({"metric": "util.sm", "change": 0.2, "noise": 0.0,
                        "points_based": True}, 0.05)
    assert _slower({"metric": "util.sm", "change": -0.2, "noise": 0.0,
                    "points_based": True}, 0.05)
    # the stored verdict of a live judgement, re-decided at its own tolerance, is itself
    live = judge_metric("verify", s(BASE), s(BASE, 1.18), 0.08)
    assert MetricVerdict.from_json(live.to_json()).rejudged(0.08) is live.verdict


def test_a_disturbed_run_is_unstable_not_slower():
    """Some blocks much slower than others (a noisy neighbour): UNSTABLE, not SLOWER."""
    quiet = [x * f for x, f in zip(BASE, [1.0] * 16)]
    shaken = [x * f for x, f in zip(BASE, [1.2] * 4 + [1.9] * 4 + [1.3] * 4 + [2.0] * 4)]
    v = judge_metric("verify", s(quiet), s(shaken), 0.05)
    assert v.disturbed and v.scatter_ratio > 3
    assert v.verdict is Verdict.UNSTABLE
    from pytest_specperf.reporting.terminal import unstable_advice

    assert "scatter" in unstable_advice(v) and "quiet machine" in unstable_advice(v)
    # a regression that moves every block alike is SLOWER
    uniform = judge_metric("verify", s(quiet), s(quiet, 1.3), 0.05)
    assert uniform.verdict is Verdict.SLOWER and not uniform.disturbed


def test_step_of_a_disturbed_case_is_unstable():
    """Phases scattering far more than the baseline's: the step change is not the code's."""
    from pytest_specperf.judging.verdict import case_disturbance, downgrade_disturbed

    step = s(BASE)
    quiet_rest = s([3.0] * 16)
    shaken_rest = summarize([3.0] * 4 + [4.5] * 4 + [3.2] * 4 + [5.0] * 4, BLOCKS)
    base = {"step": step, "verify": s(BASE, 0.8), "verify/rest": quiet_rest}
    now = {"step": s(BASE, 1.3), "verify": s(BASE, 0.8), "verify/rest": shaken_rest}
    ratio = case_disturbance(base, now)
    assert ratio is not None and ratio > 3
    mv = judge_metric("step", step, now["step"], 0.15)
    assert mv.verdict is Verdict.SLOWER
    [mv] = downgrade_disturbed([mv], ratio)
    assert mv.verdict is Verdict.UNSTABLE and mv.disturbed
    calm = judge_metric("step", step, now["step"], 0.15)
    [calm] = downgrade_disturbed(
        [calm], case_disturbance(base, {**now, "verify/rest": quiet_rest})
    )
    assert calm.verdict is Verdict.SLOWER  # a uniform slowdown stays a regression


def test_phases_of_a_disturbed_case_are_unstable_too():
    """verify's blocks scatter (disturbed); draft, judged against a rest made mostly of
    verify, moves by 40% without scattering: neither is the code's doing. unaccounted and
    the accept length keep their verdicts."""
    from pytest_specperf.judging.verdict import downgrade_disturbed

    draft = judge_metric("draft", s(BASE), s(BASE, 1.4), 0.05)
    unacc = MetricVerdict("unaccounted", Verdict.SLOWER, 0.1, 5.0, 0.2, 0.01, 0.05, "ms",
                          share_based=True)
    accept = judge_metric("accept_len", s(BASE), s(BASE, 0.5), 0.05)
    assert draft.verdict is Verdict.SLOWER and accept.verdict is Verdict.SLOWER
    draft, unacc, accept = downgrade_disturbed([draft, unacc, accept], 4.2)
    assert draft.verdict is Verdict.UNSTABLE and draft.scatter_ratio == 4.2
    assert unacc.verdict is Verdict.SLOWER and accept.verdict is Verdict.SLOWER
    # A ratio within [1/3, 3] is a quiet case: nothing changes.
    calm = judge_metric("draft", s(BASE), s(BASE, 1.4), 0.05)
    [calm] = downgrade_disturbed([calm], 2.9)
    assert calm.verdict is Verdict.SLOWER


def test_stored_form_applies_the_case_rule():
    """The calibration re-judges stored reports: a case with any disturbed phase or step
    cannot fail on its phases or step, exactly as downgrade_disturbed decides live."""
    from pytest_specperf.judging.verdict import case_disturbed

    draft = _stored(metric="draft", change=0.47, noise=0.03, scatter_ratio=2.99)
    verify = _stored(metric="verify", change=-0.32, noise=0.04, scatter_ratio=3.66)
    unacc = _stored(metric="unaccounted", change=0.2, noise=0.01, share_based=True)
    assert case_disturbed([draft, verify, unacc])
    assert draft.rejudged(0.05) is Verdict.SLOWER  # alone, its own scatter ratio is under 3
    assert draft.rejudged(0.05, case_disturbed=True) is Verdict.UNSTABLE
    assert unacc.rejudged(0.05, case_disturbed=True) is Verdict.SLOWER
    assert not case_disturbed([draft, unacc])


def _decode_metrics(step_ms, ref_ms, accepted):
    """Per-step summaries of a decode run (8 blocks of 2 steps): the step, its read-time
    form, the accept length and tokens/s, as ``judging.samples`` makes them."""
    from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP, STEP_PER_REF, TOKENS_PER_S

    ref = [ref_ms * (1 + 0.01 * (b % 3)) for b in BLOCKS]  # each block's own KV read
    steps = [step_ms * x / 21.0 * (1 + 0.01 * (b % 3)) for x, b in zip(BASE, BLOCKS)]
    acc = [accepted[b % len(accepted)] for b in BLOCKS]
    return {
        STEP: summarize(steps, BLOCKS),
        STEP_PER_REF: summarize([s_ / r for s_, r in zip(steps, ref)], BLOCKS),
        ACCEPT_LEN: summarize(acc, BLOCKS, center="mean"),
        TOKENS_PER_S: summarize([a / (s_ / 1e3) for a, s_ in zip(acc, steps)], BLOCKS, center="mean"),
    }


def test_tokens_per_s_on_another_machine_is_judged_per_read_time():
    """A machine 2.8x slower (every step and every KV read 2.8x longer, same accept length)
    is no regression: tokens/s is judged per KV read time (``tokens/ref``), the raw drop shown."""
    from pytest_specperf.judging.verdict import Tolerances, judge_gate

    accepted = [3, 4, 2, 3]
    base = _decode_metrics(40.0, 6.9, accepted)
    now = _decode_metrics(40.0 * 2.8, 6.9 * 2.8, accepted)
    mv = judge_gate("tokens_per_s", base, now, Tolerances(0.07, 0.25))
    assert mv is not None and mv.verdict is Verdict.SAME, mv.describe()
    assert mv.basis == "per the request's KV read time"
    assert mv.change == pytest.approx(0.0, abs=1e-9)
    assert mv.raw_change == pytest.approx(1 / 2.8 - 1, rel=1e-6)
    assert mv.describe().startswith("tokens per KV read time 0.5010 -> 0.5010 (")  # blocks' geomean
    assert "; raw tokens_per_s 73.98 -> 26.42 tok/s (-64.3%)" in mv.describe()


def test_tokens_per_s_drop_from_accept_length_still_fails():
    """Fewer accepted tokens per step at the same step time: tokens/ref drops as tokens/s."""
    from pytest_specperf.judging.verdict import Tolerances, judge_gate

    base = _decode_metrics(40.0, 6.9, [3, 4, 2, 3])
    now = _decode_metrics(40.0, 6.9, [2, 3, 1, 2])  # a quarter to a half fewer per step
    mv = judge_gate("tokens_per_s", base, now, Tolerances(0.07, 0.25))
    assert mv is not None and mv.verdict is Verdict.SLOWER, mv.describe()
    # the change judged is the mean paired log difference of the blocks' tokens/ref
    ratios = [2 / 3, 3 / 4, 1 / 2, 2 / 3]
    expected = math.expm1(sum(math.log(r) for r in ratios) / 4)
    assert mv.change == pytest.approx(expected, rel=1e-6)


def test_tokens_per_ref_from_a_stored_run_matches_the_live_arithmetic():
    """A stored (compact) baseline run derives ``tokens/ref`` by the same arithmetic as a
    live run, so a baseline recorded before the form existed is judged on it too."""
    from pytest_specperf.judging.verdict import tokens_per_ref

    live = _decode_metrics(40.0, 6.9, [3, 4, 2, 3])
    stored = {m: Summary.compact(x.value, x.blocks, x.n, x.center) for m, x in live.items()}
    a, b = tokens_per_ref(live), tokens_per_ref(stored)
    assert a is not None and b is not None
    assert a.value == pytest.approx(b.value) and a.blocks == pytest.approx(b.blocks)
    assert tokens_per_ref({k: v for k, v in live.items() if k != "step/ref"}) is None


def test_tokens_per_s_without_a_read_time_is_judged_raw():
    """A backend that reports no KV read time (SGLang): tokens/s as it is."""
    from pytest_specperf.judging.verdict import Tolerances, judge_gate

    base = _decode_metrics(40.0, 6.9, [3, 4, 2, 3])
    now = _decode_metrics(40.0 * 1.5, 6.9 * 1.5, [3, 4, 2, 3])
    for d in (base, now):
        del d["step/ref"]
    mv = judge_gate("tokens_per_s", base, now, Tolerances(0.07, 0.25))
    assert mv is not None and mv.basis is None and mv.verdict is Verdict.SLOWER


def _rec(data: dict) -> object:
    """A test double of a case's record (``CaseRecord``): only the data the note reads."""
    from types import SimpleNamespace

    return SimpleNamespace(data=data)


def test_a_machine_with_slower_kv_reads_is_named_in_the_summary():
    """Steps 2.8x longer with KV reads 2.8x longer: every case SAME, and the summary says
    the raw times come from another machine; at the same read time it says nothing."""
    from types import SimpleNamespace

    from pytest_specperf.judging.verdict import Tolerances, judge_gate
    from pytest_specperf.reporting.terminal import machine_note

    tol = Tolerances(0.07, 0.25)
    base = _decode_metrics(40.0, 6.9, [3, 4, 2, 3])
    slow = judge_gate("step", base, _decode_metrics(112.0, 6.9 * 2.8, [3, 4, 2, 3]), tol)
    same = judge_gate("step", base, _decode_metrics(40.4, 6.9, [3, 4, 2, 3]), tol)
    assert slow is not None and same is not None and slow.verdict is Verdict.SAME
    case = SimpleNamespace(verdict=Verdict.SAME, metrics=(slow,), ab_reference=None, record=_rec({}))
    note = machine_note([case] * 3)  # type: ignore[list-item]
    assert note is not None
    assert note.startswith("machine: KV reads took 2.80x as long as in the baselines (median of 3")
    assert "under its own name (--specperf-device NAME or --specperf-baselines DIR)" in note
    assert machine_note([case], recording=True) is None  # type: ignore[list-item]
    assert machine_note([SimpleNamespace(verdict=Verdict.SAME, metrics=(same,), ab_reference=None, record=_rec({}))]) is None  # type: ignore[list-item]
    # a throttled GPU's INVALID case reads slowly too: not another machine
    invalid = SimpleNamespace(verdict=Verdict.INVALID, metrics=(slow,), ab_reference=None, record=_rec({}))
    assert machine_note([invalid]) is None  # type: ignore[list-item]
    # a verdict read back from JSON without a finite change is left out, not printed as nan
    broken = SimpleNamespace(verdict=Verdict.SAME, metrics=(dataclasses.replace(slow, change=math.nan),), ab_reference=None, record=_rec({}))
    assert machine_note([broken]) is None  # type: ignore[list-item]
    # faster reads: "0.36x as long", never "2.80x less time"
    fast = judge_gate("step", _decode_metrics(112.0, 6.9 * 2.8, [3, 4, 2, 3]), base, tol)
    note = machine_note([SimpleNamespace(verdict=Verdict.SAME, metrics=(fast,), ab_reference=None, record=_rec({}))])  # type: ignore[list-item]
    assert note is not None and note.startswith("machine: KV reads took 0.36x as long as")
    # the server's thread waited for a CPU a fifth of the step: load, not another machine
    busy = {"bottleneck": {"figures": {"runq_share": 0.2}}}
    note = machine_note([SimpleNamespace(verdict=Verdict.SAME, metrics=(slow,), ab_reference=None, record=_rec(busy))])  # type: ignore[list-item]
    assert note is not None and "this machine was loaded (the server's thread waited for a CPU 20%" in note
    assert "another machine, or" not in note
    # A/B: one machine, both sides in this run; the sides read the KV differently
    ab = SimpleNamespace(verdict=Verdict.SAME, metrics=(slow,), ab_reference="args=--x",
                         record=_rec({}))  # fmt: skip
    note = machine_note([ab])  # type: ignore[list-item]
    assert note is not None and note.startswith("A/B: B read the KV in 2.80x the time A took")
    assert "another machine" not in note and "--specperf-device" not in note


def test_the_judged_centers_shown_agree_with_the_change_judged():
    """A run with one slow block: the change judged is the mean paired log difference of
    the blocks, and the judged form's centers shown beside it are the geometric means of
    the same blocks, so that ``now / base`` is the change (a CI run once printed
    ``draft / rest of step 0.3303 -> 0.4080 (+80.0%``: medians beside a mean of logs)."""
    import re

    from pytest_specperf.judging.metrics import STEP
    from pytest_specperf.judging.verdict import Tolerances, judge_gate

    base = _decode_metrics(40.0, 6.9, [3])
    now = _decode_metrics(40.0, 6.9, [3])
    slow = [x * (4.0 if b == 5 else 1.0) for x, b in zip(BASE, BLOCKS)]  # block 5 four times
    ref = [6.9 * (1 + 0.01 * (b % 3)) for b in BLOCKS]
    steps = [40.0 * x / 21.0 * (1 + 0.01 * (b % 3)) for x, b in zip(slow, BLOCKS)]
    from pytest_specperf.judging.metrics import STEP_PER_REF

    now = {**now, STEP: summarize(steps, BLOCKS),
           STEP_PER_REF: summarize([a / r for a, r in zip(steps, ref)], BLOCKS)}  # fmt: skip
    mv = judge_gate("step", base, now, Tolerances(0.07, 0.25))
    assert mv is not None and mv.basis is not None and mv.judged_base and mv.judged_now
    assert mv.judged_now / mv.judged_base == pytest.approx(1 + mv.change, rel=1e-9)
    # the step's median hardly moved (one block of eight): the medians' ratio is not the change
    assert abs(mv.now / mv.base - 1) < 0.05 < mv.change
    shown = re.match(r".* (\S+) -> (\S+) \(([+-][\d.]+)%", mv.describe())
    assert shown is not None, mv.describe()
    b, n, pct = (float(g) for g in shown.groups())
    assert n / b - 1 == pytest.approx(pct / 100, abs=0.002), mv.describe()


def test_a_relative_change_is_significant_on_the_log_scale_of_its_noise():
    """The noise of a relative change is the standard error of its mean log difference, so
    the change is tested as ``log(1 + change)``: +30% against a noise of 9% at t = 3.3 is
    0.262 / 0.09 = 2.9 standard errors (not significant), though 30% > 3.3 x 9% = 29.7%.
    Judged on the ratio, a quiet step gate's false alarms ran several times their level
    whenever the noise band was wider than the tolerance (the review of 2026-12-05)."""
    from pytest_specperf.judging.significance import p_worse
    from pytest_specperf.judging.verdict import band_limit, decide

    assert decide(0.30, 0.09, 0.25, z=3.3) is Verdict.SLOWER  # a share/points change
    assert decide(0.30, 0.09, 0.25, z=3.3, relative=True) is Verdict.UNSTABLE
    assert decide(0.36, 0.09, 0.25, z=3.3, relative=True) is Verdict.SLOWER  # log 0.307
    # the band is compared with the tolerance on the same scale, in the worse direction
    assert band_limit(0.25, relative=True) == pytest.approx(math.log(1.25))
    assert band_limit(0.25, higher_is_better=True, relative=True) == pytest.approx(-math.log(0.75))
    # a band of 3.3 x 7% = 0.231: under 25%, over log(1.25) = 0.223 (a +25% change could
    # not be told from none)
    assert decide(0.01, 0.07, 0.25, z=3.3) is Verdict.SAME
    assert decide(0.01, 0.07, 0.25, z=3.3, relative=True) is Verdict.UNSTABLE
    assert decide(0.01, 0.067, 0.25, z=3.3, relative=True) is Verdict.SAME  # 0.221
    # Holm's p-values are of the same statistic
    p = p_worse(0.30, 0.09, math.inf, relative=True)
    assert p == pytest.approx(0.5 * math.erfc(math.log(1.3) / 0.09 / math.sqrt(2)))
    assert p > p_worse(0.30, 0.09, math.inf)
    # a faster time: -20% is log(0.8) = -0.223
    assert decide(-0.20, 0.06, 0.07, z=3.3, relative=True) is Verdict.FASTER
    assert decide(-0.20, 0.07, 0.07, z=3.3, relative=True) is Verdict.UNSTABLE


def test_a_gate_judged_as_measured_shows_the_blocks_whose_ratio_is_the_change():
    """A step without a KV reference (live SGLang) is judged as measured: one slow block
    moves the mean log difference, not the median. The line shows both, so that the
    numbers beside the change agree with it."""
    import re

    slow = [x * (1.5 if b == 5 else 1.0) for x, b in zip(BASE, BLOCKS)]
    v = judge_metric("step", s(BASE), s(slow), 0.25)
    assert v.basis is None and v.judged_now / v.judged_base == pytest.approx(1 + v.change)
    text = v.describe()
    assert " median; blocks' geometric mean " in text, text
    b, n = (float(x) for x in re.search(r"geometric mean (\S+) -> (\S+),", text).groups())
    assert n / b - 1 == pytest.approx(v.change, abs=0.002), text
    # where the two agree, the line stays as it was
    assert "geometric" not in judge_metric("step", s(BASE), s(BASE, 1.1), 0.25).describe()


def test_a_change_beyond_what_a_disturbance_can_move_stays_slower():
    """A disturbed run's blocks scatter; a disturbance moves their center by at most
    ``DISTURBANCE_REACH`` x that scatter (docs/statistics.md, "Disturbed runs"). A change
    far beyond it (a 3x verify canary beside a side whose blocks scatter) is the code's:
    SLOWER, saying why; the same scatter beside a change within reach stays UNSTABLE."""
    from pytest_specperf.judging.verdict import DISTURBANCE_REACH, largest_scatter

    quiet = s(BASE)
    bumps = [1.0] * 4 + [1.25] * 4 + [1.05] * 4 + [1.3] * 4  # some blocks slowed
    shaken = s([x * f for x, f in zip(BASE, bumps)])
    spread = largest_scatter(quiet, shaken)
    assert spread is not None and 0.06 < spread < 0.2
    tripled = judge_metric("verify", quiet, s([x * f * 3 for x, f in zip(BASE, bumps)]), 0.07)
    assert tripled.disturbed and tripled.verdict is Verdict.SLOWER, tripled.describe()
    assert tripled.block_scatter == pytest.approx(spread)
    assert "a disturbance moves a center at most" in tripled.describe()
    assert f"{DISTURBANCE_REACH:g} x {spread * 100:.1f}%" in tripled.describe()
    # the stored form re-decides the same way (the calibration's tables)
    stored = MetricVerdict.from_json(tripled.to_json())
    assert stored.block_scatter == pytest.approx(spread)
    assert stored.rejudged(0.07) is Verdict.SLOWER
    # within reach: the disturbance alone could have made it
    near = judge_metric("verify", quiet, s([x * f * 1.25 for x, f in zip(BASE, bumps)]), 0.07)
    assert near.disturbed and near.verdict is Verdict.UNSTABLE
    assert MetricVerdict.from_json(near.to_json()).rejudged(0.07) is Verdict.UNSTABLE


def test_a_disturbed_case_keeps_a_step_change_beyond_its_phases_scatter():
    """The case-level rule: the step of a case whose verify blocks scatter (ratio 4.4,
    largest scatter 9%) is UNSTABLE at +30% (log 0.262 - 3 x 0.09 < 0), SLOWER at +155%;
    without the case's scatter (an older caller) nothing is beyond it."""
    from pytest_specperf.judging.verdict import downgrade_disturbed

    small = judge_metric("step", s(BASE), s(BASE, 1.3), 0.15)
    large = judge_metric("step", s(BASE), s(BASE, 2.555), 0.15)
    assert small.verdict is large.verdict is Verdict.SLOWER
    small_d, large_d = downgrade_disturbed([small, large], 1 / 4.4, 0.09)
    assert small_d.verdict is Verdict.UNSTABLE and small_d.disturbed
    assert large_d.verdict is Verdict.SLOWER and large_d.block_scatter == 0.09
    assert "one side's blocks scatter 4.4x the other's" in large_d.describe()
    [unknown] = downgrade_disturbed([large], 1 / 4.4)
    assert unknown.verdict is Verdict.UNSTABLE


def test_an_ab_case_names_the_side_whose_blocks_scattered():
    """A/B records nothing: a scattered reference side is side A, not "the baseline"."""
    from pytest_specperf.judging.verdict import downgrade_disturbed
    from pytest_specperf.reporting.terminal import unstable_advice

    [m] = downgrade_disturbed([judge_metric("step", s(BASE), s(BASE, 1.3), 0.15)], 1 / 4.4, 0.09)
    text = unstable_advice(m, ab=True)
    assert "side A's blocks scatter 4.4x more than the other's" in text, text
    assert "3 x 9.0% = 27% (log)" in text
    assert "baseline" not in text
    assert "the baseline was recorded on a busy machine" in unstable_advice(m)


def _unstable_ab(**fields: Any) -> MetricVerdict:
    """An UNSTABLE A/B verify verdict of 2 processes a side that more steps cannot decide
    (block noise 0.4%), with ``fields`` (the process noise, the critical value, ...) set."""
    m = judge_metric("verify", s(BASE), s(BASE, 1.01), 0.07)
    return dataclasses.replace(
        m, **{"verdict": Verdict.UNSTABLE, "steps_to_decide": None, "within": 0.004,
              "alpha": 4.46e-4, "base_runs": 2, "now_runs": 2, "processes_to_decide": None,
              "ab_sides": True, **fields})  # fmt: skip


def test_an_ab_band_widened_by_few_degrees_of_freedom_says_so_and_what_adds_them():
    """A capped device prior is worth about one degree of freedom for one case: the first
    A/B nights rest on the run's own processes and little history, so Student's t, not the
    noise, makes the band wide. The advice says the critical value against the normal one
    and points at --specperf-history; on many degrees of freedom it says nothing of it."""
    from pytest_specperf.reporting.terminal import unstable_advice

    few = _unstable_ab(between=0.02, floor=0.02, noise=0.02, critical=7.05, df=4.2,
                       history_runs=4)  # fmt: skip
    text = unstable_advice(few, ab=True)
    assert "its critical value 7.05 rests on 4.2 degrees of freedom (3.32 on many)" in text, text
    assert "with 2 earlier tested process(es) from --specperf-history" in text
    many = dataclasses.replace(few, critical=3.40, df=200.0)
    assert "degrees of freedom" not in unstable_advice(many, ab=True)
    assert "degrees of freedom" not in unstable_advice(few)  # stored mode: the sitting's advice


def test_unstable_advice_names_the_quantity_judged_and_marks_a_log_band():
    """The advice's change is the judged form's (a phase against the rest of its step),
    not the raw phase's the table shows, so it says which; its band is of the log."""
    from pytest_specperf.reporting.terminal import _change_text, unstable_advice

    m = dataclasses.replace(_unstable_ab(between=0.02, floor=0.02, noise=0.02, critical=3.4,
                                         df=40.0), basis="against the rest of the step")  # fmt: skip
    text = unstable_advice(m)
    assert text.startswith(f"verify / rest of step changed {m.change * 100:+.1f}% within"), text
    assert f"= {m.band * 100:.1f}% (log), a change of +" in text
    assert _change_text(m) == f"verify/rest {m.change * 100:+.1f}%"  # the summary's column
    gpu = dataclasses.replace(m, basis="on device time, against the rest of the step")
    assert _change_text(gpu).startswith("verify/rest (device) ")
    raw = dataclasses.replace(m, basis=None)
    assert unstable_advice(raw).startswith("verify changed ") and _change_text(raw).startswith(
        "verify +"
    )


def test_an_ab_case_no_process_count_decides_points_at_the_files_mark_when_processes_split():
    """No practical number of processes per side: where the processes differ more than the
    blocks (a split), the advice says how a recording marks it not gated and that A/B runs
    honour the mark; where the blocks dominate, a quieter machine."""
    from pytest_specperf.reporting.terminal import unstable_advice

    split = _unstable_ab(between=0.12, floor=0.12, noise=0.12, critical=3.4, df=40.0,
                         history_runs=30)  # fmt: skip
    text = unstable_advice(split, ab=True)
    assert "its processes differ more than its blocks do" in text, text
    assert "--specperf-update-baselines --specperf-processes 5" in text
    assert "A/B runs of a comparable setup honour the mark" in text
    assert "export THP_MEM_ALLOC_ENABLE=1" in text and "quieter machine" not in text
    busy = dataclasses.replace(split, within=0.05, between=0.01)
    assert "run on a quieter machine" in unstable_advice(busy, ab=True)


def test_tolerance_for_band_inverts_band_limit():
    """The least tolerance a band decides is ``band_limit``'s inverse, for a time (log),
    a higher-is-better quantity and a share in points."""
    from pytest_specperf.judging.verdict import band_limit, tolerance_for_band

    for kw in ({"relative": True}, {"relative": True, "higher_is_better": True}, {}):
        for tol in (0.02, 0.07, 0.25):
            assert tolerance_for_band(band_limit(tol, **kw), **kw) == pytest.approx(tol)
    assert tolerance_for_band(0.0677, relative=True) == pytest.approx(0.07, abs=1e-4)


def test_steps_advice_says_the_extension_took_its_looks_not_its_time():
    """An extension that measured every look it planned stopped on them: raising
    --specperf-max-time would not add one, so the advice names the steps instead; one that
    stopped earlier ran out of time. The rounds are the case's (an A/B verdict counts 1)."""
    from pytest_specperf.judging.significance import Family
    from pytest_specperf.reporting.terminal import unstable_advice

    m = dataclasses.replace(judge_metric("verify", s(BASE), s(BASE, 1.01), 0.07),
                            verdict=Verdict.UNSTABLE, steps_to_decide=128)  # fmt: skip
    spent = unstable_advice(m, max_time_s=30, looks=Family(looks=4, look=4), rounds=4)
    assert spent.endswith(
        "; about 128 steps would decide: the automatic extension took all 4 of its looks "
        "after 4 rounds; record the baseline and run with --specperf-steps 128 (or the "
        "marker's steps=)"
    ), spent  # a stored baseline is judged at its own steps only (INVALID otherwise)
    assert "--specperf-max-time" not in spent
    timed = unstable_advice(m, max_time_s=30, looks=Family(looks=4, look=2), rounds=2)
    assert "stopped after 2 rounds at --specperf-max-time 30 s; raise it" in timed
