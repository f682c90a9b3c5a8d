"""Engine parts of ``gpu_check.py``: load, canaries, layouts and bandwidth, probe cost.

Each function takes the in-process medium engine (graphs already captured for 32k and
46k by the earlier parts) and returns a JSON-safe dictionary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpu_check_device import Cuda
from gpu_check_engine import (
    CANARY_STEPS,
    CTXS,
    HEAD_CTX,
    LOAD_SECONDS,
    SMALL_CTX,
    Nvml,
    annotating_probe,
    calibrate_with_clock,
    decode,
    device_info,
    graph_counts,
    median,
    peak_of,
    phase_table,
    probe_swapped,
    save_trace,
)

#: Tokens per canary request: about 10 steps at the engine's acceptance.
CANARY_TOKENS = 31


def load_and_calibration(eng: Any, side: Cuda) -> dict[str, Any]:
    """``_sleep`` calibration with the SM clock, then ``LOAD_SECONDS`` of back-to-back
    decode at 46k sampled by NVML/GPM restricted to the decode steps, then again."""
    from pytest_specperf.telemetry import TelemetrySampler

    dev = device_info()
    nv = Nvml(dev.nvml_index or 0)
    at_start = calibrate_with_clock(nv, side)
    sampler = TelemetrySampler(dev.nvml_index or 0, uuid=dev.uuid)
    sampler.start()
    t0, recs, seed = time.monotonic(), [], 100
    try:
        while time.monotonic() - t0 < side.seconds(LOAD_SECONDS):
            _, more = decode(eng, side.ctx(HEAD_CTX), side.work(1200), seed=seed)
            recs += more
            seed += 1
        sampler.add_windows((r.wall_ns, r.wall_ns + r.step_ns) for r in recs)
    finally:
        summary = sampler.stop()
    return {
        "calibration_at_start": at_start,
        "calibration_after_load": calibrate_with_clock(nv, side),
        "load_s": round(time.monotonic() - t0, 3),
        "decode_steps": len(recs),
        "decode_s": sum(r.step_ns for r in recs) / 1e9,
        "telemetry_decode_only": summary.to_dict(),
        "state_after_load": nv.state(),
    }


def _arms(
    eng: Any, probes: dict[str, Any], blocks: int, seed0: int, side: Cuda
) -> dict[str, list[Any]]:
    """Interleaved blocks of ~10 steps per arm, same seeds in every arm."""
    out: dict[str, list[Any]] = {name: [] for name in probes}
    for b in range(blocks):
        order = list(probes) if b % 2 == 0 else list(reversed(probes))
        for name in order:
            with probe_swapped(eng, probes[name]):
                _, recs = decode(eng, side.ctx(HEAD_CTX), CANARY_TOKENS, seed=seed0 + b)
            out[name] += recs
    return out


def _blocks(side: Cuda) -> int:
    """Blocks of ~10 steps per canary arm (a rehearsal runs fewer)."""
    return 1 if side.rehearsal else CANARY_STEPS // 10


def _device_ms(recs: list[Any], phase: str) -> float | None:
    return median([r.device_ns[phase] / 1e6 for r in recs if r.device_ns])


def _host_ms(recs: list[Any], phase: str) -> float | None:
    return median([r.host_ns[phase] / 1e6 for r in recs])


def canary_verify(eng: Any, side: Cuda) -> dict[str, Any]:
    """``verify=1.10``: the change in device verify time over ~``CANARY_STEPS`` steps."""
    from pytest_specperf.probe import StepProbe
    from pytest_specperf.probe.inject import Injector, parse_inject

    inj = Injector(parse_inject("verify=1.10"), device=side.device)  # calibrated here, warm
    probes = {
        "off": StepProbe(None, use_cuda=side.use_cuda),
        "on": StepProbe(None, use_cuda=side.use_cuda, injector=inj),
    }
    with probe_swapped(eng, probes["on"]):
        decode(eng, side.ctx(HEAD_CTX), CANARY_TOKENS, seed=40)  # the feedback's first estimate
        probes["on"].take_completed()
    arms = _arms(eng, probes, blocks=_blocks(side), seed0=41, side=side)
    timing = "device" if side.use_cuda else "host"  # the stand-in probe: host times only
    ms = _device_ms if side.use_cuda else _host_ms
    off, on = ms(arms["off"], "verify"), ms(arms["on"], "verify")
    return {
        **({} if side.use_cuda else {"stand_in": "cuda-events"}),
        "steps": {k: len(v) for k, v in arms.items()},
        f"{timing}_verify_ms": {"off": off, "on": on},
        "ratio": on / off if on and off else None,
        "expected_ratio": 1.10,
        "device_step_ms": {k: phase_table(v)["step"]["device_ms"] for k, v in arms.items()},
        "cycles_per_ns": {"calibrations": inj.calibrations, "corrected": inj.cycles_per_ns},
        "baseline_estimate_ms": (inj.baseline_ns("verify") or 0) / 1e6,
    }


def canary_host_stall(eng: Any, side: Cuda) -> dict[str, Any]:
    """``host_stall=2``: the change in unaccounted time, and the bottleneck verdict."""
    from pytest_specperf.judging.bottleneck import StepFigures, classify
    from pytest_specperf.probe import StepProbe
    from pytest_specperf.probe.inject import Injector, parse_inject

    stall = Injector(parse_inject("host_stall=2"))
    probes = {
        "off": StepProbe(None, use_cuda=side.use_cuda),
        "on": StepProbe(None, use_cuda=side.use_cuda, injector=stall),
    }
    arms = _arms(eng, probes, blocks=_blocks(side), seed0=60, side=side)
    out: dict[str, Any] = {"steps": {k: len(v) for k, v in arms.items()}}
    for name, recs in arms.items():
        table = phase_table(recs)
        figures = StepFigures(
            step_ms=table["step"]["host_ms"],
            host_ms={p: v["host_ms"] for p, v in table.items() if p not in ("step", "unaccounted")},
            device_ms={p: v["device_ms"] for p, v in table.items()
                       if p not in ("step", "unaccounted") and v.get("device_ms") is not None},
            unaccounted_ms=table["unaccounted"]["host_ms"],
        )
        verdict = classify(figures)
        out[name] = {"unaccounted_ms": table["unaccounted"]["host_ms"],
                     "step_ms": table["step"], "bottleneck": verdict.kind,
                     "describe": verdict.describe()}
    off, on = out["off"]["unaccounted_ms"], out["on"]["unaccounted_ms"]
    out["unaccounted_change_ms"] = on - off if on is not None and off is not None else None
    out["expected_change_ms"] = 2.0
    return out


def layouts(eng: Any, side: Cuda) -> dict[str, Any]:
    """Per phase host/device medians and the verify's KV-read bandwidth at 32k and 46k,
    contiguous and fragmented, against the peak and a copy measured here."""
    from pytest_specperf.telemetry.bandwidth import kv_read_bytes

    peak = peak_of(device_info())
    copy = side.copy_rate(1 << 30, 0.3)
    model = eng.kv_read_model()
    out: dict[str, Any] = {"copy": copy, "peak_gb_per_s": peak.bytes_per_s / 1e9 if peak else None,
                           "kv_read_model": model}
    for ctx in CTXS:
        run_ctx = side.ctx(ctx)
        for layout in ("contiguous", "fragmented"):
            decode(eng, run_ctx, CANARY_TOKENS, seed=80, layout=layout)  # warm: graphs, pages
            r, recs = decode(eng, run_ctx, side.work(3 * CANARY_TOKENS), seed=81, layout=layout)
            verify = _device_ms(recs, "verify") if side.use_cuda else _host_ms(recs, "verify")
            moved = kv_read_bytes(model, run_ctx, 1, r.kv_fragmentation)
            gbs = moved / (verify / 1e3) / 1e9 if verify and moved else None
            out[f"{ctx}/{layout}"] = {
                "steps": len(recs),
                "context_run": run_ctx,
                "fragmentation": r.kv_fragmentation,
                "phases": phase_table(recs),
                "graphs": graph_counts(recs),
                "verify_kv_bytes_moved": moved,
                "context_kv_bytes": model["bytes_per_token"] * run_ctx,
                "verify_gb_per_s": gbs,  # a rehearsal's: over host time (cuda-events)
                "share_of_peak": gbs * 1e9 / peak.bytes_per_s if gbs and peak else None,
                "share_of_copy": gbs / copy["moved_gb_per_s"] if gbs else None,
                "reference_read_ms": r.reference_ms,
            }
    return out


def probe_on_off(eng: Any, side: Cuda, pairs: int = 8) -> dict[str, Any]:
    """Decode time per step with the probe on and off, interleaved (ABBA)."""
    pairs = side.work(pairs)
    from pytest_specperf.probe import NullProbe, StepProbe

    original = eng._decode
    last = [0.0]

    def timed(live: Any) -> None:
        side.synchronize()
        t = time.perf_counter()
        original(live)
        side.synchronize()
        last[0] = time.perf_counter() - t

    probes = {"off": NullProbe(), "on": StepProbe(None, use_cuda=side.use_cuda)}
    per_step: dict[str, list[float]] = {"off": [], "on": []}
    eng._decode = timed
    try:
        for i in range(pairs):
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                with probe_swapped(eng, probes[name]):
                    r, _ = decode(eng, side.ctx(HEAD_CTX), side.work(3 * CANARY_TOKENS), seed=90)
                per_step[name].append(last[0] * 1e3 / max(r.spec_verify_ct, 1))
    finally:
        del eng._decode
    off, on = median(per_step["off"]), median(per_step["on"])
    return {"ms_per_step": per_step, "ratio_on_off": on / off if on and off else None,
            "pairs": pairs, "goal": "at most 1.01"}


def small_trace(eng: Any, out: Path, side: Cuda) -> dict[str, Any]:
    """A small CUDA kineto trace (a few steps at 4k) for the kernel-attribution tests."""
    from torch.profiler import profile

    from pytest_specperf.probe.kineto import parse_trace

    with probe_swapped(eng, annotating_probe(use_cuda=side.use_cuda)):
        decode(eng, side.ctx(SMALL_CTX), 9, seed=3)
        with profile(activities=side.profiler_activities()) as prof:
            _, recs = decode(eng, side.ctx(SMALL_CTX), 9, seed=3)
    path = out / f"traces/{'cpu' if side.rehearsal else 'cuda'}-small.json.gz"
    trace = save_trace(prof, path)
    parsed = parse_trace(trace)
    return {"path": str(path), "steps": len(recs), "device_ops": len(parsed.cuda),
            "source": parsed.source,
            "phases": {p: t.to_json() for p, t in parsed.totals(parsed.source, top=5).items()},
            "device_ns": [r.device_ns for r in recs]}


def dflash_vs_none(eng: Any, side: Cuda) -> dict[str, Any]:
    """Tokens per second of DFLASH (this engine) and NONE (a second engine with the same
    weights) decoding at 46k."""
    from pytest_specperf.engines.reference.engine import Engine
    from pytest_specperf.probe import StepProbe

    none = Engine(eng.cfg, device=side.device, algorithm="NONE",
                  probe=StepProbe(None, use_cuda=side.use_cuda), graph_capture=side.capture())
    out: dict[str, Any] = {}
    try:
        for name, e in (("DFLASH", eng), ("NONE", none)):
            decode(e, side.ctx(HEAD_CTX), side.work(33), seed=70)  # warm: this bucket's graphs
            r, recs = decode(e, side.ctx(HEAD_CTX), side.work(129), seed=71)
            seconds = sum(x.step_ns for x in recs) / 1e9
            tokens = r.completion_tokens - 1
            out[name] = {"tokens": tokens, "steps": len(recs), "decode_s": seconds,
                         "tokens_per_s": tokens / seconds if seconds else None}
    finally:
        del none
        side.empty_cache()
    d, n = out["DFLASH"]["tokens_per_s"], out["NONE"]["tokens_per_s"]
    out["ratio"] = d / n if d and n else None
    return out
