"""Fixtures: ``model_server``, ``specperf``, ``fragmented_kv``, ``warmed_cuda_graphs``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.engines import BackendUnavailable, get_backend
from pytest_specperf.judging.samples import DecodeRun, KVLayout
from pytest_specperf.judging.significance import MAX_LOOKS
from pytest_specperf.plugin.markers import CaseOptions, parse_marker
from pytest_specperf.plugin.progress import CaseProgress
from pytest_specperf.plugin.session import SpecperfSession, get_session
from pytest_specperf.plugin.xdist import parallel_servers, worker_id
from pytest_specperf.server.client import ServerHTTPError, ServerUnreachable
from pytest_specperf.server.control import ControlError, release, take_control
from pytest_specperf.server.decoder import (
    CaseSpec,
    Decoder,
    MeasurementError,
    ServerExited,
    sampler_for,
)
from pytest_specperf.server.model_server import ModelServer, attach_server, start_server
from pytest_specperf.server.pool import ServerPool
from pytest_specperf.server.supervisor import ServerStartError

LAYOUT_PARAMS = ("contiguous", "fragmented")


def parse_layout(value: Any) -> KVLayout:
    """``"contiguous"``, ``"fragmented"`` or a level in [0, 1] -> ``KVLayout``."""
    if value == "contiguous":
        return KVLayout("contiguous", 0.0)
    if value == "fragmented":
        return KVLayout("fragmented", 1.0)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        return KVLayout("contiguous", 0.0) if value == 0 else KVLayout("fragmented", float(value))
    raise ValueError(
        f"fragmented_kv: invalid layout {value!r}; use 'contiguous', 'fragmented', or a "
        "fragmentation level between 0 and 1"
    )


@dataclass
class GraphsState:
    """What ``warmed_cuda_graphs`` reports."""

    available: bool
    reason: str
    captured: Any = None
    counters: dict[str, Any] = field(default_factory=dict)


class SpecperfHandle:
    """The measurement handle of one test (the ``specperf`` fixture)."""

    def __init__(
        self, session: SpecperfSession, item: pytest.Item, server: ModelServer, opts: CaseOptions
    ) -> None:
        self._session = session
        self._item = item
        self.server = server
        self.options = opts
        self.layout = KVLayout("contiguous", 0.0)
        self.expect_graphs = False
        self.runs: list[DecodeRun] = []
        #: the server process being measured (named when its measurement fails)
        self._active: ModelServer | None = None

    @property
    def steps(self) -> int:
        """Measured steps per case in this test (marker, option or default)."""
        return self.options.steps or self._session.settings.steps

    def capacity_reason(self, context_len: int, batch_size: int = 1) -> str | None:
        """Why ``context_len`` cannot run on this server (KV memory, model limit), or None.

        A server whose ``/server_info`` lacks what the check needs fails the test (naming
        the field) rather than giving a reason to skip: skipping every case would pass.
        """
        srv = self.server
        try:
            return srv.backend.capacity_reason(srv.server_info, context_len, batch_size)
        except BackendUnavailable as e:
            problem = str(e)
        pytest.fail(f"specperf: {problem}", pytrace=False)

    def _case(
        self, context_len: int, steps: int | None, batch_size: int, warmup: int | None
    ) -> CaseSpec:
        for name, v, lo in (
            ("context_len", context_len, 1),
            ("batch_size", batch_size, 1),
            ("steps", steps, 4),
            ("warmup", warmup, 0),
        ):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
                raise ValueError(f"specperf.decode: {name} must be an integer >= {lo}, got {v!r}")
        if warmup is None:
            warmup = self.options.warmup
        if warmup is None:
            warmup = self._session.settings.warmup_steps
        return CaseSpec(
            context_len=context_len,
            batch_size=batch_size,
            steps=steps or self.steps,
            warmup_steps=warmup,
            layout=self.layout,
            tag=f"{len(self.runs)}",
        )

    def decode(
        self,
        context_len: int,
        *,
        steps: int | None = None,
        batch_size: int = 1,
        warmup: int | None = None,
    ) -> DecodeRun:
        """Measure ``steps`` decode steps at ``context_len`` tokens of context.

        Returns the run with per-step records and summaries (in every server process of
        ``--specperf-processes``: the others are its ``siblings``). A case too noisy to
        decide measures more rounds of its blocks, up to ``--specperf-max-time``. The
        plugin judges every run against its baseline when the test ends; a regression
        fails the test.
        """
        case = self._case(context_len, steps, batch_size, warmup)
        sess = self._session
        prog = sess.progress.case(f"{self._item.name} ctx={context_len} kv={self.layout.label}")
        failure: str | None = None
        try:
            runs = self._measure(case, prog)
        except (MeasurementError, ServerHTTPError, ServerUnreachable, ServerStartError) as e:
            failure = measurement_failure(self._active or self.server, e)
        if failure is not None:  # raised here, not in the handler: no chained traceback
            prog.done("failed")
            pytest.fail(failure, pytrace=False)
        run = dataclasses.replace(runs[0], siblings=tuple(runs[1:]))
        prog.done(_done_text(run))
        self.runs.append(run)
        return run

    def _servers(self) -> tuple[ModelServer, ...]:
        pool = self._session.pool
        n = self._session.settings.processes
        return pool.servers(n) if pool is not None else (self.server,)

    def _measure(self, case: CaseSpec, prog: CaseProgress) -> list[DecodeRun]:
        """The first round of ``case`` in every server process, then more rounds while
        the judge says they would decide and the time budget allows."""
        sess = self._session
        self._active = None
        servers = self._servers()
        baseline_ms = self._baseline_ms(case)
        decoders: list[Decoder] = []
        try:
            for i, server in enumerate(servers):
                self._active = server
                sampler, note = sampler_for(sess.device(), server, self._pids())
                if note:
                    sess.telemetry_note = note
                decoders.append(
                    Decoder(server, prog.update, sampler=sampler, baseline_step_ms=baseline_ms)
                )
                label = f"process {i + 1}/{len(servers)}" if len(servers) > 1 else ""
                decoders[-1].start(case, note=label)
            self._extend(case, decoders, prog)
            return [d.run(case) for d in decoders]
        finally:
            for d in decoders:
                d.close()

    def _pids(self) -> tuple[int, ...]:
        pool = self._session.pool
        return pool.pids() if pool is not None else ()

    def _extend(self, case: CaseSpec, decoders: list[Decoder], prog: CaseProgress) -> None:
        """More rounds of every process's blocks while some gated metric is UNSTABLE only
        for want of steps, and the next round fits in ``--specperf-max-time``."""
        s = self._session.settings
        if s.max_time_s <= 0 or s.update_baselines:
            return
        from pytest_specperf.plugin.cases import undecided_metrics

        undecided = undecided_metrics(self._session, self._item, self)
        round_s = prog.elapsed()  # the first round in every process, warm-ups included
        while True:
            runs = [d.run(case) for d in decoders]
            metrics = undecided(dataclasses.replace(runs[0], siblings=tuple(runs[1:])))
            if not metrics:
                return
            if prog.elapsed() + round_s > s.max_time_s:
                return  # the budget is spent: the verdict says so
            if runs[0].rounds >= MAX_LOOKS:
                return  # the false-alarm budget was split over MAX_LOOKS looks
            t0 = time.monotonic()
            note = f"round {runs[0].rounds + 1} ({', '.join(metrics)} undecided)"
            for d in decoders:
                self._active = d.server
                if not d.more(case, note=note):
                    return
            round_s = time.monotonic() - t0

    def _baseline_ms(self, case: CaseSpec) -> float | None:
        # imported here: cases.py imports this module (the handle is what it judges)
        from pytest_specperf.plugin.cases import baseline_step_ms, case_key_of

        key = case_key_of(self._item, case.context_len, case.layout.label, case.batch_size)
        return baseline_step_ms(self._session, self._item, self.server.fingerprint, key)

    def profile(self, run: DecodeRun, trace: Path) -> list[Path]:
        """Re-run ``run``'s case briefly under the server's profiler; return the traces."""
        backend, client = self.server.backend, self.server.client
        trace.parent.mkdir(parents=True, exist_ok=True)
        decoder = Decoder(self.server, lambda done, total, note: None)
        case = CaseSpec(run.context_len, run.batch_size, PROFILE_STEPS, 0, run.kv_layout, "profile")
        try:
            backend.start_profile(client, trace)
            try:
                decoder.decode(case)
            finally:
                files = backend.stop_profile(client, trace)
        finally:
            decoder.close()
        return files


def _done_text(run: DecodeRun) -> str:
    text = f"{run.steps} steps, {run.step_ms.median:.2f} ms/step"
    if run.rounds > 1:
        text += f" ({run.rounds} rounds)"
    if run.siblings:
        text += f", {len(run.processes)} processes"
    return text


def measurement_failure(server: ModelServer, error: Exception) -> str:
    """The failure of a case whose measurement broke off: what happened (the server
    exited, stopped responding, or answered an error) and the server's log tail."""
    what = str(error)
    status = server.exit_status()
    if status is not None and not isinstance(error, ServerExited):
        what = f"the server {status} during the case ({what})"
    where = f" ({server.log_path})" if server.log_path is not None else ""
    return (
        f"specperf: measurement failed: {what}\n"
        f"server log{where}, last lines:\n{server.log_tail()}"
    )


#: Decode steps of the profiled re-run of a regressed case.
PROFILE_STEPS = 8

HANDLE_KEY = pytest.StashKey[SpecperfHandle]()


def _open_server(
    sess: SpecperfSession, work_dir: Callable[[], Path], parallel: int
) -> tuple[ModelServer, bool]:
    """Launch or attach to the session's server (``parallel``: servers side by side, one
    per pytest-xdist worker); whether the plugin holds its control file (attach mode with
    --specperf-inject, see ``server.control``)."""
    s = sess.settings
    backend = get_backend(s.backend)
    if not s.server_url:
        server = start_server(
            backend,
            s.backend_settings(parallel=parallel),
            work_dir=work_dir(),
            ready_timeout_s=s.ready_timeout_s,
            progress=sess.progress.line,
        )
        return server, False
    server = attach_server(backend, s.server_url, s.run_dir)
    try:
        if s.inject is not None:
            sess.progress.line(f"injecting {s.inject} into the attached server (control file)")
        return server, take_control(server, s.inject)
    except BaseException:
        server.stop()
        raise


@pytest.fixture(scope="session")
def model_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModelServer]:
    """The session's server for the chosen backend, started once and torn down at the end."""
    from pytest_specperf.plugin.cases import baseline_refusal

    sess = get_session(request.config)
    refusal = baseline_refusal(sess)  # read once, before any server starts
    if refusal is not None and worker_id(request.config) is not None:
        pytest.fail(refusal, pytrace=False)  # (the controller refuses first: see hooks)
    if refusal is not None:  # one message for the session, no case measured
        pytest.exit(refusal, returncode=pytest.ExitCode.USAGE_ERROR)
    problem = None
    try:
        server, controlled = _open_server(
            sess, lambda: tmp_path_factory.mktemp("specperf"), parallel_servers(request.config)
        )
    except (
        BackendUnavailable, ControlError, ServerStartError, ServerHTTPError, ServerUnreachable
    ) as e:  # fmt: skip
        problem = f"specperf: cannot start the {sess.settings.backend} server: {e}"
    if problem is not None:  # failed here, not in the handler: no chained traceback
        pytest.fail(problem, pytrace=False)
    sess.server = server
    sess.pool = ServerPool(server, lambda i: _start_more(sess, i, tmp_path_factory))
    try:
        yield server
    finally:
        try:
            if controlled:
                _release(sess, server)
        finally:
            sess.pool.stop()


def _start_more(
    sess: SpecperfSession, index: int, tmp_path_factory: pytest.TempPathFactory
) -> ModelServer:
    """Server process ``index`` of the session (``--specperf-processes``), fresh."""
    s = sess.settings
    sess.progress.line(f"starting server process {index} of {s.processes}")
    return start_server(
        get_backend(s.backend),
        s.backend_settings(),
        work_dir=tmp_path_factory.mktemp(f"specperf-p{index}"),
        ready_timeout_s=s.ready_timeout_s,
        progress=sess.progress.line,
    )


def _release(sess: SpecperfSession, server: ModelServer) -> None:
    try:
        release(server)
    except ControlError as e:
        sess.notes.append(f"the attached server's injection was removed but not confirmed: {e}")


@pytest.fixture
def specperf(request: pytest.FixtureRequest, model_server: ModelServer) -> SpecperfHandle:
    """Measurement handle: ``specperf.decode(context_len=..., steps=..., batch_size=...)``."""
    sess = get_session(request.config)
    handle = SpecperfHandle(sess, request.node, model_server, parse_marker(request.node))
    request.node.stash[HANDLE_KEY] = handle
    return handle


@pytest.fixture(params=LAYOUT_PARAMS, ids=lambda p: f"kv={p}")
def fragmented_kv(request: pytest.FixtureRequest, specperf: SpecperfHandle) -> KVLayout:
    """KV layout for this test's decodes: contiguous, fragmented, or a level in [0, 1].

    Parametrize it indirectly to choose: ``@pytest.mark.parametrize("fragmented_kv",
    [0.25, "fragmented"], indirect=True)``. The fragmentation actually reached is
    measured on the live request and reported with the run.
    """
    try:
        layout: KVLayout | None = parse_layout(request.param)
        problem = ""
    except ValueError as e:
        layout, problem = None, str(e)
    if layout is None:  # failed here, not in the handler: no chained traceback
        pytest.fail(problem, pytrace=False)
    specperf.layout = layout
    return layout


@pytest.fixture
def warmed_cuda_graphs(specperf: SpecperfHandle, model_server: ModelServer) -> GraphsState:
    """Graphs warmed and expected: a measured step that falls back to eager fails the test.

    On a CPU (or with graphs disabled) graphs are reported unavailable, not failed.
    """
    info = model_server.client.server_info()
    if not model_server.cuda_graphs:
        device = info.get("device", "unknown device")
        return GraphsState(
            False,
            f"CUDA graphs unavailable on {device}: forwards run eagerly",
            counters=info.get("graph_counters") or {},
        )
    specperf.decode(context_len=1024, steps=4, warmup=4)  # capture the common shapes
    specperf.runs.clear()
    specperf.expect_graphs = True
    info = model_server.client.server_info()
    return GraphsState(
        True,
        "captured",
        captured=info.get("cuda_graphs"),
        counters=info.get("graph_counters") or {},
    )
