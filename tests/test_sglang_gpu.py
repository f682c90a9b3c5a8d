"""The real-server path of the sglang backend: needs a GPU and sglang (with its GPU
dependencies). Skipped everywhere else, CI included; it has not yet run on a GPU (written
without access to one), so treat a failure here as a finding about this test as much as
about the backend.

A tiny Llama target and draft with random weights (``tiny_model``), STANDALONE speculative
decoding (SGLang's EAGLE V2 worker), one request at 4096 tokens of context on a fragmented
KV cache: checks that the in-scheduler probe recorded every decode step with device times,
phases and graph counters, that the requested fragmentation was reached, and prints the
cross-check against SGLang's own metrics.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from pathlib import Path

import pytest

from pytest_specperf.engines.sglang import tiny_model
from pytest_specperf.engines.sglang.backend import SGLangBackend
from pytest_specperf.engines.sglang.metrics import cross_check, scrape
from pytest_specperf.probe.sink import make_run_dir, read_records
from pytest_specperf.server.client import ServerClient
from pytest_specperf.server.protocol import BackendSettings
from pytest_specperf.server.supervisor import ServerProcess, free_port


def _gpu_and_sglang() -> bool:
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("sgl_kernel") is None:
        return False  # `pip install --no-deps sglang` (CI) has no GPU stack
    import torch

    return bool(torch.cuda.is_available())


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_and_sglang(), reason="needs a GPU and sglang"),
]

SERVER_ARGS = (
    "--speculative-algorithm=STANDALONE", "--speculative-num-steps=3",
    "--speculative-eagle-topk=1", "--speculative-num-draft-tokens=4",
    "--load-format=dummy", "--speculative-draft-load-format=dummy", "--skip-tokenizer-init",
    "--disable-radix-cache", "--cuda-graph-max-bs-decode=4", "--mem-fraction-static=0.6",
)


def test_real_sglang_server_end_to_end(tmp_path: Path) -> None:
    target, draft = tiny_model.write(tmp_path / "models")
    backend = SGLangBackend()
    settings = BackendSettings(model=str(target), draft_model=str(draft),
                               server_args=SERVER_ARGS)
    backend.check(settings)
    run_dir = make_run_dir(tmp_path / "run")
    port = free_port()
    spec = backend.launch_spec(settings, port=port, run_dir=run_dir)
    env = {**os.environ, **spec.env, "SGLANG_SIMULATE_ACC_LEN": "3"}
    proc = ServerProcess(spec.cmd, log_path=tmp_path / "server.log", env=env, name=spec.name)
    proc.start()
    try:
        client = ServerClient(f"http://127.0.0.1:{port}")
        proc.wait_ready(client, deadline_s=spec.ready_deadline_s)
        fp = backend.fingerprint(client.server_info())
        assert fp["speculative_algorithm"] == "STANDALONE" and fp["cuda_graphs"]
        hooks = backend.describe_hooks(run_dir)
        print("\n".join(hooks))
        assert not [line for line in hooks if "MISSING" in line or "error" in line], hooks

        backend.set_kv_layout(client, run_dir, "fragmented", 1.0, seed=1)
        before = scrape(client)
        body = backend.prompt_fields(4096, 1, seed=1)
        body["sampling_params"] = {"max_new_tokens": 96, "temperature": 0, "ignore_eos": True}
        body["rid"] = "specperf-gpu-1"
        t0 = time.monotonic()
        resp = client.generate(body)
        wall = time.monotonic() - t0
        meta = resp["meta_info"]
        recs = read_records(run_dir, rids={"specperf-gpu-1"})
        assert len(recs) == meta["spec_verify_ct"], (len(recs), meta)
        assert sum(r.accepted_tokens for r in recs) >= meta["completion_tokens"] - 1
        assert all(r.device_ns is not None and r.device_step_ns for r in recs)
        for phase in ("schedule", "draft", "build_verify_input", "prepare_for_verify",
                      "verify", "accept", "kv_commit"):
            assert statistics.median(r.host_ns[phase] for r in recs) > 0, phase
        replays = sum(g.replay for r in recs for g in r.graphs.values())
        assert replays >= 2 * len(recs), [r.graphs for r in recs[:3]]
        frag = backend.kv_fragmentation(meta, run_dir)
        assert frag is not None and frag > 0.9, frag
        after = scrape(client)
        window = [r for r in read_records(run_dir) if r.wall_ns >= recs[0].wall_ns]
        print("cross-check:", cross_check(before, after, window, wall_s=wall) or "agrees")
    finally:
        proc.stop()
