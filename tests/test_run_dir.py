"""Run directories: created fresh and private, refused with a clear error, never a link."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from rawhttp import run_reference

from pytest_specperf.probe import RunDirError, RunDirSink, StepProbe, make_run_dir, read_records
from pytest_specperf.probe.sink import RecordTail, open_run_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _one_step(sink: RunDirSink, rid: str) -> None:
    probe = StepProbe(sink)
    probe.begin_step(context_len=8, batch_size=1, rids=[rid])
    with probe.phase("verify"):
        pass
    probe.end_step(accepted_tokens=1)
    probe.close()


def test_make_run_dir_creates_a_fresh_private_directory(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "a" / "run")
    assert run_dir.is_dir() and _mode(run_dir) == 0o700


def test_an_empty_directory_of_ours_is_accepted_and_made_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    assert make_run_dir(run_dir) == run_dir
    assert _mode(run_dir) == 0o700


def test_a_non_empty_directory_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(run_dir, 0o755)
    (run_dir / "steps-rank0-pid1.jsonl").write_text("old\n")
    with pytest.raises(RunDirError) as e:
        make_run_dir(run_dir)
    msg = str(e.value)
    assert str(run_dir) in msg and "is not empty (1 entries: steps-rank0-pid1.jsonl)" in msg
    assert "pass a directory that does not exist yet" in msg  # the fix
    assert _mode(run_dir) == 0o755  # nothing changed on disk
    assert (run_dir / "steps-rank0-pid1.jsonl").read_text() == "old\n"


def test_a_symlinked_run_dir_is_refused_for_makers_and_sinks(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "run"
    link.symlink_to(target)
    for fn in (make_run_dir, open_run_dir, RunDirSink):
        with pytest.raises(RunDirError, match=r"run directory .*/run is a symbolic link \(to "):
            fn(link)
    assert list(target.iterdir()) == []  # nothing written through the link


def test_a_file_in_place_of_the_run_dir_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.write_text("x")
    with pytest.raises(RunDirError, match="exists and is not a directory"):
        make_run_dir(path)
    assert path.read_text() == "x"


def test_a_directory_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
    else:
        foreign = Path("/")  # owned by root: foreign to any other user
    with pytest.raises(RunDirError, match=r"is owned by uid \d+, not by this user"):
        open_run_dir(foreign)


def test_a_planted_symlink_never_redirects_the_sinks_writes(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = run_dir / f"steps-rank0-pid{os.getpid()}.jsonl"
    planted.symlink_to(victim)
    sink = RunDirSink(run_dir)
    assert sink.path != planted and sink.path.name == f"steps-rank0-pid{os.getpid()}-1.jsonl"
    _one_step(sink, "r1")
    assert victim.read_text() == "precious\n"
    assert [r.rids for r in read_records(run_dir)] == [["r1"]]  # the link is not read
    assert _mode(sink.path) == 0o600


def test_two_sinks_of_one_process_get_two_files(tmp_path: Path) -> None:
    a, b = RunDirSink(tmp_path), RunDirSink(tmp_path)
    assert a.path != b.path
    _one_step(a, "a")
    _one_step(b, "b")
    assert sorted(r.rids[0] for r in read_records(tmp_path)) == ["a", "b"]


def test_write_meta_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    sink = RunDirSink(tmp_path / "run")
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    (sink.run_dir / "server-rank0.json").symlink_to(victim)
    sink.write_meta("server", {"port": 1})
    target = sink.run_dir / "server-rank0.json"
    assert not target.is_symlink() and json.loads(target.read_text()) == {"port": 1}
    assert victim.read_text() == "{}"
    assert [p.name for p in sink.run_dir.iterdir() if p.name.endswith(".tmp")] == []
    sink.close()


def test_readers_skip_a_fifo_named_like_a_record_file(tmp_path: Path) -> None:
    sink = RunDirSink(tmp_path)
    _one_step(sink, "x")
    os.mkfifo(tmp_path / "steps-rank9-pid9.jsonl")  # opening it for reading would block
    assert [r.rids for r in read_records(tmp_path)] == [["x"]]
    assert len(RecordTail(tmp_path).poll()) == 1


@pytest.mark.parametrize("kind", ["not-empty", "symlink"])
def test_reference_server_refuses_a_bad_run_dir_with_one_clear_line(
    tmp_path: Path, kind: str
) -> None:
    run_dir = tmp_path / "run"
    if kind == "not-empty":
        run_dir.mkdir()
        (run_dir / "old.jsonl").write_text("")
    else:
        (tmp_path / "t").mkdir()
        run_dir.symlink_to(tmp_path / "t")
    out = run_reference("--port", "0", "--device", "cpu", "--run-dir", str(run_dir))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: --run-dir: run directory {run_dir} ")
    assert "pass a directory that does not exist yet" in out.stderr
