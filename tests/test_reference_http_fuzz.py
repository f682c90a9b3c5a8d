"""HTTP fuzz corpus: bad requests, sent raw, against a real reference server on 127.0.0.1.

Each request gets the specific 4xx/5xx JSON error it deserves (or, where HTTP says so, a
closed connection), and the server answers /health after every one. The corpus
(http_fuzz_corpus.py) is fixed, not random, so a failure names its case and repeats.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import fault_table
import pytest
from http_fuzz_corpus import MAX_BODY, TIMEOUT_S, Case, corpus
from rawhttp import Exchange, address, exchange, launch_reference

from pytest_specperf.server.client import ServerClient

pytestmark = pytest.mark.faults

MIN_CASES = 120
#: The whole corpus must finish within this (it takes a few seconds).
BUDGET_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerClient]:
    work = tmp_path_factory.mktemp("fuzz")
    proc, client = launch_reference(
        work, "--max-body-bytes", str(MAX_BODY), "--http-timeout", str(TIMEOUT_S)
    )
    yield client
    assert proc.proc is not None and proc.proc.poll() is None, "the server died in the corpus"
    proc.stop()


def _check(case: Case, ex: Exchange) -> str | None:
    """What is wrong with the server's answer to ``case`` (None: as expected)."""
    if case.status is None:
        if ex.responses or not ex.closed:
            return f"expected a closed connection, got {[r.status for r in ex.responses]}"
        return None
    if len(ex.responses) != 1:
        return f"expected one response, got {[r.status for r in ex.responses]}"
    resp = ex.responses[0]
    if resp.status != case.status:
        return f"expected HTTP {case.status}, got {resp.status}: {resp.body[:200]!r}"
    if resp.headers.get("content-type") != "application/json":
        return f"content type {resp.headers.get('content-type')!r}"
    if resp.status == 405 and not resp.headers.get("allow"):
        return "405 without Allow"
    if case.head_only:
        return None
    err = json.loads(resp.body)["error"]
    if err["code"] != case.status or case.fragment not in err["message"]:
        return f"error {err!r} lacks {case.fragment!r}"
    return None


def _run(client: ServerClient, case: Case) -> tuple[Case, str | None]:
    ex = exchange(
        address(client),
        list(case.parts),
        pause_s=case.pause_s,
        half_close=case.half_close,
        wait_s=TIMEOUT_S + 5 if case.slow else 5,
        head_only=case.head_only,
    )
    problem = _check(case, ex)
    try:
        alive = client.get("/health", timeout=10) == {"status": "ok"}
    except Exception as e:  # reported with the case that caused it
        alive, problem = False, f"{problem or ''} /health failed after it: {e}"
    if not alive and problem is None:
        problem = "/health did not answer ok after it"
    return case, problem


def test_http_fuzz_corpus(server: ServerClient, capsys: pytest.CaptureFixture[str]) -> None:
    cases = corpus()
    assert len({c.parts for c in cases}) == len(cases), "duplicate requests in the corpus"
    assert len({(c.category, c.name) for c in cases}) == len(cases)
    assert len(cases) >= MIN_CASES
    t0 = time.monotonic()
    slow = [c for c in cases if c.slow]
    with ThreadPoolExecutor(max_workers=len(slow)) as pool:
        pending = [pool.submit(_run, server, c) for c in slow]
        results = [_run(server, c) for c in cases if not c.slow]  # meanwhile, the rest
        results += [f.result() for f in pending]
    elapsed = time.monotonic() - t0
    failures = [f"{c.category}/{c.name}: {p}" for c, p in results if p]
    outcomes = Counter("closed" if c.status is None else str(c.status) for c, _ in results)
    categories = Counter(c.category for c, _ in results)
    with capsys.disabled():
        print(
            f"\nHTTP fuzz corpus: {len(results)} requests in {len(categories)} categories, "
            f"{elapsed:.1f} s; outcomes {dict(sorted(outcomes.items()))}; "
            f"{len(results) - len(failures)} as expected, {len(failures)} not"
        )
    shown = ", ".join(f"{n} x {k}" if n > 1 else k for k, n in sorted(outcomes.items()))
    fault_table.row(
        "HTTP fuzz corpus against a reference server (loopback)",
        len(results),
        f"{len(categories)} categories in {elapsed:.1f} s: {shown}; "
        f"{len(results) - len(failures)} as expected, `/health` ok after each",
        not failures,
    )
    assert not failures, "\n".join(failures)
    assert elapsed < BUDGET_S
    info = server.server_info()
    assert info["http_counters"]["timeouts"] >= len(slow)
