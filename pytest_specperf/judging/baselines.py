"""Baseline records (pure): ``<dir>/<device-slug>.yaml``, one file per device model.

Layout (``schema_version: 4``)::

    schema_version: 4
    device: {name: ..., kind: cpu, ...}
    engines:
      reference tiny DFLASH:                 # identity: backend, model, draft, algorithm
        identity: {backend: reference, model: tiny, draft_model: null, algorithm: DFLASH}
        fingerprints:                        # full engine fingerprints, by short hash
          1a2b3c4d5e6f: {backend: reference, engine_version: ..., config_hash: ..., ...}
        cases:
          perf_tests/test_decode.py::test_decode:       # test id (no parameters)
            ctx=46000 kv=fragmented bs=1:                # case key
              fingerprint: 1a2b3c4d5e6f                  # the runs' engine fingerprint
              steps: 32                                  # measured steps per run
              runs:                                      # one per server process, newest last
              - {at: '2026-12-01T10:00:00+00:00', pid: 4711, sitting: 20261201T1000-box, host: box}
              phases:                                    # per step part, each run's centers:
                verify: {ms: [31.2, 31.4], rest: [3.51, 3.52], cpu: [31.0, 31.3]}
                step: {ms: [40.9, 41.0], ref: [6.87, 6.91], cpu: [40.8, 40.9]}
              value:                                     # the other metrics, each run's center
                accept_len: [3.125, 3.125]
              blocks:                                    # per judged form, each run's blocks
                verify/rest: [[3.45, 3.42, ...], [3.52, 3.49, ...]]
              not_gated:                                 # only for a case no setting decides
                accepted: false                          # true: the team accepts it (strict)
                gates: {draft: 0.174, verify: 0.167}     # measured spread between processes
                reason: bimodal between server processes ...

A ``phases`` row holds one step part's forms (``ms`` wall time, ``rest`` its share of the
rest of the step, ``ref`` the step against the KV read time, ``cpu`` the probe thread's CPU
time, ``device``/``device_rest`` on a GPU; ``active`` is read, not written), so a case
of three runs takes about 35 lines.

The identity selects the entry, so a reference run and an SGLang run (or two models) on
one device never read or overwrite each other's cases; the rest of the fingerprint is
compared (a mismatch is INVALID). An update appends the new runs to each recorded case and
keeps the last ``keep_runs``; a case whose engine fingerprint, step count or metric set
changed starts over, so runs of different engines are never pooled. Every run an update
writes carries its sitting (the update's id, from when and where it ran) and host, so a
baseline grown over updates on several days knows its sittings (``judging.noise``); runs
of older files carry none and read as one sitting.

Files are read and written by ``store.baselines`` through ``store.baseline_io`` (size,
shape and symlink limits, safe loading only), by ``schema_version``: a run reads v4
only; ``specperf migrate`` reads an older file (a v1 file's cases as one run each, a v2
file's metrics each on its own line under ``value``, runs up to v3 as one sitting) and
rewrites it as v4. File-level problems raise
``BaselineError``; a case that fails validation is a ``CaseProblem`` that the judge
reports as INVALID, naming file, case and field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_specperf import brief
from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    DEVICE_BUSY,
    STEP,
    STEP_PER_REF,
    TOKENS_PER_S,
    center_of,
    is_rest_form,
)
from pytest_specperf.judging.noise import LEGACY_SITTING
from pytest_specperf.judging.stats import Summary, center_of_centers, stable
from pytest_specperf.probe.phases import UNACCOUNTED

__all__ = [
    "DEFAULT_KEEP_RUNS",
    "FINGERPRINT_KEYS",
    "SCHEMA_VERSION",
    "BaselineFile",
    "CaseBaseline",
    "CaseProblem",
    "Identity",
    "NotGated",
    "RunRecord",
    "device_mismatch",
    "fingerprint_hash",
    "fingerprint_mismatch",
    "identity_of",
]

SCHEMA_VERSION = 4
#: Runs kept per case by an update (the last K).
DEFAULT_KEEP_RUNS = 5
#: Fingerprint fields that must match for a baseline to be comparable.
FINGERPRINT_KEYS = (
    "backend",
    "engine_version",
    "config",
    "config_hash",
    "model",
    "draft_model",
    "speculative_algorithm",
    "num_draft_tokens",
    "simulate_accept_len",
    "dtype",
    "device_type",
    "cuda_graphs",
    "huge_pages",
)
_RERECORD = "re-record it with --specperf-update-baselines"


# -- identity and fingerprints -----------------------------------------------------------


def plain_str(v: Any, what: str) -> str | None:
    """An identity field: None, or a plain value as a string; ``ValueError`` otherwise."""
    if v is None:
        return None
    if isinstance(v, (dict, list, tuple, set)):
        raise ValueError(f"{what} must be a plain value, got {brief(v)}")
    return str(v)


@dataclass(frozen=True)
class Identity:
    """What selects a baseline entry: backend, model (or reference config), draft model
    and speculative algorithm."""

    backend: str
    model: str | None
    draft_model: str | None
    algorithm: str | None

    @property
    def key(self) -> str:
        """Readable entry name, e.g. ``reference tiny DFLASH``."""
        parts = [self.backend, self.model or "-"]
        if self.draft_model:
            parts.append(f"draft={self.draft_model}")
        parts.append(self.algorithm or "-")
        return " ".join(parts)

    def to_dict(self) -> dict[str, str | None]:
        return {
            "backend": self.backend,
            "model": self.model,
            "draft_model": self.draft_model,
            "algorithm": self.algorithm,
        }


def identity_of(fingerprint: Mapping[str, Any]) -> Identity:
    """The identity of an engine fingerprint (``backend``, ``model`` or else ``config``,
    ``draft_model``, ``speculative_algorithm``); ``ValueError`` if it has no backend."""
    backend = fingerprint.get("backend")
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"the engine fingerprint has no backend name (got {brief(backend)})")
    model = fingerprint.get("model")
    if model is None:
        model = fingerprint.get("config")
    return Identity(
        backend,
        plain_str(model, "model"),
        plain_str(fingerprint.get("draft_model"), "draft_model"),
        plain_str(fingerprint.get("speculative_algorithm"), "speculative_algorithm"),
    )


def fingerprint_hash(fingerprint: Mapping[str, Any]) -> str:
    """Short stable hash of a whole fingerprint: runs are pooled only under one hash."""
    blob = json.dumps(dict(fingerprint), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


#: What sets a fingerprint field that a run's environment, not its build, decides: the
#: mismatch names it beside the usual re-record (``engines.reference.kv.THP_ENV``).
_FIELD_SOURCE = {
    "huge_pages": "the reference engine's CPU KV pool asks for huge pages when "
    "THP_MEM_ALLOC_ENABLE=1 is exported: export or unset it to match the baseline",
}


def fingerprint_mismatch(base: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Human-readable differences in the comparable fingerprint fields."""
    out = []
    for k in FINGERPRINT_KEYS:
        if base.get(k) != now.get(k):
            source = f" ({_FIELD_SOURCE[k]})" if k in _FIELD_SOURCE else ""
            out.append(f"{k}: baseline {base.get(k)!r}, now {now.get(k)!r}{source}")
    return out


#: Device fields that must match for a file to be judged against (the file's name is
#: the slug, but a file can be copied or renamed).
DEVICE_KEYS = ("slug", "kind")


def device_mismatch(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Whose a baseline file is when it is not this run's device's (``slug`` or ``kind``
    differ; a field the file lacks is not compared), else None."""
    differ = [
        k for k in DEVICE_KEYS if recorded.get(k) is not None and recorded.get(k) != now.get(k)
    ]
    if not differ:
        return None

    def who(d: Mapping[str, Any]) -> str:
        return f"{brief(d.get('slug'))} ({brief(d.get('kind'))}, {brief(d.get('name'))})"

    return f"the file was recorded on {who(recorded)}; this run is on {who(now)}"


def cpu_changed(recorded: Mapping[str, Any], now: Mapping[str, Any], *,
                recording: bool = False) -> str | None:  # fmt: skip
    """A note when a CPU baseline file of this slug was last recorded on another CPU
    design (``cpu_id``: family and model numbers, which a virtual machine's generic name
    hides), for a run judged against it or, ``recording``, adding runs to it; else None
    (a GPU file, or a file from before ``cpu_id`` was recorded)."""
    was, ours = recorded.get("cpu_id"), now.get("cpu_id")
    if now.get("kind") != "cpu" or not isinstance(was, str) or not was or not ours:
        return None
    if was == ours:
        return None
    head = (
        f"this CPU is not the one the baselines were last recorded on, though both are "
        f"named {brief(now.get('name'))}: {brief(was)} then, {brief(ours)} now (cpu_id); "
    )
    if recording:
        return head + (
            "this update adds its runs beside the other CPU's, and their offset then "
            "counts as sitting noise: record this CPU's under its own name "
            "(--specperf-device NAME) unless the two are meant to be one device"
        )
    return head + (
        "another CPU generation under one name moves every case alike, which the sitting "
        "term may not cover: judge against A/B in one run (--specperf-ab), or record this "
        "CPU's baselines under its own name (--specperf-device NAME)"
    )


def _fingerprint_changes(base: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    keys = sorted(k for k in {*base, *now} if base.get(k) != now.get(k))
    return ", ".join(f"{k} {base.get(k)!r} -> {now.get(k)!r}" for k in keys)[:300]


# -- stored runs -------------------------------------------------------------------------

#: Metrics whose per-run block centers are stored besides the judged ``<phase>/rest``
#: forms: what the verdicts pair (step, step/ref, unaccounted + step for the share,
#: accept length, tokens/s, the device-busy share).
BLOCK_METRICS = frozenset({STEP, STEP_PER_REF, UNACCOUNTED, ACCEPT_LEN, TOKENS_PER_S, DEVICE_BUSY})


def keeps_blocks(metric: str) -> bool:
    """Whether a stored run keeps ``metric``'s block centers (the verdicts pair them)."""
    return metric in BLOCK_METRICS or is_rest_form(metric)


@dataclass(frozen=True)
class RunRecord:
    """One stored run of a case (one server process): per metric its center, and the
    block centers of the forms the verdicts pair; when and where it was measured (the
    sitting: one pytest session's servers on one host, by id)."""

    at: str
    pid: int | None
    values: Mapping[str, float]
    blocks: Mapping[str, tuple[float, ...]]
    sitting: str | None = None
    host: str | None = None
    #: per form whose ``blocks`` fold several rounds of the same blocks (an A/B reference
    #: process: ``judging.ab.fold_reference``), its blocks as measured, which the scatter
    #: checks read; never stored
    measured_blocks: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    #: rounds of the same blocks the run measured (the automatic extension; ``blocks``
    #: hold them one after the other, or folded onto fewer, see ``rounds_of``): an A/B
    #: reference process's or a history report's; never stored (a recording is one round)
    rounds: int = 1
    #: the steps of its first round where known (an A/B reference process, a run read back
    #: by ``specperf compare``: a later round can measure fewer); never stored (a
    #: recording's are the case's ``steps``)
    round_steps: int | None = None

    @property
    def sitting_label(self) -> str:
        """The sitting the noise groups this run by (``LEGACY_SITTING`` when unknown)."""
        return self.sitting if self.sitting is not None else LEGACY_SITTING

    def summaries(self, steps: int) -> dict[str, Summary]:
        """The run as compact summaries, one per metric."""
        return {
            m: Summary.compact(v, self.blocks.get(m, ()), steps, center_of(m),
                               measured_blocks=self.measured_blocks.get(m, ()),
                               rounds=self.rounds_of(m))
            for m, v in self.values.items()
        }

    def rounds_of(self, metric: str) -> int:
        """The rounds ``metric``'s blocks hold: the run's, or fewer where they were folded
        onto a run of fewer rounds (``measured_blocks``: 4 rounds of 8 blocks folded onto 16
        hold 2)."""
        measured, now = self.measured_blocks.get(metric, ()), self.blocks.get(metric, ())
        if not measured or not now:
            return self.rounds
        return max(1, self.rounds * len(now) // len(measured))


def make_run(
    at: str,
    pid: int | None,
    values: Mapping[str, float],
    blocks: Mapping[str, Any],
    sitting: str | None = None,
    host: str | None = None,
    rounds: int = 1,
    round_steps: int | None = None,
) -> RunRecord:
    return RunRecord(
        at=at,
        pid=pid,
        values=MappingProxyType(dict(values)),
        blocks=MappingProxyType({m: tuple(b) for m, b in blocks.items()}),
        sitting=sitting,
        host=host,
        rounds=max(1, rounds),
        round_steps=round_steps,
    )


@dataclass(frozen=True)
class NotGated:
    """A case whose server processes disagree beyond any tolerance (bimodal): found when
    its baseline was recorded, the gates it cannot decide, each with its measured spread
    between processes (``tau_hat`` of the judged form, log units), and why. ``accepted``:
    the team accepted it in the file (``--specperf-strict`` then counts the case judged)."""

    gates: Mapping[str, float]
    reason: str
    accepted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "gates": {g: float(f"{x:.4g}") for g, x in sorted(self.gates.items())},
            "reason": self.reason,
        }


# -- cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseBaseline:
    """One case's stored runs (newest last) under one engine fingerprint."""

    test: str
    key: str
    identity: Identity
    fingerprint: Mapping[str, Any]
    fingerprint_hash: str
    steps: int
    runs: tuple[RunRecord, ...]
    #: the gates no setting can decide (a bimodal case), found when it was recorded
    not_gated: NotGated | None = None

    @property
    def sittings(self) -> int:
        """The distinct sittings of the stored runs (runs without one: one sitting)."""
        return len({r.sitting_label for r in self.runs})

    @classmethod
    def from_run(
        cls,
        *,
        test: str,
        key: str,
        fingerprint: Mapping[str, Any],
        steps: int,
        metrics: Mapping[str, Summary],
        at: str,
        pid: int | None = None,
        sitting: str | None = None,
        host: str | None = None,
        rounds: int = 1,
        round_steps: int | None = None,
    ) -> CaseBaseline:
        """A just-measured case (one run of ``rounds`` rounds, the first of ``round_steps``
        steps where known, recorded ``at``: an ISO timestamp the caller reads from its
        clock), numbers rounded as they are stored."""
        run = make_run(
            at,
            pid,
            {m: stable(s.value) for m, s in metrics.items()},
            {
                m: [stable(b) for b in s.blocks]
                for m, s in metrics.items()
                if keeps_blocks(m) and s.blocks
            },
            sitting,
            host,
            rounds,
            round_steps,
        )
        fp = MappingProxyType(dict(fingerprint))
        return cls(test, key, identity_of(fp), fp, fingerprint_hash(fp), steps, (run,))

    @property
    def latest(self) -> RunRecord:
        return self.runs[-1]

    @property
    def recorded_at(self) -> str:
        """When the latest run was recorded."""
        return self.latest.at

    @functools.cached_property
    def _latest_summaries(self) -> Mapping[str, Summary]:
        return MappingProxyType(self.latest.summaries(self.steps))

    @property
    def metrics(self) -> dict[str, Summary]:
        """The latest run's metrics as compact summaries (a fresh dict per call)."""
        return dict(self._latest_summaries)

    def run_metrics(self, index: int) -> dict[str, Summary]:
        """Run ``index``'s metrics (0 is the oldest kept)."""
        return self.runs[index].summaries(self.steps)


@dataclass(frozen=True)
class CaseProblem:
    """A stored case that failed validation: the judge reports it as INVALID."""

    path: Path
    engine: str
    test: str
    key: str
    problem: str
    #: what to do about it (default: fix or re-record the entry)
    fix: str | None = None

    @property
    def message(self) -> str:
        fix = self.fix or f"fix the entry, or {_RERECORD} (an update replaces an invalid entry)"
        return f"{self.path}: {self.engine}: {self.test} [{self.key}]: {self.problem}; {fix}"

    def __str__(self) -> str:
        return self.message


# -- the file ----------------------------------------------------------------------------


@dataclass
class _Entry:
    """One identity's entry as read."""

    name: str
    identity: Identity
    fingerprints: dict[str, dict[str, Any]] = field(default_factory=dict)
    cases: dict[str, dict[str, CaseBaseline | CaseProblem]] = field(default_factory=dict)
    #: tests whose entry is not a mapping of cases
    broken_tests: dict[str, CaseProblem] = field(default_factory=dict)


@dataclass
class BaselineFile:
    """A read baseline file: entries by identity; ``raw`` is the v2/v3 data as read (kept
    for writing untouched what an update does not record)."""

    path: Path
    version: int
    device: dict[str, Any]
    entries: dict[Identity, _Entry]
    #: v1 cases whose fingerprint gives no identity: INVALID for every identity
    loose: dict[tuple[str, str], CaseProblem] = field(default_factory=dict)
    raw: dict[str, Any] | None = None

    def lookup(self, identity: Identity, test: str, key: str) -> CaseBaseline | CaseProblem | None:
        """The case of ``identity`` (``None``: not recorded; ``CaseProblem``: invalid)."""
        entry = self.entries.get(identity)
        if entry is not None:
            found = entry.cases.get(test, {}).get(key)
            if found is not None:
                return found
            if test in entry.broken_tests:
                return dataclasses.replace(entry.broken_tests[test], key=key)
        loose = self.loose.get((test, key)) or self.loose.get((test, "*"))
        return dataclasses.replace(loose, key=key) if loose is not None else None

    def all_cases(self) -> Iterator[CaseBaseline]:
        """Every valid case of every identity."""
        for entry in self.entries.values():
            for per in entry.cases.values():
                yield from (c for c in per.values() if isinstance(c, CaseBaseline))

    def problems(self) -> list[CaseProblem]:
        out = [p for e in self.entries.values() for p in e.broken_tests.values()]
        out += [
            c
            for e in self.entries.values()
            for per in e.cases.values()
            for c in per.values()
            if isinstance(c, CaseProblem)
        ]
        return out + list(self.loose.values())

    def identities(self) -> list[Identity]:
        return list(self.entries)

    def case_count(self) -> int:
        n = sum(len(per) for e in self.entries.values() for per in e.cases.values())
        return n + sum(len(e.broken_tests) for e in self.entries.values()) + len(self.loose)


def run_centers(runs: Sequence[RunRecord]) -> dict[str, float]:
    """Per stored metric, the center over ``runs`` (``stats.center_of_centers``): what a
    verdict against these runs takes as the baseline's value."""
    if not runs:
        return {}
    names = runs[-1].values
    return {m: center_of_centers([r.values[m] for r in runs if m in r.values]) for m in names}
