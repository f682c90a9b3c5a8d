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


def _phase_values(centers: Mapping[str, Any]) -> dict[str, Any]:
    return {p: centers[p] for p in ALL_PHASES if p in centers}


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
    #: the verdict's reasons (the report's ``reasons`` add the judge's notes)
    reasons: tuple[str, ...]
    #: the mean accepted length, unrounded (the report's summary is rounded as stored)
    accept_len: float
    metrics: tuple[MetricVerdict, ...]
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
    #: the JSON report's form of the case (``store.report.case_json``): the one record of
    #: the judged case; the verdict, the recorded flag, the canary and the centers people
    #: read are taken from it, not copied beside it
    report: Mapping[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.report["verdict"])

    @property
    def recorded(self) -> bool:
        return self.report.get("recorded") is True

    @property
    def injected(self) -> str | None:
        """The canary the run carried (``labels.inject``), None if none."""
        labels = self.report.get("labels")
        inject = labels.get("inject") if isinstance(labels, Mapping) else None
        return inject if isinstance(inject, str) and inject else None

    def _centers(self, which: str) -> Mapping[str, Any] | None:
        centers = self.report.get("centers")
        found = centers.get(which) if isinstance(centers, Mapping) else None
        return found if isinstance(found, Mapping) else None

    @property
    def step_ms(self) -> float:
        """The step's center now (over this measurement's server processes)."""
        now = self._centers("now") or {}
        return _num(now.get(STEP))

    @property
    def base_step_ms(self) -> float | None:
        """The step's center in the baseline (None without one)."""
        base = self._centers("base")
        return None if base is None or STEP not in base else _num(base[STEP])

    @property
    def phases(self) -> Mapping[str, float]:
        """Phase -> its center now (ms)."""
        return _numbers(_phase_values(self._centers("now") or {}))

    @property
    def base_phases(self) -> Mapping[str, float] | None:
        """Phase -> its center in the baseline (None without one)."""
        base = self._centers("base")
        return None if base is None else _numbers(_phase_values(base))

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
        return cls(
            nodeid=o.nodeid,
            test=o.test,
            key=o.key,
            reasons=o.verdict.reasons,
            accept_len=o.run.accept_len,
            metrics=o.verdict.metrics,
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
                "reasons": list(self.reasons),
                ACCEPT_LEN: self.accept_len,
                "metrics": [m.to_json() for m in self.metrics],
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
            Verdict(d["report"]["verdict"])  # the record the view reads is usable
            return cls(
                nodeid=str(d["nodeid"]),
                test=str(d["test"]),
                key=str(d["key"]),
                reasons=tuple(str(r) for r in d["reasons"]),
                accept_len=_num(d[ACCEPT_LEN]),
                metrics=tuple(MetricVerdict.from_json(m) for m in d["metrics"]),
                baseline_file=str(d["baseline_file"]),
                failure=str(d["failure"]),
                unjudged=tuple(str(u) for u in d["unjudged"]),
                over_budget=tuple(str(b) for b in d.get("over_budget", ())),
                diagnosis=tuple(str(b) for b in d.get("diagnosis", ())),
                report=MappingProxyType(dict(d["report"])),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a case view ({type(e).__name__}: {e})") from None
