"""Server processes (launch, readiness, teardown) and the HTTP client for SGLang's API."""

from pytest_specperf.server.client import ServerClient, ServerHTTPError, ServerUnreachable
from pytest_specperf.server.supervisor import ServerProcess, ServerStartError, free_port

__all__ = [
    "ServerClient",
    "ServerHTTPError",
    "ServerProcess",
    "ServerStartError",
    "ServerUnreachable",
    "free_port",
]
