"""In-process steps of ``gpu_check.py``: the telemetry truth and the engine checks.

Each measurement is a *part*: its result (or its error) is written to the step's JSON as
soon as it is known, so a step stopped by its time limit keeps what it measured.
Parts run in order of importance (issue 15's five measurements first). The parts that run
``torch.profiler`` (kernels against spans, the small CUDA trace) are a step of their own,
``profile``, which runs after every other measurement: a profiler that hangs (CUPTI and
graph replays) loses only itself. ``SPECPERF_KERNEL_EVERY=0`` skips them (the fallback).

Every CUDA-only call goes through a side (``gpu_check_device``): the GPU, or the CPU
rehearsal's named stand-ins.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpu_check import Results
from gpu_check_device import Cuda

CTXS = (32768, 46000)
HEAD_CTX = 46000
#: Context of the small CUDA trace kept for tests/data (a few steps, a small file).
SMALL_CTX = 4096
COPY_BYTES = 4 << 30
GPM_SECONDS = 1.2
LOAD_SECONDS = 10.0
CANARY_STEPS = 30
#: The kernel-sampling switch of the plugin's servers; 0 also skips the ``profile`` step.
KERNEL_EVERY_ENV = "SPECPERF_KERNEL_EVERY"


# -- small helpers ---------------------------------------------------------------------------


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Nvml:
    """Direct NVML readings of one device: SM clock, throttle reasons, processes."""

    def __init__(self, index: int) -> None:
        from pytest_specperf.telemetry import loader

        imported = loader.load_pynvml()
        self.nv: Any = imported.module
        self.reason = imported.reason
        self.handle: Any = None
        if self.nv is not None:
            try:
                self.nv.nvmlInit()
                self.handle = self.nv.nvmlDeviceGetHandleByIndex(index)
            except Exception as e:
                self.reason, self.nv = f"NVML: {e}", None

    def sm_clock(self) -> int | None:
        if self.nv is None:
            return None
        with contextlib.suppress(Exception):
            return int(self.nv.nvmlDeviceGetClockInfo(self.handle, self.nv.NVML_CLOCK_SM))
        return None

    def reasons(self) -> list[str] | None:
        from pytest_specperf.telemetry import decode_clock_event_reasons

        if self.nv is None:
            return None
        fn = getattr(self.nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self.nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        with contextlib.suppress(Exception):
            return list(decode_clock_event_reasons(int(fn(self.handle))))
        return None

    def processes(self) -> list[dict[str, Any]] | None:
        if self.nv is None:
            return None
        with contextlib.suppress(Exception):
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
            return [{"pid": int(p.pid), "used_bytes": p.usedGpuMemory} for p in procs]
        return None

    def state(self) -> dict[str, Any]:
        return {
            "sm_clock_mhz": self.sm_clock(),
            "clock_event_reasons": self.reasons(),
            "processes": self.processes(),
            "own_pid": os.getpid(),
        }


def calibrate_with_clock(nv: Nvml, side: Cuda) -> dict[str, Any]:
    """The canary's ``_sleep`` calibration now, beside NVML's SM clock."""
    before = nv.sm_clock()
    cpn = side.sleep_calibration()
    out = {
        "cycles_per_ns": cpn,
        "implied_sm_clock_mhz": None if cpn is None else round(cpn * 1e3, 1),
        "nvml_sm_clock_mhz_before": before,
        "nvml_sm_clock_mhz_after": nv.sm_clock(),
    }
    if cpn is None:
        out["stand_in"] = "sleep-calibration"
    return out


def device_info() -> Any:
    from pytest_specperf.telemetry import detect_device

    return detect_device(cuda_index=0)


def peak_of(dev: Any) -> Any:
    from pytest_specperf.telemetry import peak_bandwidth

    return peak_bandwidth(dev.name, dev.nvml_index)


# -- telemetry truth -------------------------------------------------------------------------


def copy_vs_gpm(dev: Any, peak: Any, side: Cuda) -> dict[str, Any]:
    """A 4 GB copy's bandwidth against GPM DRAM_BW_UTIL over the same >= 1 s window."""
    from pytest_specperf.telemetry import TelemetrySampler
    from pytest_specperf.telemetry.summary import DRAM_UTIL

    sampler = TelemetrySampler(dev.nvml_index or 0, uuid=dev.uuid)
    sampler.start()
    try:
        rate = side.copy_rate(COPY_BYTES, GPM_SECONDS, window=sampler.window())
    finally:
        summary = sampler.stop()
    dram = summary.median(DRAM_UTIL)
    out = {"copy": rate, "telemetry": summary.to_dict(), "gpm_dram_util_pct": dram}
    if dram is not None and peak is not None:
        implied = dram / 100 * peak.bytes_per_s / 1e9
        out["gpm_implied_gb_per_s"] = implied
        out["measured_over_gpm"] = rate["moved_gb_per_s"] / implied if implied else None
    if peak is not None:
        out["measured_share_of_peak"] = rate["moved_gb_per_s"] * 1e9 / peak.bytes_per_s
    return out


def telemetry_step(out: Path, side: Cuda) -> int:
    """NVML identity, peak bandwidth, throttle reasons and processes, the ``_sleep``
    calibration at idle, and a 4 GB copy against GPM."""
    res = Results(out / "telemetry.json", side=side)
    dev = device_info()
    res.put("identity", dev.to_dict())
    peak = peak_of(dev)
    res.put("peak_bandwidth", None if peak is None else {
        "bytes_per_s": peak.bytes_per_s, "source": peak.source, "detail": peak.detail})
    nv = Nvml(dev.nvml_index or 0)
    res.put("nvml", {"available": nv.nv is not None, "reason": nv.reason})
    res.part("idle_state", nv.state)
    res.part("sleep_calibration_idle", calibrate_with_clock, nv, side)
    res.part("copy_vs_gpm", copy_vs_gpm, dev, peak, side)
    res.part("state_after_copy", nv.state)
    return 0


# -- engine ---------------------------------------------------------------------------------


class _Annotated:
    """A probe phase that is also a ``torch.profiler.record_function`` range, named as the
    probe's own kernel sampler names it (``specperf.<phase>``)."""

    def __init__(self, span: Any, name: str) -> None:
        import torch

        from pytest_specperf.probe.kernels import ANNOTATION_PREFIX

        self.span = span
        self.rf = torch.profiler.record_function(ANNOTATION_PREFIX + name)

    def __enter__(self) -> None:
        self.rf.__enter__()
        self.span.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.span.__exit__(*exc)
        self.rf.__exit__(*exc)


def annotating_probe(*, use_cuda: bool = True) -> Any:
    """A StepProbe (records in memory) whose steps and phases are profiler ranges."""
    import torch

    from pytest_specperf.probe import StepProbe
    from pytest_specperf.probe.kernels import STEP_ANNOTATION

    class AnnotatingProbe(StepProbe):
        def phase(self, name: str) -> Any:
            return _Annotated(super().phase(name), name)

        def begin_step(self, **kw: Any) -> None:
            self._rf = torch.profiler.record_function(STEP_ANNOTATION)
            self._rf.__enter__()
            super().begin_step(**kw)

        def end_step(self, **kw: Any) -> None:
            super().end_step(**kw)
            self._rf.__exit__(None, None, None)

    return AnnotatingProbe(None, use_cuda=use_cuda)


def decode(eng: Any, ctx: int, new: int, seed: int = 1, layout: str = "contiguous") -> Any:
    """One request of ``new`` tokens at ``ctx`` (synthetic prompt); (result, records)."""
    from pytest_specperf.engines.reference.engine import GenRequest

    eng.set_kv_layout(layout, 1.0, seed)
    req = GenRequest(f"gc-{ctx}-{seed}", new, context_len=ctx, ignore_eos=True, seed=seed)
    r = eng.generate([req])[0]
    take = getattr(eng.probe, "take_completed", None)
    return r, (take() if take is not None else [])


def graph_counts(recs: list[Any]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter[str]] = {}
    for r in recs:
        for runner, g in r.graphs.items():
            c = out.setdefault(runner, Counter())
            c.update(replay=g.replay, eager=g.eager, capture=g.capture)
    return {k: dict(v) for k, v in out.items()}


def phase_table(recs: list[Any]) -> dict[str, Any]:
    """Medians (ms) per phase, host and device, and of the step."""
    from pytest_specperf.probe import PHASES

    def med(xs: list[float]) -> float | None:
        m = median(xs)
        return None if m is None else round(m, 4)

    table = {
        p: {
            "host_ms": med([r.host_ns[p] / 1e6 for r in recs]),
            "device_ms": med([r.device_ns[p] / 1e6 for r in recs if r.device_ns]),
        }
        for p in PHASES
    }
    table["unaccounted"] = {"host_ms": med([r.unaccounted_ns / 1e6 for r in recs])}
    table["step"] = {
        "host_ms": med([r.step_ns / 1e6 for r in recs]),
        "device_ms": med([r.device_step_ns / 1e6 for r in recs if r.device_step_ns]),
    }
    return table


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def graphs_vs_eager(eng: Any, side: Cuda) -> dict[str, Any]:
    """Same seeds through graphs and eagerly: output ids, counts, capture time, memory."""
    out: dict[str, Any] = {}
    for ctx in CTXS:
        mem0 = side.memory_reserved()
        run_ctx, new = side.ctx(ctx), side.work(96)
        first, recs1 = decode(eng, run_ctx, new, seed=7)
        mem1 = side.memory_reserved()
        again, recs2 = decode(eng, run_ctx, new, seed=7)
        graphs, eng.graphs = eng.graphs, None
        try:
            eager, recs_e = decode(eng, run_ctx, new, seed=7)
        finally:
            eng.graphs = graphs
        out[str(ctx)] = {
            "context_run": run_ctx,
            "identical_output_ids": first.output_ids == again.output_ids == eager.output_ids,
            "first_divergence": first_divergence(first.output_ids, eager.output_ids),
            "counts_first_run": graph_counts(recs1),
            "counts_second_run": graph_counts(recs2),
            "counts_eager_run": graph_counts(recs_e),
            "memory_reserved_bytes": [mem0, mem1],
            "step_ms_graphs": phase_table(recs2)["step"],
            "step_ms_eager": phase_table(recs_e)["step"],
        }
    out["captured"] = graphs.info() if graphs is not None else None
    return out


def logits_diff(eng: Any, ctx: int) -> dict[str, Any]:
    """One verify block through the captured graph and through the eager forward."""
    import torch

    from pytest_specperf.engines.reference.engine import GenRequest, _Live
    from pytest_specperf.engines.reference.model import PlannedReads, SeqRows

    lr = _Live(req=GenRequest("logits", 8, context_len=ctx, seed=3), pages=[], row=0)
    eng.page_table.truncate(0, 0)
    try:
        with eng._device_guard():
            eng._prefill(lr)
            si = eng._schedule([lr], eng.block, draws=False)
            tokens = eng._cat_block(si.anchors, eng._draft([lr], si))
            pos = (si.context_lens[:, None] + eng._aranges[None, : eng.block]).reshape(-1)
            slots = eng._slot_index(si.page_rows, pos.view(1, -1))
            out = eng.graphs.try_replay(
                "target_verify", tokens, pos, slots, si.page_rows, si.context_lens, si.max_context
            )
            graph_logits = out[0].clone()
            reads = PlannedReads([SeqRows(0, eng.block, eng._plan(lr))])
            eager_logits, _ = eng.target.forward(tokens, pos, reads, eng.kv, slots)
            diff = (graph_logits.float() - eager_logits.float()).abs().max().item()
            same = torch.equal(graph_logits.argmax(-1), eager_logits.argmax(-1))
    finally:
        eng.allocator.free(lr.pages)
    return {"context": ctx, "max_abs_logit_diff": diff, "argmax_equal": same,
            "graph_use": eng.graphs.last_use}


@contextlib.contextmanager
def probe_swapped(eng: Any, probe: Any) -> Iterator[Any]:
    saved, eng.probe = eng.probe, probe
    try:
        yield probe
    finally:
        eng.probe = saved


def save_trace(prof: Any, path: Path) -> dict[str, Any]:
    """Export a profiler trace gzipped to ``path``; the trace's dictionary."""
    raw = path.with_suffix("")  # .json
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace: dict[str, Any] = json.loads(raw.read_text(encoding="utf-8"))
    raw.unlink()
    return trace


def profiled_decode(
    eng: Any, ctx: int, new: int, path: Path, side: Cuda
) -> tuple[list[Any], dict[str, Any]]:
    from torch.profiler import profile

    with probe_swapped(eng, annotating_probe(use_cuda=side.use_cuda)):
        decode(eng, ctx, new, seed=5)  # warm (graphs for this bucket)
        with profile(activities=side.profiler_activities()) as prof:
            _, recs = decode(eng, ctx, new, seed=5)
    return recs, save_trace(prof, path)


def kernels_vs_spans(eng: Any, out: Path, side: Cuda) -> dict[str, Any]:
    """Per phase: CUDA-event span vs kernel sum and kernel union over ~10 steps at 46k."""
    path = out / f"traces/{'cpu-rehearsal' if side.rehearsal else 'engine'}-46k.json.gz"
    recs, trace = profiled_decode(eng, side.ctx(HEAD_CTX), 1 + side.work(10) * 3, path, side)
    return kernels_and_spans(trace, recs)


def kernels_and_spans(trace: dict[str, Any], recs: list[Any]) -> dict[str, Any]:
    """Per phase of a profiled decode: the probe's device span (CUDA events, summed over the
    records) beside the kernels the trace attributes to it (count, summed, union, top)."""
    from pytest_specperf.probe import PHASES
    from pytest_specperf.probe.kernels import STEP_KEY
    from pytest_specperf.probe.kineto import parse_trace

    parsed = parse_trace(trace)
    totals = parsed.totals(top=5)  # kernels on a GPU (CPU ops in a CPU trace)
    busy = totals.pop(STEP_KEY, None)
    spans = {p: sum((r.device_ns or {}).get(p, 0) for r in recs) / 1e6 for p in PHASES}
    device_step_ms = sum(r.device_step_ns or 0 for r in recs) / 1e6
    busy_ms = busy.active_ns / 1e6 if busy is not None else 0.0
    return {
        "source": parsed.source,
        "steps_recorded": len(recs),
        "steps_in_trace": len(parsed.steps),
        "per_phase": {
            p: {"span_ms": round(spans.get(p, 0.0), 4), **t.to_json()} for p, t in totals.items()
        }
        | {p: {"span_ms": round(v, 4)} for p, v in spans.items() if p not in totals},
        "device_step_ms": device_step_ms,
        "busy_share_from_kernels": busy_ms / device_step_ms if device_step_ms else None,
        "busy_share_from_spans": sum(spans.values()) / device_step_ms if device_step_ms else None,
    }


def sync_census(eng: Any, side: Cuda, steps: int = 3) -> dict[str, Any]:
    """``torch.cuda.set_sync_debug_mode("warn")`` around the first ``steps`` decode steps:
    every synchronizing call inside a step, by source line."""
    done = [0]
    original = eng._step_dflash if eng.algorithm == "DFLASH" else eng._step_greedy
    fetches0 = eng._d2h.fetches

    def watched(batch: Any) -> None:
        if done[0] >= steps:
            return original(batch)
        done[0] += 1
        side.sync_debug_mode("warn")
        try:
            return original(batch)
        finally:
            side.sync_debug_mode(0)

    name = "_step_dflash" if eng.algorithm == "DFLASH" else "_step_greedy"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setattr(eng, name, watched)
        try:
            decode(eng, side.ctx(HEAD_CTX), 1 + steps * eng.block, seed=9)
        finally:
            delattr(eng, name)
    sites = Counter(f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0][:120]}"
                    for w in caught)
    return {"steps_watched": done[0], "sync_warnings": sum(sites.values()),
            "sites": dict(sites), "read_backs": eng._d2h.fetches - fetches0,
            "expected": "0 warnings; read_backs = steps run (the accept phase's one read)"}


def build_engine(side: Cuda, res: Results) -> Any:
    """The check's engine (``side.config`` on ``side.device``), its build time recorded."""
    from pytest_specperf.engines.reference.config import get_config
    from pytest_specperf.engines.reference.engine import Engine
    from pytest_specperf.probe import StepProbe

    t0 = time.monotonic()
    eng = Engine(
        get_config(side.config),
        device=side.device,
        probe=StepProbe(None, use_cuda=side.use_cuda),
        graph_capture=side.capture(),
    )
    res.put("build", {"s": round(time.monotonic() - t0, 3), "fingerprint": eng.fingerprint(),
                      "kv_read": eng.kv_read_model(), "pool_tokens": eng.pool_tokens})
    return eng


def engine_step(out: Path, side: Cuda) -> int:
    """Build the engine once and run every engine part (see the module docstring)."""
    res = Results(out / "engine.json", side=side)
    eng = build_engine(side, res)
    for key, fn, args in engine_parts(eng, side):
        res.part(key, fn, *args)
    res.put("engine_info", eng.info())
    return 0


def profile_step(out: Path, side: Cuda) -> int:
    """The profiler parts, last of all: kernels against spans at 46k, a small CUDA trace.
    ``SPECPERF_KERNEL_EVERY=0`` skips them (the fallback when the profiler hangs)."""
    res = Results(out / "profile.json", side=side)
    if os.environ.get(KERNEL_EVERY_ENV, "").strip() == "0":
        why = f"skipped: {KERNEL_EVERY_ENV}=0 (no profiler in this run)"
        print(f"gpu-check: profile {why}", flush=True)
        res.put("skipped", why)
        return 0
    eng = build_engine(side, res)
    for key, fn, args in profile_parts(eng, out, side):
        res.part(key, fn, *args)
    return 0


def engine_parts(eng: Any, side: Cuda) -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    from gpu_check_canaries import (
        canary_host_stall,
        canary_verify,
        dflash_vs_none,
        layouts,
        load_and_calibration,
        probe_on_off,
    )

    return [
        ("graphs_vs_eager", graphs_vs_eager, (eng, side)),
        ("logits_graph_vs_eager", logits_diff, (eng, side.ctx(HEAD_CTX))),
        ("sync_census", sync_census, (eng, side)),
        ("load_and_sleep_calibration", load_and_calibration, (eng, side)),
        ("canary_verify", canary_verify, (eng, side)),
        ("canary_host_stall", canary_host_stall, (eng, side)),
        ("layouts_and_bandwidth", layouts, (eng, side)),
        ("probe_on_off", probe_on_off, (eng, side)),
        ("dflash_vs_none", dflash_vs_none, (eng, side)),
    ]


def profile_parts(
    eng: Any, out: Path, side: Cuda
) -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    from gpu_check_canaries import small_trace

    return [
        ("kernels_vs_spans", kernels_vs_spans, (eng, out, side)),
        ("small_cuda_trace", small_trace, (eng, out, side)),
    ]


STEPS: dict[str, Callable[[Path, Cuda], int]] = {
    "telemetry": telemetry_step,
    "engine": engine_step,
    "profile": profile_step,
}
