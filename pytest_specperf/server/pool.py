"""The session's server processes: the first one, and more started on first need.

``--specperf-processes N`` measures every case in N server processes, so that the
between-process part of the noise is measured, not assumed (``judging.noise``, whose
``MAX_PROCESSES`` the pool is given as its limit). The
processes are started once per session, one after the other, the first time a case needs
them, and all stay up until the session ends: every case then runs in every process, the
same way, in the same order. They must all run the same engine (same fingerprint).

All N are alive at once, each with its own KV pool: on one GPU, N servers of a big model
may not fit; a nightly job then takes the between-process part from its history
(``--specperf-history``) instead.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_specperf.server.model_server import ModelServer
from pytest_specperf.server.supervisor import ServerStartError

#: ``start(index)``: launch the ``index``-th server process (1-based; 1 is the first).
Starter = Callable[[int], ModelServer]


class ServerPool:
    """The first server and the extra ones, started on first need, stopped together."""

    def __init__(self, first: ModelServer, start: Starter, *, limit: int) -> None:
        """``limit``: the most processes a session may ask for."""
        self._servers = [first]
        self._start = start
        self._limit = limit

    @property
    def first(self) -> ModelServer:
        return self._servers[0]

    @property
    def started(self) -> tuple[ModelServer, ...]:
        return tuple(self._servers)

    def servers(self, n: int) -> tuple[ModelServer, ...]:
        """The first ``n`` servers, starting the missing ones; ``ServerStartError`` if one
        does not start or runs another engine than the first."""
        if not 1 <= n <= self._limit:
            raise ValueError(f"processes must be from 1 to {self._limit}, got {n}")
        while len(self._servers) < n:
            index = len(self._servers) + 1
            try:
                server = self._start(index)
            except ServerStartError as e:
                raise ServerStartError(
                    f"server process {index} of {n} did not start: {e}; the {n} processes "
                    "run at once (on one GPU they may not fit: take the noise between "
                    "processes from --specperf-history instead)"
                ) from None
            self._servers.append(server)
            if server.fingerprint != self.first.fingerprint:
                raise ServerStartError(
                    f"server process {len(self._servers)} runs another engine than the first: "
                    f"{server.fingerprint} != {self.first.fingerprint}"
                )
        return tuple(self._servers[:n])

    def pids(self) -> tuple[int, ...]:
        """The pids of every started server (telemetry counts them as ours)."""
        out = []
        for s in self._servers:
            if s.process is not None and s.process.pid:
                out.append(s.process.pid)
            pid = s.server_info.get("pid")
            if isinstance(pid, int) and not isinstance(pid, bool):
                out.append(pid)
        return tuple(sorted(set(out)))

    def stop(self) -> None:
        """Stop every server, the extra ones first (each is stopped even if one fails)."""
        errors: list[BaseException] = []
        for s in reversed(self._servers):
            try:
                s.stop()
            except BaseException as e:  # stop the others, then re-raise
                errors.append(e)
        if errors:
            raise errors[0]
