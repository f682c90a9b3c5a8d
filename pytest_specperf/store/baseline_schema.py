"""The baseline file's case entries parsed and validated (store): plain data in, the
pure records of ``judging.baselines`` (``RunRecord``, ``NotGated``) or a named problem out.

A small typed validator rather than a schema library: the rules that matter here are
semantic (time medians > 0, a phase's judged form > 0 when the phase is, lists as long as
the runs, the metrics every verdict needs), every problem must name its field in the
file's own terms (``phases.step.ms`` in a v3 file, ``value.step`` in a v2 file,
``metrics.step.median`` in a v1 file), and the
package keeps its dependencies few. Nothing here reads files or raises anything but
``Invalid``, whose text is ``<field>: <problem>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pytest_specperf import brief
from pytest_specperf.judging.baselines import NotGated, RunRecord, keeps_blocks, make_run
from pytest_specperf.judging.metrics import (
    ACCEPT_LEN,
    GATEABLE,
    STEP,
    STEP_PARTS,
    STEP_PER_REF,
    TOKENS_PER_S,
    MetricKind,
    active_form,
    center_of,
    cpu_form,
    device_form,
    is_rest_form,
    rest_form,
    spec,
)
from pytest_specperf.judging.stats import Summary
from pytest_specperf.probe.phases import CORE_PHASES, PHASES, UNACCOUNTED

_GATE_NAMES = frozenset(GATEABLE)
#: Most runs kept per case (``keep_runs`` may not exceed it).
MAX_RUNS = 64
#: Most block centers per run and metric.
MAX_BLOCKS = 4096
#: Most metrics per case.
MAX_METRICS = 256
#: Most measured steps per run.
MAX_STEPS = 10_000_000
#: Metrics every measured case has and the verdicts need.
REQUIRED_METRICS = (
    STEP,
    UNACCOUNTED,
    ACCEPT_LEN,
    TOKENS_PER_S,
    *CORE_PHASES,
    *(rest_form(p) for p in CORE_PHASES),
)
#: Metrics whose every value must be > 0 (a time that a ratio is taken against).
POSITIVE_METRICS = frozenset({STEP, STEP_PER_REF})
#: Metrics that may be negative (the step minus its named phases).
SIGNED_METRICS = frozenset({UNACCOUNTED})
_CASE_FIELDS_V2 = ("fingerprint", "steps", "runs", "value", "blocks")
_CASE_FIELDS_V3 = ("fingerprint", "steps", "runs", "phases", "value", "blocks")
_CASE_FIELDS_V4 = (*_CASE_FIELDS_V3, "not_gated")
_RUN_FIELDS_V3 = ("at", "pid")
_RUN_FIELDS_V4 = ("at", "pid", "sitting", "host")
#: A v3 case's ``phases`` row: per step part (each phase, ``unaccounted``, ``step``) its
#: forms, by field: ``ms`` the wall time, ``rest`` its share of the rest of the step, ``ref``
#: the step relative to the KV read time, ``cpu`` the probe thread's CPU time, ``device``
#: and ``device_rest`` the device time and its share, ``active`` the active time.
ROW_FIELDS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("ms", lambda p: p),
    ("rest", rest_form),
    ("ref", lambda p: f"{p}/ref"),
    ("cpu", cpu_form),
    ("device", device_form),
    ("device_rest", lambda p: rest_form(device_form(p))),
    ("active", active_form),
)
#: metric name -> (step part, field) of the v3 row that holds it
ROW_OF: Mapping[str, tuple[str, str]] = MappingProxyType(
    {form(p): (p, f) for p in STEP_PARTS for f, form in ROW_FIELDS}
)
_METRIC_OF = MappingProxyType({row: m for m, row in ROW_OF.items()})


class Invalid(Exception):
    """A case that fails validation; the text names the field."""


#: Longest sitting id and host name stored.
MAX_LABEL = 128


def number(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Invalid(f"{field}: expected a number, got {brief(v)}")
    x = float(v)
    if not math.isfinite(x):
        raise Invalid(f"{field}: expected a finite number, got {x!r}")
    return x


#: Physical range of a stored value by what it is, ``(smallest non-zero magnitude,
#: largest magnitude, unit)``: a time in ms up to 1 hour (a median of nanosecond
#: readings may be half a nanosecond, so the floor is lower), a ratio of two times
#: (``verify/rest``, ``step/ref``), a share (0..1, with room for rounding and overlap), a
#: percentage, accepted tokens per step (a draft block holds at most a few thousand), a
#: token rate. Outside it a value is not a measurement (``1e308``, ``1e-300``): INVALID.
RANGES: Mapping[str, tuple[float, float, str]] = MappingProxyType(
    {
        "time": (1e-9, 3.6e6, "ms"),
        "ratio": (1e-15, 1e9, ""),
        "share": (1e-9, 10.0, ""),
        "percent": (1e-9, 1000.0, "%"),
        "length": (1e-6, 1e4, "tokens"),
        "rate": (1e-6, 1e9, "tokens/s"),
        "other": (1e-12, 1e12, ""),
    }
)


def range_kind(metric: str) -> str:
    """Which of ``RANGES`` bounds ``metric``'s stored values."""
    if is_rest_form(metric) or metric == STEP_PER_REF:
        return "ratio"
    try:
        s = spec(metric)
    except KeyError:
        return "other"
    if s.unit == "share":
        return "share"
    if s.unit == "ms":
        return "time"
    if s.kind is MetricKind.UTILIZATION:
        return "share" if s.to_percent != 1.0 else "percent"
    return {MetricKind.COUNT: "length", MetricKind.RATE: "rate"}.get(s.kind, "other")


def _bound(metric: str, x: float, field: str) -> None:
    """``x`` is a possible value of ``metric`` (sign and physical range), else ``Invalid``
    naming the field and the value."""
    if metric in POSITIVE_METRICS and x <= 0:
        raise Invalid(f"{field}: must be > 0, got {x:g}")
    if metric not in SIGNED_METRICS and x < 0:
        raise Invalid(f"{field}: must be >= 0, got {x:g}")
    kind = range_kind(metric)
    low, high, unit = RANGES[kind]
    if x != 0 and not low <= abs(x) <= high:
        unit = f" {unit}" if unit else ""
        raise Invalid(
            f"{field}: {x:.6g} is outside the physical range of a {kind} "
            f"({low:g} to {high:g}{unit}); not a measurement"
        )


#: Names a field in the file's own terms: ``(kind, metric) -> field`` with kind "value"
#: or "blocks" (metric "" for the mapping itself).
Namer = Callable[[str, str], str]


def check_run(run: RunRecord, name: Namer) -> None:
    """The rules every stored run obeys; ``Invalid`` names the first broken one."""
    missing = [m for m in REQUIRED_METRICS if m not in run.values]
    if missing:
        raise Invalid(f"{name('value', '')}: missing required metric(s) {', '.join(missing)}")
    if len(run.values) > MAX_METRICS:
        raise Invalid(f"{name('value', '')}: more than {MAX_METRICS} metrics")
    for m, x in run.values.items():
        field = name("value", m)
        _bound(m, number(x, field), field)
    for p in PHASES:
        for phase in (p, f"device.{p}"):
            form = rest_form(phase)
            if run.values.get(phase, 0) > 0 and run.values.get(form, 1) <= 0:
                raise Invalid(
                    f"{name('value', form)}: is {run.values[form]:g} while {phase} takes "
                    f"{run.values[phase]:g} ms: {phase} cannot be judged against the rest"
                )
    for m, blocks in run.blocks.items():
        field = name("blocks", m)
        if len(blocks) > MAX_BLOCKS:
            raise Invalid(f"{field}: more than {MAX_BLOCKS} blocks")
        for x in blocks:
            _bound(m, number(x, field), field)


# -- schema v2 and v3: shared parts ------------------------------------------------------


def _mapping(v: Any, field: str) -> dict[Any, Any]:
    if not isinstance(v, dict):
        raise Invalid(f"{field}: expected a mapping, got {brief(v)}")
    return v


def _list(v: Any, field: str, length: int | None = None, most: int = MAX_BLOCKS) -> list[Any]:
    if not isinstance(v, list):
        raise Invalid(f"{field}: expected a list, got {brief(v)}")
    if length is not None and len(v) != length:
        raise Invalid(f"{field}: has {len(v)} entries, expected one per run ({length})")
    if len(v) > most:
        raise Invalid(f"{field}: more than {most} entries")
    return v


def _int(v: Any, field: str, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise Invalid(f"{field}: expected an integer from {low} to {high}, got {brief(v)}")
    return v


def _at(v: Any, field: str) -> str:
    if hasattr(v, "hour") and hasattr(v, "isoformat"):  # a datetime (YAML reads timestamps so)
        return str(v.isoformat())
    if not isinstance(v, str) or not v or len(v) > 64:
        raise Invalid(f"{field}: expected a timestamp string, got {brief(v)}")
    return v


def _label(v: Any, field: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > MAX_LABEL or not v.isprintable():
        raise Invalid(
            f"{field}: expected a printable name of 1 to {MAX_LABEL} characters, got {brief(v)}"
        )
    return v


@dataclass(frozen=True)
class _RunMeta:
    at: str
    pid: int | None
    sitting: str | None
    host: str | None


def _runs_v2(raw: Any, version: int) -> list[_RunMeta]:
    allowed = _RUN_FIELDS_V4 if version >= 4 else _RUN_FIELDS_V3
    out = []
    for i, r in enumerate(_list(raw, "runs", most=MAX_RUNS)):
        r = _mapping(r, f"runs[{i}]")
        extra = sorted(str(k) for k in r if k not in allowed)
        if extra:
            raise Invalid(f"runs[{i}]: unknown field(s) {', '.join(extra)[:120]}")
        pid = r.get("pid")
        out.append(
            _RunMeta(
                _at(r.get("at"), f"runs[{i}].at"),
                None if pid is None else _int(pid, f"runs[{i}].pid", 0, 2**31),
                _label(r.get("sitting"), f"runs[{i}].sitting"),
                _label(r.get("host"), f"runs[{i}].host"),
            )
        )
    if not out:
        raise Invalid("runs: no runs")
    return out


def _columns(raw: Any, kind: str, n: int) -> dict[str, list[Any]]:
    """``value`` or ``blocks``: metric -> one entry per run."""
    cols = _mapping(raw, kind)
    if len(cols) > MAX_METRICS:
        raise Invalid(f"{kind}: more than {MAX_METRICS} metrics")
    out = {}
    for m, per_run in cols.items():
        if not isinstance(m, str):
            raise Invalid(f"{kind}: metric names must be strings, got {brief(m)}")
        out[m] = _list(per_run, f"{kind}.{m}", length=n)
    return out


# -- schema v3: the step parts' forms grouped in one row each ----------------------------


def split_rows(
    values: Mapping[str, list[Any]],
) -> tuple[dict[str, dict[str, list[Any]]], dict[str, list[Any]]]:
    """Per-run columns as a v3 case writes them: the step parts' rows (in phase order,
    fields in ``ROW_FIELDS`` order) and the other metrics (sorted)."""
    rows: dict[str, dict[str, list[Any]]] = {}
    for part in STEP_PARTS:
        row = {f: values[form(part)] for f, form in ROW_FIELDS if form(part) in values}
        if row:
            rows[part] = row
    rest = {m: values[m] for m in sorted(values) if m not in ROW_OF}
    return rows, rest


def field_name(kind: str, metric: str, suffix: str = "") -> str:
    """Where a v3 case holds ``metric`` (``kind`` "value" or "blocks"): ``phases.verify.rest``,
    ``value.accept_len``, ``blocks.verify/rest``; ``suffix`` names the run (``[1]``)."""
    if not metric:
        return "phases/value" if kind == "value" else kind
    row = ROW_OF.get(metric) if kind == "value" else None
    return f"phases.{row[0]}.{row[1]}{suffix}" if row else f"{kind}.{metric}{suffix}"


def _rows(raw: Any, n: int) -> dict[str, list[Any]]:
    """A v3 ``phases`` mapping as metric -> one entry per run."""
    out: dict[str, list[Any]] = {}
    for part, row in _mapping(raw, "phases").items():
        if part not in STEP_PARTS:
            raise Invalid(
                f"phases: unknown step part {brief(part)} (expected {', '.join(STEP_PARTS)})"
            )
        for f, per_run in _mapping(row, f"phases.{part}").items():
            metric = _METRIC_OF.get((part, f))
            if metric is None:
                fields = ", ".join(f for f, _ in ROW_FIELDS)
                raise Invalid(f"phases.{part}: unknown field {brief(f)} (expected {fields})")
            out[metric] = _list(per_run, f"phases.{part}.{f}", length=n)
    return out


def parse_case(raw: Any, version: int) -> tuple[str, int, tuple[RunRecord, ...]]:
    """A v2, v3 or v4 case entry: its fingerprint reference, steps per run and runs."""
    d = _mapping(raw, "case")
    if version >= 4:
        allowed: tuple[str, ...] = _CASE_FIELDS_V4
    else:
        allowed = _CASE_FIELDS_V3 if version >= 3 else _CASE_FIELDS_V2
    extra = sorted(str(k) for k in d if k not in allowed)
    if extra:
        raise Invalid(f"unknown field(s) {', '.join(extra)[:120]} (expected {', '.join(allowed)})")
    ref = d.get("fingerprint")
    if not isinstance(ref, str) or not ref:
        raise Invalid(f"fingerprint: expected a fingerprint hash, got {brief(ref)}")
    steps = _int(d.get("steps"), "steps", 1, MAX_STEPS)
    meta = _runs_v2(d.get("runs"), version)
    n = len(meta)
    values = _columns(d.get("value", {} if version >= 3 else None), "value", n)
    grouped: dict[str, list[Any]] = {}
    if version >= 3:
        grouped = _rows(d.get("phases"), n)
        misplaced = sorted(m for m in values if m in ROW_OF)
        if misplaced:
            part, f = ROW_OF[misplaced[0]]
            raise Invalid(f"value.{misplaced[0]}: belongs in phases.{part}.{f}; move it there")
        values.update(grouped)
    blocks = _columns(d.get("blocks", {}), "blocks", n)
    runs = []
    for i, rm in enumerate(meta):
        suffix = f"[{i}]" if n > 1 else ""

        def name(kind: str, metric: str, suffix: str = suffix) -> str:
            if version >= 3:
                return field_name(kind, metric, suffix)
            return f"{kind}.{metric}{suffix}" if metric else kind

        run = make_run(
            rm.at,
            rm.pid,
            {m: number(v[i], name("value", m)) for m, v in values.items()},
            {m: _list(b[i], name("blocks", m)) for m, b in blocks.items()},
            rm.sitting,
            rm.host,
        )
        check_run(run, name)
        runs.append(run)
    return ref, steps, tuple(runs)


# -- schema v4: a case no setting can decide ---------------------------------------------

#: Longest stored reason of a ``not_gated`` mark.
MAX_REASON = 500


def parse_not_gated(raw: Any) -> NotGated | None:
    """A v4 case's ``not_gated`` mark (None: absent); ``Invalid`` names the field."""
    if raw is None:
        return None
    d = _mapping(raw, "not_gated")
    extra = sorted(str(k) for k in d if k not in ("accepted", "gates", "reason"))
    if extra:
        raise Invalid(f"not_gated: unknown field(s) {', '.join(extra)[:120]} "
                      "(expected accepted, gates, reason)")  # fmt: skip
    accepted = d.get("accepted", False)
    if not isinstance(accepted, bool):
        raise Invalid(f"not_gated.accepted: expected true or false, got {brief(accepted)}")
    reason = d.get("reason")
    if not isinstance(reason, str) or not reason or len(reason) > MAX_REASON:
        raise Invalid(f"not_gated.reason: expected a text of 1 to {MAX_REASON} characters, "
                      f"got {brief(reason)}")  # fmt: skip
    gates = _mapping(d.get("gates"), "not_gated.gates")
    if not gates or len(gates) > MAX_METRICS:
        raise Invalid(f"not_gated.gates: expected 1 to {MAX_METRICS} gates")
    out: dict[str, float] = {}
    for g, x in gates.items():
        if not isinstance(g, str) or g not in _GATE_NAMES:
            raise Invalid(f"not_gated.gates: {brief(g)} is not a gateable metric")
        v = number(x, f"not_gated.gates.{g}")
        if v < 0:
            raise Invalid(f"not_gated.gates.{g}: must be >= 0, got {v:g}")
        out[g] = v
    return NotGated(MappingProxyType(out), reason, accepted)


# -- schema v1 (read for migration) ------------------------------------------------------

_V1_FIELDS = (
    ("context_len", int),
    ("batch_size", int),
    ("steps", int),
    ("kv_layout", str),
    ("recorded_at", str),
    ("fingerprint", dict),
    ("metrics", dict),
)


def parse_v1_case(raw: Any) -> tuple[dict[str, Any], int, RunRecord]:
    """A v1 case entry as one run: its fingerprint, steps and the run (each metric's
    center, and the blocks of the forms a v2 run keeps)."""
    d = _mapping(raw, "case")
    for f, typ in _V1_FIELDS:
        v = d.get(f)
        if isinstance(v, bool) or not isinstance(v, typ):
            raise Invalid(f"{f}: expected {typ.__name__}, got {brief(v)}")
    steps = _int(d["steps"], "steps", 1, MAX_STEPS)
    if len(d["metrics"]) > MAX_METRICS:
        raise Invalid(f"metrics: more than {MAX_METRICS} metrics")
    summaries: dict[str, Summary] = {}
    for m, s in d["metrics"].items():
        try:
            summaries[str(m)] = Summary.from_dict(s, f"metrics.{m}")
        except ValueError as e:
            raise Invalid(str(e)[:300]) from None
        if len(summaries[str(m)].blocks) > MAX_BLOCKS:
            raise Invalid(f"metrics.{m}.blocks: more than {MAX_BLOCKS} blocks")
        for b in summaries[str(m)].blocks:
            number(b, f"metrics.{m}.blocks")
    run = make_run(
        d["recorded_at"],
        None,
        {m: s.value for m, s in summaries.items()},
        {m: s.blocks for m, s in summaries.items() if keeps_blocks(m) and s.blocks},
    )

    def name(kind: str, metric: str) -> str:
        if not metric:
            return "metrics"
        return f"metrics.{metric}.{'blocks' if kind == 'blocks' else center_of(metric)}"

    check_run(run, name)
    return d["fingerprint"], steps, run
