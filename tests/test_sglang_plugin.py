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
from pytest_specperf.engines.sglang.algorithms import ALGORITHMS, KNOWN_FAMILIES
from pytest_specperf.engines.sglang.hooks import ProbeRuntime
from pytest_specperf.engines.sglang.phase_map import HookEntry, PhaseMap, load_builtin, parse_map


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


def _hooks_report(
    monkeypatch: pytest.MonkeyPatch, run: Path, phase_map: Path | None = None,
    algorithm: str | None = None,
) -> dict[str, Any]:
    """``sgl_plugin.load`` in a scheduler whose run directory is ``run`` (with the user's
    ``phase_map``, for ``--speculative-algorithm algorithm``); the hooks report it wrote."""
    monkeypatch.setenv("SPECPERF_RUN_DIR", str(run))
    if phase_map is not None:
        monkeypatch.setenv("SPECPERF_PHASE_MAP", str(phase_map))
    args = None if algorithm is None else types.SimpleNamespace(speculative_algorithm=algorithm)
    _in_scheduler(sgl_plugin.load, server_args=args)
    return json.loads(next(run.glob("hooks-*.json")).read_text())


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


@pytest.mark.parametrize("text", [
    "schema: 1\nentries: [7]\n",
    "schema: 1\nentries:\n - {target: sglang.a.B.c, role: phase, phase: drafting}\n",
    "schema: 1\nentries:\n - {target: myfork.B.c, role: step}\n",
    "schema: 1\nentries:\n - {target: sglang.a.B.c, role: step}\n - {target: sglang.a.B.c, role: idle}\n",
    "schema: 1\nentries:\n - !!python/object/apply:os.system [echo]\n",
], ids=["not-a-mapping", "unknown-phase", "outside-sglang", "duplicate", "yaml-tag"])
def test_unit_bad_user_phase_map_patches_nothing(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    text: str,
) -> None:
    """A map that does not validate registers no hook at all, not even the built-in ones
    (half a map would measure something else than asked), and the report says where."""
    bad = tmp_path / "fork.yaml"
    bad.write_text(text)
    report = _hooks_report(monkeypatch, tmp_path / "run", bad)
    assert fake_registry.registered == []
    assert report["installed"] == [] and report["refused"] == report["phase_map_error"]
    assert f"phase map {bad}:" in report["phase_map_error"]
    assert isinstance(sgl_plugin._runtime, ProbeRuntime)  # loaded once, inert


def test_unit_load_with_a_user_phase_map(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fork = tmp_path / "fork.yaml"
    fork.write_text("schema: 1\nentries:\n"
                    " - {target: sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft,"
                    " role: phase, phase: build_verify_input, params: [self, batch, extra]}\n")
    report = _hooks_report(monkeypatch, tmp_path / "run", fork)
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
        {"target": "sglang.srt.x.f", "role": "phase", "phase": "accept"},
        {"target": "sglang.srt.x.nothing_here", "role": "phase", "phase": "accept",
         "optional": True},
        {"target": "sglang.srt.x.g", "role": "disabled"},
    ]}, "inline")
    got: list[str] = []
    rt = ProbeRuntime(tmp_path, use_cuda=False)

    def resolve(target: str) -> Any:
        if target == "sglang.srt.x.f":
            return def_b
        raise AttributeError(f"sglang.srt.x has no attribute {target.rsplit('.', 1)[1]!r}")

    report = sgl_plugin.install(rt, pm, lambda t, h: got.append(t), resolve)
    assert got == ["sglang.srt.x.f"]
    (missing,) = report["missing"]
    assert missing["target"] == "sglang.srt.x.nothing_here" and missing["kind"] == "not_found"
    assert report["refused"] is None


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


@pytest.mark.parametrize("algorithm", [a for a, spec in ALGORITHMS.items() if spec.families])
def test_unit_install_skips_families_the_algorithm_cannot_use(
    tmp_path: Path, algorithm: str
) -> None:
    pm = load_builtin()
    resolved: list[str] = []

    def resolve(target: str) -> Any:
        resolved.append(target)
        return def_a

    report = sgl_plugin.install(ProbeRuntime(tmp_path, use_cuda=False), pm,
                                lambda t, h: None, resolve, algorithm)
    family = {e.target: e.family for e in pm.entries}
    usable = ALGORITHMS[algorithm].families
    assert report["speculative_algorithm"] == algorithm
    assert {family[t] for t in report["not_for_this_algorithm"]} == KNOWN_FAMILIES - usable
    assert {family[t] for t in resolved} == usable | {None}  # never imported: the others
    assert any(family[t] is None for t in resolved)  # scheduler plumbing, graph runners


def test_unit_frozen_kv_mtp_gets_its_own_families_only(tmp_path: Path) -> None:
    """FROZEN_KV_MTP runs EAGLEWorkerV2's verify but none of EAGLE's draft workers, and
    nothing of DFlash: before it was in the table, every family was installed for it."""
    pm = load_builtin()
    report = sgl_plugin.install(ProbeRuntime(tmp_path, use_cuda=False), pm,
                                lambda t, h: None, lambda t: def_a, "FROZEN_KV_MTP")
    installed = {i["target"].rsplit(".", 2)[-2] + "." + i["target"].rsplit(".", 1)[1]
                 for i in report["installed"]}
    assert {"FrozenKVMTPWorkerV2.forward_batch_generation", "EAGLEWorkerV2.verify",
            "FrozenKVMTPDraftWorker.draft"} <= installed
    assert not any(t.startswith(("EagleDraftWorker.", "MultiLayer", "DFlash", "ModelRunner.",
                                 "TpModelWorker.")) for t in installed)


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
    report = _hooks_report(monkeypatch, tmp_path, algorithm="DFLASH")
    assert report["speculative_algorithm"] == "DFLASH"
    assert sgl_plugin._runtime is not None
    assert sgl_plugin._runtime.labels["speculative_algorithm"] == "DFLASH"
    assert report["installed"] == []  # the fake resolver only knows two EAGLE targets
    assert not any("eagle_worker_v2" in m["target"] for m in report["missing"])


@pytest.mark.parametrize("algorithm", ["NGRAM", "UNO", "DSPARK", "MY_DDTREE"])
def test_unit_load_refuses_an_algorithm_without_a_step_entry(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    algorithm: str,
) -> None:
    report = _hooks_report(monkeypatch, tmp_path, algorithm=algorithm)
    assert fake_registry.registered == []
    assert report["installed"] == [] and report["phase_map_error"] is None
    assert f"--speculative-algorithm {algorithm}" in report["refused"]
    assert "SPECPERF_PHASE_MAP" in report["refused"] and "sglang-check" in report["refused"]


def test_unit_load_accepts_ngram_with_the_users_step_entry(
    fake_registry: type[FakeHookRegistry], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fork = tmp_path / "ngram.yaml"
    fork.write_text("schema: 1\nentries:\n"
                    " - {target: sglang.srt.speculative.ngram_worker.NGRAMWorker."
                    "forward_batch_generation, role: step}\n")
    report = _hooks_report(monkeypatch, tmp_path / "run", fork, "NGRAM")
    assert report["refused"] is None
    missing = {m["target"] for m in report["missing"]}  # the fake resolver knows 2 targets
    assert "sglang.srt.speculative.ngram_worker.NGRAMWorker.forward_batch_generation" in missing
    family = {e.target: e.family for e in load_builtin().entries}
    # NGRAM uses none of the built-in families: only plumbing and the user's entries
    assert {family[t] for t in report["not_for_this_algorithm"]} == KNOWN_FAMILIES


def test_unit_resolve_target_reports_a_module_that_fails_to_import(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A module that exists but raises on import is an import failure naming the module and
    its error, where pkgutil.resolve_name reports an AttributeError of the parent package."""
    import pkgutil

    pkg = tmp_path / "sglang_stub_for_import_test"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "worker.py").write_text("import flashinfer_missing_dependency\n"
                                           "class W:\n    def step(self): ...\n")
    (pkg / "srt" / "fine.py").write_text("class W:\n    def step(self): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = "sglang_stub_for_import_test.srt.worker.W.step"
    with pytest.raises(AttributeError):  # what the old resolution reported
        pkgutil.resolve_name(target.rsplit(".", 1)[0])
    with pytest.raises(sgl_plugin.TargetImportError) as exc:
        sgl_plugin.resolve_target(target)
    msg = str(exc.value)
    assert "sglang_stub_for_import_test.srt.worker exists but importing it raised" in msg
    assert "flashinfer_missing_dependency" in msg
    assert sgl_plugin.resolve_target("sglang_stub_for_import_test.srt.fine.W.step")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        sgl_plugin.resolve_target("sglang_stub_for_import_test.srt.fine.W.nope")
    with pytest.raises(AttributeError, match="srt has no attribute 'absent'"):
        sgl_plugin.resolve_target("sglang_stub_for_import_test.srt.absent.W.step")
    with pytest.raises(ModuleNotFoundError):
        sgl_plugin.resolve_target("no_such_top_level_package_xyz.m.W.step")
    pm = PhaseMap(entries=(HookEntry(target=target, role="step"),))  # a stand-in package
    report = sgl_plugin.install(ProbeRuntime(tmp_path, use_cuda=False), pm, lambda t, h: None,
                                sgl_plugin.resolve_target)
    (m,) = report["missing"]
    assert m["kind"] == "import_failed" and m["reason"].startswith("import failed: module ")
