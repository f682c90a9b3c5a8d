"""Reports for people: the phase table of a case, the run's summary table, the JSON file."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specperf.baselines import CaseBaseline
from pytest_specperf.measure import DecodeRun
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.telemetry.bottleneck import Bottleneck
from pytest_specperf.verdict import CaseVerdict, MetricVerdict, Verdict

JSON_SCHEMA_VERSION = 1


@dataclass
class CaseOutcome:
    """One judged case, as every report sees it."""

    nodeid: str
    test: str
    key: str
    run: DecodeRun
    verdict: CaseVerdict
    baseline: CaseBaseline | None
    baseline_path: Path
    fingerprint: dict[str, Any]
    recorded: bool = False
    notes: list[str] = field(default_factory=list)
    bottleneck: Bottleneck | None = None
    time_went: str | None = None

    @property
    def where(self) -> str:
        r = self.run
        s = f"ctx={r.context_len} kv={r.kv_layout.label}"
        return s + (f" bs={r.batch_size}" if r.batch_size != 1 else "")


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _change_cell(base: float, now: float, step: float) -> str:
    """Relative change, or the difference in ms where the base is under 1% of the step
    (``unaccounted`` growing from 0.03 ms to 9.2 ms is "+9.20 ms", not "+35241%")."""
    if base <= 0 or (step and base < 0.01 * step and abs(now - base) > base):
        return f"{now - base:+.2f} ms"
    return _pct(now / base - 1)


def phase_table(run: DecodeRun, base: CaseBaseline | None) -> list[str]:
    """Per-phase medians now (and at baseline), with change and share of the step."""
    step = run.summaries["step"].median
    headers = ["phase", "base ms", "now ms", "change", "share"]
    if run.has_device_times:
        headers += ["device ms"]
    rows = []
    for name in (*ALL_PHASES, "step"):
        now = run.summaries[name].median
        b = base.metrics.get(name) if base else None
        row = [
            name,
            f"{b.median:.3f}" if b else "-",
            f"{now:.3f}",
            _change_cell(b.median, now, step) if b else "-",
            f"{now / step * 100:.1f}%" if step else "-",
        ]
        if run.has_device_times:
            key = "device.step" if name == "step" else f"device.{name}"
            dev = run.summaries.get(key)
            row.append(f"{dev.median:.3f}" if dev else "-")
        rows.append(row)
    lines = _table(headers, rows, right={1, 2, 3, 4, 5})
    acc = run.summaries.get("accept_len")
    extra = [
        f"accept_len {acc.value:.2f} tok/step" if acc else "",
        f"tokens/s {run.summaries['tokens_per_s'].value:.1f}",
        f"steps {run.steps}",
        f"kv fragmentation {run.fragmentation:.2f}" if run.fragmentation is not None else "",
    ]
    if run.graphs:
        extra.append(
            "graphs "
            + ", ".join(
                f"{k} {v['replay']} replay/{v['eager']} eager"
                for k, v in sorted(run.graphs.items())
            )
        )
    lines.append("  ".join(e for e in extra if e))
    return lines


def most_changed(outcome: CaseOutcome) -> MetricVerdict | None:
    """The phase to show in the summary: the slowest-grown SLOWER phase if any (phases are
    judged against the rest of their step, so when verify grows, draft's share shrinks and
    can show a larger absolute change), else the phase with the largest change."""
    phases = [m for m in outcome.verdict.metrics if m.metric in ALL_PHASES]
    slower = [m for m in phases if m.verdict is Verdict.SLOWER]
    return max(slower or phases, key=lambda m: abs(m.change), default=None)


def failure_message(outcome: CaseOutcome, baseline_display: str) -> str:
    slower = outcome.verdict.worst(Verdict.SLOWER)
    head = slower[0]
    lines = [f"{head.describe()} at {outcome.where} [{baseline_display}]"]
    if outcome.run.labels.get("inject"):
        lines[0] += f" [injected: {outcome.run.labels['inject']}]"
    lines += [f"  also {m.describe()}" for m in slower[1:]]
    if outcome.time_went:
        lines.append(outcome.time_went)
    if outcome.bottleneck is not None:
        lines.append(f"bottleneck: {outcome.bottleneck.describe()}")
    lines += outcome.notes
    lines.append("")
    lines += phase_table(outcome.run, outcome.baseline)
    return "\n".join(lines)


def _change_text(m: MetricVerdict) -> str:
    change = f"{m.change * 100:+.1f}pp" if m.share_based else _pct(m.change)
    return f"{m.metric} {change}"


def summary_lines(outcomes: list[CaseOutcome]) -> list[str]:
    headers = ["case", "step ms (base -> now)", "delta", "most changed", "accept", "verdict"]
    rows = []
    for o in outcomes:
        step = o.run.summaries["step"].median
        b = o.baseline.metrics.get("step") if o.baseline else None
        mc = most_changed(o)
        verdict = o.verdict.verdict.value + (" (recorded)" if o.recorded else "")
        if o.run.labels.get("inject"):
            verdict += " [injected]"
        rows.append(
            [
                f"{o.test.rsplit('::', 1)[-1]} {o.key}",
                f"{b.median:.2f} -> {step:.2f}" if b else f"- -> {step:.2f}",
                _pct(step / b.median - 1) if b and b.median else "-",
                _change_text(mc) if mc else "-",
                f"{o.run.accept_len:.2f}",
                verdict,
            ]
        )
    return _table(headers, rows, right={1, 2, 4})


def _summary_json(run: DecodeRun, name: str) -> dict[str, Any]:
    s = run.summaries[name].to_dict()
    s["median_ms"] = s["median"]
    return s


def culprit(o: CaseOutcome) -> str | None:
    """The metric a failing case is blamed on (a phase when one is slower)."""
    slower = o.verdict.worst(Verdict.SLOWER)
    return slower[0].metric if slower else None


def case_json(o: CaseOutcome) -> dict[str, Any]:
    from pytest_specperf.probe.phases import PHASES

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
        "culprit": culprit(o),
        "reasons": o.verdict.reasons + o.notes,
        "recorded": o.recorded,
        "labels": run.labels,
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "wall_s": round(run.wall_s, 3),
        "step_ms": run.summaries["step"].to_dict(),
        "phases": {p: _summary_json(run, p) for p in ALL_PHASES},
        "accept_len": run.summaries["accept_len"].to_dict(),
        "tokens_per_s": run.summaries["tokens_per_s"].to_dict(),
        "graphs": run.graphs,
        "fingerprint": o.fingerprint,
        "bottleneck": None
        if o.bottleneck is None
        else {
            "kind": o.bottleneck.kind,
            "describe": o.bottleneck.describe(),
            "reasons": o.bottleneck.reasons,
            "figures": o.bottleneck.figures,
        },
        "time_went": o.time_went,
        "cross_check": run.cross_check,
        "telemetry": run.telemetry.to_dict() if run.telemetry is not None else None,
        "baseline": None
        if o.baseline is None
        else {
            "file": str(o.baseline_path),
            "recorded_at": o.baseline.recorded_at,
            "step_ms": o.baseline.metrics["step"].to_dict()
            if "step" in o.baseline.metrics
            else None,
        },
        "metrics": [
            {
                "metric": m.metric,
                "verdict": m.verdict.value,
                "base": m.base,
                "now": m.now,
                "change": m.change,
                "noise": m.noise,
                "tolerance": m.tolerance,
                "share_based": m.share_based,
                "points_based": m.points_based,
                "scatter_ratio": m.scatter_ratio,
                "basis": m.basis,
                "raw_change": m.raw_change,
                "steps_to_decide": m.steps_to_decide,
            }
            for m in o.verdict.metrics
        ],
        "samples": {
            "block": run.blocks,
            "step_ms": run.samples["step"],
            "unaccounted_ms": run.samples["unaccounted"],
            "accept_len": run.samples["accept_len"],
            "phases_ms": {p: run.samples[p] for p in PHASES},
            "reference_ms": run.reference_ms,
        },
    }
    if run.has_device_times:
        out["device_phases"] = {p: _summary_json(run, f"device.{p}") for p in PHASES}
        out["device_step_ms"] = run.summaries["device.step"].to_dict()
        out["samples"]["device_phases_ms"] = {p: run.samples[f"device.{p}"] for p in PHASES}
    return out


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=1, sort_keys=True, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
