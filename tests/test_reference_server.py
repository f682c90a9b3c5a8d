"""The reference server process: every endpoint and every bad input, over real HTTP."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path

import pytest
from rawhttp import launch_reference, run_reference

from pytest_specperf.engines import get_backend
from pytest_specperf.probe import read_records
from pytest_specperf.server.client import ServerClient, ServerHTTPError


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("refsrv")
    proc, client = launch_reference(work, "--max-body-bytes", "65536")
    yield client, work / "run", proc
    proc.stop()


def _raw(client: ServerClient, method: str, path: str, body: bytes, headers=None):
    host, port = client.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def test_health_endpoints(server):
    client, _, _ = server
    assert client.get("/health") == {"status": "ok"}
    assert client.get("/health_generate") == {"status": "ok"}
    info = client.get("/get_model_info")
    assert info["is_generation"] is True and info["vocab_size"] == 4096


def test_server_info_has_config_device_fingerprint_counters(server):
    client, run_dir, _ = server
    info = client.server_info()
    assert info["config"]["name"] == "tiny"
    assert info["device"] == "cpu"
    fp = info["fingerprint"]
    assert fp["backend"] == "reference" and fp["speculative_algorithm"] == "DFLASH"
    assert fp["num_draft_tokens"] == 8 and fp["cuda_graphs"] is False
    assert "decode_steps" in info["counters"]
    assert info["run_dir"] == str(run_dir)
    assert "avg_spec_accept_length" in info["internal_states"][0]
    assert "max_decode_steps" in info["sampling_params"]  # what a decoder may ask of it


def test_generate_ends_on_max_decode_steps(server):
    """The limit a measured block sends: exactly that many decode steps and records."""
    client, run_dir, _ = server
    out = client.generate(
        {
            "context_len": 2048,
            "rid": "steps-1",
            "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, "max_decode_steps": 3},
        }
    )
    meta = out["meta_info"]
    assert meta["spec_verify_ct"] == 3 and meta["completion_tokens"] < 200
    assert len(read_records(run_dir, rids={"steps-1"})) == 3


def test_a_step_limit_is_sent_only_to_a_server_that_lists_it() -> None:
    """A server of an older build (an A/B reference side) would refuse the unknown
    parameter: the decoder then sends none, and the request ends on its tokens; SGLang
    has no such parameter at all."""
    ref = get_backend("reference")
    info = {"sampling_params": ["ignore_eos", "max_decode_steps", "max_new_tokens"]}
    assert ref.step_limit_fields(info, 5) == {"max_decode_steps": 5}
    assert ref.step_limit_fields({"sampling_params": ["max_new_tokens"]}, 5) == {}
    assert ref.step_limit_fields({}, 5) == {}
    assert get_backend("sglang").step_limit_fields(info, 5) == {}


def test_generate_input_ids(server):
    client, run_dir, _ = server
    out = client.generate(
        {
            "input_ids": [5, 6, 7, 8],
            "rid": "ids-1",
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        }
    )
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 12
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 12
    assert meta["spec_verify_ct"] >= 1 and meta["e2e_latency"] > 0
    assert meta["spec_accept_length"] == pytest.approx(11 / meta["spec_verify_ct"], abs=1e-3)
    recs = read_records(run_dir, rids={"ids-1"})
    assert len(recs) == meta["spec_verify_ct"]  # one record per decode step, on disk already


def test_generate_context_len_and_batch(server):
    client, _, _ = server
    out = client.generate(
        {
            "context_len": [2048, 3000],
            "rid": ["c1", "c2"],
            "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
        }
    )
    assert [o["meta_info"]["id"] for o in out] == ["c1", "c2"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [2048, 3000]
    assert all(o["meta_info"]["specperf"]["synthetic_prefill"] for o in out)
    batch = client.generate(
        {"input_ids": [[5, 6, 7], [9, 10]], "sampling_params": {"max_new_tokens": 4}}
    )
    assert len(batch) == 2 and all(len(b["output_ids"]) == 4 for b in batch)


def test_kv_layout_applies_to_next_request_and_is_measured(server):
    client, _, _ = server
    client.flush_cache()
    r = client.post("/specperf/kv_layout", {"layout": "fragmented", "level": 0.5, "seed": 3})
    assert r["layout"] == "fragmented" and r["level"] == 0.5
    out = client.generate({"context_len": 16000, "sampling_params": {"max_new_tokens": 4}})
    sp = out["meta_info"]["specperf"]
    assert sp["kv_layout"] == "fragmented"
    assert sp["kv_fragmentation"] == pytest.approx(0.5, abs=0.06)
    client.post("/specperf/kv_layout", {"layout": "contiguous"})
    out = client.generate({"context_len": 16000, "sampling_params": {"max_new_tokens": 4}})
    assert out["meta_info"]["specperf"]["kv_fragmentation"] == 0.0


def test_flush_cache(server):
    client, _, _ = server
    assert client.post("/flush_cache")["success"] is True


BAD_GENERATE = [
    (b'{"input_ids": [1, 2', 400, "malformed JSON"),
    (b"[1, 2, 3]", 400, "JSON object"),
    (b'{"input_ids": "hello"}', 400, "non-empty list"),
    (b'{"input_ids": []}', 400, "non-empty list"),
    (b'{"input_ids": [1, "2"]}', 400, "integers"),
    (b'{"input_ids": [1, true]}', 400, "integers"),
    (b'{"input_ids": [1, 99999]}', 400, "outside the vocabulary"),
    (b'{"input_ids": [-1]}', 400, "outside the vocabulary"),
    (b'{"context_len": 99999999}', 400, "context_len must be in"),
    (
        b'{"context_len": 130000, "sampling_params": {"max_new_tokens": 9000}}',
        400,
        "exceeds the configured maximum context",
    ),
    (b'{"context_len": "46000"}', 400, "must be an integer"),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}', 400, "max_new_tokens"),
    (
        b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 100000000}}',
        400,
        "max_new_tokens",
    ),
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2.5}}', 400, "integer"),
    (b'{"input_ids": [1], "sampling_params": {"temperature": 0.7}}', 400, "greedy"),
    (b'{"input_ids": [1], "sampling_params": {"ignore_eos": "yes"}}', 400, "ignore_eos"),
    (b'{"input_ids": [1], "sampling_params": {"top_p": 0.9}}', 400, "unsupported"),
    (b'{"input_ids": [1], "sampling_params": [1]}', 400, "must be an object"),
    (b'{"input_ids": [1], "bogus": 1}', 400, "unknown field"),
    (b'{"text": "hello"}', 400, "no tokenizer"),
    (b'{"input_ids": [1], "stream": true}', 400, "streaming"),
    (b'{"input_ids": [1], "context_len": 5}', 400, "exactly one"),
    (b'{"input_ids": [[1], [2]], "rid": ["a", "a"]}', 400, "distinct"),
    (b'{"input_ids": [[1], [2]], "rid": ["a"]}', 400, "batch of 2"),
    (b'{"context_len": [1,1,1,1,1,1,1,1,1]}', 400, "maximum batch size"),
    (b'{"input_ids": [1], "rid": 5}', 400, "rid"),
]


@pytest.mark.parametrize(
    ("body", "status", "fragment"), BAD_GENERATE, ids=[b[2] for b in BAD_GENERATE]
)
def test_bad_generate_gets_4xx_and_server_keeps_serving(server, body, status, fragment):
    client, _, _ = server
    code, payload = _raw(client, "POST", "/generate", body)
    assert code == status
    assert fragment in payload["error"]["message"]
    assert client.get("/health") == {"status": "ok"}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"layout": "swiss-cheese"}', "unknown KV layout"),
        (b'{"layout": "fragmented", "level": 1.5}', "level must be"),
        (b'{"layout": "fragmented", "level": "high"}', "level must be"),
        (b'{"layout": "fragmented", "seed": -4}', "seed must be"),
        (b'{"layout": "fragmented", "extra": 1}', "unknown field"),
        (b"nope", "malformed JSON"),
    ],
)
def test_bad_kv_layout(server, body, fragment):
    client, _, _ = server
    code, payload = _raw(client, "POST", "/specperf/kv_layout", body)
    assert code == 400 and fragment in payload["error"]["message"]


def test_body_over_limit_is_refused_unread(server):
    client, _, _ = server
    big = json.dumps({"input_ids": [1] * 40000}).encode()
    code, payload = _raw(client, "POST", "/generate", big)
    assert code == 413 and "exceeds the limit" in payload["error"]["message"]
    assert client.get("/health") == {"status": "ok"}


def test_unknown_route_and_missing_length(server):
    client, _, _ = server
    code, payload = _raw(client, "GET", "/nope", b"")
    assert code == 404 and "no route" in payload["error"]["message"]
    with pytest.raises(ServerHTTPError) as e:
        client.post("/specperf/unknown", {})
    assert e.value.status == 404


def test_sigterm_stops_the_server_and_keeps_records(tmp_path):
    run_dir = tmp_path / "run"
    proc, client = launch_reference(tmp_path)
    client.generate(
        {
            "input_ids": [4, 5, 6],
            "rid": "k",
            "sampling_params": {"max_new_tokens": 10, "ignore_eos": True},
        }
    )
    pid = proc.pid
    assert pid is not None
    assert proc.stop() == 0  # SIGTERM: graceful exit
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert read_records(run_dir, rids={"k"})  # readable after the server is gone
    assert stat_mode(run_dir) == 0o700


def stat_mode(path: Path) -> int:
    import stat

    return stat.S_IMODE(os.stat(path).st_mode)


def test_startup_errors_are_clear(tmp_path):
    out = run_reference("--config", "huge", timeout=60)
    assert out.returncode == 2 and "invalid choice: 'huge'" in out.stderr
    import torch

    if torch.cuda.is_available():
        return  # the CUDA error path needs a machine without CUDA
    out = run_reference("--device", "cuda:0", "--port", "0")
    assert out.returncode == 2 and "CUDA is not available" in out.stderr
