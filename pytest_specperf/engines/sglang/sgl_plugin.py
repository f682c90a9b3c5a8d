"""SGLang plugin entry point: ``sglang.srt.plugins`` -> ``specperf = ...sgl_plugin:load``.

SGLang calls :func:`load` in every one of its processes (launcher, tokenizer, detokenizer,
each scheduler) at start-up, then ``HookRegistry.apply_hooks()``. ``load`` does nothing
(and imports nothing beyond ``os``, ``sys`` and ``contextlib``) unless
``SPECPERF_SGLANG_PLUGIN=1``, which our launcher sets, and nothing outside scheduler
processes (it recognises one by being called from SGLang's ``run_scheduler_process``,
whose ``tp_rank`` it reads). In a scheduler it:

- builds the phase map for the installed SGLang version, extended by the file named in
  ``SPECPERF_PHASE_MAP`` if any; if that file does not validate, or the server's
  ``--speculative-algorithm`` has no step entry in the map (NGRAM, UNO and DSPARK have
  none built in: see :mod:`.algorithms`), it registers **nothing** and says why in the
  report (``refused``);
- resolves every target (importing its module, as ``HookRegistry.apply_hooks`` would),
  skipping the families of the map the server's algorithm cannot use; targets missing in
  this SGLang are listed, not fatal, and a module that exists but fails to import is
  reported as such (``kind: import_failed``), not as a missing attribute;
- registers one AROUND hook per found target with ``HookRegistry``;
- writes the report ``hooks-pid<P>-rank<R>.json`` into ``SPECPERF_RUN_DIR`` (targets
  installed, missing, and with a changed signature).

The probe itself (``StepProbe`` and its sink) is created on the first decode step, in
the scheduler process, after CUDA is initialised. No exception leaves :func:`load`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any

# engines.env imports only the standard library: this module stays cheap in every process
from pytest_specperf.engines.env import ENV_PHASE_MAP, ENV_RUN_DIR, ENV_SGLANG_PLUGIN

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
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        log.warning(
            "%s=1 but %s is not set: pytest-specperf probe stays off",
            ENV_SGLANG_PLUGIN,
            ENV_RUN_DIR,
        )
        return
    try:
        _runtime = _start(ctx, run_dir, log)
    except Exception as e:  # never take the server down
        log.exception("pytest-specperf plugin failed to load: %s", e)


def _start(ctx: dict[str, Any], run_dir: str, log: Any) -> ProbeRuntime:
    """Build this scheduler's runtime, register its hooks, write the hooks report."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from pytest_specperf.engines.env import probe_setup
    from pytest_specperf.engines.sglang.hooks import ProbeRuntime
    from pytest_specperf.engines.sglang.source import installed_version

    version = installed_version()
    algo = _algorithm(ctx)
    # SPECPERF_INJECT and SPECPERF_NVTX: the one probe-from-environment setup; the run
    # dir's control file switches injections while the server runs (attach-mode canaries)
    device = _device(ctx)
    setup = probe_setup(device=device, labels=_labels(ctx, version, algo), run_dir=run_dir)
    rt = ProbeRuntime(
        run_dir,
        rank=_int(ctx.get("tp_rank")),
        labels=dict(setup.labels),
        injector=setup.injector,
        nvtx=setup.nvtx,
        kernel_every=setup.kernel_every,
        control=setup.control,
    )
    if rt.sink is not None:  # the progress the client watches for a frozen server
        rt.sink.start_heartbeat()
    pm, refused = _effective_map(version, algo)

    def register(target: str, hook: Any) -> None:
        HookRegistry.register(target, hook, HookType.AROUND)

    if refused is None:
        report = install(rt, pm, register, resolve_target, algo)
    else:
        log.error("pytest-specperf: %s (no hook installed)", refused)
        report = hooks_report(pm, algo, refused)
    report.update(process=_process_info(ctx), sglang_version=version)
    if rt.sink is not None:
        rt.sink.write_meta(f"hooks-{rt.meta_suffix}", report)
    missing = [m["target"] for m in report["missing"] if not m["optional"]]
    if missing:
        log.warning(
            "pytest-specperf: %d hook target(s) not usable in sglang %s: %s",
            len(missing),
            version,
            ", ".join(missing),
        )
    return rt


def _device(ctx: dict[str, Any]) -> str:
    """The scheduler's device (``--device``: cuda, cpu, npu, ...; SGLang's resolved value),
    ``cuda`` when unknown."""
    device = getattr(ctx.get("server_args"), "device", None)
    return str(device) if isinstance(device, str) and device else "cuda"


def _algorithm(ctx: dict[str, Any]) -> str | None:
    """The algorithm SGLang resolved and runs: ``server_args.speculative_algorithm`` is the
    typed input, which SGLang's resolution may override (EAGLE/NEXTN with a Gemma4
    assistant draft becomes FROZEN_KV_MTP); ``overrides.resolution_result`` reads the
    resolved value."""
    args = ctx.get("server_args")
    algo = getattr(args, "speculative_algorithm", None)
    # loaded in every scheduler by sglang.srt.server_args (ServerArgs's own module): read,
    # never imported here (it pulls triton)
    overrides = sys.modules.get("sglang.srt.arg_groups.overrides")
    if args is not None and overrides is not None:
        # an SGLang without the resolution record: the typed field
        with contextlib.suppress(Exception):
            algo = overrides.resolution_result(args, "speculative_algorithm", algo)
    return None if algo is None else str(getattr(algo, "name", algo))


def _labels(ctx: dict[str, Any], version: str | None, algo: str | None) -> dict[str, str]:
    labels = {"engine": "sglang", "sglang_version": str(version)}
    for key in ("tp_rank", "pp_rank", "dp_rank", "gpu_id"):
        if ctx.get(key) is not None:
            labels[key] = str(ctx[key])
    if algo is not None:
        labels["speculative_algorithm"] = algo
    return labels


def _effective_map(version: str | None, algo: str | None) -> tuple[PhaseMap, str | None]:
    """The map to install and, if nothing may be installed, why.

    A user map (``SPECPERF_PHASE_MAP``) that does not validate installs nothing at all (not
    the built-in map alone: a half-applied map would measure something else than asked);
    neither does an algorithm without a step entry in the map.
    """
    from pytest_specperf.engines.sglang import algorithms, preflight
    from pytest_specperf.engines.sglang.phase_map import PhaseMapError, load_builtin, load_file

    try:
        pm, no_fit = preflight.base_map(version, os.environ)
    except preflight.MapMismatch as e:
        return load_builtin(version), str(e)
    user_file = os.environ.get(ENV_PHASE_MAP)
    if user_file:
        try:
            pm = pm.extended(load_file(user_file))
        except PhaseMapError as e:
            return pm, str(e)
    elif no_fit is not None:
        return pm, no_fit  # the same refusal as before launch: no map for this release
    if algo is not None:
        return pm, algorithms.refusal(algo, pm, version)
    return pm, None


def hooks_report(pm: PhaseMap, algorithm: str | None, refused: str | None = None) -> dict[str, Any]:
    """A scheduler's hooks report before any hook is installed: empty lists, and why it
    installs nothing when it ``refused``."""
    return {
        "phase_map": list(pm.sources),
        "speculative_algorithm": algorithm,
        "installed": [],
        "missing": [],
        "signature_changed": [],
        "not_for_this_algorithm": [],
        "refused": refused,
        "phase_map_error": refused if refused and refused.startswith("phase map ") else None,
    }


def install(
    rt: ProbeRuntime,
    pm: PhaseMap,
    register: Any,
    resolve: Any,
    algorithm: str | None = None,
) -> dict[str, Any]:
    """Register a hook for every resolvable entry of ``pm``; return the hooks report.

    ``register(target, hook)`` registers an AROUND hook; ``resolve(target)`` returns the
    callable at ``target`` (importing its module) or raises: the target is missing
    (:class:`TargetImportError`: its module exists but failed to import).
    ``algorithm``: the server's ``--speculative-algorithm``, to skip other families.
    """
    from pytest_specperf.engines.sglang.algorithms import families_for, installs
    from pytest_specperf.engines.sglang.hooks import make_hook

    usable = families_for(algorithm)
    report = hooks_report(pm, algorithm)
    for entry in pm.active():
        if not installs(entry.family, usable):
            report["not_for_this_algorithm"].append(entry.target)
            continue
        try:
            fn = resolve(entry.target)
        except Exception as e:
            kind = "import_failed" if isinstance(e, TargetImportError) else "not_found"
            report["missing"].append(_describe(entry, kind=kind, reason=_reason(e)))
            continue
        if entry.params is not None:
            actual = runtime_params(fn)
            if actual is not None and actual != entry.params:
                report["signature_changed"].append(
                    _describe(entry, expected=list(entry.params), actual=list(actual))
                )
        try:
            register(entry.target, make_hook(entry, rt))
        except Exception as e:
            report["missing"].append(
                _describe(entry, kind="register_failed", reason=f"register failed: {_reason(e)}")
            )
            continue
        report["installed"].append(_describe(entry))
    return report


def _reason(e: BaseException) -> str:
    return str(e) if isinstance(e, TargetImportError) else f"{type(e).__name__}: {e}"


class TargetImportError(ImportError):
    """A hook target's module exists but raised while being imported."""


def resolve_target(target: str) -> Any:
    """The object at dotted ``target``, importing its module as HookRegistry will.

    Unlike ``pkgutil.resolve_name`` (which swallows the ImportError of a module that
    exists and reports an AttributeError of its parent instead), a module that exists but
    fails to import raises :class:`TargetImportError` naming the module and the error.
    """
    import importlib
    import importlib.util

    parts = target.split(".")
    obj: Any = None
    i = 0
    while i < len(parts) - 1:  # the last part is always an attribute
        name = ".".join(parts[: i + 1])
        if i and not hasattr(obj, "__path__"):
            break  # obj is a module without submodules: the rest are attributes
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            if i == 0:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            break
        try:
            obj = importlib.import_module(name)
        except Exception as e:
            raise TargetImportError(
                f"import failed: module {name} exists but importing it raised "
                f"{type(e).__name__}: {e}"
            ) from e
        i += 1
    for attr in parts[i:-1]:
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            owner = getattr(obj, "__name__", obj)
            raise AttributeError(f"{owner} has no attribute {attr!r}") from None
    return _member(obj, ".".join(parts[:-1]), parts[-1])


def _member(obj: Any, obj_path: str, attr: str) -> Any:
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if attr in vars(klass):
                raw = vars(klass)[attr]
                return getattr(raw, "__func__", raw)
        raise AttributeError(f"{obj_path} has no attribute {attr!r}")
    try:
        return getattr(obj, attr)
    except AttributeError:
        raise AttributeError(f"{obj_path} has no attribute {attr!r}") from None


def runtime_params(fn: Any) -> tuple[str, ...] | None:
    """Parameter names of ``fn`` in the phase-map notation (see source.signature_params).

    A decorated method is read through ``__wrapped__`` (SGLang wraps scheduler methods with
    ``functools.wraps``, e.g. ``@scheduler_stage_method``): such a wrapper passes its
    arguments through in the same positions, which is what the hooks read, and the source
    check (``ast``) sees the wrapped definition too.
    """
    import inspect

    try:
        sig = inspect.signature(fn)
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
    if entry.may_not_fire:
        d["may_not_fire"] = True
    if entry.phase:
        d["phase"] = entry.phase
    elif entry.role == "iteration":
        d["phase"] = "ingest"  # the iteration hook times its call as ingest
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
