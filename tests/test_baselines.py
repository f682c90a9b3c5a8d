"""Baseline store: round trip, merge semantics, atomic writes, refusal of bad files."""

from __future__ import annotations

import os

import pytest
import yaml

from pytest_specperf.judging.baselines import (
    SCHEMA_VERSION,
    BaselineError,
    CaseBaseline,
    dump_baselines,
    fingerprint_mismatch,
    load_baselines,
    write_baselines,
)
from pytest_specperf.judging.stats import summarize

FP = {
    "backend": "reference",
    "engine_version": "0.1.0",
    "config": "tiny",
    "speculative_algorithm": "DFLASH",
    "num_draft_tokens": 8,
}


def _case(test="perf_tests/t.py::test_d", key="ctx=8192 kv=contiguous bs=1", scale=1.0):
    samples = [scale * (10 + i % 3) / 3 for i in range(16)]
    blocks = [i // 4 for i in range(16)]
    return CaseBaseline(
        test=test,
        key=key,
        context_len=8192,
        kv_layout="contiguous",
        batch_size=1,
        fingerprint=dict(FP),
        recorded_at="2026-11-29T10:00:00+00:00",
        steps=16,
        metrics={
            "step": summarize(samples, blocks),
            "verify": summarize([s / 2 for s in samples], blocks),
        },
    )


def test_round_trip(tmp_path):
    path = tmp_path / "cpu-x-2c.yaml"
    written = write_baselines(path, {"name": "X", "kind": "cpu"}, [_case()])
    loaded = load_baselines(path)
    assert loaded is not None
    c = loaded.get("perf_tests/t.py::test_d", "ctx=8192 kv=contiguous bs=1")
    assert c is not None
    assert c.metrics["step"].median == pytest.approx(
        written.cases[c.test][c.key].metrics["step"].median, rel=1e-5
    )  # 6 significant digits
    assert c.metrics["step"].blocks == pytest.approx(_case().metrics["step"].blocks, rel=1e-5)
    assert c.fingerprint == FP
    text = path.read_text()
    assert text.startswith("cases:") and f"schema_version: {SCHEMA_VERSION}" in text
    assert "blocks: [" in text  # short number lists stay on one line
    assert dump_baselines(loaded) == text  # stable: re-dumping changes nothing


def test_update_keeps_unmeasured_cases_and_replaces_measured(tmp_path):
    path = tmp_path / "b.yaml"
    write_baselines(path, {}, [_case(key="A"), _case(key="B"), _case(test="other::t", key="C")])
    before = yaml.safe_load(path.read_text())
    write_baselines(path, {"name": "new"}, [_case(key="B", scale=2.0)])
    after = yaml.safe_load(path.read_text())
    t = "perf_tests/t.py::test_d"
    assert after["cases"][t]["A"] == before["cases"][t]["A"]
    assert after["cases"]["other::t"]["C"] == before["cases"]["other::t"]["C"]
    assert after["cases"][t]["B"]["metrics"]["step"]["median"] == pytest.approx(
        2 * before["cases"][t]["B"]["metrics"]["step"]["median"], rel=1e-5
    )
    assert after["device"] == {"name": "new"}


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "b.yaml"
    write_baselines(path, {}, [_case(key="A")])
    original = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_baselines(path, {}, [_case(key="B")])
    assert path.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.yaml"]


def test_missing_file_is_none(tmp_path):
    assert load_baselines(tmp_path / "nope.yaml") is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cases: [unclosed", "malformed YAML"),
        (
            "schema_version: 2\ncases: {}\n",
            "schema_version: is 2, this pytest-specperf reads version 1",
        ),
        ("cases: {}\n", "schema_version: is None"),
        ("- a list\n", "top level: expected a mapping"),
        (
            "schema_version: 1\ncases: {t: {k: {context_len: '8192'}}}\n",
            "context_len: expected int",
        ),
        (
            "schema_version: 1\ncases: {t: {k: {context_len: 1, batch_size: 1, steps: 1, kv_layout: c,"
            " recorded_at: x, fingerprint: {}, metrics: {step: {n: 1, median: .nan}}}}}\n",
            "metrics.step: missing",
        ),
        ("!!python/object/apply:os.system ['echo pwned']\n", "refused: the file uses a YAML tag"),
    ],
)
def test_bad_files_are_refused_with_the_file_named(tmp_path, text, fragment):
    path = tmp_path / "cpu.yaml"
    path.write_text(text)
    with pytest.raises(BaselineError) as e:
        load_baselines(path)
    assert str(path) in str(e.value) and fragment in str(e.value)


def test_python_tag_is_never_executed_and_file_untouched(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "cpu.yaml"
    path.write_text(
        f"schema_version: 1\ncases: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    before = path.read_bytes()
    for action in (lambda: load_baselines(path), lambda: write_baselines(path, {}, [_case()])):
        with pytest.raises(BaselineError, match="refused"):
            action()
    assert not marker.exists()
    assert path.read_bytes() == before


def test_fingerprint_mismatch_lists_fields():
    now = dict(FP, engine_version="0.2.0", torch_version="other")
    assert fingerprint_mismatch(FP, now) == ["engine_version: baseline '0.1.0', now '0.2.0'"]
