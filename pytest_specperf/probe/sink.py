"""Writes step records to a per-run directory and reads them back.

Each process (each tensor-parallel rank of an SGLang server, or the reference server)
appends JSON lines to its own file ``steps-rank<R>-pid<P>.jsonl``. Records are kept as
objects and serialized in small batches (serializing 64 records in a row runs with warm
caches, several times cheaper per record than one between two steps of model work),
written outside the timed part of a step and flushed to the OS at every batch, so the
files can be read while the server runs and after it dies; a torn last line (a process
killed mid-write) is skipped by the reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from pytest_specperf.probe.heartbeat import Heartbeat
from pytest_specperf.probe.record import StepRecord

#: Records are written when this many are buffered, or when the oldest is this old.
_BATCH_RECORDS = 64
_BATCH_SECONDS = 0.25
#: Names of the record files (one per process, numbered if a process opens several).
_RECORD_GLOB = "steps-rank*-pid*.jsonl"
#: A process whose record file name is taken tries this many numbered names after it.
_NAME_TRIES = 100
#: Flags for every file this module creates: never through a link, never an existing file.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_RUN_DIR_FIX = (
    "pass a directory that does not exist yet (it is created, mode 0700) or an empty one "
    "that you own"
)


class RunDirError(Exception):
    """A run directory that cannot safely hold step records; the message names the fix."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"run directory {os.fspath(path)} {problem}; {_RUN_DIR_FIX}")
        self.path = Path(path)
        self.problem = problem


def make_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` fresh and private (mode 0700), or accept it if it is empty and ours.

    Refused with :class:`RunDirError` (naming the path and the fix): a symbolic link, a
    non-directory, a directory owned by another user, or one that already holds files
    (records of another run would mix with this one's).
    """
    return _private_dir(path, must_be_empty=True)


def open_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create or check the run directory a sink writes to: a real directory of ours, 0700.

    Unlike :func:`make_run_dir` it may hold files already: the other ranks of one server
    write into the same directory.
    """
    return _private_dir(path, must_be_empty=False)


def _private_dir(path: str | os.PathLike[str], *, must_be_empty: bool) -> Path:
    run_dir = Path(path)
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        pass  # checked below, through a descriptor that does not follow links
    except OSError as e:
        raise RunDirError(run_dir, f"cannot be created ({e.strerror or e})") from None
    fd = _open_dir(run_dir)
    try:
        st = os.fstat(fd)
        uid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
        if st.st_uid != uid:
            raise RunDirError(run_dir, f"is owned by uid {st.st_uid}, not by this user ({uid})")
        if must_be_empty:
            entries = sorted(os.listdir(fd))
            if entries:
                shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
                raise RunDirError(
                    run_dir,
                    f"is not empty ({len(entries)} entries: {shown}): records of another "
                    "run would mix with this one's",
                )
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return run_dir


def _open_dir(run_dir: Path) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
    try:
        return os.open(run_dir, flags)
    except OSError as e:
        if os.path.islink(run_dir):
            raise RunDirError(run_dir, f"is a symbolic link (to {os.readlink(run_dir)})") from None
        if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
            raise RunDirError(run_dir, "exists and is not a directory") from None
        raise RunDirError(run_dir, f"cannot be opened ({e.strerror or e})") from None


def _create_private_file(path: Path) -> int:
    """Open a new file at ``path`` for writing (0600): never an existing file or a link."""
    return os.open(path, _CREATE_FLAGS, 0o600)


class RunDirSink:
    """Append-only JSON-lines sink for one process."""

    def __init__(self, run_dir: str | os.PathLike[str], *, rank: int = 0) -> None:
        self.run_dir = open_run_dir(run_dir)
        self.rank = rank
        fd, self.path = self._create(f"steps-rank{rank}-pid{os.getpid()}")
        self._file: IO[str] = os.fdopen(fd, "a", encoding="utf-8")
        #: records, or (builder, raw figures) pairs built when the batch is written
        self._buffer: list[StepRecord | tuple[Callable[[Any], StepRecord], Any]] = []
        self._oldest = 0.0
        #: records handed to the sink so far (the progress a heartbeat reports)
        self.added = 0
        self._heartbeat: Heartbeat | None = None

    def start_heartbeat(self) -> None:
        """Report this process's progress (steps handed in, CPU time) in the run directory
        every ``HEARTBEAT_S`` (``probe.heartbeat``), until :meth:`close`."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self.run_dir, lambda: self.added, rank=self.rank).start()

    def _create(self, stem: str) -> tuple[int, Path]:
        """A new record file: ``<stem>.jsonl``, or ``<stem>-<n>.jsonl`` if that is taken."""
        for n in range(_NAME_TRIES):
            path = self.run_dir / (f"{stem}.jsonl" if n == 0 else f"{stem}-{n}.jsonl")
            try:
                return _create_private_file(path), path
            except FileExistsError:
                continue  # an earlier sink of this process, or a planted file or link
            except OSError as e:
                raise RunDirError(self.run_dir, f"refuses {path.name} ({e.strerror})") from None
        raise RunDirError(self.run_dir, f"already holds {_NAME_TRIES} files named {stem}*")

    def write(self, record: StepRecord) -> None:
        self._add(record)

    def write_deferred(self, build: Callable[[Any], StepRecord], raw: Any) -> None:
        """A record that ``build(raw)`` makes when its batch is written: the work of making
        it leaves the decode step and is done batch by batch (measured: README, probe cost)."""
        self._add((build, raw))

    def _add(self, item: StepRecord | tuple[Callable[[Any], StepRecord], Any]) -> None:
        self.added += 1
        if not self._buffer:
            self._oldest = time.monotonic()
        self._buffer.append(item)
        if len(self._buffer) >= _BATCH_RECORDS or time.monotonic() - self._oldest > _BATCH_SECONDS:
            self.flush()

    def write_meta(self, name: str, data: dict[str, Any]) -> None:
        """Write a small JSON document (engine fingerprint, hook report) beside the records."""
        target = self.run_dir / f"{name}-rank{self.rank}.json"
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=self.run_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
            os.replace(tmp, target)  # replaces a link itself, never writes through it
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def flush(self) -> None:
        if self._buffer:
            records = (r if isinstance(r, StepRecord) else r[0](r[1]) for r in self._buffer)
            lines = [json.dumps(r.to_json(), separators=(",", ":")) for r in records]
            self._file.write("\n".join(lines) + "\n")
            self._buffer.clear()
        self._file.flush()

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if not self._file.closed:
            self.flush()
            self._file.close()


def iter_records(run_dir: str | os.PathLike[str]) -> Iterator[StepRecord]:
    """Yield every complete record under ``run_dir``, file by file, in write order."""
    for path in sorted(Path(run_dir).glob(_RECORD_GLOB)):
        data = _read_regular(path)
        if data is None:
            continue
        for raw in data.split(b"\n")[:-1]:  # the last piece: "" or a torn write
            line = raw.strip()
            if line:
                yield StepRecord.from_json(json.loads(line))


def _read_regular(path: Path, start: int = 0) -> bytes | None:
    """The bytes of ``path`` from ``start``; None for a link, a FIFO or a vanished file."""
    flags = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fh.seek(start)
        return fh.read()


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
            for path in self.run_dir.glob(_RECORD_GLOB):
                data = _read_regular(path)
                if data is not None:
                    self._offsets[path] = data.rfind(b"\n") + 1

    def poll(self) -> list[StepRecord]:
        out: list[StepRecord] = []
        for path in sorted(self.run_dir.glob(_RECORD_GLOB)):
            start = self._offsets.get(path, 0)
            chunk = _read_regular(path, start)
            if chunk is None:
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
