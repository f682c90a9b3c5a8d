"""The SGLang backend against real SGLang 0.5.23 servers on this CPU (marked ``live_sglang``).

Real SGLang serves tiny Llama models with dummy weights (``sglang_cpu/models.py``) on its CPU
engine, with the stand-in ``sgl_kernel`` (``sglang_cpu/stand_in``: plain torch standing in
for the CUDA/AMX kernels, each op checked in ``test_sglang_cpu_stand_in.py``). Everything
else is SGLang's own: scheduler, model runner, STANDALONE/EAGLE/EAGLE3 workers, the plugin
loader that runs our entry point in the scheduler, HookRegistry. Skipped, saying so, where
SGLang's CPU dependency set is not installed (.ci/run installs it).

Servers are shared between the tests (``sglang_cpu.live.Pool``, two at a time at most): each
configuration starts once, two start side by side, and the next ones start ahead of the test
that needs them (:func:`_plan`: never while a test whose timings are judged is still to come
before them); a server no later test needs is stopped at once. Contexts stay at or below 8k
(the stand-in attention is plain torch).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from e2e import SHORT_RUN
from sglang_cpu import live
from sglang_cpu.models import write_models

pytestmark = live.marks(timeout_s=600)

ROOT = Path(__file__).resolve().parent.parent
PROMPT = live.prompt(1000)
NEW_TOKENS = 24
#: Hooks each worker gets from the 0.5.23 map: the scheduler's iteration and host phases add 6 to
#: the 20 (STANDALONE) and 27 (EAGLE, EAGLE3) that SGLANG-CPU.md counted before them.
HOOKS = {"STANDALONE": 26, "EAGLE": 33, "EAGLE3": 33}
#: The perf_tests case the attach/launch runs measure: 8k tokens, contiguous and fragmented.
CASE = "test_decode.py::test_decode"
#: perf_tests' test_decode at 2048 tokens (contiguous and fragmented KV) for the attach-mode
#: runs: every case prefills four times (warm-up and three blocks), and an 8k prefill takes
#: the stand-in attention seconds. Launch mode runs the repository's own file at 8192.
SMALL_CASE = """
import pytest

@pytest.mark.parametrize("context_len", [2048], ids=lambda n: f"ctx={n}")
def test_decode(specperf, fragmented_kv, context_len):
    run = specperf.decode(context_len=context_len)
    assert run.steps >= specperf.steps
    if run.fragmentation is not None:
        assert abs(run.fragmentation - fragmented_kv.level) < 0.1, run.fragmentation
"""
PERF_RUN = (*SHORT_RUN, "--specperf-json=report.json", "-rA")

_greedy: dict[str, list[int]] = {}
F = TypeVar("F", bound=Callable[..., Any])


def uses(*servers: str | None, judged: bool = False) -> Callable[[F], F]:
    """The pool servers a test uses (None: plain decoding; a parametrized ``algorithm`` is
    added), and whether its timings are judged (no server starts beside it then)."""

    def mark(fn: F) -> F:
        fn.live_servers = servers  # type: ignore[attr-defined]
        fn.live_judged = judged  # type: ignore[attr-defined]
        return fn

    return mark


def _servers_of(item: pytest.Item) -> list[str | None]:
    fn = getattr(item, "function", None)
    out = [s for s in getattr(fn, "live_servers", ()) if s is not None or "ids" not in _greedy]
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "algorithm" in callspec.params:
        out.append(callspec.params["algorithm"])
    return out


def _plan(pool: live.Pool, later: Sequence[pytest.Item]) -> None:
    """Stop the servers no later test uses; start ahead the first ones later tests use (as
    many as the pool keeps), except those first needed after a test whose timings are
    judged: a server starting beside it would take its CPU."""
    order: list[str | None] = []
    blocked: set[str | None] = set()
    judged_before = False
    for item in later:
        for server in _servers_of(item):
            if server not in order:
                order.append(server)
                if judged_before:
                    blocked.add(server)
        judged_before = judged_before or getattr(
            getattr(item, "function", None), "live_judged", False
        )
    pool.stop(*[s for s in pool.names() if s not in order])
    pool.prestart(*[s for s in order[: pool.keep] if s not in blocked])


def _later(request: pytest.FixtureRequest, *, current: bool) -> list[pytest.Item]:
    """The selected tests of this module from the current one (``current``) or after it."""
    items = [i for i in request.session.items if getattr(i, "module", None) is request.module]
    if request.node not in items:
        return items
    return items[items.index(request.node) + (0 if current else 1) :]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Iterator[live.Pool]:
    p = live.Pool(tmp_path_factory.mktemp("servers"), models)
    try:
        yield p
    finally:
        p.close()
        for name, seconds in p.startups.items():
            print(f"live sglang {name}: ready in {seconds:.1f} s")


@pytest.fixture(autouse=True)
def _servers_ahead(request: pytest.FixtureRequest) -> Iterator[None]:
    """Around each test that uses the pool: before it, start its servers and the next ones
    (two side by side); after it, stop what no later test uses and start what comes next."""
    if "pool" not in request.fixturenames:
        yield
        return
    pool: live.Pool = request.getfixturevalue("pool")
    _plan(pool, _later(request, current=True))
    yield
    _plan(pool, _later(request, current=False))


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("baselines")


def _plain_greedy(pool: live.Pool) -> list[int]:
    if "ids" not in _greedy:
        out = pool.get(None).generate(PROMPT, NEW_TOKENS, rid="plain-1")
        _greedy["ids"] = list(out["output_ids"])
    return _greedy["ids"]


@uses(None)
def test_plain_decoding_on_real_sglang(pool: live.Pool) -> None:
    server = pool.get(None)
    ids = _plain_greedy(pool)
    assert len(ids) == NEW_TOKENS
    # the same request again: greedy decoding is deterministic on one server
    again = server.generate(PROMPT, NEW_TOKENS, rid="plain-2")
    assert again["output_ids"] == ids
    assert "spec_verify_ct" not in again["meta_info"] or not again["meta_info"]["spec_verify_ct"]


def _speculative_equals_plain_greedy_and_hooks_match_the_decode_log(
    pool: live.Pool, algorithm: str
) -> None:
    expected = _plain_greedy(pool)
    server = pool.get(algorithm)
    log_before = len(server.log())
    rid = f"{algorithm.lower()}-1"
    out = server.generate(PROMPT, NEW_TOKENS, rid=rid)
    assert out["output_ids"] == expected  # lossless: the target's greedy tokens
    meta = out["meta_info"]
    verify_ct = int(meta["spec_verify_ct"])
    assert 0 < verify_ct <= NEW_TOKENS - 1

    report = server.hooks_report()
    assert report["refused"] is None and report["speculative_algorithm"] == algorithm
    assert len(report["installed"]) == HOOKS[algorithm], report["installed"]
    assert report["missing"] == []
    assert report["signature_changed"] == []  # Scheduler.on_idle read through functools.wraps

    time.sleep(0.2)  # records are flushed before the output streams; the log may lag
    records = [r for r in server.records() if rid in r["rids"]]
    decode = [r for r in records if r["mode"] == "decode"]
    assert [r["mode"] for r in records][:1] == ["extend"]
    assert len(decode) == verify_ct  # one record per verify step of the request
    # the first token comes from the prefill, every decode step adds its accepted tokens;
    # the last step may accept more than the request still wanted (SGLang drops the rest)
    accepted = [r["accepted_tokens"] for r in decode]
    assert sum(accepted[:-1]) < NEW_TOKENS - 1 <= sum(accepted) <= NEW_TOKENS - 1 + 3
    for r in decode:
        assert r["labels"]["speculative_algorithm"] == algorithm
        assert r["host_ns"]["verify"] > 0 and r["host_ns"]["draft"] > 0
        assert r["kernels"] is None and r["device_ns"] is None  # CPU: no sampling, no CUDA
        assert r["batch_size"] == 1
    # SGLang's own decode log (--decode-log-interval=1): one line per decode batch, with the
    # batch's accept length; the same steps and the same accepted tokens as our records
    lines = live.decode_log(server.log()[log_before:])
    assert len(lines) == len(decode), (lines, [r["accepted_tokens"] for r in decode])
    assert [acc for _, acc in lines] == [float(r["accepted_tokens"]) for r in decode]
    assert all(running == 1 for running, _ in lines)
    if algorithm == "STANDALONE":  # the draft model agrees with the target here
        assert verify_ct < NEW_TOKENS - 1


@uses(None, "STANDALONE")
def test_standalone_output_equals_plain_greedy_and_hooks_match_the_decode_log(
    pool: live.Pool,
) -> None:
    _speculative_equals_plain_greedy_and_hooks_match_the_decode_log(pool, "STANDALONE")


def _perf(
    pytester: pytest.Pytester,
    *args: str,
    k: str = "2048",
    small: bool = True,
    timeout: float = 400,
) -> tuple[pytest.RunResult, dict[str, Any] | None]:
    """perf_tests/test_decode.py (the repository's own; ``small``: SMALL_CASE) run by an
    inner pytest."""
    if small:
        (pytester.path / "test_decode.py").write_text(SMALL_CASE)
    else:
        shutil.copy(ROOT / "perf_tests" / "test_decode.py", pytester.path / "test_decode.py")
    report = pytester.path / "report.json"
    report.unlink(missing_ok=True)
    result = pytester.runpytest_subprocess(CASE, *PERF_RUN, "-k", k, *args, timeout=timeout)
    data = json.loads(report.read_text()) if report.exists() else None
    return result, data


def _attach(server: live.LiveServer) -> tuple[str, ...]:
    return (
        "--specperf-backend=sglang",
        f"--specperf-attach={server.url},run-dir={server.run_dir}",
    )


@uses("STANDALONE")
def test_strict_mode_fails_an_unjudged_case(
    pytester: pytest.Pytester, pool: live.Pool, tmp_path: Path
) -> None:
    server = pool.get("STANDALONE")
    result, report = _perf(
        pytester,
        *_attach(server),
        f"--specperf-baselines={tmp_path}",
        "--specperf-strict",
        k="contiguous",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--specperf-strict: *was not judged*"])
    assert report is not None and report["cases"][0]["verdict"] == "NO_BASELINE"


@uses("STANDALONE", judged=True)
def test_perf_tests_attach_mode_records_then_judges(
    pytester: pytest.Pytester, pool: live.Pool, baselines: Path
) -> None:
    server = pool.get("STANDALONE")
    base = f"--specperf-baselines={baselines}"
    result, report = _perf(pytester, *_attach(server), base, "--specperf-update-baselines")
    result.assert_outcomes(passed=2)
    assert report is not None and len(report["cases"]) == 2
    for case in report["cases"]:
        assert case["recorded"] and case["steps"] >= 8
        assert case["phases"]["verify"]["median_ms"] > 0
        assert case["accept_len"]["mean"] > 1.0  # STANDALONE's draft agrees here
    (frag,) = [c for c in report["cases"] if c["kv_layout"] == "fragmented"]
    assert abs(frag["kv_fragmentation"] - frag["kv_level"]) < 0.1, frag["kv_fragmentation"]

    result, report = _perf(
        pytester,
        *_attach(server),
        base,
        "--specperf-tolerance=95%,step=95%",
    )
    # judged against the baseline a minute old on a shared box: the widest tolerances keep
    # this about the path (record, compare, verdict), the canary below about detection
    result.assert_outcomes(passed=2)
    assert report is not None
    for case in report["cases"]:
        assert case["baseline"] is not None
        assert case["verdict"] in ("SAME", "FASTER", "UNSTABLE"), case["verdict"]
    # SGLang's own health checks (/health_generate) get no fragmentation file
    assert server.client.health_generate(timeout=60.0)
    assert server.run_dir is not None
    assert not list(server.run_dir.glob("kvfrag-HEALTH_CHECK*")), sorted(
        p.name for p in server.run_dir.glob("kvfrag-*")
    )


@uses("STANDALONE", judged=True)
def test_canary_in_an_attached_server_fails_naming_the_phase(
    pytester: pytest.Pytester, pool: live.Pool, baselines: Path
) -> None:
    if not any(baselines.iterdir()):
        pytest.skip("needs the baselines the attach-mode test records")
    server = pool.get("STANDALONE")
    result, report = _perf(
        pytester,
        *_attach(server),
        f"--specperf-baselines={baselines}",
        "--specperf-inject=verify=4",
        k="contiguous",
    )
    assert report is not None
    # the case fails; where only the step it slowed was SLOWER (culprit "step", below), no
    # gate named verify: the canary was missed, a failed check of its own
    missed = report["canary"]["caught"] is False
    result.assert_outcomes(failed=2 if missed else 1)
    assert ("specperf::canary" in result.stdout.str()) == missed
    # the summary names verify as the phase that moved (the failure line names the first
    # failing gate, which may be the step it slowed)
    result.stdout.fnmatch_lines(
        ["*test_decode ctx=2048 kv=contiguous*verify/rest +*SLOWER [[]injected[]]*"]
    )
    (case,) = report["cases"]
    assert case["verdict"] == "SLOWER"
    # blamed on verify; on a loaded box verify's own change may stay within its noise and the
    # step it slowed is blamed (the summary above still names verify as the phase that moved)
    assert case["culprit"] in ("verify", "step"), case["culprit"]


@uses("STANDALONE", judged=True)
def test_a_a_in_one_run_on_one_attached_server_does_not_fail(pytester: pytest.Pytester,
                                                             pool: live.Pool) -> None:  # fmt: skip
    """A/B in one run, A/A: the shared STANDALONE server is both sides (B attached, A
    ``--specperf-ab url=`` of the same server), no canary, no baseline: nothing differs, so
    the case must not fail (``test_sglang_live_ab.py`` has the canary that must)."""
    server = pool.get("STANDALONE")
    where = f"{server.url},run-dir={server.run_dir}"
    result, report = _perf(pytester, *_attach(server), f"--specperf-ab=url={where}",
                           "--specperf-processes=1", "--specperf-tolerance=30%",
                           k="contiguous")  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*A/B in this run: B (this build) against A (url={where})*"])
    assert report is not None and report["comparison"] == {
        "mode": "ab",
        "reference": f"url={where}",
    }
    (case,) = report["cases"]
    assert case["ab"]["order"] == ["A1 B1 B1 A1"] and case["baseline"]["file"] is None
    assert case["verdict"] != "SLOWER", case["verdict"]


@uses(None)
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_speculative_output_equals_plain_greedy_and_hooks_match_the_decode_log(
    pool: live.Pool, algorithm: str
) -> None:
    _speculative_equals_plain_greedy_and_hooks_match_the_decode_log(pool, algorithm)


@uses()
def test_perf_tests_launch_mode_on_the_cpu(
    pytester: pytest.Pytester,
    pool: live.Pool,
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool.close()  # the launched server gets the cores (_plan stopped them all already)
    server_args = [
        f"--specperf-server-arg={a}"
        for a in (
            *live.CPU_FLAGS,
            "--speculative-algorithm=STANDALONE",
            *live.CHAIN,
            *live.SPEC_BACKEND,
        )
    ]
    env = live.server_env(None)
    for key in ("PYTHONPATH", "SGLANG_CACHE_DIR", *live.SERVER_ENV):  # the launcher passes
        monkeypatch.setenv(key, env[key])  # its environment on to the server
    result, report = _perf(
        pytester,
        "--specperf-backend=sglang",
        f"--specperf-model={models['target4']}",
        f"--specperf-draft-model={models['draft']}",
        *server_args,
        f"--specperf-baselines={tmp_path}",
        "--specperf-update-baselines",
        k="8192 and contiguous",
        small=False,
    )
    result.assert_outcomes(passed=1)
    assert report is not None
    (case,) = report["cases"]
    assert case["recorded"] and case["steps"] >= 8 and case["accept_len"]["mean"] > 1.0
    assert case["phases"]["verify"]["median_ms"] > 0
