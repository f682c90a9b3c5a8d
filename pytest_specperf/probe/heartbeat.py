"""The server's progress signal, and the client's watch over it.

Every server process that records steps (the reference server; each SGLang scheduler
rank, through its probe) keeps a small file ``progress-rank<R>-pid<P>.json`` in its run
directory, rewritten in place every ``HEARTBEAT_S`` by a daemon thread with the steps it
has recorded so far (prefill and decode) and its CPU time. The client polls these files
while a request runs: a server whose steps or CPU time advance is making progress (a long
prefill on a big model uses CPU, and on SGLang each prefill chunk is a step), however
slow it is; one where neither advanced for ``STALL_S`` is frozen (stopped, paused) or
hung on a lock. The per-request deadline stays as the backstop for a hang that burns CPU.

The file alone misses two kinds of work, so before calling a server stalled the watch also
reads the kernel's own account of the file's process (Linux ``/proc``, same machine):

- work done in its **child processes**: a first request on a cold compile cache waits for
  torch.compile's workers and the C++ compiler they run (Inductor on a CPU, Triton or JIT
  kernels on a GPU), for tens of seconds, while the scheduler itself uses no CPU;
- time spent **waiting for a CPU** (runnable, on a run queue): on a loaded or niced
  machine a working process may get under ``CPU_PROGRESS_S`` of CPU in ``STALL_S``, and
  its heartbeat thread may not get to write at all.

Both count as progress (:func:`tree_activity_s`). A stopped process (SIGSTOP) or one
blocked on a lock neither runs nor waits to run, in itself or in a child (past its
heartbeat thread's few milliseconds): still stalled. The file carries its process's start
time: where ``/proc`` shows another process under that pid (a server in another PID
namespace, a container with the run directory mounted), its tree is out of sight, and the
request's deadline alone judges it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Seconds between two writes of a process's progress file.
HEARTBEAT_S = 0.5
#: Seconds without progress after which a request's server counts as frozen.
STALL_S = 6.0
#: CPU seconds a process must have used since the last progress to count as working (a
#: frozen process uses none; an idle one a few ms in ``STALL_S``: its heartbeat, its HTTP
#: loop's wake-ups).
CPU_PROGRESS_S = 0.05
#: Clock ticks per second of ``/proc/<pid>/stat``'s CPU times.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Names of the progress files.
PROGRESS_GLOB = "progress-rank*-pid*.json"
#: Width every write pads its line to (so that a shorter line overwrites a longer one).
_LINE_BYTES = 256
_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


@dataclass(frozen=True)
class Progress:
    """One process's progress as its file last said: beats written, steps recorded, CPU
    seconds used."""

    beats: int
    steps: int
    cpu_s: float
    #: the process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    #: None from a server that does not write it: the watch reads ``/proc/<pid>`` as this
    #: process only when the two agree (a server in another PID namespace, a container
    #: with the run directory mounted, has a pid that names some other local process)
    start: int | None = None


class Heartbeat:
    """Writes one process's progress file every ``interval_s`` from a daemon thread."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        steps: Callable[[], int],
        *,
        rank: int = 0,
        interval_s: float = HEARTBEAT_S,
    ) -> None:
        self.path = Path(run_dir) / f"progress-rank{rank}-pid{os.getpid()}.json"
        self._fd = os.open(self.path, _FLAGS, 0o600)  # never an existing file or a link
        self._steps = steps
        self._start = start_ticks(str(os.getpid()))
        self._interval_s = interval_s
        self._beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specperf-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        """Write the progress line now (in place: the reader never sees an empty file)."""
        self._beats += 1
        line = json.dumps({
            "beats": self._beats, "steps": self._steps(),
            "cpu_s": round(time.process_time(), 4), "start": self._start,
        })  # fmt: skip
        os.pwrite(self._fd, line.ljust(_LINE_BYTES - 1).encode() + b"\n", 0)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(OSError):  # a full disk must not stop the server
                self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._interval_s)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _pid_of(name: str) -> int | None:
    """The pid a progress file is named after (None: not one of ours)."""
    try:
        return int(name.rsplit("-pid", 1)[1].split(".", 1)[0].split("-", 1)[0])
    except (ValueError, IndexError):
        return None


def _stat_fields(pid: str, proc: Path) -> list[bytes] | None:
    """The fields of ``<proc>/<pid>/stat`` after the process's name (index 0 is field 3,
    the state); None where it cannot be read (gone, not shown)."""
    try:
        raw = (proc / pid / "stat").read_bytes()
        return raw[raw.rindex(b")") + 2 :].split()
    except (OSError, ValueError):
        return None


def _stat(pid: str, proc: Path) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of ``pid`` from ``<proc>/<pid>/stat`` (None: gone): its
    own and that of its children it has waited for (a compiler that ran and exited keeps
    counting in its parent, so the tree's total does not drop when it is reaped)."""
    fields = _stat_fields(pid, proc)
    if fields is None:
        return None
    try:
        # ppid (index 1), utime (11), stime (12), cutime (13), cstime (14)
        return int(fields[1]), sum(int(f) for f in fields[11:15]) / _TICKS
    except (ValueError, IndexError):
        return None


def start_ticks(pid: str, proc: Path = Path("/proc")) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``<proc>/<pid>/stat`` field 22);
    None where ``proc`` does not show it."""
    fields = _stat_fields(pid, proc)
    if fields is None:
        return None
    try:
        return int(fields[19])
    except (ValueError, IndexError):
        return None


def _run_queue_s(pid: int, proc: Path) -> float:
    """Seconds the live threads of ``pid`` spent runnable without a CPU (schedstat)."""
    total = 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_bytes().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def tree_activity_s(
    pid: int, proc: Path = Path("/proc"), *, start: int | None = None
) -> float | None:
    """Seconds ``pid`` and its live descendants have run on a CPU or waited on a run
    queue for one (the kernel's account in ``proc``: ``stat`` CPU times, every thread's
    ``schedstat`` wait). It only grows while some process of the tree works or wants to;
    a frozen or blocked tree holds it still. None where ``proc`` does not show ``pid``
    (another machine, not Linux), or shows a process that did not start at ``start``
    (given: the progress file's; another PID namespace, where the number is another's)."""
    mine = _stat(str(pid), proc)
    if mine is None:
        return None
    if start is not None and start_ticks(str(pid), proc) != start:
        return None
    parents: dict[int, list[tuple[int, float]]] = {}
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        entries = []
    for name in entries:
        st = _stat(name, proc)
        if st is not None:
            parents.setdefault(st[0], []).append((int(name), st[1]))
    total = mine[1] + _run_queue_s(pid, proc)
    todo, seen = [pid], {pid}
    while todo:
        for child, cpu_s in parents.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
                total += cpu_s + _run_queue_s(child, proc)
    return total


def _gone(name: str) -> bool:
    """Whether the process a progress file is named after no longer exists (a file left
    by an earlier server in a reused run directory never advances: it is not watched)."""
    pid = _pid_of(name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: it exists
        return False
    return False


def read_progress(run_dir: str | os.PathLike[str]) -> dict[str, Progress]:
    """Every readable progress file of a live process in ``run_dir``, by file name (a
    torn or foreign file, or one whose process has ended, is left out)."""
    out = {}
    for path in sorted(Path(run_dir).glob(PROGRESS_GLOB)):
        if _gone(path.name):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
            try:
                raw = os.read(fd, _LINE_BYTES)
            finally:
                os.close(fd)
            d = json.loads(raw)
            start = d.get("start")
            out[path.name] = Progress(
                int(d["beats"]), int(d["steps"]), float(d["cpu_s"]),
                start if isinstance(start, int) and not isinstance(start, bool) else None,
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


class ProgressWatch:
    """When a server last made progress, as seen from the client: ``stalled_for`` says
    how long nothing advanced once that reaches ``stall_s``. Without any progress file
    (a server without the probe) it never says so: the request deadline alone applies."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None,
        stall_s: float = STALL_S,
        *,
        proc: Path = Path("/proc"),
    ) -> None:
        """``proc``: where the kernel's account of processes is read (``tree_activity_s``)."""
        self.run_dir = run_dir
        self.stall_s = stall_s
        self.proc = proc
        self._seen: dict[str, Progress] = {}
        self._since = time.monotonic()
        self.last: dict[str, Progress] = {}
        #: per progress file, the kernel's account of its process tree (tree_activity_s)
        #: when the file last stopped advancing, and as last read
        self._tree_from: dict[str, float] = {}
        self._tree_now: dict[str, float] = {}

    def _advanced(self, now: dict[str, Progress]) -> bool:
        for name, p in now.items():
            was = self._seen.get(name)
            if was is None or p.steps != was.steps or p.cpu_s - was.cpu_s >= CPU_PROGRESS_S:
                return True
        return False

    def _tree_active(self, now: dict[str, Progress]) -> bool:
        """Whether some watched process, or a child of it, ran on a CPU or waited for one
        for ``CPU_PROGRESS_S`` since its file stopped advancing (``tree_activity_s``)."""
        active = False
        for name, p in now.items():
            pid = _pid_of(name)
            if pid is None:
                continue
            start = start_ticks(str(pid), self.proc) if p.start is not None else None
            if start is not None and start != p.start:
                # /proc shows another process of that number: the server is in another PID
                # namespace (a container), its children out of sight. A cold compile there
                # leaves the file still for tens of seconds: only the deadline can judge it
                self._tree_now.pop(name, None)
                active = True
                continue
            tree = tree_activity_s(pid, self.proc)
            if tree is None:
                continue
            self._tree_now[name] = tree
            was = self._tree_from.setdefault(name, tree)
            if tree - was >= CPU_PROGRESS_S:
                self._tree_from[name] = tree
                active = True
            elif tree < was:  # a child reaped by a process outside the tree took its CPU
                self._tree_from[name] = tree
        return active

    def restart(self) -> None:
        """Count from now (a new request)."""
        self._since = time.monotonic()

    def stalled_for(self) -> float | None:
        """Seconds without progress, when there were at least ``stall_s`` of them."""
        if self.run_dir is None:
            return None
        now = read_progress(self.run_dir)
        self.last = now
        if not now:
            return None
        t = time.monotonic()
        if self._advanced(now):
            self._seen = now
            self._since = t
            self._tree_from.clear()
            self._tree_now.clear()
            return None
        idle = t - self._since
        # the kernel's account (a walk of /proc) only once the file has been still for two
        # of its writes (a quarter of the stall time at most): between two writes (every
        # HEARTBEAT_S) a decoding server's file looks still to most polls, and a walk per
        # poll would load the measurement. Growth a walk finds counts from when it is found,
        # so a freeze is seen at most this much later than STALL_S after the last work.
        if idle >= min(2 * HEARTBEAT_S, self.stall_s / 4) and self._tree_active(now):
            self._since = t
            return None
        return idle if idle >= self.stall_s else None

    def describe(self) -> str:
        """The progress files as last read, for a failure message."""
        parts = [
            f"{name}: {p.steps} steps, {p.cpu_s:.2f} s CPU, beat {p.beats}"
            + (
                f", with its child processes {self._tree_now[name] - self._tree_from[name]:.2f}"
                " s on or waiting for a CPU in the stall"
                if name in self._tree_now
                else ""
            )
            for name, p in sorted(self.last.items())
        ]
        return "; ".join(parts)[:400] or "no progress file"
