"""HTTP server for the reference engine, speaking the subset of SGLang's native API the
plugin uses.

    python -m pytest_specperf.engines.reference.server --host 127.0.0.1 --port 30000 \\
        --config tiny --speculative-algorithm DFLASH --speculative-num-draft-tokens 8 \\
        --run-dir /tmp/specperf-run

Endpoints: ``GET /health``, ``GET /health_generate``, ``GET /get_model_info``,
``GET /server_info``, ``POST /generate``, ``POST /flush_cache``,
``POST /specperf/kv_layout``. Built on the standard library's ``http.server``
(``ThreadingHTTPServer``), so the server runs wherever torch runs, GPU boxes without
internet included. HTTP is parsed on handler threads; all engine work runs on the main
thread, one job at a time (PyTorch's CPU kernels run about half as fast when called from
a thread other than the one whose OpenMP pool is warm). A bad request gets a 4xx JSON
error and the server keeps serving.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from pytest_specperf import __version__
from pytest_specperf.engines.protocol import ENV_INJECT, ENV_NVTX
from pytest_specperf.engines.reference.config import CONFIGS, get_config
from pytest_specperf.engines.reference.engine import (
    ALGORITHMS,
    Engine,
    GenRequest,
    GenResult,
    RequestError,
)
from pytest_specperf.engines.reference.kv import LAYOUTS
from pytest_specperf.probe.inject import Injector, parse_inject

#: Request bodies above this size are refused with 413 before being read.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: A profiler left running longer than this stops by itself (no trace kept).
PROFILE_MAX_S = 600.0
#: Seconds a SIGTERM waits for the running job before the process exits anyway.
STOP_GRACE_S = 5.0
#: Largest ``max_new_tokens`` accepted in one request.
MAX_NEW_TOKENS_LIMIT = 65536
_GENERATE_KEYS = {
    "input_ids",
    "context_len",
    "sampling_params",
    "rid",
    "synthetic_seed",
    "stream",
    "return_logprob",
    "text",
}
_SAMPLING_KEYS = {"max_new_tokens", "temperature", "ignore_eos"}


class HTTPError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _bad(message: str) -> HTTPError:
    return HTTPError(HTTPStatus.BAD_REQUEST, message)


def _int(value: Any, name: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not lo <= value <= hi:
        raise _bad(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _one_or_list(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise _bad(f"{name} has {len(value)} entries for a batch of {n}")
        return value
    return [value] * n


def parse_generate(body: Any, engine: Engine) -> tuple[list[GenRequest], bool]:
    """Validate a ``/generate`` body; return the requests and whether it was a batch."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    unknown = sorted(set(body) - _GENERATE_KEYS)
    if unknown:
        raise _bad(
            f"unknown field(s) {', '.join(unknown)}; supported: {', '.join(sorted(_GENERATE_KEYS))}"
        )
    if body.get("text") is not None:
        raise _bad("this engine has no tokenizer: send input_ids (or context_len), not text")
    if body.get("stream"):
        raise _bad("streaming is not supported by the reference engine; send stream=false")
    if body.get("return_logprob"):
        raise _bad("return_logprob is not supported by the reference engine")
    cfg = engine.cfg
    ids = body.get("input_ids")
    ctx = body.get("context_len")
    if (ids is None) == (ctx is None):
        raise _bad("give exactly one of input_ids and context_len")
    prompts: list[tuple[list[int] | None, int | None]]
    if ids is not None:
        if not isinstance(ids, list) or not ids:
            raise _bad("input_ids must be a non-empty list of token ids (or a list of such lists)")
        batch = isinstance(ids[0], list)
        rows = ids if batch else [ids]
        prompts = []
        for i, row in enumerate(rows):
            if not isinstance(row, list) or not row:
                raise _bad(f"input_ids[{i}] must be a non-empty list of token ids")
            for t in row:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise _bad(f"input_ids must hold integers, got {type(t).__name__} {t!r:.40}")
                if not 0 <= t < cfg.vocab_size:
                    raise _bad(f"token id {t} is outside the vocabulary [0, {cfg.vocab_size})")
            prompts.append((row, None))
    else:
        batch = isinstance(ctx, list)
        lens = ctx if batch else [ctx]
        if not lens:
            raise _bad("context_len list is empty")
        prompts = [(None, _int(c, "context_len", lo=1, hi=cfg.max_context_len)) for c in lens]
    n = len(prompts)
    if n > cfg.max_batch_size:
        raise _bad(f"batch of {n} requests exceeds the maximum batch size {cfg.max_batch_size}")
    sps = _one_or_list(body.get("sampling_params", {}), n, "sampling_params")
    rids = _one_or_list(body.get("rid"), n, "rid")
    seeds = _one_or_list(body.get("synthetic_seed", 0), n, "synthetic_seed")
    reqs = []
    for (row, c), sp, rid, seed in zip(prompts, sps, rids, seeds):
        if not isinstance(sp, dict):
            raise _bad("sampling_params must be an object")
        extra = sorted(set(sp) - _SAMPLING_KEYS)
        if extra:
            raise _bad(
                f"unsupported sampling_params {', '.join(extra)}; supported: "
                f"{', '.join(sorted(_SAMPLING_KEYS))} (greedy decoding only)"
            )
        temp = sp.get("temperature", 0)
        if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp != 0:
            raise _bad(f"temperature must be 0 (greedy decoding only), got {temp!r:.40}")
        mnt = _int(sp.get("max_new_tokens", 128), "max_new_tokens", lo=1, hi=MAX_NEW_TOKENS_LIMIT)
        ignore_eos = sp.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise _bad(f"ignore_eos must be true or false, got {ignore_eos!r:.40}")
        if rid is None:
            rid = uuid.uuid4().hex
        if not isinstance(rid, str) or not 0 < len(rid) <= 200:
            raise _bad("rid must be a non-empty string of at most 200 characters")
        seed = _int(seed, "synthetic_seed", lo=0, hi=2**63 - 1)
        req = GenRequest(
            rid=rid,
            max_new_tokens=mnt,
            input_ids=row,
            context_len=c,
            ignore_eos=ignore_eos,
            seed=seed,
        )
        try:
            engine.validate(req)
        except RequestError as e:
            raise _bad(str(e)) from None
        reqs.append(req)
    if len({r.rid for r in reqs}) != len(reqs):
        raise _bad("rid values in a batch must be distinct")
    return reqs, batch


def result_json(res: GenResult) -> dict[str, Any]:
    return {
        "text": "",
        "output_ids": res.output_ids,
        "meta_info": {
            "id": res.rid,
            "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens,
            "spec_verify_ct": res.spec_verify_ct,
            "spec_accept_length": round(res.spec_accept_length, 4),
            "e2e_latency": round(res.e2e_latency, 6),
            "finish_reason": {"type": res.finish_reason},
            "specperf": {
                "kv_layout": res.kv_layout,
                "kv_fragmentation": round(res.kv_fragmentation, 6),
                "kv_pages": res.kv_pages,
                "synthetic_prefill": res.synthetic_prefill,
                "reference_ms": None if res.reference_ms is None else round(res.reference_ms, 4),
            },
        },
    }


_T = TypeVar("_T")


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


class ReferenceServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        addr: tuple[str, int],
        engine: Engine,
        *,
        run_dir: str,
        max_body_bytes: int,
        quiet: bool,
    ) -> None:
        super().__init__(addr, _Handler)
        self.engine = engine
        self.run_dir = run_dir
        self.max_body_bytes = max_body_bytes
        self.quiet = quiet
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.profiler: Any = None
        self.profiler_started = 0.0
        self.started = time.time()
        self.http_counters = {"requests": 0, "errors": 0}

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


class _Handler(BaseHTTPRequestHandler):
    server: ReferenceServer
    protocol_version = "HTTP/1.1"
    server_version = f"specperf-reference/{__version__}"

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {format % args}\n")

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self.server.http_counters["errors"] += 1
        self._send(status, {"error": {"message": message, "code": int(status)}})

    def _body(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise HTTPError(
                HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not supported; send Content-Length"
            )
        length = self.headers.get("Content-Length")
        if length is None:
            raise HTTPError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise _bad(f"Content-Length {length!r:.40} is not a number") from None
        if n < 0:
            self.close_connection = True
            raise _bad("Content-Length is negative")
        if n > self.server.max_body_bytes:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise HTTPError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {n} bytes exceeds the limit of {self.server.max_body_bytes} bytes",
            )
        raw = self.rfile.read(n)
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _bad(f"malformed JSON: {e}") from None

    def _dispatch(self, routes: dict[str, Any]) -> None:
        self.server.http_counters["requests"] += 1
        handler = routes.get(self.path.split("?", 1)[0])
        try:
            if handler is None:
                self._drain()
                raise HTTPError(HTTPStatus.NOT_FOUND, f"no route {self.command} {self.path}")
            handler()
        except HTTPError as e:
            self._error(e.status, e.message)
        except Exception as e:  # engine bug: report it, keep serving
            self.log_message("internal error: %r", e)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")

    def _drain(self) -> None:
        if self.command == "POST":
            n = int(self.headers.get("Content-Length") or 0)
            if 0 < n <= self.server.max_body_bytes:
                self.rfile.read(n)
            elif n:
                self.close_connection = True

    def do_GET(self) -> None:
        self._dispatch(
            {
                "/health": lambda: self._send(200, {"status": "ok"}),
                "/health_generate": self._health_generate,
                "/server_info": self._server_info,
                "/get_server_info": self._server_info,
                "/get_model_info": self._model_info,
            }
        )

    def do_POST(self) -> None:
        self._dispatch(
            {
                "/generate": self._generate,
                "/flush_cache": self._flush_cache,
                "/specperf/kv_layout": self._kv_layout,
                "/specperf/profile": self._profile,
            }
        )

    # -- endpoints -------------------------------------------------------------------------
    def _health_generate(self) -> None:
        req = GenRequest(
            rid=f"health-{uuid.uuid4().hex[:8]}",
            max_new_tokens=1,
            input_ids=[3, 4, 5, 6],
            ignore_eos=True,
        )
        self.server.on_engine(lambda: self.server.engine.generate([req]))
        self._send(200, {"status": "ok"})

    def _model_info(self) -> None:
        eng = self.server.engine
        self._send(
            200,
            {
                "model_path": f"specperf-reference/{eng.cfg.name}",
                "is_generation": True,
                "vocab_size": eng.cfg.vocab_size,
            },
        )

    def _server_info(self) -> None:
        eng = self.server.engine
        info = self.server.on_engine(eng.info)
        info.update(
            {
                "version": __version__,
                "run_dir": self.server.run_dir,
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.server.started, 3),
                "http_counters": dict(self.server.http_counters),
                "internal_states": [{"avg_spec_accept_length": eng.mean_accept_length()}],
            }
        )
        self._send(200, info)

    def _generate(self) -> None:
        body = self._body()
        eng = self.server.engine
        reqs, batch = parse_generate(body, eng)
        srv = self.server
        if srv.profiler is not None and time.monotonic() - srv.profiler_started > PROFILE_MAX_S:
            prof, srv.profiler = srv.profiler, None  # forgotten: stop it, keep no trace
            srv.on_engine(prof.stop)
        try:
            results = self.server.on_engine(lambda: eng.generate(reqs))
        except RequestError as e:
            raise _bad(str(e)) from None
        out = [result_json(r) for r in results]
        self._send(200, out if batch else out[0])

    def _flush_cache(self) -> None:
        self._body()
        self.server.on_engine(self.server.engine.flush_cache)
        self._send(200, {"success": True, "message": "Cache flushed."})

    def _profile(self) -> None:
        """``{"action": "start"}`` / ``{"action": "stop"}``: the PyTorch profiler around the
        engine's requests in between. The trace (Chrome format) is written inside the run
        directory under a name the server chooses, returned as ``path``; a profiler left
        running stops by itself after PROFILE_MAX_S."""
        body = self._body()
        if not isinstance(body, dict) or set(body) - {"action"}:
            raise _bad('the body must be {"action": "start"} or {"action": "stop"}')
        srv = self.server
        action = body.get("action")
        if action == "start":
            if srv.profiler is not None:
                raise HTTPError(HTTPStatus.CONFLICT, "the profiler is already running")
            srv.profiler = srv.on_engine(lambda: _start_profiler(srv.engine.device.type))
            srv.profiler_started = time.monotonic()
            self._send(200, {"success": True, "profiling": True})
            return
        if action != "stop":
            raise _bad(f"unknown profile action {action!r:.40}; use start or stop")
        if srv.profiler is None:
            raise HTTPError(HTTPStatus.CONFLICT, "the profiler is not running")
        prof, srv.profiler = srv.profiler, None
        out_dir = os.path.join(srv.run_dir, "profiles")
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        path = os.path.join(out_dir, f"trace-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
        srv.on_engine(lambda: (prof.stop(), prof.export_chrome_trace(path)))
        self._send(200, {"success": True, "path": path})

    def _kv_layout(self) -> None:
        body = self._body()
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object")
        unknown = sorted(set(body) - {"layout", "level", "seed"})
        if unknown:
            raise _bad(f"unknown field(s) {', '.join(unknown)}; supported: layout, level, seed")
        layout = body.get("layout")
        if layout not in LAYOUTS:
            raise _bad(f"unknown KV layout {layout!r:.40}; choose one of: {', '.join(LAYOUTS)}")
        level = body.get("level", 1.0 if layout == "fragmented" else 0.0)
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 <= level <= 1:
            raise _bad(f"level must be a number in [0, 1], got {level!r:.40}")
        seed = _int(body.get("seed", 0), "seed", lo=0, hi=2**63 - 1)
        self.server.on_engine(lambda: self.server.engine.set_kv_layout(layout, float(level), seed))
        self._send(
            200,
            {
                "success": True,
                "layout": layout,
                "level": float(level),
                "seed": seed,
                "applies_to": "next /generate",
            },
        )


def _start_profiler(device_type: str) -> Any:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities)
    prof.start()
    return prof


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
        help="directory for step records (created 0700); default: a new temp dir",
    )
    p.add_argument("--no-probe", action="store_true", help="run without the phase probe")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--quiet", action="store_true", help="do not log each HTTP request")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from pytest_specperf.probe import NullProbe, RunDirSink, StepProbe

    if args.threads is not None:
        if args.threads < 1:
            print(f"error: --threads must be at least 1, got {args.threads}", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {device} requested but CUDA is not available", file=sys.stderr)
        return 2
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="specperf-run-")
    injector, labels = None, {}
    spec_text = os.environ.get(ENV_INJECT, "").strip()
    if spec_text:
        try:
            spec = parse_inject(spec_text)
        except ValueError as e:
            print(f"error: {ENV_INJECT}={spec_text!r}: {e}", file=sys.stderr)
            return 2
        injector, labels = Injector(spec, device=device), {"inject": str(spec)}
        print(f"canary injection active: {spec}", flush=True)
    sink = None if args.no_probe else RunDirSink(run_dir)
    probe = (
        NullProbe()
        if sink is None
        else StepProbe(
            sink,
            use_cuda=device.startswith("cuda"),
            labels=labels,
            injector=injector,
            nvtx=os.environ.get(ENV_NVTX) == "1",
        )
    )
    try:
        engine = Engine(
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
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        server = ReferenceServer(
            (args.host, args.port),
            engine,
            run_dir=run_dir,
            max_body_bytes=args.max_body_bytes,
            quiet=args.quiet,
        )
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    if sink is not None:
        sink.write_meta(
            "server",
            {"host": host, "port": port, "pid": os.getpid(), "fingerprint": engine.fingerprint()},
        )

    def _stop(signum: int, frame: Any) -> None:
        # End the engine loop after the current job (queued from another thread: the main
        # thread may hold the queue's lock right now), and exit hard if that job hangs.
        threading.Thread(target=server.jobs.put, args=(None,), daemon=True).start()
        timer = threading.Timer(STOP_GRACE_S, os._exit, args=(3,))
        timer.daemon = True  # only fires if the process is still running then
        timer.start()

    signal.signal(signal.SIGTERM, _stop)
    print(
        f"specperf reference server ({engine.algorithm}, config {engine.cfg.name}, "
        f"{device}) listening on http://{host}:{port} run_dir={run_dir}",
        flush=True,
    )
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
