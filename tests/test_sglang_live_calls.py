"""Per-target hook-call counts on a real SGLang 0.5.23 server on this CPU (marked
``live_sglang``; issue 29, item 4): every required phase/iteration target the plugin
installs in a STANDALONE server times at least one call in a measured window, so
``--specperf-strict`` (which fails a case where one timed none) passes on a healthy
server. One STANDALONE server of its own (tiny models, the stand-in kernels of
``sglang_cpu``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sglang_cpu import live
from sglang_cpu.models import write_models

from pytest_specperf.engines.sglang.backend import SGLangBackend
from pytest_specperf.judging.strict import silent_targets

REASON = live.missing()
pytestmark = [
    pytest.mark.live_sglang,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    pytest.mark.timeout(600),
]

PROMPT = live.prompt(600, seed=11)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[live.LiveServer]:
    work = tmp_path_factory.mktemp("calls")
    models = write_models(work / "models")
    srv = live.start("calls", live.algorithm_args("STANDALONE", models), work)
    try:
        srv.generate(PROMPT[:200], 8, "calls-warm-up")  # first speculative request
        yield srv
    finally:
        srv.proc.stop()
        print(f"live sglang calls server: ready in {srv.started_s:.1f} s")


def _decode_steps(srv: live.LiveServer, rid: str, want: int) -> int:
    deadline = time.monotonic() + 10.0  # the records (and counts) follow within an iteration
    while True:
        n = sum(1 for r in srv.records() if r["mode"] == "decode" and rid in r["rids"])
        if n >= want or time.monotonic() > deadline:
            return n


def test_every_required_target_times_calls_in_a_measured_window(
    server: live.LiveServer,
) -> None:
    assert server.run_dir is not None
    b = SGLangBackend()
    b.bind(server.run_dir)
    required = b.required_targets()
    assert len(required) >= 10, required  # the iteration's and STANDALONE's phase targets
    before = b.metrics_before(server.client)
    out = server.generate(PROMPT, 24, "calls-window")
    steps = int(out["meta_info"]["spec_verify_ct"])
    assert _decode_steps(server, "calls-window", steps) == steps > 2
    b.metrics_check(server.client, before, [], 1.0)
    calls = b.target_calls({})
    assert calls is not None and set(calls) == set(required.items())
    for (target, phase), n in sorted(calls.items()):
        print(f"{n:6d}  {phase:<20} {target}")
    assert silent_targets(calls) == [], calls
    # each decode step runs each iteration phase at least once
    assert calls[("sglang.srt.managers.scheduler.Scheduler.ingest_requests", "ingest")] >= steps
