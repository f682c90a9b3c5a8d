"""``specperf sglang-check``: does the phase map fit this SGLang (or this fork of it)?

For the installed SGLang, or a fork's checkout given with ``--source``, and the built-in
phase map extended by ``--phase-map FILE`` (default: ``$SPECPERF_PHASE_MAP``), it reads the
source with ``ast`` (nothing is imported, no GPU needed) and lists:

- map entries whose target is missing from the source, or whose parameters differ from
  the ``params`` the map records (with ``file:line``);
- which worker each ``--speculative-algorithm`` gets (``spec_info.create_worker``) and
  whether the map has a step entry for it (without one the backend refuses it);
- for each step method (the map's ``role: step`` entries, plus ``--step TARGET``): the
  phases it reaches, and every call in its body that no phase covers, with ``file:line``:
  their time lands in ``unaccounted``. Calls into the source tree come with a suggested
  map entry (phase guessed from the name: check it) to paste into your map.

Exit status: 0 when every required entry is found with its recorded parameters and every
step method exists, 1 when not, 2 for bad input (no source there, a bad phase map).
"""

from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specperf.engines.sglang import algorithms, source
from pytest_specperf.engines.sglang.callgraph import BUILTIN_NAMES, Call, CallGraph, Definition
from pytest_specperf.engines.sglang.phase_map import (
    HookEntry,
    PhaseMap,
    PhaseMapError,
    load_builtin,
    load_file,
)
from pytest_specperf.engines.sglang.source import SourceLookupError, SourceTree
from pytest_specperf.engines.sglang.spec_workers import SpecInfoError, worker_choices
from pytest_specperf.probe.phases import INGEST, SCHEDULER_PHASES

ENV_PHASE_MAP = "SPECPERF_PHASE_MAP"
#: Name fragments -> suggested phase, first match wins (a guess for the user to check).
PHASE_HINTS = (
    ("prepare_for_verify", "prepare_for_verify"),
    ("verify_input", "build_verify_input"),
    ("accept", "accept"),
    ("reject", "accept"),
    ("tree", "build_verify_input"),
    ("mask", "build_verify_input"),
    ("draft", "draft"),
    ("propose", "draft"),
    ("sample", "accept"),
    ("verify", "verify"),
    ("kv", "kv_commit"),
    ("cache", "kv_commit"),
    ("commit", "kv_commit"),
    ("append", "kv_commit"),
)


class CheckError(RuntimeError):
    """Bad input: no SGLang source at the path, or a phase map that does not validate."""


@dataclass
class EntryStatus:
    target: str
    role: str
    phase: str | None
    optional: bool
    source: str
    status: str  # found | missing | signature
    where: str | None = None  # file:line in the source tree
    expected: list[str] | None = None
    actual: list[str] | None = None
    reason: str | None = None
    #: where the target is defined when that is not where the map names it (a class
    #: moved to another module and imported back): it resolves there at run time
    lives: str | None = None


@dataclass
class CallStatus:
    where: str  # file:line
    call: str  # the callee as written
    status: str  # covered | reaches | uncovered | unresolved
    detail: str = ""
    definition: str | None = None  # resolved target
    suggestion: dict[str, Any] | None = None
    phases: list[str] = field(default_factory=list)
    entry: str | None = None  # the phase entry that covers the call


@dataclass
class Renamed:
    """A mapped phase whose target is gone from the source, and the call the step makes
    in its place (same class or module, a name or parameters like the old one's)."""

    phase: str
    old: str  # the map's target
    new: str  # the definition the step calls now
    call: str  # the call as written
    where: str  # file:line of the call


@dataclass
class StepReport:
    target: str
    where: str | None
    phases_reached: dict[str, str] = field(default_factory=dict)  # phase -> how
    calls: list[CallStatus] = field(default_factory=list)
    error: str | None = None
    renamed: list[Renamed] = field(default_factory=list)


@dataclass
class CheckReport:
    source_root: str
    version: str | None
    phase_map: list[str]
    algorithm: str | None
    skipped_for_algorithm: int
    entries: list[EntryStatus]
    algorithms: list[dict[str, Any]]
    steps: list[StepReport]
    #: the scheduler's event loops (with an ``iteration`` entry in the map): what each
    #: iteration calls and which host phase covers it; an uncovered call is
    #: ``unaccounted`` time of the iteration's record
    loops: list[StepReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        bad_entries = [e for e in self.entries if e.status != "found" and not e.optional]
        return not bad_entries and not any(s.error for s in self.steps)


# -- the source tree ---------------------------------------------------------------------------
def locate_source(path: str | None) -> tuple[Path, str | None]:
    """The ``sglang`` package directory to read and its version (None if unknown)."""
    if path is None:
        root = source.sglang_root()
        if root is None:
            raise CheckError(
                "SGLang is not installed here: pass --source PATH (a checkout of SGLang or "
                "of your fork: its python/ directory, or the sglang package directory)"
            )
        return root, source.installed_version()
    base = Path(path).expanduser()
    for candidate in (base, base / "sglang", base / "python" / "sglang"):
        if (candidate / "srt").is_dir():
            return candidate.resolve(), _source_version(candidate)
    raise CheckError(
        f"--source {path}: no SGLang source there (looked for srt/ in {base}, {base}/sglang "
        f"and {base}/python/sglang)"
    )


def _source_version(root: Path) -> str | None:
    """The version of the SGLang source at ``root``, read without importing it.

    A built or installed SGLang has ``sglang/_version.py`` (written by its build:
    ``__version__ = version = '0.5.23'``); ``version.py`` imports it, and falls back to the
    metadata, then to ``0.0.0.dev0`` inside ``except`` blocks, which are never the answer. So:
    ``_version.py``, then a module-level string ``__version__`` of ``version.py``, then the
    installed distribution's version when ``root`` is the installed package, else None.
    """
    for name in ("_version.py", "version.py"):
        found = _module_level_version(root / name)
        if found is not None:
            return found
    installed = source.sglang_root()
    if installed is not None and installed.resolve() == root.resolve():
        return source.installed_version()
    return None


def _module_level_version(path: Path) -> str | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:  # top level only: not the fallbacks inside try/except
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def effective_map(version: str | None, user_file: str | None) -> PhaseMap:
    pm = load_builtin(version)
    if user_file:
        try:
            pm = pm.extended(load_file(user_file))
        except PhaseMapError as e:
            raise CheckError(str(e)) from None
    return pm


# -- map entries ---------------------------------------------------------------------------------
def check_entries(
    src: SourceTree, entries: list[HookEntry], graph: CallGraph | None = None
) -> list[EntryStatus]:
    """Each entry found in the source, missing, or with other parameters than recorded.
    A target not defined where the map names it but imported there (a class moved to
    another module) is found where it lives, as SGLang's hook registry resolves it."""
    out = []
    for e in entries:
        st = EntryStatus(e.target, e.role, e.phase, e.optional, e.where(), "found")
        try:
            found = src.find_callable(e.target)
        except (SourceLookupError, SyntaxError, OSError, UnicodeDecodeError) as err:
            graph = graph or CallGraph(src)
            lives = graph.locate(e.target)
            if lives is None:
                st.status, st.reason = "missing", str(err)
                out.append(st)
                continue
            found = src.find_callable(lives)
            st.lives = lives
            st.reason = (
                f"not defined in {e.target.rsplit('.', 2)[0]}, imported there: resolves to "
                f"{lives} at run time"
            )
        st.where = _rel(src.root, found.path, found.lineno)
        st.actual = list(found.params)
        if e.params is not None and tuple(e.params) != found.params:
            st.status, st.expected = "signature", list(e.params)
        out.append(st)
    return out


def _rel(root: Path, path: Path, line: int) -> str:
    try:
        shown = path.relative_to(root.parent)
    except ValueError:
        shown = path
    return f"{shown}:{line}"


# -- algorithms ----------------------------------------------------------------------------------
def algorithm_rows(graph: CallGraph, pm: PhaseMap, version: str | None) -> list[dict[str, Any]]:
    """Per algorithm of the tree's spec_info: the worker, its step, mapped or not."""
    try:
        choices = worker_choices(graph)
    except SpecInfoError as e:
        return [{"error": str(e)}]
    steps = algorithms.step_targets(pm)
    rows = []
    for c in choices:
        rows.append(
            {
                "algorithm": c.algorithm,
                "condition": c.condition,
                "worker": c.worker,
                "step": c.step,
                "mapped": c.step in steps if c.step else False,
                "known": algorithms.lookup(c.algorithm) is not None,
            }
        )
    return rows


# -- step methods ----------------------------------------------------------------------------------
#: Method names of calls that may wait for the GPU (a host sync): flagged in the output.
HOST_SYNC_NAMES = frozenset({"item", "tolist", "cpu", "numpy", "synchronize", "to"})


def analyse_step(
    graph: CallGraph, target: str, phases: list[HookEntry], family: str | None = None
) -> StepReport:
    """Every call of the step method ``target``, and whether a phase of ``phases`` covers it.

    ``family``: the step entry's family; phase entries matched by name only are ranked
    same family first, then same module, then the rest.
    """
    d = graph.definition(target)
    if d is None:
        return StepReport(target, None, error="step method not found in the source")
    rep = StepReport(target, _rel(graph.src.root, d.path, d.line))
    by_target = {e.target: e for e in phases}
    gone = []
    for e in phases:  # a target found through an import is covered where it lives
        lives = graph.locate(e.target)
        if lives is None:
            gone.append(e)
        elif lives != e.target:
            by_target.setdefault(lives, e)
    by_name: dict[str, list[HookEntry]] = {}
    module = target.rsplit(".", 2)[0]
    for e in sorted(phases, key=lambda e: (e.family != family, not e.target.startswith(module))):
        by_name.setdefault(e.target.rsplit(".", 1)[1], []).append(e)
    for call in graph.calls(d):
        if call.callee in BUILTIN_NAMES:
            continue
        rep.calls.append(_classify(graph, call, by_target, by_name, d.owner))
    covered = [st for st in rep.calls if st.status == "covered"]
    for st in covered:  # direct coverage is named first, then what nests inside it
        rep.phases_reached.setdefault(st.phases[0], _how(st))
    for st in covered:
        start = graph.locate(st.entry or "") or st.entry or ""
        for t in graph.reach(start, by_target, max_depth=4, accept=_accepts(by_target)):
            rep.phases_reached.setdefault(by_target[t].phase or "", f"inside {_how(st)}")
    for st in rep.calls:
        if st.status == "reaches":
            for phase in st.phases:
                rep.phases_reached.setdefault(phase, f"via {_how(st)}")
    rep.renamed = _renamed(graph, d, gone, rep.calls)
    return rep


#: How alike a new callee must be to a gone target to be named as its rename: the names'
#: similarity (difflib ratio), plus ``PARAMS_BONUS`` when the parameter lists are equal.
RENAME_CUTOFF = 0.75
PARAMS_BONUS = 0.3


def _renamed(
    graph: CallGraph, step: Definition, gone: list[HookEntry], calls: list[CallStatus]
) -> list[Renamed]:
    """For each required phase entry whose target is gone, of the step's own class (or
    its bases) or module: the uncovered call of the step most like it (name, parameters),
    if alike enough. That call is where the step now does what the old target did."""
    import difflib

    mro = set(graph.mro(step.owner)) if step.owner else set()
    out = []
    for e in gone:
        owner = e.target.rpartition(".")[0]
        if e.optional or e.role != "phase" or not (owner in mro or owner == step.module):
            continue
        old = e.target.rsplit(".", 1)[1]
        best: tuple[float, CallStatus] | None = None
        for c in calls:
            new = c.definition
            d = graph.definition(new) if new else None
            if c.status != "uncovered" or new is None or d is None:
                continue
            score = difflib.SequenceMatcher(None, old, new.rsplit(".", 1)[1]).ratio()
            if e.params is not None and tuple(e.params) == source.signature_params(d.node):
                score += PARAMS_BONUS
            if score >= RENAME_CUTOFF and (best is None or score > best[0]):
                best = (score, c)
        if best is not None:
            c = best[1]
            out.append(Renamed(e.phase or "", e.target, c.definition or "", c.call, c.where))
            c.detail += f" [renamed from {e.target}? map it as {e.phase}]"
    return out


def _accepts(by_target: dict[str, HookEntry]) -> Any:
    return lambda call, target: _condition(by_target[target], call)[0]


def _reached_phase(e: HookEntry) -> str:
    return f"{e.phase} (if self.{e.when_self_attr})" if e.when_self_attr else e.phase or ""


def _how(st: CallStatus) -> str:
    return f"{st.call} (line {st.where.rsplit(':', 1)[1]})"


def _classify(
    graph: CallGraph,
    call: Call,
    by_target: dict[str, HookEntry],
    by_name: dict[str, list[HookEntry]],
    owner: str | None,
) -> CallStatus:
    where = _rel(graph.src.root, call.path, call.line)
    if call.resolved is not None and call.resolved in by_target:
        return _covered(where, call, [by_target[call.resolved]], exact=True)
    if call.resolved is None:
        candidates = by_name.get(call.name, [])
        if candidates:
            return _covered(where, call, candidates, exact=False)
        sync = " [may wait for the GPU]" if call.name in HOST_SYNC_NAMES else ""
        return CallStatus(where, call.callee, "unresolved", sync.strip())
    reached = graph.reach(call.resolved, by_target, max_depth=4, accept=_accepts(by_target))
    d = graph.definition(call.resolved)
    at = _rel(graph.src.root, d.path, d.line) if d is not None else "?"
    if reached:
        plain = {by_target[t].phase for t in reached if not by_target[t].when_self_attr}
        names = sorted(
            {_reached_phase(by_target[t]) for t in reached if by_target[t].phase not in plain}
            | {p or "" for p in plain}
        )
        return CallStatus(
            where,
            call.callee,
            "reaches",
            f"reaches {', '.join(names)} ({at})",
            call.resolved,
            phases=sorted({by_target[t].phase or "" for t in reached}),
        )
    suggestion = None if call.context else _suggest(call.resolved, d, owner, graph)
    syncs = _host_syncs(graph, d) if d is not None else ""
    if call.context:
        syncs += " [context manager: its with-block is listed on its own]"
    return CallStatus(
        where,
        call.callee,
        "uncovered",
        f"{call.resolved} ({at}){syncs}",
        call.resolved,
        suggestion,
    )


def _host_syncs(graph: CallGraph, d: Definition) -> str:
    """Calls in ``d``'s own body that may wait for the GPU, as a note."""
    found = [
        f".{c.name}() at line {c.line}"
        for c in graph.calls(d)
        if c.resolved is None and c.name in HOST_SYNC_NAMES
    ]
    return f" [may wait for the GPU: {', '.join(found)}]" if found else ""


def _covered(where: str, call: Call, entries: list[HookEntry], *, exact: bool) -> CallStatus:
    holding = []
    notes = []
    for e in entries:
        ok, note = _condition(e, call)
        if ok:
            holding.append(e)
        notes.append(
            f"{e.phase} ({'' if exact else 'by name: '}{e.target}{', ' + note if note else ''})"
        )
    if not holding:
        return CallStatus(where, call.callee, "uncovered", notes[0], call.resolved)
    more = f" (+{len(notes) - 1} other entries of that name)" if len(notes) > 1 else ""
    best = notes[entries.index(holding[0])]
    return CallStatus(
        where,
        call.callee,
        "covered",
        best + more,
        call.resolved,
        phases=[holding[0].phase or ""],
        entry=holding[0].target,
    )


def _condition(e: HookEntry, call: Call) -> tuple[bool, str]:
    """Whether ``e``'s ``when`` holds for this call, as far as the source shows."""
    if e.when_self_attr:
        return True, f"when self.{e.when_self_attr} is true"
    name = e.when_arg or e.when_not_arg
    if name is None:
        return True, ""
    node: ast.expr | None = next((k.value for k in call.node.keywords if k.arg == name), None)
    idx = e.arg_index(name)
    if node is None and idx is not None:
        pos = idx - 1 if e.owner else idx  # a method call passes self implicitly
        node = call.node.args[pos] if 0 <= pos < len(call.node.args) else None
    if node is not None and not isinstance(node, ast.Constant):
        return True, f"when {name} is {'true' if e.when_arg else 'false'}"
    value = node.value if isinstance(node, ast.Constant) else None
    holds = bool(value) if e.when_arg else not value
    return holds, f"{name}={value!r}" + ("" if holds else ": condition false here")


def _suggest(
    target: str, d: Definition | None, owner: str | None, graph: CallGraph
) -> dict[str, Any] | None:
    """A map entry for an uncovered call of the worker's own code with a name that says
    which phase it is (methods of the step's class and its bases, functions of its
    package); None for anything else (context managers, getters, library helpers)."""
    if d is None or any("contextmanager" in ast.unparse(dec) for dec in d.node.decorator_list):
        return None  # a context manager: what matters runs in its with-block
    own = d.owner is not None and owner is not None and d.owner in graph.mro(owner)
    package = owner.rsplit(".", 2)[0] if owner else None
    if not own and not (package and d.module.startswith(package + ".")):
        return None
    name = target.rsplit(".", 1)[1].lower()
    phase = next((p for key, p in PHASE_HINTS if key in name), None)
    if phase is None:
        return None
    return {
        "target": target,
        "role": "phase",
        "phase": phase,
        "params": list(source.signature_params(d.node)),
    }


# -- the whole check ---------------------------------------------------------------------------
def build_report(
    source_path: str | None,
    phase_map: str | None,
    algorithm: str | None = None,
    extra_steps: tuple[str, ...] = (),
) -> CheckReport:
    """Everything ``sglang-check`` prints; raises :class:`CheckError` on bad input."""
    root, version = locate_source(source_path)
    pm = effective_map(version, phase_map)
    usable = algorithms.families_for(algorithm) if algorithm else None
    active = [e for e in pm.active() if algorithms.installs(e.family, usable)]
    for step in extra_steps:
        if not step.startswith("sglang.") or step.count(".") < 2:
            raise CheckError(f"--step {step!r}: give module.Class.method under sglang.")
    src = SourceTree(root)
    graph = CallGraph(src)
    phases = [e for e in active if e.role == "phase"]
    iteration = [e for e in active if e.role == "iteration"]
    steps = {e.target: e.family for e in active if e.role == "step"}
    steps |= {s: None for s in extra_steps if s not in steps}
    return CheckReport(
        source_root=str(root),
        version=version,
        phase_map=list(pm.sources),
        algorithm=algorithm,
        skipped_for_algorithm=len(pm.active()) - len(active),
        entries=check_entries(src, active, graph),
        algorithms=algorithm_rows(graph, pm, version),
        steps=[
            analyse_step(graph, s, phases, family)
            for s, family in steps.items()
            if _present(graph, s, pm)
        ],
        loops=analyse_loops(graph, phases, iteration),
    )


#: SGLang's scheduler event loops (0.5.23): every iteration starts with ingest_requests.
EVENT_LOOPS = (
    "sglang.srt.managers.scheduler.Scheduler.event_loop_normal",
    "sglang.srt.managers.scheduler.Scheduler.event_loop_overlap",
)


def analyse_loops(
    graph: CallGraph, phases: list[HookEntry], iteration: list[HookEntry]
) -> list[StepReport]:
    """The event loops of the source, as steps whose phases are the scheduler's host phases
    (the ``iteration`` entry counts as ``ingest``); none without an ``iteration`` entry."""
    if not iteration:
        return []
    host = [e for e in phases if e.phase in SCHEDULER_PHASES]
    host += [dataclasses.replace(e, role="phase", phase=INGEST) for e in iteration]
    return [
        analyse_step(graph, loop, host)
        for loop in EVENT_LOOPS
        if graph.definition(loop) is not None
    ]


def _present(graph: CallGraph, step: str, pm: PhaseMap) -> bool:
    """Analyse a step found in the source, or a missing one the map does not mark optional."""
    entry = pm.by_target().get(step)
    return graph.definition(step) is not None or entry is None or not entry.optional


# -- output ----------------------------------------------------------------------------------------
def render_text(r: CheckReport, *, show_all: bool = False) -> str:
    lines = [
        f"sglang-check: SGLang {r.version or '(version unknown)'} at {r.source_root}",
        f"phase map: {' + '.join(r.phase_map)}",
    ]
    if r.algorithm:
        lines.append(
            f"algorithm: {r.algorithm} ({r.skipped_for_algorithm} entries of other "
            "algorithms' families left out)"
        )
    lines += ["", *_entry_lines(r.entries), "", *_algorithm_lines(r.algorithms)]
    for step in r.steps:
        lines += ["", *_step_lines(step, show_all=show_all)]
    for loop in r.loops:
        lines += ["", *_step_lines(loop, show_all=show_all, what="Scheduler loop")]
    lines += ["", "OK" if r.ok else "PROBLEMS FOUND (see MISSING / PARAMETERS / step above)"]
    return "\n".join(lines)


def _entry_lines(entries: list[EntryStatus]) -> list[str]:
    missing = [e for e in entries if e.status == "missing" and not e.optional]
    optional = [e for e in entries if e.status == "missing" and e.optional]
    changed = [e for e in entries if e.status == "signature"]
    out = [
        f"Map entries: {len(entries)} checked, {len(missing)} missing, "
        f"{len(changed)} with other parameters, {len(optional)} optional not present"
    ]
    for e in missing:
        out.append(f"  MISSING     {e.target} ({e.phase or e.role}) [{e.source}]: {e.reason}")
    for e in changed:
        out.append(
            f"  PARAMETERS  {e.target} ({e.phase or e.role}) [{e.source}] at {e.where}: the map "
            f"records {e.expected}, the source has {e.actual}"
        )
    for e in optional:
        out.append(f"  optional    {e.target} ({e.phase or e.role}): not in this source")
    for e in entries:
        if e.lives is not None:
            out.append(
                f"  via import  {e.target} ({e.phase or e.role}): defined as {e.lives} at "
                f"{e.where} and imported into {e.target.rsplit('.', 2)[0]}; hooked there at "
                "run time"
            )
    return out


def _algorithm_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = ["Algorithms (worker from spec_info.create_worker; step = its forward_batch_generation):"]
    for row in rows:
        if "error" in row:
            out.append(f"  (not read: {row['error']})")
            continue
        name = row["algorithm"] + ("" if row["condition"] == "always" else f" [{row['condition']}]")
        worker = (row["worker"] or "(none)").rsplit(".", 1)[-1]
        if row["mapped"]:
            state = "step mapped"
        elif row["step"] is None:
            state = "worker not in this source"
        else:
            state = f"NO STEP ENTRY for {row['step']}: the backend refuses it"
        out.append(f"  {name:<44} {worker:<28} {state}")
    return out


def _step_lines(s: StepReport, *, show_all: bool = False, what: str = "Step") -> list[str]:
    out = [f"{what} {s.target}" + (f" ({s.where})" if s.where else "")]
    if s.error:
        return [*out, f"  ERROR: {s.error}"]
    out.append("  phases reached:")
    out += [f"    {p:<20} {how}" for p, how in s.phases_reached.items()] or ["    none"]
    if s.renamed:
        out.append("  mapped phases whose target is gone; the step calls in its place:")
        out += [
            f"    {r.phase:<20} {r.old} is not in the source: the step calls {r.call} "
            f"({r.where}), defined as {r.new}: map `target: {r.new}` as {r.phase}"
            for r in s.renamed
        ]
    groups = (
        ("uncovered", "calls no phase covers (their time is 'unaccounted'):"),
        ("reaches", "calls that reach phases only further down (the rest is 'unaccounted'):"),
    )
    for status, title in groups:
        calls = [c for c in s.calls if c.status == status]
        if calls:
            out.append(f"  {title}")
            out += [f"    {c.where:<46} {c.call}(...)  {c.detail}".rstrip() for c in calls]
    other = [c for c in s.calls if c.status == "unresolved"]
    shown = other if show_all else [c for c in other if c.detail]
    if other:
        out.append(
            f"  other calls no phase covers, not found in the source tree (library calls, "
            f"methods of objects): {len(other)}"
            + ("" if show_all else f"; {len(shown)} may wait for the GPU (--all lists all)")
        )
        out += [f"    {c.where:<46} {c.call}(...)  {c.detail}".rstrip() for c in shown]
    seen: set[str] = set()
    suggestions = []
    for c in s.calls:
        if c.suggestion and c.suggestion["target"] not in seen:
            seen.add(c.suggestion["target"])
            suggestions.append(c.suggestion)
    if suggestions:
        out.append("  suggested entries for your phase map (phase guessed from the name: check):")
        for sug in suggestions:
            params = ", ".join(json.dumps(p) if p == "*" else p for p in sug["params"])
            out += [
                f"    - target: {sug['target']}",
                "      role: phase",
                f"      phase: {sug['phase']}",
                f"      params: [{params}]",
            ]
    return out
