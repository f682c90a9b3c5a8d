"""The HTTP client's timeouts and the attach-mode diagnosis, against real sockets."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from rawhttp import serve

from pytest_specperf.server.client import (
    ServerClient,
    ServerHTTPError,
    ServerUnreachable,
    attach_problem,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose socket accepts connections (in the backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _NotFound(_Quiet):
    def do_GET(self) -> None:
        self.send_error(404)


class _OtherJSON(_Quiet):
    def do_GET(self) -> None:
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def not_found_url() -> Iterator[str]:
    yield from serve(_NotFound)


@pytest.fixture
def other_json_url() -> Iterator[str]:
    yield from serve(_OtherJSON)


def _timed(url: str, **kw: object) -> tuple[str | None, float]:
    t0 = time.monotonic()
    msg = attach_problem(url, **kw)  # type: ignore[arg-type]
    return msg, time.monotonic() - t0


def test_attach_problem_refused() -> None:
    msg, dt = _timed(f"http://127.0.0.1:{_free_port()}")
    assert msg is not None and msg.startswith("connection refused: nothing listens at http://")
    assert dt < 2


def test_attach_problem_timed_out_within_the_deadline(silent_port: int) -> None:
    msg, dt = _timed(f"http://127.0.0.1:{silent_port}", deadline_s=1.5)
    assert msg is not None and msg.startswith("timed out: ")
    assert "within 1.5 s" in msg
    assert 1.4 < dt < 3.0


def test_attach_problem_http_status(not_found_url: str) -> None:
    msg, dt = _timed(not_found_url)
    assert msg is not None and msg.startswith(f"HTTP 404 from GET {not_found_url}/server_info")
    assert "<" not in msg  # the HTML error page reduced to its words
    assert dt < 2


def test_attach_problem_not_a_specperf_server(other_json_url: str) -> None:
    msg, _ = _timed(other_json_url)
    assert msg == (
        f"not a specperf server: GET {other_json_url}/server_info lacks version "
        "(a reference or SGLang server reports them)"
    )


def test_attach_problem_a_trickling_server_is_cut_at_the_deadline() -> None:
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)

        def trickle() -> None:
            conn, _ = lsock.accept()
            with conn:
                conn.recv(4096)
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
                    try:
                        conn.send(bytes([byte]))
                    except OSError:
                        return
                    time.sleep(0.1)

        threading.Thread(target=trickle, daemon=True).start()
        msg, dt = _timed(f"http://127.0.0.1:{lsock.getsockname()[1]}", deadline_s=1.0)
    assert msg is not None and msg.startswith("timed out: ")
    assert dt < 2.0


def test_client_errors_say_refused_or_read_timeout(silent_port: int) -> None:
    with pytest.raises(ServerUnreachable, match="connection refused"):
        ServerClient(f"http://127.0.0.1:{_free_port()}").get("/health")
    t0 = time.monotonic()
    with pytest.raises(ServerUnreachable, match=r"timed out after 0.5 s waiting for the answer"):
        ServerClient(f"http://127.0.0.1:{silent_port}", timeout=0.5).get("/health")
    assert time.monotonic() - t0 < 2


def test_client_reads_html_errors_as_one_line(not_found_url: str) -> None:
    with pytest.raises(ServerHTTPError) as e:
        ServerClient(not_found_url).get("/server_info")
    assert e.value.status == 404 and "\n" not in e.value.message and "404" in e.value.message
