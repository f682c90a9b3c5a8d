"""``scripts/rejudge_inline.py``'s judging: each case at the look its rounds reached (not
look 1 for every case), with the plugin's budget; the judge itself is a test double that
records the level it is asked at (the script's own judging is ``judge_runs``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pytest_specperf.judging.significance import MAX_LOOKS, Family
from pytest_specperf.judging.verdict import Tolerances


@pytest.fixture(scope="module")
def script() -> ModuleType:
    path = Path(__file__).parent.parent / "scripts" / "rejudge_inline.py"
    spec = importlib.util.spec_from_file_location("rejudge_inline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rejudge_inline"] = module
    spec.loader.exec_module(module)
    return module


def test_the_look_is_the_cases_rounds_clamped(script):
    assert [script.look_of({"runs": [{"rounds": r}]}) for r in (1, 2, 3, 4, 9)] == [
        1, 2, 3, 4, MAX_LOOKS,
    ]  # fmt: skip
    assert script.look_of({"runs": []}) == 1 and script.look_of({}) == 1


def test_each_case_is_judged_at_its_look(script, monkeypatch):
    """Under Pocock's constant boundary every look has the same level, so the looks are
    read off the family each gate's level comes from."""
    asked: list[float] = []
    looks: list[int] = []

    def judge_runs(metric, runs, tol, *, alpha, prior=None):  # a test double: records the level
        asked.append(alpha)

    class RecordingFamily(Family):  # the real family, recording the look it is read at
        def gate_alpha(self, gates: int) -> float:
            looks.append(self.look)
            return super().gate_alpha(gates)

    monkeypatch.setattr(script, "judge_runs", judge_runs)
    monkeypatch.setattr(script, "Family", RecordingFamily)
    gates = ["verify/rest", "step/ref"]
    table = {
        "A_A": {rep: {"t ctx=1": ({}, gates, 1), "t ctx=2": ({}, gates, 1)} for rep in (0, 1)},
        "hog": {1: {"t ctx=1": ({}, gates, 1), "t ctx=2": ({}, gates, 3)}},
    }
    assert script.judge(table, "hog", None, 1, Tolerances(0.05, 0.25)) == (1, 0, 0, 0)
    assert looks == [1, 3]
    want = [Family(tests=2, looks=MAX_LOOKS, look=k).gate_alpha(2) for k in (1, 1, 3, 3)]
    assert asked == want
