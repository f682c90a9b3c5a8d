"""The phase map: which SGLang callable is which phase of a decode step, as data.

The built-in maps ship as ``phase_map_<version>.yaml`` beside this module, one per SGLang
release they were written against; :func:`load_builtin` picks the newest one not newer
than the installed SGLang. Users extend or override a map for their own fork with a YAML
file named by the environment variable ``SPECPERF_PHASE_MAP`` (read inside the SGLang
scheduler processes), in the same format.

File format (YAML, read with ``yaml.safe_load``)::

    schema: 1                      # required, must be 1
    sglang_version: "0.5.23"       # optional: the release the map was written against
    entries:                       # required: a list of mappings
      - target: sglang.srt.speculative.dflash_worker.DFlashWorker._build_ddtree_verify_input
        role: phase                # step | phase | graph | step_result | kv_release
                                   #   | kv_flush | idle | disabled
        phase: build_verify_input  # role phase: schedule, draft, build_verify_input,
                                   #   prepare_for_verify, verify, accept, kv_commit
        params: [self, batch]      # optional: parameter names as written in the source
                                   #   (bare "*" starts keyword-only ones); checked in CI
                                   #   for the built-in map, and used to find arguments
        when: {self_attr: is_draft_worker}  # optional (phase): only if self.<attr> is true,
                                   #   or {arg: is_verify}: only if that argument is true
        outermost: true            # optional (phase): only when no other phase is open
        replay: false              # role graph: true counts a CUDA-graph replay, false an
                                   #   eager forward
        label: MyRunner            # optional (graph): counter name (default: the
                                   #   runner's class name, "[draft]" for draft runners)
        optional: true             # optional: expected to be missing in some versions
        family: dflash-fork        # optional: shown in reports; entries of the built-in
                                   #   families (eagle, eagle-multi-layer, frozen-kv-mtp,
                                   #   dflash, dflash-fork) are skipped when the server's
                                   #   --speculative-algorithm cannot use them
        note: ...                  # optional: free text

``target`` is ``module.function`` or ``module.Class.method``. A user entry whose target
is already in the built-in map replaces that entry; ``role: disabled`` removes it.
Roles: ``step`` marks the speculative worker's ``forward_batch_generation`` (one record
per call; the batch is its ``batch`` argument); ``phase`` times the call as that phase;
``graph`` counts a replay or an eager forward of a runner; the remaining roles are the
scheduler plumbing (accepted tokens, request finish, ``/flush_cache``, idle) and expect
the signatures of the 0.5.23 functions they are mapped to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_specperf.probe.phases import PHASES

SCHEMA_VERSION = 1
ROLES = ("step", "phase", "graph", "step_result", "kv_release", "kv_flush", "idle", "disabled")
_KEYS = {
    "target",
    "role",
    "phase",
    "params",
    "when",
    "outermost",
    "replay",
    "label",
    "optional",
    "family",
    "note",
}
_TARGET_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_PARAM_RE = re.compile(r"^(\*{0,2}[A-Za-z_]\w*|\*)$")
_BUILTIN_RE = re.compile(r"^phase_map_(\d+(?:_\d+)*)\.yaml$")


class PhaseMapError(ValueError):
    """A phase-map file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class HookEntry:
    """One hook target."""

    target: str
    role: str
    phase: str | None = None
    params: tuple[str, ...] | None = None
    when_self_attr: str | None = None
    when_arg: str | None = None
    outermost: bool = False
    replay: bool | None = None
    label: str | None = None
    optional: bool = False
    family: str | None = None
    note: str | None = None
    source: str = "builtin"

    def arg_index(self, name: str) -> int | None:
        """Position of parameter ``name`` in a call (``self`` included), if recorded."""
        if self.params is None:
            return None
        try:
            i = self.params.index(name)
        except ValueError:
            return None
        # Parameters after a bare "*" or "*args" are keyword-only.
        if any(p.startswith("*") for p in self.params[:i]):
            return None
        return i

    def describe(self) -> str:
        what = self.phase if self.role == "phase" else self.role
        if self.role == "graph":
            what = "graph replay" if self.replay else "eager forward"
        return f"{self.target} ({what})"


@dataclass(frozen=True)
class PhaseMap:
    entries: tuple[HookEntry, ...]
    sglang_version: str | None = None
    sources: tuple[str, ...] = field(default_factory=tuple)

    def active(self) -> tuple[HookEntry, ...]:
        return tuple(e for e in self.entries if e.role != "disabled")

    def by_target(self) -> dict[str, HookEntry]:
        return {e.target: e for e in self.entries}

    def extended(self, other: PhaseMap) -> PhaseMap:
        """This map with ``other``'s entries added; same target: ``other`` wins."""
        merged = dict(self.by_target())
        for e in other.entries:
            merged[e.target] = e
        return PhaseMap(
            entries=tuple(merged.values()),
            sglang_version=self.sglang_version,
            sources=(*self.sources, *other.sources),
        )


def version_tuple(version: str) -> tuple[int, ...]:
    """Leading numeric components of a version string (``0.5.23.post1`` -> (0, 5, 23))."""
    out = []
    for part in re.split(r"[.+-]", version):
        m = re.match(r"^\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.group() != part:
            break
    return tuple(out)


def _err(source: str, where: str, problem: str) -> PhaseMapError:
    return PhaseMapError(f"phase map {source}: {where}: {problem}")


def _entry(raw: Any, i: int, source: str) -> HookEntry:
    if not isinstance(raw, Mapping):
        raise _err(source, f"entry {i}", f"must be a mapping, got {type(raw).__name__}")
    target = raw.get("target")
    where = f"entry {i}" + (f" ({target})" if isinstance(target, str) else "")
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise _err(
            source,
            where,
            f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(_KEYS))}",
        )
    if not isinstance(target, str) or not _TARGET_RE.match(target):
        raise _err(
            source, where, "'target' must be a dotted path like sglang.srt.module.Class.method"
        )
    role = raw.get("role")
    if role not in ROLES:
        raise _err(source, where, f"'role' must be one of {', '.join(ROLES)}, got {role!r}")
    phase = raw.get("phase")
    if role == "phase":
        if phase not in PHASES:
            raise _err(source, where, f"'phase' must be one of {', '.join(PHASES)}, got {phase!r}")
    elif phase is not None:
        raise _err(source, where, f"'phase' is only valid with role 'phase' (role is {role!r})")
    params = raw.get("params")
    if params is not None:
        if not isinstance(params, list) or not all(
            isinstance(p, str) and _PARAM_RE.match(p) for p in params
        ):
            raise _err(
                source,
                where,
                "'params' must be a list of parameter names "
                '("*", "*args" and "**kwargs" allowed)',
            )
        params = tuple(params)
    when = raw.get("when")
    when_self_attr = when_arg = None
    if when is not None:
        if role != "phase":
            raise _err(source, where, "'when' is only valid with role 'phase'")
        if (
            not isinstance(when, Mapping)
            or len(when) != 1
            or next(iter(when)) not in ("self_attr", "arg")
        ):
            raise _err(source, where, "'when' must be {self_attr: NAME} or {arg: NAME}")
        key, value = next(iter(when.items()))
        if not isinstance(value, str) or not value.isidentifier():
            raise _err(source, where, f"'when.{key}' must be an identifier, got {value!r}")
        if key == "self_attr":
            when_self_attr = value
        else:
            when_arg = value
    outermost = raw.get("outermost", False)
    if not isinstance(outermost, bool):
        raise _err(source, where, f"'outermost' must be true or false, got {outermost!r}")
    if outermost and role != "phase":
        raise _err(source, where, "'outermost' is only valid with role 'phase'")
    replay = raw.get("replay")
    if role == "graph":
        if not isinstance(replay, bool):
            raise _err(
                source,
                where,
                "role 'graph' needs 'replay: true' (graph replay) or "
                "'replay: false' (eager forward)",
            )
    elif replay is not None:
        raise _err(source, where, "'replay' is only valid with role 'graph'")
    label = raw.get("label")
    if label is not None and (role != "graph" or not isinstance(label, str) or not label):
        raise _err(source, where, "'label' must be a non-empty string, with role 'graph' only")
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        raise _err(source, where, f"'optional' must be true or false, got {optional!r}")
    for key in ("family", "note"):
        if raw.get(key) is not None and not isinstance(raw.get(key), str):
            raise _err(source, where, f"'{key}' must be a string")
    return HookEntry(
        target=target,
        role=role,
        phase=phase,
        params=params,
        when_self_attr=when_self_attr,
        when_arg=when_arg,
        outermost=outermost,
        replay=replay,
        label=label,
        optional=optional,
        family=raw.get("family"),
        note=raw.get("note"),
        source=source,
    )


def parse_map(data: Any, source: str) -> PhaseMap:
    """Validate a loaded YAML document; ``source`` names it in error messages."""
    if not isinstance(data, Mapping):
        raise _err(source, "top level", "must be a mapping with keys schema, entries")
    unknown = sorted(str(k) for k in data if k not in ("schema", "sglang_version", "entries"))
    if unknown:
        raise _err(
            source,
            "top level",
            f"unknown key(s) {', '.join(unknown)}; valid keys: schema, sglang_version, entries",
        )
    if data.get("schema") != SCHEMA_VERSION:
        raise _err(
            source, "top level", f"'schema' must be {SCHEMA_VERSION}, got {data.get('schema')!r}"
        )
    version = data.get("sglang_version")
    if version is not None and not isinstance(version, str):
        raise _err(source, "top level", "'sglang_version' must be a string such as \"0.5.23\"")
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list):
        raise _err(source, "top level", "'entries' must be a list")
    entries: dict[str, HookEntry] = {}
    for i, raw in enumerate(raw_entries):
        entry = _entry(raw, i, source)
        if entry.target in entries:
            raise _err(source, f"entry {i} ({entry.target})", "duplicate target")
        entries[entry.target] = entry
    return PhaseMap(entries=tuple(entries.values()), sglang_version=version, sources=(source,))


def load_file(path: str | Path) -> PhaseMap:
    """Read and validate a phase-map YAML file (a user's fork extension)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PhaseMapError(f"phase map {p}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PhaseMapError(f"phase map {p}: not valid YAML: {e}") from None
    return parse_map(data, str(p))


def builtin_versions() -> list[tuple[tuple[int, ...], str]]:
    """(version, file name) of every built-in map, oldest first."""
    out = []
    for item in resources.files(__package__).iterdir():
        m = _BUILTIN_RE.match(item.name)
        if m:
            out.append((tuple(int(x) for x in m.group(1).split("_")), item.name))
    return sorted(out)


def builtin_name_for(version: str | None) -> str:
    """File name of the built-in map for SGLang ``version`` (newest not newer than it)."""
    known = builtin_versions()
    if not known:
        raise PhaseMapError("no built-in phase map found beside pytest_specperf.engines.sglang")
    if version is None:
        return known[-1][1]
    want = version_tuple(version)
    older = [name for v, name in known if v <= want]
    return older[-1] if older else known[0][1]


def load_builtin(version: str | None = None) -> PhaseMap:
    """The built-in map for SGLang ``version`` (None: the newest)."""
    import yaml

    name = builtin_name_for(version)
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return parse_map(yaml.safe_load(text), name)


def load_effective(version: str | None, user_file: str | None) -> PhaseMap:
    """Built-in map for ``version`` extended by ``user_file`` (if given)."""
    pm = load_builtin(version)
    if user_file:
        pm = pm.extended(load_file(user_file))
    return pm
