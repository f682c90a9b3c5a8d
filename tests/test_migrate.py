"""``specperf migrate``: an older schema's baseline file rewritten in the current one,
in place, every case kept; a current file left alone; a broken one refused unchanged."""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

import pytest
import yaml

from pytest_specperf.cli import migrate
from pytest_specperf.judging.baselines import SCHEMA_VERSION
from pytest_specperf.store.baselines import BaselineError, load_any_schema, load_baselines

DATA = Path(__file__).resolve().parent / "data"
V1 = DATA / "baselines-v1-cpu-amd-epyc-2c.yaml"
V2 = DATA / "baselines-v2-cpu-amd-epyc-2c.yaml"


def _run(*files: Path, check: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    status = migrate.run(argparse.Namespace(files=list(files), check=check), out)
    return status, out.getvalue()


def _metrics(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    bf = load_any_schema(path)
    assert bf is not None
    return {(c.test, c.key): {m: s.value for m, s in c.metrics.items()} for c in bf.all_cases()}


def test_older_files_are_rewritten_in_the_current_schema_keeping_every_case(tmp_path):
    for old, version in ((V1, 1), (V2, 2)):
        path = tmp_path / old.name
        shutil.copy(old, path)
        before = _metrics(path)
        status, said = _run(path)
        assert status == 0, said
        assert f"schema {version} -> {SCHEMA_VERSION}, migrated ({len(before)} case(s))" in said
        assert yaml.safe_load(path.read_text())["schema_version"] == SCHEMA_VERSION
        assert _metrics(path) == before
        status, said = _run(path)  # a second time: nothing to do
        assert status == 0 and f"schema {SCHEMA_VERSION}, current" in said


def test_check_writes_nothing_and_says_which_file_needs_it(tmp_path):
    path = tmp_path / "b.yaml"
    shutil.copy(V1, path)
    text = path.read_text()
    status, said = _run(path, check=True)
    assert status == 1 and "needs migrating" in said
    assert path.read_text() == text


def test_a_missing_or_broken_file_is_refused_and_left_as_it_was(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema_version: 99\n")
    status, said = _run(tmp_path / "absent.yaml", broken)
    assert status == 2
    assert "absent.yaml: no such file; nothing to migrate" in said
    assert "schema_version is 99" in said
    assert broken.read_text() == "schema_version: 99\n"
    assert not any(p.name.startswith("absent") for p in tmp_path.iterdir())  # no lock file


def test_the_command_is_dispatched(tmp_path):
    from pytest_specperf.cli.main import main

    path = tmp_path / "b.yaml"
    shutil.copy(V2, path)
    assert main(["migrate", "--check", str(path)]) == 1
    assert main(["migrate", str(path)]) == 0
    assert main(["migrate", "--check", str(path)]) == 0


def test_a_run_refuses_an_older_schema_naming_the_migration(tmp_path):
    """Outside ``specperf migrate`` a valid file of an older schema is refused, the message
    naming the command that fixes it; nothing on disk changes. After the migration the
    same file reads, with the same numbers."""
    for old, version in ((V1, 1), (V2, 2)):
        path = tmp_path / old.name
        shutil.copy(old, path)
        before = path.read_bytes()
        with pytest.raises(BaselineError) as e:
            load_baselines(path)
        assert f"schema_version is {version}, an older schema" in str(e.value)
        assert f"specperf migrate {path}" in str(e.value)
        assert path.read_bytes() == before
        numbers = _metrics(path)
        assert _run(path)[0] == 0
        bf = load_baselines(path)
        assert bf is not None
        assert {(c.test, c.key): {m: s.value for m, s in c.metrics.items()}
                for c in bf.all_cases()} == numbers  # fmt: skip
