"""The same test against the embedded reference engine (CPU or GPU, no server to run).
pytest examples/test_embedded_engine.py"""

import pytest


@pytest.mark.specperf(gate=["step", "draft", "verify", "accept_len"])
@pytest.mark.parametrize("context_len", [32768], ids=lambda n: f"ctx={n}")
def test_reference_decode(specperf, fragmented_kv, context_len):
    reason = specperf.capacity_reason(context_len)  # a small GPU may not hold 32k
    if reason:
        pytest.skip(reason)
    run = specperf.decode(context_len=context_len)
    assert run.accept_len > 1.0  # the reference drafter accepts more than one token
