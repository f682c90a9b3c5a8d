"""SGLang plugin entry point: ``sglang.srt.plugins`` -> ``specperf = ...sgl_plugin:load``.

SGLang calls :func:`load` in every one of its processes (launcher, tokenizer, detokenizer,
each scheduler) at start-up, then ``HookRegistry.apply_hooks()``. ``load`` does nothing
(and imports nothing beyond ``os``/``sys``) unless ``SPECPERF_SGLANG_PLUGIN=1``, which our
launcher sets, and nothing outside scheduler processes (it recognises one by being called
from SGLang's ``run_scheduler_process``, whose ``tp_rank`` it reads). In a scheduler it:

- builds the phase map for the installed SGLang version, extended by the file named in
  ``SPECPERF_PHASE_MAP`` if any;
- resolves every target (importing its module, as ``HookRegistry.apply_hooks`` would),
  skipping the families of the map the server's ``--speculative-algorithm`` cannot use;
  targets missing in this SGLang are listed, not fatal;
- registers one AROUND hook per found target with ``HookRegistry``;
- writes the report ``hooks-pid<P>-rank<R>.json`` into ``SPECPERF_RUN_DIR`` (targets
  installed, missing, and with a changed signature).

The probe itself (``StepProbe`` and its sink) is created on the first decode step, in
the scheduler process, after CUDA is initialised. No exception leaves :func:`load`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

# engines.env imports only the standard library: this module stays cheap to import in
# every SGLang process.
from pytest_specperf.engines.env import (
    ENV_PHASE_MAP,
    ENV_RUN_DIR,
    ENV_SGLANG_PLUGIN,
    probe_setup,
    run_dir_from_env,
)

if TYPE_CHECKING:
    from pytest_specperf.engines.sglang.hooks import ProbeRuntime
    from pytest_specperf.engines.sglang.phase_map import HookEntry, PhaseMap

#: The one piece of module state: the runtime of this process once its hooks are
#: registered. SGLang's hooks are process-wide monkeypatches, so registration must
#: happen at most once per process (SGLang guards load_plugins() the same way), and the
#: hooks' state lives exactly as long as the process.
_runtime: ProbeRuntime | None = None


def load() -> None:
    """Entry point called by SGLang's ``load_plugins()``."""
    global _runtime
    if os.environ.get(ENV_SGLANG_PLUGIN) != "1" or _runtime is not None:
        return
    ctx = scheduler_context()
    if ctx is None:
        return  # launcher, tokenizer, detokenizer, DP controller: nothing to do
    import logging

    log = logging.getLogger("pytest_specperf.sglang")
    run_dir = run_dir_from_env()
    if not run_dir:
        log.warning(
            "%s=1 but %s is not set: pytest-specperf probe stays off",
            ENV_SGLANG_PLUGIN,
            ENV_RUN_DIR,
        )
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from pytest_specperf.engines.sglang.phase_map import PhaseMapError, load_builtin, load_file
        from pytest_specperf.engines.sglang.source import installed_version

        version = installed_version()
        algo = getattr(ctx.get("server_args"), "speculative_algorithm", None)
        algo = None if algo is None else str(getattr(algo, "name", algo))
        rt = _probe_runtime(ctx, run_dir, version, algo)
        pm = load_builtin(version)
        map_error = None
        user_file = os.environ.get(ENV_PHASE_MAP)
        if user_file:
            try:
                pm = pm.extended(load_file(user_file))
            except PhaseMapError as e:
                map_error = str(e)
                log.error("pytest-specperf: %s (built-in map used alone)", e)

        def register(target: str, hook: Any) -> None:
            HookRegistry.register(target, hook, HookType.AROUND)

        report = install(rt, pm, register, resolve_target, algo)
        report.update(process=_process_info(ctx), sglang_version=version, phase_map_error=map_error)
        if rt.sink is not None:
            rt.sink.write_meta(f"hooks-{rt.meta_suffix}", report)
        missing = [m["target"] for m in report["missing"] if not m["optional"]]
        if missing:
            log.warning(
                "pytest-specperf: %d hook target(s) not found in sglang %s: %s",
                len(missing),
                version,
                ", ".join(missing),
            )
        _runtime = rt
    except Exception as e:  # never take the server down
        log.exception("pytest-specperf plugin failed to load: %s", e)


def _probe_runtime(
    ctx: dict[str, Any], run_dir: str, version: str | None, algo: str | None
) -> ProbeRuntime:
    """This scheduler's probe runtime: its labels, plus the environment's probe setup."""
    from pytest_specperf.engines.sglang.hooks import ProbeRuntime

    labels = {"engine": "sglang", "sglang_version": str(version)}
    for key in ("tp_rank", "pp_rank", "dp_rank", "gpu_id"):
        if ctx.get(key) is not None:
            labels[key] = str(ctx[key])
    if algo is not None:
        labels["speculative_algorithm"] = algo
    setup = probe_setup(device="cuda", labels=labels)  # SPECPERF_INJECT, SPECPERF_NVTX
    return ProbeRuntime(
        run_dir,
        rank=_int(ctx.get("tp_rank")),
        labels=dict(setup.labels),
        injector=setup.injector,
        nvtx=setup.nvtx,
    )


#: Which families of the phase map each speculative algorithm can use. Entries of a
#: known family that the server's algorithm cannot use are skipped (their modules are not
#: imported); entries without a family, of another family, or under an unknown algorithm
#: are always installed.
ALGORITHM_FAMILIES: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"),
        frozenset({"eagle", "eagle-multi-layer", "frozen-kv-mtp"}),
    ),
    "DFLASH": frozenset({"dflash", "dflash-fork"}),
}
KNOWN_FAMILIES = frozenset().union(*ALGORITHM_FAMILIES.values())


def install(
    rt: ProbeRuntime,
    pm: PhaseMap,
    register: Any,
    resolve: Any,
    algorithm: str | None = None,
) -> dict[str, Any]:
    """Register a hook for every resolvable entry of ``pm``; return the hooks report.

    ``register(target, hook)`` registers an AROUND hook; ``resolve(target)`` returns the
    callable at ``target`` (importing its module) or raises: the target is missing.
    ``algorithm``: the server's ``--speculative-algorithm``, to skip other families.
    """
    from pytest_specperf.engines.sglang.hooks import make_hook

    usable = ALGORITHM_FAMILIES.get(str(algorithm).upper()) if algorithm else None
    installed: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    changed: list[dict[str, Any]] = []
    skipped: list[str] = []
    for entry in pm.active():
        if usable is not None and entry.family in KNOWN_FAMILIES and entry.family not in usable:
            skipped.append(entry.target)
            continue
        try:
            fn = resolve(entry.target)
        except Exception as e:
            missing.append(_describe(entry, reason=f"{type(e).__name__}: {e}"))
            continue
        if entry.params is not None:
            actual = runtime_params(fn)
            if actual is not None and actual != entry.params:
                changed.append(_describe(entry, expected=list(entry.params), actual=list(actual)))
        try:
            register(entry.target, make_hook(entry, rt))
        except Exception as e:
            missing.append(_describe(entry, reason=f"register failed: {type(e).__name__}: {e}"))
            continue
        installed.append(_describe(entry))
    return {
        "phase_map": list(pm.sources),
        "speculative_algorithm": algorithm,
        "installed": installed,
        "missing": missing,
        "signature_changed": changed,
        "not_for_this_algorithm": skipped,
    }


def resolve_target(target: str) -> Any:
    """The object at dotted ``target`` (imports its module, as HookRegistry will)."""
    import pkgutil

    obj_path, _, attr = target.rpartition(".")
    obj = pkgutil.resolve_name(obj_path)
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if attr in vars(klass):
                raw = vars(klass)[attr]
                return getattr(raw, "__func__", raw)
        raise AttributeError(f"{obj_path} has no attribute {attr!r}")
    return getattr(obj, attr)


def runtime_params(fn: Any) -> tuple[str, ...] | None:
    """Parameter names of ``fn`` in the phase-map notation (see source.signature_params)."""
    import inspect

    try:
        sig = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return None
    out: list[str] = []
    star = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                out.append("*")
                star = True
            out.append(p.name)
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            out.append(p.name)
    return tuple(out)


def scheduler_context(max_depth: int = 16) -> dict[str, Any] | None:
    """Locals of SGLang's ``run_scheduler_process`` if it is on the call stack."""
    frame = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        if frame.f_code.co_name == "run_scheduler_process":
            loc = frame.f_locals
            return {
                k: loc.get(k) for k in ("tp_rank", "pp_rank", "dp_rank", "gpu_id", "server_args")
            }
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _describe(entry: HookEntry, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "target": entry.target,
        "role": entry.role,
        "source": entry.source,
        "optional": entry.optional,
    }
    if entry.phase:
        d["phase"] = entry.phase
    if entry.family:
        d["family"] = entry.family
    d.update(extra)
    return d


def _process_info(ctx: dict[str, Any]) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        **{k: ctx.get(k) for k in ("tp_rank", "pp_rank", "dp_rank", "gpu_id")},
    }


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
