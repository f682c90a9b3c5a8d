"""``specperf sglang-check`` says what a fork changed (issue 29, item 5): a renamed callee is
named where the step calls it; a class moved to another module and imported back resolves
as at run time, with where it lives now.

Fixtures: copies of the fork-shaped tree ``tests/data/sglang_ddtree_fork`` with one change
each, made by the ``renamed_fork`` and ``moved_fork`` fixtures below.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_specperf.engines.sglang.check import Renamed, build_report, render_text
from pytest_specperf.engines.sglang.phase_map import example_fork_map_path

FORK = Path(__file__).parent / "data" / "sglang_ddtree_fork"
SPEC = "sglang.srt.speculative"
WORKER = f"{SPEC}.dflash_worker.DFlashWorker"
STEP = f"{WORKER}.forward_batch_generation"
EXAMPLE = str(example_fork_map_path())
WORKER_PY = "python/sglang/srt/speculative/dflash_worker.py"
INFO_PY = "python/sglang/srt/speculative/dflash_info.py"


def _copy(tmp_path: Path) -> Path:
    fork = tmp_path / "fork"
    shutil.copytree(FORK, fork)
    return fork


@pytest.fixture
def renamed_fork(tmp_path: Path) -> Path:
    """The fork with ``_ddtree_accept`` renamed ``_accept_ddtree`` (definition and call)."""
    fork = _copy(tmp_path)
    worker = fork / WORKER_PY
    text = worker.read_text()
    assert text.count("_ddtree_accept(") == 2
    worker.write_text(text.replace("_ddtree_accept(", "_accept_ddtree("))
    return fork


def test_unit_a_renamed_callee_is_named_where_the_step_calls_it(renamed_fork: Path) -> None:
    r = build_report(str(renamed_fork / "python"), EXAMPLE, "DFLASH")
    assert not r.ok
    (gone,) = [e for e in r.entries if e.status != "found"]
    assert gone.target == f"{WORKER}._ddtree_accept" and gone.status == "missing"
    (s,) = r.steps
    assert s.target == STEP and "accept" not in s.phases_reached
    where = "sglang/srt/speculative/dflash_worker.py:23"
    assert s.renamed == [
        Renamed("accept", f"{WORKER}._ddtree_accept", f"{WORKER}._accept_ddtree",
                "self._accept_ddtree", where)
    ]  # fmt: skip
    # the stats update, also uncovered and named like "accept", is not taken for it
    (call,) = [c for c in s.calls if c.call == "self._accept_ddtree"]
    assert f"renamed from {WORKER}._ddtree_accept" in call.detail
    (stats,) = [c for c in s.calls if c.call == "self._update_acceptance_stats"]
    assert "renamed" not in stats.detail
    text = render_text(r)
    assert (
        f"accept               {WORKER}._ddtree_accept is not in the source: the step calls "
        f"self._accept_ddtree ({where}), defined as {WORKER}._accept_ddtree: map "
        f"`target: {WORKER}._accept_ddtree` as accept"
    ) in text


def test_unit_an_unchanged_fork_names_no_rename() -> None:
    (s,) = build_report(str(FORK), EXAMPLE, "DFLASH").steps
    assert s.renamed == []


MOVED = f"{SPEC}.dflash_info_tree.DDTreeVerifyInput.prepare_for_verify"


@pytest.fixture(params=["absolute", "relative"])
def moved_fork(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The fork with ``DDTreeVerifyInput`` moved to ``dflash_info_tree.py`` and imported
    back into ``dflash_info`` (where the map and the worker's import name it)."""
    fork = _copy(tmp_path)
    info = fork / INFO_PY
    (info.parent / "dflash_info_tree.py").write_text(info.read_text())
    source = "." if request.param == "relative" else f"{SPEC}."
    info.write_text(f"from {source}dflash_info_tree import DDTreeVerifyInput  # noqa: F401\n")
    return fork


def test_unit_a_class_moved_and_imported_back_resolves_where_it_lives(moved_fork: Path) -> None:
    r = build_report(str(moved_fork / "python"), EXAMPLE, "DFLASH")
    (e,) = [
        e
        for e in r.entries
        if e.target == f"{SPEC}.dflash_info.DDTreeVerifyInput.prepare_for_verify"
    ]
    assert e.status == "found" and e.lives == MOVED
    assert e.where == "sglang/srt/speculative/dflash_info_tree.py:13"
    assert r.ok, [x for x in r.entries if x.status != "found"]
    (s,) = r.steps
    assert s.phases_reached["prepare_for_verify"] == "verify_input.prepare_for_verify (line 21)"
    text = render_text(r)
    assert "MISSING" not in text  # no contradiction with the step section
    assert (
        f"via import  {SPEC}.dflash_info.DDTreeVerifyInput.prepare_for_verify "
        f"(prepare_for_verify): defined as {MOVED} at "
        "sglang/srt/speculative/dflash_info_tree.py:13 and imported into "
        f"{SPEC}.dflash_info; hooked there at run time"
    ) in text
