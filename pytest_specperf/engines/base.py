"""What the plugin needs from a backend (reference engine or SGLang)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# The ENV_* names live in engines.env; re-exported here for existing importers.
from pytest_specperf.engines.env import (
    ENV_INJECT,
    ENV_NVTX,
    ENV_PHASE_MAP,
    ENV_RUN_DIR,
    ENV_SGLANG_PLUGIN,
)
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.server.client import ServerClient

__all__ = [
    "ENV_INJECT",
    "ENV_NVTX",
    "ENV_PHASE_MAP",
    "ENV_RUN_DIR",
    "ENV_SGLANG_PLUGIN",
    "Backend",
    "BackendSettings",
    "BackendUnavailable",
    "LaunchSpec",
    "get_backend",
]


class BackendUnavailable(RuntimeError):
    """The backend cannot run here; the message names what is missing and the fix."""


@dataclass(frozen=True)
class BackendSettings:
    """The user's backend choices (from ``--specperf-*`` options and their ini twins)."""

    model: str | None = None
    draft_model: str | None = None
    server_args: tuple[str, ...] = ()
    inject: str | None = None
    nvtx: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_deadline_s: float = 600.0
    name: str = "server"


class Backend(Protocol):
    """One backend. Implementations live in ``engines/<name>/backend.py``."""

    name: str

    def check(self, settings: BackendSettings) -> None:
        """Raise ``BackendUnavailable`` if the backend cannot start with these settings."""

    def launch_spec(self, settings: BackendSettings, *, port: int, run_dir: Path) -> LaunchSpec:
        """The command line and environment that start a server on 127.0.0.1:``port``."""

    def prompt_fields(self, context_len: int, batch_size: int, seed: int) -> dict[str, Any]:
        """``/generate`` body fields that give each request ``context_len`` prompt tokens."""

    def set_kv_layout(
        self, client: ServerClient, run_dir: Path | None, layout: str, level: float, seed: int
    ) -> None:
        """Put the server's KV allocator in ``layout`` for the next request."""

    def kv_fragmentation(self, meta_info: dict[str, Any], run_dir: Path | None) -> float | None:
        """Fragmentation measured on the live request, if the backend reports one."""

    def fingerprint(self, server_info: dict[str, Any]) -> dict[str, Any]:
        """Engine identity a baseline is valid for (backend, version, model, draft settings)."""

    def reference_ms(self, meta_info: dict[str, Any]) -> float | None:
        """The request's reference read time (ms) reported by the server, if any: step
        times are judged relative to it (see verdict.judged_form)."""

    def notes(self, run_dir: Path | None) -> list[str]:
        """Lines about the server's instrumentation for the run's summary (e.g. hook
        targets missing in the installed SGLang). Empty when there is nothing to say."""

    def metrics_before(self, client: ServerClient) -> Any:
        """A snapshot of the server's own metrics before a measured window (or None)."""

    def metrics_check(
        self, client: ServerClient, before: Any, records: list[StepRecord], wall_s: float
    ) -> list[str]:
        """Where the server's own metrics disagree with our records over the window."""

    def start_profile(self, client: ServerClient, trace: Path) -> None:
        """Start the server's PyTorch profiler; the trace is to end up at ``trace``."""

    def stop_profile(self, client: ServerClient, trace: Path) -> list[Path]:
        """Stop the profiler and return the trace files it wrote."""

    def capacity_reason(
        self, server_info: dict[str, Any], context_len: int, batch_size: int
    ) -> str | None:
        """Why the server cannot hold ``batch_size`` requests of ``context_len`` (or None)."""


def get_backend(name: str) -> Backend:
    if name == "reference":
        from pytest_specperf.engines.reference.backend import ReferenceBackend

        return ReferenceBackend()
    if name == "sglang":
        from pytest_specperf.engines.sglang.backend import SGLangBackend

        return SGLangBackend()
    raise ValueError(f"unknown backend {name!r}; choose reference or sglang")
