"""What the plugin needs from a backend (reference engine or SGLang)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_specperf.server.client import ServerClient

#: Environment variables read by code running inside server processes.
ENV_RUN_DIR = "SPECPERF_RUN_DIR"  # where the probe sink writes step records
ENV_SGLANG_PLUGIN = "SPECPERF_SGLANG_PLUGIN"  # "1": our sglang.srt.plugins entry point hooks
ENV_PHASE_MAP = "SPECPERF_PHASE_MAP"  # user phase-map extension file for SGLang forks
ENV_INJECT = "SPECPERF_INJECT"  # canary slowdowns, same syntax as --specperf-inject


class BackendUnavailable(RuntimeError):
    """The backend cannot run here; the message names what is missing and the fix."""


@dataclass(frozen=True)
class BackendSettings:
    """The user's backend choices (from ``--specperf-*`` options and their ini twins)."""

    model: str | None = None
    draft_model: str | None = None
    server_args: tuple[str, ...] = ()
    inject: str | None = None
    device: str | None = None  # "cpu"/"cuda" override for the reference engine


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
