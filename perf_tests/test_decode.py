"""Long-context decode performance, phase by phase, against the device's baselines.

The same tests run on every backend: ``pytest perf_tests`` (embedded reference engine)
or ``pytest perf_tests --specperf-backend sglang --specperf-model ...``.
"""

from __future__ import annotations

import pytest

CONTEXTS = [8192, 32768, 46000, 131072]


@pytest.mark.parametrize("context_len", CONTEXTS, ids=lambda n: f"ctx={n}")
def test_decode(specperf, fragmented_kv, context_len):
    """Decode steps at a long context, contiguous and fragmented KV."""
    reason = specperf.capacity_reason(context_len)
    if reason:
        pytest.skip(reason)
    run = specperf.decode(context_len=context_len)
    assert run.steps >= specperf.steps
    assert run.step_ms.median > 0
    if run.fragmentation is not None:  # the layout asked for is the layout measured
        assert abs(run.fragmentation - fragmented_kv.level) < 0.1, run.fragmentation


@pytest.mark.gpu
@pytest.mark.parametrize("context_len", [32768], ids=lambda n: f"ctx={n}")
def test_cuda_graph_replay(specperf, warmed_cuda_graphs, context_len):
    """Every measured verify and draft forward replays a captured CUDA graph."""
    assert warmed_cuda_graphs.available, warmed_cuda_graphs.reason
    run = specperf.decode(context_len=context_len)
    assert run.graphs, "the server reported no graph counters"
    assert sum(g["replay"] for g in run.graphs.values()) > 0
    assert run.eager_forwards == 0, run.graphs


@pytest.mark.specperf(gate=["accept_len", "tokens_per_s", "step"])
@pytest.mark.parametrize("context_len", [8192, 46000], ids=lambda n: f"ctx={n}")
def test_acceptance_length(specperf, context_len):
    """Accepted tokens per step: a drop is a regression even when steps got no slower."""
    run = specperf.decode(context_len=context_len)
    if specperf.server.speculative:
        assert run.accept_len > 1.0, f"mean accepted tokens per step {run.accept_len:.2f}"
    else:
        assert run.accept_len == 1.0
