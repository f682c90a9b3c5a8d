"""Entry point of the reference server process, speaking the subset of SGLang's native
API the plugin uses.

    python -m pytest_specperf.engines.reference.server --host 127.0.0.1 --port 30000 \\
        --config tiny --speculative-algorithm DFLASH --speculative-num-draft-tokens 8 \\
        --run-dir /tmp/specperf-run

Endpoints: ``GET /health``, ``GET /health_generate``, ``GET /get_model_info``,
``GET /server_info``, ``POST /generate``, ``POST /flush_cache``,
``POST /specperf/kv_layout``, ``POST /specperf/profile``. Request bodies are validated
in ``schema``, HTTP framing and limits live in ``http``; this module parses the command
line and starts the process: run directory, probe, socket, engine, signal handling.
Start-up errors print one ``error:`` line naming the fix and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from typing import Any

from pytest_specperf.engines.env import ProbeEnvError, probe_setup
from pytest_specperf.engines.reference.config import CONFIGS, get_config
from pytest_specperf.engines.reference.engine import ALGORITHMS, Engine
from pytest_specperf.engines.reference.http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TIMEOUT_S,
    HTTPLimits,
    ReferenceServer,
)
from pytest_specperf.probe import NullProbe, RunDirError, RunDirSink, StepProbe, make_run_dir

#: Seconds a SIGTERM waits for the running job before the process exits anyway.
STOP_GRACE_S = 5.0
#: Exit status of a start-up error (bad flag, unusable run directory, port taken).
EXIT_USAGE = 2


class StartupError(Exception):
    """A start-up problem; the message is printed as ``error: <message>``."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pytest_specperf.engines.reference.server",
        allow_abbrev=False,
        description="Reference speculative-decoding server (SGLang-compatible HTTP subset).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    p.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="default: float32 on CPU, bfloat16 on CUDA",
    )
    p.add_argument("--speculative-algorithm", default="DFLASH", choices=ALGORITHMS)
    p.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=8,
        help="DFlash block size: tokens verified per step (default 8)",
    )
    p.add_argument(
        "--simulate-accept-len",
        type=float,
        default=None,
        help="pin the mean accepted tokens per step (like SGLANG_SIMULATE_ACC_LEN); "
        "outputs then differ from greedy decoding",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="PyTorch CPU threads (default: PyTorch's choice, one per core)",
    )
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument(
        "--run-dir",
        default=None,
        help="directory for step records: created (mode 0700) if missing, else it must be "
        "empty and yours; default: a new temp dir",
    )
    p.add_argument("--no-probe", action="store_true", help="run without the phase probe")
    _add_http_flags(p)
    p.add_argument("--quiet", action="store_true", help="do not log each HTTP request")
    return p


def _add_http_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="larger request bodies get 413 (default %(default)s)",
    )
    p.add_argument(
        "--http-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a connection may idle or take to send a request's head; "
        "socket timeout (default %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections served at once; more get 503 (default %(default)s)",
    )


def _device(args: argparse.Namespace) -> str:
    """Configure torch's threads and return the device to run on."""
    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise StartupError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    device = str(args.device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise StartupError(f"--device {device} requested but CUDA is not available")
    return device


def _run_dir(args: argparse.Namespace) -> str:
    if args.run_dir is None:
        return tempfile.mkdtemp(prefix="specperf-run-")  # fresh, mode 0700
    try:
        return str(make_run_dir(args.run_dir))
    except RunDirError as e:
        raise StartupError(f"--run-dir: {e}") from None


def _limits(args: argparse.Namespace) -> HTTPLimits:
    try:
        return HTTPLimits(
            max_body_bytes=args.max_body_bytes,
            timeout_s=args.http_timeout,
            max_connections=args.max_connections,
        )
    except ValueError as e:
        raise StartupError(str(e)) from None


def _listen(args: argparse.Namespace, run_dir: str, limits: HTTPLimits) -> ReferenceServer:
    """Bind the socket before the probe exists: a port taken leaves the run dir empty."""
    try:
        return ReferenceServer(
            (args.host, args.port), run_dir=run_dir, limits=limits, quiet=args.quiet
        )
    except OSError as e:
        raise StartupError(f"cannot listen on {args.host}:{args.port}: {e}") from None


_Probe = tuple[StepProbe | NullProbe, RunDirSink | None]


def _probe(args: argparse.Namespace, device: str, run_dir: str) -> _Probe:
    """The phase probe (configured from SPECPERF_INJECT / SPECPERF_NVTX) and its sink."""
    try:  # the run dir's control file switches injections while the server runs
        setup = probe_setup(device=device, run_dir=run_dir)
    except ProbeEnvError as e:
        raise StartupError(str(e)) from None
    if setup.inject:
        print(f"canary injection active: {setup.inject}", flush=True)
    if args.no_probe:
        return NullProbe(), None
    try:
        sink = RunDirSink(run_dir)
        sink.start_heartbeat()  # the progress the client watches for a frozen server
    except RunDirError as e:
        raise StartupError(f"--run-dir: {e}") from None
    except OSError as e:
        raise StartupError(f"--run-dir: cannot write its progress file: {e}") from None
    return setup.build(sink, use_cuda=device.startswith("cuda")), sink


def _engine(args: argparse.Namespace, device: str, probe: StepProbe | NullProbe) -> Engine:
    try:
        return Engine(
            get_config(args.config),
            device=device,
            algorithm=args.speculative_algorithm,
            num_draft_tokens=args.speculative_num_draft_tokens,
            simulate_accept_len=args.simulate_accept_len,
            probe=probe,
            cuda_graphs=not args.disable_cuda_graph,
            dtype=args.dtype,
        )
    except ValueError as e:
        raise StartupError(str(e)) from None


def _install_sigterm(server: ReferenceServer) -> None:
    def _stop(signum: int, frame: Any) -> None:
        # End the engine loop after the current job (queued from another thread: the main
        # thread may hold the queue's lock right now), and exit hard if that job hangs.
        threading.Thread(target=server.jobs.put, args=(None,), daemon=True).start()
        timer = threading.Timer(STOP_GRACE_S, os._exit, args=(3,))
        timer.daemon = True  # only fires if the process is still running then
        timer.start()

    signal.signal(signal.SIGTERM, _stop)


def _serve(server: ReferenceServer, probe: StepProbe | NullProbe) -> None:
    """Serve HTTP on a thread and run engine jobs on this one until SIGTERM or Ctrl-C."""
    http = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.2},
        name="specperf-http",
        daemon=True,
    )
    http.start()
    try:
        server.run_engine_loop()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        probe.close()


def start(args: argparse.Namespace) -> tuple[ReferenceServer, StepProbe | NullProbe]:
    """Everything before serving: device, run directory, socket, probe, engine."""
    limits = _limits(args)
    device = _device(args)
    run_dir = _run_dir(args)  # the first thing written: after every check of the flags
    server = _listen(args, run_dir, limits)
    try:
        probe, sink = _probe(args, device, run_dir)
        engine = _engine(args, device, probe)
    except BaseException:
        server.server_close()
        raise
    server.attach(engine)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    if sink is not None:
        sink.write_meta(
            "server",
            {"host": host, "port": port, "pid": os.getpid(), "fingerprint": engine.fingerprint()},
        )
    print(
        f"specperf reference server ({engine.algorithm}, config {engine.cfg.name}, "
        f"{device}) listening on http://{host}:{port} run_dir={run_dir}",
        flush=True,
    )
    return server, probe


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        server, probe = start(args)
    except StartupError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    _install_sigterm(server)
    _serve(server, probe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
