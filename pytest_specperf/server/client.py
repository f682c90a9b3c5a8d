"""Minimal JSON client for the subset of SGLang's native HTTP API the plugin uses."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


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


class ServerClient:
    """Blocking JSON-over-HTTP client; every call has a timeout."""

    def __init__(self, base_url: str, *, timeout: float = 600.0) -> None:
        self.base_url = check_url(base_url)
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)
                msg = err.get("error", {}).get("message") if isinstance(err, dict) else None
                message = str(msg or err)
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace")[:500]
            raise ServerHTTPError(method, url, e.code, message) from None
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise ServerUnreachable(f"{method} {url}: {reason}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

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

    def generate(self, body: dict[str, Any]) -> Any:
        return self.post("/generate", body)
