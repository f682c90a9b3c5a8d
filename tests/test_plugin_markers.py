"""Markers: registration, specperf(...) validation by name, long_context auto-marking, gpu."""

from __future__ import annotations

import pytest


def test_markers_are_registered_for_strict_markers(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.long_context
        @pytest.mark.gpu
        @pytest.mark.specperf(steps=8)
        def test_x(): pass
    """)
    result = pytester.runpytest("--strict-markers", "--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.specperf(*", "@pytest.mark.long_context*", "@pytest.mark.gpu*"]
    )
    assert pytester.runpytest("--strict-markers", "-p", "no:cacheprovider").ret in (0,)


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "specperf(tolerence=0.1)",
            "*unknown keyword(s) tolerence; valid: gate, tolerance, steps, warmup, context_len*",
        ),
        ("specperf(gate=['verfy'])", "*gate: unknown metric(s) 'verfy'; valid: step, accept_len*"),
        ("specperf(gate=[])", "*gate must be a non-empty list*"),
        (
            "specperf(tolerance='lots')",
            "*tolerance: invalid value 'lots': phase 'lots' is not a "
            "fraction in (0, 1); expected PHASE[[],step=STEP[]]*",
        ),
        ("specperf(tolerance=2)", "*tolerance: invalid value 2: phase '2' is not a fraction*"),
        ("specperf(tolerance=True)", "*tolerance: invalid value True: not text or a number*"),
        (
            "specperf(tolerance='5%,step=')",
            "*tolerance: invalid value '5%,step=': 'step' has no value*",
        ),
        (
            "specperf(step_tolerance='30%')",
            "*step_tolerance= was replaced by "
            "tolerance='PHASE[[],step=STEP[]]', e.g. tolerance='step=30%'*",
        ),
        ("specperf(steps=2)", "*steps must be an integer >= 4, got 2*"),
        ("specperf(steps=True)", "*steps must be an integer >= 4, got True*"),
        ("specperf(8)", "*takes keyword arguments only*"),
    ],
)
def test_bad_specperf_marker_is_rejected_by_name(pytester, marker, message):
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.{marker}
        def test_bad(): pass
    """)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "test_bad: @pytest.mark.specperf:" in result.stderr.str()


def test_valid_marker_is_accepted(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.specperf(gate=["verify", "step", "unaccounted", "util.sm"], tolerance="10%",
                              steps=8, warmup=0)
        def test_ok(request):
            from pytest_specperf.plugin.markers import parse_marker
            o = parse_marker(request.node)
            assert o.gate == ("verify", "step", "unaccounted", "util.sm")
            assert o.tolerance == 0.1 and o.step_tolerance is None
            assert o.steps == 8 and o.warmup == 0

        @pytest.mark.specperf(tolerance="10%,step=30%")
        def test_both(request):
            from pytest_specperf.plugin.markers import parse_marker
            o = parse_marker(request.node)
            assert (o.tolerance, o.step_tolerance) == (0.1, 0.3)

        @pytest.mark.specperf(tolerance="step=40%")
        def test_step_only(request):
            from pytest_specperf.plugin.markers import parse_marker
            o = parse_marker(request.node)
            assert (o.tolerance, o.step_tolerance) == (None, 0.4)

        @pytest.mark.specperf(tolerance=0.05)
        def test_number(request):
            from pytest_specperf.plugin.markers import parse_marker
            assert parse_marker(request.node).tolerance == 0.05
    """)
    pytester.runpytest().assert_outcomes(passed=4)


def test_long_context_is_applied_from_the_context_length(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.parametrize("context_len", [1024, 32767, 32768, 131072])
        def test_p(context_len): pass

        @pytest.mark.specperf(context_len=50000)
        def test_declared(): pass

        def test_plain(): pass
    """)
    result = pytester.runpytest("-m", "long_context", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        ["*test_p[[]32768[]] PASSED*", "*test_p[[]131072[]] PASSED*", "*test_declared PASSED*"]
    )
    pytester.makeini("[pytest]\nspecperf_long_context_min = 1000\n")
    pytester.runpytest("-m", "long_context").assert_outcomes(passed=5)


def test_gpu_marker_skips_with_a_reason_without_cuda(pytester):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    pytester.makepyfile("""
        import pytest
        @pytest.mark.gpu
        def test_needs_gpu(): pass
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU: torch.cuda.is_available() is False*"])


FAMILY_TESTS = """
import pytest

@pytest.mark.parametrize("context_len", [2048, 4096])
def test_decode(specperf, context_len): pass

@pytest.mark.gpu
def test_graphs(specperf): pass

def test_plain(): pass
"""


@pytest.mark.parametrize(("select", "judged"), [((), 2), (("-k", "2048"), 1), (("-k", "plain"), 1)])
def test_the_run_budget_is_shared_by_every_selected_specperf_test(
    pytester: pytest.Pytester, select: tuple[str, ...], judged: int
) -> None:
    """The false-alarm budget's divisor (``Family.tests``) counts the selected tests that
    use ``specperf``; a ``gpu`` one counts only where CUDA is usable (it is skipped
    elsewhere), a plain test never; at least 1."""
    from pytest_specperf.plugin.session import get_session
    from pytest_specperf.telemetry.cuda import cuda_unavailable_reason

    pytester.makepyfile(test_case=FAMILY_TESTS)
    rec = pytester.inline_run("--collect-only", "-p", "no:cacheprovider", *select)
    (call,) = rec.getcalls("pytest_collection_finish")
    gpu = 0 if cuda_unavailable_reason() or select else 1
    assert get_session(call.session.config).judged_tests == judged + gpu
