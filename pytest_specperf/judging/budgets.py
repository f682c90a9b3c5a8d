"""Budgets: absolute limits a case must meet whatever its baseline says (pure).

A comparison with a baseline cannot catch a state that was already bad when the baseline
was recorded, nor anything on a first run (``NO_BASELINE`` passes). A budget can: the
incident this project was started for (192 ms per step at 1% GPU activity) fails a
``min_active_share`` budget on its very first run. Budgets come from the ``specperf``
marker's keywords and their ini twins (the marker wins); each is checked on the run's
center (median step, mean accept length and tokens/s, median shares).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from pytest_specperf.judging.metrics import ACCEPT_LEN, ACTIVE_SHARE, STEP, TOKENS_PER_S
from pytest_specperf.judging.samples import DecodeRun
from pytest_specperf.probe.phases import UNACCOUNTED

Bound = Literal["max", "min"]


@dataclass(frozen=True)
class Budgets:
    """The limits of one case (None: no limit). Shares are fractions (0.5 = 50%)."""

    max_unaccounted_share: float | None = None
    min_active_share: float | None = None
    max_step_ms: float | None = None
    min_accept_len: float | None = None
    min_tokens_per_s: float | None = None

    def over(self, closer: Budgets) -> Budgets:
        """These budgets with every limit ``closer`` sets replacing ours (marker over ini)."""
        given = {f.name: getattr(closer, f.name) for f in fields(closer)}
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


#: Budget keyword -> (metric it limits, bound, whether it is a share)
BUDGETS: dict[str, tuple[str, Bound, bool]] = {
    "max_unaccounted_share": (UNACCOUNTED, "max", True),
    "min_active_share": (ACTIVE_SHARE, "min", True),
    "max_step_ms": (STEP, "max", False),
    "min_accept_len": (ACCEPT_LEN, "min", False),
    "min_tokens_per_s": (TOKENS_PER_S, "min", False),
}
#: Keywords whose value is a share (a fraction, or a percentage such as '50%').
SHARE_BUDGETS = tuple(k for k, (_, _, share) in BUDGETS.items() if share)
_UNITS = {STEP: "ms", ACCEPT_LEN: "tok/step", TOKENS_PER_S: "tok/s"}
#: Budgets on a figure the reports show as a center over the server processes.
_CENTERED = frozenset(_UNITS)


@dataclass(frozen=True)
class BudgetCheck:
    """One budget checked on one run: the value it saw (None: not measured)."""

    budget: str
    metric: str
    bound: Bound
    limit: float
    value: float | None
    #: why the value is missing (when it is)
    missing: str = ""

    @property
    def share(self) -> bool:
        return BUDGETS[self.budget][2]

    @property
    def failed(self) -> bool:
        """Breached, or not measurable (a budget that cannot be checked never passes)."""
        if self.value is None or not math.isfinite(self.value):
            return True
        return self.value > self.limit if self.bound == "max" else self.value < self.limit

    def _fmt(self, x: float) -> str:
        return f"{x * 100:.1f}%" if self.share else f"{x:.4g} {_UNITS.get(self.metric, '')}".strip()

    def describe(self) -> str:
        limit = f"{self.bound} {self._fmt(self.limit)}"
        if self.value is None or not math.isfinite(self.value):
            return f"budget {self.budget} ({limit}) cannot be checked: {self.missing}"
        sign = ">" if self.bound == "max" else "<"
        if not self.failed:
            sign = "<=" if self.bound == "max" else ">="
        state = "over budget" if self.failed else "within budget"
        return f"{state}: {self.metric} {self._fmt(self.value)} {sign} {limit} ({self.budget})"

    def to_json(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "metric": self.metric,
            "bound": self.bound,
            "limit": self.limit,
            "value": self.value,
            "failed": self.failed,
            "describe": self.describe(),
        }


def _active_missing(run: DecodeRun) -> str:
    if run.has_device_times:
        return (
            "the device's active share was not measured (no kernel samples: run with "
            "--specperf-profile kernels=N, N > 0)"
        )
    return "the active share was not measured (step records without CPU times)"


def _value(run: DecodeRun, metric: str) -> tuple[float | None, str]:
    s = run.summaries
    if metric == UNACCOUNTED:
        step = s[STEP].median
        return (s[UNACCOUNTED].median / step if step > 0 else None), "no step time"
    if metric == ACTIVE_SHARE:
        a = s.get(ACTIVE_SHARE)
        return (a.median if a is not None else None), _active_missing(run)
    summary = s.get(metric)
    return (summary.value if summary is not None else None), f"{metric} was not measured"


def check_budgets(
    run: DecodeRun, budgets: Budgets | None, centers: Mapping[str, float] | None = None
) -> tuple[BudgetCheck, ...]:
    """Every budget set, checked on ``run``; the step, accept length and tokens/s budgets
    on ``centers`` where given (the centers over the case's server processes, the numbers
    every report shows), and the unaccounted share as the phase table shows it (its center
    over the step's); the active share on ``run`` (the first process, as its run line)."""
    if budgets is None:
        return ()
    out = []
    for name, (metric, bound, _) in BUDGETS.items():
        limit = getattr(budgets, name)
        if limit is None:
            continue
        value, missing = _value(run, metric)
        if centers is not None and metric in _CENTERED and metric in centers:
            value = centers[metric]
        elif metric == UNACCOUNTED and centers and {UNACCOUNTED, STEP} <= centers.keys():
            # the phase table's share: the unaccounted center over the step's
            step = centers[STEP]
            value = centers[UNACCOUNTED] / step if step > 0 else None
        out.append(BudgetCheck(name, metric, bound, float(limit), value, missing))
    return tuple(out)


def budget_expectation(name: str) -> str:
    """What a valid value of budget ``name`` looks like (for error messages)."""
    if name in SHARE_BUDGETS:
        return "a share in (0, 1] like 0.5, or a percentage like '50%'"
    return "a positive number"


def parse_budget(name: str, raw: object) -> float:
    """The limit of budget ``name`` from a marker keyword or an ini value; ``ValueError``
    (its text says what is valid) for anything else."""
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}; valid: {', '.join(BUDGETS)}")
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(budget_expectation(name))
    text = str(raw).strip()
    try:
        if name in SHARE_BUDGETS and text.endswith("%"):
            value = float(text[:-1]) / 100
        else:
            value = float(text)
    except ValueError:
        raise ValueError(budget_expectation(name)) from None
    top = 1.0 if name in SHARE_BUDGETS else math.inf
    if not math.isfinite(value) or not 0 < value <= top:
        raise ValueError(budget_expectation(name))
    return value
