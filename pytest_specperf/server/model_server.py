"""The session's model server: launched (or attached to) once, torn down at the end."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_specperf.judging.judge import is_speculative
from pytest_specperf.probe.sink import RunDirError, make_run_dir
from pytest_specperf.server.client import (
    ATTACH_DEADLINE_S,
    ServerClient,
    ServerHTTPError,
    ServerUnreachable,
    attach_problem,
)
from pytest_specperf.server.protocol import Backend, BackendSettings
from pytest_specperf.server.supervisor import ServerProcess, ServerStartError, free_port


@dataclass
class ModelServer:
    """What the ``model_server`` fixture gives a test."""

    backend: Backend
    url: str
    client: ServerClient
    server_info: dict[str, Any]
    fingerprint: dict[str, Any]
    process: ServerProcess | None = None
    log_path: Path | None = None
    startup_s: float = 0.0
    attached: bool = False

    @property
    def run_dir(self) -> Path:
        """Where the server's probe writes step records (the backend's binding)."""
        return self.backend.run_dir

    @property
    def speculative(self) -> bool:
        return is_speculative(self.fingerprint)

    @property
    def cuda_graphs(self) -> bool:
        return bool(self.fingerprint.get("cuda_graphs"))

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines) if self.process else "(attached server: no log)"

    def exit_status(self) -> str | None:
        """How a launched server ended ("was killed by signal 9 (SIGKILL)"), None while it
        runs; always None for an attached server (not ours to watch)."""
        return self.process.exit_status() if self.process else None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


def _waiting(progress: Callable[..., None], name: str) -> Callable[[float], None]:
    return lambda s: progress(
        f"waiting for {name} to answer /health_generate: {s:.0f} s", throttle=True
    )


def start_server(
    backend: Backend,
    settings: BackendSettings,
    *,
    work_dir: Path,
    ready_timeout_s: float,
    progress: Callable[..., None],
) -> ModelServer:
    """Launch a server for ``backend`` on 127.0.0.1 and wait until it generates."""
    backend.check(settings)
    try:
        run_dir = make_run_dir(work_dir / "run")
    except RunDirError as e:
        raise ServerStartError(str(e)) from None
    log_path = work_dir / "server.log"
    last_error: Exception | None = None
    for _attempt in range(2):  # a port taken between free_port() and bind: retry once
        port = free_port()
        spec = backend.launch_spec(settings, port=port, run_dir=run_dir)
        proc = ServerProcess(
            spec.cmd, log_path=log_path, env={**os.environ, **spec.env}, name=spec.name
        )
        progress(f"starting {spec.name} on 127.0.0.1:{port} (log: {log_path})")
        proc.start()
        client = ServerClient(f"http://127.0.0.1:{port}")
        try:
            startup = proc.wait_ready(
                client,
                deadline_s=ready_timeout_s,
                progress=_waiting(progress, spec.name),
            )
        except ServerStartError as e:
            proc.stop()
            last_error = e
            if "address already in use" in str(e).lower():
                continue
            raise
        except BaseException:  # Ctrl-C while waiting, or anything unexpected
            proc.stop()
            raise
        try:
            info = client.server_info()
            fp = backend.fingerprint(info)
        except BaseException:
            proc.stop()
            raise
        progress(f"{spec.name} ready in {startup:.1f} s")
        return ModelServer(
            backend=backend,
            url=client.base_url,
            client=client,
            server_info=info,
            fingerprint=fp,
            process=proc,
            log_path=log_path,
            startup_s=startup,
        )
    assert last_error is not None
    raise last_error


#: Seconds an attached server may take to generate one token for /health_generate.
ATTACH_HEALTH_TIMEOUT_S = 60.0


def attach_server(backend: Backend, url: str, run_dir: Path | None) -> ModelServer:
    """Use a server someone else started; its step records must be readable here."""
    t0 = time.monotonic()
    problem = attach_problem(url, required=backend.server_info_fields)
    if problem is not None:
        raise ServerStartError(f"cannot attach to {url}: {problem}")
    client = ServerClient(url)
    try:
        client.get("/health_generate", timeout=ATTACH_HEALTH_TIMEOUT_S)
        info = client.with_timeout(ATTACH_DEADLINE_S).server_info()
    except (ServerUnreachable, ServerHTTPError) as e:
        raise ServerStartError(
            f"cannot attach to {url}: it answers /server_info but cannot generate: {e} "
            "(is it still loading the model?)"
        ) from None
    if run_dir is None:
        rd = info.get("run_dir")
        run_dir = Path(rd) if isinstance(rd, str) else None
    if run_dir is None or not run_dir.is_dir():
        raise ServerStartError(
            f"cannot find the step records of the server at {url}: pass "
            "--specperf-attach URL,run-dir=DIR, the directory the server's probe writes to "
            "(reference server: --run-dir; SGLang: SPECPERF_RUN_DIR with "
            "SPECPERF_SGLANG_PLUGIN=1 in the server's environment)"
        )
    backend.bind(run_dir)
    backend.check_attached(info)
    return ModelServer(
        backend=backend,
        url=client.base_url,
        client=client,
        server_info=info,
        fingerprint=backend.fingerprint(info),
        attached=True,
        startup_s=time.monotonic() - t0,
    )
