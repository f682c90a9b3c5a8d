"""Migration of older baseline files on read, by ``schema_version``: v1 (one summary per
metric and case) and v2 (every metric on its own line) files, both the development box's
real baselines as those schemas recorded them. Every case judges exactly as it did, and
only an update rewrites the file, as v4 (schema 4 adds each run's sitting and host and a
case's not_gated mark; a case's layout is v3's)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_specperf.judging.baselines import CaseBaseline, CaseProblem, Identity, keeps_blocks
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import Tolerances, case_disturbance, judge_gate, noisiest_phase
from pytest_specperf.probe.phases import CORE_PHASES, UNACCOUNTED
from pytest_specperf.store.baselines import (
    BaselineError,
    dump_baselines,
    load_any_schema,
    migrate_baselines,
    write_baselines,
)

#: The development box's baseline as schema 1 recorded it (commit 4a9f183), kept as the
#: migration fixture since baselines/cpu-amd-epyc-2c.yaml is re-recorded in later schemas.
V1 = Path(__file__).resolve().parent / "data" / "baselines-v1-cpu-amd-epyc-2c.yaml"
#: The same box's baseline as schema 2 recorded it (commit bdea9d0): three runs (server
#: processes) for 7 cases, one for 3, with the CPU-time medians and run-queue share.
V2 = Path(__file__).resolve().parent / "data" / "baselines-v2-cpu-amd-epyc-2c.yaml"
REF = Identity("reference", "tiny", None, "DFLASH")
#: Every gate a default or marker-chosen verdict can use on a CPU case.
GATES = ("step", UNACCOUNTED, "accept_len", "tokens_per_s", *CORE_PHASES)


def _v1_cases() -> list[tuple[str, str, dict[str, Summary]]]:
    data = yaml.safe_load(V1.read_text())
    assert data["schema_version"] == 1
    return [
        (test, key, {m: Summary.from_dict(s, m) for m, s in case["metrics"].items()})
        for test, per in data["cases"].items()
        for key, case in per.items()
    ]


def _scaled(s: Summary, f: float) -> Summary:
    return dataclasses.replace(
        s, median=s.median * f, mean=s.mean * f, blocks=tuple(b * f for b in s.blocks)
    )


def _now(v1: dict[str, Summary]) -> dict[str, Summary]:
    """A run that moved: verify 30% slower and scattered, draft 10% faster."""
    now = dict(v1)
    for name in ("verify", "verify/rest", "step", "step/ref"):
        now[name] = _scaled(v1[name], 1.3)
    for name in ("draft", "draft/rest"):
        now[name] = _scaled(v1[name], 0.9)
    wobble = [1.0, 1.2, 0.8, 1.1, 0.9, 1.15, 0.85, 1.05, 0.95]
    vr = now["verify/rest"]
    now["verify/rest"] = dataclasses.replace(
        vr, blocks=tuple(b * w for b, w in zip(vr.blocks, wobble))
    )
    return now


def test_the_v1_file_loads_as_one_identity_with_one_run_per_case():
    before = V1.read_bytes()
    bf = load_any_schema(V1)
    assert bf is not None and bf.version == 1 and bf.case_count() == 10
    assert bf.identities() == [REF] and bf.problems() == []
    case = bf.lookup(REF, "perf_tests/test_decode.py::test_decode", "ctx=46000 kv=fragmented bs=1")
    assert isinstance(case, CaseBaseline) and len(case.runs) == 1 and case.steps == 32
    assert (
        case.recorded_at.startswith("2026-11-29T")
        and case.fingerprint["config_hash"] == "1a92d7839362"
    )
    assert V1.read_bytes() == before  # reading never rewrites


def test_migrated_cases_keep_every_value_and_judged_block():
    bf = load_any_schema(V1)
    checked = 0
    for test, key, v1 in _v1_cases():
        migrated = bf.lookup(REF, test, key).metrics
        assert set(migrated) == set(v1)
        for m, s in v1.items():
            assert migrated[m].value == s.value and migrated[m].center == s.center, (key, m)
            if keeps_blocks(m):
                assert migrated[m].blocks == s.blocks, (key, m)
                checked += 1
            else:
                assert migrated[m].blocks == ()
    assert checked == 10 * 12  # step, step/ref, unaccounted, accept_len, tokens/s, 7 x <phase>/rest


@pytest.mark.parametrize(
    "tol", [Tolerances(phase=0.07, step=0.25), Tolerances(phase=0.02, step=0.02)]
)
def test_migrated_cases_judge_identically(tol):
    bf = load_any_schema(V1)
    verdicts = set()
    for test, key, v1 in _v1_cases():
        migrated = bf.lookup(REF, test, key).metrics
        now = _now(v1)
        for gate in GATES:
            a, b = judge_gate(gate, v1, now, tol), judge_gate(gate, migrated, now, tol)
            assert dataclasses.asdict(a) == dataclasses.asdict(b), (key, gate)
            verdicts.add(a.verdict)
        assert case_disturbance(migrated, now) == case_disturbance(v1, now)
        assert noisiest_phase(migrated) == noisiest_phase(v1)
    assert len(verdicts) >= 2  # the comparison saw more than one outcome


def test_migrated_file_dumps_as_compact_v4(tmp_path):
    text = dump_baselines(load_any_schema(V1))
    assert text.startswith("schema_version: 4\n")
    lines = len(text.splitlines())
    print(
        f"\nv1 file: {len(V1.read_text().splitlines())} lines; as v3: {lines} lines (10 cases, 1 run each)"
    )
    assert lines < 350
    path = tmp_path / "v2.yaml"
    path.write_text(text)
    again = load_any_schema(path)
    for case in load_any_schema(V1).all_cases():
        assert again.lookup(REF, case.test, case.key).metrics == case.metrics


def test_an_update_refuses_v1_until_it_is_migrated_keeping_every_case(tmp_path, make_case):
    path = tmp_path / "cpu-amd-epyc-2c.yaml"
    shutil.copy(V1, path)
    before = path.read_bytes()
    old = load_any_schema(path)
    with pytest.raises(BaselineError, match="specperf migrate"):
        write_baselines(path, old.device, [make_case(test="perf_tests/new.py::test_x")])
    assert path.read_bytes() == before
    assert migrate_baselines(path).written
    result = write_baselines(path, old.device, [make_case(test="perf_tests/new.py::test_x")])
    assert result.case_count() == 11 and result.notes == ()
    new = load_any_schema(path)
    assert new.version == 4
    for case in old.all_cases():
        kept = new.lookup(REF, case.test, case.key)
        assert kept.metrics == case.metrics and kept.runs == case.runs


def test_a_bad_v1_case_is_a_problem_and_dropped_with_a_note_on_migration(tmp_path, make_case):
    data = yaml.safe_load(V1.read_text())
    per = data["cases"]["perf_tests/test_decode.py::test_decode"]
    per["ctx=8192 kv=contiguous bs=1"]["metrics"]["step"]["median"] = -1
    per["ctx=8192 kv=fragmented bs=1"]["metrics"] = {}
    path = tmp_path / "v1.yaml"
    path.write_text(yaml.safe_dump(data))
    bf = load_any_schema(path)
    neg = bf.lookup(REF, "perf_tests/test_decode.py::test_decode", "ctx=8192 kv=contiguous bs=1")
    empty = bf.lookup(REF, "perf_tests/test_decode.py::test_decode", "ctx=8192 kv=fragmented bs=1")
    assert (
        isinstance(neg, CaseProblem) and "metrics.step.median: must be > 0, got -1" in neg.message
    )
    assert (
        isinstance(empty, CaseProblem)
        and "metrics: missing required metric(s) step" in empty.message
    )
    result = migrate_baselines(path)
    assert result.cases == 8  # 10 less the two invalid ones
    assert [n.split("]")[0] + "]" for n in result.notes] == [
        "dropped invalid v1 case perf_tests/test_decode.py::test_decode [ctx=8192 kv=contiguous bs=1]",
        "dropped invalid v1 case perf_tests/test_decode.py::test_decode [ctx=8192 kv=fragmented bs=1]",
    ]


# -- schema v2 ---------------------------------------------------------------------------


def _entry_sizes(text: str) -> list[tuple[int, int]]:
    """(runs, lines) of every case entry, in file order (a case key line ``ctx=...:`` to
    the next line as shallow), in a v2 or v3 file written by the package."""
    data = yaml.safe_load(text)
    runs = [
        len(case["runs"])
        for entry in data["engines"].values()
        for per in entry["cases"].values()
        for case in per.values()
    ]
    lines = text.splitlines()
    sizes = []
    for i, line in enumerate(lines):
        if not line.strip().startswith("ctx="):
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (
            len(lines[j]) - len(lines[j].lstrip()) > indent
            or lines[j].startswith(" " * indent + "-")
        ):
            j += 1
        sizes.append(j - i)
    assert len(sizes) == len(runs)
    return list(zip(runs, sizes))


def test_the_v2_file_loads_as_it_is_and_dumps_as_v4_with_every_value(tmp_path):
    before = V2.read_bytes()
    old = load_any_schema(V2)
    assert old.version == 2 and old.case_count() == 10 and old.problems() == []
    assert V2.read_bytes() == before  # reading never rewrites
    text = dump_baselines(old)
    assert text.startswith("schema_version: 4\n")
    path = tmp_path / "v3.yaml"
    path.write_text(text)
    new = load_any_schema(path)
    assert new.version == 4 and new.problems() == []
    for case in old.all_cases():
        again = new.lookup(REF, case.test, case.key)
        assert again.runs == case.runs and again.steps == case.steps, case.key
        assert again.fingerprint == case.fingerprint
    # the reviewable size: a case of 3 runs with every CPU figure
    v2 = [n for runs, n in _entry_sizes(V2.read_text()) if runs == 3]
    v3 = [n for runs, n in _entry_sizes(text) if runs == 3]
    print(f"\nlines per case of 3 runs: v2 {sorted(v2)}, v3 {sorted(v3)}")
    assert len(v3) == 7 and max(v3) <= 40


@pytest.mark.parametrize(
    "tol", [Tolerances(phase=0.07, step=0.25), Tolerances(phase=0.02, step=0.02)]
)
def test_v2_cases_judge_identically_after_migration_and_an_update(tmp_path, make_case, tol):
    path = tmp_path / "cpu-amd-epyc-2c.yaml"
    shutil.copy(V2, path)
    old = load_any_schema(path)
    migrate_baselines(path)
    write_baselines(path, old.device, [make_case(test="perf_tests/new.py::test_x")])
    new = load_any_schema(path)
    assert new.version == 4 and new.case_count() == 11
    for case in old.all_cases():
        kept = new.lookup(REF, case.test, case.key)
        now = {m: _scaled(s, 1.3 if m.startswith("verify") else 1.0)
               for m, s in case.metrics.items()}  # fmt: skip
        for gate in GATES:
            a, b = judge_gate(gate, case.metrics, now, tol), judge_gate(gate, kept.metrics, now, tol)
            assert dataclasses.asdict(a) == dataclasses.asdict(b), (case.key, gate)


def test_an_untouched_v3_entry_is_written_exactly_as_it_was(tmp_path, make_case):
    path = tmp_path / "cpu.yaml"
    path.write_text(dump_baselines(load_any_schema(V2)))
    before = path.read_text()
    write_baselines(path, {}, [make_case(fingerprint={**make_case().fingerprint, "config": "x"})])
    after = path.read_text()
    assert after != before
    head = before.split("engines:\n", 1)[1]
    assert head in after  # the reference entry's text, byte for byte
