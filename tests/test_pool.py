"""The session's server processes (``--specperf-processes``), with test doubles."""

from __future__ import annotations

import pytest

from pytest_specperf.judging.noise import MAX_PROCESSES
from pytest_specperf.server.pool import ServerPool
from pytest_specperf.server.supervisor import ServerStartError


class FakeServer:
    """Stands in for a ModelServer: a fingerprint, a pid, a stop that can fail."""

    def __init__(self, pid, fingerprint=None, fail_stop=False):
        self.fingerprint = fingerprint or {"backend": "reference", "config": "tiny"}
        self.server_info = {"pid": pid}
        self.process = None
        self.stopped = False
        self.fail_stop = fail_stop

    def stop(self):
        self.stopped = True
        if self.fail_stop:
            raise RuntimeError(f"server {self.server_info['pid']} would not stop")


def test_more_servers_start_on_first_need_and_stay():
    started = []

    def start(index):
        started.append(index)
        return FakeServer(100 + index)

    pool = ServerPool(FakeServer(101), start, limit=MAX_PROCESSES)
    assert [s.server_info["pid"] for s in pool.servers(1)] == [101] and started == []
    assert [s.server_info["pid"] for s in pool.servers(3)] == [101, 102, 103]
    assert pool.servers(2) == pool.started[:2] and started == [2, 3]  # none started again
    assert pool.pids() == (101, 102, 103)
    with pytest.raises(ValueError, match="processes must be from 1 to 16, got 17"):
        pool.servers(17)


def test_a_server_of_another_engine_is_refused():
    pool = ServerPool(
        FakeServer(1), lambda i: FakeServer(i, {"backend": "sglang"}), limit=MAX_PROCESSES
    )
    with pytest.raises(ServerStartError, match="server process 2 runs another engine"):
        pool.servers(2)
    pool.stop()
    assert all(s.stopped for s in pool.started)  # the odd one is torn down too


def test_every_server_is_stopped_even_when_one_fails():
    first = FakeServer(1)
    pool = ServerPool(first, lambda i: FakeServer(i, fail_stop=i == 2), limit=MAX_PROCESSES)
    servers = pool.servers(3)
    with pytest.raises(RuntimeError, match="server 2 would not stop"):
        pool.stop()
    assert all(s.stopped for s in servers)


def test_a_server_that_does_not_start_is_named_with_the_way_out():
    def start(index):
        raise ServerStartError("CUDA out of memory")

    pool = ServerPool(FakeServer(1), start, limit=MAX_PROCESSES)
    with pytest.raises(
        ServerStartError,
        match=r"server process 2 of 3 did not start: CUDA out "
        r"of memory; .*--specperf-history",
    ):
        pool.servers(3)
