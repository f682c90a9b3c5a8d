"""Minimal JSON client for the subset of SGLang's native HTTP API the plugin uses.

Every call has a connect timeout (a host that accepts nothing fails fast) and a read
timeout (how long the answer may take: decode blocks are long on a CPU). Errors say which
of the two ran out, or that the connection was refused; :func:`attach_problem` tells
apart, within a deadline, the ways a URL can fail to be a usable server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterator
from typing import Any

#: Seconds to establish a connection.
CONNECT_TIMEOUT_S = 10.0
#: Default seconds to wait for an answer once connected (one decode block on a CPU).
READ_TIMEOUT_S = 600.0
#: Largest response body read; a larger one is an error, not a memory blow-up.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
#: Seconds :func:`attach_problem` takes at most to reach its verdict.
ATTACH_DEADLINE_S = 10.0
#: Longest timeout a call is given (a day): a deadline computed from a baseline's pace is
#: cut to it, so that no figure can overflow the socket layer's time arithmetic.
MAX_TIMEOUT_S = 86_400.0
#: ``/server_info`` fields every server this plugin measures reports.
SERVER_INFO_FIELDS = ("version",)


class ServerUnreachable(ConnectionError):
    """No HTTP answer (refused, reset, timed out)."""


class ServerHTTPError(RuntimeError):
    """The server answered with a 4xx/5xx status."""

    def __init__(self, method: str, url: str, status: int, message: str) -> None:
        super().__init__(f"{method} {url} -> HTTP {status}: {message}")
        self.status = status
        self.message = message


def check_url(url: str) -> str:
    """Validate a server base URL (``http://host:port``) and return it without a slash."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"server URL {url!r} must look like http://127.0.0.1:30000")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"server URL {url!r} has an invalid port") from None
    if parts.query or parts.fragment:
        raise ValueError(f"server URL {url!r} must not carry a query or fragment")
    return url.rstrip("/")


def bounded_timeout(seconds: float, default: float = READ_TIMEOUT_S) -> float:
    """``seconds`` as a usable socket timeout: from 1 ms to ``MAX_TIMEOUT_S`` (a NaN is
    ``default``), so that a deadline derived from any number never raises."""
    if math.isnan(seconds):
        return default
    return min(max(seconds, 0.001), MAX_TIMEOUT_S)


def _error_message(raw: bytes) -> str:
    try:
        err = json.loads(raw)
    except ValueError:  # an HTML or text error page: its words, on one line
        text = re.sub(r"<[^>]*>", " ", raw[:4096].decode(errors="replace"))
        return " ".join(text.split())[:500]
    msg = err.get("error") if isinstance(err, dict) else None
    if isinstance(msg, dict):
        msg = msg.get("message")
    if msg is None and isinstance(err, dict):
        msg = err.get("detail") or err.get("message")  # FastAPI / SGLang shapes
    return str(msg if msg is not None else err)[:500]


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class ServerClient:
    """Blocking JSON-over-HTTP client; every call has a connect and a read timeout."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = READ_TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.base_url = check_url(base_url)
        self.timeout = bounded_timeout(timeout)
        self.connect_timeout = bounded_timeout(connect_timeout, CONNECT_TIMEOUT_S)

    def with_timeout(self, seconds: float) -> ServerClient:
        """The same server with every call bounded by ``seconds`` (connect and answer)."""
        return ServerClient(
            self.base_url, timeout=seconds, connect_timeout=min(self.connect_timeout, seconds)
        )

    def _exchange(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        *,
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """Send one request; return the status and body. ServerUnreachable says why not."""
        url = self.base_url + path
        ct = self.connect_timeout if connect_timeout is None else bounded_timeout(connect_timeout)
        rt = self.timeout if timeout is None else bounded_timeout(timeout)
        conn, prefix = _connection(self.base_url, ct)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise ServerUnreachable(f"{method} {url}: {_connect_reason(e, ct)}") from None
        try:
            assert conn.sock is not None
            conn.sock.settimeout(rt)
            return _send_and_read(conn, method, prefix + path, data)
        except TimeoutError:
            raise ServerUnreachable(
                f"{method} {url}: timed out after {rt:g} s waiting for the answer"
            ) from None
        except (OSError, http.client.HTTPException) as e:
            raise ServerUnreachable(f"{method} {url}: {type(e).__name__}: {e}") from None
        finally:
            conn.close()

    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, raw = self._exchange(method, path, data, timeout=timeout)
        if status >= 400:
            raise ServerHTTPError(method, self.base_url + path, status, _error_message(raw))
        return _decode(raw)

    def get(self, path: str, *, timeout: float | None = None) -> Any:
        return self._call("GET", path, timeout=timeout)

    def post(self, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        return self._call("POST", path, body if body is not None else {}, timeout=timeout)

    # -- SGLang native API ---------------------------------------------------------------
    def health_generate(self, timeout: float = 30.0) -> bool:
        try:
            self.get("/health_generate", timeout=timeout)
            return True
        except (ServerUnreachable, ServerHTTPError):
            return False

    def server_info(self) -> dict[str, Any]:
        info = self.get("/server_info")
        if not isinstance(info, dict):
            raise ServerHTTPError("GET", self.base_url + "/server_info", 200, "not a JSON object")
        return info

    def flush_cache(self) -> None:
        self.post("/flush_cache")

    def generate(self, body: dict[str, Any], *, timeout: float | None = None) -> Any:
        return self.post("/generate", body, timeout=timeout)


def _connection(base_url: str, connect_timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An unconnected connection to ``base_url``'s host and the URL's path prefix."""
    parts = urllib.parse.urlsplit(base_url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "", parts.port, timeout=connect_timeout), parts.path


def _send_and_read(
    conn: http.client.HTTPConnection, method: str, target: str, data: bytes | None
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"} if data is not None else {}
    # A server that answers early (a 413, say) may stop reading: read that answer.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        conn.request(method, target, body=data, headers=headers)
    resp = conn.getresponse()
    raw = resp.read(MAX_RESPONSE_BYTES + 1)
    if len(raw) > MAX_RESPONSE_BYTES:
        raise http.client.HTTPException(f"response larger than {MAX_RESPONSE_BYTES} bytes")
    return resp.status, raw


def _connect_reason(e: OSError, timeout: float) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(e, TimeoutError):
        return f"timed out after {timeout:g} s connecting"
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the host name ({e.strerror or e})"
    return f"cannot connect ({type(e).__name__}: {e.strerror or e})"


# -- attach mode ---------------------------------------------------------------------------


@contextlib.contextmanager
def _hard_deadline(conn: http.client.HTTPConnection, seconds: float) -> Iterator[None]:
    """Shut the connection's socket at the deadline, however slowly the peer trickles."""

    def fire() -> None:
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(seconds, 0.0), fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def attach_problem(
    url: str,
    *,
    required: Collection[str] = SERVER_INFO_FIELDS,
    deadline_s: float = ATTACH_DEADLINE_S,
) -> str | None:
    """Why the server at ``url`` cannot be attached to, or None if it can.

    Asks ``GET /server_info`` once and answers within ``deadline_s`` with one of:
    ``connection refused: ...``, ``timed out: ...``, ``HTTP <status> from ...``,
    ``not a specperf server: ...`` (no JSON object, or without the ``required`` fields),
    ``unreachable: ...`` (name resolution and other socket errors).
    """
    base = check_url(url)
    t0 = time.monotonic()
    conn, prefix = _connection(base, deadline_s)
    try:
        with _hard_deadline(conn, deadline_s):
            status, raw = _probe(conn, prefix + "/server_info", deadline_s)
    except ConnectionRefusedError:
        return f"connection refused: nothing listens at {base} (is the server running?)"
    except TimeoutError:
        return _timed_out(base, deadline_s)
    except (OSError, http.client.HTTPException) as e:
        if time.monotonic() - t0 >= deadline_s * 0.99:
            return _timed_out(base, deadline_s)
        return f"unreachable: {base}: {type(e).__name__}: {e}"
    finally:
        conn.close()
    return _info_problem(base, status, raw, required)


def _probe(conn: http.client.HTTPConnection, target: str, deadline_s: float) -> tuple[int, bytes]:
    conn.connect()
    assert conn.sock is not None
    conn.sock.settimeout(deadline_s)
    return _send_and_read(conn, "GET", target, None)


def _timed_out(base: str, deadline_s: float) -> str:
    return (
        f"timed out: {base} gave no answer to GET /server_info within {deadline_s:g} s "
        "(a stopped or overloaded server, or a port that is not HTTP)"
    )


def _info_problem(base: str, status: int, raw: bytes, required: Collection[str]) -> str | None:
    where = f"GET {base}/server_info"
    if status >= 400:
        return f"HTTP {status} from {where}: {_error_message(raw)[:200]}"
    info = _decode(raw)
    if not isinstance(info, dict):
        return f"not a specperf server: {where} did not answer a JSON object"
    missing = [f for f in required if f not in info]
    if missing:
        return (
            f"not a specperf server: {where} lacks {', '.join(missing)} (a reference or "
            "SGLang server reports them)"
        )
    return None
