"""Unit tests of the sglang backend on the pytest side: checks and their error messages,
launcher arguments and environment, prompts, KV layouts through the run directory,
fingerprint and capacity. No SGLang import, no server: where the scheduler side is
needed, its real hook runs on test doubles in this process."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_specperf.engines import env as base
from pytest_specperf.engines import get_backend
from pytest_specperf.engines.sglang import backend as backend_mod
from pytest_specperf.engines.sglang import kv_fragment, launcher, source
from pytest_specperf.engines.sglang.backend import (
    DEFAULT_ID_RANGE,
    SGLangBackend,
    check_model,
    config_vocab_size,
    decode_cuda_graphs,
    prompt_id_range,
)
from pytest_specperf.engines.sglang.hooks import ProbeRuntime, make_hook
from pytest_specperf.engines.sglang.kv_fragment import KVLayoutError
from pytest_specperf.engines.sglang.phase_map import load_builtin
from pytest_specperf.server.client import ServerHTTPError
from pytest_specperf.server.protocol import BackendSettings, BackendUnavailable

FLAGS = frozenset({
    "--speculative-algorithm", "--speculative-num-draft-tokens", "--page-size",
    "--load-format", "--speculative-draft-load-format", "--enable-metrics", "--config",
    "--disable-radix-cache", "--model-path", "--model", "--host", "--port",
    "--speculative-draft-model-path", "--speculative-draft-model", "--tp-size",
})
SPEC = ("--speculative-algorithm=EAGLE3",)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                               "vocab_size": 128256}))
    return d


@pytest.fixture
def fake_sglang(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Pretend SGLang 0.5.23 is installed with the flags in FLAGS (no source needed)."""
    root = tmp_path / "site" / "sglang"
    (root / "srt").mkdir(parents=True)
    monkeypatch.setattr(source, "sglang_root", lambda: root)
    monkeypatch.setattr(source, "installed_version", lambda: "0.5.23")
    monkeypatch.setattr(launcher, "known_flags", lambda r: FLAGS)
    monkeypatch.delenv(base.ENV_PHASE_MAP, raising=False)
    # no source here to check the map against (tests/test_sglang_preflight.py does that)
    monkeypatch.setattr(SGLangBackend, "_check_map", lambda self, root, algorithm: None)
    return root


def settings(model: str | None, *args: str, **kw: Any) -> BackendSettings:
    return BackendSettings(model=model, server_args=tuple(args), **kw)


# -- check() -------------------------------------------------------------------------------------
def test_unit_get_backend_returns_the_sglang_backend() -> None:
    b = get_backend("sglang")
    assert isinstance(b, SGLangBackend) and b.name == "sglang"


def test_unit_check_without_sglang_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    monkeypatch.setattr(source, "sglang_root", lambda: None)
    with pytest.raises(BackendUnavailable) as exc:
        SGLangBackend().check(settings(str(model_dir), *SPEC))
    from pytest_specperf.install import install_hint

    # the line names this copy's own source (here the editable checkout), never an index
    assert f"install it with: {install_hint('sglang')}" in str(exc.value)
    assert "[sglang]" in install_hint("sglang")


def test_unit_check_passes_and_learns_the_vocabulary(fake_sglang: Path, model_dir: Path) -> None:
    b = SGLangBackend()
    b.check(settings(str(model_dir), *SPEC, "--page-size=16", "--tp-size", "2"))
    assert b._vocab_size == 128256
    b.check(settings("meta-llama/Llama-3.1-8B", "--config", "cfg.yaml"))  # HF id, no config


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: settings(None, *SPEC), "needs a model: --specperf-model"),
    (lambda d: settings(str(d / "nope"), *SPEC), "no such file or directory"),
    (lambda d: settings("./rel/model", *SPEC), "no such file or directory"),
    (lambda d: settings(str(d.parent), *SPEC), "has no config.json"),
    (lambda d: settings("not a repo id!", *SPEC), "neither an existing path nor a Hugging"),
    (lambda d: BackendSettings(model=str(d), draft_model="/no/draft", server_args=SPEC),
     "--specperf-draft-model '/no/draft': no such file"),
    (lambda d: settings(str(d), *SPEC, "--host=0.0.0.0"), "sets --host, which the plugin"),
    (lambda d: settings(str(d), *SPEC, "--port", "8000"), "sets --port, which the plugin"),
    (lambda d: settings(str(d), *SPEC, "--model-path=/x"), "with --specperf-model instead"),
    (lambda d: settings(str(d), *SPEC, "--speculative-draft-model=/x"),
     "with --specperf-draft-model instead"),
    (lambda d: settings(str(d), *SPEC, "--page-sise=16"),
     "has no flag --page-sise (flags must be spelled in full); did you mean --page-size"),
    (lambda d: settings(str(d), "--page-size=16"), "--speculative-algorithm=EAGLE3"),
])
def test_unit_check_errors(fake_sglang: Path, model_dir: Path, make: Any, message: str) -> None:
    with pytest.raises(BackendUnavailable) as exc:
        SGLangBackend().check(make(model_dir))
    assert message in str(exc.value)


def test_unit_check_without_our_entry_point(
    fake_sglang: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend_mod._entry_point_installed()  # this checkout is pip-installed
    monkeypatch.setattr(backend_mod, "_entry_point_installed", lambda: False)
    with pytest.raises(BackendUnavailable, match=r"entry point sglang\.srt\.plugins:specperf"):
        SGLangBackend().check(settings(str(model_dir), *SPEC))


def test_unit_check_validates_the_users_phase_map(
    fake_sglang: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "fork.yaml"
    bad.write_text("schema: 1\nentries:\n - {target: a.b, role: phase, phase: drafting}\n")
    monkeypatch.setenv(base.ENV_PHASE_MAP, str(bad))
    with pytest.raises(BackendUnavailable) as exc:
        SGLangBackend().check(settings(str(model_dir), *SPEC))
    assert str(bad) in str(exc.value) and "entry 0 (a.b)" in str(exc.value)


def test_unit_check_model_paths(tmp_path: Path) -> None:
    check_model("Qwen/Qwen3-8B", "--m")
    check_model("gpt2", "--m")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    check_model(str(gguf), "--m")  # a file: SGLang decides
    with pytest.raises(BackendUnavailable, match="no such file"):
        check_model("~/definitely/not/here", "--m")


def test_unit_config_vocab_size_from_dir_and_hf_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mm = tmp_path / "vlm"
    mm.mkdir()
    (mm / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 151936}}))
    assert config_vocab_size(str(mm)) == 151936
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert config_vocab_size("org/tiny") == 32000
    assert config_vocab_size("org/absent") is None
    (mm / "config.json").write_text("{broken")
    assert config_vocab_size(str(mm)) is None


# -- launcher ------------------------------------------------------------------------------------
def test_unit_launch_spec_command_and_environment(
    fake_sglang: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    b = SGLangBackend()
    s = BackendSettings(model=str(model_dir), draft_model="org/draft",
                        server_args=("--speculative-algorithm=EAGLE3", "--page-size 16",
                                     "--enable-metrics"))
    spec = b.launch_spec(s, port=31234, run_dir=tmp_path / "run")
    assert spec.cmd[1:] == [
        "-m", "sglang.launch_server", "--model-path", str(model_dir.resolve()),
        "--speculative-draft-model-path", "org/draft", "--host", "127.0.0.1",
        "--port", "31234", "--speculative-algorithm=EAGLE3", "--page-size", "16",
        "--enable-metrics",
    ]
    assert spec.env == {"SPECPERF_SGLANG_PLUGIN": "1",
                        "SPECPERF_RUN_DIR": str(tmp_path / "run"),
                        "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
    assert spec.ready_deadline_s >= 600 and spec.name == "sglang server"
    cmd = b.launch_spec(settings(str(model_dir), *SPEC), port=1, run_dir=tmp_path).cmd
    assert cmd.count("--enable-metrics") == 1
    injected = b.launch_spec(settings(str(model_dir), *SPEC, inject="verify=1.1"), port=1,
                             run_dir=tmp_path)
    assert injected.env["SPECPERF_INJECT"] == "verify=1.1"  # read by the scheduler's probe


@pytest.mark.parametrize(("whitelist", "expected"), [
    ("", None),
    ("xpu_hooks", "xpu_hooks,specperf"),
    ("a, b ,", "a,b,specperf"),
    ("specperf,a", None),
])
def test_unit_plugin_whitelist(tmp_path: Path, whitelist: str, expected: str | None) -> None:
    env = launcher.build_env(tmp_path, {"SGLANG_PLUGINS": whitelist})
    assert env.get("SGLANG_PLUGINS") == expected


def test_unit_split_server_args() -> None:
    assert launcher.split_server_args(["--a=1", "--b 2", "--c", "x y", "--d=e f"]) == [
        "--a=1", "--b", "2", "--c", "x y", "--d=e f"]


def test_unit_value_tokens_are_not_flags() -> None:
    launcher.check_server_args(["--page-size", "16", "-1", "--"], FLAGS, "0.5.23")
    launcher.check_server_args(["--anything"], None, None)  # flag set unknown: SGLang decides


def _synthetic_sglang(root: Path, n_fields: int) -> Path:
    fields = root / "srt" / "arg_groups" / "fields"
    fields.mkdir(parents=True)
    body = "\n".join(f"    f{i}: A[int, 'help {i}'] = 0" for i in range(n_fields))
    (fields / "spec.py").write_text(f"""
import argparse
from sglang.srt.arg_groups.arg_utils import A, Arg
class Spec:
    speculative_algorithm: A[str, "algo"] = None
    speculative_draft_model_path: A[str, Arg(help="d", aliases=["--speculative-draft-model"])]
    tp_size: A[int, Arg(cli_name="--tensor-parallel-size", aliases=["--tp-size"])] = 1
    hidden: A[int, Arg(no_cli=True)] = 0
    enable_x: A[bool, Arg(action=argparse.BooleanOptionalAction)] = False
    plain: int = 0
{body}
""")
    (root / "srt" / "server_args.py").write_text(
        "def add(parser):\n    parser.add_argument('--config', type=str)\n"
        "    parser.add_argument('--disable-cuda-graph', action='store_true')\n")
    return root


def test_unit_known_flags_from_source(tmp_path: Path) -> None:
    flags = launcher.known_flags(_synthetic_sglang(tmp_path / "sglang", 120))
    assert flags is not None
    assert {"--speculative-algorithm", "--speculative-draft-model-path",
            "--speculative-draft-model", "--tensor-parallel-size", "--tp-size", "--enable-x",
            "--no-enable-x", "--config", "--disable-cuda-graph", "--f119"} <= flags
    assert "--hidden" not in flags and "--plain" not in flags and "--tp-size-x" not in flags


def test_unit_known_flags_gives_up_on_unknown_layouts(tmp_path: Path) -> None:
    assert launcher.known_flags(None) is None
    assert launcher.known_flags(_synthetic_sglang(tmp_path / "few" / "sglang", 3)) is None
    assert launcher.known_flags(tmp_path / "empty") is None
    broken = _synthetic_sglang(tmp_path / "broken" / "sglang", 120)
    (broken / "srt" / "server_args.py").write_text("def (:")
    assert launcher.known_flags(broken) is None


# -- prompts -------------------------------------------------------------------------------------
def test_unit_prompt_fields(fake_sglang: Path, model_dir: Path) -> None:
    b = SGLangBackend()
    one = b.prompt_fields(500, 1, seed=3)
    assert list(one) == ["input_ids"] and len(one["input_ids"]) == 500
    assert min(one["input_ids"]) >= DEFAULT_ID_RANGE[0]
    assert max(one["input_ids"]) < DEFAULT_ID_RANGE[1]
    assert b.prompt_fields(500, 1, seed=3) == one  # seeded
    assert b.prompt_fields(500, 1, seed=4) != one
    batch = b.prompt_fields(64, 3, seed=3)["input_ids"]
    assert len(batch) == 3 and all(len(r) == 64 for r in batch)
    assert batch[0] == one["input_ids"][:64] or batch[0] != batch[1]
    b.check(settings(str(model_dir), *SPEC))
    ids = b.prompt_fields(20000, 1, seed=0)["input_ids"]
    assert min(ids) >= 1000 and max(ids) < 128256 - 4008
    with pytest.raises(ValueError, match="context_len"):
        b.prompt_fields(0, 1, 0)
    with pytest.raises(ValueError, match="batch_size"):
        b.prompt_fields(5, 0, 0)


def test_unit_prompt_id_range() -> None:
    assert prompt_id_range(None) == DEFAULT_ID_RANGE
    assert prompt_id_range(32000) == (1000, 31000)
    assert prompt_id_range(151936) == (1000, 147188)
    lo, hi = prompt_id_range(100)
    assert 0 < lo < hi < 100
    with pytest.raises(BackendUnavailable):
        prompt_id_range(8)
    rng = random.Random(0)
    assert all(lo <= x < hi for x in rng.choices(range(lo, hi), k=100))


# -- KV layout, end to end through the run directory ---------------------------------------------
class FakeScheduler:
    def __init__(self, allocator: Any) -> None:
        self.token_to_kv_pool_allocator = allocator

    def flush_cache(self, empty_cache: bool = True) -> bool:
        self.token_to_kv_pool_allocator.clear()
        return True


class FakeTokenAllocatorBase:
    page_size = 1

    def __init__(self, size: int) -> None:
        self.size = size
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.size + 1)
        self.release_pages = torch.empty((0,), dtype=torch.int64)


#: the double under SGLang's class name (kv_fragment recognises allocators by name)
FakeTokenAllocator = type("TokenToKVPoolAllocator", (FakeTokenAllocatorBase,), {})


class FakeServerClient:
    """POST /flush_cache runs the scheduler's flush hook in-process (as the server would)."""

    def __init__(self, scheduler: FakeScheduler | None, rt: ProbeRuntime | None,
                 busy: bool = False) -> None:
        self.scheduler = scheduler
        self.rt = rt
        self.busy = busy
        self.flushes = 0
        entry = load_builtin().by_target()["sglang.srt.managers.scheduler.Scheduler.flush_cache"]
        self.hook = make_hook(entry, rt) if rt is not None else None

    def flush_cache(self) -> None:
        self.flushes += 1
        if self.busy:
            raise ServerHTTPError("POST", "/flush_cache", 400,
                                  "Cache not flushed because there are pending requests.\n")
        if self.scheduler is not None and self.hook is not None:
            self.hook(FakeScheduler.flush_cache, self.scheduler)


def test_unit_set_kv_layout_applies_in_the_scheduler(tmp_path: Path) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False)
    sched = FakeScheduler(FakeTokenAllocator(1000))
    client = FakeServerClient(sched, rt)
    b = SGLangBackend()
    b.bind(tmp_path)
    b.set_kv_layout(client, "fragmented", 1.0, seed=5)  # type: ignore[arg-type]
    order = torch.tensor(kv_fragment.fragment_order(1000, 1.0, 5)) + 1
    assert torch.equal(sched.token_to_kv_pool_allocator.free_pages, order)
    b.set_kv_layout(client, "contiguous", 0.9, seed=5)  # type: ignore[arg-type]
    assert torch.equal(sched.token_to_kv_pool_allocator.free_pages, torch.arange(1, 1001))
    assert client.flushes == 2


def test_unit_set_kv_layout_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = ProbeRuntime(tmp_path, use_cuda=False)
    swa = type("SWATokenToKVPoolAllocator", (FakeTokenAllocatorBase,), {})(64)
    b = SGLangBackend()
    b.bind(tmp_path)
    with pytest.raises(KVLayoutError, match=r"refused KV layout 'fragmented'.*sliding-window"):
        b.set_kv_layout(FakeServerClient(FakeScheduler(swa), rt),  # type: ignore[arg-type]
                        "fragmented", 0.5, 0)
    b.flush_wait_s = 0.3  # the refusals' retry window (10 s by default), shortened
    with pytest.raises(KVLayoutError, match=r"refused \(.*\) for 0.3 s: .*must be idle"):
        b.set_kv_layout(FakeServerClient(None, None, busy=True),  # type: ignore[arg-type]
                        "fragmented", 0.5, 0)
    monkeypatch.setattr(kv_fragment, "wait_layout_results",
                        lambda rd, rid, timeout_s: kv_fragment.read_layout_results(rd, rid))
    with pytest.raises(KVLayoutError, match="SPECPERF_SGLANG_PLUGIN=1"):
        b.set_kv_layout(FakeServerClient(None, None),  # type: ignore[arg-type]
                        "fragmented", 0.5, 0)
    with pytest.raises(KVLayoutError, match="unknown KV layout"):
        b.set_kv_layout(FakeServerClient(None, None),  # type: ignore[arg-type]
                        "diagonal", 0.5, 0)
    monkeypatch.setenv(base.ENV_RUN_DIR, str(tmp_path))  # never a source of truth
    with pytest.raises(BackendUnavailable, match="not bound to a run directory"):
        SGLangBackend().set_kv_layout(FakeServerClient(None, None),  # type: ignore[arg-type]
                                      "fragmented", 0.5, 0)


def test_unit_kv_fragmentation_reads_the_schedulers_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = SGLangBackend()
    b.bind(tmp_path)
    assert b.kv_fragmentation({"id": "r1"}) is None  # nothing measured: no wait
    (tmp_path / "kvfrag-r1-rank1.json").write_text(json.dumps({"rid": "r1",
                                                                "fragmentation": 0.4}))
    (tmp_path / "kvfrag-r1-rank0.json").write_text(json.dumps({"rid": "r1",
                                                                "fragmentation": 0.5}))
    assert b.kv_fragmentation({"id": "r1"}) == 0.5
    assert b.kv_fragmentation({}) is None


# -- after launch ----------------------------------------------------------------------------------
INFO = {
    "model_path": "/models/llama", "speculative_draft_model_path": "/models/eagle3",
    "version": "0.5.23", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
    "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "page_size": 1,
    "tp_size": 1, "load_format": "dummy", "context_length": 65536,
    "max_req_input_len": 65000, "max_total_num_tokens": 200000,
}


def test_unit_fingerprint() -> None:
    fp = SGLangBackend().fingerprint(dict(INFO))
    assert fp["backend"] == "sglang" and fp["version"] == "0.5.23"
    assert fp["model"] == "/models/llama" and fp["draft_model"] == "/models/eagle3"
    assert fp["speculative_algorithm"] == "EAGLE3" and fp["speculative_num_draft_tokens"] == 4
    assert fp["phase_map"] == "phase_map_0_5_23.yaml" and fp["cuda_graphs"] is True
    assert "kv_cache_dtype" in fp  # absent keys are recorded as None, never dropped
    with pytest.raises(BackendUnavailable, match="not an SGLang server"):
        SGLangBackend().fingerprint({"fingerprint": {}})


def test_unit_decode_cuda_graphs() -> None:
    assert decode_cuda_graphs({}) is True
    assert decode_cuda_graphs({"disable_cuda_graph": True}) is False
    assert decode_cuda_graphs({"cuda_graph_backend_decode": "disabled"}) is False
    assert decode_cuda_graphs({"cuda_graph_config": {"decode": {"backend": "disabled"}}}) is False
    assert decode_cuda_graphs({"cuda_graph_config": {"decode": {"backend": "full"}}}) is True


def test_unit_capacity_reason() -> None:
    b = SGLangBackend()
    assert b.capacity_reason(INFO, 46000, 1) is None
    assert "context length of 65536" in (b.capacity_reason(INFO, 65200, 1) or "")
    assert "max_req_input_len" in (b.capacity_reason({**INFO, "context_length": None},
                                                     65200, 1) or "")
    assert "KV pool of 200000" in (b.capacity_reason(INFO, 46000, 5) or "")
    assert b.capacity_reason({"model_path": "m"}, 10**6, 64) is None  # limits unknown


def test_unit_hook_reports(tmp_path: Path) -> None:
    b = SGLangBackend()
    b.bind(tmp_path)
    assert "did not load" in b.describe_hooks()[0]
    (tmp_path / "hooks-pid1-rank0.json").write_text(json.dumps({
        "sglang_version": "0.5.23", "phase_map": ["phase_map_0_5_23.yaml"],
        "installed": [{"target": "x"}] * 3,
        "missing": [{"target": "a.B.c", "role": "phase", "phase": "draft", "optional": False,
                     "reason": "AttributeError: no c"},
                    {"target": "f.G.h", "role": "step", "optional": True, "reason": "no f"}],
        "signature_changed": [{"target": "s.T.u", "expected": ["self"],
                               "actual": ["self", "x"]}],
        "phase_map_error": "phase map fork.yaml: entry 0: bad",
    }))
    (tmp_path / "errors-pid1-rank0.json").write_text(json.dumps(
        {"step:x": {"count": 2, "first": "AttributeError: reqs"}}))
    lines = b.describe_hooks()
    assert lines[0] == "sglang 0.5.23: 3 hooks installed from phase_map_0_5_23.yaml"
    assert "MISSING target a.B.c (draft): AttributeError: no c" in lines[1]
    assert "optional target f.G.h (step)" in lines[2]
    assert "signature changed: s.T.u" in lines[3]
    assert "fork.yaml" in lines[4]
    assert "hook error in step:x (2x): AttributeError: reqs" in lines[5]
    assert len(b.hook_reports()) == 1


def test_unit_tiny_model_configs(tmp_path: Path) -> None:
    from pytest_specperf.engines.sglang import tiny_model

    assert tiny_model.main([str(tmp_path)]) == 0
    target, draft = tmp_path / "target", tmp_path / "draft"
    for d in (target, draft):
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["hidden_size"] // cfg["num_attention_heads"] == cfg["head_dim"] == 64
        assert config_vocab_size(str(d)) == tiny_model.VOCAB
    assert tiny_model.main([]) == 2


def test_unit_attach_mode_learns_the_vocabulary_from_server_info(model_dir: Path) -> None:
    b = SGLangBackend()
    b.fingerprint({**INFO, "model_path": str(model_dir), "speculative_draft_model_path": None})
    assert b._vocab_size == 128256


# -- algorithms without a phase map ------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "FROZEN_KV_MTP",
                                       "DFLASH", "eagle3"])
def test_unit_check_accepts_mapped_algorithms(fake_sglang: Path, model_dir: Path,
                                              algorithm: str) -> None:
    SGLangBackend().check(settings(str(model_dir), f"--speculative-algorithm={algorithm}"))


@pytest.mark.parametrize(("algorithm", "worker"), [
    ("NGRAM", "sglang.srt.speculative.ngram_worker.NGRAMWorker"),
    ("UNO", "sglang.srt.speculative.uno_worker_v2.UnoWorkerV2"),
    ("DSPARK", "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"),
])
def test_unit_check_refuses_algorithms_without_a_phase_map(
    fake_sglang: Path, model_dir: Path, algorithm: str, worker: str
) -> None:
    with pytest.raises(BackendUnavailable) as exc:
        SGLangBackend().check(settings(str(model_dir), "--speculative-algorithm", algorithm))
    msg = str(exc.value)
    assert f"--speculative-algorithm {algorithm}: pytest-specperf has no phase map" in msg
    assert f"{worker}.forward_batch_generation" in msg
    assert "specperf sglang-check --step" in msg and "SPECPERF_PHASE_MAP" in msg
    assert "Extending the phase map" in msg


def test_unit_check_accepts_ngram_and_a_forks_algorithm_with_the_users_map(
    fake_sglang: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(BackendUnavailable, match=r"MY_DDTREE: not an algorithm of SGLang 0\.5\.23"):
        SGLangBackend().check(settings(str(model_dir), "--speculative-algorithm=MY_DDTREE"))
    user = tmp_path / "map.yaml"
    user.write_text("schema: 1\nentries:\n"
                    " - {target: sglang.srt.speculative.ngram_worker.NGRAMWorker."
                    "forward_batch_generation, role: step}\n"
                    " - {target: sglang.srt.speculative.ddtree.DDTreeWorker."
                    "forward_batch_generation, role: step}\n")
    monkeypatch.setenv(base.ENV_PHASE_MAP, str(user))
    for algorithm in ("NGRAM", "MY_DDTREE"):
        SGLangBackend().check(settings(str(model_dir), f"--speculative-algorithm={algorithm}"))


def test_unit_check_reads_the_algorithm_from_a_config_file(
    fake_sglang: Path, model_dir: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("speculative-algorithm: UNO\npage-size: 16\n")
    with pytest.raises(BackendUnavailable, match="--speculative-algorithm UNO"):
        SGLangBackend().check(settings(str(model_dir), "--config", str(cfg)))
    cfg.write_text("speculative_algorithm: EAGLE3\n")
    SGLangBackend().check(settings(str(model_dir), f"--config={cfg}"))
    # an unreadable config: SGLang says so itself; the attach-time check still applies
    SGLangBackend().check(settings(str(model_dir), "--config", str(tmp_path / "nope.yaml")))


def test_unit_attach_refuses_an_unmapped_algorithm_and_a_bad_map(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(base.ENV_PHASE_MAP, raising=False)
    with pytest.raises(BackendUnavailable, match="--speculative-algorithm DSPARK"):
        SGLangBackend().fingerprint({**INFO, "speculative_algorithm": "DSPARK"})
    SGLangBackend().fingerprint({**INFO, "speculative_algorithm": None})  # not speculative
    bad = tmp_path / "map.yaml"
    bad.write_text("schema: 1\nentries:\n - {target: json.dumps, role: step}\n")
    monkeypatch.setenv(base.ENV_PHASE_MAP, str(bad))
    with pytest.raises(BackendUnavailable) as exc:
        SGLangBackend().check_attached(dict(INFO))
    assert f"SPECPERF_PHASE_MAP: phase map {bad}:3: entry 0 (json.dumps)" in str(exc.value)
    assert "outside SGLang" in str(exc.value)


def test_unit_hook_report_of_a_refused_scheduler(tmp_path: Path) -> None:
    (tmp_path / "hooks-pid1-rank0.json").write_text(json.dumps({
        "sglang_version": "0.5.23", "phase_map": ["phase_map_0_5_23.yaml"], "installed": [],
        "missing": [{"target": "a.B.c", "role": "phase", "phase": "draft", "optional": False,
                     "kind": "import_failed",
                     "reason": "import failed: module a exists but importing it raised X"}],
        "signature_changed": [], "refused": "--speculative-algorithm NGRAM: no map",
        "phase_map_error": None,
    }))
    b = SGLangBackend()
    b.bind(tmp_path)
    lines = b.describe_hooks()
    assert lines[1] == "  REFUSED, nothing installed: --speculative-algorithm NGRAM: no map"
    assert lines[2].startswith("  IMPORT FAILED for target a.B.c (draft): import failed: module")


def test_unit_flag_and_config_values(tmp_path: Path) -> None:
    tokens = ["--speculative-algorithm", "EAGLE3", "--page-size=16",
              "--speculative-algorithm=DFLASH", "--flag"]
    assert launcher.flag_value(tokens, "--speculative-algorithm") == "DFLASH"
    assert launcher.flag_value(tokens, "--page-size") == "16"
    assert launcher.flag_value(tokens, "--flag") is None
    assert launcher.flag_value(["--a", "--b"], "--a") is None
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- not a mapping\n")
    assert launcher.config_value(["--config", str(cfg)], "speculative_algorithm") is None
    cfg.write_text("speculative_algorithm: 3\n")
    assert launcher.config_value(["--config", str(cfg)], "speculative_algorithm") is None
    assert launcher.config_value([], "speculative_algorithm") is None
