"""The false-alarm budget: Student's t, Welch-Satterthwaite, Holm, the family of a run,
mirror phase pairs, a duplicate tokens/s gate, bimodal cases marked at recording, sittings
in the baseline file and the device prior beside it. Named synthetic data, no timing."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import random
from pathlib import Path

import pytest

from pytest_specperf.judging.judge import (
    Case,
    as_baseline,
    compare,
    fixed_accept,
    judge_case,
    mirror_pairs,
    not_gated_mark,
)
from pytest_specperf.judging.noise import PROVISIONAL_PRIOR, DevicePrior, LevelPrior
from pytest_specperf.judging.significance import (
    LONE,
    MAX_LOOKS,
    Family,
    critical,
    holm,
    holm_levels,
    p_worse,
)
from pytest_specperf.judging.spending import look_level, pocock_boundary
from pytest_specperf.judging.stats import Summary, f_sf, satterthwaite, stable, t_quantile, t_sf
from pytest_specperf.judging.strict import unjudged
from pytest_specperf.judging.verdict import Tolerances, Verdict
from pytest_specperf.store.baselines import (
    BaselineError,
    case_from_json,
    case_to_json,
    load_any_schema,
    load_baselines,
    write_baselines,
)
from pytest_specperf.store.prior import load_prior, prior_path, write_prior

# -- distributions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 10, 2.2281),  # printed tables
        (0.995, 3, 5.8409),
        (0.95, 1, 6.3138),
        (0.999, 30, 3.3852),
        (0.99865, math.inf, 3.0000),  # the old 3-sigma cut is the normal's 0.135% tail
    ],
)
def test_t_quantiles_match_printed_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-4)
    assert t_sf(t_quantile(p, df), df) == pytest.approx(1 - p, rel=1e-6)


def test_the_old_3_sigma_cut_with_8_degrees_of_freedom_is_a_1_percent_tail():
    """The issue: 3 sigma with w on 7 and tau on 2 df is not the normal's 0.135%."""
    assert t_sf(3.0, 8) == pytest.approx(0.0085, abs=5e-4)
    assert 1 - (1 - t_sf(3.0, 8)) ** 21 == pytest.approx(0.165, abs=0.01)


def test_f_tail_matches_the_readme_anova():
    assert f_sf(1.46, 11, 77) == pytest.approx(0.16, abs=0.01)  # README: p 0.16-0.17


def test_satterthwaite_degrees_of_freedom():
    assert satterthwaite([(1.0, 5)]) == 5
    assert satterthwaite([(1.0, 5), (1.0, 5)]) == pytest.approx(10)
    assert satterthwaite([(1.0, 3), (0.0, 1)]) == 3  # a zero part adds nothing
    assert satterthwaite([(1.0, math.inf)]) == math.inf  # a known variance
    # a small uncertain part beside a large known one: about known
    assert satterthwaite([(0.01, 2), (1.0, math.inf)]) > 1e4


# -- the family of a run ------------------------------------------------------------------


def test_a_run_splits_its_budget_over_tests_cases_looks_and_gates():
    f = Family(tests=7, cases=1, looks=MAX_LOOKS)
    assert f.case_alpha == pytest.approx(0.05 / 7)  # the case's share, over all its looks
    # Pocock's constant boundary: one level at every look, whose crossing is the share
    levels = [dataclasses.replace(f, look=k).gate_alpha(6) for k in range(1, MAX_LOOKS + 1)]
    assert levels == [levels[0]] * MAX_LOOKS
    assert pocock_boundary(0.05 / 42, MAX_LOOKS).nominal[0] == levels[0]
    assert all(a > 0.05 / 168 for a in levels)  # every look: more than Bonferroni's quarter
    assert levels == [look_level(0.05 / 42, k, MAX_LOOKS) for k in range(1, MAX_LOOKS + 1)]
    assert Family(tests=7).gate_alpha(6) == pytest.approx(0.05 / 42)  # one look
    assert LONE.gate_alpha(1) == 0.05
    with pytest.raises(ValueError, match="tests"):
        Family(tests=0)
    with pytest.raises(ValueError, match="run_alpha"):
        Family(run_alpha=1.5)
    with pytest.raises(ValueError, match=r"Family.look must be at most looks \(4\), got 5"):
        Family(looks=4, look=5)


def test_holm_step_down():
    ps = [0.001, 0.04, 0.013, 0.2]
    assert holm_levels(ps, 0.05) == [0.0125, 0.025, 0.05 / 3, 0.05]
    assert holm(ps, 0.05) == [True, False, True, False]  # 0.013 < 0.0167; 0.04 > 0.025
    assert holm([0.02, 0.02], 0.05) == [True, True]
    assert holm([0.03, 0.04, 0.001], 0.05) == [False, False, True]  # 0.03 > 0.05 / 2


def test_p_worse_is_one_sided():
    assert p_worse(0.05, 0.01, math.inf) == pytest.approx(t_sf(5.0, math.inf))
    assert p_worse(-0.05, 0.01, math.inf) > 0.99  # faster is no evidence of worse
    assert p_worse(-0.05, 0.01, 8, higher_is_better=True) == pytest.approx(t_sf(5.0, 8))
    assert p_worse(math.nan, 0.01, 8) == 1.0


def test_the_family_wise_rate_of_a_simulated_quiet_run_stays_under_budget():
    """1500 simulated quiet runs of 7 cases x 6 gates, each gate a t statistic on 9 df at
    the Bonferroni x Holm levels: the share of runs with any false alarm is <= 5% (its
    expectation is about 5% x the union's slack); a fixed 3-sigma cut fails about 17%."""
    rng = random.Random(28)
    family = Family(tests=7)
    df = 9
    n = 1500
    runs_with_alarm = runs_with_3sigma_alarm = 0
    for _ in range(n):
        any_alarm = any_3sigma = False
        for _case in range(7):
            ts = [rng.gauss(0, 1) / math.sqrt(rng.gammavariate(df / 2, 2 / df)) for _ in range(6)]
            ps = [t_sf(t, df) for t in ts]
            any_alarm |= any(holm(ps, family.case_alpha))
            any_3sigma |= any(t > 3.0 for t in ts)
        runs_with_alarm += any_alarm
        runs_with_3sigma_alarm += any_3sigma
    assert runs_with_alarm / n <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / n)  # 5%, 2 sd of chance
    assert runs_with_3sigma_alarm / n > 0.10


def _looks_simulation():
    """``scripts/look_false_alarms.py``: the simulation of quiet runs over the looks."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "look_false_alarms.py"
    spec = importlib.util.spec_from_file_location("look_false_alarms", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_family_wise_rate_over_the_extensions_looks_stays_under_budget():
    """1500 simulated quiet runs of 7 cases x 6 gates x 4 looks at Pocock's constant
    boundary's levels (Holm at each look), each gate's noise as ``judging.noise`` makes
    it with half the first look's variance from the blocks (``scripts/look_false_alarms.py``):
    the share of runs with any false alarm stays under 5% (within 2 sd of chance; 3.3%
    with 3000 runs); judging every look at the case's whole share (no correction over
    looks) fails far more often (9.2%)."""
    family = Family(tests=7, looks=MAX_LOOKS)
    looks = [dataclasses.replace(family, look=k) for k in range(1, MAX_LOOKS + 1)]
    first = [f.gate_alpha(6) for f in looks]
    assert first == [holm_levels([0.0] * 6, f.case_alpha, f.level)[0] for f in looks]
    sim = _looks_simulation()
    n = 1500
    rate = sim.quiet_runs_over_looks(first, n, seed=28)
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / n)
    uncorrected = [family.case_alpha / 6] * MAX_LOOKS
    assert sim.quiet_runs_over_looks(uncorrected, n, seed=28) > rate + 0.03


# -- one gate per independent quantity ----------------------------------------------------

BLOCKS = 8


def _run(verify_ms, draft_ms, *, accept=(3.0,) * BLOCKS, verify_jitter=(), seed=0):
    """One run's summaries: verify and draft make up the whole step, so verify/rest and
    draft/rest mirror each other."""
    rng = random.Random(seed)
    v = [verify_ms * (1 + (verify_jitter[i] if verify_jitter else rng.gauss(0, 0.004)))
         for i in range(BLOCKS)]  # fmt: skip
    d = [draft_ms * (1 + rng.gauss(0, 0.004)) for _ in range(BLOCKS)]
    step = [a + b for a, b in zip(v, d)]

    def summ(xs, center="median"):
        return Summary.compact(sorted(xs)[BLOCKS // 2], xs, BLOCKS * 4, center)

    out = {
        "step": summ(step),
        "step/ref": summ([x / 10 for x in step]),
        "verify": summ(v),
        "draft": summ(d),
        "verify/rest": summ([a / b for a, b in zip(v, d)]),
        "draft/rest": summ([b / a for a, b in zip(v, d)]),
        "accept_len": summ(list(accept), "mean"),
        "tokens_per_s": summ([a / s * 1000 for a, s in zip(accept, step)], "mean"),
        "unaccounted": summ([0.01] * BLOCKS),
    }
    return out


class _Run:
    """The parts of a ``DecodeRun`` that ``compare`` reads (a test double)."""

    def __init__(self, *summaries):
        self.summaries = summaries[0]
        self.utilizations = {}
        self._all = summaries

    @property
    def processes(self):
        return tuple(_Run(s) for s in self._all)


EXACT = DevicePrior(LevelPrior(0.0, math.inf, 0.0, math.inf),
                    LevelPrior(0.0, math.inf, 0.0, math.inf), "test: block noise only", False)  # fmt: skip


def test_verify_and_draft_mirror_each_other():
    base = _run(30.0, 10.0)
    assert mirror_pairs(base, ["verify", "draft"]) == [("verify", "draft")]
    # a third phase that takes a real share of each one's rest breaks the mirror
    base3 = {**base, "kv_commit": Summary.compact(8.0, (8.0,) * BLOCKS, 32)}
    assert mirror_pairs(base3, ["verify", "draft"]) == []


def test_a_slower_verify_is_not_also_reported_as_a_faster_draft():
    base = _run(30.0, 10.0, seed=1)
    now = _run(33.0, 10.0, seed=2)  # verify +10%
    v = compare(base, _Run(now), ["verify", "draft"], Tolerances(0.05, 0.25), prior=EXACT)
    by = {m.metric: m for m in v.metrics}
    assert by["verify"].verdict is Verdict.SLOWER and by["verify"].mirror_of == "draft"
    assert by["draft"].verdict is Verdict.SAME and by["draft"].mirror_of == "verify"
    assert by["draft"].change < -0.05  # the same evidence seen from the other end


def test_a_slower_draft_is_caught_on_the_draft_side():
    base = _run(30.0, 10.0, seed=1)
    now = _run(30.0, 11.0, seed=2)  # draft +10%
    v = compare(base, _Run(now), ["verify", "draft"], Tolerances(0.05, 0.25), prior=EXACT)
    assert v.verdict is Verdict.SLOWER and v.culprit == "draft"


def test_tokens_per_s_is_not_judged_twice_when_the_accept_length_is_fixed():
    base = _run(30.0, 10.0, seed=1)
    now = _run(30.0, 10.0, seed=2)
    assert fixed_accept(base, _Run(now))
    v = compare(base, _Run(now), ["accept_len", "tokens_per_s", "step"], Tolerances(0.07, 0.25),
                prior=EXACT)  # fmt: skip
    assert [m.metric for m in v.metrics] == ["accept_len", "step"]
    assert any("tokens_per_s not judged apart from step" in r for r in v.reasons)
    # a changed accept length: tokens/s says something the step does not
    fewer = _run(30.0, 10.0, accept=(2.0,) * BLOCKS, seed=2)
    assert not fixed_accept(base, _Run(fewer))
    v = compare(base, _Run(fewer), ["accept_len", "tokens_per_s", "step"],
                Tolerances(0.07, 0.25), prior=EXACT)  # fmt: skip
    assert "tokens_per_s" in [m.metric for m in v.metrics]


def test_a_stored_accept_length_is_the_same_as_this_runs_at_the_stores_precision():
    """The baseline stores 8/3 as 2.66667 (6 significant digits), this run holds it in full:
    the same tokens, so tokens/s is still the step's test again (it was judged twice)."""
    accept = (3.0, 8 / 3, 1.5, 2.0) * (BLOCKS // 4)
    base = _run(30.0, 10.0, accept=tuple(stable(a) for a in accept), seed=1)
    assert base["accept_len"].blocks[1] == 2.66667
    assert fixed_accept(base, _Run(_run(30.0, 10.0, accept=accept, seed=2)))
    one_more = (3.0, 8 / 3 + 1 / 32, 1.5, 2.0) * (BLOCKS // 4)
    assert not fixed_accept(base, _Run(_run(30.0, 10.0, accept=one_more, seed=2)))


def test_holm_lets_a_second_clear_change_through():
    """Two gates worse: the first clears Bonferroni's level (alpha / 2), the second only
    Holm's next one (alpha / 1): both SLOWER, each at its level."""
    from pytest_specperf.judging.judge import _holm
    from pytest_specperf.judging.verdict import MetricVerdict

    alpha = 0.005

    def gate(metric, change, noise):
        z = critical(alpha / 2, math.inf)
        v = Verdict.SLOWER if change > max(0.05, z * noise) else Verdict.UNSTABLE
        return MetricVerdict(metric, v, 1.0, 1 + change, change, noise, 0.05, "ms",
                             critical=z, df=math.inf, alpha=alpha / 2)  # fmt: skip

    first, second = gate("step", 0.20, 0.01), gate("verify", 0.054, 0.02)
    assert second.verdict is Verdict.UNSTABLE  # ln(1.054) / 0.02 = 2.63 < 2.807 (alpha / 2)
    out = _holm([first, second], alpha)
    assert [m.verdict for m in out] == [Verdict.SLOWER, Verdict.SLOWER]
    assert out[1].alpha == alpha and out[1].critical == pytest.approx(2.5758, abs=1e-3)
    # alone, the second stays undecided
    assert _holm([second], alpha / 2)[0].verdict is Verdict.UNSTABLE


def test_the_gate_level_follows_the_family():
    base = _run(30.0, 10.0, seed=1)
    now = _run(30.3, 10.0, seed=2)

    def at(family):
        return compare(base, _Run(now), ["verify"], Tolerances(0.05, 0.25), prior=EXACT,
                       family=family).metrics[0]  # fmt: skip

    loose = at(LONE)
    looks = [at(Family(tests=10, looks=4, look=k)) for k in range(1, 5)]
    assert [m.alpha for m in looks] == pytest.approx(
        [look_level(0.05 / 10, k, 4) for k in range(1, 5)]
    )
    assert looks[0].alpha == pytest.approx(pocock_boundary(0.05 / 10, 4).nominal[0])
    for m in looks:
        assert m.critical > loose.critical
        assert critical(m.alpha, m.df) == pytest.approx(m.critical)


# -- bimodal cases, sittings, the prior file ----------------------------------------------

TEST = "perf_tests/t.py::test_d"
KEY = "ctx=8192 kv=contiguous bs=1"


def _processes(make_run, shifts, seed0=1):
    """Runs whose verify/rest blocks are shifted by ``shifts[i]`` (log units): one process
    each, e.g. a bimodal split of -12% / +12%."""
    runs = []
    for i, shift in enumerate(shifts):
        r = make_run(seed=seed0 + i)
        form = r.summaries["verify/rest"]
        rng = random.Random(seed0 + i)  # block-to-block noise of 1%
        blocks = [b * math.exp(shift + rng.gauss(0, 0.01)) for b in form.blocks]
        moved = Summary.compact(form.value * math.exp(shift), blocks, form.n)
        runs.append(dataclasses.replace(r, summaries={**r.summaries, "verify/rest": moved},
                                        server_pid=100 + i))  # fmt: skip
    return dataclasses.replace(runs[0], siblings=tuple(runs[1:]))


def _record(case):
    """What an update stores, recorded at a fixed time (the store's clock is the caller's)."""
    return as_baseline(case, at="2026-12-03T14:00:00+00:00")


def _case(run, fp, **kw):
    return Case(nodeid="t", test=TEST, key=KEY, run=run, fingerprint=fp,
                tolerances=Tolerances(0.07, 0.25), **kw)  # fmt: skip


def test_a_bimodal_recording_is_marked_not_gated(make_run, reference_fp):
    bimodal = _case(_processes(make_run, [-0.12, 0.12, -0.12, 0.12]), reference_fp)
    mark = not_gated_mark(bimodal)
    assert mark is not None and set(mark.gates) == {"verify"}
    assert mark.gates["verify"] == pytest.approx(0.12, rel=0.15)
    assert "bimodal between server processes" in mark.reason and not mark.accepted
    quiet = _case(_processes(make_run, [0.0, 0.001, -0.001, 0.0]), reference_fp)
    assert not_gated_mark(quiet) is None
    one = _case(_processes(make_run, [0.3]), reference_fp)
    assert not_gated_mark(one) is None  # one process cannot tell


def test_a_marked_case_is_said_once_and_strict_counts_it_until_accepted(
    tmp_path, make_run, reference_fp
):
    path = tmp_path / "box.yaml"
    recorded = _record(_case(_processes(make_run, [-0.12, 0.12, -0.12, 0.12]), reference_fp))
    write_baselines(path, {"name": "box"}, [recorded], sitting="s1", host="box")
    text = path.read_text()
    assert "not_gated:" in text and "accepted: false" in text
    [case] = list(load_baselines(path).all_cases())
    assert case.not_gated is not None and "verify" in case.not_gated.gates
    outcome = judge_case(_case(make_run(seed=9), reference_fp, prior=EXACT), case, path)
    assert "verify" not in [m.metric for m in outcome.verdict.metrics]
    [line] = [r for r in outcome.verdict.reasons if r.startswith("not gated")]
    assert "verify 1" in line and "not accepted in the file" in line
    assert [u.label for u in unjudged(outcome, mapped=None, gpu_run=False)] == ["not gated: verify"]
    from pytest_specperf.reporting.terminal import case_notes
    from pytest_specperf.reporting.view import CaseView

    notes = case_notes([CaseView.of(outcome, baseline_file="box.yaml")])
    assert [n for n in notes if n.startswith("NOT GATED")] == [f"NOT GATED {TEST} {KEY}: {line}"]
    # the team accepts it in the file: judged (still not gated)
    path.write_text(text.replace("accepted: false", "accepted: true"))
    [case] = list(load_baselines(path).all_cases())
    outcome = judge_case(_case(make_run(seed=9), reference_fp, prior=EXACT), case, path)
    assert unjudged(outcome, mapped=None, gpu_run=False) == ()
    # a later one-process update keeps the mark and its acceptance
    write_baselines(path, {"name": "box"}, [_record(_case(make_run(seed=3), reference_fp))],
                    sitting="s2")  # fmt: skip
    [case] = list(load_baselines(path).all_cases())
    assert case.not_gated is not None and case.not_gated.accepted


def test_an_ab_run_honours_the_files_mark(tmp_path, make_run, reference_fp):
    """A/B needs no baseline, but the device's file may mark a case whose processes split:
    the A/B run's reference side then carries the mark (``stored_mark``), so the same gates
    are not gated, the same line says so, and strict counts it until the team accepts it.
    Another case, another engine identity, or no file: no mark."""
    from pytest_specperf.judging.ab import reference_baseline, stored_mark

    path = tmp_path / "box.yaml"
    recorded = _record(_case(_processes(make_run, [-0.12, 0.12, -0.12, 0.12]), reference_fp))
    write_baselines(path, {"name": "box"}, [recorded], sitting="s1", host="box")
    file = load_baselines(path)
    mark = stored_mark(file, reference_fp, TEST, KEY)
    assert mark is not None and "verify" in mark.gates and not mark.accepted
    assert stored_mark(file, reference_fp, TEST, "ctx=4096 kv=contiguous bs=1") is None
    assert stored_mark(file, {**reference_fp, "config": "other"}, TEST, KEY) is None
    assert stored_mark(None, reference_fp, TEST, KEY) is None
    # a split recorded under another environment says nothing of this run's: the mark holds
    # only where the recording is comparable with one of the two sides
    thp = {**reference_fp, "huge_pages": True}
    assert stored_mark(file, thp, TEST, KEY) is None
    assert stored_mark(file, thp, TEST, KEY, reference=thp) is None
    assert stored_mark(file, thp, TEST, KEY, reference=reference_fp) == mark  # A as recorded
    newer = {**reference_fp, "engine_version": "next"}  # B a new build, A the recorded one
    assert stored_mark(file, newer, TEST, KEY, reference=reference_fp) == mark
    reference = _record(_case(make_run(seed=5), reference_fp))
    base = reference_baseline(reference, "ab-sitting", reference_fp, mark)
    outcome = judge_case(_case(make_run(seed=9), reference_fp, prior=EXACT, sitting="ab-sitting"),
                         base, path)  # fmt: skip
    assert "verify" not in [m.metric for m in outcome.verdict.metrics]
    assert any(r.startswith("not gated: verify") for r in outcome.verdict.reasons)
    assert [u.label for u in unjudged(outcome, mapped=None, gpu_run=False)] == ["not gated: verify"]
    unmarked = judge_case(_case(make_run(seed=9), reference_fp, prior=EXACT, sitting="ab-sitting"),
                          reference_baseline(reference, "ab-sitting", reference_fp), path)  # fmt: skip
    assert "verify" in [m.metric for m in unmarked.verdict.metrics]


def test_a_bad_not_gated_mark_is_invalid_naming_the_field(tmp_path, make_run, reference_fp):
    path = tmp_path / "box.yaml"
    recorded = _record(_case(_processes(make_run, [-0.12, 0.12, -0.12, 0.12]), reference_fp))
    write_baselines(path, {"name": "box"}, [recorded])
    path.write_text(path.read_text().replace("accepted: false", "accepted: maybe"))
    [problem] = load_baselines(path).problems()
    assert "not_gated.accepted: expected true or false" in problem.message
    # an A/B run takes no mark from an entry that fails validation (the stored run's
    # INVALID says why), nor for a fingerprint without a backend
    from pytest_specperf.judging.ab import stored_mark

    assert stored_mark(load_baselines(path), reference_fp, TEST, KEY) is None
    no_backend = {k: v for k, v in reference_fp.items() if k != "backend"}
    assert stored_mark(load_baselines(path), no_backend, TEST, KEY) is None


def test_updates_on_later_days_add_sittings_and_keep_the_last_k(tmp_path, make_run, reference_fp):
    path = tmp_path / "box.yaml"
    for day, seeds in (("mon", [1, 2]), ("tue", [3, 4]), ("wed", [5, 6])):
        run = _processes(make_run, [0.0] * len(seeds), seed0=seeds[0])
        write_baselines(path, {"name": "box"}, [_record(_case(run, reference_fp))],
                        keep_runs=5, sitting=f"2026-12-{day}", host="box")  # fmt: skip
    [case] = list(load_baselines(path).all_cases())
    assert [r.sitting for r in case.runs] == ["2026-12-mon"] + ["2026-12-tue"] * 2 + [
        "2026-12-wed"
    ] * 2
    assert case.sittings == 3 and {r.host for r in case.runs} == {"box"}
    outcome = judge_case(_case(make_run(seed=9), reference_fp, sitting="thu"), case, path)
    verify = next(m for m in outcome.verdict.metrics if m.metric == "verify")
    assert verify.sittings == 3  # the noise's sitting term estimated from the file's sittings
    assert verify.sitting_coef == pytest.approx(1 + 0.2**2 + 0.4**2 + 0.4**2)


def test_a_v3_file_reads_as_one_sitting(tmp_path, make_run, reference_fp):
    """A schema-3 file's runs carry no sitting (read by ``specperf migrate``, which keeps
    them as one sitting)."""
    path = tmp_path / "box.yaml"
    write_baselines(path, {"name": "box"}, [_record(_case(_processes(make_run, [0, 0]),
                                                               reference_fp))])  # fmt: skip
    text = path.read_text().replace("schema_version: 4", "schema_version: 3")
    path.write_text(text)
    bf = load_any_schema(path)
    assert bf.version == 3
    [case] = list(bf.all_cases())
    assert case.sittings == 1 and all(r.sitting is None for r in case.runs)
    path.write_text(text.replace("pid: 100}", "pid: 100, sitting: x}"))
    [problem] = load_any_schema(path).problems()  # a v3 run knows no sitting field
    assert "unknown field(s) sitting" in problem.message


def test_the_device_prior_file_round_trips_and_is_checked(tmp_path):
    base = tmp_path / "cpu-box.yaml"
    assert prior_path(base).name == "cpu-box.prior.yaml"
    assert load_prior(base) is PROVISIONAL_PRIOR  # no file: the provisional prior
    measured = DevicePrior(LevelPrior(0.008, 24, 0.009, 12), LevelPrior(0.027, 24, 0.041, 12),
                           "specperf calibrate, 3 sittings", False)  # fmt: skip
    write_prior(base, measured)
    assert load_prior(base) == measured
    text = prior_path(base).read_text()
    prior_path(base).write_text(text.replace("sitting: 0.041", "sitting: 3"))
    with pytest.raises(BaselineError, match=r"step.sitting: must be from 0 to 0.7, got 3"):
        load_prior(base)
    prior_path(base).write_text(text.replace("provisional: false", "provisional: 1"))
    with pytest.raises(BaselineError, match="provisional: expected true or false"):
        load_prior(base)


def test_the_provisional_prior_says_so():
    text = PROVISIONAL_PRIOR.describe()
    assert text.startswith("noise prior (PROVISIONAL, derived from the README's 2026-12")
    assert "1.2% (phases), 3.0% (step)" in text and "1.1% (phases), 6.0% (step)" in text


def test_a_recorded_case_keeps_its_sitting_through_json(tmp_path, make_run, reference_fp):
    """The writer stamps the update's sitting on runs that carry none (a pytest-xdist
    worker's cases travel as JSON to the controller, which writes them)."""
    recorded = _record(_case(_processes(make_run, [0, 0]), reference_fp, sitting="worker"))
    assert [r.sitting for r in recorded.runs] == [None, None]
    wire = case_from_json(case_to_json(recorded))
    path = tmp_path / "box.yaml"
    write_baselines(path, {"name": "box"}, [wire], sitting="controller", host="box")
    [case] = list(load_baselines(path).all_cases())
    assert [r.sitting for r in case.runs] == ["controller", "controller"]
    again = case_from_json(case_to_json(case))
    assert [(r.sitting, r.host) for r in again.runs] == [("controller", "box")] * 2


def test_a_calibration_pools_its_cases_into_the_device_prior():
    """Three sittings of three processes per case, simulated with tau 1% and sitting 2%:
    the pooled estimates come back near them, measured (not provisional), on the degrees
    of freedom the cases give (tau: 6 per case; sittings: 2 per case)."""
    from pytest_specperf.judging.noise import level_estimate, measured_prior

    rng = random.Random(11)

    def case():
        beta = [rng.gauss(0, 0.05) for _ in range(8)]
        rows, labels = [], []
        for s in "abc":
            v = rng.gauss(0, 0.02)
            for _ in range(3):
                u = rng.gauss(0, 0.01)
                rows.append([b + v + u + rng.gauss(0, 0.005) for b in beta])
                labels.append(s)
        return level_estimate(rows, labels)

    ests = [case() for _ in range(40)]
    prior = measured_prior({"phase": ests}, "simulated", fallback=PROVISIONAL_PRIOR)
    assert prior.phase.between == pytest.approx(0.01, rel=0.15)
    assert prior.phase.sitting == pytest.approx(0.02, rel=0.25)
    assert (prior.phase.between_df, prior.phase.sitting_df) == (240, 80)
    assert prior.step == PROVISIONAL_PRIOR.step  # no step estimates: the fallback's
    assert prior.provisional  # one kind still provisional


def test_a_device_prior_is_worth_no_more_for_one_case_than_the_cases_spread_allows():
    """Cases whose process spreads differ far beyond their sampling (tau 0.3% to 3%, 40
    cases of 3 sittings x 3 processes): the device-wide mean pools 240 degrees of freedom,
    but as a predictor of one case it is worth only ``case_spread_df`` of them (a few): the
    prior carries that, so that a case's own runs and history outweigh it within days.
    The sitting level, the same for every case, keeps its pooled 80."""
    from pytest_specperf.judging.noise import case_spread_df, level_estimate, measured_prior

    rng = random.Random(12)

    def case(tau):
        beta = [rng.gauss(0, 0.05) for _ in range(8)]
        rows, labels = [], []
        for s in "abc":
            v = rng.gauss(0, 0.02)
            for _ in range(3):
                u = rng.gauss(0, tau)
                rows.append([b + v + u + rng.gauss(0, 0.005) for b in beta])
                labels.append(s)
        return level_estimate(rows, labels)

    ests = [case(0.003 if i % 2 else 0.03) for i in range(40)]
    prior = measured_prior({"phase": ests}, "simulated", fallback=PROVISIONAL_PRIOR)
    cap = case_spread_df([(e.between_hat2, e.between_df) for e in ests])
    assert cap is not None and 1.0 <= cap < 4
    assert prior.phase.between_df == max(1.0, round(cap, 1))  # not 240
    assert prior.phase.sitting_df == 80
    assert prior.phase.between == pytest.approx(math.sqrt((0.03**2 + 0.003**2) / 2), rel=0.3)
