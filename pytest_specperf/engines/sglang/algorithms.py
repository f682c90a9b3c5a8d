"""Which SGLang worker each ``--speculative-algorithm`` runs, and which map families it uses.

Read from SGLang 0.5.23's ``speculative/spec_info.py`` (``SpeculativeAlgorithm.create_worker``;
``tests/test_sglang_contract.py`` re-derives this table from the installed source and fails
when they differ). A worker's *step* is the ``forward_batch_generation`` it runs, which
may be inherited (``StandaloneWorkerV2`` runs ``EAGLEWorkerV2``'s).

An algorithm is measured only if the effective phase map (built-in plus the user's
``SPECPERF_PHASE_MAP``) has a ``role: step`` entry for the step of every worker it may
run, or the user's map has a step entry of one of the algorithm's families (a fork's own
worker, such as a DFlash fork's ``DFlashWorker`` with ``family: dflash-fork``); otherwise
:func:`refusal` says why and how to add a map, and the backend refuses it at launch and
at attach (and the in-server plugin installs nothing).

Families group the built-in map's entries by the workers that reach them; the plugin
installs, for a known algorithm, only the entries of its families (plus entries without a
family or of a family not listed here), so the modules of other algorithms are never
imported. Pure data and string logic: no SGLang import.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_specperf.engines.sglang.phase_map import PhaseMap, is_builtin_source

_SPEC = "sglang.srt.speculative."
FBG = "forward_batch_generation"


@dataclass(frozen=True)
class Worker:
    """A worker class ``spec_info.create_worker`` returns, and the step method it runs."""

    cls: str  # module.Class
    step_owner: str  # module.Class defining the forward_batch_generation it runs
    condition: str | None = None  # e.g. "--enable-multi-layer-eagle"

    @property
    def step(self) -> str:
        return f"{self.step_owner}.{FBG}"


@dataclass(frozen=True)
class Algorithm:
    name: str
    workers: tuple[Worker, ...]
    families: frozenset[str]


_EAGLE_V2 = _SPEC + "eagle_worker_v2.EAGLEWorkerV2"
_EAGLE = Worker(_EAGLE_V2, _EAGLE_V2)
_MULTI = Worker(
    _SPEC + "multi_layer_eagle_worker_v2.MultiLayerEagleWorkerV2",
    _SPEC + "multi_layer_eagle_worker_v2.MultiLayerEagleWorkerV2",
    "--enable-multi-layer-eagle",
)
_EAGLE_FAMILIES = frozenset({"eagle", "eagle-draft", "eagle-multi-layer"})


def _one(module_class: str) -> tuple[Worker, ...]:
    return (Worker(_SPEC + module_class, _SPEC + module_class),)


#: Every built-in algorithm of SGLang 0.5.23 (NEXTN is an alias of EAGLE there).
ALGORITHMS: dict[str, Algorithm] = {
    **{
        name: Algorithm(name, (_EAGLE, _MULTI), _EAGLE_FAMILIES)
        for name in ("EAGLE", "EAGLE3", "NEXTN")
    },
    "STANDALONE": Algorithm(
        "STANDALONE",
        (Worker(_SPEC + "standalone_worker_v2.StandaloneWorkerV2", _EAGLE_V2),),
        frozenset({"eagle", "eagle-draft"}),
    ),
    "FROZEN_KV_MTP": Algorithm(
        "FROZEN_KV_MTP",
        _one("frozen_kv_mtp_worker_v2.FrozenKVMTPWorkerV2"),
        frozenset({"eagle", "frozen-kv-mtp"}),
    ),
    "DFLASH": Algorithm(
        "DFLASH",
        _one("dflash_worker_v2.DFlashWorkerV2"),
        frozenset({"dflash", "dflash-fork"}),
    ),
    # No built-in phase map: refused unless the user's map adds a step entry.
    "NGRAM": Algorithm("NGRAM", _one("ngram_worker.NGRAMWorker"), frozenset()),
    "UNO": Algorithm("UNO", _one("uno_worker_v2.UnoWorkerV2"), frozenset()),
    "DSPARK": Algorithm(
        "DSPARK", _one("dspark_components.dspark_worker_v2.DSparkWorkerV2"), frozenset()
    ),
}
#: Families of the built-in map that some algorithm uses; others are always installed.
KNOWN_FAMILIES: frozenset[str] = frozenset().union(*(a.families for a in ALGORITHMS.values()))
README_SECTION = "docs/sglang.md, 'Extending the phase map for a fork'"


def lookup(algorithm: str | None) -> Algorithm | None:
    """The table entry for ``--speculative-algorithm`` (any case), None if unknown."""
    return ALGORITHMS.get(algorithm.strip().upper()) if algorithm else None


def families_for(algorithm: str | None) -> frozenset[str] | None:
    """Map families the algorithm's workers use; None: unknown algorithm (install all)."""
    algo = lookup(algorithm)
    return algo.families if algo is not None else None


def installs(entry_family: str | None, usable: frozenset[str] | None) -> bool:
    """Whether an entry of ``entry_family`` is installed under families ``usable``."""
    return usable is None or entry_family not in KNOWN_FAMILIES or entry_family in usable


def step_targets(pm: PhaseMap) -> set[str]:
    return {e.target for e in pm.active() if e.role == "step"}


def _how_to_map(step: str) -> str:
    return (
        f"To measure it, write a phase map for that worker: `specperf sglang-check --step "
        f"{step}` lists the calls of its step method with file:line; put a 'role: step' entry "
        f"for {step} and 'role: phase' entries for the methods it calls into a YAML file "
        f"(format: {README_SECTION}) and set SPECPERF_PHASE_MAP to that file, for pytest and "
        "for the server."
    )


def refusal(algorithm: str, pm: PhaseMap, version: str | None = None) -> str | None:
    """Why ``algorithm`` cannot be measured with ``pm`` (None: it can)."""
    steps = step_targets(pm)
    algo = lookup(algorithm)
    release = f"SGLang {version}" if version else "SGLang"
    if algo is None:
        user_steps = sorted(
            e.target for e in pm.active() if e.role == "step" and not is_builtin_source(e.source)
        )
        if user_steps:
            return None  # a fork's own algorithm, with the user's map of its worker
        return (
            f"--speculative-algorithm {algorithm}: not an algorithm of {release} that "
            "pytest-specperf knows (built-in: " + ", ".join(ALGORITHMS) + "), and your phase "
            "map (SPECPERF_PHASE_MAP) has no 'role: step' entry, so no step would be recorded. "
            "For a fork's own algorithm: " + _how_to_map("<module>.<YourWorker>." + FBG)
        )
    declared = [
        e
        for e in pm.active()
        if e.role == "step" and not is_builtin_source(e.source) and e.family in algo.families
    ]
    if declared:
        return None  # the user's map names this algorithm's step (a fork's worker)
    for worker in algo.workers:
        if worker.step not in steps:
            via = f" (with {worker.condition})" if worker.condition else ""
            return (
                f"--speculative-algorithm {algo.name}: pytest-specperf has no phase map for "
                f"{release}'s {algo.name} worker {worker.cls}{via}: its step method "
                f"{worker.step} has no 'role: step' entry, so its decode steps would produce "
                "no step records. " + _how_to_map(worker.step)
            )
    return None
