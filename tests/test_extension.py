"""The automatic extension's loop (``run.measure.more_rounds``), with test doubles for the
decoders and the progress line, and the judge's answers as a list; the real thing runs
in tests/test_noise_e2e.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_specperf.run.measure import Extension, extension, more_rounds


class FakeDecoder:
    """Counts rounds; each round takes ``round_s`` on the fake clock."""

    def __init__(self, make_run, clock, round_s=4.0):
        self.make_run, self.clock, self.round_s = make_run, clock, round_s
        self.rounds, self.notes = 1, []
        self.server = None  # the loop names the server being measured when one fails

    def measured(self, case):
        return SimpleNamespace(rounds=self.rounds)

    def more(self, case, *, note=""):
        self.notes.append(note)
        self.clock.t += self.round_s
        self.rounds += 1
        return True

    def close(self):
        pass


class FakeClock:
    def __init__(self, t=0.0):
        self.t = t

    def elapsed(self):
        return self.t


@pytest.fixture
def undecided(monkeypatch):
    """The judge's answer per call: the metrics more rounds would decide; the runs are
    the decoders' round counts (``side_run`` is replaced: the doubles hold no records)."""
    answers: list[list[str]] = []
    monkeypatch.setattr(
        "pytest_specperf.run.measure.side_run",
        lambda decoders, case, looks=None: decoders[0].rounds,
    )
    return answers


def _extension(max_time, answers):
    return Extension(max_time, lambda run: answers.pop(0) if answers else [])


def test_rounds_go_on_while_undecided_and_stop_when_decided(make_run, undecided, monkeypatch):
    clock = FakeClock(4.0)  # the first round took 4 s
    monkeypatch.setattr("pytest_specperf.run.measure.time.monotonic", lambda: clock.t)
    decoders = [FakeDecoder(make_run, clock), FakeDecoder(make_run, clock, 0.0)]
    undecided += [["verify"], ["verify", "draft"], []]
    more_rounds(decoders, None, clock, _extension(60.0, undecided), clock.t)
    assert [d.rounds for d in decoders] == [3, 3]  # every process, whole rounds
    assert decoders[0].notes == ["round 2 (verify undecided)", "round 3 (verify, draft undecided)"]


def test_the_budget_stops_the_rounds(make_run, undecided, monkeypatch):
    clock = FakeClock(10.0)
    monkeypatch.setattr("pytest_specperf.run.measure.time.monotonic", lambda: clock.t)
    decoder = FakeDecoder(make_run, clock, round_s=10.0)
    undecided += [["verify"]] * 10
    more_rounds([decoder], None, clock, _extension(29.0, undecided), clock.t)
    assert decoder.rounds == 2  # 10 s + 10 s; a third round would end at 30 s, past 29 s
    assert clock.t == 20.0


def test_the_looks_stop_at_the_false_alarm_budgets_count(make_run, undecided, monkeypatch):
    """The run's false-alarm budget was split over MAX_LOOKS looks per case
    (judging.significance): a case still undecided after them stops, whatever the time."""
    from pytest_specperf.judging.significance import MAX_LOOKS

    clock = FakeClock(1.0)
    monkeypatch.setattr("pytest_specperf.run.measure.time.monotonic", lambda: clock.t)
    decoder = FakeDecoder(make_run, clock, round_s=1.0)
    undecided += [["verify"]] * 20
    more_rounds([decoder], None, clock, _extension(600.0, undecided), clock.t)
    assert decoder.rounds == MAX_LOOKS == 4


def test_an_ab_case_takes_every_look_with_one_process_a_side(make_run, monkeypatch):
    """With one process a side (``A1 B1 B1 A1``) each look measures two rounds of each
    side's process: the A/B loop counts looks (its order's entries), not the rounds of
    B's process, so it asks at looks 1, 2, 3, 4 and stops after ``MAX_LOOKS`` of them."""
    from pytest_specperf.judging.ab import abba_order, describe_order, next_round
    from pytest_specperf.judging.significance import MAX_LOOKS
    from pytest_specperf.run.measure import Side, measure_ab

    clock = FakeClock(1.0)
    monkeypatch.setattr("pytest_specperf.run.measure.time.monotonic", lambda: clock.t)
    decoders: list[FakeDecoder] = []

    def start_side(side, case, progress, **kw):  # a test double: a decoder of one round
        decoders.append(FakeDecoder(make_run, clock, round_s=0.0))
        return [decoders[-1]], ""

    monkeypatch.setattr("pytest_specperf.run.measure.start_side", start_side)
    monkeypatch.setattr(
        "pytest_specperf.run.measure._ab_runs", lambda ds, case, looks=None: (None, None)
    )  # the doubles hold no records
    asked: list[int] = []

    def undecided(a, b, looks=None):  # None: a loop that does not say its looks
        asked.append(looks)
        return ["verify"]

    one = Side((SimpleNamespace(),))  # type: ignore[arg-type]
    measured = measure_ab(one, one, None, clock, device=None, pids=(),
                          extension=(600.0, undecided))  # fmt: skip
    assert asked == [1, 2, 3, 4]
    first = abba_order(1, 1)
    looks = [first, next_round(first), first, next_round(first)]
    assert measured.order == tuple(describe_order(o) for o in looks)
    assert len(measured.order) == MAX_LOOKS
    assert [d.rounds for d in decoders] == [2 * MAX_LOOKS, 2 * MAX_LOOKS]


def test_the_looks_are_planned_from_the_first_rounds_time():
    """As many looks as fit if every round takes as long as the first, at most MAX_LOOKS:
    a case whose first round takes more than half the budget gets one look, and its
    gates the whole share of the false-alarm budget instead of Pocock's boundary over
    looks it could never take."""
    from pytest_specperf.judging.significance import MAX_LOOKS, Family, planned_looks
    from pytest_specperf.run.cases import CaseRequest

    assert [planned_looks(30.0, t) for t in (40.0, 20.0, 15.0, 14.0, 10.0, 1.0)] == [
        1, 1, 2, 2, 3, MAX_LOOKS]  # fmt: skip
    assert planned_looks(0.0, 5.0) == 1 and planned_looks(30.0, 0.0) == MAX_LOOKS
    request = CaseRequest("n", "t", "", None, None, None, tests=2, looks=MAX_LOOKS)  # type: ignore[arg-type]
    one, four = request.family(7, 1, planned=1), request.family(7, 1)
    assert (one.looks, four.looks) == (1, MAX_LOOKS)
    assert one.gate_alpha(5) == Family(tests=2, cases=7).gate_alpha(5)
    assert one.gate_alpha(5) > 3 * four.gate_alpha(5)  # Pocock over 4 looks: 0.31 of it
    assert request.family(7, 3, planned=2).look == 2  # clamped to the planned looks
    assert CaseRequest("n", "t", "", None, None, None).family(1, 1, planned=3).looks == 1  # type: ignore[arg-type]


def test_a_first_round_too_long_for_a_second_takes_one_look(make_run, undecided, monkeypatch):
    clock = FakeClock(20.0)  # the first round took 20 s of 30
    monkeypatch.setattr("pytest_specperf.run.measure.time.monotonic", lambda: clock.t)
    decoder = FakeDecoder(make_run, clock, round_s=1.0)  # later rounds would be quick
    undecided += [["verify"]] * 5
    assert more_rounds([decoder], None, clock, _extension(30.0, undecided), clock.t) == 1
    assert decoder.rounds == 1
    clock.t = 10.0  # 10 s of 30: three looks planned, and no more however quick
    assert more_rounds([decoder], None, clock, _extension(30.0, undecided), clock.t) == 3
    assert decoder.rounds == 3


def test_an_ab_case_plans_its_looks_from_its_first_round(make_run, monkeypatch):
    """The A/B loop plans its looks from the first round of both sides (``A1 B1 B2 A2``)
    and hands them to the judge with the runs: here the first round took 20 s of 30,
    so the case is judged at one look and measured in no more (the case's clock, which
    the servers' starts may hold, is not what plans them)."""
    from pytest_specperf.run.measure import Side, measure_ab

    clock = FakeClock(100.0)  # the servers' starts before the case do not count
    monkeypatch.setattr("pytest_specperf.run.measure.time.monotonic", lambda: clock.t)

    def start_side(side, case, progress, **kw):  # a test double: a decoder of one round
        clock.t += 10.0  # A1, then B1: 20 s; the second round of each takes no time
        return [FakeDecoder(make_run, clock, round_s=0.0)], ""

    monkeypatch.setattr("pytest_specperf.run.measure.start_side", start_side)
    handed: list[int | None] = []
    monkeypatch.setattr("pytest_specperf.run.measure._ab_runs",
                        lambda ds, case, looks=None: handed.append(looks) or (None, None))  # fmt: skip
    one = Side((SimpleNamespace(),))  # type: ignore[arg-type]
    measured = measure_ab(one, one, None, clock, device=None, pids=(),
                          extension=(30.0, lambda a, b, looks: ["verify"]))  # fmt: skip
    assert len(measured.order) == 1 and handed == [1, 1]


def test_no_rounds_without_a_budget(make_run, undecided):
    decoder = FakeDecoder(make_run, FakeClock(1.0))
    undecided += [["verify"]] * 3
    more_rounds([decoder], None, FakeClock(1.0), _extension(0.0, undecided), 1.0)
    assert decoder.rounds == 1


def test_no_extension_when_recording_or_without_time():
    def never(run):
        raise AssertionError("not asked")

    assert extension(60.0, recording=True, undecided=never) is None
    assert extension(0.0, recording=False, undecided=never) is None
    assert extension(60.0, recording=False, undecided=never) == Extension(60.0, never)


@pytest.mark.parametrize(
    ("max_time", "rounds", "says"),
    [
        (None, 1, "about 40 steps would decide: record the baseline and run with "
         "--specperf-steps 40"),
        (0.0, 1, "about 40 steps would decide and the automatic extension is off "
         "(--specperf-max-time 0): raise it, or record the baseline and run with "
         "--specperf-steps 40"),
        (25.0, 3, "about 40 steps would decide: the automatic extension stopped after 3 "
         "rounds at --specperf-max-time 25 s; raise it (or rerun on a quieter machine)"),
    ],
)  # fmt: skip
def test_unit_steps_advice_names_the_extension_state(max_time, rounds, says):
    from types import SimpleNamespace

    from pytest_specperf.reporting.terminal import _steps_advice

    fake_verdict = SimpleNamespace(steps_to_decide=40, rounds=rounds, ab_sides=False)  # a double
    assert says in _steps_advice(fake_verdict, max_time)
    ab = _steps_advice(SimpleNamespace(steps_to_decide=40, rounds=rounds, ab_sides=True),
                       max_time)  # fmt: skip
    if max_time:  # A/B: the steps from the start are the other way (no look to pay for)
        assert ab.endswith("; raise it, or run with --specperf-steps 40 (both sides)"), ab
    elif max_time == 0:  # A/B measures both sides anew: nothing to record
        assert ab.endswith("raise it, or run with --specperf-steps 40"), ab


def test_unit_ab_steps_advice_counts_a_look_s_rounds_of_one_process():
    """With one process a side, A/B measures each process two rounds a look (``A1 B1 B1
    A1``): the steps that decide count both, and ``--specperf-steps`` sets each round's,
    so the run needs half of them; at 2 processes a side a look is one round."""
    from types import SimpleNamespace

    from pytest_specperf.reporting.terminal import _steps_advice

    one = SimpleNamespace(steps_to_decide=81, rounds=1, ab_sides=True)  # a double
    said = _steps_advice(one, 30.0, per_look=2)
    assert said.startswith("; about 81 steps in the first tested process (it measures 2 "
                           "rounds a look) would decide")  # fmt: skip
    assert said.endswith("or run with --specperf-steps 41 (both sides)"), said
    off = _steps_advice(one, 0.0, per_look=2)
    assert off.endswith("raise it, or run with --specperf-steps 41"), off
    said = _steps_advice(one, 30.0, per_look=1)
    assert "81 steps would decide" in said and said.endswith("--specperf-steps 81 (both sides)")
    stored = SimpleNamespace(steps_to_decide=81, rounds=1, ab_sides=False)
    assert "--specperf-steps 81" in _steps_advice(stored, 0.0, per_look=2)  # never halved


@pytest.mark.parametrize(("a", "b", "per_look"), [(1, 1, 2), (1, 2, 1), (2, 1, 2), (3, 2, 2),
                                                  (2, 2, 1), (3, 1, 3), (4, 4, 1)])  # fmt: skip
def test_a_case_s_rounds_per_look_follow_the_order_of_its_processes(a, b, per_look):
    """The first tested process measures ``ceil(max(a, b, 2) / b)`` rounds a look: as many
    times as ``abba_order`` names it; a report's case reads it back from its sides."""
    from pytest_specperf.judging.ab import abba_order, describe_order, rounds_per_look
    from pytest_specperf.store.report import CaseRecord

    assert rounds_per_look(a, b) == describe_order(abba_order(a, b)).split().count("B1")
    assert rounds_per_look(a, b) == per_look
    record = CaseRecord.from_json({
        "test": "t", "key": "k", "verdict": "SAME", "step_ms": {"median": 1.0},
        "ab": {"reference_processes": a}, "runs": [{}] * b,
    })  # fmt: skip
    assert record.rounds_per_look == per_look
    stored = CaseRecord.from_json({"test": "t", "key": "k", "verdict": "SAME",
                                   "step_ms": {"median": 1.0}, "runs": [{}] * b})  # fmt: skip
    assert stored.rounds_per_look == 1
