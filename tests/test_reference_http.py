"""The reference server's HTTP hardening, over real sockets: limits, timeouts, methods."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rawhttp import address, exchange, launch_reference, run_reference, thread_count

from pytest_specperf.server.client import ServerClient, ServerHTTPError, attach_problem

TIMEOUT_S = 1.0
needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="counts threads through /proc (Linux)"
)
MAX_CONNECTIONS = 50
MAX_BODY = 65536


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerClient, int]]:
    work = tmp_path_factory.mktemp("refhttp")
    proc, client = launch_reference(
        work,
        "--max-body-bytes",
        str(MAX_BODY),
        "--http-timeout",
        str(TIMEOUT_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
    )
    assert proc.pid is not None
    yield client, proc.pid
    proc.stop()


def _settle(pid: int, baseline: int, within_s: float) -> int:
    end = time.monotonic() + within_s
    while True:
        n = thread_count(pid)
        if n <= baseline or time.monotonic() > end:
            return n
        time.sleep(0.1)


@pytest.mark.parametrize("n", [40_000, 3_000_000])  # just over the limit; 9 MB
def test_the_plugins_client_sees_413_not_a_broken_pipe(
    server: tuple[ServerClient, int], n: int
) -> None:
    client, _ = server
    body = json.dumps({"input_ids": [1] * n}).encode()
    # The standard library's client stops at a broken pipe: it sees the 413 only if the
    # server reads the body it refuses.
    conn = http.client.HTTPConnection(*address(client), timeout=30)
    conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413 and resp.getheader("Connection") == "close"
    assert json.loads(resp.read())["error"]["code"] == 413
    conn.close()
    with pytest.raises(ServerHTTPError) as e:
        client.post("/generate", {"input_ids": [1] * n})
    assert e.value.status == 413
    assert f"exceeds the limit of {MAX_BODY} bytes (--max-body-bytes)" in e.value.message
    assert client.get("/health") == {"status": "ok"}


@needs_proc
def test_forty_stalled_connections_time_out_and_free_their_threads(
    server: tuple[ServerClient, int],
) -> None:
    client, pid = server
    baseline = _settle(pid, 0, 0)
    before = client.server_info()["http_counters"]["timeouts"]
    socks = []
    for _ in range(40):
        s = socket.create_connection(address(client), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Stalled: ")  # and nothing more
        socks.append(s)
    t0 = time.monotonic()
    assert client.get("/health", timeout=5) == {"status": "ok"}  # still serving
    assert time.monotonic() - t0 < TIMEOUT_S  # answered before any stalled one timed out
    after = _settle(pid, baseline, TIMEOUT_S + 3)
    answers = []
    for s in socks:
        with s:
            answers.append(s.recv(4096))
    assert after <= baseline, f"{after} threads, {baseline} before the stalled connections"
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers)
    body = json.loads(answers[0].split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == 408 and "deadline" in body["error"]["message"]
    assert client.server_info()["http_counters"]["timeouts"] >= before + 40


def test_a_dripping_client_is_cut_at_the_request_deadline(
    server: tuple[ServerClient, int],
) -> None:
    client, _ = server
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Drip: " + b"a" * 100
    drip = [head[i : i + 1] for i in range(len(head))]  # one byte every 50 ms: 6.6 s
    ex = exchange(address(client), drip, pause_s=0.05, half_close=False, wait_s=10)
    assert ex.responses and ex.responses[0].status == 408
    assert ex.seconds < TIMEOUT_S + 2


@needs_proc
def test_connections_over_the_cap_get_503_at_once(server: tuple[ServerClient, int]) -> None:
    client, pid = server
    baseline = _settle(pid, 0, 0)
    socks = []
    for _ in range(MAX_CONNECTIONS + 10):
        s = socket.create_connection(address(client), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        socks.append(s)
    time.sleep(0.3)
    assert thread_count(pid) <= baseline + MAX_CONNECTIONS
    refused = []
    for s in socks:
        s.settimeout(0.2)
        try:
            data = s.recv(4096)
        except TimeoutError:
            continue
        if data.startswith(b"HTTP/1.1 503 "):
            refused.append(json.loads(data.split(b"\r\n\r\n", 1)[1]))
    for s in socks:
        s.close()
    assert len(refused) >= 10
    assert f"more than {MAX_CONNECTIONS} connections open" in refused[0]["error"]["message"]
    _settle(pid, baseline, TIMEOUT_S + 3)
    assert client.get("/health") == {"status": "ok"}


def test_a_get_body_is_drained_not_parsed_as_a_request(server: tuple[ServerClient, int]) -> None:
    client, _ = server
    smuggled = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
    ex = exchange(
        address(client),
        b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        b"GET /get_model_info HTTP/1.1\r\nHost: x\r\n\r\n" % (len(smuggled), smuggled),
    )
    assert [r.status for r in ex.responses] == [200, 200]
    assert ex.responses[1].json()["is_generation"] is True


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/generate", "POST"),
        ("DELETE", "/generate", "POST"),
        ("PATCH", "/specperf/kv_layout", "POST"),
        ("OPTIONS", "/generate", "POST"),
        ("GET", "/generate", "POST"),
        ("POST", "/health", "GET"),
        ("TRACE", "/server_info", "GET"),
    ],
)
def test_other_methods_get_405_json_with_allow(
    server: tuple[ServerClient, int], method: str, path: str, allow: str
) -> None:
    client, _ = server
    ex = exchange(address(client), f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    (resp,) = ex.responses
    assert resp.status == 405 and resp.headers["allow"] == allow
    assert resp.headers["content-type"] == "application/json"
    assert resp.json()["error"] == {
        "message": f"{path} accepts {allow}, not {method}",
        "code": 405,
    }


def test_head_gets_405_headers_without_a_body(server: tuple[ServerClient, int]) -> None:
    client, _ = server
    ex = exchange(address(client), b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n", head_only=True)
    (resp,) = ex.responses
    assert resp.status == 405 and resp.headers["allow"] == "GET"
    assert resp.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"[" * 5000 + b"]" * 5000, "nested deeper than 32 levels"),
        (b'{"input_ids": ' + b"[" * 40 + b"1" + b"]" * 40 + b"}", "nested deeper than 32 levels"),
        (b'{"input_ids": [' + b"7" * 5001 + b"]}", "integer literal of 5001 characters"),
        (b'{"context_len": 123456789012345678901234}', "integer literal of 24 characters"),
        (b'{"context_len": 1e999}', "number 1e999 is out of range"),
        (b'{"context_len": NaN}', "NaN is not JSON"),
        (b'{"context_len": 5, "context_len": 6}', "duplicate key 'context_len'"),
    ],
)
def test_deep_and_huge_json_is_400(
    server: tuple[ServerClient, int], body: bytes, fragment: str
) -> None:
    client, _ = server
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    (resp,) = exchange(address(client), head + body).responses
    assert resp.status == 400 and fragment in resp.json()["error"]["message"]


def test_attach_problem_accepts_the_reference_server(server: tuple[ServerClient, int]) -> None:
    client, _ = server
    assert attach_problem(client.base_url, required=("fingerprint", "config", "run_dir")) is None
    msg = attach_problem(client.base_url, required=("model_path",))
    assert msg is not None and msg.startswith("not a specperf server: ")


def test_bad_http_flags_are_one_error_line(tmp_path: Path) -> None:
    out = run_reference("--device", "cpu", "--port", "0", "--http-timeout", "0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip() == "error: --http-timeout must be a positive number of seconds, got 0.0"
    )
