"""A case that cannot be measured fails naming why: request deadlines (pure), a server
whose /server_info lacks what the capacity check needs, and the baseline size limit."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from pytest_specperf.engines.reference.backend import ReferenceBackend
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.server.decoder import (
    DEADLINE_FACTOR,
    DEADLINE_FLOOR_S,
    FIRST_DEADLINE_FLOOR_S,
    Pace,
)
from pytest_specperf.server.supervisor import describe_exit

pytestmark = pytest.mark.timeout(300)


def _steps(*ms: float) -> list[StepRecord]:
    return [StepRecord(i, 0, "decode", ["r"], 8, 1, 1, int(m * 1e6), {}, 0) for i, m in enumerate(ms)]


def test_first_request_gets_the_generous_floor_or_the_baselines_pace() -> None:
    assert Pace().deadline_s(65) == FIRST_DEADLINE_FLOOR_S
    slow_baseline = Pace(step_s=0.5)  # a 500 ms step recorded in the baseline
    assert slow_baseline.deadline_s(65) == pytest.approx(DEADLINE_FACTOR * 65 * 0.5)


def test_later_requests_are_paced_by_what_the_case_showed() -> None:
    # warm-up: 2.0 s for 10 steps of 50 ms -> 1.5 s of prefill
    pace = Pace().widened(_steps(*[50.0] * 10), wall_s=2.0)
    assert (pace.fixed_s, pace.step_s, pace.floor_s) == pytest.approx((1.5, 0.05, DEADLINE_FLOOR_S))
    assert pace.deadline_s(12) == pytest.approx(DEADLINE_FACTOR * (1.5 + 12 * 0.05))
    # a faster request never narrows it; a short case keeps the floor
    assert pace.widened(_steps(10.0, 10.0), wall_s=0.1) == pace
    assert Pace().widened(_steps(1.0), wall_s=0.01).deadline_s(4) == DEADLINE_FLOOR_S


def test_exit_status_in_words() -> None:
    assert describe_exit(None) is None
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(-signal.SIGSEGV) == "was killed by signal 11 (SIGSEGV)"


@pytest.mark.parametrize(("info", "field"), [
    ({}, "max_context_len (got nothing)"),
    ({"config": None, "kv_total_pages": 9}, "max_context_len (got nothing)"),
    ({"config": {"max_context_len": 4096}, "kv_total_pages": 9}, "page_size (got None)"),
    ({"config": {"max_context_len": 4096, "page_size": 16}}, "/server_info has no usable kv_total_pages"),
])  # fmt: skip
def test_capacity_check_names_a_missing_field(info, field) -> None:
    from pytest_specperf.engines import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="no usable") as e:
        ReferenceBackend().capacity_reason(info, 1024, 1)
    assert field in str(e.value)
    ok = {"config": {"max_context_len": 4096, "page_size": 16}, "kv_total_pages": 512}
    assert ReferenceBackend().capacity_reason(ok, 1024, 1) is None
    assert "exceeds" in (ReferenceBackend().capacity_reason(ok, 8192, 1) or "")


NO_CONFIG = """
import pytest

@pytest.fixture(scope="session")
def model_server(model_server):
    model_server.server_info.pop("config")  # a server that does not report its config
    return model_server
"""
SKIPPING_CASE = """
import pytest

def test_decode(specperf):
    reason = specperf.capacity_reason(8192)
    if reason:
        pytest.skip(reason)
"""


def test_a_server_without_config_fails_instead_of_skipping_every_case(pytester) -> None:
    pytester.makeconftest(NO_CONFIG)
    pytester.makepyfile(test_case=SKIPPING_CASE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=180)
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*specperf: the server's /server_info config has no usable "
                                 "max_context_len (got nothing)*"])  # fmt: skip


BASELINE_READER = """
from pytest_specperf.plugin.session import get_session

def test_read(request):
    get_session(request.config).baselines()
"""


def _big_baseline(pytester) -> None:
    path = pytester.path / "baselines" / "test-box.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({"schema_version": 2, "pad": "x" * 300_000}))


@pytest.mark.parametrize(("flag", "ini"), [(True, False), (False, True)])
def test_baseline_size_limit_option_and_ini(pytester, flag, ini) -> None:
    _big_baseline(pytester)
    pytester.makepyfile(test_read=BASELINE_READER)
    if ini:
        pytester.makeini("[pytest]\nspecperf_baseline_max_mb = 0.25\n")
    args = ["--specperf-device=test-box", "-p", "no:cacheprovider"]
    result = pytester.runpytest_inprocess(*args, *(["-o", "specperf_baseline_max_mb=0.25"] if flag else []))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test-box.yaml: is 0.3 MiB, over the 0.25 MiB limit for a baseline "
                                 "file*raise the limit with -o specperf_baseline_max_mb=<MiB>*"])  # fmt: skip
    result = pytester.runpytest_inprocess(*args, "-o", "specperf_baseline_max_mb=1")
    assert "over the" not in result.stdout.str()  # read under the raised limit


@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan", "inf", "70000"])
def test_bad_baseline_size_limits_are_usage_errors(pytester, value) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess("-o", f"specperf_baseline_max_mb={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*ini option specperf_baseline_max_mb: invalid value '{value}'; expected "
                                 "a size in MiB in (0, 65536], e.g. 32*"])  # fmt: skip


DECODE = """
def test_decode(specperf):
    specperf.decode(context_len=1024, steps=4, warmup=1)
"""


def test_an_update_over_the_limit_writes_nothing(pytester) -> None:
    pytester.makepyfile(test_case=DECODE)
    result = pytester.runpytest_subprocess(
        "--specperf-update-baselines", "-o", "specperf_baseline_max_mb=0.001",
        "--specperf-device=test-box", "-p", "no:cacheprovider", timeout=180,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*baselines not written: *test-box.yaml: the updated file would be "
                                 "*over the 0.000999* MiB limit; nothing was written*"])  # fmt: skip
    # the measurement passed; the write is the run's failed check, a test of its own
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["FAILED specperf::baselines - baselines not written: *"])
    assert not (pytester.path / "baselines" / "test-box.yaml").exists()


def test_ctrl_c_is_held_while_torch_imports() -> None:
    """A KeyboardInterrupt inside torch's import aborts the process or is lost: SIGINT
    waits until the import is done, then interrupts as usual."""
    import os
    import time

    from pytest_specperf.telemetry.loader import ctrl_c_deferred

    reached = False
    # Python's own handler, also where this process started with SIGINT ignored (a shell's
    # background job): otherwise no KeyboardInterrupt would ever come
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with ctrl_c_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # an interrupt would be raised here without the deferral
                reached = True
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert reached


def _inputs(bf):
    """Run inputs holding only a baseline file (the rest is not asked for)."""
    from pytest_specperf.run.inputs import RunInputs

    return RunInputs(None, Path("b.yaml"), bf, None, None, (), None)  # type: ignore[arg-type]


def test_the_first_deadline_comes_from_the_baselines_step_time(tmp_path, make_case, reference_fp):
    from pytest_specperf.judging.metrics import STEP
    from pytest_specperf.run.cases import baseline_step_ms
    from pytest_specperf.store.baselines import load_baselines, write_baselines

    case = make_case()  # perf_tests/t.py::test_d, ctx=8192 kv=contiguous bs=1
    path = tmp_path / "b.yaml"
    write_baselines(path, {"name": "box"}, [case])
    inputs = _inputs(load_baselines(path))
    test = "perf_tests/t.py::test_d"
    got = baseline_step_ms(inputs, reference_fp, test, "ctx=8192 kv=contiguous bs=1")
    assert got == pytest.approx(case.metrics[STEP].value) and got > 40  # synthetic ~48 ms
    assert baseline_step_ms(inputs, reference_fp, test, "ctx=1 kv=contiguous bs=1") is None
    assert baseline_step_ms(_inputs(None), reference_fp, test, "x") is None
