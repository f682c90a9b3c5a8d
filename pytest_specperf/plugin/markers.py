"""Markers: ``specperf(...)``, ``long_context``, ``gpu``; validation and auto-marking."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_specperf.judging.budgets import BUDGETS, Budgets, budget_expectation, parse_budget
from pytest_specperf.judging.metrics import GATEABLE, unknown_gates
from pytest_specperf.settings import TOLERANCE_FORM, ToleranceSpec, parse_tolerance

MARKERS = (
    "specperf(gate=None, tolerance=None, steps=None, warmup=None, "
    "context_len=None, max_unaccounted_share=None, min_active_share=None, max_step_ms=None, "
    "min_accept_len=None, min_tokens_per_s=None): speculative-decoding performance case: "
    "gate=[metrics or phases] to "
    "judge (step, accept_len, tokens_per_s, unaccounted, a phase such as verify, or a "
    "utilization such as util.sm), "
    f"tolerance='{TOLERANCE_FORM}' ('10%', '10%,step=30%', 'step=30%' or 0.1) to override "
    "the run's tolerances, "
    "steps= / warmup= decode steps, context_len= to declare the context length of a "
    "non-parametrized case; budgets that fail the case whatever its baseline says: "
    "max_unaccounted_share= and min_active_share= (0.5 or '50%'), max_step_ms=, "
    "min_accept_len=, min_tokens_per_s=",
    "long_context: decode at a long context; added automatically to cases whose context "
    "length is at or above the ini option specperf_long_context_min",
    "gpu: needs a CUDA GPU; skipped with a reason where there is none",
)

_KEYWORDS = (
    "gate",
    "tolerance",
    "steps",
    "warmup",
    "context_len",
    *BUDGETS,
)


@dataclass(frozen=True)
class CaseOptions:
    """What the ``specperf`` marker of one test asks for."""

    gate: tuple[str, ...] | None = None
    #: from ``tolerance='PHASE,step=STEP'`` (None: the part was not given)
    tolerance: float | None = None
    step_tolerance: float | None = None
    steps: int | None = None
    warmup: int | None = None
    context_len: int | None = None
    budgets: Budgets = field(default_factory=Budgets)


#: Old keywords -> what replaced them.
_REPLACED = {"step_tolerance": f"tolerance='{TOLERANCE_FORM}', e.g. tolerance='step=30%'"}


def _err(item: pytest.Item, what: str) -> str:
    return f"{item.nodeid}: @pytest.mark.specperf: {what}"


def _merged(item: pytest.Item) -> dict[str, object]:
    """The test's ``specperf`` marker keywords, the closest marker winning."""
    merged: dict[str, object] = {}
    for mark in reversed(list(item.iter_markers("specperf"))):
        if mark.args:
            raise ValueError(_err(item, f"takes keyword arguments only, got {mark.args!r}"))
        merged.update(mark.kwargs)
    for old, new in _REPLACED.items():
        if old in merged:
            raise ValueError(_err(item, f"{old}= was replaced by {new}"))
    unknown = sorted(set(merged) - set(_KEYWORDS))
    if unknown:
        raise ValueError(
            _err(item, f"unknown keyword(s) {', '.join(unknown)}; valid: {', '.join(_KEYWORDS)}")
        )
    return merged


def _gates(item: pytest.Item, gate: object) -> tuple[str, ...] | None:
    if gate is None:
        return None
    if isinstance(gate, str):
        gate = [gate]
    if not isinstance(gate, (list, tuple)) or not gate:
        raise ValueError(_err(item, f"gate must be a non-empty list of names, got {gate!r}"))
    bad = [g for g in gate if not isinstance(g, str) or unknown_gates([g])]
    if bad:
        raise ValueError(
            _err(
                item,
                f"gate: unknown metric(s) {', '.join(map(repr, bad))}; "
                f"valid: {', '.join(GATEABLE)}",
            )
        )
    return tuple(str(g) for g in gate)


def _tolerance(item: pytest.Item, tol: object) -> ToleranceSpec:
    if tol is None:
        return ToleranceSpec()
    try:
        return parse_tolerance(tol)  # the one parser, as --specperf-tolerance's
    except ValueError as e:
        raise ValueError(_err(item, f"tolerance: {e}")) from None


def _int(item: pytest.Item, name: str, v: object, lo: int) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(_err(item, f"{name} must be an integer >= {lo}, got {v!r}"))
    return v


def _budgets(item: pytest.Item, m: dict[str, object]) -> Budgets:
    limits = {}
    for name in BUDGETS:
        raw = m.get(name)
        if raw is None:
            continue
        try:
            limits[name] = parse_budget(name, raw)
        except ValueError:
            raise ValueError(
                _err(item, f"{name} {raw!r} must be {budget_expectation(name)}")
            ) from None
    return Budgets(**limits)


def parse_marker(item: pytest.Item) -> CaseOptions:
    """Merge the test's ``specperf`` markers (closest wins); raise ``ValueError`` if bad."""
    m = _merged(item)
    tolerance = _tolerance(item, m.get("tolerance"))
    return CaseOptions(
        gate=_gates(item, m.get("gate")),
        tolerance=tolerance.phase,
        step_tolerance=tolerance.step,
        steps=_int(item, "steps", m.get("steps"), 4),
        warmup=_int(item, "warmup", m.get("warmup"), 0),
        context_len=_int(item, "context_len", m.get("context_len"), 1),
        budgets=_budgets(item, m),
    )


def case_context_len(item: pytest.Item, opts: CaseOptions) -> int | None:
    """The context length a case declares: a ``context_len`` parameter or marker keyword."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        v = callspec.params.get("context_len")
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return opts.context_len
