"""EAGLE-3 on your own SGLang server at 32k tokens, gated phase by phase.
pytest examples/test_eagle3_own_server.py --specperf-attach http://127.0.0.1:30000"""

import pytest


@pytest.mark.specperf(gate=["step", "draft", "verify", "accept_len"])
@pytest.mark.parametrize("context_len", [32768], ids=lambda n: f"ctx={n}")
def test_eagle3_decode(specperf, fragmented_kv, context_len):
    fp = specperf.server.fingerprint
    if fp.get("backend") != "sglang":
        pytest.skip("needs SGLang: --specperf-attach URL or --specperf-backend sglang")
    assert str(fp.get("speculative_algorithm")).upper() == "EAGLE3", fp
    run = specperf.decode(context_len=context_len)
    assert run.accept_len > 1.0  # EAGLE-3 accepts more than one token per step
