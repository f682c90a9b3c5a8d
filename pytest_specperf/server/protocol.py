"""What the plugin needs from a backend (reference engine or SGLang): the protocol only.

Implementations live in ``engines/<name>/backend.py`` and are found through the registry in
``engines/__init__.py``; nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # imported in every SGLang process (through sgl_plugin): keep it light
    from pytest_specperf.probe.record import StepRecord
    from pytest_specperf.server.client import ServerClient

__all__ = [
    "Backend",
    "BackendSettings",
    "BackendUnavailable",
    "LaunchSpec",
    "RunDirBinding",
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
    #: servers running side by side on this machine (one per pytest-xdist worker)
    parallel: int = 1
    #: kernel sampling interval for the server's probe (None: the server's default)
    kernel_every: int | None = None
    #: the Python interpreter the server runs in (None: this one; an A/B run's reference
    #: side in another environment, ``--specperf-ab python=PATH``)
    python: str | None = None


@dataclass(frozen=True)
class LaunchSpec:
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_deadline_s: float = 600.0
    name: str = "server"


class Backend(Protocol):
    """One backend, bound to the run directory its server's probe writes step records to.

    A backend object is created unbound by the registry; ``launch_spec`` (the plugin
    launches the server) or ``bind`` (attach mode) binds it, and every later call uses
    ``run_dir``.
    """

    name: str
    #: ``/server_info`` fields a server of this backend answers with (attach checks them)
    server_info_fields: tuple[str, ...]

    @property
    def run_dir(self) -> Path:
        """The bound run directory; ``BackendUnavailable`` before ``launch_spec``/``bind``."""

    def bind(self, run_dir: Path) -> None:
        """Bind to the run directory of a server someone else started (attach mode)."""

    def check(self, settings: BackendSettings) -> None:
        """Raise ``BackendUnavailable`` if the backend cannot start with these settings."""

    def check_attached(self, server_info: dict[str, Any]) -> None:
        """Raise ``BackendUnavailable`` if an attached server cannot be measured."""

    def launch_spec(self, settings: BackendSettings, *, port: int, run_dir: Path) -> LaunchSpec:
        """Bind to ``run_dir``; the command line and environment that start a server on
        127.0.0.1:``port`` whose probe writes there."""

    def prompt_fields(self, context_len: int, batch_size: int, seed: int) -> dict[str, Any]:
        """``/generate`` body fields that give each request ``context_len`` prompt tokens."""

    def step_limit_fields(self, server_info: dict[str, Any], steps: int) -> dict[str, Any]:
        """``sampling_params`` fields that end a request after ``steps`` decode steps
        whatever its acceptance; empty where the server has no such limit (a request then
        ends on ``max_new_tokens`` alone, a few steps past the wanted ones)."""

    def set_kv_layout(self, client: ServerClient, layout: str, level: float, seed: int) -> None:
        """Put the server's KV allocator in ``layout`` for the next request."""

    def kv_fragmentation(self, meta_info: dict[str, Any]) -> float | None:
        """Fragmentation measured on the live request, if the backend reports one."""

    def fingerprint(self, server_info: dict[str, Any]) -> dict[str, Any]:
        """Engine identity a baseline is valid for (backend, version, model, draft settings)."""

    def reference_ms(self, meta_info: dict[str, Any]) -> float | None:
        """The request's reference read time (ms) reported by the server, if any: step
        times are judged relative to it (see ``judging.verdict.judged_form``)."""

    def kv_bytes_per_token(self, server_info: dict[str, Any]) -> float | None:
        """KV bytes read per context token and request (for the KV-read bandwidth)."""

    def mapped_phases(self, server_info: dict[str, Any]) -> frozenset[str] | None:
        """The phases this backend's server times for the running algorithm (None: it
        cannot say). A mapped phase that is zero in every measured step did not record:
        ``--specperf-strict`` fails such a case."""

    def notes(self) -> list[str]:
        """Lines about the server's instrumentation for the run's summary (e.g. hook
        targets missing in the installed SGLang). Empty when there is nothing to say."""

    def metrics_before(self, client: ServerClient) -> Any:
        """A snapshot of the server's own metrics before a measured window (or None)."""

    def metrics_check(
        self, client: ServerClient, before: Any, records: Sequence[StepRecord], wall_s: float
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


class RunDirBinding:
    """The run-directory binding every backend shares (mix-in)."""

    _bound: Path | None = None

    @property
    def run_dir(self) -> Path:
        if self._bound is None:
            raise BackendUnavailable(
                "the backend is not bound to a run directory yet (launch or attach first)"
            )
        return self._bound

    def bind(self, run_dir: Path) -> None:
        self._bound = Path(run_dir)


def is_speculative(fingerprint: Mapping[str, Any]) -> bool:
    """Whether an engine fingerprint names a speculative algorithm (accept length gated)."""
    return str(fingerprint.get("speculative_algorithm", "NONE")).upper() != "NONE"
