"""A saved case back to the run it measured, so that it can be judged again.

A report's case keeps the probe's own step records (``records``, ``StepRecord.to_json``),
from which the run is rebuilt with every measured field (CPU and run-queue time
included). An older report's case, and the one a pytest-benchmark result carries, keeps
the steps in ``samples``: its block (request), step time, time per phase, unaccounted
time and accept length, on a GPU the device times, and per block the reference read
time; from them this module rebuilds the step records. Either way the records go to the
plugin's own ``judging.samples.build_run``: the summaries, block centers and drift-free
forms that come out are those the gate computed when the case was measured, so
``specperf compare`` judges with the gate's code, not a copy of it. A case measured in
several server processes (``--specperf-processes``) saves the other processes' steps in
``siblings`` and is rebuilt with all of them, as the gate judged it; a report written
before they were saved holds the first process's steps only (``first_process_only``).
"""

from __future__ import annotations

import dataclasses
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


def _count(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _window(case: Mapping[str, Any], reference: dict[int, float], run: Any) -> Window:
    """What the decoder measured besides the steps; ``run``: the process's entry of the
    case's ``runs`` (its server pid and rounds), None where the report has none."""
    tele = case.get("telemetry")
    frag = case.get("kv_fragmentation")
    run = run if isinstance(run, Mapping) else {}
    pid, rounds = _count(run.get("server_pid")), _count(run.get("rounds"))
    first = _count(run.get("round_steps"))  # None: a report from before it was written
    return Window(
        fragmentation=float(frag) if isinstance(frag, (int, float)) else None,
        wall_s=float(case.get("wall_s") or 0.0),
        warmup_steps=int(case.get("warmup_steps") or 0),
        reference=reference,
        telemetry=TelemetrySummary.from_dict(tele) if isinstance(tele, Mapping) else None,
        cross_check=tuple(str(x) for x in case.get("cross_check") or ()),
        server_pid=pid,
        rounds=rounds if rounds is not None and rounds > 0 else 1,
        round_steps=first if first is not None and first > 0 else 0,
    )


def _probe_records(saved: Any, n: int) -> list[StepRecord]:
    """The probe's step records as the case saved them (``StepRecord.to_json``)."""
    if not isinstance(saved, list) or len(saved) != n:
        raise ValueError(f"records: expected {n} step records, one per measured step")
    return [StepRecord.from_json(r) for r in saved]


def _process_run(c: Mapping[str, Any], run: Any) -> DecodeRun:
    """One server process's run: from the probe's records (``records``) where saved, else
    from the sample columns."""
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
        window=_window(c, reference, run),
    )


def _siblings(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The other processes' runs as saved (``siblings``; none in an older report)."""
    raw = c.get("siblings")
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(s, Mapping) for s in raw):
        raise ValueError("siblings: expected a list of objects, one per other server process")
    for i, sib in enumerate(raw, start=2):
        # a sibling without samples of its own would be rebuilt from the first process's
        # (its blocks and KV read times: judged as a second, identical process)
        if not isinstance(sib.get("samples"), Mapping):
            raise ValueError(
                f"siblings: server process {i} has no samples of its own; the report is "
                "truncated or was edited: re-run the suite to write it again"
            )
    return raw


def first_process_only(case: CaseRecord) -> int:
    """Server processes a saved case measured whose runs it did not save (a report written
    before every process's steps were: it is re-judged from its first process only); 0
    when every process's run can be rebuilt."""
    c = case.data
    if c.get("siblings") is not None:
        return 0
    return case.processes - 1


def run_from_case(path: Path, case: CaseRecord) -> DecodeRun:
    """The ``DecodeRun`` a saved case measured, with one sibling per other server process
    (``--specperf-processes``), as the gate judged it; ``ReportError`` naming the file and
    the case when its samples are missing or unusable. A process whose probe records were
    saved (``records``) is rebuilt from them, every measured field included; an older one
    from its sample columns (no CPU or run-queue time). A report written before the other
    processes' steps were saved rebuilds the first process alone (``first_process_only``)."""
    c = case.data
    saved = c.get("runs")
    runs: list[Any] = saved if isinstance(saved, list) else []
    try:
        first = _process_run(c, runs[0] if runs else None)
        others = []
        for i, sib in enumerate(_siblings(c), start=1):
            # a sibling holds its own steps; the case's shape (context, batch, layout) is shared
            merged = {**c, "records": None, "graphs": None, **sib}
            others.append(_process_run(merged, runs[i] if i < len(runs) else None))
        return dataclasses.replace(first, siblings=tuple(others)) if others else first
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ReportError(path, f"{case.test} {case.key}: {e}") from None
