"""Unit tests of the SGLang plugin entry point (``sgl_plugin.load``) without SGLang.

SGLang's ``HookRegistry`` is replaced by a test double installed in ``sys.modules`` under
its real module name; target resolution is replaced too, so no SGLang module is imported.
"""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pytest_specperf.engines import env as base
from pytest_specperf.engines.sglang import sgl_plugin
from pytest_specperf.engines.sglang.hooks import ProbeRuntime
from pytest_specperf.engines.sglang.phase_map import PhaseMap, load_builtin, parse_map


def test_unit_env_names_match_the_backend_protocol() -> None:
    assert sgl_plugin.ENV_SGLANG_PLUGIN == base.ENV_SGLANG_PLUGIN
    assert sgl_plugin.ENV_RUN_DIR == base.ENV_RUN_DIR
    assert sgl_plugin.ENV_PHASE_MAP == base.ENV_PHASE_MAP


def test_unit_disabled_plugin_is_inert_and_imports_nothing() -> None:
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "import pytest_specperf.engines.sglang.sgl_plugin as p; p.load()\n"
        "dt = time.perf_counter() - t\n"
        "heavy = [m for m in ('torch', 'sglang', 'yaml', 'pytest_specperf.engines.sglang.hooks',"
        " 'pytest_specperf.probe') if m in sys.modules]\n"
        "print(heavy, p._runtime, dt < 0.5)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "SPECPERF_SGLANG_PLUGIN"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    assert out == "[] None True"


def test_unit_enabled_plugin_does_nothing_outside_a_scheduler(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECPERF_SGLANG_PLUGIN", "1")
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(sgl_plugin, "_runtime", None)
    sgl_plugin.load()  # as in the launcher, tokenizer or detokenizer process
    assert sgl_plugin._runtime is None
    assert list(tmp_path.iterdir()) == []


def _in_scheduler(fn: Any, **ranks: Any) -> Any:
    """Call ``fn`` the way SGLang calls load(): from run_scheduler_process, via load_plugins."""

    def run_scheduler_process(server_args: Any = None, port_args: Any = None, gpu_id: int = 0,
                              tp_rank: int = 0, pp_rank: int = 0, dp_rank: Any = None) -> Any:
        def load_plugins() -> Any:
            return fn()

        return load_plugins()

    return run_scheduler_process(**ranks)


def test_unit_scheduler_context_reads_the_ranks() -> None:
    ctx = _in_scheduler(sgl_plugin.scheduler_context, tp_rank=3, pp_rank=1, gpu_id=5)
    assert ctx["tp_rank"] == 3 and ctx["pp_rank"] == 1 and ctx["gpu_id"] == 5
    assert ctx["dp_rank"] is None and "server_args" in ctx
    assert sgl_plugin.scheduler_context() is None


class FakeHookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class FakeHookRegistry:
    registered: ClassVar[list[tuple[str, Any, Any]]] = []

    @classmethod
    def register(cls, target: str, hook: Any, hook_type: Any = FakeHookType.AFTER) -> None:
        cls.registered.append((target, hook, hook_type))


def def_a(self: Any, batch: Any, on_publish: Any = None, grammar_barrier: Any = None,
          pp_proxy_tensors: Any = None) -> None: ...
def def_b(self: Any, batch: Any, extra: Any) -> None: ...


def fake_resolve(target: str) -> Any:
    known = {
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation": def_a,
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft": def_b,
    }
    if target not in known:
        raise ModuleNotFoundError(f"No module named {target.rsplit('.', 2)[0]!r}")
    return known[target]


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> type[FakeHookRegistry]:
    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    mod.HookRegistry = FakeHookRegistry  # type: ignore[attr-defined]
    mod.HookType = FakeHookType  # type: ignore[attr-defined]
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)
    monkeypatch.setattr(FakeHookRegistry, "registered", [])
    monkeypatch.setattr(sgl_plugin, "resolve_target", fake_resolve)
    monkeypatch.setattr(sgl_plugin, "_runtime", None)
    monkeypatch.setenv("SPECPERF_SGLANG_PLUGIN", "1")
    monkeypatch.delenv("SPECPERF_PHASE_MAP", raising=False)
    return FakeHookRegistry


def test_unit_load_takes_inject_and_nvtx_from_the_environment(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SPECPERF_INJECT", "verify=1.25")
    monkeypatch.setenv("SPECPERF_NVTX", "1")
    _in_scheduler(sgl_plugin.load, tp_rank=0)
    rt = sgl_plugin._runtime
    assert isinstance(rt, ProbeRuntime)
    assert rt.labels["inject"] == "verify=1.25" and rt.labels["engine"] == "sglang"
    assert rt._injector is not None and rt._nvtx is True


def test_unit_load_in_a_scheduler_registers_hooks_and_reports(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path))
    _in_scheduler(sgl_plugin.load, tp_rank=1, gpu_id=1)
    assert [t for t, _, _ in fake_registry.registered] == [
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
        "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft",
    ]
    assert all(ht is FakeHookType.AROUND for _, _, ht in fake_registry.registered)
    rt = sgl_plugin._runtime
    assert isinstance(rt, ProbeRuntime) and rt.rank == 1
    assert rt.labels["engine"] == "sglang" and rt.labels["gpu_id"] == "1"
    (path,) = tmp_path.glob("hooks-*-rank1.json")
    report = json.loads(path.read_text())
    assert report["phase_map"] == ["phase_map_0_5_23.yaml"]
    assert len(report["installed"]) == 2
    missing = {m["target"]: m for m in report["missing"]}
    assert len(missing) == len(load_builtin().active()) - 2
    fork = missing["sglang.srt.speculative.dflash_worker.DFlashWorker.forward_batch_generation"]
    assert fork["optional"] is True and "No module named" in fork["reason"]
    # def_b has an extra parameter: reported, hooked anyway
    (changed,) = report["signature_changed"]
    assert changed["target"].endswith("EagleDraftWorker.draft")
    assert changed["actual"] == ["self", "batch", "extra"]
    assert report["process"]["tp_rank"] == 1 and report["phase_map_error"] is None
    # a second load in the same process changes nothing
    sgl_plugin.load()
    assert len(fake_registry.registered) == 2


def test_unit_load_reports_a_bad_user_phase_map(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "fork.yaml"
    bad.write_text("schema: 1\nentries: [7]\n")
    run = tmp_path / "run"
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(run))
    monkeypatch.setenv("SPECPERF_PHASE_MAP", str(bad))
    _in_scheduler(sgl_plugin.load)
    report = json.loads(next(run.glob("hooks-*.json")).read_text())
    assert str(bad) in report["phase_map_error"] and "entry 0" in report["phase_map_error"]
    assert len(report["installed"]) == 2  # the built-in map still applies


def test_unit_load_with_a_user_phase_map(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fork = tmp_path / "fork.yaml"
    fork.write_text("schema: 1\nentries:\n"
                    " - {target: sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft,"
                    " role: phase, phase: build_verify_input, params: [self, batch, extra]}\n")
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("SPECPERF_PHASE_MAP", str(fork))
    _in_scheduler(sgl_plugin.load)
    report = json.loads(next((tmp_path / "run").glob("hooks-*.json")).read_text())
    by = {i["target"]: i for i in report["installed"]}
    draft = by["sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft"]
    assert draft["phase"] == "build_verify_input" and draft["source"] == str(fork)
    assert report["signature_changed"] == []


def test_unit_load_without_run_dir_stays_off(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECPERF_RUN_DIR", raising=False)
    _in_scheduler(sgl_plugin.load)
    assert fake_registry.registered == [] and sgl_plugin._runtime is None


def test_unit_load_never_raises(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path))

    def broken(*a: Any, **k: Any) -> None:
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(FakeHookRegistry, "register", broken)
    _in_scheduler(sgl_plugin.load)  # failures are reported, not raised
    report = json.loads(next(tmp_path.glob("hooks-*.json")).read_text())
    assert report["installed"] == []
    reasons = {m["target"]: m["reason"] for m in report["missing"]}
    assert reasons["sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2."
                   "forward_batch_generation"] == "register failed: RuntimeError: registry exploded"
    monkeypatch.setattr(sgl_plugin, "install", broken)
    monkeypatch.setattr(sgl_plugin, "_runtime", None)
    _in_scheduler(sgl_plugin.load)
    assert sgl_plugin._runtime is None


def test_unit_install_on_a_small_map(tmp_path: Path) -> None:
    pm: PhaseMap = parse_map({"schema": 1, "entries": [
        {"target": "json.dumps", "role": "phase", "phase": "accept"},
        {"target": "json.nothing_here", "role": "phase", "phase": "accept", "optional": True},
        {"target": "json.loads", "role": "disabled"},
    ]}, "inline")
    got: list[str] = []
    rt = ProbeRuntime(tmp_path, use_cuda=False)
    report = sgl_plugin.install(rt, pm, lambda t, h: got.append(t), sgl_plugin.resolve_target)
    assert got == ["json.dumps"]
    assert [m["target"] for m in report["missing"]] == ["json.nothing_here"]


def test_unit_resolve_target_and_runtime_params() -> None:
    import json as json_mod

    assert sgl_plugin.resolve_target("json.dumps") is json_mod.dumps
    assert sgl_plugin.resolve_target("json.JSONDecoder.decode") is json_mod.JSONDecoder.decode
    assert sgl_plugin.resolve_target("collections.OrderedDict.fromkeys")  # classmethod
    with pytest.raises(AttributeError):
        sgl_plugin.resolve_target("json.JSONDecoder.nope")
    with pytest.raises(ModuleNotFoundError):
        sgl_plugin.resolve_target("no_such_module_xyz.Cls.meth")

    def f(self: Any, a: Any, b: int = 1, *, c: Any, **kw: Any) -> None: ...
    def g(x: Any, *args: Any, y: Any) -> None: ...

    assert sgl_plugin.runtime_params(f) == ("self", "a", "b", "*", "c", "**kw")
    assert sgl_plugin.runtime_params(g) == ("x", "*args", "y")
    assert sgl_plugin.runtime_params(len) == ("obj",)
    assert sgl_plugin.runtime_params(object()) is None  # not introspectable: not compared


@pytest.mark.parametrize(("algorithm", "skipped_family", "kept_family"), [
    ("EAGLE3", "dflash", "eagle"),
    ("DFLASH", "eagle", "dflash"),
    ("NEXTN", "dflash-fork", "eagle-multi-layer"),
])
def test_unit_install_skips_families_the_algorithm_cannot_use(
    tmp_path: Path, algorithm: str, skipped_family: str, kept_family: str
) -> None:
    pm = load_builtin()
    resolved: list[str] = []

    def resolve(target: str) -> Any:
        resolved.append(target)
        return def_a

    report = sgl_plugin.install(ProbeRuntime(tmp_path, use_cuda=False), pm,
                                lambda t, h: None, resolve, algorithm)
    family = {e.target: e.family for e in pm.entries}
    assert report["speculative_algorithm"] == algorithm
    assert {family[t] for t in report["not_for_this_algorithm"]} == (
        {"dflash", "dflash-fork"} if algorithm != "DFLASH"
        else {"eagle", "eagle-multi-layer", "frozen-kv-mtp"})
    assert not any(family[t] == skipped_family for t in resolved)  # never imported
    assert any(family[t] == kept_family for t in resolved)
    assert any(family[t] is None for t in resolved)  # scheduler plumbing, graph runners


def test_unit_install_with_unknown_algorithm_keeps_everything(tmp_path: Path) -> None:
    pm = load_builtin()
    for algo in (None, "MY_DDTREE"):
        report = sgl_plugin.install(ProbeRuntime(tmp_path, use_cuda=False), pm,
                                    lambda t, h: None, lambda t: def_a, algo)
        assert report["not_for_this_algorithm"] == []
        assert len(report["installed"]) == len(pm.active())


def test_unit_load_reads_the_algorithm_from_server_args(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(tmp_path))
    server_args = types.SimpleNamespace(speculative_algorithm="DFLASH")
    _in_scheduler(sgl_plugin.load, server_args=server_args)
    report = json.loads(next(tmp_path.glob("hooks-*.json")).read_text())
    assert report["speculative_algorithm"] == "DFLASH"
    assert sgl_plugin._runtime is not None
    assert sgl_plugin._runtime.labels["speculative_algorithm"] == "DFLASH"
    assert report["installed"] == []  # the fake resolver only knows two EAGLE targets
    assert not any("eagle_worker_v2" in m["target"] for m in report["missing"])
