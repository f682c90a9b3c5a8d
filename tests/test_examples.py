"""The README's example tests (``examples/``) really collect, and the embedded engine's
really runs: a README example that does not work is worse than none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from e2e import SHORT_RUN

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_the_examples_collect_from_the_repository_root() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "examples"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert sorted(ids) == [
        "examples/test_eagle3_own_server.py::test_eagle3_decode[kv=contiguous-ctx=32768]",
        "examples/test_eagle3_own_server.py::test_eagle3_decode[kv=fragmented-ctx=32768]",
        "examples/test_embedded_engine.py::test_reference_decode[kv=contiguous-ctx=32768]",
        "examples/test_embedded_engine.py::test_reference_decode[kv=fragmented-ctx=32768]",
    ], out.stdout


def test_the_embedded_example_runs_and_the_sglang_one_says_what_it_needs(
    pytester: pytest.Pytester,
) -> None:
    for name in ("test_embedded_engine.py", "test_eagle3_own_server.py"):
        pytester.makepyfile(**{name[:-3]: (EXAMPLES / name).read_text()})
    result = pytester.runpytest_subprocess(*SHORT_RUN, "-k", "contiguous", "-rs", timeout=500)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*test_reference_decode ctx=32768 kv=contiguous bs=1*NO_BASELINE*",
        "*needs SGLang: --specperf-attach URL or --specperf-backend sglang*",
    ])  # fmt: skip
