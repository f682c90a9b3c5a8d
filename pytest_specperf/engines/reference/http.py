"""HTTP front of the reference server: request framing and limits, routes, engine jobs.

Built on the standard library's ``http.server`` (``ThreadingHTTPServer``), so the server
runs wherever torch runs, GPU boxes without internet included; its request parsing is
replaced by a stricter one with its own limits (stdlib's allows 64 KiB lines and 100
headers, answers some errors with HTML and reads no body it does not route). Every
answer is JSON, every error a 4xx/5xx with ``{"error": {"message", "code"}}``:

- request line over ``MAX_REQUEST_LINE`` bytes: 414; header line, header count or head
  size over their limits: 431; malformed request line or header: 400; HTTP/2+: 505;
  a method outside HTTP's: 501; a known path with another method: 405 with ``Allow``;
- a body is read on every method (so it is never parsed as a second request), framed by
  ``Content-Length`` only: chunked 411, other transfer codings 501, both headers or a
  malformed length 400 (and the connection is closed: its framing is unknown);
- a body over ``max_body_bytes``: 413, sent first, then the body is read and dropped (up
  to ``MAX_DISCARD_BYTES``) so that a client still sending it reads the 413 instead of
  a reset connection;
- each connection has a socket timeout, and each request a deadline for its head
  (``timeout_s``) and body (plus one second per ``MIN_BODY_RATE`` bytes): a stalled or
  dripping client gets 408 and is closed by a reaper thread; at most
  ``max_connections`` are open, more are answered 503 and closed at once;
- bad JSON, JSON nested too deep, numbers too long: 400 (see ``schema.parse_json``).

Engine work runs on the main thread, one job at a time (PyTorch's CPU kernels run slower
when called from a thread other than the one whose OpenMP pool is warm).
"""

from __future__ import annotations

import contextlib
import email.parser
import http.client
import json
import os
import queue
import re
import socket
import socketserver
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from pytest_specperf import __version__
from pytest_specperf.engines.reference.engine import Engine, GenRequest, RequestError
from pytest_specperf.engines.reference.schema import (
    SAMPLING_KEYS,
    HTTPError,
    bad,
    error_json,
    parse_generate,
    parse_json,
    parse_kv_layout,
    parse_profile,
    result_json,
)
from pytest_specperf.probe.sink import RunDirError, open_run_dir

#: Request bodies above this size are refused with 413.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: Seconds a connection may sit idle, or take to send a request's head; socket timeout.
DEFAULT_TIMEOUT_S = 30.0
#: Connections served at once; more are answered 503.
DEFAULT_MAX_CONNECTIONS = 64
#: An oversized body is read and dropped up to this size, then the connection is closed.
MAX_DISCARD_BYTES = 64 * 1024 * 1024
#: A body must arrive at least this fast (bytes/s) on top of ``timeout_s``.
MIN_BODY_RATE = 1024 * 1024
#: Limits of a request's head (request line, header lines, headers, all of it).
MAX_REQUEST_LINE = 8192
MAX_HEADER_LINE = 8192
MAX_HEADERS = 64
MAX_HEAD_BYTES = 32 * 1024
#: Empty lines tolerated before a request line (RFC 9112 section 2.2).
MAX_LEADING_EMPTY_LINES = 4
#: A profiler left running longer than this stops by itself (no trace kept).
PROFILE_MAX_S = 600.0

#: Methods HTTP defines (RFC 9110 and 5789); any other is 501, these are 405 where not routed.
HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")
_DIGITS = re.compile(r"[0-9]+")
#: Content-Length values this long or longer are not converted (and are refused).
_HUGE_LENGTH = 10**18
_CTL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters except HTAB
_TARGET_BAD = re.compile(r"[\x00-\x20\x7f]")

_T = TypeVar("_T")


@dataclass(frozen=True)
class HTTPLimits:
    """The server's limits (``--max-body-bytes``, ``--http-timeout``, ``--max-connections``)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"--max-body-bytes must be at least 1, got {self.max_body_bytes}")
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(
                f"--http-timeout must be a positive number of seconds, got {self.timeout_s}"
            )
        if self.max_connections < 1:
            raise ValueError(f"--max-connections must be at least 1, got {self.max_connections}")

    def body_deadline_s(self, n: int) -> float:
        return self.timeout_s + n / MIN_BODY_RATE


class _Job:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except Exception as e:  # handed back to the handler thread
            self.error = e
        finally:
            self.done.set()


class _Deadlines:
    """Per-connection deadlines; a reaper shuts the reading side of late connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[socket.socket, float] = {}
        self._expired: set[socket.socket] = set()

    def set(self, sock: socket.socket, seconds: float) -> None:
        with self._lock:
            self._due[sock] = time.monotonic() + seconds

    def clear(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)

    def expired(self, sock: socket.socket) -> bool:
        with self._lock:
            return sock in self._expired

    def forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)
            self._expired.discard(sock)

    def reap(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [s for s, t in self._due.items() if t <= now]
            for sock in late:
                del self._due[sock]
                self._expired.add(sock)
        for sock in late:  # a blocked read returns end-of-file; the handler answers 408
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.wait(interval):
            self.reap()


class ReferenceServer(ThreadingHTTPServer):
    """The HTTP server; engine work is queued to the thread that runs ``run_engine_loop``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # listen backlog: a burst of connections is not dropped

    def __init__(
        self,
        addr: tuple[str, int],
        *,
        run_dir: str,
        limits: HTTPLimits | None = None,
        quiet: bool = False,
    ) -> None:
        super().__init__(addr, _Handler)
        self._engine: Engine | None = None
        self.run_dir = run_dir
        self.limits = limits or HTTPLimits()
        self.quiet = quiet
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.profiler: Any = None
        self.profiler_started = 0.0
        self.started = time.time()
        self.deadlines = _Deadlines()
        self._lock = threading.Lock()
        self._open = 0
        self._counts = {"requests": 0, "errors": 0, "timeouts": 0, "refused_connections": 0}
        self._stop_reaper = threading.Event()
        interval = min(0.25, self.limits.timeout_s / 4)
        threading.Thread(
            target=self.deadlines.run,
            args=(self._stop_reaper, interval),
            name="specperf-http-reaper",
            daemon=True,
        ).start()

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # no reverse DNS lookup of the host
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    # -- engine ------------------------------------------------------------------------
    def attach(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise HTTPError(HTTPStatus.SERVICE_UNAVAILABLE, "the engine is still starting")
        return self._engine

    def on_engine(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the engine thread (the main thread) and return its result."""
        job = _Job(fn)
        self.jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        result: _T = job.result
        return result

    def run_engine_loop(self) -> None:
        """Execute engine jobs until ``None`` is queued (called on the main thread)."""
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job.run()

    # -- connections -------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            admit = self._open < self.limits.max_connections
            if admit:
                self._open += 1
            else:
                self._counts["refused_connections"] += 1
        if not admit:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.forget(request)
            self._release()

    def _release(self) -> None:
        with self._lock:
            self._open -= 1

    def _refuse(self, sock: socket.socket) -> None:
        body = json.dumps(
            error_json(503, f"more than {self.limits.max_connections} connections open")
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            sock.setblocking(False)  # never stall the accept loop
            sock.send(head.encode() + body)
        self.shutdown_request(sock)

    def count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def counters(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._counts)
            out["open_connections"] = self._open
        return out

    def server_close(self) -> None:
        self._stop_reaper.set()
        super().server_close()


#: Path -> method -> handler method name.
_ROUTES: dict[str, dict[str, str]] = {
    "/health": {"GET": "_health"},
    "/health_generate": {"GET": "_health_generate"},
    "/server_info": {"GET": "_server_info"},
    "/get_server_info": {"GET": "_server_info"},
    "/get_model_info": {"GET": "_model_info"},
    "/generate": {"POST": "_generate"},
    "/flush_cache": {"POST": "_flush_cache"},
    "/specperf/kv_layout": {"POST": "_kv_layout"},
    "/specperf/profile": {"POST": "_profile"},
}


class _Timeout(Exception):
    """The request did not arrive within its deadline."""


class _Handler(BaseHTTPRequestHandler):
    server: ReferenceServer
    protocol_version = "HTTP/1.1"
    server_version = f"specperf-reference/{__version__}"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.limits.timeout_s)  # every read and write

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in format % args)
            sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text[:500]}\n")

    # -- one request ---------------------------------------------------------------------
    def handle_one_request(self) -> None:
        """Read, frame and answer one request; any failure is a JSON error, never a crash."""
        sock, limits = self.connection, self.server.limits
        self.command, self.path, self.requestline = "", "", ""
        self.request_version = "HTTP/1.1"  # answer malformed requests in HTTP/1.1
        self.close_connection = True
        self.server.deadlines.set(sock, limits.timeout_s)
        try:
            if not self._read_head():
                return  # the client closed an idle connection
            body = self._read_body()
            self.server.deadlines.clear(sock)
            self._dispatch(body)
        except HTTPError as e:
            self._error(e)
        except _Answered:
            self.close_connection = True
        except (_Timeout, TimeoutError):
            self.server.count("timeouts")
            self._error(
                HTTPError(
                    HTTPStatus.REQUEST_TIMEOUT,
                    f"the request did not arrive within its deadline ({limits.timeout_s:g} s "
                    "for the head, plus 1 s per MiB of body)",
                    close=True,
                )
            )
        except OSError:
            self.close_connection = True  # the client went away: nobody to answer
        finally:
            self.server.deadlines.clear(sock)

    def _readline(self, limit: int, what: str, status: HTTPStatus) -> bytes:
        line = self.rfile.readline(limit + 1)
        if len(line) > limit:
            raise HTTPError(status, f"{what} longer than {limit} bytes", close=True)
        if line and not line.endswith(b"\n"):
            self._incomplete(what)
        return line

    def _incomplete(self, what: str) -> None:
        if self.server.deadlines.expired(self.connection):
            raise _Timeout
        raise _malformed(f"connection ended inside the {what}")

    def _read_head(self) -> bool:
        """Read the request line and headers; False when the client closed before sending."""
        line = b""
        for _ in range(MAX_LEADING_EMPTY_LINES + 1):
            line = self._readline(MAX_REQUEST_LINE, "request line", HTTPStatus.REQUEST_URI_TOO_LONG)
            if line.strip(b"\r\n"):
                break
            if not line:
                return False
        else:
            raise _malformed("no request line")
        self._parse_request_line(line.rstrip(b"\r\n").decode("latin-1"))
        self.headers = self._read_headers()
        self._check_headers()
        return True

    def _parse_request_line(self, text: str) -> None:
        self.requestline = text[:200]
        parts = text.split(" ")
        if len(parts) != 3:
            raise _malformed(
                f"malformed request line {text[:80]!r}: expected METHOD TARGET HTTP/1.1"
            )
        method, target, version = parts
        m = _VERSION.fullmatch(version)
        if m is None:
            raise _malformed(f"bad HTTP version {version[:20]!r}")
        if m.group(1) != "1":
            raise HTTPError(
                HTTPStatus.HTTP_VERSION_NOT_SUPPORTED,
                f"HTTP version {version} is not supported; use HTTP/1.1",
                close=True,
            )
        self.request_version = "HTTP/1.0" if m.group(2) == "0" else "HTTP/1.1"
        self.close_connection = self.request_version == "HTTP/1.0"
        if _TOKEN.fullmatch(method) is None:
            raise _malformed(f"malformed method {method[:20]!r}")
        self.command = method
        self.path = self._request_path(target)

    def _request_path(self, target: str) -> str:
        if _TARGET_BAD.search(target):
            raise _malformed("the request target holds a control character or space")
        if target.startswith("/"):
            return target
        if target.lower().startswith(("http://", "https://")):  # absolute form: its path
            parts = urllib.parse.urlsplit(target)
            return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        raise _malformed(f"request target {target[:40]!r} must be a path starting with /")

    def _read_headers(self) -> http.client.HTTPMessage:
        lines: list[str] = []
        size = 0
        while True:
            raw = self._readline(
                MAX_HEADER_LINE, "header section", HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
            )
            if not raw:
                self._incomplete("header section")
            size += len(raw)
            if size > MAX_HEAD_BYTES:
                raise HTTPError(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    f"headers larger than {MAX_HEAD_BYTES} bytes",
                    close=True,
                )
            line = raw.rstrip(b"\r\n").decode("latin-1")
            if not line:
                break
            if len(lines) == MAX_HEADERS:
                raise HTTPError(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    f"more than {MAX_HEADERS} headers",
                    close=True,
                )
            lines.append(_check_header_line(line))
        text = "\r\n".join(lines) + "\r\n\r\n"
        msg: http.client.HTTPMessage = email.parser.Parser(_class=http.client.HTTPMessage).parsestr(
            text
        )
        return msg

    def _check_headers(self) -> None:
        hosts = self.headers.get_all("Host") or []
        if self.request_version == "HTTP/1.1" and len(hosts) != 1:
            raise _malformed(f"an HTTP/1.1 request needs exactly one Host header, got {len(hosts)}")
        conn = (self.headers.get("Connection") or "").lower()
        if "close" in conn:
            self.close_connection = True
        elif "keep-alive" in conn:
            self.close_connection = False

    # -- body --------------------------------------------------------------------------
    def _body_length(self) -> int:
        te = self.headers.get_all("Transfer-Encoding") or []
        cl = self.headers.get_all("Content-Length") or []
        if te and cl:
            raise _malformed("both Transfer-Encoding and Content-Length: send Content-Length only")
        if te:
            coding = te[-1].split(",")[-1].strip().lower()
            if coding == "chunked":
                raise HTTPError(
                    HTTPStatus.LENGTH_REQUIRED,
                    "chunked bodies are not supported; send Content-Length",
                    close=True,
                )
            raise HTTPError(
                HTTPStatus.NOT_IMPLEMENTED,
                f"transfer coding {coding[:40]!r} is not supported; send Content-Length",
                close=True,
            )
        if len(cl) > 1:
            raise _malformed("more than one Content-Length")
        if not cl:
            return 0  # no body (RFC 9112 section 6.3)
        value = cl[0].strip()
        if _DIGITS.fullmatch(value) is None:
            raise _malformed(f"Content-Length {value[:40]!r} is not a non-negative decimal number")
        return int(value) if len(value) < len(str(_HUGE_LENGTH)) else _HUGE_LENGTH

    def _read_body(self) -> bytes:
        n = self._body_length()
        expect = (self.headers.get("Expect") or "").lower()
        limits = self.server.limits
        if n > limits.max_body_bytes:
            self._too_large(n, waiting=expect == "100-continue")
        if expect and expect != "100-continue":
            self._discard(n)
            raise HTTPError(
                HTTPStatus.EXPECTATION_FAILED,
                f"unsupported expectation {expect[:40]!r} (only 100-continue)",
                close=True,
            )
        if expect and self.request_version == "HTTP/1.1" and n:
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.server.deadlines.set(self.connection, limits.body_deadline_s(n))
        raw = self.rfile.read(n) if n else b""
        if len(raw) < n:
            if self.server.deadlines.expired(self.connection):
                raise _Timeout
            raise _malformed(f"the body ended after {len(raw)} of {n} bytes (Content-Length)")
        return raw

    def _too_large(self, n: int, *, waiting: bool) -> None:
        """Answer 413 first, then read and drop the body (bounded) and close."""
        limit = self.server.limits.max_body_bytes
        shown = f"{n} bytes" if n < _HUGE_LENGTH else f"a Content-Length of {n} or more bytes"
        self._error(
            HTTPError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {shown} exceeds the limit of {limit} bytes (--max-body-bytes)",
                close=True,
            )
        )
        if not waiting:  # a client waiting for 100 Continue sends no body
            with contextlib.suppress(OSError):  # late or gone: the 413 is said already
                self._discard(min(n, MAX_DISCARD_BYTES))
        raise _Answered

    def _discard(self, n: int) -> None:
        self.server.deadlines.set(self.connection, self.server.limits.body_deadline_s(n))
        left = n
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                return
            left -= len(chunk)

    # -- responses ---------------------------------------------------------------------
    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, e: HTTPError) -> None:
        self.server.count("errors")
        if e.close:
            self.close_connection = True
        with contextlib.suppress(OSError):
            self._send(e.status, error_json(e.status, e.message), e.headers)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors raised by ``http.server`` itself, as JSON too."""
        text = message or HTTPStatus(code).phrase
        self._error(HTTPError(HTTPStatus(code), text, close=True))

    def _dispatch(self, raw: bytes) -> None:
        self.server.count("requests")
        if self.command not in HTTP_METHODS:
            raise HTTPError(
                HTTPStatus.NOT_IMPLEMENTED, f"method {self.command[:20]} is not implemented"
            )
        route = self.path.split("?", 1)[0]
        methods = _ROUTES.get(route)
        if methods is None:
            raise HTTPError(HTTPStatus.NOT_FOUND, f"no route {self.command} {route[:100]}")
        name = methods.get(self.command)
        if name is None:
            allow = ", ".join(sorted(methods))
            raise HTTPError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{route} accepts {allow}, not {self.command}",
                headers={"Allow": allow},
            )
        try:
            getattr(self, name)(raw)
        except HTTPError:
            raise
        except Exception as e:  # engine bug: report it, keep serving
            self.log_message("internal error: %r", e)
            raise HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}") from e

    # -- endpoints -----------------------------------------------------------------------
    def _health(self, raw: bytes) -> None:
        self._send(200, {"status": "ok"})

    def _health_generate(self, raw: bytes) -> None:
        req = GenRequest(
            rid=f"health-{uuid.uuid4().hex[:8]}",
            max_new_tokens=1,
            input_ids=[3, 4, 5, 6],
            ignore_eos=True,
        )
        engine = self.server.engine
        self.server.on_engine(lambda: engine.generate([req]))
        self._send(200, {"status": "ok"})

    def _model_info(self, raw: bytes) -> None:
        cfg = self.server.engine.cfg
        self._send(
            200,
            {
                "model_path": f"specperf-reference/{cfg.name}",
                "is_generation": True,
                "vocab_size": cfg.vocab_size,
            },
        )

    def _server_info(self, raw: bytes) -> None:
        srv = self.server
        eng = srv.engine
        info = srv.on_engine(eng.info)
        info.update(
            {
                "version": __version__,
                "run_dir": srv.run_dir,
                "pid": os.getpid(),
                "uptime_s": round(time.time() - srv.started, 3),
                "http_counters": srv.counters(),
                "internal_states": [{"avg_spec_accept_length": eng.mean_accept_length()}],
                "sampling_params": sorted(SAMPLING_KEYS),
            }
        )
        self._send(200, info)

    def _generate(self, raw: bytes) -> None:
        srv = self.server
        eng = srv.engine
        reqs, batch = parse_generate(parse_json(raw), eng)
        if srv.profiler is not None and time.monotonic() - srv.profiler_started > PROFILE_MAX_S:
            prof, srv.profiler = srv.profiler, None  # forgotten: stop it, keep no trace
            srv.on_engine(prof.stop)
        try:
            results = srv.on_engine(lambda: eng.generate(reqs))
        except RequestError as e:
            raise bad(str(e)) from None
        out = [result_json(r) for r in results]
        self._send(200, out if batch else out[0])

    def _flush_cache(self, raw: bytes) -> None:
        parse_json(raw)  # any JSON body is accepted and ignored, as SGLang does
        self.server.on_engine(self.server.engine.flush_cache)
        self._send(200, {"success": True, "message": "Cache flushed."})

    def _kv_layout(self, raw: bytes) -> None:
        req = parse_kv_layout(parse_json(raw))
        eng = self.server.engine
        self.server.on_engine(lambda: eng.set_kv_layout(req.layout, req.level, req.seed))
        self._send(200, {"success": True, **req.to_json(), "applies_to": "next /generate"})

    def _profile(self, raw: bytes) -> None:
        """``{"action": "start"}`` / ``{"action": "stop"}``: the PyTorch profiler around the
        engine's requests in between. The trace (Chrome format) is written inside the run
        directory under a name the server chooses, returned as ``path``; a profiler left
        running stops by itself after PROFILE_MAX_S."""
        action = parse_profile(parse_json(raw))
        srv = self.server
        if action == "start":
            if srv.profiler is not None:
                raise HTTPError(HTTPStatus.CONFLICT, "the profiler is already running")
            device_type = srv.engine.device.type
            srv.profiler = srv.on_engine(lambda: _start_profiler(device_type))
            srv.profiler_started = time.monotonic()
            self._send(200, {"success": True, "profiling": True})
            return
        if srv.profiler is None:
            raise HTTPError(HTTPStatus.CONFLICT, "the profiler is not running")
        prof, srv.profiler = srv.profiler, None
        try:
            out_dir = open_run_dir(os.path.join(srv.run_dir, "profiles"))
        except RunDirError as e:
            raise HTTPError(HTTPStatus.INTERNAL_SERVER_ERROR, str(e)) from None
        path = str(out_dir / f"trace-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
        srv.on_engine(lambda: (prof.stop(), prof.export_chrome_trace(path)))
        self._send(200, {"success": True, "path": path})


def _malformed(message: str) -> HTTPError:
    """A 400 for a request whose framing is unknown: the connection closes after it."""
    return HTTPError(HTTPStatus.BAD_REQUEST, message, close=True)


class _Answered(Exception):
    """The response was sent already; the connection closes."""


def _check_header_line(line: str) -> str:
    if line[0] in " \t":
        raise _malformed("folded header lines (obs-fold) are not accepted")
    name, sep, value = line.partition(":")
    if not sep:
        raise _malformed(f"header line {line[:40]!r} has no colon")
    if _TOKEN.fullmatch(name) is None:
        raise _malformed(f"malformed header name {name[:40]!r}")
    if _CTL.search(value):
        raise _malformed(f"header {name} holds a control character")
    return line


def _start_profiler(device_type: str) -> Any:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities)
    prof.start()
    return prof
