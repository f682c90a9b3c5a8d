"""``specperf history``: reading a store, the table, change points, pictures, bad files.

The store is written by ``scripts/make_history.py`` (every case through the plugin's own
judging and the bridge, saved by pytest-benchmark's own ``FileStorage``), so the history
reads what a nightly job would have saved.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import io
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_specperf.cli import history as cli
from pytest_specperf.reporting.changepoints import (
    ChangePoint,
    change_points,
    new_change_points,
    segment_starts,
)
from pytest_specperf.reporting.history import Point, Series, load_history

ROOT = Path(__file__).resolve().parents[1]
RUNS = 30
#: make_history.py's story at 30 runs: accept drops at run 10 (ctx >= 32k), verify +10% at
#: 16, baselines re-recorded at 18, a 3 ms host stall at 24 (fragmented cases).
ACCEPT_AT, VERIFY_AT, BASELINE_AT, STALL_AT = 10, 16, 18, 24


def _make(out: Path, *extra: str) -> Path:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_history.py"), str(out),
                    "--runs", str(RUNS), "--cases", "4", *extra], check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A pytest-benchmark storage of 30 nightly runs x 4 cases."""
    return _make(tmp_path_factory.mktemp("hist") / ".benchmarks")


def _args(storage: Path, out: Path, **kw) -> argparse.Namespace:
    base = dict(storage=storage, last=5, out=out, no_plots=True, svg=False, markdown=None,
                new_hours=20.0, min_change=0.05, case=None)
    return argparse.Namespace(**{**base, **kw})


def _series(h, name: str) -> Series:
    [s] = [s for s in h.series if s.name == name]
    return s


def test_store_is_read_in_date_order_with_each_case_a_series(store):
    h = load_history(store)
    assert len(h.runs) == RUNS and h.skipped == ()
    assert [r.date[:10] for r in h.runs[:2]] == ["2025-06-01", "2025-06-02"]
    assert all(r.source == "pytest-benchmark" for r in h.runs)
    assert sorted(s.name for s in h.series) == [
        "test_decode ctx=1024 kv=contiguous bs=1", "test_decode ctx=1024 kv=fragmented bs=1",
        "test_decode ctx=8192 kv=contiguous bs=1", "test_decode ctx=8192 kv=fragmented bs=1"]
    s = _series(h, "test_decode ctx=8192 kv=contiguous bs=1")
    assert len(s.points) == RUNS and s.engine == "reference tiny DFLASH"
    updates = [i for i, p in enumerate(s.points) if p.baseline_update]
    assert updates == [0, BASELINE_AT]  # recorded on the first night and at the update
    assert s.points[VERIFY_AT].verdict == "SLOWER"


def test_a_recording_is_named_as_its_summary_named_it(store):
    """A night that recorded the baselines reads ``(recorded)`` inside its verdict, as that
    night's summary said it (``verdict_label``), not ``(baseline)``."""
    from pytest_specperf.reporting.history import history_rows

    h = load_history(store)
    s = _series(h, "test_decode ctx=8192 kv=contiguous bs=1")
    rows = history_rows(h, s, len(s.points))
    first, update = rows[0][-1], rows[BASELINE_AT][-1]
    assert first == "NO_BASELINE (recorded)", first  # the first night's summary's words
    assert s.points[BASELINE_AT].recorded and update == "SLOWER (recorded)", update
    assert not any("(baseline)" in r[-1] for r in rows)


def test_the_table_shows_the_last_runs(store):
    h = load_history(store)
    out = io.StringIO()
    assert cli.run(_args(store, Path("unused")), out) == 0
    text = out.getvalue()
    assert f"specperf history: {RUNS} run(s), 4 case(s)" in text
    header = "date (UTC)        commit    step ms  verify ms  draft ms  unaccounted ms  accept  verdict"
    assert header in text
    s = _series(h, "test_decode ctx=8192 kv=fragmented bs=1")
    last = s.points[-1]
    assert f"{last.step_ms:.2f}" in text and f"{last.phase_ms['verify']:.2f}" in text
    assert h.runs[-1].short_commit in text and "2025-06-30 02:00" in text


def test_change_points_name_what_happened_and_when(store):
    h = load_history(store)
    frag = change_points(_series(h, "test_decode ctx=8192 kv=fragmented bs=1"))
    found = {(cp.metric, cp.index) for cp in frag}
    assert {("verify", VERIFY_AT), ("unaccounted", STALL_AT)} <= found
    [stall] = [cp for cp in frag if cp.metric == "unaccounted"]
    assert stall.in_points and stall.change > 0.1  # 3 ms of a ~15 ms step
    contiguous = change_points(_series(h, "test_decode ctx=8192 kv=contiguous bs=1"))
    assert "unaccounted" not in {cp.metric for cp in contiguous}  # no stall there
    verify = [cp for cp in contiguous if cp.metric == "verify"]
    assert [cp.index for cp in verify] == [VERIFY_AT] and 0.07 < verify[0].change < 0.13


def test_change_points_on_small_named_series():
    rng = random.Random(3)
    flat = [40 * rng.gauss(1, 0.01) for _ in range(60)]
    assert segment_starts([math.log(x) for x in flat]) == []
    shifted = flat[:35] + [x * 1.08 for x in flat[35:]]
    assert segment_starts([math.log(x) for x in shifted]) == [35]
    outlier = [*flat[:30], flat[30] * 1.5, *flat[31:]]  # one bad night is not a change
    assert segment_starts([math.log(x) for x in outlier]) == []
    assert segment_starts([1.0, 2.0, 3.0]) == []  # too short to search


def _series_of(steps: list[float]) -> Series:
    pts = tuple(Point(i, x, {"verify": 0.7 * x, "draft": 0.25 * x, "unaccounted": 0.01},
                      3.0, "SAME", False, None) for i, x in enumerate(steps))  # fmt: skip
    return Series("t.py::test_d", "ctx=1 kv=contiguous bs=1", "e", pts)


def test_new_change_points_are_those_the_last_run_brought():
    """A shift is a change point once MIN_SIZE (2) runs show it: it is new on that night,
    and not on the nights after."""
    rng = random.Random(5)
    old = [40 * rng.gauss(1, 0.01) for _ in range(40)]

    def shifted(at: int) -> Series:
        return _series_of(old[:at] + [x * 1.1 for x in old[at:]])

    assert {cp.index for cp in change_points(shifted(15))} == {15}
    assert new_change_points(shifted(15)) == []  # found long ago
    assert new_change_points(shifted(39)) == []  # one run at the new level: not yet
    fresh = new_change_points(shifted(38))  # the second run at the new level: tonight
    assert {cp.metric for cp in fresh} == {"step", "verify", "draft"}
    assert {cp.index for cp in fresh} == {38}
    assert new_change_points(shifted(37)) == []  # already named yesterday
    assert {cp.index for cp in new_change_points(shifted(37), last_runs=2)} == {37}
    [step] = [cp for cp in fresh if cp.metric == "step"]
    assert isinstance(step, ChangePoint) and 0.05 < step.change < 0.15
    assert step.describe().startswith(f"step +{step.change * 100:.1f}% (40 -> 43")


def _bad_store(store: Path, tmp_path: Path) -> Path:
    """A copy of ``store`` with a corrupt, a truncated, a foreign file, a newer schema
    version, a pytest-benchmark run of user benchmarks only, and a broken case."""
    bad = tmp_path / "bad"
    shutil.copytree(store, bad)
    machine = next(bad.iterdir())
    good = json.loads(next(machine.glob("0001_*.json")).read_text())
    (machine / "9001_corrupt.json").write_bytes(b"\x00\xff garbage")
    text = json.dumps(good)
    (machine / "9002_truncated.json").write_text(text[: len(text) // 2])
    (machine / "9003_foreign.json").write_text(json.dumps({"name": "another tool", "x": [1]}))
    (machine / "9004_newer.json").write_text(json.dumps({**good, "specperf": {
        **good["specperf"], "schema_version": 99}}))
    (machine / "9005_user_only.json").write_text(json.dumps(
        {k: v for k, v in good.items() if k != "specperf"}))
    broken = json.loads(text)
    del broken["benchmarks"][0]["extra_info"]["specperf"]["step_ms"]
    (machine / "9006_broken_case.json").write_text(json.dumps(broken))
    (machine / "9007_list.json").write_text("[1, 2, 3]")
    return bad


def test_bad_files_are_named_and_skipped(store, tmp_path):
    bad = _bad_store(store, tmp_path)
    h = load_history(bad)
    assert len(h.runs) == RUNS  # the good ones, all of them
    why = {Path(line.split(": ", 1)[0]).name: line.split(": ", 1)[1] for line in h.skipped}
    assert why["9001_corrupt.json"].startswith(("not JSON", "cannot read"))
    assert why["9002_truncated.json"].startswith("not JSON (truncated or corrupt?)")
    assert "not a pytest-specperf report" in why["9003_foreign.json"]
    assert why["9004_newer.json"].startswith("schema_version 99 is not one this pytest-specperf")
    assert "without pytest-specperf cases" in why["9005_user_only.json"]
    assert why["9006_broken_case.json"].startswith("cases[0]")
    assert "top level is not an object" in why["9007_list.json"]
    assert h.foreign == 3
    out = io.StringIO()
    assert cli.run(_args(bad, tmp_path / "out"), out) == 0
    assert "skipped " + str(bad) in out.getvalue() and "9004_newer.json" in out.getvalue()


def test_pictures_and_one_page(store, tmp_path):
    out_dir = tmp_path / "out"
    out = io.StringIO()
    assert cli.run(_args(store, out_dir, no_plots=False, svg=True, case="ctx=8192"), out) == 0
    pngs = sorted(p.name for p in out_dir.glob("*.png"))
    assert pngs == ["test_decode-ctx=8192-kv=contiguous-bs=1.png",
                    "test_decode-ctx=8192-kv=fragmented-bs=1.png"]
    assert all((out_dir / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert (out_dir / "test_decode-ctx=8192-kv=fragmented-bs=1.svg").read_text().count("<svg") == 1
    page = (out_dir / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "unaccounted +" in page and "2025-06-25" in page  # the stall, on its night
    assert f"trend pictures: 2 PNG and SVG in {out_dir}" in out.getvalue()


def test_markdown_names_the_change_points_of_the_last_night(store, tmp_path):
    """Cut the store where the stall has shown for two nights: that night's summary names
    it; the night after, it is no longer new."""
    for nights, expect_new in ((STALL_AT + 2, True), (STALL_AT + 3, False)):
        cut = tmp_path / f"cut{nights}"
        machine = next(store.iterdir())
        (cut / machine.name).mkdir(parents=True)
        for f in sorted(machine.glob("*.json"))[:nights]:
            shutil.copy(f, cut / machine.name / f.name)
        md = tmp_path / f"summary{nights}.md"
        md.write_text("earlier step output\n")
        assert cli.run(_args(cut, tmp_path / "o", markdown=md), io.StringIO()) == 0
        text = md.read_text()
        assert text.startswith("earlier step output\n### specperf history: ")  # appended
        row = "| test_decode ctx=8192 kv=fragmented bs=1 | reference tiny DFLASH | unaccounted +"
        assert (row in text) is expect_new, text
        assert ("No new change point in the runs of the last 20 h." in text) is not expect_new


def test_a_folder_of_reports_is_a_store_too(tmp_path):
    reports = _make(tmp_path / "reports", "--format", "report")
    h = load_history(reports)
    assert len(h.runs) == RUNS and {r.source for r in h.runs} == {"report"}
    assert h.runs[0].commit == __import__("hashlib").sha1(b"commit 0").hexdigest()
    s = _series(h, "test_decode ctx=8192 kv=fragmented bs=1")
    assert ("unaccounted", STALL_AT) in {(cp.metric, cp.index) for cp in change_points(s)}


def test_cli_errors(tmp_path, capsys):
    assert cli.run(_args(tmp_path / "nothing", tmp_path), io.StringIO()) == 2
    assert "no such store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        from pytest_specperf.__main__ import main

        main(["history", "--last", "0"])
    assert "invalid count '0'" in capsys.readouterr().err


def test_a_missing_extra_is_named(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ruptures", None)  # as if not installed
    assert cli.run(_args(store, tmp_path), io.StringIO()) == 2
    from pytest_specperf.install import install_hint

    assert install_hint("history") in capsys.readouterr().err


def test_last_nights_runs_are_those_within_the_window():
    from pytest_specperf.reporting.history import History, RunInfo, recent_points

    def run(stamp):
        return RunInfo(Path(f"{stamp}.json"), stamp, "c", False, "report")

    runs = (run("2026-05-01T02:00:00+00:00"), run("2026-05-02T02:00:00+00:00"),
            run("2026-05-02T03:10:00+00:00"))  # two runs last night: reference, SGLang
    reference = Series("t", "k", "reference", (Point(0, 40.0, {}, 3.0, "SAME", False, None),
                                               Point(1, 41.0, {}, 3.0, "SAME", False, None)))
    sglang = Series("t", "k", "sglang", (Point(0, 9.0, {}, 3.0, "SAME", False, None),
                                         Point(2, 9.1, {}, 3.0, "SAME", False, None)))
    skipped = Series("t", "k2", "reference", (Point(0, 40.0, {}, 3.0, "SAME", False, None),))
    h = History(Path("."), runs, (reference, sglang, skipped), ())
    assert [recent_points(h, s, 20) for s in (reference, sglang, skipped)] == [1, 1, 0]
    assert recent_points(h, reference, 30) == 2
    undated = History(Path("."), tuple(RunInfo(r.path, None, "c", False, "report") for r in runs),
                      h.series, ())
    assert [recent_points(undated, s, 20) for s in (reference, sglang, skipped)] == [0, 1, 0]


@pytest.mark.parametrize("command", ["history", "compare"])
def test_help(command, capsys):
    from pytest_specperf.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and f"usage: specperf {command}" in capsys.readouterr().out


def test_injected_runs_are_labelled_in_the_table(store, tmp_path):
    """A canary's run (``labels.inject``) says so in the table: its SLOWER is no news."""
    from pytest_specperf.reporting.history import history_rows

    copy = tmp_path / ".benchmarks"
    shutil.copytree(store, copy)
    newest = sorted(copy.rglob("*.json"))[-1]
    data = json.loads(newest.read_text())

    def label(node):  # every case of the run carries the canary's label
        if isinstance(node, dict):
            if "labels" in node and "key" in node:
                node["labels"] = {"inject": "verify=1.1"}
            for v in node.values():
                label(v)
        elif isinstance(node, list):
            for v in node:
                label(v)

    label(data)
    newest.write_text(json.dumps(data))
    h = load_history(copy)
    s = _series(h, "test_decode ctx=8192 kv=contiguous bs=1")
    rows = history_rows(h, s, 2)
    assert rows[-1][-1].endswith("[injected: verify=1.1]")
    assert "injected" not in rows[0][-1]


TEST_ID, CASE_KEY = "perf_tests/t.py::test_d", "ctx=8192 kv=contiguous bs=1"


def _nights(folder: Path, make_run, fp, *, processes: int, old: int, new: int,
            values: bool = True, slower_from: int | None = None) -> Path:  # fmt: skip
    """``old`` nightly reports as written before the centers were saved (a case's figures
    of its first server process; each process's values in ``runs``, or, without
    ``values``, the other processes' lost), then ``new`` reports with the centers. Each
    night measures the case in ``processes`` server processes: the first one 12% faster
    than the others (a process's own level: between-process noise, not a change);
    ``slower_from``: every process 10% slower from that night on (a change)."""
    from pytest_specperf.judging.judge import Case, judge_case
    from pytest_specperf.judging.verdict import Tolerances
    from pytest_specperf.store.report import report_payload, write_report

    folder.mkdir()
    for night in range(old + new):
        slow = 1.1 if slower_from is not None and night >= slower_from else 1.0
        scales = [slow * (1.0 if i == 0 else 1.12) for i in range(processes)]
        runs = [dataclasses.replace(make_run(seed=night + i, scale=x), server_pid=100 + i)
                for i, x in enumerate(scales)]  # fmt: skip
        case = Case(nodeid=TEST_ID, test=TEST_ID, key=CASE_KEY, fingerprint=fp,
                    run=dataclasses.replace(runs[0], siblings=tuple(runs[1:])),
                    tolerances=Tolerances(phase=0.07, step=0.25))  # fmt: skip
        payload = report_payload({"datetime": f"2026-11-{night + 1:02d}T02:00:00+00:00"},
                                 [judge_case(case, None, Path("b.yaml"))])  # fmt: skip
        if night < old:
            c = payload["cases"][0]
            del c["centers"], c["siblings"]
            if not values:
                for r in c["runs"][1:]:
                    del r["values"]
        write_report(folder / f"night{night:02d}.json", payload)
    return folder



def test_older_reports_of_several_processes_read_as_centers(tmp_path, make_run, reference_fp):
    """Reports from before the centers were saved hold each process's values (``runs``):
    their points are the same center as the newer reports' (the geometric mean of the
    processes' medians), so the history has no step where the format changed."""
    from pytest_specperf.store.report import read_report

    store = _nights(tmp_path / "n", make_run, reference_fp, processes=3, old=6, new=6)
    [s] = load_history(store).series
    newest = read_report(store / "night11.json").cases[0]
    assert s.points[-1].step_ms == newest.data["centers"]["now"]["step"]
    old = read_report(store / "night00.json").cases[0]
    medians = [r["values"]["step"] for r in old.data["runs"]]
    assert s.points[0].step_ms == pytest.approx(math.prod(medians) ** (1 / 3), rel=1e-9)
    assert s.points[0].step_ms > 1.05 * old.step_median_ms  # not the first process's
    for metric in ("step", "verify", "accept_len"):
        xs = s.values(metric)
        assert max(xs) / min(xs) < 1.04, (metric, xs)  # one level over all 12 nights
    assert not any(p.first_process for p in s.points)
    assert change_points(s) == []
    out = io.StringIO()
    assert cli.run(_args(store, tmp_path / "o"), out) == 0
    assert "*" not in out.getvalue() and "first server process" not in out.getvalue()


def test_first_process_figures_are_marked_and_not_a_change(tmp_path, make_run, reference_fp):
    """Where an older report kept the first process's figures alone, they are marked (the
    table, its note, the picture's page), and the change of kind is no change point,
    while a real change among the centers still is."""
    store = _nights(tmp_path / "n", make_run, reference_fp, processes=3, old=6, new=10,
                    values=False, slower_from=11)  # fmt: skip
    h = load_history(store)
    [s] = h.series
    first = [bool(p.first_process) for p in s.points]
    assert first == [True] * 6 + [False] * 10
    assert {"step", "verify", "accept_len"} <= s.points[0].first_process
    steps = s.values("step")
    assert steps[6] > 1.05 * steps[5]  # the kind changed: the first process is faster
    assert [(cp.metric, cp.index) for cp in change_points(s) if cp.metric == "step"] == [
        ("step", 11)]  # fmt: skip
    out = io.StringIO()
    assert cli.run(_args(store, tmp_path / "o", last=16), out) == 0
    text = out.getvalue()
    rows = [line for line in text.splitlines() if line.startswith("2026-11-")]
    assert [("*" in r) for r in rows] == first
    assert f"{steps[0]:.2f}*" in rows[0]
    note = ("* the first server process's figure, not the center over the case's processes: "
            "the report(s) of 2026-11-01 02:00, 2026-11-02 02:00, 2026-11-03 02:00, "
            "2026-11-04 02:00, 2026-11-05 02:00 and 1 more saved no center of it nor every "
            "process's value (change points are searched within figures of one kind)")  # fmt: skip
    assert note in text
    page = tmp_path / "p"
    assert cli.run(_args(store, page, no_plots=False), io.StringIO()) == 0
    assert html.escape(note) in (page / "index.html").read_text()


def test_a_one_process_history_reads_the_figures_as_saved(tmp_path, make_run, reference_fp):
    """One server process: its figures are the center, in either format; nothing is marked
    and nothing computed from the rounded per-process values."""
    from pytest_specperf.store.report import read_report

    store = _nights(tmp_path / "n", make_run, reference_fp, processes=1, old=3, new=3)
    [s] = load_history(store).series
    for p, f in zip(s.points, sorted(store.glob("*.json")), strict=True):
        c = read_report(f).cases[0]
        assert p.step_ms == c.step_median_ms and p.phase_ms["verify"] == c.median_ms("verify")
        assert p.first_process == frozenset()
    out = io.StringIO()
    assert cli.run(_args(store, tmp_path / "o"), out) == 0
    assert "*" not in out.getvalue() and "first server process" not in out.getvalue()
