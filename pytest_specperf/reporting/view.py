"""One judged case as the end-of-run reports see it, and its JSON form.

Every report written at the end of a run (terminal summary, JSON, picture, Markdown)
reads ``CaseView``s, never the full ``CaseOutcome``: a case judged in this process and a
case judged in a pytest-xdist worker (sent to the controller as ``to_json()``, read back
with ``from_json``) are reported by the same code. A view is the case's record
(``store.report.CaseRecord``, what the JSON report holds) and what the plugin said of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pytest_specperf.judging.judge import CaseOutcome
from pytest_specperf.judging.metrics import STEP
from pytest_specperf.judging.verdict import MetricVerdict, Verdict
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.store.report import CaseRecord, strict


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
    the ``-rP`` section and the Markdown summary all call it, or ``CaseView.diagnosis``)."""
    b = outcome.bottleneck
    return _diagnosis(
        [c.describe() for c in outcome.budgets],
        outcome.time_went,
        (b.describe(), list(b.lines)) if b is not None else None,
        len(outcome.run.processes),
        ab=outcome.reference is not None,
    )


def _diagnosis(
    budgets: list[str],
    time_went: str | None,
    bottleneck: tuple[str, list[str]] | None,
    processes: int,
    *,
    ab: bool,
) -> list[str]:
    lines = list(budgets)
    if time_went:
        lines.append(time_went)
    if bottleneck is not None:
        # its figures are the first server process's (activity is not pooled over
        # processes), not the centers beside it: say so where there are several
        side = "B's " if ab else ""  # A/B: the run's processes are the tested side's
        which = f" ({side}server process 1 of {processes})" if processes > 1 else ""
        lines.append(f"bottleneck{which}: {bottleneck[0]}")
        lines += [f"  {line}" for line in bottleneck[1]]
    return lines


@dataclass(frozen=True)
class CaseView:
    """A judged case as the end-of-run reports see it: its record (``CaseRecord``, the
    case as written) and what the plugin said of it, which the record does not hold
    (the failure lines, the strict check, the baseline file as shown)."""

    #: the case as written (``store.report.case_json``): verdict, reasons, metrics,
    #: centers, figures; the views' properties read it, nothing is copied beside it
    record: CaseRecord
    #: the baseline file as shown to people
    baseline_file: str
    #: the lines that failed the test ("" when it passed)
    failure: str = ""
    #: ``--specperf-strict``: why the case does not count as judged (empty: it does)
    unjudged: tuple[str, ...] = ()

    @property
    def over_budget(self) -> tuple[str, ...]:
        """The budgets the run breached (or could not check), described."""
        return tuple(str(b.get("describe")) for b in self.record.budget_checks if b.get("failed"))

    @property
    def diagnosis(self) -> tuple[str, ...]:
        """The diagnosis in words: budgets, where the time went, the bottleneck, per phase
        worked or waited (``diagnosis_lines`` of the judged case, read from its record)."""
        data = self.record.data
        b = data.get("bottleneck")
        bottleneck = None
        if isinstance(b, Mapping):
            bottleneck = (str(b.get("describe")), [str(x) for x in b.get("lines") or ()])
        went = data.get("time_went")
        budgets = [str(x.get("describe")) for x in self.record.budget_checks]
        went = went if isinstance(went, str) else None
        return tuple(_diagnosis(budgets, went, bottleneck, self.record.processes,
                                ab=self.ab_reference is not None))  # fmt: skip

    @property
    def nodeid(self) -> str:
        return self.record.nodeid

    @property
    def test(self) -> str:
        return self.record.test

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def verdict(self) -> Verdict:
        return self.record.verdict

    @property
    def metrics(self) -> tuple[MetricVerdict, ...]:
        return self.record.metrics

    @property
    def reasons(self) -> tuple[str, ...]:
        """The verdict's reasons (the written ``reasons`` add the judge's notes)."""
        return self.record.verdict_reasons

    @property
    def accept_len(self) -> float:
        """The accepted length's center over the case's server processes (the number its
        verdict judged; ``CaseRecord.accept_len``)."""
        a = self.record.accept_len
        return math.nan if a is None else a

    @property
    def recorded(self) -> bool:
        return self.record.recorded

    @property
    def injected(self) -> str | None:
        """The canary the run carried (``labels.inject``), None if none."""
        return self.record.injected

    @property
    def step_ms(self) -> float:
        """The step's center now (over this measurement's server processes)."""
        now = self.record.centers("now") or {}
        return _num(now.get(STEP))

    @property
    def base_step_ms(self) -> float | None:
        """The step's center in the baseline (None without one)."""
        base = self.record.centers("base")
        return None if base is None or STEP not in base else _num(base[STEP])

    @property
    def phases(self) -> Mapping[str, float]:
        """Phase -> its center now (ms)."""
        return _numbers(_phase_values(self.record.centers("now") or {}))

    @property
    def base_phases(self) -> Mapping[str, float] | None:
        """Phase -> its center in the baseline (None without one)."""
        base = self.record.centers("base")
        return None if base is None else _numbers(_phase_values(base))

    @property
    def processes(self) -> int:
        """Server processes the case was measured in (``--specperf-processes``)."""
        return self.record.processes

    @property
    def rounds(self) -> int:
        """Rounds of its blocks the case measured (the automatic extension)."""
        return self.record.rounds

    @property
    def rounds_per_look(self) -> int:
        """The rounds its first tested process measured a look (``CaseRecord``'s)."""
        return self.record.rounds_per_look

    @property
    def ab_reference(self) -> str | None:
        """An A/B case's reference side as typed (``python=...``); None: a baseline file."""
        return self.record.ab_reference

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
            record=CaseRecord.of(o),
            baseline_file=baseline_file,
            failure=failure,
            unjudged=unjudged,
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (pytest-xdist sends it from a worker to the controller)."""
        out: dict[str, Any] = strict(
            {
                "record": self.record.to_json(),
                "baseline_file": self.baseline_file,
                "failure": self.failure,
                "unjudged": list(self.unjudged),
            }
        )
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaseView:
        """Read ``to_json``'s form; ``ValueError`` naming the field if it is unusable."""
        try:
            return cls(
                record=CaseRecord.from_json(d["record"]),
                baseline_file=str(d["baseline_file"]),
                failure=str(d["failure"]),
                unjudged=tuple(str(u) for u in d["unjudged"]),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a case view ({type(e).__name__}: {e})") from None
