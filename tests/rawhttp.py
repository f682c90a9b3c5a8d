"""Raw-socket HTTP for tests that send what no HTTP library would, and the servers tests
share: the reference server (launched, or run to see it refuse its arguments) and a
throwaway HTTP server for a handler class."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specperf.server.client import ServerClient
from pytest_specperf.server.supervisor import ServerProcess, free_port


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Exchange:
    """What came back for one connection: responses in order, and whether it was closed."""

    responses: list[Response]
    closed: bool
    seconds: float


#: The reference server's command line, before its flags.
REFERENCE_SERVER = (sys.executable, "-m", "pytest_specperf.engines.reference.server")


def launch_reference(work: Path, *flags: str) -> tuple[ServerProcess, ServerClient]:
    """Start a reference server (tiny config, CPU, one thread) and wait until it generates."""
    port = free_port()
    cmd = [
        *REFERENCE_SERVER,
        "--port",
        str(port),
        "--run-dir",
        str(work / "run"),
        "--threads",
        "1",
        "--device",
        "cpu",
        "--quiet",
        *flags,
    ]
    proc = ServerProcess(cmd, log_path=work / "server.log", name="reference server")
    proc.start()
    client = ServerClient(f"http://127.0.0.1:{port}", timeout=120)
    proc.wait_ready(client, deadline_s=120)
    return proc, client


def run_reference(
    *flags: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the reference server with ``flags`` that it refuses at start-up; its exit code
    and output (``env``: added to this process's environment)."""
    return subprocess.run(
        [*REFERENCE_SERVER, *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free local port in a thread; yields its URL (a fixture body:
    ``yield from serve(...)``), shut down after."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def address(client: ServerClient) -> tuple[str, int]:
    host, port = client.base_url.removeprefix("http://").split(":")
    return host, int(port)


def parse_responses(data: bytes) -> tuple[list[Response], bytes]:
    """Complete responses (framed by Content-Length) at the start of ``data``, and the rest."""
    out: list[Response] = []
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            return out, data
        lines = data[:head_end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status == 100:
            data = data[head_end + 4 :]
            continue
        n = int(headers.get("content-length", "0"))
        body_start = head_end + 4
        if len(data) < body_start + n:
            return out, data
        out.append(Response(status, headers, data[body_start : body_start + n]))
        data = data[body_start + n :]


def exchange(
    addr: tuple[str, int],
    parts: list[bytes] | bytes,
    *,
    pause_s: float = 0.0,
    half_close: bool = True,
    wait_s: float = 5.0,
    head_only: bool = False,
) -> Exchange:
    """Send ``parts`` (pausing between them), then read until the peer closes or
    ``wait_s`` passed."""
    if isinstance(parts, bytes):
        parts = [parts]
    t0 = time.monotonic()
    with socket.create_connection(addr, timeout=wait_s) as sock:
        try:
            for i, part in enumerate(parts):
                if i and pause_s:
                    time.sleep(pause_s)
                sock.sendall(part)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed early: read what it said
        data, closed = _read_all(sock, t0 + wait_s)
    if head_only:  # a HEAD response: Content-Length describes a body that is not sent
        responses = _heads(data)
    else:
        responses, _ = parse_responses(data)
    return Exchange(responses, closed, time.monotonic() - t0)


def _read_all(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, False
        except OSError:
            return data, True  # reset: closed
        if not chunk:
            return data, True
        data += chunk


def _heads(data: bytes) -> list[Response]:
    out = []
    for block in data.split(b"\r\n\r\n"):
        if not block.startswith(b"HTTP/"):
            continue
        lines = block.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        out.append(Response(int(lines[0].split(" ")[1]), headers))
    return out


def thread_count(pid: int) -> int:
    """Threads of process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError(f"no thread count for pid {pid}")
