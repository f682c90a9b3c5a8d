"""Shared fixtures of the plugin's own test suite."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fault-table",
        metavar="PAGE",
        default=None,
        help="write the rows the fault tests measured into PAGE's fault table (docs/faults.md; "
        "see tests/fault_table.py)",
    )
    parser.addoption(
        "--full-faults",
        action="store_true",
        help="run every try of the server fault tests (tests/test_server_faults.py: "
        "SIGINT 5, killed 3, frozen mid-case 3, frozen in a first request 3, throttled 1); "
        "without it, one try of each",
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    page = session.config.getoption("--fault-table")
    if page is not None and not hasattr(session.config, "workerinput"):
        import fault_table

        if fault_table.ROWS:
            tests = Path(__file__).resolve().parent
            fault_table.write(Path(page), keep=fault_table.fault_tests(tests))


# pytester's in-process runs restore sys.modules afterwards, and torch cannot be imported
# twice in one process: import it once, up front, so that inline runs find it loaded.
# One CPU thread for the engines this process builds (the tiny engine's matrices are small):
# with torch's default of one OpenMP worker per core, a worker spins while a server or the
# other jobs of a shared machine hold the other core, and the in-process engine tests
# (tests/test_engine_*.py) took 3-10x the CPU (docs/development.md, "The suite's time").
# Servers set their own (``--threads``), as the plugin launches them.
with contextlib.suppress(ImportError):
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_engine_factory():
    """Build reference engines on the CPU, cached per (algorithm, block, simulate) key."""
    from pytest_specperf.engines.reference.config import get_config
    from pytest_specperf.engines.reference.engine import Engine

    cache = {}

    def make(algorithm="DFLASH", block=8, simulate=None, probe=None):
        key = (algorithm, block, simulate, id(probe))
        if key not in cache:
            cache[key] = Engine(
                get_config("tiny"),
                algorithm=algorithm,
                num_draft_tokens=block,
                simulate_accept_len=simulate,
                probe=probe,
            )
        return cache[key]

    return make


#: Host milliseconds per phase of the synthetic decode steps below (verify dominates).
SYNTHETIC_PHASE_MS = {
    "schedule": 0.02,
    "draft": 10.0,
    "build_verify_input": 0.05,
    "prepare_for_verify": 0.05,
    "verify": 38.0,
    "accept": 0.05,
    "kv_commit": 0.3,
}
REFERENCE_FP = {
    "backend": "reference",
    "engine": "specperf-reference",
    "engine_version": "0.1.0",
    "config": "tiny",
    "config_hash": "1a92d7839362",
    "speculative_algorithm": "DFLASH",
    "num_draft_tokens": 8,
    "simulate_accept_len": None,
    "dtype": "float32",
    "device_type": "cpu",
    "cuda_graphs": False,
    "torch_version": "2.13.0+cpu",
}


@pytest.fixture
def make_run():
    """Build a DecodeRun from synthetic step records through the real summarizing code:
    ``scale`` slows every phase, ``factors`` one phase (``{"verify": 1.2}``)."""
    from pytest_specperf.judging.samples import Window, build_run
    from pytest_specperf.probe.layout import KVLayout
    from pytest_specperf.probe.record import StepRecord

    def make(steps=16, scale=1.0, factors=None, seed=0):
        factors = factors or {}
        records = []
        for i in range(steps):
            jitter = 1 + 0.01 * ((i * 7 + seed) % 5)
            host = {
                p: int(ms * 1e6 * scale * jitter * factors.get(p, 1.0))
                for p, ms in SYNTHETIC_PHASE_MS.items()
            }
            unaccounted = int(30_000 * jitter)
            records.append(
                StepRecord(
                    step=i,
                    wall_ns=i,
                    mode="decode",
                    rids=["r"],
                    context_len=8192,
                    batch_size=1,
                    accepted_tokens=1 + (i + seed) % 4,
                    step_ns=sum(host.values()) + unaccounted,
                    host_ns=host,
                    unaccounted_ns=unaccounted,
                )
            )
        blocks = [i // 4 for i in range(steps)]
        return build_run(
            records,
            blocks,
            context_len=8192,
            batch_size=1,
            layout=KVLayout("contiguous", 1.0),
            window=Window(wall_s=1.0, reference={b: 6.5 * scale for b in set(blocks)}),
        )

    return make


@pytest.fixture
def make_case(make_run):
    """A just-measured CaseBaseline of a synthetic run (see ``make_run``)."""
    from pytest_specperf.judging.baselines import CaseBaseline
    from pytest_specperf.store.baselines import utc_now

    def make(
        test="perf_tests/t.py::test_d",
        key="ctx=8192 kv=contiguous bs=1",
        *,
        fingerprint=None,
        pid=None,
        at=None,
        sitting=None,
        **run_kw,
    ):
        run = make_run(**run_kw)
        return CaseBaseline.from_run(
            test=test,
            key=key,
            fingerprint=fingerprint or REFERENCE_FP,
            steps=run.steps,
            metrics=run.summaries,
            pid=pid,
            at=at or utc_now(),
            sitting=sitting,
        )

    return make


@pytest.fixture
def reference_fp():
    """A reference engine's fingerprint as the server reports it (a fresh copy)."""
    return dict(REFERENCE_FP)


@pytest.fixture(autouse=True, scope="session")
def _no_outer_xdist_environment() -> Iterator[None]:
    """Under ``pytest tests -n 2`` each worker has ``PYTEST_XDIST_WORKER`` & co. in its
    environment, and the suite's inner pytest runs (pytester subprocesses, module fixtures
    that run pytest) would inherit them: pytest-benchmark then turns itself off ("a
    parallelized environment") in a run that is not parallel. Every inner run sees the
    environment of a plain run; xdist itself reads its worker input, not these."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            mp.delenv(name, raising=False)
        yield
