"""Drive decode steps on the server and turn the probe's step records into a case result.

A case is measured as blocks: one warm-up request (graphs captured, caches warm; not
measured), then requests of about ``block_steps`` decode steps each, every one starting
from a fresh prefill of ``context_len`` tokens in the requested KV layout, until ``steps``
measured steps are collected. The first step after each prefill is dropped (transient).
Blocks are the unit of evidence for the noise estimate (see ``stats.py``).
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_specperf.probe.phases import PHASES, UNACCOUNTED
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.probe.sink import RecordTail
from pytest_specperf.serving import ModelServer
from pytest_specperf.stats import Summary, summarize

if TYPE_CHECKING:
    from pytest_specperf.telemetry.nvml import TelemetrySampler
    from pytest_specperf.telemetry.summary import TelemetrySummary

#: Measured steps per block (request): 4, fewer for short runs so that there are always at
#: least 3 blocks to estimate the noise from. More steps mean more blocks, so the noise of
#: the median shrinks as 1/sqrt(steps), which the UNSTABLE advice relies on.
BLOCK_STEPS = 4


def block_steps(steps: int) -> int:
    return max(1, min(BLOCK_STEPS, steps // 3))


#: Steps dropped at the start of every measured request (post-prefill transient).
DISCARD_PER_BLOCK = 1
#: Metrics judged on their mean: accepted tokens per step is an integer per step, so its
#: median moves in whole tokens; tokens/s follows it.
MEAN_METRICS = frozenset({"accept_len", "tokens_per_s"})
#: Suffix of the drift-free form of a phase; name of the drift-free form of the step.
PER_REST = "/rest"
STEP_PER_REF = "step/ref"
#: Seconds to wait for the records of a finished request to reach the sink.
RECORD_WAIT_S = 15.0


class MeasurementError(RuntimeError):
    """The server or its probe did not deliver what the measurement needs."""


@dataclass(frozen=True)
class KVLayout:
    name: str  # contiguous | fragmented
    level: float

    @property
    def label(self) -> str:
        if self.name == "fragmented" and self.level < 1.0:
            return f"fragmented@{self.level:g}"
        return self.name


@dataclass
class DecodeRun:
    """The measured steps of one case and their summaries."""

    context_len: int
    batch_size: int
    kv_layout: KVLayout
    records: list[StepRecord]
    blocks: list[int]
    samples: dict[str, list[float]]
    summaries: dict[str, Summary]
    fragmentation: float | None
    graphs: dict[str, dict[str, int]]
    wall_s: float
    warmup_steps: int
    labels: dict[str, str] = field(default_factory=dict)
    has_device_times: bool = False
    #: NVML/GPM telemetry over the measured blocks (GPU runs)
    telemetry: TelemetrySummary | None = None
    #: per block: the request's KV read time (ms), the step's reference (reference engine)
    reference_ms: list[float] = field(default_factory=list)
    #: where the server's own metrics disagree with the probe over the measured window
    cross_check: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def step_ms(self) -> Summary:
        return self.summaries["step"]

    @property
    def accept_len(self) -> float:
        """Mean accepted tokens per step and request."""
        return self.summaries["accept_len"].value

    def phase_ms(self, phase: str) -> float:
        return self.summaries[phase].median

    @property
    def eager_forwards(self) -> int:
        return sum(g["eager"] for g in self.graphs.values())


def per_rest(phase: str) -> str:
    """Name of ``phase``'s time relative to the rest of its step (judged for phases)."""
    return f"{phase}{PER_REST}"


def samples_from_records(
    records: list[StepRecord],
    blocks: list[int] | None = None,
    reference: dict[int, float] | None = None,
) -> dict[str, list[float]]:
    """Per-step metric samples: times in ms, accept_len in tokens, tokens_per_s.

    Also the drift-free form the verdicts use for phases: each phase's time relative to
    the other named phases of the same step (``verify/rest``). A slower machine slows
    them alike; a slower phase stands out. ``unaccounted`` is not part of the rest, so a
    host stall does not move the phases. With a reference read time per block (the
    request's KV read through its page table, see the reference engine), also the step
    relative to it (``step/ref``).
    """
    out: dict[str, list[float]] = {
        "step": [],
        UNACCOUNTED: [],
        "accept_len": [],
        "tokens_per_s": [],
    }
    for p in PHASES:
        out[p] = []
    device = all(r.device_ns is not None for r in records) and bool(records)
    if device:
        for p in PHASES:
            out[f"device.{p}"] = []
            out[per_rest(f"device.{p}")] = []
        out["device.step"] = []
        out["device_busy"] = []
    for p in PHASES:
        out[per_rest(p)] = []
    use_ref = bool(reference) and blocks is not None and all(b in (reference or {}) for b in blocks)
    if use_ref:
        out[STEP_PER_REF] = []
    for i, r in enumerate(records):
        out["step"].append(r.step_ns / 1e6)
        out[UNACCOUNTED].append(r.unaccounted_ns / 1e6)
        named = sum(r.host_ns.get(p, 0) for p in PHASES)
        for p in PHASES:
            ns = r.host_ns.get(p, 0)
            out[p].append(ns / 1e6)
            rest = named - ns
            out[per_rest(p)].append(ns / rest if rest > 0 else 0.0)
        if use_ref and blocks is not None and reference is not None:
            out[STEP_PER_REF].append(r.step_ns / 1e6 / reference[blocks[i]])
        out["accept_len"].append(r.accepted_tokens / max(r.batch_size, 1))
        out["tokens_per_s"].append(r.accepted_tokens / (r.step_ns / 1e9) if r.step_ns else 0.0)
        if device and r.device_ns is not None:
            busy = sum(r.device_ns.values())
            for p in PHASES:
                ns = r.device_ns.get(p, 0)
                out[f"device.{p}"].append(ns / 1e6)
                rest = busy - ns
                out[per_rest(f"device.{p}")].append(ns / rest if rest > 0 else 0.0)
            out["device.step"].append((r.device_step_ns or 0) / 1e6)
            out["device_busy"].append(busy / r.step_ns if r.step_ns else 0.0)
    return out


def build_run(
    records: list[StepRecord],
    blocks: list[int],
    *,
    context_len: int,
    batch_size: int,
    layout: KVLayout,
    fragmentation: float | None,
    wall_s: float,
    warmup_steps: int,
    reference: dict[int, float] | None = None,
) -> DecodeRun:
    samples = samples_from_records(records, blocks, reference)
    summaries = {
        k: summarize(v, blocks, center="mean" if k in MEAN_METRICS else "median")
        for k, v in samples.items()
        if v
    }
    graphs: dict[str, dict[str, int]] = {}
    for r in records:
        for name, g in r.graphs.items():
            c = graphs.setdefault(name, {"replay": 0, "eager": 0})
            c["replay"] += g.replay
            c["eager"] += g.eager
    labels = dict(records[0].labels) if records else {}
    return DecodeRun(
        context_len=context_len,
        batch_size=batch_size,
        kv_layout=layout,
        records=records,
        blocks=blocks,
        samples=samples,
        summaries=summaries,
        fragmentation=fragmentation,
        graphs=graphs,
        wall_s=wall_s,
        warmup_steps=warmup_steps,
        labels=labels,
        has_device_times="device.step" in samples,
    )


class Decoder:
    """Runs the requests of one case against the session's server."""

    def __init__(
        self,
        server: ModelServer,
        progress: Callable[[int, int, str], None],
        sampler: TelemetrySampler | None = None,
    ) -> None:
        if server.run_dir is None:
            raise MeasurementError("the server has no readable run directory for step records")
        self.server = server
        self.progress = progress
        self.sampler = sampler  # GPU telemetry over the measured blocks (not the warm-up)
        self.tail = RecordTail(server.run_dir, from_end=True)  # skip earlier cases' records
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specperf-http")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _poll(self) -> list[StepRecord]:
        try:
            return self.tail.poll()
        except ValueError as e:
            raise MeasurementError(str(e)) from None

    def _request(
        self,
        *,
        context_len: int,
        batch_size: int,
        max_new_tokens: int,
        layout: KVLayout,
        seed: int,
        tag: str,
        counted: int,
        wanted: int,
    ) -> tuple[list[StepRecord], list[dict[str, Any]]]:
        srv = self.server
        srv.backend.set_kv_layout(srv.client, srv.run_dir, layout.name, layout.level, seed)
        rids = [f"specperf-{tag}-{uuid.uuid4().hex[:10]}" for _ in range(batch_size)]
        body: dict[str, Any] = dict(srv.backend.prompt_fields(context_len, batch_size, seed))
        sp = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
        body["sampling_params"] = sp
        body["rid"] = rids[0] if batch_size == 1 else rids
        fut = self._pool.submit(srv.client.generate, body)
        rid_set = set(rids)
        mine: list[StepRecord] = []
        while True:
            done = fut.done()
            mine += [r for r in self._poll() if r.mode == "decode" and rid_set & set(r.rids)]
            self.progress(counted + len(mine), wanted, "")
            if done:
                break
            time.sleep(0.2)
        resp = fut.result()
        metas = resp if isinstance(resp, list) else [resp]
        if not all(isinstance(m, dict) and isinstance(m.get("meta_info"), dict) for m in metas):
            raise MeasurementError(f"unexpected /generate response: {str(resp)[:200]}")
        expected = max(int(m["meta_info"].get("spec_verify_ct") or 0) for m in metas)
        if not srv.speculative:
            expected = max(int(m["meta_info"].get("completion_tokens", 1)) - 1 for m in metas)
        deadline = time.monotonic() + RECORD_WAIT_S
        while len(mine) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            mine += [r for r in self._poll() if r.mode == "decode" and rid_set & set(r.rids)]
        if len(mine) < expected:
            raise MeasurementError(
                f"the server ran {expected} decode steps for request {rids[0]} but the probe "
                f"recorded {len(mine)} in {srv.run_dir}: is the specperf probe active in the "
                "server? (SGLang: SPECPERF_SGLANG_PLUGIN=1 and SPECPERF_RUN_DIR in its "
                "environment; reference: its --run-dir)"
            )
        mine.sort(key=lambda r: (r.rank, r.step))
        rank0 = min(r.rank for r in mine) if mine else 0
        return [r for r in mine if r.rank == rank0], [m["meta_info"] for m in metas]

    def decode(
        self,
        *,
        context_len: int,
        batch_size: int,
        steps: int,
        warmup_steps: int,
        layout: KVLayout,
        tag: str,
    ) -> DecodeRun:
        t0 = time.monotonic()
        info = self.server.server_info
        block = int(info.get("speculative_num_draft_tokens") or 8) if self.server.speculative else 1
        accept = 1.0
        if warmup_steps > 0:
            self.progress(0, steps, "warm-up")
            recs, metas = self._request(
                context_len=context_len,
                batch_size=batch_size,
                max_new_tokens=1 + warmup_steps * block,
                layout=layout,
                seed=10_000,
                tag=f"{tag}-warmup",
                counted=0,
                wanted=steps,
            )
            accept = _accept_estimate(recs, accept)
        sampler = self.sampler
        srv = self.server
        metrics_before = srv.backend.metrics_before(srv.client)
        window_t0 = time.monotonic()
        if sampler is not None:
            sampler.start()
        try:
            per_block = block_steps(steps)
            records: list[StepRecord] = []
            blocks: list[int] = []
            frags: list[float] = []
            reference: dict[int, float] = {}
            b = 0
            while len(records) < steps:
                want = min(per_block, steps - len(records))
                max_new = 1 + math.ceil((want + DISCARD_PER_BLOCK) * accept * 1.25) + 1
                recs, metas = self._request(
                    context_len=context_len,
                    batch_size=batch_size,
                    max_new_tokens=max_new,
                    layout=layout,
                    seed=b,
                    tag=f"{tag}-b{b}",
                    counted=len(records),
                    wanted=steps,
                )
                accept = _accept_estimate(recs, accept)
                for m in metas:
                    f = self.server.backend.kv_fragmentation(m, self.server.run_dir)
                    if f is not None:
                        frags.append(f)
                refs = [x for x in (srv.backend.reference_ms(m) for m in metas) if x]
                if refs:
                    reference[b] = statistics.median(refs)
                kept = recs[DISCARD_PER_BLOCK : DISCARD_PER_BLOCK + want]
                records += kept
                blocks += [b] * len(kept)
                b += 1
                if b > 4 * steps:
                    raise MeasurementError(f"collected only {len(records)} of {steps} steps")
        finally:
            telemetry = sampler.stop() if sampler is not None else None
        frag = sum(frags) / len(frags) if frags else None
        run = build_run(
            records,
            blocks,
            context_len=context_len,
            batch_size=batch_size,
            layout=layout,
            fragmentation=frag,
            wall_s=time.monotonic() - t0,
            warmup_steps=warmup_steps,
            reference=reference,
        )
        run.reference_ms = [reference[b] for b in sorted(reference)]
        run.cross_check = srv.backend.metrics_check(
            srv.client, metrics_before, records, time.monotonic() - window_t0
        )
        if telemetry is not None:
            run.telemetry = telemetry
            run.summaries.update(utilization_summaries(telemetry))
        return run


#: Telemetry medians stored as metrics (and gated as drops in percentage points).
UTILIZATION_METRICS = {
    "util.sm": "sm_util_pct",
    "util.dram": "dram_util_pct",
    "util.tensor": "tensor_util_pct",
    "util.gpu": "gpu_util_pct",
}


def utilization_summaries(t: TelemetrySummary) -> dict[str, Summary]:
    """The telemetry's utilization medians (percent) as summaries (one point each)."""
    out: dict[str, Summary] = {}
    if not t.available:
        return out
    for name, key in UTILIZATION_METRICS.items():
        m = t.metrics.get(key)
        if m is None or not m.n:
            continue
        out[name] = Summary(
            n=m.n,
            median=m.median,
            mean=m.median,
            stdev=0.0,
            mad=0.0,
            q10=m.min,
            q90=m.max,
            min=m.min,
            max=m.max,
        )
    return out


def _accept_estimate(records: list[StepRecord], fallback: float) -> float:
    toks = sum(r.accepted_tokens / max(r.batch_size, 1) for r in records)
    return max(1.0, toks / len(records)) if records else fallback
