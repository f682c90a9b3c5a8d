"""The embedded reference engine as a plugin backend."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specperf.engines.env import probe_env
from pytest_specperf.probe.phases import BUILD_VERIFY_INPUT, CORE_PHASES, DRAFT
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.server.client import ServerClient
from pytest_specperf.server.protocol import (
    BackendSettings,
    BackendUnavailable,
    LaunchSpec,
    RunDirBinding,
)

#: Server flags the plugin sets itself; passing them through would be ambiguous.
_RESERVED = ("--host", "--port", "--run-dir", "--config", "--no-probe")


def default_threads(parallel: int = 1) -> int:
    """CPU threads for each of ``parallel`` servers: the usable cores but one per server
    (left to its pytest process and the OS), shared out, at least one. On a 2-core machine
    that is 1 thread: steps are slower, but a stray process no longer stalls a parallel
    region and block-to-block noise drops (README, "Backends")."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, (cores - parallel) // max(parallel, 1))


def _positive(obj: Any, name: str, *, where: str = "/server_info config") -> int:
    """A positive integer field the capacity check needs; ``BackendUnavailable`` naming the
    field when the server does not report it (never a silent skip of every case)."""
    value = obj.get(name) if isinstance(obj, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        got = f"{value!r}" if isinstance(obj, dict) and obj else "nothing"
        raise BackendUnavailable(
            f"the server's {where} has no usable {name} (got {got}): cannot tell which "
            "contexts fit; is it a reference server of this pytest-specperf version?"
        )
    return value


class ReferenceBackend(RunDirBinding):
    name = "reference"
    server_info_fields = ("fingerprint", "config", "run_dir")

    def check(self, settings: BackendSettings) -> None:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise BackendUnavailable(
                "the reference engine needs PyTorch, which is not installed; "
                "install it with: pip install torch (CPU build: pip install torch "
                "--index-url https://download.pytorch.org/whl/cpu)"
            )
        from pytest_specperf.engines.reference.config import CONFIGS

        if settings.model is not None and settings.model not in CONFIGS:
            raise BackendUnavailable(
                f"--specperf-model {settings.model!r} is not a reference-engine config; "
                f"choose one of: {', '.join(CONFIGS)}"
            )
        if settings.draft_model is not None:
            raise BackendUnavailable(
                "--specperf-draft-model applies to the sglang backend only; the reference "
                "engine builds its drafter from the target (use "
                "--specperf-server-arg=--speculative-num-draft-tokens=N to size it)"
            )
        for arg in settings.server_args:
            flag = arg.split("=", 1)[0]
            if flag in _RESERVED:
                raise BackendUnavailable(
                    f"--specperf-server-arg {arg!r} sets {flag}, which the plugin controls"
                )

    def check_attached(self, server_info: dict[str, Any]) -> None:
        return None

    def launch_spec(self, settings: BackendSettings, *, port: int, run_dir: Path) -> LaunchSpec:
        self.bind(run_dir)
        cmd = [
            settings.python or sys.executable,
            "-m",
            "pytest_specperf.engines.reference.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--run-dir",
            str(run_dir),
            "--config",
            settings.model or "tiny",
            "--quiet",
        ]
        if not any(a.split("=", 1)[0] == "--threads" for a in settings.server_args):
            cmd += ["--threads", str(default_threads(settings.parallel))]
        cmd += list(settings.server_args)
        env = probe_env(
            inject=settings.inject, nvtx=settings.nvtx, kernel_every=settings.kernel_every
        )
        return LaunchSpec(cmd=cmd, env=env, ready_deadline_s=120.0, name="reference server")

    def prompt_fields(self, context_len: int, batch_size: int, seed: int) -> dict[str, Any]:
        ctx: int | list[int] = context_len if batch_size == 1 else [context_len] * batch_size
        seeds: int | list[int] = seed if batch_size == 1 else [seed + i for i in range(batch_size)]
        return {"context_len": ctx, "synthetic_seed": seeds}

    def step_limit_fields(self, server_info: dict[str, Any], steps: int) -> dict[str, Any]:
        # a server of an older build (an A/B reference side) lists no such parameter
        known = server_info.get("sampling_params")
        if isinstance(known, list) and "max_decode_steps" in known:
            return {"max_decode_steps": steps}
        return {}

    def set_kv_layout(self, client: ServerClient, layout: str, level: float, seed: int) -> None:
        client.flush_cache()
        client.post("/specperf/kv_layout", {"layout": layout, "level": level, "seed": seed})

    def kv_fragmentation(self, meta_info: dict[str, Any]) -> float | None:
        sp = meta_info.get("specperf") or {}
        value = sp.get("kv_fragmentation")
        return float(value) if isinstance(value, (int, float)) else None

    def fingerprint(self, server_info: dict[str, Any]) -> dict[str, Any]:
        fp = server_info.get("fingerprint")
        if not isinstance(fp, dict):
            raise BackendUnavailable(
                "the server did not report an engine fingerprint in /server_info"
            )
        return dict(fp)

    def capacity_reason(
        self, server_info: dict[str, Any], context_len: int, batch_size: int
    ) -> str | None:
        cfg = server_info.get("config") or {}
        max_ctx = _positive(cfg, "max_context_len")
        page = _positive(cfg, "page_size")
        pages = _positive(server_info, "kv_total_pages", where="/server_info")
        block = int(server_info.get("speculative_num_draft_tokens") or 1)
        need = context_len + 512 + block  # room for the decode steps of a case
        if need > max_ctx:
            return (
                f"context {context_len} exceeds the {cfg.get('name')} config's maximum "
                f"context of {max_ctx} tokens"
            )
        if batch_size * -(-need // page) > pages:
            return (
                f"{batch_size} x {context_len} tokens of KV do not fit in the pool of "
                f"{pages * page} tokens on {server_info.get('device')}"
            )
        return None

    def start_profile(self, client: ServerClient, trace: Path) -> None:
        client.post("/specperf/profile", {"action": "start"})

    def stop_profile(self, client: ServerClient, trace: Path) -> list[Path]:
        out = client.post("/specperf/profile", {"action": "stop"})
        written = Path(out["path"]) if isinstance(out, dict) and "path" in out else None
        if written is None or not written.is_file():
            return []
        shutil.move(written, trace)  # the server writes inside its run directory only
        return [trace]

    def reference_ms(self, meta_info: dict[str, Any]) -> float | None:
        sp = meta_info.get("specperf") or {}
        value = sp.get("reference_ms")
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def kv_bytes_per_token(self, server_info: dict[str, Any]) -> float | None:
        value = server_info.get("kv_bytes_per_token")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            return None
        return float(value)

    def mapped_phases(self, server_info: dict[str, Any]) -> frozenset[str] | None:
        """Every engine phase with a drafter (no serving scheduler: no ``HOST_PHASES``);
        without one (``NONE``) no draft or tree build."""
        fp = server_info.get("fingerprint") or {}
        algorithm = str(fp.get("speculative_algorithm") or "NONE").upper()
        if algorithm == "NONE":
            return frozenset(CORE_PHASES) - {DRAFT, BUILD_VERIFY_INPUT}
        return frozenset(CORE_PHASES)

    def notes(self) -> list[str]:
        return []

    def metrics_before(self, client: ServerClient) -> Any:
        return None  # the reference server has no metrics of its own to cross-check

    def metrics_check(
        self, client: ServerClient, before: Any, records: Sequence[StepRecord], wall_s: float
    ) -> list[str]:
        return []
