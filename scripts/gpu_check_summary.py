"""The ``summarize`` step of ``gpu_check.py``: one summary from every step's output.

Reads what the steps left under ``OUT`` (any may be missing or partial) and writes
``summary.json`` and ``summary.txt``: the goals of the first GPU run, the plugin's cases,
the canary verdicts, and the A/A and verify=1.05 arms as changes of device times against
the recorded baseline run; first, which steps finished and which were stopped at their
limit (``steps.tsv``, written by the shell as each step ends).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from gpu_check import HEADLINE, REHEARSAL_CTX, step_report, write_json

ARMS_AA = ("aa1", "aa2", "aa3")
ARMS_V105 = ("v105a", "v105b", "v105c")


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def dig(data: Any, *keys: Any) -> Any:
    """``data[k1][k2]...``, None where anything is missing (partial results)."""
    for k in keys:
        if isinstance(data, dict):
            data = data.get(k)
        elif isinstance(data, list) and isinstance(k, int) and -len(data) <= k < len(data):
            data = data[k]
        else:
            return None
    return data


def headline(report: Any) -> dict[str, Any] | None:
    """The headline case (46k contiguous decode; a rehearsal's: at ``REHEARSAL_CTX``)."""
    for ctx in (46000, REHEARSAL_CTX):
        for case in dig(report, "cases") or []:
            if (ctx == 46000 and case.get("nodeid") == HEADLINE) or (
                case.get("context_len") == ctx and case.get("kv_layout") == "contiguous"
                and "test_decode" in str(case.get("test"))
            ):
                return dict(case)
    return None


def device_ms(case: dict[str, Any] | None, phase: str) -> float | None:
    if case is None:
        return None
    if phase == "step":
        return dig(case, "device_step_ms", "median")
    return dig(case, "device_phases", phase, "median")


def change(now: float | None, base: float | None) -> float | None:
    return now / base - 1 if now is not None and base else None


def arm(out: Path, name: str, base: dict[str, Any] | None) -> dict[str, Any]:
    case = headline(load(out / f"{name}.json"))
    verdicts = {m["metric"]: m["verdict"] for m in (case or {}).get("metrics", [])
                if m.get("metric") in ("step", "verify", "device.step", "device.verify")}
    return {
        "present": case is not None,
        "verdict": dig(case, "verdict"),
        "device_step_change": change(device_ms(case, "step"), device_ms(base, "step")),
        "device_verify_change": change(device_ms(case, "verify"), device_ms(base, "verify")),
        "metric_verdicts": verdicts,
    }


def spread(values: list[float | None]) -> dict[str, Any]:
    xs = [abs(v) for v in values if v is not None]
    return {"n": len(xs), "max_abs": max(xs) if xs else None,
            "mean_abs": statistics.fmean(xs) if xs else None}


def goals(engine: Any, arms: dict[str, Any]) -> dict[str, Any]:
    """Issue 16's goals, each as (value, goal, met)."""
    onoff = dig(engine, "probe_on_off", "result", "ratio_on_off")
    copy_share = dig(engine, "layouts_and_bandwidth", "result", "46000/contiguous", "share_of_copy")
    dflash = dig(engine, "dflash_vs_none", "result", "ratio")
    eager = dig(engine, "graphs_vs_eager", "result", "46000", "counts_second_run")
    eager_n = None if eager is None else sum(c.get("eager", 0) for c in eager.values())
    aa = spread([a["device_step_change"] for k, a in arms.items() if k in ARMS_AA])["max_abs"]

    def g(value: Any, goal: str, ok: bool | None) -> dict[str, Any]:
        return {"value": value, "goal": goal, "met": ok}

    return {
        "probe_on_off": g(onoff, "<= 1.01", None if onoff is None else onoff <= 1.01),
        "verify_kv_read_vs_copy": g(copy_share, ">= 0.60",
                                    None if copy_share is None else copy_share >= 0.60),
        "dflash_over_none_tokens_per_s": g(dflash, ">= 2", None if dflash is None else dflash >= 2),
        "eager_forwards_after_warmup": g(eager_n, "0", None if eager_n is None else eager_n == 0),
        "aa_device_step_noise": g(aa, "< 0.01", None if aa is None else aa < 0.01),
    }


def cases(report: Any) -> list[dict[str, Any]]:
    out = []
    for c in dig(report, "cases") or []:
        out.append({
            "case": f"{str(c.get('test')).rsplit('::', 1)[-1]} {c.get('key')}",
            "verdict": c.get("verdict"),
            "step_ms": dig(c, "step_ms", "median"),
            "device_step_ms": dig(c, "device_step_ms", "median"),
            "device_phases_ms": {
                p: dig(v, "median") for p, v in (c.get("device_phases") or {}).items()
            },
            "bottleneck": dig(c, "bottleneck", "describe"),
            "graphs": c.get("graphs"),
            "telemetry": dig(c, "telemetry", "available"),
        })
    return out


def canary(report: Any) -> dict[str, Any]:
    case = headline(report)
    metrics = {m["metric"]: m["verdict"] for m in (case or {}).get("metrics", [])}
    return {
        "verdict": dig(case, "verdict"),
        "culprit": dig(case, "culprit"),
        "verify": metrics.get("verify") or metrics.get("device.verify"),
        "unaccounted": metrics.get("unaccounted"),
        "bottleneck": dig(case, "bottleneck", "describe"),
        "expected": "FAIL; verify and unaccounted SLOWER; host-bound bottleneck",
    }


def summarize(out: Path, rehearsal: bool = False) -> int:
    record = load(out / "record.json")
    base = headline(record)
    engine = load(out / "engine.json")
    arms = {name: arm(out, name, base) for name in ARMS_AA + ARMS_V105}
    summary = {
        "rehearsal": "CPU rehearsal with stand-ins: not GPU results" if rehearsal else None,
        "steps": step_report(out, rehearsal),
        "preflight": load(out / "preflight.json"),
        "telemetry": load(out / "telemetry.json"),
        "goals": goals(engine, arms),
        "cases": cases(record),
        "canary": canary(load(out / "canary.json")),
        "arms": arms,
        "aa_device_step": spread([arms[k]["device_step_change"] for k in ARMS_AA]),
        "v105_device_verify": [arms[k]["device_verify_change"] for k in ARMS_V105],
        "baseline_files": sorted(str(p) for p in (out / "baselines").glob("*.yaml")),
    }
    write_json(out / "summary.json", summary)
    text = summary_text(summary)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def summary_text(s: dict[str, Any]) -> str:
    lines = [f"== REHEARSAL: {s['rehearsal']}"] if s.get("rehearsal") else []
    steps = s["steps"]
    lines.append(f"== steps finished: {', '.join(steps['finished']) or 'none'}")
    for name, status in steps["stopped"].items():
        lines.append(f"== step {name}: {status}")
    if steps["not_run"]:
        lines.append(f"== steps not run (yet): {', '.join(steps['not_run'])}")
    lines.append("== goals")
    for name, g in s["goals"].items():
        lines.append(f"  {name:32s} {g['value']!s:>24s}  goal {g['goal']:8s} met: {g['met']}")
    lines.append("== plugin cases (record)")
    for c in s["cases"]:
        lines.append(f"  {c['case']}: {c['verdict']}, step {c['step_ms']} ms, "
                     f"device {c['device_step_ms']} ms; {c['bottleneck']}")
    lines.append(f"== canary: {s['canary']}")
    for name, a in s["arms"].items():
        lines.append(f"== {name}: {a}")
    lines.append(f"== A/A device step: {s['aa_device_step']}")
    lines.append(f"== verify=1.05 device verify changes: {s['v105_device_verify']}")
    return "\n".join(lines)
