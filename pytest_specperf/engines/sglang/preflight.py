"""Before a server starts: does the phase map fit the installed SGLang?

The backend runs :func:`check_map` in ``check()`` (launch mode), reading SGLang's source with
``ast`` (no import), and refuses the run, with every problem listed and the fix, when:

- SGLang's version has no built-in map and none was named: a 0.5.24 would otherwise be
  timed with the 0.5.23 map, and a moved method would silently record nothing. Name one with
  ``SPECPERF_SGLANG_MAP`` (a built-in map's version or file name, for a fork or a release
  it fits; ``specperf sglang-check`` says whether it does) or extend it with your own
  ``SPECPERF_PHASE_MAP``;
- a required target of the map, for the algorithm SGLang will actually run, is missing from
  the source (its step would produce no record, its phase would read 0 or move into
  ``unaccounted``);
- a required target's parameters differ from the map's ``params`` (the hooks read
  arguments by position: they would read the wrong ones).

The algorithm is the one SGLang resolves (:func:`resolved_algorithm`): EAGLE/NEXTN with a
Gemma4 assistant draft run as FROZEN_KV_MTP. The server-side plugin builds its map the same
way (:func:`base_map`), so what was checked is what gets installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_specperf.engines.sglang.phase_map import (
    PhaseMap,
    builtin_versions,
    load_builtin,
    load_file,
    version_tuple,
)

#: Names the built-in map to use whatever SGLang's version says (a fork, a release the map
#: fits): a version (``0.5.23``) or a built-in map's file name (``phase_map_0_5_23.yaml``).
ENV_SGLANG_MAP = "SPECPERF_SGLANG_MAP"
#: Draft architectures SGLang turns EAGLE/NEXTN into FROZEN_KV_MTP for (0.5.23,
#: ``arg_groups/speculative_hook.py: _resolve_speculative_algorithm_alias``).
GEMMA4_ASSISTANTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")


class MapMismatch(ValueError):
    """The phase map does not fit the installed SGLang; the message lists why and the fix."""


def resolved_algorithm(algorithm: str | None, draft_config: Mapping[str, Any] | None) -> str | None:
    """``--speculative-algorithm`` as SGLang resolves it before choosing a worker: NEXTN is
    EAGLE, and EAGLE/NEXTN with a Gemma4 assistant draft model is FROZEN_KV_MTP."""
    if algorithm is None:
        return None
    name = algorithm.strip().upper()
    archs = (draft_config or {}).get("architectures") or []
    gemma4 = any(a in GEMMA4_ASSISTANTS for a in archs if isinstance(a, str))
    if name in ("EAGLE", "NEXTN"):
        return "FROZEN_KV_MTP" if gemma4 else "EAGLE"
    return name


def base_map(version: str | None, environ: Mapping[str, str]) -> tuple[PhaseMap, str | None]:
    """The built-in map to start from, and why none fits (None: it fits).

    ``SPECPERF_SGLANG_MAP`` names one explicitly; otherwise the map of exactly this release
    (``0.5.23+fork`` counts as 0.5.23). Without a fit, the newest older map is returned with
    the reason, which the caller refuses unless the user's own map takes over.
    """
    known = builtin_versions()
    names = {name: v for v, name in known}
    named = environ.get(ENV_SGLANG_MAP, "").strip()
    if named:
        by_version = {".".join(map(str, v)): name for v, name in known}
        name = named if named in names else by_version.get(named)
        if name is None:
            raise MapMismatch(
                f"{ENV_SGLANG_MAP}={named!r} is not a built-in phase map: use one of "
                + ", ".join(f"{'.'.join(map(str, v))} ({n})" for v, n in known)
                + ", or your own YAML file with SPECPERF_PHASE_MAP"
            )
        return load_builtin(".".join(map(str, names[name]))), None
    exact = [name for v, name in known if version and v == version_tuple(version)]
    if exact:
        return load_builtin(version), None
    maps = ", ".join(".".join(map(str, v)) for v, _ in known)
    why = (
        f"SGLang {version or '(version unknown)'} has no built-in phase map in pytest-specperf "
        f"(built-in: {maps}). Check whether one fits this SGLang with `specperf sglang-check` "
        f"(it lists missing targets and changed signatures), then name it with "
        f"{ENV_SGLANG_MAP}=<version> (for a fork or a release it fits), or write your own "
        "map and set SPECPERF_PHASE_MAP (both for pytest and the server)"
    )
    return load_builtin(version), why


@dataclass(frozen=True)
class Problem:
    target: str
    what: str  # "missing" | "signature"
    detail: str


def check_map(
    root: Path,
    version: str | None,
    algorithm: str | None,
    environ: Mapping[str, str],
    user_file: str | None,
) -> PhaseMap:
    """The effective map for ``algorithm`` on the SGLang source at ``root``; raises
    :class:`MapMismatch` listing every problem and the fix."""
    from pytest_specperf.engines.sglang.algorithms import families_for, installs
    from pytest_specperf.engines.sglang.check import check_entries
    from pytest_specperf.engines.sglang.source import SourceTree

    pm, no_fit = base_map(version, environ)
    if user_file:
        pm = pm.extended(load_file(user_file))
    elif no_fit is not None:
        raise MapMismatch(no_fit)
    usable = families_for(algorithm)
    entries = [e for e in pm.active() if installs(e.family, usable)]
    problems: list[Problem] = []
    for st in check_entries(SourceTree(root), entries):
        if st.optional or st.status == "found":
            continue
        label = f"{st.target} ({st.phase or st.role}, {st.source})"
        if st.status == "missing":
            problems.append(Problem(label, "missing", st.reason or "not found"))
        else:
            problems.append(
                Problem(
                    label, "signature", f"map expects {st.expected}, {st.where} has {st.actual}"
                )
            )
    if problems:
        lines = [
            f"the phase map does not fit SGLang {version or '(version unknown)'} at {root} "
            f"for --speculative-algorithm {algorithm or '(none)'}:"
        ]
        lines += [f"  {p.what}: {p.target}: {p.detail}" for p in problems]
        lines.append(
            "A missing step target records no step; a missing phase target moves its time into "
            "another phase or 'unaccounted'; a changed signature makes the hooks read the wrong "
            "arguments. Fix: `specperf sglang-check --algorithm "
            f"{algorithm or 'ALGO'}` shows where the code went; write the new targets into "
            "your own map (SPECPERF_PHASE_MAP, format in docs/sglang.md) or install the SGLang "
            "release the built-in map is for"
        )
        raise MapMismatch("\n".join(lines))
    return pm
