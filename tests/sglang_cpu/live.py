"""Real SGLang servers on the CPU for the live tests: environment, flags, a lazy pool.

A server here is ``python -m sglang.launch_server`` of SGLang 0.5.23 (installed by .ci/run
without its CUDA dependencies, see ``requirements.txt``) with the stand-ins of
``stand_in/`` on its ``PYTHONPATH`` and ``SGLANG_USE_CPU_ENGINE=1``: SGLang's own
scheduler, model runner, speculative workers, plugin loader and HookRegistry, on tiny
models with dummy weights (``models.py``). Bound to 127.0.0.1, in its own process group
(:class:`pytest_specperf.server.ServerProcess`), always stopped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specperf.server.client import ServerClient
from pytest_specperf.server.supervisor import ServerProcess, free_port

STAND_IN = Path(__file__).resolve().parent / "stand_in"
#: Modules the server needs beyond the dev install (a sample of requirements.txt: when
#: one is missing, the set was not installed).
NEEDED = (
    "sglang",
    "transformers",
    "fastapi",
    "uvicorn",
    "zmq",
    "orjson",
    "xgrammar",
    "torchvision",
    "msgspec",
    "uvloop",
    "compressed_tensors",
)
#: Flags of every live server: the CPU engine's, dummy weights, no tokenizer, one decode
#: log line per decode batch (the tests read it), a KV pool sized for the tests (without it
#: the CPU path sizes the pool from free RAM: tens of GB), and an idle scheduler that sleeps
#: in a poll of its sockets (without it, it polls them in a busy loop: an idle server took
#: 0.4 CPU-seconds a second on the loaded box, 0.03 with it, from the server beside it
#: that was measured or starting).
CPU_FLAGS = (
    "--device=cpu",
    "--sampling-backend=pytorch",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--skip-tokenizer-init",
    "--load-format=dummy",
    "--max-total-tokens=65536",
    "--decode-log-interval=1",
    "--enable-metrics",
    "--sleep-on-idle",
)
#: Chain drafts: 3 draft steps, topk 1, 4 tokens verified per step.
CHAIN = (
    "--speculative-num-steps=3",
    "--speculative-eagle-topk=1",
    "--speculative-num-draft-tokens=4",
    "--speculative-draft-load-format=dummy",
)
#: Speculative decoding on the CPU needs the intel_amx attention backend for its draft (the
#: stand-in provides its ops; sitecustomize sets the has_amx platform fact).
SPEC_BACKEND = ("--attention-backend=intel_amx",)
READY_S = 300.0
#: SGLang's cache (torch.compile's inductor output among it), read at import: pytester
#: points HOME at each test's own directory, which would recompile the draft's
#: torch.compile'd helpers (about 30 s) in every server a test starts.
CACHE_DIR = os.environ.get("SGLANG_CACHE_DIR") or os.path.expanduser("~/.cache/sglang")
#: The server's environment beyond the stand-ins' PYTHONPATH (also what a launch-mode test
#: hands its inner pytest, whose launcher passes its environment on to the server):
SERVER_ENV = {
    # SGLang's CPU engine (without it RoPE imports vllm's CUDA ops)
    "SGLANG_USE_CPU_ENGINE": "1",
    # one compute thread per server: the models are tiny, and torch's default of one
    # spinning OpenMP worker per core made every step many times slower on a shared
    # two-core box (gpu-check's rehearsal found the same); two servers run side by side
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # the one helper SGLang compiles on this path (spec_utils._select_top_k_tokens_later,
    # the draft loop's top-k bookkeeping; no hook target) runs eagerly: inductor on a CPU
    # builds C++ for it in every server, once per graph (EAGLE's and STANDALONE's differ),
    # 25-50 s before the first speculative step on a loaded box
    "TORCH_COMPILE_DISABLE": "1",
    # no py-spy/coredump diagnostics when the tests stop a server: SGLang sleeps 5 s for
    # them when its process group gets SIGTERM (the detokenizer's exit reads as a crash)
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}


def marks(timeout_s: int) -> list[Any]:
    """A live SGLang test module's ``pytestmark``: ``live_sglang``, a skip naming what is
    missing (an error instead under ``SPECPERF_REQUIRE_LIVE_SGLANG=1``: CI's live step must
    not pass by skipping), and the module's timeout."""
    import pytest

    reason = missing()
    if reason is not None and os.environ.get("SPECPERF_REQUIRE_LIVE_SGLANG") == "1":
        raise RuntimeError(f"SPECPERF_REQUIRE_LIVE_SGLANG=1 but {reason}")
    return [
        pytest.mark.live_sglang,
        pytest.mark.skipif(reason is not None, reason=reason or ""),
        pytest.mark.timeout(timeout_s),
    ]


def missing() -> str | None:
    """Why live SGLang cannot run here (None: it can)."""
    absent = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if absent:
        return (
            f"live SGLang needs its CPU dependency set (missing: {', '.join(absent)}); "
            "install it as .ci/run does: pip install --no-deps sglang==0.5.23 && "
            "pip install --no-deps -r tests/sglang_cpu/requirements.txt"
        )
    return None


def server_env(run_dir: Path | None, *, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a live server (or of a pytest that launches one): the stand-ins
    first on PYTHONPATH, the CPU engine on, and our plugin on when ``run_dir`` is given."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(STAND_IN) + (os.pathsep + path if path else "")
    env.update(SERVER_ENV)
    env["SGLANG_CACHE_DIR"] = CACHE_DIR
    env.pop("SPECPERF_SGLANG_PLUGIN", None)
    env.pop("SPECPERF_RUN_DIR", None)
    if run_dir is not None:
        env["SPECPERF_SGLANG_PLUGIN"] = "1"
        env["SPECPERF_RUN_DIR"] = str(run_dir)
    return env


def algorithm_args(algorithm: str | None, models: dict[str, Path]) -> tuple[str, ...]:
    """Server flags for ``algorithm`` (None: plain decoding) on the tiny models."""
    target = f"--model-path={models['target4']}"
    if algorithm is None:
        return (target, "--attention-backend=torch_native")
    draft = {"STANDALONE": "draft", "EAGLE": "eagle", "EAGLE3": "eagle3"}[algorithm]
    return (
        target,
        f"--speculative-algorithm={algorithm}",
        f"--speculative-draft-model-path={models[draft]}",
        *CHAIN,
        *SPEC_BACKEND,
    )


@dataclass
class LiveServer:
    name: str
    proc: ServerProcess
    client: ServerClient
    run_dir: Path | None
    log_path: Path
    started_s: float
    rids: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.client.base_url

    def generate(self, input_ids: Sequence[int], max_new_tokens: int, rid: str) -> dict[str, Any]:
        body = {
            "input_ids": list(input_ids),
            "rid": rid,
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        out = self.client.generate(body, timeout=300.0)
        assert isinstance(out, dict), out
        return out

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def records(self) -> list[dict[str, Any]]:
        import json

        assert self.run_dir is not None
        out = []
        for path in sorted(self.run_dir.glob("steps-*.jsonl")):
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return out

    def hooks_report(self) -> dict[str, Any]:
        import json

        assert self.run_dir is not None
        reports = sorted(self.run_dir.glob("hooks-*.json"))
        assert len(reports) == 1, reports
        data = json.loads(reports[0].read_text())
        assert isinstance(data, dict)
        return data


@dataclass
class Starting:
    """A server launched and not yet waited for (:func:`launch`; :meth:`ready` waits)."""

    name: str
    proc: ServerProcess
    client: ServerClient
    run_dir: Path | None
    log_path: Path
    t0: float

    def ready(self) -> LiveServer:
        """Wait until the server answers ``/health_generate``; stop it if it never does."""
        try:
            self.proc.wait_ready(self.client, deadline_s=READY_S)
        except BaseException:
            self.proc.stop()
            raise
        return LiveServer(
            self.name,
            self.proc,
            self.client,
            self.run_dir,
            self.log_path,
            time.monotonic() - self.t0,
        )


def launch(name: str, args: Sequence[str], work: Path, *, plugin: bool = True) -> Starting:
    """Start a live server without waiting for it (several can start side by side)."""
    run_dir = work / f"run-{name}" if plugin else None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = work / f"server-{name}.log"
    cmd = [
        os.environ.get("SPECPERF_LIVE_PYTHON", _python()),
        "-m",
        "sglang.launch_server",
        "--host=127.0.0.1",
        f"--port={port}",
        *CPU_FLAGS,
        *args,
    ]
    proc = ServerProcess(cmd, log_path=log, env=server_env(run_dir), name=f"sglang {name}")
    t0 = time.monotonic()
    proc.start()
    return Starting(name, proc, ServerClient(f"http://127.0.0.1:{port}"), run_dir, log, t0)


def start(name: str, args: Sequence[str], work: Path, *, plugin: bool = True) -> LiveServer:
    """Start a live server and wait until it is ready."""
    return launch(name, args, work, plugin=plugin).ready()


def _python() -> str:
    import sys

    return sys.executable


def stop_all(procs: Sequence[ServerProcess]) -> None:
    """Stop servers side by side (each stop waits for its process group to exit)."""
    if len(procs) <= 1:
        for proc in procs:
            proc.stop()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(lambda proc: proc.stop(), procs))


class Pool:
    """Servers started on first use (or ahead of it, :meth:`prestart`) and kept for later
    tests, at most ``keep`` at once, starting ones included (the least recently used one is
    stopped first: two cores and a CI runner's memory do not carry many; a server is three
    processes of about 0.6 GB each)."""

    def __init__(self, work: Path, models: dict[str, Path], keep: int = 2) -> None:
        self.work = work
        self.models = models
        self.keep = keep
        self._live: dict[str, LiveServer] = {}
        self._starting: dict[str, Starting] = {}
        self.startups: dict[str, float] = {}

    def _make_room(self, wanted: int) -> None:
        while self._live and len(self._live) + len(self._starting) + wanted > self.keep:
            self._live.pop(next(iter(self._live))).proc.stop()

    def _launch(self, algorithm: str | None) -> Starting:
        name = algorithm or "plain"
        return launch(
            name,
            algorithm_args(algorithm, self.models),
            self.work,
            plugin=algorithm is not None,
        )

    def prestart(self, *algorithms: str | None) -> None:
        """Launch the servers of ``algorithms`` (None: plain) now, side by side, without
        waiting for them; :meth:`get` waits. Ones already live or starting are kept; no more
        than ``keep`` are launched."""
        todo = [a for a in dict.fromkeys(algorithms) if (a or "plain") not in self._live]
        todo = [a for a in todo if (a or "plain") not in self._starting][: self.keep]
        self._make_room(len(todo))
        for algorithm in todo:
            if len(self._live) + len(self._starting) < self.keep:
                self._starting[algorithm or "plain"] = self._launch(algorithm)

    def get(self, algorithm: str | None) -> LiveServer:
        name = algorithm or "plain"
        server = self._live.pop(name, None)
        if server is None:
            starting = self._starting.pop(name, None)
            if starting is None:
                self._make_room(1)
                starting = self._launch(algorithm)
            try:
                server = starting.ready()
            finally:
                self.startups[name] = time.monotonic() - starting.t0
        self._live[name] = server  # most recently used last
        return server

    def names(self) -> list[str | None]:
        """The servers live or starting (None: plain decoding)."""
        return [None if n == "plain" else n for n in (*self._live, *self._starting)]

    def stop(self, *algorithms: str | None) -> None:
        """Stop these servers (live or starting) now, side by side."""
        names = [a or "plain" for a in algorithms]
        procs = [self._live.pop(n).proc for n in names if n in self._live]
        procs += [self._starting.pop(n).proc for n in names if n in self._starting]
        stop_all(procs)

    def close(self) -> None:
        procs = [s.proc for s in self._live.values()] + [s.proc for s in self._starting.values()]
        self._live.clear()
        self._starting.clear()
        stop_all(procs)


_DECODE = re.compile(r"Decode batch.*?#running-req: (\d+).*?accept len: ([0-9.]+)")


def decode_log(text: str) -> list[tuple[int, float]]:
    """(running requests, accept length) of every ``Decode batch`` line of a server log."""
    return [(int(m.group(1)), float(m.group(2))) for m in _DECODE.finditer(text)]


def prompt(n: int, seed: int = 1) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1000, 3800) for _ in range(n)]


def iter_files(run_dir: Path, pattern: str) -> Iterator[Path]:
    yield from sorted(run_dir.glob(pattern))
