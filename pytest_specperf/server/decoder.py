"""Drive the decode steps of one case on the session's server and collect its records.

A case is measured as blocks: one warm-up request (graphs captured, caches warm; not
measured), then requests of about ``block_steps`` decode steps each, every one starting
from a fresh prefill of ``context_len`` tokens in the requested KV layout, until
``steps`` measured steps are collected: the first round. The first step after each
prefill is dropped (transient). A request asks for the steps it keeps and the dropped
one, which a server that can (``Backend.step_limit_fields``) ends it on; elsewhere it runs
on to its token ceiling, sized for more acceptance than seen, a few steps past them.
Blocks are the unit of evidence for the noise estimate (``judging.noise``). The decoder
hands back what it measured as a frozen ``Measured``; the run pipeline (``run.measure``)
turns it into the ``DecodeRun`` that is judged.

More rounds (the automatic extension) repeat the first round's requests exactly: block
``j`` of every round has block ``j``'s prompt, layout seed and length, so that every
extended block has a baseline counterpart (block ``j`` of the baseline's run) and the
verdict pairs the mean of its rounds with it. The server's own metrics are cross-checked
over the first round, and GPU telemetry comes from one long decode after it.

While a request runs, the server's progress is watched (``probe.heartbeat``: the steps
its processes recorded and their CPU time, reported every half second, and, where the
server runs on this machine, the kernel's account of its processes and their children,
waiting for a CPU included): a server that made none for ``STALL_S`` is frozen or hung,
and the case fails within seconds naming the request and its stage, whether or not the
case's pace is known; a slow request that makes progress is never failed by that rule.
Every request also has a deadline, the backstop for a hang that burns CPU:
``DEADLINE_FACTOR`` times what it should take at the pace known so far (the baseline's
step time before the warm-up, then the pace the case's own requests showed: a prefill
plus a time per step), never less than a floor. A launched server that exits fails the
case at once, naming how it ended.
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pytest_specperf.probe.heartbeat import CPU_PROGRESS_S, ProgressWatch
from pytest_specperf.probe.inject import CONTROL_FILE, INJECT_ERROR_LABEL, INJECT_LABEL
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.probe.sink import RecordTail
from pytest_specperf.server.client import MAX_TIMEOUT_S, ServerHTTPError, ServerUnreachable
from pytest_specperf.server.model_server import ModelServer

if TYPE_CHECKING:
    from pytest_specperf.telemetry.device import DeviceInfo
    from pytest_specperf.telemetry.nvml import TelemetrySampler
    from pytest_specperf.telemetry.summary import TelemetrySummary

#: Measured steps per block (request): 4, fewer for short runs so that there are always at
#: least 3 blocks to estimate the noise from. More steps mean more blocks, so the noise of
#: the median shrinks as 1/sqrt(steps), which the UNSTABLE advice relies on.
BLOCK_STEPS = 4
#: Seconds between looks at a running request's records (progress, liveness, deadline).
POLL_S = 0.2
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
#: A request's deadline is this many times what it should take at the pace known so far.
DEADLINE_FACTOR = 10.0
#: Shortest deadline of a measured request, in seconds (short requests on a busy machine).
DEADLINE_FLOOR_S = 10.0
#: Shortest deadline of a case's first request (its first prefill at this context length,
#: without a pace measured yet), in seconds.
FIRST_DEADLINE_FLOOR_S = 120.0
#: Seconds a failed request waits for a dying server's exit status (to name how it ended).
EXIT_GRACE_S = 1.0

Progress = Callable[[int, int, str], None]


class MeasurementError(RuntimeError):
    """The server or its probe did not deliver what the measurement needs."""


class ServerStopped(MeasurementError):
    """The server gave no answer within a request's deadline."""


class ServerFrozen(ServerStopped):
    """The server made no progress (no step, no CPU time) for ``STALL_S`` in a request."""


class ServerExited(MeasurementError):
    """The launched server process ended during the case."""


@dataclass(frozen=True)
class Pace:
    """What a request of the case should take: a fixed part (its prefill) and a time per
    decode step, both in seconds; ``floor_s`` is the shortest deadline."""

    fixed_s: float = 0.0
    step_s: float = 0.0
    floor_s: float = FIRST_DEADLINE_FLOOR_S

    def deadline_s(self, max_steps: int) -> float:
        """The deadline of a request of at most ``max_steps`` decode steps (at most
        ``MAX_TIMEOUT_S``: a pace from any baseline gives a usable figure)."""
        wanted = DEADLINE_FACTOR * (self.fixed_s + max_steps * self.step_s)
        if math.isnan(wanted):
            return self.floor_s
        return min(max(self.floor_s, wanted), MAX_TIMEOUT_S)

    def widened(self, records: list[StepRecord], wall_s: float) -> Pace:
        """This pace, widened by a request that took ``wall_s`` for ``records``."""
        step_s = statistics.median(r.step_ns for r in records) / 1e9 if records else 0.0
        fixed_s = max(0.0, wall_s - len(records) * step_s)
        return Pace(max(self.fixed_s, fixed_s), max(self.step_s, step_s), DEADLINE_FLOOR_S)


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


@dataclass(frozen=True)
class Measured:
    """What the decoder measured of a case, every round so far: the step records, the
    block each belongs to, and the figures measured besides them."""

    case: CaseSpec
    records: tuple[StepRecord, ...]
    blocks: tuple[int, ...]
    fragmentation: float | None
    wall_s: float
    reference: Mapping[int, float]
    telemetry: TelemetrySummary | None
    cross_check: tuple[str, ...]
    server_pid: int | None
    rounds: int
    round_steps: int


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
class _Following:
    """One request being followed: its ids, what it is (for a failure), its clock."""

    rids: list[str]
    what: str
    t0: float
    deadline_s: float
    counted: int
    steps: int
    #: whether the request itself was sent (before: the KV layout call)
    sent: bool = False


@dataclass
class _Window:
    """What the first round measured besides the records."""

    t0: float
    telemetry: Any = None
    cross_check: tuple[str, ...] = ()


def _meta_infos(resp: Any) -> list[dict[str, Any]]:
    metas = resp if isinstance(resp, list) else [resp]
    if not all(isinstance(m, dict) and isinstance(m.get("meta_info"), dict) for m in metas):
        raise MeasurementError(f"unexpected /generate response: {str(resp)[:200]}")
    return [m["meta_info"] for m in metas]


def _check_one_injection(records: list[StepRecord]) -> None:
    """The measured steps ran under one injection state, which the probe could apply."""
    states = {
        (r.labels.get(INJECT_LABEL, ""), r.labels.get(INJECT_ERROR_LABEL, "")) for r in records
    }
    errors = sorted({err for _, err in states if err})
    if errors:
        raise MeasurementError(f"the server's probe could not use its control file: {errors[0]}")
    if len(states) > 1:
        shown = ", ".join(sorted(spec or "none" for spec, _ in states))
        raise MeasurementError(
            f"the canary injection changed during the case ({shown}): the server's "
            f"{CONTROL_FILE} was written while it ran; run the case again"
        )


def _accept_estimate(records: list[StepRecord], fallback: float) -> float:
    toks = sum(r.accepted_tokens / max(r.batch_size, 1) for r in records)
    return max(1.0, toks / len(records)) if records else fallback


class Decoder:
    """Runs the requests of one case against the session's server."""

    def __init__(
        self,
        server: ModelServer,
        progress: Progress,
        sampler: TelemetrySampler | None = None,
        *,
        baseline_step_ms: float | None = None,
        pace: Pace | None = None,
    ) -> None:
        """``baseline_step_ms`` paces the first request's deadline; ``pace`` replaces it."""
        self.server = server
        self.progress = progress
        self.sampler = sampler  # GPU telemetry over the measured blocks (not the warm-up)
        self.tail = RecordTail(server.run_dir, from_end=True)  # skip earlier cases' records
        self.watch = ProgressWatch(server.run_dir)  # the server's progress (frozen: none)
        self._pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="specperf-http")
        self.pace = pace or Pace(step_s=(baseline_step_ms or 0.0) / 1e3)
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

    def _body(
        self, case: CaseSpec, max_new_tokens: int, seed: int, rids: list[str], steps: int | None
    ) -> Any:
        """The ``/generate`` body; ``steps``: the decode steps the request is for (the
        server ends it there where it can, ``Backend.step_limit_fields``)."""
        srv = self.server
        body: dict[str, Any] = dict(srv.backend.prompt_fields(case.context_len, len(rids), seed))
        body["sampling_params"] = {
            "max_new_tokens": max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if steps is not None:
            body["sampling_params"].update(srv.backend.step_limit_fields(srv.server_info, steps))
        body["rid"] = rids[0] if len(rids) == 1 else rids
        return body

    def _expected_steps(self, metas: list[dict[str, Any]]) -> int:
        if self.server.speculative:
            return max(int(m.get("spec_verify_ct") or 0) for m in metas)
        return max(int(m.get("completion_tokens", 1)) - 1 for m in metas)

    def _request(
        self, case: CaseSpec, *, max_new_tokens: int, seed: int, tag: str, counted: int,
        what: str, steps: int | None = None,
    ) -> tuple[list[StepRecord], list[dict[str, Any]]]:  # fmt: skip
        """One request (``what`` names it in a failure) of at most ``max_new_tokens`` and,
        where the server can end it there, ``steps`` decode steps; its decode records
        (rank 0) and the responses' ``meta_info``."""
        srv = self.server
        deadline_s = self.pace.deadline_s(max_new_tokens)
        t0 = time.monotonic()
        client = srv.client.with_timeout(deadline_s)
        rids = [f"specperf-{tag}-{uuid.uuid4().hex[:10]}" for _ in range(case.batch_size)]
        mine: list[StepRecord] = []
        follow = _Following(rids, what, t0, deadline_s, counted, case.steps)
        self.watch.restart()
        layout = self._pool.submit(
            srv.backend.set_kv_layout, client, case.layout.name, case.layout.level, seed
        )
        self._follow(layout, follow, mine)
        try:
            layout.result()
        except (ServerUnreachable, ServerHTTPError) as e:
            raise self._failure(e, rids[0], deadline_s) from None
        body = self._body(case, max_new_tokens, seed, rids, steps)
        left = max(deadline_s - (time.monotonic() - t0), 1.0)
        fut = self._pool.submit(client.generate, body, timeout=left)
        follow.sent = True
        self._follow(fut, follow, mine)
        try:
            resp = fut.result()
        except (ServerUnreachable, ServerHTTPError) as e:
            raise self._failure(e, rids[0], deadline_s) from None
        infos = _meta_infos(resp)
        mine += self._wait_records(set(rids), len(mine), self._expected_steps(infos))
        mine.sort(key=lambda r: (r.rank, r.step))
        rank0 = min(r.rank for r in mine) if mine else 0
        recs = [r for r in mine if r.rank == rank0]
        self.pace = self.pace.widened(recs, time.monotonic() - t0)
        return recs, infos

    def _follow(self, fut: futures.Future[Any], f: _Following, mine: list[StepRecord]) -> None:
        """Wait for ``fut`` while following its request: its records (the progress line),
        the server's exit, its progress (no progress for ``STALL_S``: frozen) and the
        request's deadline (the backstop for a server that burns CPU without a step)."""
        while True:
            done = fut.done()
            mine += self._poll(set(f.rids))
            self.progress(f.counted + len(mine), self._total or f.steps, self._note)
            if done:
                return
            self._check_alive()
            stalled = self.watch.stalled_for()
            if stalled is not None:
                raise self._frozen(stalled, f, len(mine))
            if time.monotonic() - f.t0 > f.deadline_s:
                raise self._stopped(f.rids[0], f.deadline_s)
            # progress every POLL_S, but on as soon as the response is in (a sleep made every
            # request wait for the next tick: 0.1 s on average, a second or so per case)
            futures.wait([fut], timeout=POLL_S)

    def _frozen(self, stalled: float, f: _Following, steps: int) -> ServerFrozen:
        if not f.sent:
            stage = "before it was sent (setting the KV layout)"
        elif steps:
            stage = f"in its decode, after {steps} step(s)"
        else:
            stage = "in its prefill (no decode step yet)"
        return ServerFrozen(
            f"server made no progress for {stalled:.1f} s during {f.what}, {stage} (request "
            f"{f.rids[0]}): it recorded no step and used under {CPU_PROGRESS_S:g} s of CPU "
            "time, its child processes and time waiting for a CPU included where this "
            f"machine's /proc shows them ({self.watch.describe()}); it is frozen (stopped, "
            "paused) or hung"
        )

    def _check_alive(self, when: str = "during the case") -> None:
        status = self.server.exit_status()
        if status is not None:
            raise ServerExited(f"the server {status} {when}")

    def _stopped(self, rid: str, deadline_s: float) -> ServerStopped:
        return ServerStopped(
            f"server stopped responding: no answer to request {rid} within {deadline_s:.0f} s "
            f"(its deadline: {DEADLINE_FACTOR:g}x what it should take at the pace measured "
            f"so far, {self.pace.fixed_s:.2f} s + {self.pace.step_s * 1e3:.1f} ms per step, "
            f"and at least {self.pace.floor_s:.0f} s)"
        )

    def _failure(
        self, e: ServerUnreachable | ServerHTTPError, rid: str, deadline_s: float
    ) -> MeasurementError:
        """What a failed HTTP call means: the server exited, stopped responding, or said no."""
        end = time.monotonic() + EXIT_GRACE_S
        while True:  # a dying server: its connection closes just before its exit
            status = self.server.exit_status()
            if status is not None:
                return ServerExited(f"the server {status} during the case ({e})")
            if self.server.process is None or time.monotonic() > end:
                break
            time.sleep(0.05)
        if isinstance(e, ServerUnreachable) and "timed out" in str(e):
            return self._stopped(rid, deadline_s)
        return MeasurementError(str(e))

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
            what="the case's first request (its warm-up)",
            steps=case.warmup_steps,
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
                counted=len(got.records), what=f"measured block {b + 1}",
                steps=DISCARD_PER_BLOCK + want,
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
                counted=case.steps, what="the telemetry decode",
            )  # fmt: skip
            self.sampler.add_windows((r.wall_ns, r.wall_ns + r.step_ns) for r in recs[1:])
        finally:
            summary = self.sampler.stop()
        return summary

    def _tokens_per_step(self) -> int:
        """The most tokens one decode step can produce (the draft block, or 1)."""
        srv = self.server
        if not srv.speculative:
            return 1
        return int(srv.server_info.get("speculative_num_draft_tokens") or 8)

    def run_steps(self, case: CaseSpec, min_steps: int, *, tries: int = 3) -> list[StepRecord]:
        """Unmeasured requests of ``case`` until at least ``min_steps`` decode steps ran
        (each request asks for enough tokens even if every drafted token is accepted);
        their records. ``MeasurementError`` when ``tries`` requests did not get there."""
        block = self._tokens_per_step()
        got: list[StepRecord] = []
        for n in range(tries):
            recs, _ = self._request(
                case, max_new_tokens=1 + (min_steps + 1) * block, seed=WARMUP_SEED + 1 + n,
                tag=f"{case.tag}-{n}", counted=len(got), what=f"unmeasured request {n + 1}",
            )  # fmt: skip
            got += recs
            if len(got) >= min_steps:
                return got
        raise MeasurementError(
            f"{tries} requests ran {len(got)} decode steps, fewer than the {min_steps} asked for"
        )

    def start(self, case: CaseSpec, *, note: str = "") -> None:
        """Warm up and measure the first round of ``case`` (``measured`` hands it back); the
        telemetry decode follows it (``_telemetry_decode``)."""
        t0 = time.monotonic()
        self._note, self._total = note, 0
        self._check_alive("before this case")
        srv = self.server
        accept = self._warm_up(case, self._tokens_per_step())
        control = srv.client.with_timeout(self.pace.deadline_s(1))  # bounded metric scrapes
        metrics_before = srv.backend.metrics_before(control)
        window_t0 = time.monotonic()
        self._got = self._measure_blocks(case, accept)
        _check_one_injection(self._got.records)
        cross = srv.backend.metrics_check(
            control, metrics_before, self._got.records, time.monotonic() - window_t0
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
                counted=done + len(extra.records), what=f"round {got.rounds + 1}, block {j + 1}",
                steps=DISCARD_PER_BLOCK + want,
            )  # fmt: skip
            kept = recs[DISCARD_PER_BLOCK : DISCARD_PER_BLOCK + want]
            if not kept:
                return False
            extra.add(first + j, kept, metas, self.server.backend)
        _check_one_injection(got.records + extra.records)
        got.records += extra.records
        got.blocks += extra.blocks
        got.frags += extra.frags
        got.reference.update(extra.reference)
        got.rounds += 1
        got.next_block = first + len(got.plan)
        return True

    def measured(self, case: CaseSpec) -> Measured:
        """What every round measured so far (``run.measure.decode_run`` makes it a run)."""
        got, w = self._got, self._window
        return Measured(
            case=case,
            records=tuple(got.records),
            blocks=tuple(got.blocks),
            fragmentation=sum(got.frags) / len(got.frags) if got.frags else None,
            wall_s=time.monotonic() - w.t0,
            reference=MappingProxyType(dict(got.reference)),
            telemetry=w.telemetry,
            cross_check=w.cross_check,
            server_pid=_pid(self.server.server_info.get("pid")),
            rounds=got.rounds,
            round_steps=got.round_steps,
        )

    def decode(self, case: CaseSpec) -> Measured:
        """Warm up and measure the first round of ``case``."""
        self.start(case)
        return self.measured(case)


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
