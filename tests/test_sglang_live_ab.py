"""A/B in one run on real SGLang 0.5.23 on this CPU (marked ``live_sglang``): the same
build with other server arguments as the reference side, a canary on the tested side. (The
A/A run on one running server, which needs no server of its own, is in
``test_sglang_live.py``, on its shared STANDALONE server.)

The plugin launches both sides (``--specperf-backend sglang``): B with the test's server
arguments (``live.CPU_FLAGS``: ``--sleep-on-idle`` among them, which matters here: A/B
alternates its sides, so one side's server is always idle while the other is measured or
starts, and an idle SGLang scheduler otherwise polls its sockets in a busy loop), A with
``--specperf-ab args=...`` appended (a longer decode-log interval: a knob that leaves the
decode step alone, so the comparison is A/A but for the canary). One process a side (``A1
B1 B1 A1``), one small case gated on verify. The server helpers and the tiny dummy-weight
models are ``sglang_cpu``'s (see ``test_sglang_live.py``). Skipped, saying why, where
SGLang's CPU dependency set is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e import SHORT_RUN
from sglang_cpu import live
from sglang_cpu.models import write_models

pytestmark = live.marks(timeout_s=900)

CASE = """
import pytest

@pytest.mark.specperf(gate=["verify"])
def test_decode(specperf):
    run = specperf.decode(context_len=1024)
    assert run.rounds == 2 and run.injected == "verify=3"
"""
#: The reference side's extra server argument: SGLang's decode log every 40 batches
#: instead of every batch (live.CPU_FLAGS) - other arguments, the same decode step.
REFERENCE_ARGS = "--decode-log-interval=40"


def test_a_canary_on_the_tested_side_fails_against_the_same_build_with_other_arguments(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = write_models(tmp_path / "models")
    env = live.server_env(None)
    # the launcher passes its environment on to both sides' servers: the live servers' own
    # (one compute thread, torch.compile off: see live.SERVER_ENV)
    for key in ("PYTHONPATH", "SGLANG_CACHE_DIR", *live.SERVER_ENV):
        monkeypatch.setenv(key, env[key])
    server_args = [
        f"--specperf-server-arg={a}"
        for a in (
            *live.CPU_FLAGS,
            "--speculative-algorithm=STANDALONE",
            *live.CHAIN,
            *live.SPEC_BACKEND,
        )
    ]
    pytester.makepyfile(test_case=CASE)
    for attempt in (1, 2):
        result = pytester.runpytest_subprocess(
            "test_case.py", *SHORT_RUN, "--specperf-backend=sglang",
            f"--specperf-model={models['target4']}", f"--specperf-draft-model={models['draft']}",
            *server_args, "--specperf-processes=1", f"--specperf-ab=args={REFERENCE_ARGS}",
            "--specperf-inject=verify=3", "--specperf-tolerance=30%", "--specperf-json=r.json",
            timeout=800,
        )  # fmt: skip
        disturbed = "blocks scatter" in result.stdout.str()
        missed = "FAILED specperf::canary" in result.stdout.str()  # the run's check, not a test
        if attempt == 1 and disturbed and missed and result.parseoutcomes().get("failed") == 1:
            # a disturbed machine (one side's blocks scattering several times the other's:
            # a CI run saw A's at 4.4x with verify +155%) makes the case UNSTABLE, and the
            # run must say the canary went undetected; then, as the message asks, run again
            result.stdout.fnmatch_lines(["*UNSTABLE*blocks scatter*", "ERROR: canary not detected*"])
            continue
        break
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*verify / rest of step * -> * (+*%*[[]A/B in this run against A: "
        "args=--decode-log-interval=40[]] [[]injected: verify=3[]]*",
        "*A/B in this run: B (this build) against A (args=--decode-log-interval=40)*",
    ])  # fmt: skip
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["comparison"] == {"mode": "ab", "reference": f"args={REFERENCE_ARGS}"}
    [case] = report["cases"]
    assert case["ab"]["order"] == ["A1 B1 B1 A1"]
    [verify] = [m for m in case["metrics"] if m["metric"] == "verify"]
    assert verify["verdict"] == "SLOWER"
    # the canary slowed B's verify only: A's is the unslowed one (B's is three times B's own;
    # the bar leaves A's process its noise on two busy cores: canary in A reads below 1,
    # in both about 1)
    assert case["centers"]["now"]["verify"] > 1.5 * case["centers"]["base"]["verify"]
