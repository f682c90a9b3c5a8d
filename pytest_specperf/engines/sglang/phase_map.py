"""The phase map: which SGLang callable is which phase of a decode step, as data.

The built-in maps ship as ``phase_map_<version>.yaml`` beside this module, one per SGLang
release they were written against; :func:`load_builtin` picks the newest one not newer
than the installed SGLang. Users extend or override a map for their own fork with a YAML
file named by the environment variable ``SPECPERF_PHASE_MAP`` (read inside the SGLang
scheduler processes), in the same format. ``example_dflash_ddtree_fork.yaml`` beside this
module is such a file for a DFlash fork with DDTree verification.

File format (YAML, read with ``yaml.safe_load``; explicit tags such as ``!!python/...``
are refused)::

    schema: 1                      # required, must be 1
    sglang_version: "0.5.23"       # optional: the release the map was written against
    entries:                       # required: a list of mappings
      - target: sglang.srt.speculative.dflash_worker.DFlashWorker._build_ddtree_verify_input
        role: phase                # step | iteration | phase | graph | step_result
                                   #   | kv_release | kv_flush | idle | disabled
        phase: build_verify_input  # role phase: ingest, schedule, launch, draft,
                                   #   build_verify_input, prepare_for_verify, verify,
                                   #   accept, kv_commit, postprocess, output
        params: [self, batch]      # optional: parameter names as written in the source
                                   #   (bare "*" starts keyword-only ones); checked in CI
                                   #   for the built-in map, and used to find arguments
        when: {self_attr: is_draft_worker}  # optional (phase, graph): only if
                                   #   self.<attr> is true; or {arg: is_verify}: only if
                                   #   that argument is true; or {not_arg: step}: only if
                                   #   that argument is false (0, None, False)
        outermost: true            # optional (phase): only when no other phase is open
        replay: false              # role graph: true counts a CUDA-graph replay, false an
                                   #   eager forward
        label: MyRunner            # optional (graph): counter name (default: the
                                   #   runner's class name, "[draft]" for draft runners)
        optional: true             # optional: expected to be missing in some versions
        may_not_fire: true         # optional (phase): on a path some configurations never
                                   #   take; --specperf-strict does not require it to fire
        family: dflash-fork        # optional: shown in reports; entries of the built-in
                                   #   families (see algorithms.py) are skipped when the
                                   #   server's --speculative-algorithm cannot use them
        note: ...                  # optional: free text

``target`` is ``sglang.module.function`` or ``sglang.module.Class.method``: the plugin
patches SGLang (or a fork of it) and nothing else. A user entry whose target is already in
the built-in map replaces that entry; ``role: disabled`` removes it. Within one file a
target appears once. Roles: ``step`` marks the speculative worker's
``forward_batch_generation`` (the batch is its ``batch`` argument; its own time outside
the phases nested in it is ``unaccounted``); ``iteration`` marks the first call of every
scheduler event-loop iteration (``Scheduler.ingest_requests``, timed as ``ingest``): with
it a record spans one iteration that ran a step, from its start to the next iteration's
start, and the scheduler's own work in it is timed by the host-phase entries (``schedule``,
``launch``, ``postprocess``, ``output``); without it a record is the step call alone;
``phase`` times the call as that phase; ``graph`` counts a replay or an eager forward of a
runner; the remaining roles are the scheduler plumbing (accepted tokens, request finish,
``/flush_cache``, idle) and expect the signatures of the 0.5.23 functions they are
mapped to. Every error names the file, the line and the entry.
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
ROLES = (
    "step",
    "iteration",
    "phase",
    "graph",
    "step_result",
    "kv_release",
    "kv_flush",
    "idle",
    "disabled",
)
#: Roles whose entries may carry a ``when`` condition.
CONDITIONAL_ROLES = ("phase", "graph")
WHEN_KEYS = ("self_attr", "arg", "not_arg")
#: Every target lives in this package (SGLang or a fork of it).
TARGET_PACKAGE = "sglang"
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
    "may_not_fire",
    "family",
    "note",
}
_TOP_KEYS = ("schema", "sglang_version", "entries")
_TARGET_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_PARAM_RE = re.compile(r"^(\*{0,2}[A-Za-z_]\w*|\*)$")
_BUILTIN_RE = re.compile(r"^phase_map_(\d+(?:_\d+)*)\.yaml$")
EXAMPLE_FORK_MAP = "example_dflash_ddtree_fork.yaml"


class PhaseMapError(ValueError):
    """A phase-map file is malformed; the message names the file, the line and the entry."""


@dataclass(frozen=True)
class HookEntry:
    """One hook target."""

    target: str
    role: str
    phase: str | None = None
    params: tuple[str, ...] | None = None
    when_self_attr: str | None = None
    when_arg: str | None = None
    when_not_arg: str | None = None
    outermost: bool = False
    replay: bool | None = None
    label: str | None = None
    optional: bool = False
    #: on a path some configurations never take (e.g. only the overlap loop calls it):
    #: ``--specperf-strict`` does not require it to time a call
    may_not_fire: bool = False
    family: str | None = None
    note: str | None = None
    source: str = "builtin"
    line: int | None = None

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

    @property
    def owner(self) -> str | None:
        """``module.Class`` of a method target (by the capitalised class name), else None."""
        head, _, _ = self.target.rpartition(".")
        return head if head.rpartition(".")[2][:1].isupper() else None

    def describe(self) -> str:
        what = self.phase if self.role == "phase" else self.role
        if self.role == "graph":
            what = "graph replay" if self.replay else "eager forward"
        return f"{self.target} ({what})"

    def where(self) -> str:
        """``file:line`` of the entry, for messages."""
        return f"{self.source}:{self.line}" if self.line else self.source


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


# -- where things are in the file --------------------------------------------------------------
class Lines:
    """Line numbers (1-based) of the top-level keys, entries and entry keys of a map file."""

    def __init__(self, node: Any = None) -> None:
        self._top: dict[str, int] = {}
        self._entries: list[int] = []
        self._keys: list[dict[str, int]] = []
        if node is not None:
            self._read(node)

    def _read(self, node: Any) -> None:
        import yaml

        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            name = str(key.value)
            self._top[name] = key.start_mark.line + 1
            if name == "entries" and isinstance(value, yaml.SequenceNode):
                for item in value.value:
                    self._entries.append(item.start_mark.line + 1)
                    keys: dict[str, int] = {}
                    if isinstance(item, yaml.MappingNode):
                        keys = {str(k.value): k.start_mark.line + 1 for k, _ in item.value}
                    self._keys.append(keys)

    def top(self, key: str) -> int | None:
        return self._top.get(key)

    def entry(self, i: int, key: str | None = None) -> int | None:
        if i >= len(self._entries):
            return None
        if key is not None and key in self._keys[i]:
            return self._keys[i][key]
        return self._entries[i]


def _err(source: str, where: str, problem: str, line: int | None = None) -> PhaseMapError:
    at = f"{source}:{line}" if line else source
    return PhaseMapError(f"phase map {at}: {where}: {problem}")


class _EntryReader:
    """Validates one raw entry; every error names the file, the line and the entry."""

    def __init__(self, raw: Mapping[Any, Any], i: int, source: str, lines: Lines) -> None:
        self.raw, self.i, self.source, self.lines = raw, i, source, lines
        target = raw.get("target")
        self.where = f"entry {i}" + (f" ({target})" if isinstance(target, str) else "")

    def fail(self, problem: str, key: str | None = None) -> PhaseMapError:
        return _err(self.source, self.where, problem, self.lines.entry(self.i, key))

    def target(self) -> str:
        target = self.raw.get("target")
        if not isinstance(target, str) or not _TARGET_RE.match(target):
            raise self.fail(
                "'target' must be a dotted path like sglang.srt.module.Class.method", "target"
            )
        if target.split(".", 1)[0] != TARGET_PACKAGE:
            raise self.fail(
                f"'target' {target!r} is outside SGLang: the plugin only patches callables of "
                f"the {TARGET_PACKAGE} package (SGLang or your fork of it), such as "
                "sglang.srt.speculative.dflash_worker.DFlashWorker.forward_batch_generation",
                "target",
            )
        return target

    def role_and_phase(self) -> tuple[str, str | None]:
        role = self.raw.get("role")
        if role not in ROLES:
            raise self.fail(f"'role' must be one of {', '.join(ROLES)}, got {role!r}", "role")
        phase = self.raw.get("phase")
        if role == "phase":
            if phase not in PHASES:
                raise self.fail(
                    f"'phase' must be one of {', '.join(PHASES)}, got {phase!r}", "phase"
                )
        elif phase is not None:
            raise self.fail(f"'phase' is only valid with role 'phase' (role is {role!r})", "phase")
        return str(role), phase

    def params(self) -> tuple[str, ...] | None:
        params = self.raw.get("params")
        if params is None:
            return None
        if not isinstance(params, list) or not all(
            isinstance(p, str) and _PARAM_RE.match(p) for p in params
        ):
            raise self.fail(
                "'params' must be a list of parameter names "
                '("*", "*args" and "**kwargs" allowed)',
                "params",
            )
        return tuple(params)

    def when(self, role: str) -> dict[str, str]:
        when = self.raw.get("when")
        if when is None:
            return {}
        if role not in CONDITIONAL_ROLES:
            raise self.fail(
                f"'when' is only valid with role {' or '.join(map(repr, CONDITIONAL_ROLES))}",
                "when",
            )
        if not isinstance(when, Mapping) or len(when) != 1 or next(iter(when)) not in WHEN_KEYS:
            raise self.fail(
                "'when' must be {self_attr: NAME}, {arg: NAME} or {not_arg: NAME}", "when"
            )
        key, value = next(iter(when.items()))
        if not isinstance(value, str) or not value.isidentifier():
            raise self.fail(f"'when.{key}' must be an identifier, got {value!r}", "when")
        return {str(key): value}

    def flags(self, role: str) -> tuple[bool, bool | None, str | None, bool]:
        outermost = self.raw.get("outermost", False)
        if not isinstance(outermost, bool):
            raise self.fail(f"'outermost' must be true or false, got {outermost!r}", "outermost")
        if outermost and role != "phase":
            raise self.fail("'outermost' is only valid with role 'phase'", "outermost")
        replay = self.raw.get("replay")
        if role == "graph" and not isinstance(replay, bool):
            raise self.fail(
                "role 'graph' needs 'replay: true' (graph replay) or "
                "'replay: false' (eager forward)",
                "replay",
            )
        if role != "graph" and replay is not None:
            raise self.fail("'replay' is only valid with role 'graph'", "replay")
        label = self.raw.get("label")
        if label is not None and (role != "graph" or not isinstance(label, str) or not label):
            raise self.fail("'label' must be a non-empty string, with role 'graph' only", "label")
        optional = self.raw.get("optional", False)
        if not isinstance(optional, bool):
            raise self.fail(f"'optional' must be true or false, got {optional!r}", "optional")
        may_not_fire = self.raw.get("may_not_fire", False)
        if not isinstance(may_not_fire, bool):
            raise self.fail(
                f"'may_not_fire' must be true or false, got {may_not_fire!r}", "may_not_fire"
            )
        if may_not_fire and role != "phase":
            raise self.fail("'may_not_fire' is only valid with role 'phase'", "may_not_fire")
        for key in ("family", "note"):
            if self.raw.get(key) is not None and not isinstance(self.raw.get(key), str):
                raise self.fail(f"'{key}' must be a string", key)
        return outermost, replay, label, optional


def _entry(raw: Any, i: int, source: str, lines: Lines | None = None) -> HookEntry:
    lines = lines or Lines()
    if not isinstance(raw, Mapping):
        raise _err(
            source, f"entry {i}", f"must be a mapping, got {type(raw).__name__}", lines.entry(i)
        )
    r = _EntryReader(raw, i, source, lines)
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise r.fail(
            f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(_KEYS))}",
            unknown[0],
        )
    target = r.target()
    role, phase = r.role_and_phase()
    params = r.params()
    when = r.when(role)
    outermost, replay, label, optional = r.flags(role)
    return HookEntry(
        target=target,
        role=role,
        phase=phase,
        params=params,
        when_self_attr=when.get("self_attr"),
        when_arg=when.get("arg"),
        when_not_arg=when.get("not_arg"),
        outermost=outermost,
        replay=replay,
        label=label,
        optional=optional,
        may_not_fire=bool(raw.get("may_not_fire", False)),
        family=raw.get("family"),
        note=raw.get("note"),
        source=source,
        line=lines.entry(i),
    )


def parse_map(data: Any, source: str, lines: Lines | None = None) -> PhaseMap:
    """Validate a loaded YAML document; ``source`` names it in error messages and
    ``lines`` (from :func:`load_text`) gives the line of each entry."""
    lines = lines or Lines()
    if not isinstance(data, Mapping):
        raise _err(source, "top level", "must be a mapping with keys schema, entries", 1)
    unknown = sorted(str(k) for k in data if k not in _TOP_KEYS)
    if unknown:
        raise _err(
            source,
            "top level",
            f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_TOP_KEYS)}",
            lines.top(unknown[0]),
        )
    if data.get("schema") != SCHEMA_VERSION:
        raise _err(
            source,
            "top level",
            f"'schema' must be {SCHEMA_VERSION}, got {data.get('schema')!r}",
            lines.top("schema"),
        )
    version = data.get("sglang_version")
    if version is not None and not isinstance(version, str):
        raise _err(
            source,
            "top level",
            "'sglang_version' must be a string such as \"0.5.23\"",
            lines.top("sglang_version"),
        )
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list):
        raise _err(source, "top level", "'entries' must be a list", lines.top("entries"))
    entries: dict[str, HookEntry] = {}
    for i, raw in enumerate(raw_entries):
        entry = _entry(raw, i, source, lines)
        first = entries.get(entry.target)
        if first is not None:
            at = f" (first at line {first.line})" if first.line else ""
            raise _err(source, f"entry {i} ({entry.target})", f"duplicate target{at}", entry.line)
        entries[entry.target] = entry
    return PhaseMap(entries=tuple(entries.values()), sglang_version=version, sources=(source,))


def load_text(text: str, source: str) -> tuple[Any, Lines]:
    """Parse YAML ``text`` safely: explicit tags are refused; returns data and its lines."""
    import yaml

    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            tag = getattr(event, "tag", None)
            if tag is not None:
                line = event.start_mark.line + 1 if event.start_mark is not None else None
                raise _err(
                    source,
                    "YAML tag",
                    f"explicit tag {tag!r} is not allowed in a phase map (plain values only)",
                    line,
                )
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise PhaseMapError(f"phase map {source}: not valid YAML: {e}") from None
    return data, Lines(node)


def load_file(path: str | Path) -> PhaseMap:
    """Read and validate a phase-map YAML file (a user's fork extension)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PhaseMapError(f"phase map {p}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PhaseMapError(f"phase map {p}: not UTF-8 text") from None
    data, lines = load_text(text, str(p))
    return parse_map(data, str(p), lines)


def is_builtin_source(source: str) -> bool:
    """Whether ``source`` (a :attr:`HookEntry.source`) is a built-in map's file name."""
    return bool(_BUILTIN_RE.match(source))


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


def _load_packaged(name: str) -> PhaseMap:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    data, lines = load_text(text, name)
    return parse_map(data, name, lines)


def load_builtin(version: str | None = None) -> PhaseMap:
    """The built-in map for SGLang ``version`` (None: the newest)."""
    return _load_packaged(builtin_name_for(version))


def load_example_fork_map() -> PhaseMap:
    """The shipped example map for a DFlash fork with DDTree verification."""
    return _load_packaged(EXAMPLE_FORK_MAP)


def example_fork_map_path() -> Path:
    """Where the example fork map lives (to copy it, or to point SPECPERF_PHASE_MAP at)."""
    return Path(str(resources.files(__package__).joinpath(EXAMPLE_FORK_MAP)))


def load_effective(version: str | None, user_file: str | None) -> PhaseMap:
    """Built-in map for ``version`` extended by ``user_file`` (if given)."""
    pm = load_builtin(version)
    if user_file:
        pm = pm.extended(load_file(user_file))
    return pm
