"""A saved case back to the run it measured, so that it can be judged again.

A report's case keeps the probe's own step records (``records``, ``StepRecord.to_json``),
from which the run is rebuilt with every measured field (CPU and run-queue time
included). An older report's case, and the one a pytest-benchmark result carries, keeps
the steps in ``samples``: its block (request), step time, time per phase, unaccounted
time and accept length, on a GPU the device times, and per block the reference read
time; from them this module rebuilds the step records. Either way the records go to the
plugin's own ``judging.samples.build_run``: the summaries, block centers and drift-free
forms that come out are those the gate computed when the case was measured, so
``specperf compare`` judges with the gate's code, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_specperf.judging.metrics import ACCEPT_LEN
from pytest_specperf.judging.samples import DecodeRun, Window, build_run
from pytest_specperf.probe.layout import KVLayout
from pytest_specperf.probe.phases import CORE_PHASES, PHASES
from pytest_specperf.probe.record import GraphCount, StepRecord
from pytest_specperf.store.report import CaseRecord, ReportError
from pytest_specperf.telemetry.summary import TelemetrySummary


def _numbers(s: Mapping[str, Any], name: str, n: int) -> list[float]:
    xs = s.get(name)
    if (
        not isinstance(xs, list)
        or len(xs) != n
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    ):
        raise ValueError(f"samples.{name}: expected {n} numbers")
    return [float(x) for x in xs]


def _phase_lists(s: Mapping[str, Any], name: str, n: int) -> dict[str, list[float]] | None:
    d = s.get(name)
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise ValueError(f"samples.{name}: expected an object")
    # a serving scheduler's host phases are there only where some step timed them
    return {p: _numbers(d, p, n) for p in PHASES if p in d or p in CORE_PHASES}


def _ns(ms: float) -> int:
    return round(ms * 1e6)


Columns = Mapping[str, Sequence[float]]


def _record(i: int, s: Columns, host: Columns, device: Columns | None,
            case: Mapping[str, Any]) -> StepRecord:  # fmt: skip
    """Step ``i`` as the probe wrote it (times back in nanoseconds)."""
    bs = int(case["batch_size"])
    return StepRecord(
        step=i,
        wall_ns=0,
        mode="decode",
        rids=[f"block-{int(s['block'][i])}"],
        context_len=int(case["context_len"]),
        batch_size=bs,
        accepted_tokens=round(s[ACCEPT_LEN][i] * bs),
        step_ns=_ns(s["step_ms"][i]),
        host_ns={p: _ns(host[p][i]) for p in host},
        unaccounted_ns=_ns(s["unaccounted_ms"][i]),
        device_ns=None if device is None else {p: _ns(device[p][i]) for p in device},
        device_step_ns=_ns(s["device_step_ms"][i]) if "device_step_ms" in s else None,
        labels={str(k): str(v) for k, v in (case.get("labels") or {}).items()},
    )


def _records(case: Mapping[str, Any]) -> tuple[list[StepRecord], list[int], dict[int, float]]:
    raw = case.get("samples")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("block"), list):
        raise ValueError("samples: expected an object with the steps' blocks")
    n = len(raw["block"])
    if n == 0:
        raise ValueError("samples: no measured steps")
    s: dict[str, Any] = {name: _numbers(raw, name, n) for name in ("block", "step_ms",
                         "unaccounted_ms", ACCEPT_LEN)}  # fmt: skip
    if "device_step_ms" in raw:
        s["device_step_ms"] = _numbers(raw, "device_step_ms", n)
    host = _phase_lists(raw, "phases_ms", n)
    if host is None:
        raise ValueError("samples.phases_ms: missing")
    device = _phase_lists(raw, "device_phases_ms", n)
    records = [_record(i, s, host, device, case) for i in range(n)]
    blocks = [int(b) for b in s["block"]]
    ref = raw.get("reference_ms") or []
    ids = sorted(set(blocks))
    reference = dict(zip(ids, map(float, ref))) if len(ref) == len(ids) else {}
    return records, blocks, reference


def _graphs(records: list[StepRecord], graphs: Any) -> None:
    """The case's graph counters, summed over its steps, on its first record."""
    if isinstance(graphs, Mapping):
        records[0].graphs = {
            str(k): GraphCount(int(v.get("replay", 0)), int(v.get("eager", 0)))
            for k, v in graphs.items()
            if isinstance(v, Mapping)
        }


def _window(case: Mapping[str, Any], reference: dict[int, float]) -> Window:
    tele = case.get("telemetry")
    frag = case.get("kv_fragmentation")
    return Window(
        fragmentation=float(frag) if isinstance(frag, (int, float)) else None,
        wall_s=float(case.get("wall_s") or 0.0),
        warmup_steps=int(case.get("warmup_steps") or 0),
        reference=reference,
        telemetry=TelemetrySummary.from_dict(tele) if isinstance(tele, Mapping) else None,
    )


def _probe_records(saved: Any, n: int) -> list[StepRecord]:
    """The probe's step records as the case saved them (``StepRecord.to_json``)."""
    if not isinstance(saved, list) or len(saved) != n:
        raise ValueError(f"records: expected {n} step records, one per measured step")
    return [StepRecord.from_json(r) for r in saved]


def run_from_case(path: Path, case: CaseRecord) -> DecodeRun:
    """The ``DecodeRun`` a saved case measured; ``ReportError`` naming the file and the
    case when its samples are missing or unusable. A case that saved the probe's records
    (``records``) is rebuilt from them, every measured field included; an older one from
    its sample columns (no CPU or run-queue time)."""
    c = case.data
    try:
        records, blocks, reference = _records(c)
        if c.get("records") is not None:
            records = _probe_records(c["records"], len(blocks))
        else:
            _graphs(records, c.get("graphs"))
        return build_run(
            records,
            blocks,
            context_len=int(c["context_len"]),
            batch_size=int(c["batch_size"]),
            layout=KVLayout(str(c["kv_layout"]), float(c["kv_level"])),
            window=_window(c, reference),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ReportError(path, f"{case.test} {case.key}: {e}") from None
