"""Fixtures: ``model_server``, ``specperf``, ``fragmented_kv``, ``warmed_cuda_graphs``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_specperf.engines import BackendUnavailable
from pytest_specperf.judging.metrics import STEP
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.verdict import center_of_runs
from pytest_specperf.plugin.markers import CaseOptions, case_request, parse_marker
from pytest_specperf.plugin.progress import CaseProgress
from pytest_specperf.plugin.session import SpecperfSession, get_session
from pytest_specperf.plugin.xdist import parallel_servers, worker_id
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.run.cases import (
    CaseRefused,
    Reference,
    baseline_step_ms,
    undecided,
    undecided_ab,
)
from pytest_specperf.run.measure import (
    ABMeasurement,
    MeasurementFailed,
    Side,
    SideMeasurement,
    extension,
    measure_ab,
    measure_side,
    measurement_failure,
)
from pytest_specperf.run.servers import Servers, ServerSpec, open_servers, reference_spec
from pytest_specperf.server.client import ServerHTTPError, ServerUnreachable
from pytest_specperf.server.control import ControlError
from pytest_specperf.server.decoder import CaseSpec, Decoder
from pytest_specperf.server.model_server import ModelServer
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
        self.request = case_request(session.settings, item, opts, session.judged_tests)
        self.layout = KVLayout("contiguous", 0.0)
        self.expect_graphs = False
        self.runs: list[DecodeRun] = []
        #: ``--specperf-ab``: the reference side's run of each case (beside ``runs``)
        self.references: list[DecodeRun] = []
        #: ``--specperf-ab``: each case's order of processes, round by round
        self.orders: list[tuple[str, ...]] = []

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
            ab = sess.reference is not None
            measured = self._measure_ab(case, prog) if ab else self._measure(case, prog)
        except (MeasurementFailed, CaseRefused) as e:
            failure = str(e)
        except ServerStartError as e:  # a server process of --specperf-processes
            failure = measurement_failure(self.server, e)
        if failure is not None:  # raised here, not in the handler: no chained traceback
            prog.done("failed")
            pytest.fail(failure, pytrace=False)
        if measured.telemetry_note:
            sess.telemetry_note = measured.telemetry_note
        if isinstance(measured, ABMeasurement):
            prog.done(f"B: {_done_text(measured.b)}; A: {_done_text(measured.a)}")
            self.references.append(measured.a)
            self.orders.append(measured.order)
            self.runs.append(measured.b)
            return measured.b
        prog.done(_done_text(measured.run))
        self.runs.append(measured.run)
        return measured.run

    def _measure_ab(self, case: CaseSpec, prog: CaseProgress) -> ABMeasurement:
        """The case on both sides of an A/B run, alternating their server processes, with
        the automatic extension unless switched off."""
        sess, s = self._session, self._session.settings
        pool, ref_pool, reference = sess.pool, sess.reference_pool, sess.reference
        assert pool is not None and ref_pool is not None and reference is not None
        tested = Side(pool.servers(s.processes))
        # a running reference server is one process: it is measured again in turn
        ref = Side(ref_pool.servers(s.processes if s.ab is None or s.ab.launched else 1))
        inputs = sess.inputs()
        more = undecided_ab(inputs, self.request, self.server, reference, self.runs)
        return measure_ab(
            ref, tested, case, prog, device=inputs.device,
            pids=tuple(sorted({*pool.pids(), *ref_pool.pids()})),
            extension=(s.max_time_s, more) if s.max_time_s > 0 else None,
        )  # fmt: skip

    def _measure(self, case: CaseSpec, prog: CaseProgress) -> SideMeasurement:
        """The case on this session's side (every server process), with the automatic
        extension unless recording or switched off."""
        sess, s = self._session, self._session.settings
        pool = sess.pool
        side = Side(pool.servers(s.processes) if pool is not None else (self.server,))
        inputs, shown = sess.inputs(), sess.display_path(sess.baseline_path)
        key = self.request.key(case.context_len, case.layout.label, case.batch_size)
        more = undecided(inputs, self.request, self.server, self.runs, shown)
        return measure_side(
            side, case, prog, device=inputs.device,
            pids=pool.pids() if pool is not None else (),
            baseline_step_ms=baseline_step_ms(
                inputs, self.server.fingerprint, self.request.test, key
            ),
            extension=extension(s.max_time_s, recording=s.update_baselines, undecided=more),
        )  # fmt: skip

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
    """``32 steps, 29.65 ms/step``: the step as the summary shows it, the center over the
    server processes (``center_of_runs``), when there are several."""
    step = center_of_runs([p.summaries[STEP] for p in run.processes])
    text = f"{run.steps} steps, {step:.2f} ms/step"
    if run.rounds > 1:
        text += f" ({run.rounds} rounds)"
    if run.siblings:
        text += f", center of {len(run.processes)} processes"
    return text


#: Decode steps of the profiled re-run of a regressed case.
PROFILE_STEPS = 8

HANDLE_KEY = pytest.StashKey[SpecperfHandle]()


def server_spec(sess: SpecperfSession) -> ServerSpec:
    """The session's side: the chosen backend launched with the options' settings, or
    the server of ``--specperf-server-url``."""
    s = sess.settings
    return ServerSpec(
        backend=s.backend,
        settings=s.backend_settings(),
        ready_timeout_s=s.ready_timeout_s,
        url=s.server_url or None,
        run_dir=s.run_dir,
        inject=s.inject,
    )


@pytest.fixture(scope="session")
def model_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModelServer]:
    """The session's server for the chosen backend, started once and torn down at the end."""
    sess = get_session(request.config)
    refusal = sess.baseline_refusal()  # read once, before any server starts
    if refusal is not None and worker_id(request.config) is not None:
        pytest.fail(refusal, pytrace=False)  # (the controller refuses first: see hooks)
    if refusal is not None:  # one message for the session, no case measured
        pytest.exit(refusal, returncode=pytest.ExitCode.USAGE_ERROR)
    problem = None
    try:
        servers = open_servers(
            server_spec(sess),
            work_dir=tmp_path_factory.mktemp,
            parallel=parallel_servers(request.config),
            processes=sess.settings.processes,
            say=sess.progress.line,
        )
    except (
        BackendUnavailable, ControlError, ServerStartError, ServerHTTPError, ServerUnreachable
    ) as e:  # fmt: skip
        problem = f"specperf: cannot start the {sess.settings.backend} server: {e}"
    if problem is not None:  # failed here, not in the handler: no chained traceback
        pytest.fail(problem, pytrace=False)
    sess.server, sess.pool = servers.first, servers.pool
    try:
        reference = _open_reference(sess, request, tmp_path_factory) if sess.settings.ab else None
        try:
            yield servers.first
        finally:
            if reference is not None:
                reference.stop(sess.notes.append)
    finally:
        servers.stop(sess.notes.append)


def _open_reference(sess: SpecperfSession, request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Servers:  # fmt: skip
    """``--specperf-ab``: the reference side's servers (launched or attached), its first
    process started now; a reference that does not start fails the test naming it."""
    ab = sess.settings.ab
    assert ab is not None
    problem = None
    sess.progress.line(f"A/B: starting the reference side A ({ab})")
    try:
        servers = open_servers(
            reference_spec(server_spec(sess), ab),
            work_dir=lambda name: tmp_path_factory.mktemp(f"ab-ref-{name}"),
            parallel=parallel_servers(request.config),
            processes=sess.settings.processes,
            say=sess.progress.line,
        )
    except (
        BackendUnavailable, ControlError, ServerStartError, ServerHTTPError, ServerUnreachable
    ) as e:  # fmt: skip
        problem = (
            f"specperf: cannot start the A/B reference side (--specperf-ab {ab}) of the "
            f"{sess.settings.backend} backend: {e}"
        )
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    sess.reference_pool = servers.pool
    sess.reference = Reference(servers.first, str(ab))
    return servers


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
    specperf.references.clear()  # an A/B run's reference side warmed up too
    specperf.orders.clear()
    specperf.expect_graphs = True
    info = model_server.client.server_info()
    return GraphsState(
        True,
        "captured",
        captured=info.get("cuda_graphs"),
        counters=info.get("graph_counters") or {},
    )
