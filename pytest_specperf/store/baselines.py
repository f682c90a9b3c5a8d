"""The baseline file on disk: read (``load_baselines``: the current schema; every older
one only for ``specperf migrate``) and written
(``write_baselines``: locked, atomic, appending each recorded case's run).

The records it reads into and writes from (``BaselineFile``, ``CaseBaseline``, ``Identity``)
are pure and live in ``judging.baselines``; the layout is described there.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_specperf import brief
from pytest_specperf.install import install_hint
from pytest_specperf.judging.baselines import (
    DEFAULT_KEEP_RUNS,
    SCHEMA_VERSION,
    BaselineFile,
    CaseBaseline,
    CaseProblem,
    Identity,
    RunRecord,
    _Entry,
    _fingerprint_changes,
    fingerprint_hash,
    identity_of,
    plain_str,
    run_centers,
)
from pytest_specperf.judging.metrics import STEP
from pytest_specperf.judging.stats import stable
from pytest_specperf.judging.verdict import fmt_value
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.store.baseline_io import (
    LOCK_TIMEOUT_S,
    RAISE_LIMIT,
    BaselineError,
    FlowMap,
    atomic_write,
    dump_yaml,
    locked,
    max_nodes_for,
    parse_yaml,
    read_bounded,
    real_target,
    remove_stale_temps,
    resolve_max_bytes,
)
from pytest_specperf.store.baseline_schema import (
    MAX_RUNS,
    Invalid,
    check_run,
    field_name,
    parse_case,
    parse_not_gated,
    parse_v1_case,
    split_rows,
)

__all__ = [
    "BaselineError",
    "Migrated",
    "Moved",
    "WriteResult",
    "case_from_json",
    "case_to_json",
    "dump_baselines",
    "format_moved",
    "load_any_schema",
    "load_baselines",
    "migrate_baselines",
    "older_schema",
    "utc_now",
    "write_baselines",
]


#: Versions this reader understands: the current one, and the older ones only for
#: ``specperf migrate`` (``load_any_schema``).
READABLE_VERSIONS = (1, 2, 3, 4)


# -- a case's stored form, and the same on the xdist wire ----------------------------------


def case_dict(c: CaseBaseline) -> dict[str, Any]:
    """The stored form of a case (v4 layout) in plain JSON types."""
    rows, value = split_rows({m: [stable(r.values[m]) for r in c.runs] for m in c.latest.values})
    return {
        "fingerprint": c.fingerprint_hash,
        "steps": c.steps,
        "runs": [run_meta(r) for r in c.runs],
        "phases": {part: dict(row) for part, row in rows.items()},
        "value": value,
        "blocks": {
            m: [[stable(b) for b in r.blocks[m]] for r in c.runs] for m in sorted(c.latest.blocks)
        },
        **({"not_gated": c.not_gated.to_dict()} if c.not_gated is not None else {}),
    }


def run_meta(r: RunRecord) -> dict[str, Any]:
    """A stored run's when and where: ``at``, ``pid``, and its ``sitting`` and ``host``
    when known."""
    meta: dict[str, Any] = {"at": r.at, "pid": r.pid}
    if r.sitting is not None:
        meta["sitting"] = r.sitting
    if r.host is not None:
        meta["host"] = r.host
    return meta


def case_to_json(c: CaseBaseline) -> dict[str, Any]:
    """The case with its full fingerprint, in plain JSON types (a pytest-xdist worker
    sends the cases it measured for an update to the controller this way)."""
    # plain dicts only: pytest-xdist's wire (execnet) refuses dict subclasses (FlowMap)
    return {
        "test": c.test,
        "key": c.key,
        "fingerprint": dict(c.fingerprint),
        "case": case_dict(c),
    }


def case_from_json(d: Mapping[str, Any]) -> CaseBaseline:
    """Read ``case_to_json``'s form, validated as a stored case; ``ValueError`` if
    unusable."""
    try:
        fp = MappingProxyType(dict(d["fingerprint"]))
        ref, steps, runs = parse_case(d["case"], SCHEMA_VERSION)
        mark = parse_not_gated(d["case"].get("not_gated"))
        test, key = str(d["test"]), str(d["key"])
    except (Invalid, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"not a recorded case ({type(e).__name__}: {e})") from None
    if ref != fingerprint_hash(fp):
        raise ValueError(f"recorded case {test} [{key}]: fingerprint hash {ref!r} mismatch")
    return CaseBaseline(test, key, identity_of(fp), fp, ref, steps, runs, mark)


# -- reading -----------------------------------------------------------------------------


def _mapping(path: Path, v: Any, where: str, fix: str = "") -> dict[Any, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BaselineError(path, f"{where}: expected a mapping, got {brief(v)}{fix}")
    return v


def _only(path: Path, d: dict[Any, Any], allowed: Sequence[str], where: str) -> None:
    extra = sorted(str(k) for k in d if k not in allowed)
    if extra:
        raise BaselineError(
            path,
            f"{where}: unknown field(s) {', '.join(extra)[:200]} (expected {', '.join(allowed)}); "
            "remove them, or move the file away and re-record",
        )


def older_schema(path: Path, version: int) -> BaselineError:
    """The refusal of a valid file of an older schema outside ``specperf migrate``."""
    return BaselineError(
        path,
        f"schema_version is {version}, an older schema than this pytest-specperf's "
        f"{SCHEMA_VERSION}; nothing was read or changed: upgrade the file in place with "
        f"`specperf migrate {path}` (every case is kept) and commit it",
    )


def _read_versioned(path: Path, max_bytes: int | None) -> tuple[dict[str, Any], int] | None:
    """The file's plain data and its (readable) ``schema_version``; None if no file."""
    limit = resolve_max_bytes(path, max_bytes)
    text = read_bounded(path, limit)
    if text is None:
        return None
    data = parse_yaml(text, path, max_nodes_for(limit))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BaselineError(path, f"top level: expected a mapping, got {brief(data)}")
    version = data.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BaselineError(
            path,
            f"schema_version is {brief(version)}: this pytest-specperf reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. If a newer pytest-specperf wrote "
            f"the file, upgrade ({install_hint()}, from a newer source); otherwise move the "
            "file away and re-record with --specperf-update-baselines",
        )
    return data, version


def load_baselines(path: Path, *, max_bytes: int | None = None) -> BaselineFile | None:
    """Read and validate ``path`` (through a symbolic link); ``None`` if there is no file.

    ``max_bytes``: the size limit (default 8 MiB, or ``SPECPERF_BASELINE_MAX_MB``).
    Only the current schema is read: a file of an older one is refused before its
    entries are read (``older_schema``, naming ``specperf migrate``).
    """
    read = _read_versioned(path, max_bytes)
    if read is None:
        return None
    data, version = read
    if version != SCHEMA_VERSION:
        raise older_schema(path, version)
    return _from_v2(path, data, version)


def load_any_schema(path: Path, *, max_bytes: int | None = None) -> BaselineFile | None:
    """``load_baselines`` for every readable schema, the older ones upgraded as read (a
    v1 case as one run): what ``specperf migrate`` rewrites."""
    read = _read_versioned(path, max_bytes)
    if read is None:
        return None
    data, version = read
    return _from_v1(path, data) if version == 1 else _from_v2(path, data, version)


def _from_v2(path: Path, data: dict[str, Any], version: int) -> BaselineFile:
    """A v2 or v3 file (they differ only inside a case)."""
    _only(path, data, ("schema_version", "device", "engines"), "top level")
    device = _mapping(path, data.get("device"), "device")
    engines = _mapping(path, data.get("engines"), "engines")
    entries: dict[Identity, _Entry] = {}
    for name, raw in engines.items():
        entry = _entry_v2(path, name, raw, version)
        other = entries.get(entry.identity)
        if other is not None:
            raise BaselineError(
                path,
                f"engines {other.name!r} and {name!r} have the same identity; merge their "
                "cases into one, or remove one",
            )
        entries[entry.identity] = entry
    return BaselineFile(path, version, device, entries, raw=data)


def _identity(d: Any) -> Identity:
    """Parse a stored identity; ``ValueError`` says what is wrong."""
    if not isinstance(d, dict) or set(d) != {"backend", "model", "draft_model", "algorithm"}:
        raise ValueError(
            "expected a mapping of exactly backend, model, draft_model and algorithm, "
            f"got {brief(d)}"
        )
    backend = d["backend"]
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend must be a name, got {brief(backend)}")
    return Identity(
        backend,
        plain_str(d["model"], "model"),
        plain_str(d["draft_model"], "draft_model"),
        plain_str(d["algorithm"], "algorithm"),
    )


def _entry_v2(path: Path, name: Any, raw: Any, version: int) -> _Entry:
    where = f"engines[{brief(name)}]"
    if not isinstance(name, str):
        raise BaselineError(path, f"{where}: engine names must be strings")
    d = _mapping(path, raw, where)
    _only(path, d, ("identity", "fingerprints", "cases"), where)
    try:
        identity = _identity(d.get("identity"))
    except ValueError as e:
        raise BaselineError(path, f"{where}.identity: {e}; fix it, or remove the entry") from None
    entry = _Entry(name, identity)
    for h, fp in _mapping(path, d.get("fingerprints"), f"{where}.fingerprints").items():
        fp = _mapping(path, fp, f"{where}.fingerprints[{brief(h)}]")
        try:
            same = identity_of(fp) == identity
        except ValueError:
            same = False
        if not same or not isinstance(h, str):
            raise BaselineError(
                path,
                f"{where}.fingerprints[{brief(h)}]: does not belong to this entry's identity "
                f"({identity.key}); move it to its own entry, or remove it",
            )
        entry.fingerprints[h] = fp
    for test, per in _mapping(path, d.get("cases"), f"{where}.cases").items():
        if not isinstance(test, str):
            raise BaselineError(path, f"{where}.cases: test ids must be strings, got {brief(test)}")
        if not isinstance(per, dict):
            entry.broken_tests[test] = CaseProblem(
                path, name, test, "*", "expected a mapping of cases"
            )
            continue
        entry.cases[test] = {
            str(k): _case_v2(path, entry, test, str(k), c, version) for k, c in per.items()
        }
    return entry


def _case_v2(
    path: Path, entry: _Entry, test: str, key: str, raw: Any, version: int
) -> CaseBaseline | CaseProblem:
    try:
        ref, steps, runs = parse_case(raw, version)
        mark = parse_not_gated(raw.get("not_gated")) if version >= 4 else None
        fp = entry.fingerprints.get(ref)
        if fp is None:
            raise Invalid(f"fingerprint: {ref[:40]!r} is not among this engine's fingerprints")
    except Invalid as e:
        return CaseProblem(path, entry.name, test, key, str(e))
    return CaseBaseline(test, key, entry.identity, MappingProxyType(fp), ref, steps, runs, mark)


def _from_v1(path: Path, data: dict[str, Any]) -> BaselineFile:
    _only(path, data, ("schema_version", "device", "cases"), "top level")
    device = _mapping(path, data.get("device"), "device")
    cases = _mapping(path, data.get("cases"), "cases")
    bf = BaselineFile(path, 1, device, {})
    for test, per in cases.items():
        test = str(test)
        if not isinstance(per, dict):
            bf.loose[(test, "*")] = CaseProblem(
                path, "v1", test, "*", "expected a mapping of cases"
            )
            continue
        for key, raw in per.items():
            _add_v1_case(bf, test, str(key), raw)
    return bf


def _add_v1_case(bf: BaselineFile, test: str, key: str, raw: Any) -> None:
    try:
        fp, steps, run = parse_v1_case(raw)
        identity = identity_of(fp)
    except (Invalid, ValueError) as e:
        bf.loose[(test, key)] = CaseProblem(bf.path, "v1", test, key, str(e))
        return
    entry = bf.entries.setdefault(identity, _Entry(identity.key, identity))
    h = fingerprint_hash(fp)
    entry.fingerprints[h] = fp
    frozen = MappingProxyType(fp)
    entry.cases.setdefault(test, {})[key] = CaseBaseline(
        test, key, identity, frozen, h, steps, (run,)
    )


# -- writing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Moved:
    """What an update changed in one recorded case (the latest run before and after)."""

    engine: str
    test: str
    key: str
    runs: int  # runs kept now
    old_step: float | None  # None: a new case (or one that replaced an invalid entry)
    new_step: float
    #: the named phase (or unaccounted) whose time moved most, with old and new ms
    phase: tuple[str, float, float] | None
    #: why earlier runs were dropped instead of kept (None: kept, or nothing to keep)
    started_over: str | None


@dataclass(frozen=True)
class WriteResult:
    """The outcome of ``write_baselines``."""

    path: Path  # as given
    target: Path  # the file written (a symbolic link's target)
    cases: int  # cases in the file now
    recorded: int  # cases this update recorded
    moved: tuple[Moved, ...]
    notes: tuple[str, ...]  # removed temporary files, dropped invalid v1 cases

    def case_count(self) -> int:
        return self.cases


_Key = tuple[Identity, str, str]


def _combine(
    old: CaseBaseline | CaseProblem | None, new: CaseBaseline, keep: int
) -> tuple[CaseBaseline, str | None]:
    """The case after adding ``new``'s runs to ``old``'s (the last ``keep``), and why
    old runs were dropped if they were. The ``not_gated`` mark: the new recording's when
    it measured 2 or more processes (it could tell; a team's acceptance of a mark that
    holds again is kept), else the old one."""
    trimmed = dataclasses.replace(new, runs=new.runs[-keep:])
    if old is None:
        return trimmed, None
    if isinstance(old, CaseProblem):
        return trimmed, f"the stored entry was invalid ({old.problem[:160]})"
    if fingerprint_hash(old.fingerprint) != new.fingerprint_hash:
        changes = _fingerprint_changes(old.fingerprint, new.fingerprint)
        return trimmed, f"engine fingerprint changed: {changes}"
    if old.steps != new.steps:
        return trimmed, f"steps per run changed: {old.steps} -> {new.steps}"
    o, n = old.latest, new.latest
    if set(o.values) != set(n.values) or set(o.blocks) != set(n.blocks):
        return trimmed, "the set of recorded metrics changed"
    mark = new.not_gated if len(new.runs) >= 2 else old.not_gated
    if mark is not None and old.not_gated is not None and old.not_gated.accepted:
        mark = dataclasses.replace(mark, accepted=True)
    return dataclasses.replace(new, runs=(old.runs + new.runs)[-keep:], not_gated=mark), None


def _moved(engine: str, old: Any, new: CaseBaseline, added: int, why: str | None) -> Moved:
    """What moved: the old case's center over its runs (what runs were judged against)
    and the center over the runs this update added (what the summary showed as now)."""
    before = run_centers(old.runs) if isinstance(old, CaseBaseline) else None
    after = run_centers(new.runs[-added:])
    phase = None
    if before is not None:
        common = [p for p in ALL_PHASES if p in before and p in after]
        if common:
            p = max(common, key=lambda p: abs(after[p] - before[p]))
            phase = (p, before[p], after[p])
    old_step = before.get(STEP) if before is not None else None
    return Moved(engine, new.test, new.key, len(new.runs), old_step, after[STEP], phase, why)


def _case_dict(c: CaseBaseline) -> dict[str, Any]:
    case = case_dict(c)  # runs and phase rows in YAML's flow style: one line each
    case["runs"] = [FlowMap(r) for r in case["runs"]]
    case["phases"] = {part: FlowMap(row) for part, row in case["phases"].items()}
    return case


def _v3_case(case: Any) -> Any:
    """A v2 case entry as read, in v3 form (its ``value`` split into ``phases`` rows);
    anything else (an entry too broken to split) as it is, to stay INVALID."""
    if not isinstance(case, dict) or not isinstance(case.get("value"), dict):
        return case
    if "phases" in case:  # not a v2 field: the entry stays INVALID, its data kept
        return case
    if not all(isinstance(m, str) for m in case["value"]):
        return case
    rows, value = split_rows(case["value"])
    out = {k: v for k, v in case.items() if k not in ("value", "blocks")}
    out["phases"] = rows
    out["value"] = value
    if "blocks" in case:
        out["blocks"] = case["blocks"]
    return out


def _unshare(x: Any) -> Any:
    """A copy of loaded YAML data with no shared parts (aliases were bounded on read)."""
    if isinstance(x, dict):
        return {k: _unshare(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unshare(v) for v in x]
    return x


def _restyle(entry: Any, version: int) -> None:
    """Give an entry as read the writer's one-line styles (identity, runs, phase rows)
    back, so an entry an update does not touch is written exactly as it was (a v2 entry's
    cases in v3 form)."""
    if not isinstance(entry, dict):
        return
    if isinstance(entry.get("identity"), dict):
        entry["identity"] = FlowMap(entry["identity"])
    cases = entry.get("cases")
    for per in cases.values() if isinstance(cases, dict) else ():
        if not isinstance(per, dict):
            continue
        for key, case in list(per.items()):
            if version < 3:
                case = per[key] = _v3_case(case)
            if not isinstance(case, dict):
                continue
            runs, rows = case.get("runs"), case.get("phases")
            if isinstance(runs, list):
                case["runs"] = [FlowMap(r) if isinstance(r, dict) else r for r in runs]
            if isinstance(rows, dict):
                case["phases"] = {p: FlowMap(r) if isinstance(r, dict) else r
                                  for p, r in rows.items()}  # fmt: skip


def _engines_out(existing: BaselineFile | None, notes: list[str]) -> dict[str, Any]:
    """The ``engines`` mapping to write, before this update's cases: a v3 file's as read,
    a v2 file's with its cases in v3 form, a v1 file's migrated (its invalid cases cannot
    be, and are dropped with a note)."""
    if existing is None:
        return {}
    if existing.raw is not None:
        engines = _unshare(existing.raw.get("engines") or {})
        for entry in engines.values():
            _restyle(entry, existing.version)
        return dict(engines)
    out: dict[str, Any] = {}
    for e in existing.entries.values():
        cases: dict[str, dict[str, Any]] = {}
        for test, per in e.cases.items():
            for key, c in per.items():
                if isinstance(c, CaseBaseline):
                    cases.setdefault(test, {})[key] = _case_dict(c)
        out[e.name] = {
            "identity": FlowMap(e.identity.to_dict()),
            "fingerprints": dict(e.fingerprints),
            "cases": cases,
        }
    notes += [
        f"dropped invalid v1 case {p.test} [{p.key}]: {p.problem}" for p in existing.problems()
    ]
    return out


def _put(engines: dict[str, Any], name: str, case: CaseBaseline) -> None:
    entry = engines.get(name)
    if not isinstance(entry, dict):
        entry = engines[name] = {"identity": FlowMap(case.identity.to_dict())}
    for part in ("fingerprints", "cases"):
        if not isinstance(entry.get(part), dict):
            entry[part] = {}
    entry["fingerprints"][case.fingerprint_hash] = dict(case.fingerprint)
    per = entry["cases"].get(case.test)
    if not isinstance(per, dict):
        per = entry["cases"][case.test] = {}
    per[case.key] = _case_dict(case)


def _tidy(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry this update touched: sorted cases, and only the fingerprints they use."""
    cases = entry["cases"]
    used = {
        c.get("fingerprint")
        for per in cases.values()
        if isinstance(per, dict)
        for c in per.values()
        if isinstance(c, dict)
    }
    fps = {
        h: dict(sorted(fp.items())) for h, fp in sorted(entry["fingerprints"].items()) if h in used
    }
    return {
        "identity": FlowMap(entry["identity"]),
        "fingerprints": fps,
        "cases": {
            t: dict(sorted(per.items())) if isinstance(per, dict) else per
            for t, per in sorted(cases.items())
        },
    }


def _free_name(engines: dict[str, Any], identity: Identity) -> str:
    name, i = identity.key, 1
    while name in engines:  # a hand-edited entry took the name
        i += 1
        name = f"{identity.key} #{i}"
    return name


def _merge(
    existing: BaselineFile | None,
    device: Mapping[str, Any],
    measured: Sequence[CaseBaseline],
    keep: int,
) -> tuple[dict[str, Any], list[Moved], list[str]]:
    """The document to write: ``existing`` with ``measured`` added; what moved; notes."""
    notes: list[str] = []
    engines = _engines_out(existing, notes)
    names = {e.identity: e.name for e in existing.entries.values()} if existing else {}
    initial: dict[_Key, CaseBaseline | CaseProblem | None] = {}
    state: dict[_Key, CaseBaseline] = {}
    why: dict[_Key, str | None] = {}
    added: dict[_Key, int] = {}
    for c in measured:
        k = (c.identity, c.test, c.key)
        if k not in initial:
            initial[k] = existing.lookup(*k) if existing else None
        state[k], reason = _combine(state.get(k, initial[k]), c, keep)
        why[k] = reason or why.get(k)
        added[k] = min(added.get(k, 0) + len(c.runs), len(state[k].runs))
    moved = []
    for k, case in state.items():
        name = names.setdefault(k[0], names.get(k[0]) or _free_name(engines, k[0]))
        _put(engines, name, case)
        moved.append(_moved(name, initial[k], case, added[k], why[k]))
    for name in {names[k[0]] for k in state}:
        engines[name] = _tidy(engines[name])
    doc = {
        "schema_version": SCHEMA_VERSION,
        "device": dict(sorted(device.items())),
        "engines": dict(sorted(engines.items())),
    }
    return doc, moved, notes


def _count_cases(doc: dict[str, Any]) -> int:
    n = 0
    for entry in doc["engines"].values():
        cases = entry.get("cases") if isinstance(entry, dict) else None
        for per in cases.values() if isinstance(cases, dict) else ():
            n += len(per) if isinstance(per, dict) else 1
    return n


def _stamped(c: CaseBaseline, sitting: str | None, host: str | None) -> CaseBaseline:
    """``c`` with ``sitting`` and ``host`` on its runs that carry none."""
    runs = tuple(
        dataclasses.replace(
            r,
            sitting=r.sitting if r.sitting is not None else sitting,
            host=r.host if r.host is not None else host,
        )
        for r in c.runs
    )
    return dataclasses.replace(c, runs=runs)


def _check_measured(path: Path, measured: Sequence[CaseBaseline]) -> None:
    for c in measured:
        for run in c.runs:
            try:
                check_run(run, field_name)
            except Invalid as e:
                raise BaselineError(
                    path, f"refusing to record {c.test} [{c.key}]: {e}; nothing was written"
                ) from None


def write_baselines(
    path: Path,
    device: Mapping[str, Any],
    measured: Sequence[CaseBaseline],
    *,
    keep_runs: int = DEFAULT_KEEP_RUNS,
    max_bytes: int | None = None,
    lock_timeout: float = LOCK_TIMEOUT_S,
    sitting: str | None = None,
    host: str | None = None,
) -> WriteResult:
    """Add ``measured`` to ``path`` (every other case and identity kept as it is) and
    write it atomically, under the file's lock, through a symbolic link to its target.
    ``sitting`` and ``host`` (this update's) are stamped on the measured runs that carry
    none: the update is their sitting.

    The existing file is validated first; if it is unusable, ``BaselineError`` is raised
    and nothing on disk changes. Temporary files of killed updates are removed.
    """
    if not 1 <= keep_runs <= MAX_RUNS:
        raise ValueError(f"keep_runs must be from 1 to {MAX_RUNS}, got {keep_runs}")
    limit = resolve_max_bytes(path, max_bytes)
    measured = [_stamped(c, sitting, host) for c in measured]
    _check_measured(path, measured)
    target = real_target(path) or path
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target, lock_timeout):
        removed = remove_stale_temps(target)
        existing = load_baselines(path, max_bytes=limit)
        doc, moved, notes = _merge(existing, device, measured, keep_runs)
        text = _dump_within(path, doc, limit, "updated", ", or split the suite across files")
        try:
            atomic_write(target, text)
        except OSError as e:  # a full disk, a read-only file system, a quota
            name = errno.errorcode.get(e.errno or 0, "")
            raise BaselineError(
                path,
                f"cannot write the update ({e.strerror or e}{f', {name}' if name else ''}); "
                f"the file is unchanged and no temporary file is left: free space in "
                f"{target.parent} (or fix its permissions) and run the update again",
            ) from None
    if removed:
        notes.insert(
            0,
            f"removed {len(removed)} temporary file(s) left by an interrupted update: "
            + ", ".join(removed),
        )
    return WriteResult(path, target, _count_cases(doc), len(moved), tuple(moved), tuple(notes))


@dataclass(frozen=True)
class Migrated:
    """What ``migrate_baselines`` did to one file: its schema before and after, whether it
    was written, how many cases it holds, and the notes of the rewrite (cases dropped)."""

    path: Path
    old_version: int
    new_version: int
    written: bool
    cases: int
    notes: tuple[str, ...]


def migrate_baselines(path: Path, *, write: bool = True, max_bytes: int | None = None,
                      lock_timeout: float = LOCK_TIMEOUT_S) -> Migrated:  # fmt: skip
    """Rewrite an older schema's file in the current schema (every case kept as an
    update would write it), atomically, under its lock; a current file is left alone.
    ``write=False``: only say what would change. ``BaselineError`` (nothing on disk
    changes) for a missing or unusable file."""
    limit = resolve_max_bytes(path, max_bytes)
    target = real_target(path)
    if target is None or not target.exists():  # no lock file left beside a missing one
        raise BaselineError(path, "no such file; nothing to migrate")
    with locked(target, lock_timeout):
        existing = load_any_schema(path, max_bytes=limit)
        if existing is None:
            raise BaselineError(path, "no such file; nothing to migrate")
        if existing.version == SCHEMA_VERSION:
            return Migrated(path, existing.version, SCHEMA_VERSION, False,
                            existing.case_count(), ())  # fmt: skip
        doc, _, notes = _merge(existing, existing.device, [], DEFAULT_KEEP_RUNS)
        text = _dump_within(path, doc, limit, "migrated", "")
        if write:
            atomic_write(target, text)
    return Migrated(path, existing.version, SCHEMA_VERSION, write, _count_cases(doc),
                    tuple(notes))  # fmt: skip


def dump_baselines(bf: BaselineFile) -> str:
    """The v4 text of a read file (a v1, v2 or v3 file migrated), as an update would write
    it."""
    doc, _, _ = _merge(bf, bf.device, [], DEFAULT_KEEP_RUNS)
    return dump_yaml(doc)


def _change(old: float, new: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old else "new"


def format_moved(moved: Iterable[Moved]) -> list[str]:
    """One line per recorded case saying what moved, ready for a commit message::

    test_decode ctx=32768 kv=contiguous bs=1: step 48.58 -> 48.71 ms (+0.3%);
    verify 37.76 -> 37.81 ms (+0.1%); 2 runs
    """
    items = list(moved)
    several = len({m.engine for m in items}) > 1
    lines = []
    for m in items:
        head = f"[{m.engine}] " if several else ""
        head += f"{m.test} {m.key}: "
        runs = f"{m.runs} run{'s' if m.runs != 1 else ''}"
        if m.old_step is None:
            text = f"new, step {fmt_value(m.new_step)} ms"
        else:
            text = (
                f"step {fmt_value(m.old_step)} -> {fmt_value(m.new_step)} ms "
                f"({_change(m.old_step, m.new_step)})"
            )
            if m.phase is not None:
                p, a, b = m.phase
                text += f"; {p} {fmt_value(a)} -> {fmt_value(b)} ms ({_change(a, b)})"
        text += f"; {runs}"
        if m.started_over:
            text += f"; earlier runs dropped: {m.started_over}"
        lines.append(head + text)
    return lines


def utc_now() -> str:
    """The clock's time as a run's ``at`` (UTC, ISO, whole seconds)."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return now.isoformat()


def _dump_within(path: Path, doc: Any, limit: int, what: str, advice: str) -> str:
    """``doc`` as YAML text; ``BaselineError`` when it would exceed ``limit`` bytes."""
    text = dump_yaml(doc)
    size = len(text.encode())
    if size > limit:
        raise BaselineError(
            path,
            f"the {what} file would be {size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB "
            f"limit; nothing was written (raise the limit with {RAISE_LIMIT}{advice})",
        )
    return text
