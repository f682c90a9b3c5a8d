"""SGLang 0.5.23's own plugin loader and hook registry, run for real in a spawned process.

SGLang starts each scheduler with multiprocessing ``spawn`` in ``run_scheduler_process``,
whose first act is ``load_plugins()``. Here a child process is spawned the same way and
entered through a function of that name; in it, the **real**
``sglang/srt/plugins/__init__.py`` (``load_plugins``) and ``plugins/hook_registry.py``
(``HookRegistry``) of the installed SGLang source run, and find our plugin through the
entry point that the installed pytest-specperf distribution declares
(``sglang.srt.plugins`` -> ``specperf = pytest_specperf.engines.sglang.sgl_plugin:load``;
the code itself comes from this checkout, first on ``sys.path``). Our plugin registers
AROUND hooks from the built-in phase map, the registry applies them (and rebinds names
other modules imported with ``from x import y``), a few decode steps run, and the parent
reads back the step records and the hooks report from the run directory.

Stubs, for what is not under test and cannot run here (each named as a stub below):

- ``StubSglangPackage``: the real ``sglang/__init__.py`` imports torch, transformers and
  SGLang's language API; an empty package whose ``__path__`` is the real directory stands
  in for it, so that ``sglang.srt.plugins`` and ``sglang.srt.environ`` load from the source.
- ``STANDIN_MODULES``: the hooked SGLang modules need CUDA kernels, so small stand-ins
  with the 0.5.23 signatures take their names in ``sys.modules`` (under stand-in parent
  packages, so that nothing else of the real tree is imported). They call each other the
  way EAGLEWorkerV2's decode step does.
"""

from __future__ import annotations

import importlib.machinery
import json
import multiprocessing
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.engines.sglang.source import sglang_root
from pytest_specperf.probe.phases import PHASES
from pytest_specperf.probe.sink import read_records

ROOT = sglang_root()
pytestmark = pytest.mark.skipif(
    ROOT is None,
    reason="sglang is not installed; CI runs these with `pip install --no-deps sglang==0.5.23`",
)
DECODE_STEPS = 4
S = "sglang.srt."

#: Stand-in parent packages: nothing below them is looked up in the real tree.
STANDIN_PACKAGES = (
    "sglang.srt.speculative",
    "sglang.srt.managers",
    "sglang.srt.managers.scheduler_components",
    "sglang.srt.mem_cache",
    "sglang.srt.model_executor",
    "sglang.srt.model_executor.runner",
)

_BUSY = '''
import time
def busy(us=50):
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass
'''

#: Stand-in modules (name -> source), in import order; signatures are SGLang 0.5.23's.
STANDIN_MODULES: dict[str, str] = {
    S + "model_executor.runner.decode_cuda_graph_runner": _BUSY + '''
class DecodeCudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
    def execute(self, forward_batch, pp_proxy_tensors=None):
        busy()
''',
    S + "model_executor.runner.eager_runner": _BUSY + '''
class EagerRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
    def execute(self, forward_batch, pp_proxy_tensors=None, **kwargs):
        busy()
''',
    S + "speculative.eagle_draft_cuda_graph_runner": _BUSY + '''
class EAGLEDraftCudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
    def execute(self, forward_batch):
        busy()
''',
    S + "speculative.eagle_draft_extend_cuda_graph_runner": _BUSY + '''
class EAGLEDraftExtendCudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
    def execute(self, forward_batch, select_index):
        busy()
''',
    S + "speculative.eagle_utils": _BUSY + '''
def eagle_prepare_for_decode(batch):
    busy()
def eagle_prepare_for_verify(verify_input, req_to_token_pool, batch, target_worker):
    busy()
def eagle_sample(verify_input, batch, logits_output, grammar_mask, uno_target_max_top_k,
                 *, watermark_state=None, watermark_full_mask=None):
    busy()
''',
    S + "speculative.eagle_worker_common": _BUSY + '''
from sglang.srt.speculative.eagle_utils import eagle_prepare_for_verify, eagle_sample
def build_eagle_verify_input(batch, draft_input, parent_list, top_scores_index, draft_tokens,
                             draft_probs, *, target_worker, topk, num_steps, num_draft_tokens,
                             tree_mask_mode, device):
    busy()
def prepare_for_draft_extend(draft_extend_input, batch, predict, num_draft_tokens,
                             draft_model_runner, cuda_graph_runner, *,
                             return_hidden_states_before_norm=False, widened_out_cache_loc=None,
                             widened_positions=None, kv_loc_plan=None):
    busy()
def run_eagle_verify(batch, *, target_worker, req_to_token_pool, token_to_kv_pool_allocator,
                     plan_stream, plan_stream_ctx, topk, num_draft_tokens, device,
                     metadata_ready_pre_pad, finalize_tree_path, pp_proxy_tensors=None,
                     grammar_barrier=None, uno_target_max_top_k=None):
    eagle_prepare_for_verify(batch.spec_info, None, batch, target_worker)
    target_worker.target_runner.execute(None)
    eagle_sample(batch.spec_info, batch, None, None, None)
    return target_worker.result_for(batch)
''',
    S + "speculative.eagle_worker_v2": _BUSY + '''
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
    EAGLEDraftExtendCudaGraphRunner,
)
from sglang.srt.speculative.eagle_worker_common import (
    build_eagle_verify_input,
    prepare_for_draft_extend,
    run_eagle_verify,
)

class StandinModelRunner:
    def __init__(self, is_draft_worker):
        self.is_draft_worker = is_draft_worker

class StandinResult:
    def __init__(self, accept):
        self.accept_lens = StandinLens(accept)
        self.copy_done = None

class StandinLens(list):
    is_cuda = False
    def sum(self):
        return sum(iter(self))

class EagleDraftWorker:
    def __init__(self):
        self.cuda_graph_runner = EAGLEDraftCudaGraphRunner(StandinModelRunner(True))
        self.extend_runner = EAGLEDraftExtendCudaGraphRunner(StandinModelRunner(True))
    def draft(self, batch, *, with_topology=False):
        self.cuda_graph_runner.execute(None)
        build_eagle_verify_input(batch, None, None, None, None, None, target_worker=None, topk=1,
                                 num_steps=3, num_draft_tokens=4, tree_mask_mode=None,
                                 device="cpu")
        return "verify-input"
    def draft_forward(self, forward_batch):
        busy()
    def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
        prepare_for_draft_extend(None, batch, None, 4, None, None)
        self.extend_runner.execute(None, None)

class EAGLEWorkerV2:
    accept = 3
    def __init__(self):
        self.draft_worker = EagleDraftWorker()
        self.target_runner = DecodeCudaGraphRunner(StandinModelRunner(False))
    def result_for(self, batch):
        return StandinResult([self.accept] * len(batch.reqs))
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                 pp_proxy_tensors=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            busy()
            return StandinResult([1] * len(batch.reqs))
        batch.spec_info = self.draft_worker.draft(batch)
        result = self.verify(batch, pp_proxy_tensors=pp_proxy_tensors)
        self.draft_worker._draft_extend_for_decode(batch, result, kv_loc_plan=None)
        return result
    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        return run_eagle_verify(batch, target_worker=self, req_to_token_pool=None,
                                token_to_kv_pool_allocator=None, plan_stream=None,
                                plan_stream_ctx=None, topk=1, num_draft_tokens=4, device="cpu",
                                metadata_ready_pre_pad=False, finalize_tree_path=False)
''',
    S + "managers.schedule_batch": _BUSY + '''
from sglang.srt.speculative.eagle_utils import eagle_prepare_for_decode

class StandinForwardMode:
    def __init__(self, kind):
        self.kind = kind
    def is_extend(self):
        return self.kind == "extend"
    def is_idle(self):
        return False

class StandinReq:
    def __init__(self, rid, prompt_len):
        self.rid = rid
        self.origin_input_ids = [7] * prompt_len
        self.output_ids = []
        self.done = False
    def finished(self):
        return self.done

class ScheduleBatch:
    def __init__(self, reqs, kind):
        self.reqs = reqs
        self.forward_mode = StandinForwardMode(kind)
        self.is_extend_in_batch = False
        self.seq_lens_cpu = None
    def prepare_for_decode(self):
        eagle_prepare_for_decode(self)
''',
    S + "mem_cache.common": '''
def release_kv_cache(req, tree_cache, *, checkpoint=False):
    return None
''',
    S + "managers.scheduler_components.output_streamer": _BUSY + '''
class SchedulerOutputStreamer:
    def stream_output(self, reqs, return_logprob, skip_req=None):
        busy()
''',
    S + "managers.scheduler_components.batch_result_processor": '''
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

class SchedulerBatchResultProcessor:
    def __init__(self, finish_at):
        self.finish_at = finish_at
        self.output_streamer = SchedulerOutputStreamer()
    def process_batch_result_decode(self, batch, result):
        for req, n in zip(batch.reqs, result.accept_lens):
            req.output_ids += [1] * n
            if len(req.output_ids) >= self.finish_at:
                req.done = True
                release_kv_cache(req, None, checkpoint=False)
        self.output_streamer.stream_output(batch.reqs, False)
''',
    S + "managers.scheduler": _BUSY + '''
from sglang.srt.managers.schedule_batch import ScheduleBatch

class Scheduler:
    """event_loop_normal's calls, each with 0.5.23's signature."""
    def __init__(self, worker, proc, req):
        self.worker, self.proc, self.req, self.prefilled = worker, proc, req, False
    def ingest_requests(self, stop_at_pause=False):
        busy()
        return []
    def get_next_batch_to_run(self, running_batch, last_batch):
        if not self.prefilled:
            self.prefilled = True
            return ScheduleBatch([self.req], "extend")
        if self.req.done:
            return None
        batch = ScheduleBatch([self.req], "decode")
        batch.prepare_for_decode()
        return batch
    def run_batch(self, batch, pp_proxy_tensors=None):
        busy()
        return self.worker.forward_batch_generation(batch)
    def launch_batch_sample_if_needed(self, batch_result, cur_batch):
        return None
    def process_batch_result(self, batch, result):
        if not batch.forward_mode.is_extend():
            self.proc.process_batch_result_decode(batch, result)
    def flush_cache(self, empty_cache=True):
        return True
    def on_idle(self):
        return None
''',
}


def _stub_module(name: str, *, package: bool) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        mod.__path__ = []
    sys.modules[name] = mod
    return mod


def install_stubs(sglang_dir: str) -> None:
    """StubSglangPackage, the stand-in packages and the stand-in modules (child only)."""
    stub = _stub_module("sglang", package=True)  # StubSglangPackage
    stub.__path__ = [sglang_dir]
    for name in STANDIN_PACKAGES:
        _stub_module(name, package=True)
    for name, code in STANDIN_MODULES.items():
        mod = _stub_module(name, package=False)
        exec(compile(code, f"<stand-in {name}>", "exec"), vars(mod))


def _drive(steps: int) -> None:
    """What the scheduler does for one request: prefill, decode steps, finish, idle."""
    from sglang.srt.managers.schedule_batch import StandinReq
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    worker = EAGLEWorkerV2()
    req = StandinReq("r1", 64)
    proc = SchedulerBatchResultProcessor(finish_at=steps * EAGLEWorkerV2.accept)
    sched = Scheduler(worker, proc, req)
    while True:  # Scheduler.event_loop_normal
        sched.ingest_requests()
        batch = sched.get_next_batch_to_run(None, None)
        if batch is None:
            sched.on_idle()
            return
        sched.process_batch_result(batch, sched.run_batch(batch))


def run_scheduler_process(
    server_args: Any,
    port_args: Any,
    gpu_id: int,
    tp_rank: int,
    pp_rank: int,
    dp_rank: int | None,
    pipe_writer: Any,
) -> None:
    """The spawned child, named and shaped like SGLang's scheduler entry."""
    sglang_dir, steps = port_args
    install_stubs(sglang_dir)
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    plugins.load_plugins()
    plugins.load_plugins()  # once per process: the second call does nothing
    import sglang.srt.speculative.eagle_worker_common as common
    import sglang.srt.speculative.eagle_worker_v2 as v2

    from pytest_specperf.engines.sglang import sgl_plugin

    _drive(steps)
    pipe_writer.send({
        "plugins_file": plugins.__file__,
        "registry_file": sys.modules["sglang.srt.plugins.hook_registry"].__file__,
        "sgl_plugin_file": sgl_plugin.__file__,
        "patched": sorted(HookRegistry._patched),
        "hooks_per_target": {t: len(h) for t, h in HookRegistry._hooks.items()},
        "wrapped_step": hasattr(v2.EAGLEWorkerV2.forward_batch_generation, "__wrapped__"),
        "rebound": v2.build_eagle_verify_input is common.build_eagle_verify_input
        and hasattr(v2.build_eagle_verify_input, "__wrapped__"),
        "heavy": [m for m in ("transformers", "triton", "sglang.lang") if m in sys.modules],
    })
    pipe_writer.close()


def _spawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str) -> dict[str, Any]:
    monkeypatch.setenv("SPECPERF_SGLANG_PLUGIN", "1")
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SGLANG_PLUGINS", "specperf")  # SGLang's whitelist, with us in it
    monkeypatch.delenv("SPECPERF_PHASE_MAP", raising=False)
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    server_args = types.SimpleNamespace(speculative_algorithm=algorithm)
    proc = ctx.Process(
        target=run_scheduler_process,
        args=(server_args, (str(ROOT), DECODE_STEPS), 0, 0, 0, None, writer),
    )
    proc.start()
    writer.close()
    try:
        if not reader.poll(120):
            pytest.fail(f"the spawned scheduler sent nothing (exit code {proc.exitcode})")
        summary: dict[str, Any] = reader.recv()
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    return summary


def test_sglang_loader_applies_our_hooks_in_a_spawned_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = _spawn(tmp_path, monkeypatch, "EAGLE3")
    # SGLang's own loader and registry ran, from the installed source; our code, from here
    assert ROOT is not None
    assert summary["plugins_file"] == str(ROOT / "srt" / "plugins" / "__init__.py")
    assert summary["registry_file"] == str(ROOT / "srt" / "plugins" / "hook_registry.py")
    here = Path(__file__).resolve().parents[1]
    assert Path(summary["sgl_plugin_file"]).resolve().is_relative_to(here)
    assert summary["heavy"] == []
    # applied once per target (load_plugins twice in one process registers once)
    assert summary["wrapped_step"] and summary["rebound"]
    assert set(summary["hooks_per_target"].values()) == {1}
    assert S + "speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation" in (
        summary["patched"]
    )

    (report_path,) = tmp_path.glob("hooks-pid*-rank0.json")
    report = json.loads(report_path.read_text())
    assert report["speculative_algorithm"] == "EAGLE3" and report["refused"] is None
    installed = {i["target"] for i in report["installed"]}
    assert installed == set(summary["patched"]) == set(summary["hooks_per_target"])
    assert report["signature_changed"] == []  # the stand-ins have 0.5.23's signatures
    missing = {m["target"]: m for m in report["missing"]}
    multi = missing[S + "speculative.multi_layer_eagle_worker_v2.MultiLayerEagleWorkerV2."
                    "forward_batch_generation"]
    assert multi["kind"] == "not_found"  # no stand-in for it
    skipped = report["not_for_this_algorithm"]
    assert any("dflash" in t for t in skipped) and not any("dflash" in t for t in installed)

    recs = read_records(tmp_path, rids={"r1"})
    assert len(recs) == DECODE_STEPS
    for r in recs:
        assert r.accepted_tokens == 3 and r.labels["speculative_algorithm"] == "EAGLE3"
        assert r.labels["engine"] == "sglang" and r.rank == 0
        assert {p for p in PHASES if r.host_ns.get(p, 0) > 0} == set(PHASES), r.host_ns
        assert r.graphs["DecodeCudaGraphRunner"].replay == 1
        assert r.graphs["EAGLEDraftCudaGraphRunner[draft]"].replay == 1
        assert r.graphs["EAGLEDraftExtendCudaGraphRunner[draft]"].replay == 1
        assert sum(g.eager for g in r.graphs.values()) == 0
    assert len(read_records(tmp_path, rids={"r1"}, mode="extend")) == 1
    assert not list(tmp_path.glob("errors-*.json"))


def test_sglang_loader_refuses_ngram_and_patches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary = _spawn(tmp_path, monkeypatch, "NGRAM")
    assert summary["patched"] == [] and not summary["wrapped_step"]
    report = json.loads(next(tmp_path.glob("hooks-*.json")).read_text())
    assert report["installed"] == [] and "--speculative-algorithm NGRAM" in report["refused"]
    assert read_records(tmp_path) == []


def test_unit_child_entry_is_named_like_sglangs() -> None:
    """sgl_plugin recognises a scheduler by this frame name and these parameters."""
    import inspect

    params = list(inspect.signature(run_scheduler_process).parameters)
    assert run_scheduler_process.__name__ == "run_scheduler_process"
    assert params[:6] == ["server_args", "port_args", "gpu_id", "tp_rank", "pp_rank", "dp_rank"]
    assert os.environ.get("SPECPERF_SGLANG_PLUGIN") != "1"  # the parent stays plugin-free


def test_the_scheduler_probe_takes_injections_from_the_control_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attach-mode canaries: the control file in the run directory (written here before the
    scheduler starts, as the plugin writes it into a running server's) reaches the probe
    that sgl_plugin builds, and labels the records."""
    from pytest_specperf.probe.inject import parse_inject, write_control

    write_control(tmp_path, parse_inject("host_stall=2"))
    _spawn(tmp_path, monkeypatch, "EAGLE3")
    recs = read_records(tmp_path, rids={"r1"})
    assert len(recs) == DECODE_STEPS
    for r in recs:
        assert r.labels["inject"] == "host_stall=2" and "inject_error" not in r.labels
        assert r.unaccounted_ns >= 2_000_000  # the stall really happened, outside the phases
