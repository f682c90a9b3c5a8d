"""Writes step records to a per-run directory and reads them back.

Each process (each tensor-parallel rank of an SGLang server, or the reference server)
appends JSON lines to its own file ``steps-rank<R>-pid<P>.jsonl``. Lines are written in
small batches outside the timed part of a step and flushed to the OS at every batch, so
the files can be read while the server runs and after it dies; a torn last line (a
process killed mid-write) is skipped by the reader.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pytest_specperf.probe.record import StepRecord

#: Records are written when this many are buffered, or when the oldest is this old.
_BATCH_RECORDS = 64
_BATCH_SECONDS = 0.25


def make_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) private to this user (mode 0700) and return it.

    An existing directory is accepted only if it is a real directory owned by us; its
    mode is tightened to 0700.
    """
    run_dir = Path(path)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(run_dir)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"run directory {run_dir} is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"run directory {run_dir} is owned by uid {st.st_uid}, not by us")
    os.chmod(run_dir, 0o700)
    return run_dir


class RunDirSink:
    """Append-only JSON-lines sink for one process."""

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int = 0) -> None:
        self.run_dir = make_run_dir(run_dir)
        self.rank = rank
        self.path = self.run_dir / f"steps-rank{rank}-pid{os.getpid()}.jsonl"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file: IO[str] = os.fdopen(fd, "a", encoding="utf-8")
        self._buffer: list[str] = []
        self._oldest = 0.0

    def write(self, record: StepRecord) -> None:
        if not self._buffer:
            self._oldest = time.monotonic()
        self._buffer.append(json.dumps(record.to_json(), separators=(",", ":")))
        if len(self._buffer) >= _BATCH_RECORDS or time.monotonic() - self._oldest > _BATCH_SECONDS:
            self.flush()

    def write_meta(self, name: str, data: dict[str, Any]) -> None:
        """Write a small JSON document (engine fingerprint, hook report) beside the records."""
        target = self.run_dir / f"{name}-rank{self.rank}.json"
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, target)

    def flush(self) -> None:
        if self._buffer:
            self._file.write("\n".join(self._buffer) + "\n")
            self._buffer.clear()
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


def iter_records(run_dir: str | os.PathLike[str]) -> Iterator[StepRecord]:
    """Yield every complete record under ``run_dir``, file by file, in write order."""
    for path in sorted(Path(run_dir).glob("steps-rank*-pid*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # torn write from a process that died mid-line
                line = line.strip()
                if line:
                    yield StepRecord.from_json(json.loads(line))


def read_records(
    run_dir: str | os.PathLike[str], *, rids: set[str] | None = None, mode: str = "decode"
) -> list[StepRecord]:
    """Records of ``mode`` steps whose batch contained one of ``rids`` (all if None)."""
    out = []
    for rec in iter_records(run_dir):
        if rec.mode != mode:
            continue
        if rids is not None and not rids.intersection(rec.rids):
            continue
        out.append(rec)
    out.sort(key=lambda r: (r.wall_ns, r.rank, r.step))
    return out


class RecordTail:
    """Incremental reader of a run directory: each ``poll`` parses only new lines."""

    def __init__(self, run_dir: str | os.PathLike[str], *, from_end: bool = False) -> None:
        """With ``from_end``, records already in the files are skipped without parsing."""
        self.run_dir = Path(run_dir)
        self._offsets: dict[Path, int] = {}
        if from_end:
            for path in self.run_dir.glob("steps-rank*-pid*.jsonl"):
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                except OSError:
                    continue
                self._offsets[path] = data.rfind(b"\n") + 1

    def poll(self) -> list[StepRecord]:
        out: list[StepRecord] = []
        for path in sorted(self.run_dir.glob("steps-rank*-pid*.jsonl")):
            start = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    chunk = fh.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            for line in chunk[: end + 1].splitlines():
                if line.strip():
                    try:
                        out.append(StepRecord.from_json(json.loads(line)))
                    except (ValueError, KeyError, TypeError, IndexError) as e:
                        raise ValueError(f"{path}: unreadable step record: {e}") from None
            self._offsets[path] = start + end + 1
        return out
