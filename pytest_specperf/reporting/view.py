"""One judged case as the end-of-run reports see it, and its JSON form.

Every report written at the end of a run (terminal summary, JSON, picture, Markdown)
reads ``CaseView``s, never the full ``CaseOutcome``: a case judged in this process and a
case judged in a pytest-xdist worker (sent to the controller as ``to_json()``, read back
with ``from_json``) are reported by the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.metrics import ACCEPT_LEN, STEP
from pytest_specperf.judging.verdict import MetricVerdict, Verdict
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.store.report import case_json, strict


def _phase_values(centers: Mapping[str, float]) -> dict[str, float]:
    return {p: float(centers[p]) for p in ALL_PHASES if p in centers}


def _num(x: Any) -> float:
    """A number as written by ``to_json`` (a non-finite one was written as null)."""
    return math.nan if x is None else float(x)


def _numbers(d: Mapping[str, Any]) -> Mapping[str, float]:
    return MappingProxyType({str(k): _num(v) for k, v in d.items()})


def diagnosis_lines(outcome: CaseOutcome) -> list[str]:
    """The diagnosis of a case in words with numbers: its budgets, where the time went,
    the bottleneck verdict, and per phase whether it worked or waited (pure; the terminal,
    the ``-rP`` section and the Markdown summary all call it)."""
    lines = [b.describe() for b in outcome.budgets]
    if outcome.time_went:
        lines.append(outcome.time_went)
    b = outcome.bottleneck
    if b is not None:
        lines.append(f"bottleneck: {b.describe()}")
        lines += [f"  {line}" for line in b.lines]
    return lines


@dataclass(frozen=True)
class CaseView:
    """What the summary, the JSON report, the picture and the Markdown need of a case."""

    nodeid: str
    test: str
    key: str
    verdict: Verdict
    reasons: tuple[str, ...]
    recorded: bool
    injected: str | None
    step_ms: float
    base_step_ms: float | None
    accept_len: float
    metrics: tuple[MetricVerdict, ...]
    #: phase -> median ms now, and in the baseline (None without one)
    phases: Mapping[str, float]
    base_phases: Mapping[str, float] | None
    #: the baseline file as shown to people
    baseline_file: str
    #: the lines that failed the test ("" when it passed)
    failure: str = ""
    #: ``--specperf-strict``: why the case does not count as judged (empty: it does)
    unjudged: tuple[str, ...] = ()
    #: the budgets the run breached, described
    over_budget: tuple[str, ...] = ()
    #: the diagnosis in words: where the time went, bottleneck, per phase worked or waited
    diagnosis: tuple[str, ...] = ()
    #: the JSON report's form of the case
    report: Mapping[str, Any] = field(default_factory=dict)

    @property
    def processes(self) -> int:
        """Server processes the case was measured in (``--specperf-processes``)."""
        runs = self.report.get("runs")
        return max(1, len(runs)) if isinstance(runs, list) else 1

    @property
    def rounds(self) -> int:
        """Rounds of its blocks the case measured (the automatic extension)."""
        runs = self.report.get("runs")
        first = runs[0] if isinstance(runs, list) and runs else None
        r = first.get("rounds") if isinstance(first, Mapping) else None
        return r if isinstance(r, int) and r >= 1 else 1

    @property
    def ab_reference(self) -> str | None:
        """An A/B case's reference side as typed (``python=...``); None: a baseline file."""
        ab = self.report.get("ab")
        ref = ab.get("reference") if isinstance(ab, Mapping) else None
        return ref if isinstance(ref, str) else None

    @property
    def name(self) -> str:
        """``test_decode ctx=46000 kv=contiguous bs=1``: the test's name and the case key."""
        return f"{self.test.rsplit('::', 1)[-1]} {self.key}"

    @classmethod
    def of(
        cls,
        o: CaseOutcome,
        *,
        baseline_file: str,
        failure: str = "",
        unjudged: tuple[str, ...] = (),
    ) -> CaseView:
        """The view of a case judged in this process."""
        base, now = o.base_centers, o.now_centers
        return cls(
            nodeid=o.nodeid,
            test=o.test,
            key=o.key,
            verdict=o.verdict.verdict,
            reasons=o.verdict.reasons,
            recorded=o.recorded,
            injected=o.run.injected,
            step_ms=now[STEP],
            base_step_ms=base.get(STEP) if base is not None else None,
            accept_len=o.run.accept_len,
            metrics=o.verdict.metrics,
            phases=MappingProxyType(_phase_values(now)),
            base_phases=MappingProxyType(_phase_values(base)) if base is not None else None,
            baseline_file=baseline_file,
            failure=failure,
            unjudged=unjudged,
            over_budget=tuple(b.describe() for b in o.over_budget),
            diagnosis=tuple(diagnosis_lines(o)),
            report=MappingProxyType(strict(case_json(o))),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (pytest-xdist sends it from a worker to the controller)."""
        out: dict[str, Any] = strict(
            {
                "nodeid": self.nodeid,
                "test": self.test,
                "key": self.key,
                "verdict": self.verdict.value,
                "reasons": list(self.reasons),
                "recorded": self.recorded,
                "injected": self.injected,
                "step_ms": self.step_ms,
                "base_step_ms": self.base_step_ms,
                ACCEPT_LEN: self.accept_len,
                "metrics": [m.to_json() for m in self.metrics],
                "phases": dict(self.phases),
                "base_phases": dict(self.base_phases) if self.base_phases is not None else None,
                "baseline_file": self.baseline_file,
                "failure": self.failure,
                "unjudged": list(self.unjudged),
                "over_budget": list(self.over_budget),
                "diagnosis": list(self.diagnosis),
                "report": dict(self.report),
            }
        )
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaseView:
        """Read ``to_json``'s form; ``ValueError`` naming the field if it is unusable."""
        try:
            base_phases = d["base_phases"]
            return cls(
                nodeid=str(d["nodeid"]),
                test=str(d["test"]),
                key=str(d["key"]),
                verdict=Verdict(d["verdict"]),
                reasons=tuple(str(r) for r in d["reasons"]),
                recorded=bool(d["recorded"]),
                injected=str(d["injected"]) if d["injected"] else None,
                step_ms=_num(d["step_ms"]),
                base_step_ms=None if d["base_step_ms"] is None else _num(d["base_step_ms"]),
                accept_len=_num(d[ACCEPT_LEN]),
                metrics=tuple(MetricVerdict.from_json(m) for m in d["metrics"]),
                phases=_numbers(d["phases"]),
                base_phases=None if base_phases is None else _numbers(base_phases),
                baseline_file=str(d["baseline_file"]),
                failure=str(d["failure"]),
                unjudged=tuple(str(u) for u in d["unjudged"]),
                over_budget=tuple(str(b) for b in d.get("over_budget", ())),
                diagnosis=tuple(str(b) for b in d.get("diagnosis", ())),
                report=MappingProxyType(dict(d["report"])),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a case view ({type(e).__name__}: {e})") from None
