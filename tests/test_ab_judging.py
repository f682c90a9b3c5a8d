"""A/B in one run, the pure parts (``judging.ab``): the order of the two sides' server
processes, the reference side as the comparison's baseline, the per-pair cross-check, and
the noise of a same-sitting comparison (no sitting term), with small named data."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest

from pytest_specperf.judging.ab import (
    Slot,
    abba_order,
    describe_order,
    engine_differences,
    next_round,
    pair_changes,
    reference_baseline,
)
from pytest_specperf.judging.baselines import CaseBaseline, fingerprint_hash
from pytest_specperf.judging.noise import NO_PRIOR, LevelPrior, RunBlocks, relative_noise
from pytest_specperf.judging.significance import MAX_LOOKS, Family, critical, p_worse
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import Runs, Tolerances, Verdict, judge_runs

#: The phases' and the step's tolerances, and the gate level of 4 tests x 5 gates.
TOLS = Tolerances(0.07, 0.25)
ALPHA = 0.05 / (4 * 5)

FP_RELEASE = {"backend": "sglang", "engine_version": "0.5.22", "speculative_algorithm": "EAGLE3"}
FP_BUILD = {"backend": "sglang", "engine_version": "0.5.23", "speculative_algorithm": "EAGLE3"}


def test_two_processes_per_side_alternate_a_b_b_a() -> None:
    assert describe_order(abba_order(2, 2)) == "A1 B1 B2 A2"
    assert describe_order(abba_order(4, 4)) == "A1 B1 B2 A2 A3 B3 B4 A4"


def test_one_process_per_side_is_measured_twice_to_stay_balanced() -> None:
    # one process each (or a running reference server): the same processes again, mirrored
    assert describe_order(abba_order(1, 1)) == "A1 B1 B1 A1"
    assert describe_order(abba_order(1, 2)) == "A1 B1 B2 A1"


def test_each_further_round_is_the_last_one_mirrored() -> None:
    first = abba_order(2, 2)
    assert describe_order(next_round(first)) == "A2 B2 B1 A1"
    assert next_round(next_round(first)) == first
    # linear drift cancels within each round: A's and B's mean positions are equal
    for order in (first, next_round(first), abba_order(4, 4)):
        pos = {side: [i for i, s in enumerate(order) if s.side == side] for side in "AB"}
        assert sum(pos["A"]) / len(pos["A"]) == sum(pos["B"]) / len(pos["B"])


def test_a_side_without_processes_is_refused() -> None:
    with pytest.raises(ValueError, match="each side needs a server process"):
        abba_order(0, 2)
    assert str(Slot("B", 1)) == "B2"


def _reference_case() -> CaseBaseline:
    base = CaseBaseline.from_run(
        test="t.py::test_decode",
        key="ctx=2048 kv=contiguous bs=1",
        fingerprint=FP_RELEASE,
        steps=32,
        metrics={"step": Summary.compact(40.0, (39.0, 41.0, 40.0, 40.0), 32)},
        at="2026-12-03T16:00:00+00:00",
        sitting=None,
    )
    return base


def test_the_reference_side_becomes_a_baseline_of_this_sitting_under_the_tested_engine() -> None:
    base = reference_baseline(_reference_case(), "20261203T160000Z-box-1", FP_BUILD)
    assert {r.sitting for r in base.runs} == {"20261203T160000Z-box-1"}
    assert dict(base.fingerprint) == FP_BUILD
    assert base.fingerprint_hash == fingerprint_hash(FP_BUILD)
    assert base.metrics["step"].value == 40.0  # the numbers are the reference side's


def test_the_sides_engine_differences_are_said() -> None:
    assert engine_differences(FP_RELEASE, FP_BUILD) == (
        "A/B: the sides' engines differ: engine_version A '0.5.22', B '0.5.23'"
    )
    assert engine_differences(FP_BUILD, FP_BUILD) is None


def _medians(**values: float) -> dict[str, Summary]:
    return {k: Summary.compact(v, (), 32) for k, v in values.items()}


def test_per_pair_ratios_cross_check() -> None:
    # two pairs: verify 10 -> 11 ms and 10 -> 11.2 ms (+10%, +12%)
    a = [_medians(verify=10.0), _medians(verify=10.0)]
    b = [_medians(verify=11.0), _medians(verify=11.2)]
    assert pair_changes(a, b, "verify") == pytest.approx([0.10, 0.12])
    assert pair_changes(a, b, "draft") == []


def test_a_same_sitting_comparison_has_no_sitting_term() -> None:
    """A/B: both sides in one sitting, so the sitting prior (here 5%, which would dominate)
    never enters; a stored baseline of another sitting carries it."""
    blocks = (0.0, 1.0, -1.0, 0.5, -0.5)  # % log offsets of the block effects

    def run(shift_pct: float, sitting: str) -> RunBlocks:
        bl = tuple(math.exp((b + shift_pct) / 100) for b in blocks)
        return RunBlocks(math.exp(shift_pct / 100), bl, sitting=sitting)

    prior = LevelPrior(between=0.01, between_df=4.0, sitting=0.05, sitting_df=6.0)
    a = [run(0.0, "s1"), run(0.2, "s1")]
    b = [run(10.0, "s1"), run(10.4, "s1")]
    ab = relative_noise(a, b, prior=prior)
    stored = relative_noise(a, [run(10.0, "s2"), run(10.4, "s2")], prior=prior)
    assert ab.sitting_coef == 0.0 and stored.sitting_coef == pytest.approx(2.0)
    assert ab.total < stored.total / 3
    # +10.1% (10.2 - 0.1) on a noise of about 1%: far beyond the strictest gate of a 5%-per-run budget
    # 1 test, 1 case, 5 gates (Holm's first step), the strictest of the extension's 4 looks
    alpha = min(Family(looks=MAX_LOOKS, look=k).gate_alpha(5) for k in range(1, MAX_LOOKS + 1))
    assert ab.log_change == pytest.approx(0.101)
    assert p_worse(ab.log_change, ab.total, ab.df) < alpha
    assert ab.log_change > critical(alpha, ab.df) * ab.total


#: Accept length per block of a greedy, seeded engine, the same in every process of a side.
ACCEPT_A = (3.0, 1.5, 3.0, 1.25, 2.0, 8 / 3, 1.5, 1.75, 5.0)


def _ab_runs(a_blocks: Sequence[Sequence[float]], b_blocks: Sequence[Sequence[float]]) -> Runs:
    """An A/B case as ``run.cases`` wires it: A's processes the baseline, B's the current
    runs and, as ``tested_evidence``, history runs of a group of their own."""

    def side(blocks: Sequence[Sequence[float]]) -> tuple[dict[str, Summary], ...]:
        return tuple(
            {"accept_len": Summary.compact(sum(b) / len(b), b, 32, "mean")} for b in blocks
        )

    a, b = side(a_blocks), side(b_blocks)
    return Runs(a, b, b, ("s",) * len(a), ("s",) * len(b), ("s B",) * len(b))


def test_ab_a_deterministic_accept_length_is_judged_exactly() -> None:
    """Both sides repeat their accept length exactly in two processes each: A/A is SAME with
    no noise (the prior said 2%: UNSTABLE before), a 10% drop is SLOWER, 3% is SAME."""
    same = judge_runs("accept_len", _ab_runs([ACCEPT_A] * 2, [ACCEPT_A] * 2), TOLS, alpha=ALPHA)
    assert same is not None and same.verdict is Verdict.SAME
    assert (same.noise, same.exact_runs) == (0.0, 4)  # B's runs as history are not more runs
    drop = [[x * 0.9 for x in ACCEPT_A]] * 2
    slower = judge_runs("accept_len", _ab_runs([ACCEPT_A] * 2, drop), TOLS, alpha=ALPHA)
    assert slower is not None and slower.verdict is Verdict.SLOWER
    assert slower.noise == 0.0 and slower.change == pytest.approx(-0.1, abs=1e-6)
    small = [[x * 0.97 for x in ACCEPT_A]] * 2
    within = judge_runs("accept_len", _ab_runs([ACCEPT_A] * 2, small), TOLS, alpha=ALPHA)
    assert within is not None and within.verdict is Verdict.SAME and within.exact_runs == 4


def test_an_ab_verdict_line_counts_each_side_s_processes_once() -> None:
    """An A/B case reads "over 2 reference and 2 tested processes", not A's processes as
    baseline runs and B's again as history runs; the JSON keeps the mark."""
    from pytest_specperf.judging.ab import as_ab_verdict
    from pytest_specperf.judging.verdict import CaseVerdict, MetricVerdict

    other = list(ACCEPT_A)
    other[2] += 0.25
    mv = judge_runs("accept_len", _ab_runs([ACCEPT_A, other], [ACCEPT_A] * 2), TOLS, alpha=ALPHA)
    assert mv is not None and (mv.base_runs, mv.now_runs, mv.history_runs) == (2, 2, 2)
    assert "over 2 baseline runs, 2 history runs, 2 processes" in mv.describe()
    [ab] = as_ab_verdict(CaseVerdict(mv.verdict, (mv,))).metrics
    assert ab.ab_sides and "over 2 reference and 2 tested processes)" in ab.describe()
    assert "history" not in ab.describe()
    assert MetricVerdict.from_json(ab.to_json()).describe() == ab.describe()


def test_ab_processes_that_disagree_keep_the_prior() -> None:
    """SGLang on a GPU: accept length varies between processes (kernels that are not
    deterministic); a quarter token more in one block of one process keeps the old rule."""
    other = list(ACCEPT_A)
    other[2] += 0.25
    runs = _ab_runs([ACCEPT_A, other], [ACCEPT_A] * 2)
    mv = judge_runs("accept_len", runs, TOLS, alpha=ALPHA)
    bare = judge_runs("accept_len", runs, TOLS, alpha=ALPHA, prior=NO_PRIOR)
    assert mv is not None and bare is not None
    assert mv.exact_runs is None and mv.between is not None and mv.between > 0
    assert mv.noise > bare.noise > 0  # the device prior is imposed, as before


def test_a_running_reference_server_s_two_rounds_fold_onto_two_tested_processes() -> None:
    """``A1 B1 B2 A1``: one running server as A measures two rounds of the case's 8 blocks
    (16), each tested process one (8). Unfolded, A's 16 blocks cannot pair with B's 8 and
    the comparison fell back to the unpaired centers, whose noise carries the prompts'
    own spread; folded (each block's geometric mean over A's two rounds) they pair, and
    the scatter checks still read A's blocks as measured."""
    from pytest_specperf.judging.ab import fold_reference, fold_rounds, tested_blocks
    from pytest_specperf.judging.samples import DecodeRun
    from pytest_specperf.judging.verdict import disturbance

    prompts = (30.0, 36.0, 27.0, 33.0, 40.0, 29.0, 35.0, 31.0)  # ms: block effects of +-15%
    wobble = (1.004, 0.997, 1.002, 0.999, 1.003, 0.996, 1.001, 0.998)

    def blocks(scale: float, shift: int = 0) -> tuple[float, ...]:
        return tuple(p * scale * wobble[(j + shift) % 8] for j, p in enumerate(prompts))

    a1 = blocks(1.0) + blocks(1.0, 3)  # two rounds of the same prompts
    assert fold_rounds(a1, 8) == pytest.approx(
        [math.sqrt(x * y) for x, y in zip(a1[:8], a1[8:])]
    )
    assert fold_rounds(a1, 16) == a1 and fold_rounds(a1, 5) == a1  # nothing to fold
    base = CaseBaseline.from_run(
        test="t.py::test_decode", key="ctx=2048 kv=contiguous bs=1", fingerprint=FP_RELEASE,
        steps=64, metrics={"step": Summary.compact(32.5, a1, 64)},
        at="2026-12-06T15:00:00+00:00",
    )  # fmt: skip
    b_runs = [
        {"step": Summary.compact(32.5 * s, blocks(s, k), 32)} for k, s in ((1, 1.01), (5, 1.012))
    ]

    def process(summaries: dict[str, Summary], *siblings: DecodeRun) -> DecodeRun:
        return DecodeRun(2048, 1, "contiguous", (), (), {}, summaries, None, {}, 1.0, 8,
                         siblings=siblings)  # fmt: skip

    tested = process(b_runs[0], process(b_runs[1]))  # the two tested processes
    assert tested_blocks(tested) == {"step": (8, 1)}

    def judged(ref: CaseBaseline):
        a = tuple(ref.run_metrics(i) for i in range(len(ref.runs)))
        runs = Runs(a, tuple(b_runs), tuple(b_runs), ("s",), ("s", "s"), ("s B", "s B"))
        mv = judge_runs("step", runs, TOLS, alpha=ALPHA, prior=NO_PRIOR)
        assert mv is not None
        return mv, a

    unfolded, _ = judged(base)
    folded, a = judged(fold_reference(base, [2], tested_blocks(tested)))
    # unpaired: the centers' standard errors, which carry the prompts' own spread (+-15%)
    assert unfolded.verdict is Verdict.UNSTABLE and unfolded.noise > 0.04
    assert unfolded.judged_base is None  # the centers' ratio: no paired statistic
    assert folded.verdict is Verdict.SAME and folded.judged_base is not None  # paired
    assert folded.change == pytest.approx(0.011, abs=0.002)
    assert folded.noise < unfolded.noise / 20
    # the scatter checks read A's 16 blocks as measured, not their means over the rounds
    assert a[0]["step"].measured_blocks == pytest.approx(a1) and len(a[0]["step"].blocks) == 8
    assert disturbance(a[0]["step"], b_runs[0]["step"]) == pytest.approx(
        disturbance(Summary.compact(32.5, a1, 64), b_runs[0]["step"])
    )
    # rounds of other blocks do not fold: A measured 6 blocks a round where B measured 4
    # (12 in all, a multiple of 4, yet blocks 0, 4 and 8 are not the same prompt)
    six = CaseBaseline.from_run(
        test="t.py::test_decode", key="ctx=2048 kv=contiguous bs=1", fingerprint=FP_RELEASE,
        steps=48, metrics={"step": Summary.compact(32.5, a1[:6] + a1[8:14], 48)},
        at="2026-12-06T15:00:00+00:00",
    )  # fmt: skip
    same = fold_reference(six, [2], {"step": (4, 1)})
    assert same.runs[0].blocks == six.runs[0].blocks and not same.runs[0].measured_blocks
    assert fold_reference(base, [2], {"step": (16, 2)}).runs == base.runs  # 1/1: as many


def test_an_ab_case_that_extended_keeps_its_history_nights() -> None:
    """An A/B case whose automatic extension measured a second round on both sides (16
    blocks a process, 2 rounds of the same 8) is judged with the earlier nights' tested
    processes (8 blocks, one round) still in its process noise: every run is folded onto
    one round for the levels. Without its rounds known, the latest reference run's 16
    blocks set the fold and every night of 8 fell away; spread nights then widen the
    noise, calm ones narrow it, against the baseline's change alone."""
    prompts = (0.0, 15.0, -10.0, 8.0, 20.0, -5.0, 12.0, 3.0)  # % log block effects
    wobble = (0.3, -0.2, 0.1, -0.4, 0.2, 0.0, -0.1, 0.3)

    def blocks(shift: float, k: int = 0) -> tuple[float, ...]:
        return tuple(
            math.exp((p + shift + wobble[(j + k) % 8]) / 100) for j, p in enumerate(prompts)
        )

    def run(shift: float, rounds: int, k: int) -> dict[str, Summary]:
        bl = sum((blocks(shift, k + 3 * r) for r in range(rounds)), ())
        return {"verify": Summary.compact(math.exp(shift / 100), bl, 32 * rounds,
                                          rounds=rounds)}  # fmt: skip

    a = (run(0.0, 2, 0), run(0.3, 2, 1))
    b = (run(1.0, 2, 2), run(1.2, 2, 5))

    def judged(nights: Sequence[float], rounds: int = 2):
        def side(rs: tuple[dict[str, Summary], ...]) -> tuple[dict[str, Summary], ...]:
            return tuple(
                {m: dataclasses.replace(s, rounds=rounds) for m, s in r.items()} for r in rs
            )

        hist = tuple(run(u, 1, 7) for u in nights)
        labels = tuple(f"night {i // 2}" for i in range(len(nights)))
        runs = Runs(side(a), side(b), side(b) + hist, ("s",) * 2, ("s",) * 2,
                    ("s B",) * 2 + labels)  # fmt: skip
        mv = judge_runs("verify", runs, TOLS, alpha=ALPHA)
        assert mv is not None
        return mv

    # each night one process: the nights say nothing of tau alone (one run a sitting), so
    # two processes a night, as a nightly job with --specperf-processes 2 keeps them
    def nights(spread: float) -> list[float]:
        return [x for i in range(4) for x in (i * 0.1, i * 0.1 + spread * (-1) ** i)]

    calm, wild = judged(nights(0.1)), judged(nights(4.0))
    assert calm.history_runs == wild.history_runs == 2 + 8  # B's processes and 8 nights
    assert calm.between is not None and wild.between is not None
    assert calm.between < wild.between
    unknown = judged(nights(4.0), rounds=1)  # the rounds not carried: the nights fall away
    assert unknown.history_runs == 2
    assert calm.change == wild.change == unknown.change  # the change is against A alone


def test_a_folded_reference_run_holds_the_tested_run_s_rounds() -> None:
    """A reference process of 4 rounds folded onto a tested run of 2 holds 2 rounds in
    its folded blocks (and its own 4 as measured); one that did not fold keeps its 4."""
    from pytest_specperf.judging.ab import fold_reference

    bl = tuple(float(30 + j % 8) for j in range(32))
    base = CaseBaseline.from_run(
        test="t.py::test_decode", key="ctx=2048 kv=contiguous bs=1", fingerprint=FP_RELEASE,
        steps=128, metrics={"step": Summary.compact(33.5, bl, 128)},
        at="2026-12-07T09:00:00+00:00", rounds=4,
    )  # fmt: skip
    assert base.run_metrics(0)["step"].rounds == 4
    folded = fold_reference(base, [4], {"step": (16, 2)})
    assert len(folded.runs[0].blocks["step"]) == 16
    assert folded.run_metrics(0)["step"].rounds == 2
    assert fold_reference(base, [4], {"step": (32, 4)}).run_metrics(0)["step"].rounds == 4


def test_tokens_per_ref_keeps_the_rounds_of_what_it_is_derived_from() -> None:
    """``tokens/ref`` (the tokens/s gate's judged form) is derived per run: it keeps the
    rounds its accept length and ``step/ref`` hold, so its levels fold like theirs."""
    from pytest_specperf.judging.verdict import tokens_per_ref

    acc = Summary.compact(2.0, (2.0, 1.5, 2.5, 2.0) * 2, 64, "mean", rounds=2)
    spr = Summary.compact(9.0, (9.0, 8.5, 9.5, 9.0) * 2, 64, rounds=2)
    derived = tokens_per_ref({"accept_len": acc, "step/ref": spr})
    assert derived is not None and derived.rounds == 2 and len(derived.blocks) == 8
    one = tokens_per_ref({"accept_len": acc, "step/ref": dataclasses.replace(spr, rounds=1)})
    assert one is not None and one.rounds == 1  # rounds that disagree: not folded
