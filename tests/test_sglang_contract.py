"""Contract tests: the installed SGLang source still has what our hooks rely on.

These read SGLang's files with ``ast`` and never import it (its modules need a GPU stack).
CI installs ``sglang==0.5.23`` with ``pip install --no-deps``, which is enough: only the
source is read. When the next SGLang release renames or re-signs a hooked function, these
tests name the target, the file and the difference.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest

from pytest_specperf.engines.sglang import launcher, metrics
from pytest_specperf.engines.sglang.algorithms import ALGORITHMS, refusal
from pytest_specperf.engines.sglang.callgraph import CallGraph
from pytest_specperf.engines.sglang.kv_fragment import SUPPORTED_ALLOCATORS
from pytest_specperf.engines.sglang.phase_map import HookEntry, load_builtin
from pytest_specperf.engines.sglang.source import (
    SourceLookupError,
    SourceTree,
    base_names,
    installed_version,
    sglang_root,
)
from pytest_specperf.engines.sglang.spec_workers import worker_choices
from pytest_specperf.probe.phases import PHASES, SCHEDULER_PHASES

ROOT = sglang_root()
#: One parse per file for the whole module (the source does not change during a run).
SRC = SourceTree(ROOT) if ROOT is not None else None
pytestmark = pytest.mark.skipif(
    ROOT is None,
    reason="sglang is not installed; CI runs these with `pip install --no-deps sglang==0.5.23`",
)
MAP = load_builtin("0.5.23")
REQUIRED = [e for e in MAP.active() if not e.optional]
VERSION = installed_version()


def _id(e: HookEntry) -> str:
    return e.target.removeprefix("sglang.srt.")


def test_builtin_map_is_for_0_5_23_and_records_every_signature() -> None:
    assert MAP.sglang_version == "0.5.23"
    assert REQUIRED, "the built-in map has no required targets"
    assert [e.target for e in REQUIRED if e.params is None] == []


@pytest.mark.parametrize("entry", REQUIRED, ids=_id)
def test_hook_target_exists_with_recorded_signature(entry: HookEntry) -> None:
    assert SRC is not None
    try:
        found = SRC.find_callable(entry.target)
    except SourceLookupError as e:
        pytest.fail(f"sglang {VERSION}: hook target gone ({entry.describe()}): {e}")
    assert entry.params is not None
    assert found.params == entry.params, (
        f"sglang {VERSION}: {entry.target} ({found.path}:{found.lineno}) has parameters "
        f"{list(found.params)}, the phase map records {list(entry.params)}"
    )


def test_optional_fork_targets_are_only_the_documented_ones() -> None:
    optional = sorted(e.target for e in MAP.entries if e.optional)
    assert optional == sorted([
        "sglang.srt.speculative.dflash_worker.DFlashWorker.forward_batch_generation",
        "sglang.srt.speculative.dflash_worker.DFlashWorker._build_ddtree_verify_input",
        "sglang.srt.speculative.dflash_worker.DFlashWorker.prepare_for_verify",
    ])


#: Subclasses overriding a hooked method that we deliberately do not hook, with reasons.
NOT_HOOKED: dict[str, str] = {}


def test_every_override_of_a_hooked_method_is_mapped() -> None:
    """A new subclass overriding a hooked method would bypass the hook: map it."""
    assert ROOT is not None
    hooked: dict[str, set[str]] = {}
    for e in MAP.active():
        parts = e.target.split(".")
        if e.role in ("step", "phase", "graph") and parts[-2][:1].isupper():
            hooked.setdefault(parts[-2], set()).add(parts[-1])
    assert SRC is not None
    classes = SRC.iter_classes(("srt/speculative", "srt/model_executor", "srt/managers",
                                "srt/mem_cache"))
    mapped = {".".join(e.target.split(".")[-2:]) for e in MAP.entries}
    # transitive closure over simple base names
    parents: dict[str, list[str]] = {}
    for _path, cls in classes:
        parents.setdefault(cls.name, []).extend(base_names(cls))

    def ancestors(name: str, seen: set[str]) -> set[str]:
        for b in parents.get(name, []):
            if b not in seen:
                seen.add(b)
                ancestors(b, seen)
        return seen

    unmapped = []
    for path, cls in classes:
        defined = {n.name for n in cls.body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for anc in ancestors(cls.name, set()):
            for method in hooked.get(anc, ()):
                key = f"{cls.name}.{method}"
                if method in defined and key not in mapped and key not in NOT_HOOKED:
                    unmapped.append(f"{key} ({path.relative_to(ROOT)}, overrides {anc}.{method})")
    assert unmapped == [], "overrides not in the phase map:\n" + "\n".join(unmapped)


def _function(module: str, name: str) -> ast.FunctionDef:
    assert SRC is not None
    for node in SRC.module(module).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name} in {module}")


def _calls(fn: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            out.append(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute)
                       else "")
    return out


def test_scheduler_process_loads_plugins_with_tp_rank_in_scope() -> None:
    """sgl_plugin.load() recognises a scheduler by its caller run_scheduler_process and reads
    tp_rank/pp_rank/dp_rank/gpu_id/server_args from that frame."""
    fn = _function("sglang.srt.managers.scheduler", "run_scheduler_process")
    params = {a.arg for a in fn.args.args}
    assert {"tp_rank", "pp_rank", "dp_rank", "gpu_id", "server_args"} <= params
    calls = _calls(fn)
    assert "load_plugins" in calls
    assert calls.index("load_plugins") < calls.index("Scheduler"), "plugins must load first"


def test_plugin_framework_contract() -> None:
    assert ROOT is not None and SRC is not None
    init = SRC.module("sglang.srt.plugins")
    groups = {
        t.id: n.value.value
        for n in init.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets if isinstance(t, ast.Name)
    }
    assert groups.get("GENERAL_PLUGINS_GROUP") == "sglang.srt.plugins"
    assert "apply_hooks" in _calls(_function("sglang.srt.plugins", "load_plugins"))
    reg = SRC.find_callable("sglang.srt.plugins.hook_registry.HookRegistry.register")
    assert reg.params[:4] == ("cls", "target", "hook", "hook_type")
    assert "AROUND" in SRC.class_attributes("sglang.srt.plugins.hook_registry", "HookType")
    # AROUND hooks are called as hook(original_fn, *args, **kwargs)
    wrap = _function("sglang.srt.plugins.hook_registry", "_wrap_fn")
    around = [n for n in ast.walk(wrap) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id == "hook"
              and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id == "original_fn"]
    assert around, "HookRegistry no longer calls AROUND hooks as hook(original_fn, ...)"
    environ = (ROOT / "srt" / "environ.py").read_text(encoding="utf-8")
    for name in ("SGLANG_PLUGINS", launcher.DEVICE_TIMER_ENV):
        assert f"{name} = " in environ, name


ATTRIBUTES = [
    ("sglang.srt.managers.schedule_batch", "ScheduleBatch",
     ["reqs", "forward_mode", "is_extend_in_batch", "seq_lens_cpu"]),
    ("sglang.srt.managers.schedule_batch", "Req",
     ["rid", "kv", "origin_input_ids", "output_ids", "finished"]),
    ("sglang.srt.managers.schedule_batch", "ReqKvInfo", ["req_pool_idx", "kv_committed_len"]),
    ("sglang.srt.model_executor.forward_batch_info", "ForwardMode", ["is_extend", "is_idle"]),
    ("sglang.srt.managers.utils", "GenerationBatchResult", ["accept_lens", "copy_done"]),
    ("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool", ["req_to_token"]),
    ("sglang.srt.mem_cache.base_prefix_cache", "PrefixCacheTrait",
     ["req_to_token_pool", "token_to_kv_pool_allocator", "page_size"]),
    ("sglang.srt.managers.scheduler", "Scheduler", ["token_to_kv_pool_allocator"]),
    ("sglang.srt.model_executor.model_runner", "ModelRunner", ["is_draft_worker"]),
    ("sglang.srt.model_executor.runner.base_runner", "BaseRunner", ["model_runner"]),
    ("sglang.srt.mem_cache.allocator.base", "BaseTokenToKVPoolAllocator",
     ["free_pages", "page_size", "release_pages"]),
    ("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator",
     ["free_pages", "release_pages", "clear"]),
    ("sglang.srt.mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator",
     ["free_pages", "staged_pages", "clear"]),
]


@pytest.mark.parametrize(("module", "cls", "names"), ATTRIBUTES, ids=[a[1] for a in ATTRIBUTES])
def test_attributes_read_by_the_hooks_exist(module: str, cls: str, names: list[str]) -> None:
    assert SRC is not None
    have = SRC.class_attributes(module, cls)
    assert [n for n in names if n not in have] == [], f"sglang {VERSION}: {module}.{cls}"


def test_supported_allocators_reset_free_pages_to_a_sorted_range_in_clear() -> None:
    """kv_fragment.apply_layout relies on clear() leaving free_pages = arange(...)."""
    assert SRC is not None
    modules = {"TokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator.token",
               "PagedTokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator.paged"}
    assert set(modules) == set(SUPPORTED_ALLOCATORS)
    for cls, module in modules.items():
        SRC.find_callable(f"{module}.{cls}.clear")
        tree = SRC.module(module)
        fn = next(n for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                  for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "clear")
        assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Attribute) and t.attr == "free_pages"
                           for t in n.targets)]
        assert assigns and "arange" in ast.unparse(assigns[0].value), cls


def test_scheduler_flush_wrapper_calls_the_method_we_hook() -> None:
    """/flush_cache reaches Scheduler.flush_cache through a bound method taken in __init__,
    after our class-level patch: the AFTER-flush hook sees every HTTP flush."""
    assert ROOT is not None
    text = (ROOT / "srt" / "managers" / "scheduler.py").read_text(encoding="utf-8")
    assert "flush_cache=self.flush_cache" in text


def test_metric_names_the_cross_check_reads_exist() -> None:
    assert ROOT is not None
    text = (ROOT / "srt" / "observability" / "metrics_collector.py").read_text(encoding="utf-8")
    for name in (metrics.GRAPH_PASSES, metrics.FORWARD_SECONDS, metrics.FWD_OCCUPANCY):
        assert f'"{name}"' in text, name
    assert '"decode_cuda_graph" if value else "decode_none"' in text


def test_launch_flags_we_use_exist_and_removed_ones_are_gone() -> None:
    flags = launcher.known_flags(ROOT)
    assert flags is not None, "could not read SGLang's CLI flags from its source"
    for flag in ("--model-path", "--speculative-draft-model-path", "--host", "--port",
                 "--enable-metrics", "--speculative-algorithm", "--load-format",
                 "--speculative-draft-load-format", "--page-size", "--disable-radix-cache",
                 "--cuda-graph-max-bs-decode", "--speculative-num-draft-tokens",
                 "--speculative-dflash-block-size", "--skip-tokenizer-init", "--config"):
        assert flag in flags, flag
    assert "--cuda-graph-max-bs" not in flags  # gone in 0.5.23 (SGLANG.md)
    for flag in launcher.MODEL_FLAGS:
        assert flag in flags, flag


# -- call graph: each step reaches its phase targets -------------------------------------------
GRAPH = CallGraph(SRC) if SRC is not None else None
STEPS = [e for e in MAP.active() if e.role == "step" and not e.optional]
#: Phases each step covers (DFlash upstream verifies a chain: no tree to build).
STEP_PHASES = {
    "EAGLEWorkerV2": set(PHASES) - set(SCHEDULER_PHASES),
    "MultiLayerEagleWorkerV2": set(PHASES) - set(SCHEDULER_PHASES),
    "FrozenKVMTPWorkerV2": set(PHASES) - set(SCHEDULER_PHASES),
    "DFlashWorkerV2": set(PHASES) - {*SCHEDULER_PHASES, "build_verify_input"},
}


def _algorithm_families(step: str) -> frozenset[str]:
    return frozenset().union(*(a.families for a in ALGORITHMS.values()
                               if any(w.step == step for w in a.workers)))


def _goals(families: frozenset[str]) -> dict[str, HookEntry]:
    return {e.target: e for e in MAP.active() if e.role in ("phase", "graph")
            and e.phase != "schedule" and (e.family is None or e.family in families)}


@pytest.mark.parametrize("step", STEPS, ids=_id)
def test_each_step_reaches_the_targets_of_its_family(step: HookEntry) -> None:
    """Through the methods it calls (AST call graph), the step method reaches every phase
    and graph entry of its own family, and every phase it is meant to cover."""
    assert GRAPH is not None and step.family is not None
    goals = _goals(_algorithm_families(step.target))
    reached = GRAPH.reach(step.target, goals)
    own = {t for t, e in goals.items() if e.family == step.family}
    assert own - set(reached) == set(), f"{step.target} no longer reaches these map entries"
    phases = {goals[t].phase for t in reached if goals[t].role == "phase"}
    assert STEP_PHASES[step.target.rsplit(".", 2)[-2]] <= phases


def test_every_shared_eagle_entry_is_reached_by_some_eagle_step() -> None:
    assert GRAPH is not None
    shared = {e.target for e in MAP.active() if e.family == "eagle" and e.phase != "schedule"}
    reached: set[str] = set()
    for step in STEPS:
        if "eagle" in _algorithm_families(step.target):
            reached |= set(GRAPH.reach(step.target, _goals(_algorithm_families(step.target))))
    assert shared - reached == set()


def test_the_scheduler_reaches_every_schedule_entry() -> None:
    """schedule entries run in ScheduleBatch.prepare_for_decode, before the step."""
    assert GRAPH is not None
    sched = {e.target for e in MAP.active() if e.phase == "schedule"}
    sched.discard("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run")  # outer
    top = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"
    assert sched - {top} - set(GRAPH.reach(top, sched)) == set()


def test_multi_layer_eagle_drafts_in_its_draft_extend() -> None:
    """The review's finding (a): MultiLayerEagleDraftWorker.draft_forward is bookkeeping; the
    draft model runs in _draft_extend_for_decode through the graph runner's replay(step), or
    eagerly through the draft runners' forward."""
    assert GRAPH is not None
    mod = "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker."
    forward = GRAPH.definition(mod + "draft_forward")
    assert forward is not None
    assert not [c for c in GRAPH.calls(forward) if c.name in ("forward", "replay", "execute")]
    extend = GRAPH.definition(mod + "_draft_extend_for_decode")
    assert extend is not None
    names = {c.name for c in GRAPH.calls(extend)}
    assert {"replay", "forward", "prepare_for_draft_extend"} <= names
    by = MAP.by_target()
    assert by[mod + "_draft_extend_for_decode"].phase == "draft"
    assert mod + "draft_forward" not in by  # not an eager-forward counter any more


# -- spec_info: every algorithm goes to the worker the table says ------------------------------
def test_spec_info_create_worker_matches_the_algorithm_table() -> None:
    assert GRAPH is not None
    found: dict[str, set[tuple[str | None, str | None]]] = {}
    for c in worker_choices(GRAPH):
        found.setdefault(c.algorithm, set()).add((c.worker, c.step))
    expected = {name: {(w.cls, w.step) for w in a.workers} for name, a in ALGORITHMS.items()}
    assert found == expected


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_each_algorithm_is_mapped_or_refused(algorithm: str) -> None:
    """An accepted algorithm's worker has a step entry (and phases, tested above); the others
    are refused with the algorithm, the worker and how to add a map named."""
    reason = refusal(algorithm, MAP, "0.5.23")
    if ALGORITHMS[algorithm].families:
        assert reason is None
        for w in ALGORITHMS[algorithm].workers:
            assert w.step in {e.target for e in STEPS}
    else:
        assert reason is not None
        assert algorithm in reason and ALGORITHMS[algorithm].workers[0].step in reason
        assert "SPECPERF_PHASE_MAP" in reason and "specperf sglang-check" in reason


# -- the allocators hand out the free list from its head, in order ----------------------------
ALLOCATORS = {"TokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator.token",
              "PagedTokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator.paged"}


def _assignments_to_free_pages(fn: ast.AST) -> list[ast.expr]:
    return [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Attribute) and t.attr == "free_pages" for t in n.targets)]


def _is_head_cut(expr: ast.expr) -> bool:
    """``self.free_pages[n:]``."""
    return (isinstance(expr, ast.Subscript) and ast.unparse(expr.value) == "self.free_pages"
            and isinstance(expr.slice, ast.Slice) and expr.slice.lower is not None
            and expr.slice.upper is None and expr.slice.step is None)


@pytest.mark.parametrize("cls", sorted(ALLOCATORS))
def test_allocators_take_from_the_head_of_the_free_list(cls: str) -> None:
    """kv_fragment permutes free_pages and relies on the next request getting its pages in
    that order: every alloc* method only cuts the head off free_pages (what it hands out
    is free_pages[:n], or indexed from the head by the alloc kernels)."""
    assert SRC is not None
    tree = SRC.module(ALLOCATORS[cls])
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    allocs = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("alloc")]
    assert allocs, cls
    for fn in allocs:
        cuts = _assignments_to_free_pages(fn)
        assert cuts and all(_is_head_cut(c) for c in cuts), (cls, fn.name, [ast.unparse(c) for c in cuts])
        sorts = [c for c in ast.walk(fn) if isinstance(c, ast.Call)
                 and ast.unparse(c.func) == "self.merge_and_sort_free"]
        for call in sorts:  # only when the free list runs short (never right after clear())
            guard = next(n for n in ast.walk(fn) if isinstance(n, ast.If)
                         and call in ast.walk(n))
            assert "len(self.free_pages)" in ast.unparse(guard.test), (cls, fn.name)
    picks = [ast.unparse(n) for fn in allocs for n in ast.walk(fn)
             if isinstance(n, ast.Subscript) and ast.unparse(n.value) == "self.free_pages"
             and isinstance(n.slice, ast.Slice) and n.slice.lower is None]
    if cls == "TokenToKVPoolAllocator":
        assert picks == ["self.free_pages[:need_size]"]


def _paged_function(name: str) -> Any:
    """``name`` from the installed paged.py, compiled on its own (the module needs CUDA)."""
    import torch

    assert SRC is not None
    tree = SRC.module(ALLOCATORS["PagedTokenToKVPoolAllocator"])
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), f"<paged.{name}>", "exec"), namespace)
    return namespace[name]


def test_paged_allocation_follows_the_fragmented_free_list() -> None:
    """The allocator's reference (non-Triton) kernels, run on a free list permuted by the
    fragmenter: a new request's pages are the free list's head in order, so it gets the
    fragmentation the fragmenter laid out."""
    import torch

    from pytest_specperf.engines.sglang.kv_fragment import fragment_order, fragmentation

    page, n_pages = 4, 64
    free = torch.tensor(fragment_order(n_pages, 0.5, seed=3), dtype=torch.int64)
    extend = _paged_function("alloc_extend_naive")
    out = torch.empty(10 * page + 2, dtype=torch.int64)  # two requests, 5.5 pages each
    seq = torch.tensor([5 * page + 1, 5 * page + 1])
    extend(torch.zeros(2, dtype=torch.int64), seq, torch.full((2,), -1), free, out, page, "cpu")
    pages = [int(x) for x in torch.unique_consecutive(out // page)]
    assert pages == free[:12].tolist()
    first = pages[:6]
    assert fragmentation(first) == fragmentation(free[:6].tolist())
    decode = _paged_function("alloc_decode_naive")
    out2 = torch.empty(2, dtype=torch.int64)
    decode(torch.tensor([6 * page + 1, 6 * page + 1]), torch.tensor([99, 199]), free[12:], out2,
           page, 2)
    assert (out2 // page).tolist() == free[12:14].tolist()


# -- how SGLang starts schedulers and loads plugins ----------------------------------------------
def test_schedulers_are_spawned_so_only_entry_points_reach_them() -> None:
    """A monkeypatch in the pytest process never reaches a scheduler: SGLang forces the
    spawn start method before starting them, so our code must come in through the entry
    point (tests/test_sglang_loader.py runs that path)."""
    assert SRC is not None
    engine = SRC.module("sglang.srt.entrypoints.engine")
    calls = [ast.unparse(n) for n in ast.walk(engine) if isinstance(n, ast.Call)
             and ast.unparse(n.func).endswith("set_start_method")]
    assert "mp.set_start_method('spawn', force=True)" in calls
    targets = [ast.unparse(k.value) for n in ast.walk(engine) if isinstance(n, ast.Call)
               for k in n.keywords if k.arg == "run_scheduler_process_func"]
    assert targets, "the engine no longer passes run_scheduler_process_func to its launcher"


def test_load_plugins_runs_once_per_process() -> None:
    """load_plugins() returns at once when called again in the same process (our own load()
    guards the same way: hooks are process-wide monkeypatches)."""
    fn = _function("sglang.srt.plugins", "load_plugins")
    body = [s for s in fn.body if not (isinstance(s, ast.Expr)
                                       and isinstance(s.value, ast.Constant))]
    assert isinstance(body[0], ast.Global) and body[0].names == ["_plugins_loaded"]
    guard = body[1]
    assert isinstance(guard, ast.If) and ast.unparse(guard.test) == "_plugins_loaded"
    assert isinstance(guard.body[0], ast.Return)
    assert ast.unparse(body[2]) == "_plugins_loaded = True"
    calls = _calls(fn)
    assert calls.index("load_plugins_by_group") < calls.index("apply_hooks")
