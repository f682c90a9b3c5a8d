"""Drive the decode steps of one case on the session's server and collect its records.

A case is measured as blocks: one warm-up request (graphs captured, caches warm; not
measured), then requests of about ``block_steps`` decode steps each, every one starting
from a fresh prefill of ``context_len`` tokens in the requested KV layout, until
``steps`` measured steps are collected: the first round. The first step after each
prefill is dropped (transient). Blocks are the unit of evidence for the noise estimate
(``judging.noise``); ``judging.samples`` turns the records into a frozen ``DecodeRun``.

More rounds (the automatic extension) repeat the first round's requests exactly: block
``j`` of every round has block ``j``'s prompt, layout seed and length, so that every
extended block has a baseline counterpart (block ``j`` of the baseline's run) and the
verdict pairs the mean of its rounds with it. The server's own metrics are cross-checked
over the first round, and GPU telemetry comes from one long decode after it.
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

from pytest_specperf.judging.samples import DecodeRun, KVLayout, Window, build_run
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.probe.sink import RecordTail
from pytest_specperf.server.model_server import ModelServer

if TYPE_CHECKING:
    from pytest_specperf.telemetry.device import DeviceInfo
    from pytest_specperf.telemetry.nvml import TelemetrySampler
    from pytest_specperf.telemetry.summary import TelemetrySummary

#: Measured steps per block (request): 4, fewer for short runs so that there are always at
#: least 3 blocks to estimate the noise from. More steps mean more blocks, so the noise of
#: the median shrinks as 1/sqrt(steps), which the UNSTABLE advice relies on.
BLOCK_STEPS = 4
#: Steps dropped at the start of every measured request (post-prefill transient).
DISCARD_PER_BLOCK = 1
#: Seconds to wait for the records of a finished request to reach the sink.
RECORD_WAIT_S = 15.0
#: Seed of the warm-up request (measured blocks use seeds 0, 1, 2, ...).
WARMUP_SEED = 10_000
#: Seed of the telemetry decode, and its most new tokens (within every backend's room
#: for decode steps beyond the context, see ``capacity_reason``).
TELEMETRY_SEED = 20_000
TELEMETRY_MAX_NEW_TOKENS = 512

Progress = Callable[[int, int, str], None]


class MeasurementError(RuntimeError):
    """The server or its probe did not deliver what the measurement needs."""


def block_steps(steps: int) -> int:
    return max(1, min(BLOCK_STEPS, steps // 3))


def sampler_for(
    device: DeviceInfo, server: ModelServer, other_pids: tuple[int, ...] = ()
) -> tuple[TelemetrySampler | None, str]:
    """An NVML sampler for the server's GPU, or None and the line saying why not.
    ``other_pids``: the session's other server processes (not foreign processes)."""
    if device.kind != "cuda":
        return None, "telemetry unavailable: no CUDA device (CPU run); host-side view"
    if device.nvml_index is None:
        why = "; ".join(device.notes) or "NVML did not match the CUDA device"
        return None, f"telemetry unavailable: {why}"
    from pytest_specperf.telemetry.nvml import TelemetrySampler

    pids = set(other_pids)
    if server.process is not None and server.process.pid:
        pids.add(server.process.pid)
    if isinstance(server.server_info.get("pid"), int):
        pids.add(server.server_info["pid"])
    return TelemetrySampler(device.nvml_index, uuid=device.uuid, own_pids=tuple(pids)), ""


@dataclass(frozen=True)
class CaseSpec:
    """What one case decodes."""

    context_len: int
    batch_size: int
    steps: int
    warmup_steps: int
    layout: KVLayout
    tag: str


@dataclass
class _Blocks:
    """Records and per-block figures collected so far (internal, mutable while measuring)."""

    records: list[StepRecord] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    frags: list[float] = field(default_factory=list)
    reference: dict[int, float] = field(default_factory=dict)
    #: the first round's requests, (seed, steps wanted, max_new_tokens) per block
    plan: list[tuple[int, int, int]] = field(default_factory=list)
    rounds: int = 1
    round_steps: int = 0
    #: the id of the next block (ids grow across rounds, so blocks sort by round)
    next_block: int = 0

    def add(self, block: int, kept: list[StepRecord], metas: list[dict[str, Any]],
            backend: Any) -> None:  # fmt: skip
        """Keep block ``block``'s records, fragmentation and reference read time."""
        self.frags += [f for f in map(backend.kv_fragmentation, metas) if f is not None]
        refs = [x for x in map(backend.reference_ms, metas) if x]
        if refs:
            self.reference[block] = statistics.median(refs)
        self.records += kept
        self.blocks += [block] * len(kept)


@dataclass
class _Window:
    """What the first round measured besides the records."""

    t0: float
    telemetry: Any = None
    cross_check: tuple[str, ...] = ()


def _accept_estimate(records: list[StepRecord], fallback: float) -> float:
    toks = sum(r.accepted_tokens / max(r.batch_size, 1) for r in records)
    return max(1.0, toks / len(records)) if records else fallback


class Decoder:
    """Runs the requests of one case against the session's server."""

    def __init__(
        self, server: ModelServer, progress: Progress, sampler: TelemetrySampler | None = None
    ) -> None:
        self.server = server
        self.progress = progress
        self.sampler = sampler  # GPU telemetry over the measured blocks (not the warm-up)
        self.tail = RecordTail(server.run_dir, from_end=True)  # skip earlier cases' records
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specperf-http")
        self._got = _Blocks()
        self._window = _Window(time.monotonic())
        self._note = ""  # shown on the progress line
        self._total = 0  # steps the progress line counts to (0: the case's)

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _poll(self, rids: set[str]) -> list[StepRecord]:
        try:
            records = self.tail.poll()
        except ValueError as e:
            raise MeasurementError(str(e)) from None
        return [r for r in records if r.mode == "decode" and rids & set(r.rids)]

    def _body(self, case: CaseSpec, max_new_tokens: int, seed: int, rids: list[str]) -> Any:
        srv = self.server
        body: dict[str, Any] = dict(srv.backend.prompt_fields(case.context_len, len(rids), seed))
        body["sampling_params"] = {
            "max_new_tokens": max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        body["rid"] = rids[0] if len(rids) == 1 else rids
        return body

    def _expected_steps(self, metas: list[dict[str, Any]]) -> int:
        if self.server.speculative:
            return max(int(m.get("spec_verify_ct") or 0) for m in metas)
        return max(int(m.get("completion_tokens", 1)) - 1 for m in metas)

    def _request(
        self, case: CaseSpec, *, max_new_tokens: int, seed: int, tag: str, counted: int
    ) -> tuple[list[StepRecord], list[dict[str, Any]]]:
        """One request; its decode records (rank 0) and the responses' ``meta_info``."""
        srv = self.server
        srv.backend.set_kv_layout(srv.client, case.layout.name, case.layout.level, seed)
        rids = [f"specperf-{tag}-{uuid.uuid4().hex[:10]}" for _ in range(case.batch_size)]
        fut = self._pool.submit(srv.client.generate, self._body(case, max_new_tokens, seed, rids))
        mine: list[StepRecord] = []
        while True:
            done = fut.done()
            mine += self._poll(set(rids))
            self.progress(counted + len(mine), self._total or case.steps, self._note)
            if done:
                break
            time.sleep(0.2)
        resp = fut.result()
        metas = resp if isinstance(resp, list) else [resp]
        if not all(isinstance(m, dict) and isinstance(m.get("meta_info"), dict) for m in metas):
            raise MeasurementError(f"unexpected /generate response: {str(resp)[:200]}")
        infos = [m["meta_info"] for m in metas]
        mine += self._wait_records(set(rids), len(mine), self._expected_steps(infos))
        mine.sort(key=lambda r: (r.rank, r.step))
        rank0 = min(r.rank for r in mine) if mine else 0
        return [r for r in mine if r.rank == rank0], infos

    def _wait_records(self, rids: set[str], have: int, expected: int) -> list[StepRecord]:
        """Records of a finished request still on their way to the sink."""
        more: list[StepRecord] = []
        deadline = time.monotonic() + RECORD_WAIT_S
        while have + len(more) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            more += self._poll(rids)
        if have + len(more) < expected:
            raise MeasurementError(
                f"the server ran {expected} decode steps for request {sorted(rids)[0]} but the "
                f"probe recorded {have + len(more)} in {self.server.run_dir}: is the specperf "
                "probe active in the server? (SGLang: SPECPERF_SGLANG_PLUGIN=1 and "
                "SPECPERF_RUN_DIR in its environment; reference: its --run-dir)"
            )
        return more

    def _warm_up(self, case: CaseSpec, block: int) -> float:
        """The unmeasured warm-up request; returns the accept length it showed."""
        if case.warmup_steps <= 0:
            return 1.0
        self.progress(0, case.steps, "warm-up")
        recs, _ = self._request(
            case,
            max_new_tokens=1 + case.warmup_steps * block,
            seed=WARMUP_SEED,
            tag=f"{case.tag}-warmup",
            counted=0,
        )
        return _accept_estimate(recs, 1.0)

    def _measure_blocks(self, case: CaseSpec, accept: float) -> _Blocks:
        """The first round: blocks until ``case.steps`` steps are measured."""
        per_block = block_steps(case.steps)
        got = _Blocks()
        b = 0
        while len(got.records) < case.steps:
            want = min(per_block, case.steps - len(got.records))
            max_new = 1 + math.ceil((want + DISCARD_PER_BLOCK) * accept * 1.25) + 1
            recs, metas = self._request(
                case, max_new_tokens=max_new, seed=b, tag=f"{case.tag}-b{b}",
                counted=len(got.records),
            )  # fmt: skip
            accept = _accept_estimate(recs, accept)
            kept = recs[DISCARD_PER_BLOCK : DISCARD_PER_BLOCK + want]
            got.add(b, kept, metas, self.server.backend)
            if kept:  # a block that measured nothing is not repeated
                got.plan.append((b, want, max_new))
            b += 1
            if b > 4 * case.steps:
                raise MeasurementError(f"collected only {len(got.records)} of {case.steps} steps")
        got.round_steps = len(got.records)
        got.next_block = b
        return got

    def _telemetry_decode(
        self, case: CaseSpec, measured: list[StepRecord], accept: float
    ) -> TelemetrySummary | None:
        """GPU telemetry over one long back-to-back decode of the case (at least
        ``MIN_WINDOW_S``), keeping only the samples inside its decode steps: the short
        measured blocks are mostly prefill, HTTP and polling, which would dilute it."""
        if self.sampler is None:
            return None
        from pytest_specperf.telemetry.nvml import MIN_WINDOW_S

        step_s = statistics.median(r.step_ns for r in measured) / 1e9 if measured else 0.01
        n = math.ceil(MIN_WINDOW_S / max(step_s, 1e-4)) + DISCARD_PER_BLOCK
        max_new = min(1 + math.ceil(n * accept * 1.25), TELEMETRY_MAX_NEW_TOKENS)
        self.sampler.start()
        try:
            recs, _ = self._request(
                case, max_new_tokens=max_new, seed=TELEMETRY_SEED, tag=f"{case.tag}-telemetry",
                counted=case.steps,
            )  # fmt: skip
            self.sampler.add_windows((r.wall_ns, r.wall_ns + r.step_ns) for r in recs[1:])
        finally:
            summary = self.sampler.stop()
        return summary

    def start(self, case: CaseSpec, *, note: str = "") -> None:
        """Warm up and measure the first round of ``case`` (``run`` builds the run); the
        telemetry decode follows it (``_telemetry_decode``)."""
        t0 = time.monotonic()
        self._note, self._total = note, 0
        srv = self.server
        info = srv.server_info
        block = int(info.get("speculative_num_draft_tokens") or 8) if srv.speculative else 1
        accept = self._warm_up(case, block)
        metrics_before = srv.backend.metrics_before(srv.client)
        window_t0 = time.monotonic()
        self._got = self._measure_blocks(case, accept)
        cross = srv.backend.metrics_check(
            srv.client, metrics_before, self._got.records, time.monotonic() - window_t0
        )
        # after the cross-check window, so that its extra decode does not distort it
        telemetry = self._telemetry_decode(case, self._got.records, accept)
        self._window = _Window(t0, telemetry, tuple(cross))

    def more(self, case: CaseSpec, *, note: str = "") -> bool:
        """Measure one more round of the first round's blocks; False (and nothing kept)
        when a block came back without measured steps, so rounds stay whole."""
        got = self._got
        self._note, self._total = note, got.round_steps * (got.rounds + 1)
        first = got.next_block
        done = len(got.records)
        extra = _Blocks()
        for j, (seed, want, max_new) in enumerate(got.plan):
            recs, metas = self._request(
                case, max_new_tokens=max_new, seed=seed, tag=f"{case.tag}-r{got.rounds}b{j}",
                counted=done + len(extra.records),
            )  # fmt: skip
            kept = recs[DISCARD_PER_BLOCK : DISCARD_PER_BLOCK + want]
            if not kept:
                return False
            extra.add(first + j, kept, metas, self.server.backend)
        got.records += extra.records
        got.blocks += extra.blocks
        got.frags += extra.frags
        got.reference.update(extra.reference)
        got.rounds += 1
        got.next_block = first + len(got.plan)
        return True

    def run(self, case: CaseSpec) -> DecodeRun:
        """The frozen run of every round measured so far."""
        got, w = self._got, self._window
        window = Window(
            fragmentation=sum(got.frags) / len(got.frags) if got.frags else None,
            wall_s=time.monotonic() - w.t0,
            warmup_steps=case.warmup_steps,
            reference=got.reference,
            telemetry=w.telemetry,
            cross_check=w.cross_check,
            server_pid=_pid(self.server.server_info.get("pid")),
            rounds=got.rounds,
            round_steps=got.round_steps,
        )
        return build_run(
            got.records,
            got.blocks,
            context_len=case.context_len,
            batch_size=case.batch_size,
            layout=case.layout,
            window=window,
        )

    def decode(self, case: CaseSpec) -> DecodeRun:
        """Warm up, measure the first round of ``case`` and build its frozen run."""
        self.start(case)
        return self.run(case)


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
