"""The reference engine's GPU paths, exercised on the CPU.

* No hidden sync in a decode step: while a step runs, torch entry points that build a
  tensor from Python data or read one back (``torch.tensor``, ``.item()``, ``.tolist()``,
  ``int(t)``, ...) are patched to record their caller (``SyncRecorder``, a runtime check:
  it follows every call the step really makes, through the model, attention and graph
  code, which a static check of the step functions would not). Only the staging module
  may call them: its pinned copies and its one read-back per step.
* CUDA-graph capture through a test double of the capture backend (``FakeCapture``
  replays by rerunning the captured function on the static inputs and writing the static
  outputs in place, as a graph replay does; ``FailingCapture`` refuses like a capture that
  hits an operation not permitted while capturing).
* The KV bytes a verify moves, and the zeroed KV pool.
"""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_specperf.engines.reference.config import get_config
from pytest_specperf.engines.reference.engine import Engine, GenRequest
from pytest_specperf.engines.reference.kv import KVPool
from pytest_specperf.probe import StepProbe
from pytest_specperf.telemetry.bandwidth import kv_read_bytes

STAGING = "pytest_specperf.engines.reference.staging"


class FakeCapture:
    """Test double of ``CudaCapture``: capture runs the function once and keeps it; a
    replay reruns it on the (static) inputs and copies into the static outputs."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def capture(self, fn: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, tuple[Any, ...]]:
        self.captures += 1
        out = fn(**inputs)
        out = out if isinstance(out, tuple) else (out,)
        return (fn, inputs, out), out

    def replay(self, graph: Any) -> None:
        fn, inputs, out = graph
        new = fn(**inputs)
        for static, fresh in zip(out, new if isinstance(new, tuple) else (new,)):
            static.copy_(fresh)
        self.replays += 1


class FailingCapture:
    """Test double of a capture that fails the way CUDA refuses a sync inside a capture."""

    def __init__(self) -> None:
        self.attempts = 0

    def capture(self, fn: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, tuple[Any, ...]]:
        self.attempts += 1
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def replay(self, graph: Any) -> None:
        raise AssertionError("nothing was captured")


class SyncRecorder:
    """Records, while ``active``, calls that build tensors from Python data or read
    tensors back, made from any module but the staging module."""

    BUILDERS = ("tensor", "as_tensor", "asarray")
    READERS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active = False
        self.calls: list[str] = []
        for name in self.BUILDERS:
            monkeypatch.setattr(torch, name, self._wrap(getattr(torch, name), f"torch.{name}"))
        for name in self.READERS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(original, f"Tensor.{name}"))

    def _wrap(self, fn: Any, label: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                caller = sys._getframe(1)
                module = caller.f_globals.get("__name__", "?")
                if module != STAGING:
                    self.calls.append(f"{label} from {module}:{caller.f_lineno}")
            return fn(*args, **kwargs)

        return wrapper


_ENGINES: dict[str, Engine] = {}


def _engine(
    algorithm: str = "DFLASH",
    *,
    graph_capture: Any = None,
    probe: Any = None,
    simulate_accept_len: float | None = None,
) -> Engine:
    """A tiny CPU engine (built once per algorithm, reset per use): graphs through
    ``graph_capture`` when given, else eager."""
    from pytest_specperf.engines.reference.graphs import GraphRunner
    from pytest_specperf.probe import NullProbe

    eng = _ENGINES.get(algorithm)
    if eng is None:
        eng = _ENGINES[algorithm] = Engine(get_config("tiny"), algorithm=algorithm)
    eng.graphs = GraphRunner(eng, graph_capture) if graph_capture is not None else None
    eng.probe = probe if probe is not None else NullProbe()
    eng.simulate_accept_len = simulate_accept_len
    eng.graph_counters = {}
    eng.counters = dict.fromkeys(eng.counters, 0)
    return eng


def _watch_steps(
    eng: Engine, recorder: SyncRecorder, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Activate ``recorder`` inside every decode step; the read-backs per step."""
    name = "_step_dflash" if eng.algorithm == "DFLASH" else "_step_greedy"
    original = getattr(eng, name)
    per_step: list[int] = []

    def watched(batch: Any) -> None:
        before = eng._d2h.fetches
        recorder.active = True
        try:
            original(batch)
        finally:
            recorder.active = False
        per_step.append(eng._d2h.fetches - before)

    monkeypatch.setattr(eng, name, watched)
    return per_step


def _prompt(seed: int, n: int = 64) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 4096) for _ in range(n)]


@pytest.mark.parametrize(
    ("algorithm", "capture", "simulate"),
    [("DFLASH", None, None), ("DFLASH", "fake", None), ("DFLASH", "fake", 3.0),
     ("NONE", None, None), ("NONE", "fake", None)],
    ids=["dflash-eager", "dflash-graphs", "dflash-graphs-simulated", "none-eager",
         "none-graphs"],
)
def test_decode_step_builds_no_tensor_from_lists_and_reads_back_once(
    monkeypatch: pytest.MonkeyPatch, algorithm: str, capture: str | None, simulate: float | None
) -> None:
    eng = _engine(algorithm, graph_capture=FakeCapture() if capture else None,
                  simulate_accept_len=simulate)
    recorder = SyncRecorder(monkeypatch)
    per_step = _watch_steps(eng, recorder, monkeypatch)
    eng.set_kv_layout("fragmented", 0.5, 1)
    reqs = [GenRequest(f"s{i}", 12, context_len=500 + 150 * i, ignore_eos=True, seed=i)
            for i in range(3)]
    eng.generate(reqs)
    assert per_step and recorder.calls == []
    assert per_step == [1] * len(per_step)  # the accept phase's one read-back


def test_recorder_catches_a_hidden_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a pageable list copy and an .item() inside a step."""
    eng = _engine("NONE")
    recorder = SyncRecorder(monkeypatch)
    original = eng._step_greedy

    def leaky(batch: Any) -> None:
        torch.tensor([lr.seq_len for lr in batch])
        original(batch)
        torch.zeros(1).item()

    monkeypatch.setattr(eng, "_step_greedy", leaky)
    _watch_steps(eng, recorder, monkeypatch)
    eng.generate([GenRequest("leak", 3, input_ids=_prompt(0), ignore_eos=True)])
    assert any(c.startswith("torch.tensor from") for c in recorder.calls)
    assert any(c.startswith("Tensor.item from") for c in recorder.calls)


@pytest.mark.parametrize("algorithm", ["DFLASH", "NONE"])
def test_graph_path_decodes_exactly_like_eager(algorithm: str) -> None:
    """Device page table, padded buckets and static buffers give the eager tokens."""
    reqs = [GenRequest(f"g{i}", 24, context_len=700 + 500 * i, ignore_eos=True, seed=i)
            for i in range(2)]
    outs, replays = [], []
    for capture in (FakeCapture(), None):
        eng = _engine(algorithm, graph_capture=capture)
        eng.set_kv_layout("fragmented", 1.0, 4)
        outs.append([r.output_ids for r in eng.generate(reqs)])
        runner = "target_verify" if algorithm == "DFLASH" else "target_decode"
        replays.append(eng.graph_counters[runner]["replay"])
    assert outs[0] == outs[1]
    assert replays[0] > 0 and replays[1] == 0


def test_capture_counted_apart_from_replay() -> None:
    probe = StepProbe(None)
    fake = FakeCapture()
    eng = _engine(probe=probe, graph_capture=fake)
    eng.generate([GenRequest("c", 20, context_len=600, ignore_eos=True)])
    recs = probe.take_completed()
    first, rest = recs[0].graphs, recs[1:]
    assert (first["target_verify"].capture, first["target_verify"].replay) == (1, 0)
    assert (first["draft"].capture, first["draft"].replay) == (1, 0)
    assert all(r.graphs["target_verify"].replay == 1 for r in rest)
    assert all(r.graphs["target_verify"].capture == 0 for r in rest)
    counters = eng.info()["graph_counters"]["target_verify"]
    assert counters == {"replay": len(rest), "eager": 0, "capture": 1}
    assert fake.captures == 2  # verify and draft, one page bucket
    (verify,) = [g for g in eng.info()["cuda_graphs"]["captured"] if g["runner"] == "target_verify"]
    assert verify["replays"] == len(rest) and verify["capture_ms"] > 0


def test_failed_capture_falls_back_to_eager_with_a_reason() -> None:
    probe = StepProbe(None)
    failing = FailingCapture()
    eng = _engine(probe=probe, graph_capture=failing)
    req = GenRequest("f", 16, input_ids=_prompt(5), ignore_eos=True)
    first = eng.generate([req])[0]
    again = eng.generate([req])[0]  # no retry, no error: the shape stays eager
    info = eng.info()
    recs = probe.take_completed()
    assert first.output_ids == again.output_ids == _engine().generate([req])[0].output_ids
    assert failing.attempts == 2  # verify and draft, once each
    reasons = info["cuda_graphs"]["fallback_reasons"]
    assert any("capture failed (RuntimeError: CUDA error: operation not permitted" in r
               for r in reasons)
    assert len(info["cuda_graphs"]["capture_failures"]) == 2
    assert info["graph_counters"]["target_verify"]["eager"] == first.spec_verify_ct * 2
    assert info["graph_counters"]["target_verify"]["replay"] == 0
    assert info["graph_counters"]["target_verify"]["capture"] == 0
    assert all(r.graphs["target_verify"].eager == 1 for r in recs)


MEDIUM_BYTES_PER_TOKEN = 2 * 16 * 8 * 128 * 2  # K and V, 16 layers, 8 KV heads, 128 dims, bf16


def test_bandwidth_counts_the_bytes_the_path_moves() -> None:
    """At 46k on the medium config: the context's KV is 3.0 GB; the graph path gathers
    the 3072-page bucket into a copy and reads it again (three passes): 9.7 GB."""
    graph = {"bytes_per_token": MEDIUM_BYTES_PER_TOKEN, "page_size": 16, "gather_passes": 3,
             "padded_bucket": {"min_pages": 64, "linear_step_pages": 512}}
    eager = {k: v for k, v in graph.items() if k != "padded_bucket"}
    assert pytest.approx(3.0e9, rel=0.01) == MEDIUM_BYTES_PER_TOKEN * 46000
    assert kv_read_bytes(graph, 46000, 1, 0.0) == 3 * 3072 * 16 * MEDIUM_BYTES_PER_TOKEN
    assert kv_read_bytes(graph, 46000, 1, 0.0) == pytest.approx(9.7e9, rel=0.01)
    assert kv_read_bytes(eager, 46000, 1, 0.0) == 46000 * MEDIUM_BYTES_PER_TOKEN
    assert kv_read_bytes(eager, 46000, 2, 1.0) == 2 * 3 * 46000 * MEDIUM_BYTES_PER_TOKEN
    assert kv_read_bytes({"page_size": 16}, 46000, 1, 0.0) is None


def test_engine_counts_the_kv_bytes_of_its_verifies() -> None:
    probe = StepProbe(None)
    eng = _engine(probe=probe, graph_capture=FakeCapture())
    eng.generate([GenRequest("b", 12, context_len=900, ignore_eos=True)])
    recs = probe.take_completed()
    model = eng.info()["kv_read"]
    assert model["padded_bucket"] == {"min_pages": 64, "linear_step_pages": 512}
    expected = sum(kv_read_bytes(model, r.context_len, 1, 0.0) or 0 for r in recs)
    assert eng.counters["kv_read_bytes"] == expected
    assert eng.counters["verify_forwards"] == len(recs)


def test_diagnosis_uses_the_servers_traffic_model() -> None:
    from pytest_specperf.judging.diagnosis import kv_read_bytes_per_step

    run: Any = SimpleNamespace(context_len=46000, batch_size=1, fragmentation=0.0)
    traffic = {"bytes_per_token": MEDIUM_BYTES_PER_TOKEN, "page_size": 16, "gather_passes": 3,
               "padded_bucket": {"min_pages": 64, "linear_step_pages": 512}}
    moved = kv_read_bytes_per_step(run, MEDIUM_BYTES_PER_TOKEN, traffic)
    assert moved == 3 * 3072 * 16 * MEDIUM_BYTES_PER_TOKEN
    assert kv_read_bytes_per_step(run, 10.0) == 460000  # other backends: the context, once


def test_kv_pool_starts_zeroed() -> None:
    """Masked slots get weight exactly 0 in the padded path; 0 x NaN would still be NaN."""
    pool = KVPool(get_config("tiny"), device="cpu", dtype=torch.float32, tokens=256)
    assert all(torch.count_nonzero(t) == 0 for t in pool.k + pool.v)


def test_gpu_reference_read_uses_few_large_gathers() -> None:
    """On a GPU the reference read gathers a 46k medium request in one kernel per layer
    and pool (on the CPU it stays in small chunks)."""
    cfg = get_config("medium")
    kv = SimpleNamespace(k=[torch.empty(0, dtype=torch.bfloat16)])
    gpu = SimpleNamespace(cfg=cfg, kv=kv, device=torch.device("meta"))
    gpu.device = SimpleNamespace(type="cuda")
    pages_46k = -(-46000 // cfg.page_size)
    assert Engine._reference_chunk_pages(gpu) >= pages_46k  # type: ignore[arg-type]
    cpu = SimpleNamespace(cfg=cfg, kv=kv, device=SimpleNamespace(type="cpu"))
    assert Engine._reference_chunk_pages(cpu) * cfg.page_size <= 8192  # type: ignore[arg-type]
