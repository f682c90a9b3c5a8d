"""Whose processes are on the GPU: ours (the test process, the server and its children) or
someone else's.

NVML lists the compute processes holding a context on a device by PID. A PID is *own* when
it is one of the registered PIDs (by default the current process; the plugin adds the
server's PID) or a descendant of one (SGLang runs its scheduler in child processes), found by
walking ``PPid`` in ``/proc/<pid>/status``. A PID that is not visible in this process's
``/proc`` is *unresolved*: typically NVML reports host PIDs while we run in a container with
its own PID namespace, so we cannot tell whose it is. Everything else is *foreign*.

Limitation: inside a PID namespace a host PID may collide with an unrelated container PID
and be misclassified; run with the host PID namespace (``--pid=host``) for exact answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

PidClass = Literal["own", "foreign", "unresolved"]

#: Longest parent chain followed before giving up (guards against a /proc loop).
MAX_ANCESTRY = 64


def parent_pid(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """``PPid`` of ``pid`` from ``<proc_root>/<pid>/status``; None if it cannot be read."""
    try:
        text = (proc_root / str(pid) / "status").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("PPid:"):
            try:
                return int(line.split(":", 1)[1].strip())
            except ValueError:
                return None
    return None


class ProcessClassifier:
    """Classifies GPU process PIDs as own, foreign or unresolved (see module docstring).

    Results are memoised per instance (one measurement window), so ``/proc`` is read once
    per PID, not once per sample.
    """

    def __init__(self, own_pids: Iterable[int], proc_root: Path = Path("/proc")) -> None:
        self._own = set(own_pids)
        self._proc_root = proc_root
        self._cache: dict[int, PidClass] = {}

    @property
    def own_pids(self) -> frozenset[int]:
        return frozenset(self._own)

    def add_own_pid(self, pid: int) -> None:
        """Register one more PID as ours (and, by extension, its descendants)."""
        self._own.add(pid)
        self._cache.clear()

    def classify(self, pid: int) -> PidClass:
        cached = self._cache.get(pid)
        if cached is not None:
            return cached
        result = self._classify(pid)
        self._cache[pid] = result
        return result

    def _classify(self, pid: int) -> PidClass:
        if pid in self._own:
            return "own"
        parent = parent_pid(pid, self._proc_root)
        if parent is None:
            return "unresolved"
        for _ in range(MAX_ANCESTRY):
            if parent in self._own:
                return "own"
            if parent <= 1:
                break
            next_parent = parent_pid(parent, self._proc_root)
            if next_parent is None or next_parent == parent:
                break
            parent = next_parent
        return "foreign"
