"""Drive decode steps on the server and turn the probe's step records into a case result.

A case is measured as blocks: one warm-up request (graphs captured, caches warm; not
measured), then requests of about ``block_steps`` decode steps each, every one starting
from a fresh prefill of ``context_len`` tokens in the requested KV layout, until ``steps``
measured steps are collected. The first step after each prefill is dropped (transient).
Blocks are the unit of evidence for the noise estimate (see ``stats.py``).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pytest_specperf.probe.phases import PHASES, UNACCOUNTED
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.probe.sink import RecordTail
from pytest_specperf.serving import ModelServer
from pytest_specperf.stats import Summary, summarize

#: Measured requests per case (blocks); each gives steps / BLOCKS steps.
BLOCKS = 8
#: Fewest measured steps per block.
MIN_BLOCK_STEPS = 4
#: Steps dropped at the start of every measured request (post-prefill transient).
DISCARD_PER_BLOCK = 1
#: Metrics judged on their mean: accepted tokens per step is an integer per step, so its
#: median moves in whole tokens; tokens/s follows it.
MEAN_METRICS = frozenset({"accept_len", "tokens_per_s"})
#: Suffix of the drift-free form of a phase.
PER_REST = "/rest"
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


def samples_from_records(records: list[StepRecord]) -> dict[str, list[float]]:
    """Per-step metric samples: times in ms, accept_len in tokens, tokens_per_s.

    Also the drift-free form the verdicts use for phases: each phase's time relative to
    the other named phases of the same step (``verify/rest``). A slower machine slows
    them alike; a slower phase stands out. ``unaccounted`` is not part of the rest, so a
    host stall does not move the phases.
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
        out["device.step"] = []
        out["device_busy"] = []
    for p in PHASES:
        out[per_rest(p)] = []
    for r in records:
        out["step"].append(r.step_ns / 1e6)
        out[UNACCOUNTED].append(r.unaccounted_ns / 1e6)
        named = sum(r.host_ns.get(p, 0) for p in PHASES)
        for p in PHASES:
            ns = r.host_ns.get(p, 0)
            out[p].append(ns / 1e6)
            rest = named - ns
            out[per_rest(p)].append(ns / rest if rest > 0 else 0.0)
        out["accept_len"].append(r.accepted_tokens / max(r.batch_size, 1))
        out["tokens_per_s"].append(r.accepted_tokens / (r.step_ns / 1e9) if r.step_ns else 0.0)
        if device and r.device_ns is not None:
            busy = sum(r.device_ns.values())
            for p in PHASES:
                out[f"device.{p}"].append(r.device_ns.get(p, 0) / 1e6)
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
) -> DecodeRun:
    samples = samples_from_records(records)
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

    def __init__(self, server: ModelServer, progress: Callable[[int, int, str], None]) -> None:
        if server.run_dir is None:
            raise MeasurementError("the server has no readable run directory for step records")
        self.server = server
        self.progress = progress
        self.tail = RecordTail(server.run_dir)
        self.tail.poll()  # skip records of earlier cases
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specperf-http")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

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
            mine += [r for r in self.tail.poll() if r.mode == "decode" and rid_set & set(r.rids)]
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
            mine += [r for r in self.tail.poll() if r.mode == "decode" and rid_set & set(r.rids)]
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
        per_block = max(MIN_BLOCK_STEPS, math.ceil(steps / BLOCKS))
        records: list[StepRecord] = []
        blocks: list[int] = []
        frags: list[float] = []
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
            kept = recs[DISCARD_PER_BLOCK : DISCARD_PER_BLOCK + want]
            records += kept
            blocks += [b] * len(kept)
            b += 1
            if b > 4 * steps:
                raise MeasurementError(f"collected only {len(records)} of {steps} steps")
        frag = sum(frags) / len(frags) if frags else None
        return build_run(
            records,
            blocks,
            context_len=context_len,
            batch_size=batch_size,
            layout=layout,
            fragmentation=frag,
            wall_s=time.monotonic() - t0,
            warmup_steps=warmup_steps,
        )


def _accept_estimate(records: list[StepRecord], fallback: float) -> float:
    toks = sum(r.accepted_tokens / max(r.batch_size, 1) for r in records)
    return max(1.0, toks / len(records)) if records else fallback
