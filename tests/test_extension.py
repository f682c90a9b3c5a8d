"""The automatic extension's loop (plugin.fixtures), with test doubles for the decoders,
the progress line and the judge; the real thing runs in tests/test_noise_e2e.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from pytest_specperf.plugin import cases
from pytest_specperf.plugin.fixtures import SpecperfHandle


class FakeDecoder:
    """Counts rounds; each round takes ``round_s`` on the fake clock."""

    def __init__(self, make_run, clock, round_s=4.0):
        self.make_run, self.clock, self.round_s = make_run, clock, round_s
        self.rounds, self.notes = 1, []
        self.server = None  # the handle names the server being measured when one fails

    def run(self, case):
        run = self.make_run(steps=8 * self.rounds)
        return dataclasses.replace(run, rounds=self.rounds, round_steps=8)

    def more(self, case, *, note=""):
        self.notes.append(note)
        self.clock.t += self.round_s
        self.rounds += 1
        return True


class FakeClock:
    def __init__(self, t=0.0):
        self.t = t

    def elapsed(self):
        return self.t


def _handle(max_time, update=False):
    settings = SimpleNamespace(max_time_s=max_time, update_baselines=update)
    handle = SpecperfHandle.__new__(SpecperfHandle)
    handle._session, handle._item, handle.runs = SimpleNamespace(settings=settings), None, []
    return handle


@pytest.fixture
def undecided(monkeypatch):
    """The judge's answer per call: the metrics more rounds would decide."""
    answers: list[list[str]] = []

    def fake(sess, item, handle):
        return lambda run: answers.pop(0) if answers else []

    monkeypatch.setattr(cases, "undecided_metrics", fake)
    return answers


def test_rounds_go_on_while_undecided_and_stop_when_decided(make_run, undecided, monkeypatch):
    clock = FakeClock(4.0)  # the first round took 4 s
    monkeypatch.setattr("pytest_specperf.plugin.fixtures.time.monotonic", lambda: clock.t)
    decoders = [FakeDecoder(make_run, clock), FakeDecoder(make_run, clock, 0.0)]
    undecided += [["verify"], ["verify", "draft"], []]
    _handle(60.0)._extend(None, decoders, clock)
    assert [d.rounds for d in decoders] == [3, 3]  # every process, whole rounds
    assert decoders[0].notes == ["round 2 (verify undecided)", "round 3 (verify, draft undecided)"]


def test_the_budget_stops_the_rounds(make_run, undecided, monkeypatch):
    clock = FakeClock(10.0)
    monkeypatch.setattr("pytest_specperf.plugin.fixtures.time.monotonic", lambda: clock.t)
    decoder = FakeDecoder(make_run, clock, round_s=10.0)
    undecided += [["verify"]] * 10
    _handle(29.0)._extend(None, [decoder], clock)
    assert decoder.rounds == 2  # 10 s + 10 s; a third round would end at 30 s, past 29 s
    assert clock.t == 20.0


def test_the_looks_stop_at_the_false_alarm_budgets_count(make_run, undecided, monkeypatch):
    """The run's false-alarm budget was split over MAX_LOOKS looks per case
    (judging.significance): a case still undecided after them stops, whatever the time."""
    from pytest_specperf.judging.significance import MAX_LOOKS

    clock = FakeClock(1.0)
    monkeypatch.setattr("pytest_specperf.plugin.fixtures.time.monotonic", lambda: clock.t)
    decoder = FakeDecoder(make_run, clock, round_s=1.0)
    undecided += [["verify"]] * 20
    _handle(600.0)._extend(None, [decoder], clock)
    assert decoder.rounds == MAX_LOOKS == 4


@pytest.mark.parametrize(("max_time", "update"), [(0.0, False), (60.0, True)])
def test_no_rounds_without_a_budget_or_when_recording(make_run, undecided, max_time, update):
    decoder = FakeDecoder(make_run, FakeClock(1.0))
    undecided += [["verify"]] * 3
    _handle(max_time, update)._extend(None, [decoder], FakeClock(1.0))
    assert decoder.rounds == 1


@pytest.mark.parametrize(
    ("max_time", "rounds", "says"),
    [
        (None, 1, "about 40 steps would decide: record the baseline and run with "
         "--specperf-steps 40"),
        (0.0, 1, "about 40 steps would decide and the automatic extension is off "
         "(--specperf-max-time 0): raise it, or run with --specperf-steps 40"),
        (25.0, 3, "about 40 steps would decide: the automatic extension stopped after 3 "
         "rounds at --specperf-max-time 25 s"),
    ],
)  # fmt: skip
def test_unit_steps_advice_names_the_extension_state(max_time, rounds, says):
    from types import SimpleNamespace

    from pytest_specperf.reporting.terminal import _steps_advice

    fake_verdict = SimpleNamespace(steps_to_decide=40, rounds=rounds)  # a unit-test double
    assert says in _steps_advice(fake_verdict, max_time)
