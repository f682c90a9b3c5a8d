"""The JSON report: written once per run (``--specperf-json``), read back through one reader.

``write_report`` writes strict JSON (non-finite numbers as ``null``) atomically;
``read_report`` is the one reader every consumer uses (``specperf calibrate``, ``history``,
``compare``): it checks ``schema_version`` before anything else and refuses an unknown one,
naming the file and the version. It reads a pytest-benchmark run too (``--benchmark-json``,
``--benchmark-save``): there the run's header is the file's ``specperf`` object and each
case is the ``specperf`` object of its benchmark's ``extra_info`` (``reporting.benchmark``).
Judged metrics are (de)serialized by ``MetricVerdict`` itself.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_specperf.judging.ab import pair_changes, rounds_per_look
from pytest_specperf.judging.baselines import keeps_blocks
from pytest_specperf.judging.budgets import BUDGETS, SHARE_BUDGETS, Budgets, budget_expectation
from pytest_specperf.judging.judge import CaseOutcome, first_round_steps
from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    ACTIVE_SHARE,
    STEP,
    STEP_PARTS,
    TOKENS_PER_S,
    active_form,
    cpu_form,
    device_form,
)
from pytest_specperf.judging.noise import PRIOR_KINDS, DevicePrior, LevelPrior
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.judging.significance import LONE, Family, share_of_run
from pytest_specperf.judging.stats import Summary, center_of_centers, stable
from pytest_specperf.judging.verdict import MetricVerdict, Verdict, verdict_label
from pytest_specperf.probe.phases import ALL_PHASES, PHASES, UNACCOUNTED

#: Version of the report's layout; bumped when a field changes meaning.
JSON_SCHEMA_VERSION = 1
#: Versions ``read_report`` understands.
READABLE_VERSIONS = (1,)
#: Where a pytest-benchmark file holds our run header (top level) and each case (in the
#: benchmark's ``extra_info``).
SPECPERF_KEY = "specperf"


class ReportError(ValueError):
    """A report file that cannot be used; the message names the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def _summary_json(s: Summary) -> dict[str, Any]:
    d = s.to_dict()
    d["median_ms"] = d["median"]
    return d


#: Decimals of the per-step times in ms: nanoseconds, what the probe measured.
_NS_DECIMALS = 6


def _ms(xs: Sequence[float]) -> list[float]:
    """Per-step times in ms, exact to the nanosecond (no float noise digits)."""
    return [round(x, _NS_DECIMALS) for x in xs]


def _samples_json(run: DecodeRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "block": list(run.blocks),
        "step_ms": _ms(run.samples[STEP]),
        "unaccounted_ms": _ms(run.samples[UNACCOUNTED]),
        ACCEPT_LEN: list(run.samples[ACCEPT_LEN]),
        "phases_ms": {p: _ms(run.samples[p]) for p in PHASES if p in run.samples},
        "reference_ms": list(run.reference_ms),
    }
    if run.has_device_times:
        out["device_phases_ms"] = {
            p: _ms(run.samples[device_form(p)]) for p in PHASES if device_form(p) in run.samples
        }
        out["device_step_ms"] = _ms(run.samples[device_form(STEP)])
    for key, form in (("cpu_ms", cpu_form), ("active_ms", active_form)):
        if form(STEP) in run.samples:  # null: a step that was not sampled
            out[key] = {p: list(run.samples[form(p)]) for p in STEP_PARTS if form(p) in run.samples}
    return out


def _activity_json(run: DecodeRun) -> dict[str, Any] | None:
    """Per part of the step: span, CPU, active and idle ms (medians), and the active share."""
    s = run.summaries
    if cpu_form(STEP) not in s:
        return None
    parts: dict[str, Any] = {}
    for p in STEP_PARTS:
        if p not in s and p in PHASES:
            continue  # a scheduler host phase this engine does not have
        span_name = device_form(p) if run.active_source == "device" and p in PHASES else p
        span = s[span_name].median if span_name in s else None
        cpu = s.get(cpu_form(p))
        active = s.get(active_form(p))
        parts[p] = {
            "span_ms": span,
            "cpu_ms": cpu.median if cpu is not None else None,
            "active_ms": active.median if active is not None else None,
            "idle_ms": (
                max(span - active.median, 0.0) if span is not None and active is not None else None
            ),
        }
    share = s.get(ACTIVE_SHARE)
    return {
        "source": run.active_source,
        ACTIVE_SHARE: share.median if share is not None else None,
        "phases": parts,
    }


def _kernels_json(run: DecodeRun) -> dict[str, Any] | None:
    kv = run.kernels
    if kv is None:
        return None
    return {
        "source": kv.source,
        "sampled_steps": kv.steps,
        "cost_ms_per_sample": kv.cost_ms,
        "phases": {
            p: [
                {"name": k.name, "calls": k.calls, "total_ms": k.total_ms, "share": k.share}
                for k in stats
            ]
            for p, stats in kv.phases.items()
        },
    }


def comparison_json(reference: str | None) -> dict[str, Any]:
    """How a run compared its cases: ``{"mode": "baselines"}`` (the device's baseline file)
    or ``{"mode": "ab", "reference": "python=..."}`` (A/B in this run, ``--specperf-ab``)."""
    if reference is None:
        return {"mode": "baselines", "reference": None}
    return {"mode": "ab", "reference": reference}


def _ab_json(o: CaseOutcome) -> dict[str, Any] | None:
    """An A/B case's reference side, the order its processes ran in, and the per-pair
    ratios of the gated metrics' medians (``judging.ab.pair_changes``, a cross-check)."""
    if o.reference is None:
        return None
    ref = o.baseline.runs if o.baseline is not None else ()
    steps = o.baseline.steps if o.baseline is not None else 0
    a = [r.summaries(steps) for r in ref]
    b = [r.summaries for r in o.run.processes]
    pairs = {m.metric: pair_changes(a, b, m.metric) for m in o.verdict.metrics}
    return {
        "reference": o.reference,
        "order": list(o.ab_order),
        "reference_processes": len(a),
        "pairs": {k: v for k, v in pairs.items() if v},
    }


def _baseline_json(o: CaseOutcome) -> dict[str, Any] | None:
    if o.baseline is None:
        return None
    step = o.baseline.metrics.get(STEP)
    return {
        # an A/B case's baseline is its reference side's runs of this run, not a file
        "file": str(o.baseline_path) if o.reference is None else None,
        "recorded_at": o.baseline.recorded_at,
        # the latest run's summary; the center over its runs is ``centers.base``
        "step_ms": step.to_dict() if step is not None else None,
        "runs": len(o.baseline.runs),
    }


def _bottleneck_json(o: CaseOutcome) -> dict[str, Any] | None:
    b = o.bottleneck
    if b is None:
        return None
    return {
        "kind": b.kind,
        "describe": b.describe(),
        "reasons": b.reasons,
        "lines": list(b.lines),
        "active_source": b.active_source,
        "figures": b.figures,
    }


def run_record_json(run: DecodeRun) -> dict[str, Any]:
    """One server process's run of a case as a baseline stores it (centers, and the block
    centers of the forms the verdicts pair): what ``--specperf-history`` reads back."""
    return {
        "steps": run.steps,
        "rounds": run.rounds,
        # the first round's steps: a later round can measure fewer (a block that measured
        # nothing is not repeated), so the total does not say them
        "round_steps": first_round_steps(run),
        "server_pid": run.server_pid,
        "values": {m: stable(s.value) for m, s in sorted(run.summaries.items())},
        "blocks": {
            m: [stable(b) for b in s.blocks]
            for m, s in sorted(run.summaries.items())
            if keeps_blocks(m) and s.blocks
        },
    }


def sibling_json(run: DecodeRun) -> dict[str, Any]:
    """Another server process's run of a case (``--specperf-processes``): its steps as the
    case's own are written (``samples``, ``records``) and what its decoder measured besides,
    so that ``store.rebuild`` rebuilds every process's run, not the first one's alone."""
    return {
        "samples": _samples_json(run),
        "records": [r.to_json() for r in run.records],
        "kv_fragmentation": run.fragmentation,
        "wall_s": round(run.wall_s, 3),
        "warmup_steps": run.warmup_steps,
        "cross_check": list(run.cross_check),
        "telemetry": run.telemetry.to_dict() if run.telemetry is not None else None,
    }


def family_json(o: CaseOutcome) -> dict[str, Any]:
    """The share of the run's false-alarm budget the case was judged at: its run's specperf
    tests, its test's cases, the looks and the look (``judging.significance.Family``)."""
    f = o.family
    return {"run_alpha": f.run_alpha, "tests": f.tests, "cases": f.cases, "looks": f.looks,
            "look": f.look}  # fmt: skip


def _df(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"  # a known variance: JSON has no Infinity


def prior_json(prior: DevicePrior) -> dict[str, Any]:
    """The device's level priors a case was judged with (``judging.noise.DevicePrior``)."""
    out: dict[str, Any] = {"source": prior.source, "provisional": prior.provisional}
    for kind in PRIOR_KINDS:
        p = prior.of(kind)
        out[kind] = {"between": p.between, "between_df": _df(p.between_df),
                     "sitting": p.sitting, "sitting_df": _df(p.sitting_df)}  # fmt: skip
    return out


_LEVEL = ("between", "between_df", "sitting", "sitting_df")


def saved_family(c: CaseRecord) -> Family | None:
    """The share of its run's false-alarm budget the case was judged at (its run's tests,
    its test's cases, the looks and the look); None for a report that did not save it, or
    saved it unusable."""
    raw = c.data.get("family")
    if not isinstance(raw, Mapping):
        return None
    try:
        return Family(
            run_alpha=float(raw.get("run_alpha", LONE.run_alpha)),
            **{k: raw.get(k, 1) for k in ("tests", "cases", "looks", "look")},
        )
    except (ValueError, TypeError):
        return None


def run_family(c: CaseRecord, tests: int) -> Family:
    """The share a case is judged at when read again: ``saved_family``, else ``LONE`` (one
    gate of one case, one look: 5%), shared by at least ``tests`` tests (its report's,
    ``Report.tests``): reports written before 2026-12-05 saved 1 whatever the run held,
    because pytest never called the hook that counts them (``share_of_run``)."""
    return share_of_run(saved_family(c) or LONE, tests)


def prior_of(c: Mapping[str, Any]) -> DevicePrior | None:
    """A saved case's ``prior`` back (``prior_json``); None where it has none or it is
    unusable."""
    raw = c.get("prior")
    if not isinstance(raw, Mapping):
        return None
    try:
        levels = [LevelPrior(**{k: float(raw[kind][k]) for k in _LEVEL}) for kind in PRIOR_KINDS]
        return DevicePrior(levels[0], levels[1], str(raw["source"]), bool(raw["provisional"]))
    except (KeyError, TypeError, ValueError):
        return None


def saved_budgets(c: CaseRecord) -> Budgets | None:
    """The budgets the case's test set, from its saved checks (``budgets``: one per
    budget set, each with its ``limit``); None for a report without them (one written
    before budgets existed). ``ValueError`` naming the check for an unusable one: a
    budget dropped unread would pass a case its run failed."""
    found = c.data.get("budgets")
    if found is None:
        return None
    if not isinstance(found, list):
        raise ValueError("budgets: expected a list")
    limits: dict[str, float] = {}
    for i, b in enumerate(found):
        name = b.get("budget") if isinstance(b, Mapping) else None
        if not isinstance(name, str):
            raise ValueError(f"budgets[{i}]: expected an object with a budget and its limit")
        if name not in BUDGETS:
            raise ValueError(f"budgets[{i}]: unknown budget {name!r}; known: {', '.join(BUDGETS)}")
        limit = _number_or_none(b.get("limit"))
        top = 1.0 if name in SHARE_BUDGETS else math.inf
        if limit is None or not math.isfinite(limit) or not 0 < limit <= top:
            raise ValueError(f"budgets[{i}]: {name}'s limit {b.get('limit')!r} is not "
                             f"{budget_expectation(name)}")  # fmt: skip
        limits[name] = limit
    return Budgets(**limits)


def _judged_with(o: CaseOutcome) -> dict[str, Any]:
    """Each server process's run (``runs``; and step by step the other processes',
    ``siblings``: the first one's are the case's own samples and records), the false-alarm
    share and the prior: what ``specperf compare`` judges the case again with."""
    return {
        "runs": [run_record_json(r) for r in o.run.processes],
        "siblings": [sibling_json(r) for r in o.run.siblings],
        "family": family_json(o),
        "prior": prior_json(o.prior),
    }


def case_json(o: CaseOutcome) -> dict[str, Any]:
    """One case of the report."""
    run = o.run
    out: dict[str, Any] = {
        "test": o.test,
        "nodeid": o.nodeid,
        "key": o.key,
        "context_len": run.context_len,
        "kv_layout": run.kv_layout.name,
        "kv_level": run.kv_layout.level,
        "kv_fragmentation": run.fragmentation,
        "batch_size": run.batch_size,
        "verdict": o.verdict.verdict.value,
        "culprit": o.verdict.culprit,
        "reasons": [*o.verdict.reasons, *o.notes],
        # the judge's notes, the tail of ``reasons`` (``CaseRecord.verdict_reasons``)
        "notes": list(o.notes),
        "recorded": o.recorded,
        "labels": dict(run.labels),
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "wall_s": round(run.wall_s, 3),
        "step_ms": run.summaries[STEP].to_dict(),
        "phases": {p: _summary_json(run.summaries[p]) for p in ALL_PHASES if p in run.summaries},
        # the one source of the numbers people read: per step part, the center over this
        # measurement's server processes and over the baseline's runs (the verdict's raw
        # base and now; the headline, phase table, summary and Markdown show these)
        "centers": {
            "now": dict(o.now_centers),
            "base": dict(o.base_centers) if o.base_centers is not None else None,
        },
        ACCEPT_LEN: run.summaries[ACCEPT_LEN].to_dict(),
        TOKENS_PER_S: run.summaries[TOKENS_PER_S].to_dict(),
        "graphs": {k: dict(v) for k, v in run.graphs.items()},
        "fingerprint": dict(o.fingerprint),
        "bottleneck": _bottleneck_json(o),
        "activity": _activity_json(run),
        "kernels": _kernels_json(run),
        "budgets": [b.to_json() for b in o.budgets],
        "failed": o.failed,
        "time_went": o.time_went,
        "cross_check": list(run.cross_check),
        "telemetry": run.telemetry.to_dict() if run.telemetry is not None else None,
        "baseline": _baseline_json(o),
        "metrics": [m.to_json() for m in o.verdict.metrics],
        "gates": list(o.gates) if o.gates is not None else None,
        "tolerances": o.tolerances.to_json() if o.tolerances is not None else None,
        "samples": _samples_json(run),
        # the probe's own step records (its wire format, versioned): a rebuilt case
        # (``store.rebuild``) gets every measured field back, run-queue and CPU time included
        "records": [r.to_json() for r in run.records],
        **_judged_with(o),
        "ab": _ab_json(o),
        **_device_json(run),
    }
    return out


def _device_json(run: DecodeRun) -> dict[str, Any]:
    """On a GPU: the device time's summaries per phase and over the step."""
    if not run.has_device_times:
        return {}
    return {
        "device_phases": {
            p: _summary_json(run.summaries[device_form(p)])
            for p in PHASES
            if device_form(p) in run.summaries
        },
        "device_step_ms": run.summaries[device_form(STEP)].to_dict(),
    }


def write_report(path: Path, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` as strict JSON, atomically (temp file in the same directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(strict(payload), fh, indent=1, sort_keys=True, allow_nan=False, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class CaseRecord:
    """One judged case as written: the JSON report's case (``case_json``), the one record
    of a case from the judge to every output.

    ``CaseRecord.of`` makes it from the judged case; ``to_json`` is what the JSON report,
    the pytest-xdist wire (inside ``CaseView``) and, less its derived fields, a
    pytest-benchmark result hold; ``read_report`` gives it back with ``from_json``. The
    terminal summary, the picture, the Markdown summary, ``specperf compare``, ``history``
    and ``calibrate`` read a case's verdict, centers and figures from it."""

    test: str
    key: str
    verdict: Verdict
    metrics: tuple[MetricVerdict, ...]
    #: the case's own median step (its ``step_ms`` summary)
    step_median_ms: float
    data: Mapping[str, Any]

    @classmethod
    def of(cls, o: CaseOutcome) -> CaseRecord:
        """The record of a case judged in this process (strict JSON, as written);
        ``ValueError`` naming the case when it cannot be one (a non-finite step median)."""
        try:
            return cls.from_json(strict(case_json(o)))
        except ValueError as e:
            raise ValueError(f"{o.test} [{o.key}]: the case cannot be reported: {e}") from None

    @classmethod
    def from_json(cls, c: Any) -> CaseRecord:
        """Read ``to_json``'s form; ``ValueError`` naming the problem if it is unusable."""
        if not isinstance(c, Mapping):
            raise ValueError("expected an object")
        try:
            verdict = Verdict(c.get("verdict"))
            metrics = tuple(MetricVerdict.from_json(m) for m in c.get("metrics") or ())
            median = (c.get("step_ms") or {})["median"]
            step = math.nan if median is None else float(median)  # None: a NaN, made strict
            if not math.isfinite(step):
                raise ValueError(f"step_ms.median must be a finite number, got {median!r}")
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            raise ValueError(str(e)) from None
        if not isinstance(c.get("test"), str) or not isinstance(c.get("key"), str):
            raise ValueError("expected a test id and a case key")
        return cls(c["test"], c["key"], verdict, metrics, step, MappingProxyType(dict(c)))

    def to_json(self) -> dict[str, Any]:
        """The case as the JSON report holds it."""
        return dict(self.data)

    @property
    def nodeid(self) -> str:
        return str(self.data.get("nodeid") or self.test)

    @property
    def verdict_reasons(self) -> tuple[str, ...]:
        """The verdict's own reasons: the written ``reasons`` less the judge's ``notes``
        (a report without ``notes``: all of them)."""
        reasons = tuple(str(r) for r in self.data.get("reasons") or ())
        notes = self.data.get("notes")
        n = len(notes) if isinstance(notes, list) else 0
        return reasons[: len(reasons) - n]

    def median_ms(self, phase: str) -> float | None:
        """The case's median of ``phase`` (any of ``ALL_PHASES``), None where missing."""
        summary = (self.data.get("phases") or {}).get(phase)
        return _number_or_none(summary.get("median")) if isinstance(summary, Mapping) else None

    @property
    def budget_checks(self) -> list[Mapping[str, Any]]:
        """The case's saved budget checks (``budget``, ``limit``, ``failed``, ``describe``),
        those that are objects; empty for a report without them."""
        found = self.data.get("budgets")
        return [b for b in found if isinstance(b, Mapping)] if isinstance(found, list) else []

    @property
    def over_budget(self) -> bool:
        """Whether a budget failed the case's test (or could not be checked)."""
        return any(b.get("failed") for b in self.budget_checks)

    def verdict_text(self, *, recorded: bool = False) -> str:
        """The verdict as every report names it (``judging.verdict.verdict_label``);
        ``recorded``: say so of a recording."""
        return verdict_label(self.verdict, over_budget=self.over_budget,
                             recorded=recorded and self.recorded)  # fmt: skip

    def center(self, name: str) -> float | None:
        """``name``'s center over the case's server processes (a ``CENTER_ROWS`` figure):
        the report's ``centers.now``; in a report that did not save it (the step and phases
        before 2026-12-03, the accepted length and tokens/s before 2026-12-06), computed as
        the judge computes it (``CaseOutcome.now_centers``) from each process's saved value
        (``runs``, there since a case could have several); None where neither holds it (a
        case of one process: its figures are the center)."""
        center = _number_or_none((self.centers("now") or {}).get(name))
        runs = self.data.get("runs")
        if center is not None or self.processes < 2 or not isinstance(runs, list):
            return center
        saved = [r.get("values") for r in runs if isinstance(r, Mapping)]
        values = [v for v in saved if isinstance(v, Mapping)]
        if len(values) < len(runs) or name not in values[0]:
            return None
        found = [_number_or_none(v[name]) for v in values if name in v]
        centers = [x for x in found if x is not None]
        return center_of_centers(centers) if len(centers) == len(found) else None

    def first_process_only(self, name: str) -> bool:
        """Whether the figure of ``name`` read from the case is its first server process's
        alone although it measured several (a report that saved no center of it, nor every
        process's value)."""
        return self.processes > 1 and self.center(name) is None

    @property
    def accept_len(self) -> float | None:
        """The accepted length's center over the case's server processes (the number its
        ``accept_len`` verdict judged; ``center``); where no center can be had, the first
        process's."""
        center = self.center(ACCEPT_LEN)
        if center is not None:
            return center
        s = self.data.get(ACCEPT_LEN)
        return _number_or_none(s.get(s.get("center", "median"))) if isinstance(s, Mapping) else None

    @property
    def step_ms(self) -> float:
        """The step's center over the case's server processes (what the summary shows and
        the verdict compared; ``center``); where no center can be had, the first
        process's median."""
        center = self.center(STEP)
        return self.step_median_ms if center is None else center

    def phase_ms(self, phase: str) -> float | None:
        """``phase``'s center over the case's server processes (``center``; ``median_ms``
        of the first process where no center can be had), None where missing."""
        center = self.center(phase)
        return self.median_ms(phase) if center is None else center

    @property
    def injected(self) -> str | None:
        """The canary the run carried (``labels.inject``: ``verify=1.1``), None if none."""
        labels = self.data.get("labels")
        inject = labels.get("inject") if isinstance(labels, Mapping) else None
        return inject if isinstance(inject, str) and inject else None

    @property
    def recorded(self) -> bool:
        """Whether this run was recorded as the case's baseline."""
        return self.data.get("recorded") is True

    @property
    def baseline_at(self) -> str | None:
        """When the baseline this case was judged against was recorded."""
        b = self.data.get("baseline")
        at = b.get("recorded_at") if isinstance(b, Mapping) else None
        return at if isinstance(at, str) else None

    @property
    def fingerprint(self) -> Mapping[str, Any]:
        fp = self.data.get("fingerprint")
        return fp if isinstance(fp, Mapping) else {}

    def centers(self, which: str) -> Mapping[str, Any] | None:
        """Per step part, its center over this measurement's server processes (``now``)
        or over the baseline's runs (``base``; None without a baseline)."""
        centers = self.data.get("centers")
        found = centers.get(which) if isinstance(centers, Mapping) else None
        return found if isinstance(found, Mapping) else None

    @property
    def processes(self) -> int:
        """Server processes the case was measured in (``--specperf-processes``)."""
        runs = self.data.get("runs")
        return max(1, len(runs)) if isinstance(runs, list) else 1

    @property
    def rounds(self) -> int:
        """Rounds of its blocks the case measured (the automatic extension)."""
        runs = self.data.get("runs")
        first = runs[0] if isinstance(runs, list) and runs else None
        r = first.get("rounds") if isinstance(first, Mapping) else None
        return r if isinstance(r, int) and r >= 1 else 1

    @property
    def rounds_per_look(self) -> int:
        """The rounds its first tested process measured a look: an A/B case's
        (``judging.ab.rounds_per_look`` of its sides' processes), else 1."""
        ab = self.data.get("ab")
        a = ab.get("reference_processes") if isinstance(ab, Mapping) else None
        if not isinstance(a, int) or isinstance(a, bool) or a < 1:
            return 1
        return rounds_per_look(a, self.processes)

    @property
    def ab_reference(self) -> str | None:
        """An A/B case's reference side as typed (``python=...``); None: a baseline file."""
        ab = self.data.get("ab")
        ref = ab.get("reference") if isinstance(ab, Mapping) else None
        return ref if isinstance(ref, str) else None


@dataclass(frozen=True)
class Report:
    """A report file as read back: its settings and cases (``data`` holds the rest)."""

    path: Path
    schema_version: int
    tolerance: float | None
    step_tolerance: float | None
    cases: tuple[CaseRecord, ...]
    data: Mapping[str, Any]
    #: when the run ended (ISO 8601, UTC), None where the file does not say
    datetime: str | None = None
    #: the commit the run measured, as pytest-benchmark records it (``id``, ``dirty``, ...)
    commit: Mapping[str, Any] = field(default_factory=dict)
    #: ``report`` (``--specperf-json``) or ``pytest-benchmark`` (its JSON or storage)
    source: str = "report"

    @property
    def tests(self) -> int:
        """The specperf tests whose cases the report holds (its distinct node ids, at
        least 1): the fewest the run's false-alarm budget was shared by."""
        return max(1, len({c.nodeid for c in self.cases}))


def _case(path: Path, i: int, c: Any) -> CaseRecord:
    try:
        return CaseRecord.from_json(c)
    except ValueError as e:
        raise ReportError(path, f"cases[{i}]: {e}") from None


def _number_or_none(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


class ForeignFile(ReportError):
    """A readable JSON file that holds no pytest-specperf run (another tool's file, or a
    pytest-benchmark run without specperf cases)."""


def is_benchmark_file(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is a pytest-benchmark run (``--benchmark-json`` or its storage)."""
    return isinstance(data.get("benchmarks"), list) and "machine_info" in data


def _from_benchmark_file(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """A pytest-benchmark run as a report: its ``specperf`` header, the ``specperf`` case of
    each benchmark that has one, its date and commit."""
    header = data.get(SPECPERF_KEY)
    if not isinstance(header, Mapping):
        raise ForeignFile(path, "a pytest-benchmark run without pytest-specperf cases")
    cases = []
    for b in data["benchmarks"]:
        extra = b.get("extra_info") if isinstance(b, Mapping) else None
        if isinstance(extra, Mapping) and SPECPERF_KEY in extra:
            cases.append(extra[SPECPERF_KEY])
    commit = data.get("commit_info")
    return {**header, "cases": cases, "datetime": data.get("datetime"), "commit_info": commit}


def _load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(path, f"cannot read: {e}") from None
    except ValueError as e:
        raise ReportError(path, f"not JSON (truncated or corrupt?): {e}") from None


def _check_version(path: Path, data: Mapping[str, Any]) -> int:
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise ReportError(
            path,
            f"schema_version {version!r} is not one this pytest-specperf reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}); upgrade pytest-specperf if the "
            "report is newer",
        )
    return int(version)


def read_report(path: Path) -> Report:
    """Read a report or a pytest-benchmark run; ``ReportError`` naming the file for
    anything unusable (``ForeignFile`` for a JSON file that holds no specperf run)."""
    data = _load_json(path)
    if not isinstance(data, dict):
        raise ForeignFile(path, "not a pytest-specperf report (top level is not an object)")
    source = "report"
    if is_benchmark_file(data):
        data, source = _from_benchmark_file(path, data), "pytest-benchmark"
    elif "schema_version" not in data and "cases" not in data:
        raise ForeignFile(path, "not a pytest-specperf report (no schema_version, no cases)")
    version = _check_version(path, data)
    cases = data.get("cases")
    if not isinstance(cases, list):
        raise ReportError(path, "cases: expected a list")
    stamp, commit = data.get("datetime"), data.get("commit_info")
    return Report(
        path=Path(path),
        schema_version=version,
        tolerance=_number_or_none(data.get("tolerance")),
        step_tolerance=_number_or_none(data.get("step_tolerance")),
        cases=tuple(_case(path, i, c) for i, c in enumerate(cases)),
        data=data,
        datetime=stamp if isinstance(stamp, str) else None,
        commit=commit if isinstance(commit, Mapping) else {},
        source=source,
    )


def payload_of_cases(header: Mapping[str, Any], cases: Sequence[CaseRecord]) -> dict[str, Any]:
    """The whole report: ``header`` (device, backend, settings, servers) and the cases."""
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        **header,
        "cases": [c.to_json() for c in cases],
    }


def report_payload(header: Mapping[str, Any], outcomes: Sequence[CaseOutcome]) -> dict[str, Any]:
    """The whole report: ``header`` (device, backend, settings, server) and the cases."""
    return payload_of_cases(header, [CaseRecord.of(o) for o in outcomes])
