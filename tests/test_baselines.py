"""Baseline store (schema v3): round trip, runs kept per case, identities kept apart,
compact entries, what an update moved, atomic writes, refusal of bad files and cases."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import yaml
from e2e import column

from pytest_specperf.judging.baselines import (
    SCHEMA_VERSION,
    CaseBaseline,
    CaseProblem,
    Identity,
    fingerprint_mismatch,
    identity_of,
)
from pytest_specperf.judging.stats import Summary, stable
from pytest_specperf.judging.verdict import Tolerances, Verdict, judge_gate
from pytest_specperf.store.baselines import (
    BaselineError,
    Moved,
    dump_baselines,
    format_moved,
    load_baselines,
    write_baselines,
)

TEST = "perf_tests/t.py::test_d"
KEY = "ctx=8192 kv=contiguous bs=1"
REF = Identity("reference", "tiny", None, "DFLASH")
SGLANG_FP = {
    "backend": "sglang",
    "version": "0.5.23",
    "model": "/models/Qwen3-8B",
    "draft_model": "/models/Qwen3-8B-DFlash",
    "speculative_algorithm": "DFLASH",
    "dtype": "bfloat16",
    "cuda_graphs": True,
}


def _engine(path: Path, name: str = "reference tiny DFLASH") -> dict:
    return yaml.safe_load(path.read_text())["engines"][name]


def _case_lines(text: str, key: str) -> int:
    """Lines of one case's entry in the file (its key line to the next line as shallow)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"{key}:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(
        (
            j
            for j in range(start + 1, len(lines))
            if len(lines[j]) - len(lines[j].lstrip()) <= indent
            and not lines[j].startswith(" " * indent + "-")
        ),
        len(lines),
    )
    return end - start


def test_round_trip(tmp_path, make_case):
    path = tmp_path / "cpu-x-2c.yaml"
    case = make_case(pid=4711)
    result = write_baselines(path, {"name": "X", "kind": "cpu"}, [case])
    assert result.target == path and result.recorded == 1 and result.case_count() == 1
    loaded = load_baselines(path)
    assert loaded is not None and loaded.version == SCHEMA_VERSION
    got = loaded.lookup(REF, TEST, KEY)
    assert isinstance(got, CaseBaseline)
    assert got.identity == REF and got.fingerprint == case.fingerprint and got.steps == 16
    assert [(r.pid, r.at) for r in got.runs] == [(4711, case.recorded_at)]
    for m, s in case.metrics.items():
        assert got.metrics[m].value == s.value == stable(s.value)
        assert got.metrics[m].blocks == s.blocks
    assert (
        got.metrics["verify/rest"].blocks and not got.metrics["verify"].blocks
    )  # judged form only
    text = path.read_text()
    assert text.startswith(f"schema_version: {SCHEMA_VERSION}\n")
    assert (
        "    identity: {backend: reference, model: tiny, draft_model: null, algorithm: DFLASH}"
        in text
    )
    assert "            step: [" in text  # number lists stay on one line
    assert dump_baselines(loaded) == text  # stable: re-dumping changes nothing


def test_update_appends_runs_and_keeps_everything_else(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    write_baselines(
        path, {}, [make_case(key="A"), make_case(key="B"), make_case(test="other::t", key="C")]
    )
    before = _engine(path)
    write_baselines(path, {"name": "new"}, [make_case(key="B", scale=2.0)])
    after = _engine(path)
    assert after["cases"][TEST]["A"] == before["cases"][TEST]["A"]
    assert after["cases"]["other::t"]["C"] == before["cases"]["other::t"]["C"]
    b_old, b_new = before["cases"][TEST]["B"], after["cases"][TEST]["B"]
    assert len(b_new["runs"]) == 2 and b_new["runs"][0] == b_old["runs"][0]
    assert column(b_new, "step")[0] == column(b_old, "step")[0]
    assert column(b_new, "step")[1] == pytest.approx(2 * column(b_old, "step")[0], rel=1e-3)
    assert yaml.safe_load(path.read_text())["device"] == {"name": "new"}


def test_keep_last_k_runs_newest_last(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    for pid in range(1, 8):
        result = write_baselines(path, {}, [make_case(pid=pid, scale=1 + pid / 100)], keep_runs=3)
    case = load_baselines(path).lookup(REF, TEST, KEY)
    assert [r.pid for r in case.runs] == [5, 6, 7]
    assert result.moved[0].runs == 3
    assert case.metrics["step"].value == case.runs[-1].values["step"]  # the latest run
    assert case.run_metrics(0)["step"].value < case.metrics["step"].value
    with pytest.raises(ValueError, match="keep_runs must be from 1 to 64, got 0"):
        write_baselines(path, {}, [make_case()], keep_runs=0)


def test_several_runs_in_one_update_pool_in_order(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    result = write_baselines(path, {}, [make_case(pid=p) for p in (1, 2, 3)])
    assert [r.pid for r in load_baselines(path).lookup(REF, TEST, KEY).runs] == [1, 2, 3]
    assert len(result.moved) == 1 and result.moved[0].runs == 3 and result.recorded == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            dict(fingerprint_change={"engine_version": "0.2.0"}),
            "engine fingerprint changed: engine_version '0.1.0' -> '0.2.0'",
        ),
        (dict(steps=24), "steps per run changed: 16 -> 24"),
    ],
)
def test_a_changed_engine_or_step_count_starts_over(
    tmp_path, make_case, reference_fp, change, reason
):
    path = tmp_path / "b.yaml"
    write_baselines(path, {}, [make_case(pid=1), make_case(pid=2)])
    fp = dict(reference_fp, **change.pop("fingerprint_change", {}))
    result = write_baselines(path, {}, [make_case(pid=3, fingerprint=fp, **change)])
    case = load_baselines(path).lookup(REF, TEST, KEY)
    assert [r.pid for r in case.runs] == [3]  # runs of another engine are never pooled
    assert result.moved[0].started_over == reason
    assert list(_engine(path)["fingerprints"]) == [case.fingerprint_hash]  # unused ones dropped


def test_identities_never_read_or_overwrite_each_other(tmp_path, make_case):
    path = tmp_path / "nvidia-h200.yaml"
    write_baselines(path, {}, [make_case(pid=1)])
    write_baselines(path, {}, [make_case(pid=2, fingerprint=SGLANG_FP, scale=3.0)])
    sglang_before = _engine(path, "sglang /models/Qwen3-8B draft=/models/Qwen3-8B-DFlash DFLASH")
    write_baselines(path, {}, [make_case(pid=3)])
    bf = load_baselines(path)
    ref, sgl = bf.lookup(REF, TEST, KEY), bf.lookup(identity_of(SGLANG_FP), TEST, KEY)
    assert [r.pid for r in ref.runs] == [1, 3] and [r.pid for r in sgl.runs] == [2]
    assert (
        sgl.fingerprint == SGLANG_FP and sgl.metrics["step"].value > 2.5 * ref.metrics["step"].value
    )
    assert (
        _engine(path, "sglang /models/Qwen3-8B draft=/models/Qwen3-8B-DFlash DFLASH")
        == sglang_before
    )
    other_model = identity_of(dict(SGLANG_FP, model="/models/Llama-3.1-8B"))
    assert bf.lookup(other_model, TEST, KEY) is None
    assert sorted(i.key for i in bf.identities()) == [
        "reference tiny DFLASH",
        "sglang /models/Qwen3-8B draft=/models/Qwen3-8B-DFlash DFLASH",
    ]


def test_identity_derivation():
    assert (
        identity_of({"backend": "reference", "config": "tiny", "speculative_algorithm": "DFLASH"})
        == REF
    )
    ident = identity_of(SGLANG_FP)
    assert ident.to_dict() == {
        "backend": "sglang",
        "model": "/models/Qwen3-8B",
        "draft_model": "/models/Qwen3-8B-DFlash",
        "algorithm": "DFLASH",
    }
    assert identity_of({"backend": "sglang", "model": "m"}).key == "sglang m -"
    with pytest.raises(ValueError, match="no backend name"):
        identity_of({"config": "tiny"})


def test_compact_entry_is_at_most_40_lines_with_3_runs(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    for pid in (1, 2, 3):
        write_baselines(path, {}, [make_case(pid=pid)])
    n = _case_lines(path.read_text(), KEY)
    print(f"\nlines per case with 3 runs (CPU metrics): {n}")
    assert n <= 40


def test_what_moved(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    first = write_baselines(path, {}, [make_case(pid=1)])
    assert first.moved[0].old_step is None and first.moved[0].phase is None
    result = write_baselines(path, {}, [make_case(pid=2, factors={"verify": 1.5})])
    (moved,) = result.moved
    assert moved.old_step == first.moved[0].new_step and moved.new_step > moved.old_step
    phase, old, new = moved.phase
    assert phase == "verify" and new == pytest.approx(1.5 * old, rel=1e-3)
    assert moved.runs == 2 and moved.started_over is None


def test_format_moved_lines():
    moved = [
        Moved(
            "reference tiny DFLASH",
            "t.py::test_decode",
            "ctx=8192 kv=contiguous bs=1",
            2,
            48.58,
            48.71,
            ("verify", 37.76, 37.81),
            None,
        ),
        Moved(
            "reference tiny DFLASH",
            "t.py::test_decode",
            "ctx=46000 kv=fragmented bs=1",
            1,
            None,
            60.0,
            None,
            None,
        ),
        Moved(
            "reference tiny DFLASH",
            "t.py::test_decode",
            "ctx=2048 kv=contiguous bs=1",
            1,
            10.0,
            12.0,
            ("draft", 2.0, 4.0),
            "engine fingerprint changed: engine_version '0.1.0' -> '0.2.0'",
        ),
    ]
    assert format_moved(moved) == [
        "t.py::test_decode ctx=8192 kv=contiguous bs=1: step 48.58 -> 48.71 ms (+0.3%); "
        "verify 37.76 -> 37.81 ms (+0.1%); 2 runs",
        "t.py::test_decode ctx=46000 kv=fragmented bs=1: new, step 60.00 ms; 1 run",
        "t.py::test_decode ctx=2048 kv=contiguous bs=1: step 10.00 -> 12.00 ms (+20.0%); "
        "draft 2.00 -> 4.00 ms (+100.0%); 1 run; earlier runs dropped: engine fingerprint "
        "changed: engine_version '0.1.0' -> '0.2.0'",
    ]
    two = [moved[0], Moved("sglang m DFLASH", "t.py::x", "k", 1, None, 5.0, None, None)]
    assert format_moved(two)[1] == "[sglang m DFLASH] t.py::x k: new, step 5.00 ms; 1 run"


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch, make_case):
    path = tmp_path / "b.yaml"
    write_baselines(path, {}, [make_case(key="A")])
    original = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(BaselineError, match=r"disk full.*the file is unchanged"):
        write_baselines(path, {}, [make_case(key="B")])
    assert path.read_bytes() == original
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_refuses_to_record_an_invalid_measurement(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    bad = make_case()
    values = dict(bad.latest.values, step=math.nan)
    from pytest_specperf.judging.baselines import make_run as record

    bad = CaseBaseline(
        bad.test,
        bad.key,
        bad.identity,
        bad.fingerprint,
        bad.fingerprint_hash,
        bad.steps,
        (record(bad.latest.at, None, values, bad.latest.blocks),),
    )
    with pytest.raises(
        BaselineError, match=r"refusing to record .*: phases.step.ms: expected a finite number, got nan"
    ):
        write_baselines(path, {}, [bad])
    assert not path.exists()


def test_missing_file_is_none(tmp_path):
    assert load_baselines(tmp_path / "nope.yaml") is None


ENTRY = "engines: {e: {identity: {backend: reference, model: tiny, draft_model: null, algorithm: DFLASH}, "


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cases: [unclosed", "malformed YAML"),
        (
            "schema_version: 7\nengines: {}\n",
            "schema_version is 7: this pytest-specperf reads versions 1, 2, 3, 4. If a newer pytest-specperf wrote the file, upgrade",
        ),
        ("engines: {}\n", "schema_version is None"),
        ("schema_version: true\n", "schema_version is True"),
        ("- a list\n", "top level: expected a mapping, got a list of 1 item(s)"),
        ("schema_version: 4\nextra: 1\n", "top level: unknown field(s) extra"),
        (
            "schema_version: 4\nengines: {e: {identity: {backend: reference}}}\n",
            "engines['e'].identity: expected a mapping of exactly backend, model, draft_model and algorithm",
        ),
        (
            "schema_version: 4\n" + ENTRY + "fingerprints: {h: {backend: sglang}}}}\n",
            "engines['e'].fingerprints['h']: does not belong to this entry's identity (reference tiny DFLASH)",
        ),
        (
            "schema_version: 4\nengines: {a: &i {identity: {backend: r, model: m, draft_model: null, algorithm: null}}, b: *i}\n",
            "engines 'a' and 'b' have the same identity",
        ),
        (
            "!!python/object/apply:os.system ['echo pwned']\n",
            "refused: the file uses a YAML tag that safe loading does not allow",
        ),
        ("schema_version: 2\nengines: !!set {a}\n", "refused: the file uses a YAML tag"),
        ("schema_version: 2\nat: 2001-13-45\n", "cannot be read as plain data: ValueError"),
        (b"schema_version: 2\n\xff\xfe".decode("latin-1"), "malformed YAML"),
    ],
)
def test_bad_files_are_refused_with_the_file_named(tmp_path, text, fragment):
    path = tmp_path / "cpu.yaml"
    path.write_text(text)
    with pytest.raises(BaselineError) as e:
        load_baselines(path)
    assert str(e.value).startswith(f"{path}: ") and fragment in str(e.value)


def test_non_utf8_is_refused(tmp_path):
    path = tmp_path / "cpu.yaml"
    path.write_bytes(b"schema_version: 2\n\xff\n")
    with pytest.raises(BaselineError, match=r"is not UTF-8 text \(byte 18\)"):
        load_baselines(path)


def _corrupt(path: Path, edit) -> CaseProblem:
    data = yaml.safe_load(path.read_text())
    edit(data["engines"]["reference tiny DFLASH"]["cases"][TEST][KEY])
    path.write_text(yaml.safe_dump(data))
    got = load_baselines(path).lookup(REF, TEST, KEY)
    assert isinstance(got, CaseProblem), got
    return got


def _set(field, metric, value):
    def edit(case):
        if field == "blocks":
            case[field][metric] = value
        else:
            column(case, metric)[:] = []
            column(case, metric).extend(value)

    return edit


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (
            lambda c: c.update(value={}, phases={}),
            "phases/value: missing required metric(s) step, unaccounted, accept_len",
        ),
        (lambda c: c["phases"]["step"].pop("ms"), "phases/value: missing required metric(s) step"),
        (lambda c: c["value"].pop("accept_len"), "missing required metric(s) accept_len"),
        (_set("value", "step", [-1]), "phases.step.ms: must be > 0, got -1"),
        (_set("value", "verify", [-2.0]), "phases.verify.ms: must be >= 0, got -2"),
        (_set("value", "verify/rest", [0]), "phases.verify.rest: is 0 while verify takes"),
        (
            _set("value", "verify", [float("inf")]),
            "phases.verify.ms: expected a finite number, got inf",
        ),
        (_set("value", "tokens_per_s", [-3.0]), "value.tokens_per_s: must be >= 0, got -3"),
        (
            lambda c: c["phases"].update(speculate={"ms": [1.0]}),
            "phases: unknown step part 'speculate' (expected ingest, schedule,",
        ),
        (
            lambda c: c["phases"]["verify"].update(wall=[1.0]),
            "phases.verify: unknown field 'wall' (expected ms, rest, ref, cpu,",
        ),
        (
            lambda c: c["value"].update(verify=[1.0]),
            "value.verify: belongs in phases.verify.ms; move it there",
        ),
        (
            _set("blocks", "verify/rest", [[1.0, float("nan"), 1.0]]),
            "blocks.verify/rest: expected a finite number, got nan",
        ),
        (
            _set("value", "step", [1.0, 2.0]),
            "phases.step.ms: has 2 entries, expected one per run (1)",
        ),
        (_set("value", "step", ["fast"]), "phases.step.ms: expected a number, got 'fast'"),
        (_set("blocks", "step", [[1.0] * 5000]), "blocks.step: more than 4096 entries"),
        (
            lambda c: c.update(fingerprint="0000"),
            "fingerprint: '0000' is not among this engine's fingerprints",
        ),
        (lambda c: c.update(runs=[]), "runs: no runs"),
        (lambda c: c.update(steps=0), "steps: expected an integer from 1 to 10000000, got 0"),
        (lambda c: c.update(extra=1), "unknown field(s) extra"),
    ],
)
def test_a_bad_case_is_a_problem_naming_file_case_and_field(tmp_path, make_case, edit, fragment):
    path = tmp_path / "cpu.yaml"
    write_baselines(path, {}, [make_case(), make_case(key="other")])
    problem = _corrupt(path, edit)
    assert problem.message.startswith(f"{path}: reference tiny DFLASH: {TEST} [{KEY}]: ")
    assert fragment in problem.message
    assert "re-record it with --specperf-update-baselines" in problem.message
    assert isinstance(load_baselines(path).lookup(REF, TEST, "other"), CaseBaseline)  # others fine


def test_an_update_replaces_an_invalid_case_and_keeps_other_identities_raw(tmp_path, make_case):
    path = tmp_path / "cpu.yaml"
    write_baselines(path, {}, [make_case(), make_case(fingerprint=SGLANG_FP)])
    _corrupt(path, _set("value", "step", [-1]))
    sgl = "sglang /models/Qwen3-8B draft=/models/Qwen3-8B-DFlash DFLASH"
    bad_sglang = yaml.safe_load(path.read_text())
    column(bad_sglang["engines"][sgl]["cases"][TEST][KEY], "step")[:] = [0]  # also invalid
    path.write_text(yaml.safe_dump(bad_sglang))
    result = write_baselines(path, {}, [make_case(pid=9)])
    assert (
        "the stored entry was invalid (phases.step.ms: must be > 0, got -1)"
        in result.moved[0].started_over
    )
    bf = load_baselines(path)
    assert [r.pid for r in bf.lookup(REF, TEST, KEY).runs] == [9]
    assert _engine(path, sgl) == bad_sglang["engines"][sgl]  # not this run's: untouched
    assert isinstance(bf.lookup(identity_of(SGLANG_FP), TEST, KEY), CaseProblem)


def test_python_tag_is_never_executed_and_file_untouched(tmp_path, make_case):
    marker = tmp_path / "pwned"
    path = tmp_path / "cpu.yaml"
    path.write_text(
        f"schema_version: 2\nengines: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    before = path.read_bytes()
    for action in (lambda: load_baselines(path), lambda: write_baselines(path, {}, [make_case()])):
        with pytest.raises(BaselineError, match="refused"):
            action()
    assert not marker.exists()
    assert path.read_bytes() == before


def test_fingerprint_mismatch_lists_fields(reference_fp):
    now = dict(reference_fp, engine_version="0.2.0", torch_version="other")
    assert fingerprint_mismatch(reference_fp, now) == [
        "engine_version: baseline '0.1.0', now '0.2.0'"
    ]


def test_compact_summary_never_invents_a_spread():
    full = Summary(
        n=16,
        median=10.0,
        mean=10.2,
        stdev=1.0,
        mad=0.5,
        q10=9.0,
        q90=11.0,
        min=8.0,
        max=12.0,
        blocks=(9.8, 10.0, 10.3, 10.1),
    )
    compact = Summary.compact(10.0, full.blocks, 16)
    assert compact.value == 10.0 and compact.rel_se() == full.rel_se()  # from the blocks
    few = Summary.compact(10.0, (9.9, 10.1), 16)
    assert few.rel_se() == math.inf and few.rel_spread == math.inf  # unknown, not guessed
    assert few.to_dict() == {"n": 16, "median": 10.0, "blocks": [9.9, 10.1], "center": "median"}
    assert Summary.compact(3.1, (), 16, "mean").to_dict()["mean"] == 3.1
    tol = Tolerances(phase=0.07, step=0.25)
    now = {"step": Summary.compact(10.5, (10.4, 10.6), 16)}
    verdict = judge_gate("step", {"step": few}, now, tol)
    assert verdict.verdict is Verdict.UNSTABLE  # never SAME on an unknown noise


def test_stale_temp_files_of_its_own_naming_are_removed_and_reported(tmp_path, make_case):
    path = tmp_path / "b.yaml"
    write_baselines(path, {}, [make_case()])
    stale = [tmp_path / ".b.yaml.k2j4h1x9.tmp", tmp_path / ".b.yaml.zz.tmp"]
    others = [
        tmp_path / ".other.yaml.k2j4h1x9.tmp",
        tmp_path / "b.yaml.tmp",
        tmp_path / "notes.tmp",
    ]
    for p in stale + others:
        p.write_text("half a file")
    result = write_baselines(path, {}, [make_case(pid=2)])
    assert result.notes == (
        "removed 2 temporary file(s) left by an interrupted update: .b.yaml.k2j4h1x9.tmp, "
        ".b.yaml.zz.tmp",
    )
    assert not any(p.exists() for p in stale) and all(p.exists() for p in others)
    assert write_baselines(path, {}, [make_case(pid=3)]).notes == ()
