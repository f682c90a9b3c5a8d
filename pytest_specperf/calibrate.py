"""``specperf calibrate``: how often does the gate cry wolf, and what does it catch?

On the current machine and backend it records a baseline, then runs the suite again and
again, each time in a fresh pytest process (fresh server): ``K`` A/A repetitions (nothing
changed: every SLOWER is a false alarm), ``K`` repetitions per injected slowdown (every
run that does not fail naming the injected phase is a miss), optionally ``K`` A/A
repetitions with a CPU hog on one core (UNSTABLE is the right answer there; SLOWER is
not). Conditions are interleaved round-robin, so that slow drift of the machine hits
every condition alike. It prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_specperf.options import DEFAULT_STEP_TOLERANCE, DEFAULT_TOLERANCE
from pytest_specperf.probe.phases import ALL_PHASES
from pytest_specperf.verdict import (
    RAW_TIME_METRICS,
    Verdict,
    stored_case_disturbed,
    stored_verdict,
    would_be_slower,
)

DEFAULT_SUITE = ("perf_tests", "-m", "long_context")
DEFAULT_FACTORS = ("verify=1.05", "verify=1.10", "verify=1.20")
#: Attempts at recording a quiet baseline before calibrating against a noisy one.
RECORD_ATTEMPTS = 3
UNACCOUNTED = "unaccounted"


@dataclass
class Condition:
    name: str
    inject: str | None = None
    hog: bool = False
    expect: str | None = None  # the phase a detection must name (None: A/A)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def slower_runs(self) -> int:
        return sum(1 for r in self.runs if r["slower_cases"])

    @property
    def named_right(self) -> int:
        return sum(1 for r in self.runs if r["slower_cases"] and r["named_right"])

    @property
    def detected(self) -> int:
        return sum(1 for r in self.runs if r["detected"])

    @property
    def unstable_runs(self) -> int:
        return sum(1 for r in self.runs if r["unstable_cases"])


_JUDGED_KEYS = ("metric", "change", "noise", "share_based", "points_based", "scatter_ratio")
_UNCOMPARED = ("NO_BASELINE", "INVALID")


def _run_outcome(
    report: dict[str, Any], expect: str | None, tolerances: tuple[float, float] | None = None
) -> dict[str, Any]:
    """One run, judged by verdict.py's rule from its stored metrics at ``tolerances``
    (phases, step; default: those the run used), so that a resumed calibration judges
    older runs by the current rule. For a fresh run this is the run's own verdicts."""
    tol_phase, tol_step = tolerances or (
        float(report.get("tolerance", DEFAULT_TOLERANCE)),
        float(report.get("step_tolerance", DEFAULT_STEP_TOLERANCE)),
    )
    compared = [c for c in report.get("cases", []) if c["verdict"] not in _UNCOMPARED]
    judged = [[{k: m.get(k) for k in _JUDGED_KEYS} for m in c["metrics"]] for c in compared]
    slower, unstable = [], []
    for case, metrics in zip(compared, judged):
        bad = slower_at([metrics], tol_phase, "phase")[0]
        bad += slower_at([metrics], tol_step, "step")[0]
        if bad:
            changes = {m["metric"]: abs(float(m["change"])) for m in metrics}
            # The culprit as the report names it: a phase first, then by size of change.
            head = min(bad, key=lambda m: (m not in ALL_PHASES, -changes[m]))
            gated = [m["metric"] for m in metrics]
            slower.append({"key": case["key"], "head": head, "metrics": bad, "gated": gated})
        elif _unstable_at(metrics, tol_phase, tol_step):
            unstable.append(case["key"])
    detected = bool(expect) and any(expect in c["metrics"] for c in slower)
    # Attribution: the injected phase is named and no failing case blames another phase.
    # A case failing on its step alone (the injected phase grew, but less than the
    # tolerance there) blames no phase; its "where the time went" line names the phase.
    wrong = [c for c in slower if c["head"] in ALL_PHASES and c["head"] != expect]
    named_right = detected and not wrong
    return {
        "slower_cases": slower,
        "unstable_cases": unstable,
        "detected": detected,
        "named_right": named_right,
        "cases": len(report.get("cases", [])),
        "judged": judged,
    }


def _unstable_at(metrics: list[dict[str, Any]], tol_phase: float, tol_step: float) -> bool:
    disturbed = stored_case_disturbed(metrics)
    return any(
        stored_verdict(
            m, tol_step if m["metric"] in RAW_TIME_METRICS else tol_phase, case_disturbed=disturbed
        )
        is Verdict.UNSTABLE
        for m in metrics
    )


def slower_at(judged: list[list[dict[str, Any]]], tolerance: float, kind: str) -> list[list[str]]:
    """Per case, the metrics of ``kind`` ("phase" or "step", as ``verdict.Tolerances``
    splits them) that would be SLOWER at ``tolerance``: verdict.py's own rule."""
    out = []
    for case in judged:
        disturbed = stored_case_disturbed(case)
        out.append(
            [
                m["metric"]
                for m in case
                if (m["metric"] in RAW_TIME_METRICS) == (kind == "step")
                and would_be_slower(m, tolerance, case_disturbed=disturbed)
            ]
        )
    return out


def sweep(conds: list[Condition], tolerances: list[float], kind: str) -> list[dict[str, Any]]:
    """Failed runs and detections each tolerance would have given on the same runs."""
    rows = []
    for tol in tolerances:
        row: dict[str, Any] = {"tolerance": tol}
        for c in conds:
            fails = detect = 0
            for r in c.runs:
                per_case = slower_at(r["judged"], tol, kind)
                if any(per_case):
                    fails += 1
                if c.expect and any(c.expect in bad for bad in per_case):
                    detect += 1
            row[c.name] = {"failed": fails, "detected": detect, "runs": len(c.runs)}
        rows.append(row)
    return rows


def recommend(rows: list[dict[str, Any]], conds: list[Condition]) -> float | None:
    """Smallest tolerance with at most 1 false alarm per 20 A/A runs (hog runs included)."""
    for row in rows:
        if all(row[c.name]["failed"] <= len(c.runs) // 20 for c in conds if c.expect is None):
            return float(row["tolerance"])
    return None


class Calibration:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="specperf-calibrate-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.baselines = self.work / "baselines"
        self.suite = list(args.pytest_args or DEFAULT_SUITE)
        self.t0 = time.monotonic()
        tol, step_tol = getattr(args, "tolerance", None), getattr(args, "step_tolerance", None)
        self.tolerances: tuple[float, float] | None = None
        self.tolerance_args: list[str] = []
        if tol is not None or step_tol is not None:
            self.tolerances = (
                DEFAULT_TOLERANCE if tol is None else tol,
                DEFAULT_STEP_TOLERANCE if step_tol is None else step_tol,
            )
            self.tolerance_args = [
                f"--specperf-tolerance={self.tolerances[0]}",
                f"--specperf-step-tolerance={self.tolerances[1]}",
            ]

    def _pytest(self, tag: str, extra: list[str]) -> tuple[int, dict[str, Any] | None, float]:
        report_path = self.work / f"{tag}.json"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            *self.suite,
            "-q",
            "-p",
            "no:cacheprovider",
            "--specperf-baselines",
            str(self.baselines),
            "--specperf-json",
            str(report_path),
            *self.tolerance_args,
            *extra,
        ]
        t = time.monotonic()
        with open(self.work / f"{tag}.log", "wb") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        dt = time.monotonic() - t
        report = json.loads(report_path.read_text()) if report_path.exists() else None
        (self.work / f"{tag}.rc").write_text(f"{rc} {dt:.1f}\n")
        return rc, report, dt

    def _resumed(self, tag: str) -> tuple[int, dict[str, Any], float | None] | None:
        """A repetition finished by an earlier, interrupted calibration in this work dir.

        The report is written when its pytest session ends, so its presence means the run
        completed; its exit status and wall time come from the ``.rc`` file beside it
        (missing for runs of older versions: the status is then read off the verdicts)."""
        if not self.args.resume:
            return None
        report_path = self.work / f"{tag}.json"
        try:
            report: dict[str, Any] = json.loads(report_path.read_text())
        except (OSError, ValueError):
            return None
        try:
            rc_text, wall_text = (self.work / f"{tag}.rc").read_text().split()
            return int(rc_text), report, float(wall_text)
        except (OSError, ValueError):
            failed = any(c.get("verdict") == "SLOWER" for c in report.get("cases", []))
            return int(failed), report, None

    def record(self) -> dict[str, Any]:
        """Record the baseline; re-record (up to RECORD_ATTEMPTS) while it is noisy, since a
        baseline taken on a disturbed machine makes every comparison UNSTABLE."""
        report: dict[str, Any] | None = None
        if self.args.resume and (self.work / "baseline.json").exists() and self.baselines.exists():
            report = json.loads((self.work / "baseline.json").read_text())
            print(f"resuming: baseline from {self.work / 'baseline.json'}", flush=True)
            return report
        for attempt in range(1, RECORD_ATTEMPTS + 1):
            print(
                f"recording the baseline (attempt {attempt}): pytest {' '.join(self.suite)} "
                "--specperf-update-baselines",
                flush=True,
            )
            if self.baselines.exists():
                shutil.rmtree(self.baselines)
            rc, report, dt = self._pytest("baseline", ["--specperf-update-baselines"])
            if rc != 0 or report is None:
                raise SystemExit(
                    f"baseline run failed (exit {rc}); log: {self.work / 'baseline.log'}"
                )
            noisy = self._noisy_cases()
            print(
                f"  baseline recorded in {dt:.0f} s ({len(report['cases'])} cases)"
                + (f"; noisy: {', '.join(noisy)}" if noisy else "; quiet"),
                flush=True,
            )
            if not noisy:
                break
        assert report is not None
        return report

    def _noisy_cases(self) -> list[str]:
        from pytest_specperf.baselines import load_baselines
        from pytest_specperf.verdict import QUIET_SCATTER, noisiest_phase

        out = []
        for path in self.baselines.glob("*.yaml"):
            bf = load_baselines(path)
            for case in bf.all_cases() if bf else ():
                worst = noisiest_phase(case.metrics)
                if worst is not None and worst[1] > QUIET_SCATTER:
                    out.append(f"{case.key} ({worst[0]} {worst[1]:.0%})")
        return out

    def run(self) -> dict[str, Any]:
        base = self.record()
        steps = [c["step_ms"]["median"] for c in base["cases"]]
        ref_step = sorted(steps)[len(steps) // 2]
        stall_ms = round(self.args.host_stall_share * ref_step, 1)
        conds = [Condition("A/A")]
        for f in self.args.inject or DEFAULT_FACTORS:
            conds.append(Condition(f, inject=f, expect=f.split("=")[0]))
        conds.append(
            Condition(
                f"host_stall={stall_ms:g}ms", inject=f"host_stall={stall_ms:g}", expect=UNACCOUNTED
            )
        )
        if self.args.hog:
            conds.append(Condition("A/A + CPU hog", hog=True))
        names = [c.name for c in conds]
        plan = self.work / "conditions.json"
        if self.args.resume and plan.exists():
            before = json.loads(plan.read_text())
            if before != names:
                raise SystemExit(
                    f"--resume: this work dir was calibrated with conditions {before}, now "
                    f"{names}; give the same --inject/--hog/--host-stall-share, or a new "
                    "--work-dir"
                )
        plan.write_text(json.dumps(names))
        total = len(conds) * self.args.repetitions
        n = 0
        for rep in range(self.args.repetitions):
            for cond in conds:
                n += 1
                tag = f"rep{rep:02d}-{_slug(cond.name)}"
                done = self._resumed(tag)
                dt: float | None
                report: dict[str, Any] | None
                if done is not None:
                    rc, report, dt = done
                else:
                    extra = ["--specperf-inject", cond.inject] if cond.inject else []
                    hog = _start_hog() if cond.hog else None
                    try:
                        rc, report, dt = self._pytest(tag, extra)
                    finally:
                        if hog is not None:
                            _stop_hog(hog)
                if report is None:
                    print(
                        f"[{n:3d}/{total}] {cond.name:22s} rep {rep + 1}: no report "
                        f"(exit {rc}); see {self.work}",
                        flush=True,
                    )
                    continue
                out = _run_outcome(report, cond.expect, self.tolerances)
                out.update(
                    {
                        "rep": rep,
                        "exit": rc,
                        "wall_s": None if dt is None else round(dt, 1),
                        "resumed": done is not None,
                    }
                )
                cond.runs.append(out)
                what = ", ".join(f"{c['head']}@{c['key']}" for c in out["slower_cases"]) or "pass"
                unst = f", {len(out['unstable_cases'])} UNSTABLE" if out["unstable_cases"] else ""
                print(
                    f"[{n:3d}/{total}] {cond.name:22s} rep {rep + 1:2d}/{self.args.repetitions}  "
                    f"{'FAIL ' + what if out['slower_cases'] else 'pass'}{unst}  "
                    + (f"{dt:.0f} s" if dt is not None else "-")
                    + ("  (resumed)" if done is not None else ""),
                    flush=True,
                )
        return self.summarize(conds, base, stall_ms, ref_step)

    def summarize(
        self,
        conds: list[Condition],
        base: dict[str, Any],
        stall_ms: float,
        ref_step: float,
    ) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        # Wall time of the whole calibration: this process, plus the runs it resumed.
        wall += sum(r["wall_s"] or 0.0 for c in conds for r in c.runs if r["resumed"])
        rows: list[dict[str, Any]] = []
        for c in conds:
            k = len(c.runs)
            rows.append(
                {
                    "condition": c.name,
                    "inject": c.inject,
                    "hog": c.hog,
                    "expect": c.expect,
                    "runs": k,
                    "slower_runs": c.slower_runs,
                    "detected": c.detected,
                    "named_right": c.named_right,
                    "unstable_runs": c.unstable_runs,
                    "rate": c.slower_runs / k if k else math.nan,
                    "details": c.runs,
                }
            )
        smallest: tuple[str, float] | None = None
        for c in conds:
            if (
                c.inject
                and c.expect
                and c.expect != UNACCOUNTED
                and c.runs
                and c.detected / len(c.runs) >= 0.95
            ):
                f = float(c.inject.split("=")[1])
                if smallest is None or f < smallest[1]:
                    smallest = (c.inject, f)
        grids = {
            "phase": [round(0.01 * t, 2) for t in range(2, 16)],
            "step": [round(0.05 * t, 2) for t in range(1, 9)],
        }
        swept = {kind: sweep(conds, grid, kind) for kind, grid in grids.items()}
        recommended = {kind: recommend(rows, conds) for kind, rows in swept.items()}
        return {
            "suite": self.suite,
            "repetitions": self.args.repetitions,
            "sweep": swept,
            "recommended_tolerance": recommended,
            "judged_at": list(self.tolerances) if self.tolerances else None,
            "host_stall_ms": stall_ms,
            "reference_step_ms": ref_step,
            "smallest_detected_95": smallest[0] if smallest else None,
            "wall_s": round(wall, 1),
            "resumed_runs": sum(1 for c in conds for r in c.runs if r["resumed"]),
            "conditions": rows,
            "baseline_cases": [c["key"] for c in base["cases"]],
            "work_dir": str(self.work),
        }


def format_table(summary: dict[str, Any]) -> list[str]:
    head = ["condition", "runs", "failed (SLOWER)", "named right phase", "any UNSTABLE"]
    at = summary.get("judged_at")
    lines = [
        "verdicts at "
        + (
            f"tolerance {at[0]:.0%} (phases), {at[1]:.0%} (step)"
            if at
            else "the tolerances the runs used (the suite's defaults)"
        )
    ]
    data = []
    for r in summary["conditions"]:
        named = "-" if not r["expect"] else f"{r['named_right']}/{r['runs']} ({r['expect']})"
        failed = f"{r['slower_runs']}/{r['runs']}"
        if r["expect"] is None:
            failed += " false alarms"
        data.append(
            [r["condition"], str(r["runs"]), failed, named, f"{r['unstable_runs']}/{r['runs']}"]
        )
    widths = [max(len(h), *(len(d[i]) for d in data)) for i, h in enumerate(head)]
    for row in [head, ["-" * w for w in widths], *data]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    for kind, what in (
        ("phase", "phases, accept length, unaccounted share: --specperf-tolerance"),
        ("step", "raw step time and tokens/s: --specperf-step-tolerance"),
    ):
        rows = summary.get("sweep", {}).get(kind)
        if not rows:
            continue
        lines.append("")
        lines.append(f"the same runs judged at other tolerances for {what}")
        lines.append(
            "(runs that would fail)"
            if kind == "step"
            else "(A/A columns: runs that would fail; injected columns: runs that would "
            "detect the injected phase)"
        )
        hdr = ["tolerance", *(r["condition"] for r in summary["conditions"])]
        table = []
        for row in rows:
            cells = [f"{row['tolerance']:.0%}"]
            for r in summary["conditions"]:
                v = row[r["condition"]]
                key = "failed" if r["expect"] is None or kind == "step" else "detected"
                cells.append(f"{v[key]}/{v['runs']}")
            table.append(cells)
        w = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(hdr)]
        for row_cells in [hdr, ["-" * x for x in w], *table]:
            lines.append("  ".join(c.ljust(x) for c, x in zip(row_cells, w)).rstrip())
        rec = summary["recommended_tolerance"].get(kind)
        lines.append(
            "smallest tolerance with at most 1 false alarm per 20 A/A runs: "
            + (f"{rec:.0%}" if rec is not None else f"none up to {rows[-1]['tolerance']:.0%}")
        )
    lines.append("")
    lines.append(
        f"smallest injected factor detected in >= 95% of runs: "
        f"{summary['smallest_detected_95'] or 'none of those tried'}"
    )
    lines.append(
        f"host stall: {summary['host_stall_ms']} ms per step (about "
        f"{summary['host_stall_ms'] / summary['reference_step_ms']:.0%} of the median "
        f"case's {summary['reference_step_ms']:.1f} ms step)"
    )
    wall = summary["wall_s"]
    lines.append(
        f"wall time: {int(wall // 3600)}h {int(wall % 3600 // 60)}m {int(wall % 60)}s "
        f"({summary['repetitions']} repetitions per condition"
        + (
            f"; {summary['resumed_runs']} runs resumed from an interrupted calibration"
            if summary.get("resumed_runs")
            else ""
        )
        + ")"
    )
    return lines


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "_" for ch in name)


def _start_hog() -> subprocess.Popen[bytes]:
    from pytest_specperf.server.supervisor import set_pdeathsig

    return subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        start_new_session=True,
        preexec_fn=set_pdeathsig,  # dies with a killed calibrate
    )


def _stop_hog(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "calibrate",
        help="measure false-alarm rate and detection power on this machine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "-k", "--repetitions", type=int, default=20, help="repetitions per condition (default 20)"
    )
    c.add_argument(
        "--inject",
        action="append",
        metavar="PHASE=FACTOR",
        help=f"slowdown to test (repeatable; default: {', '.join(DEFAULT_FACTORS)})",
    )
    c.add_argument(
        "--host-stall-share",
        type=float,
        default=0.20,
        help="host stall per step, as a share of the median case's step (default 0.2)",
    )
    c.add_argument(
        "--hog", action="store_true", help="add A/A repetitions with a busy process on one core"
    )
    c.add_argument(
        "--tolerance",
        metavar="F",
        help="phase tolerance to run and judge at, as --specperf-tolerance (default: the "
        "suite's); the sweep tables show every other",
    )
    c.add_argument(
        "--step-tolerance",
        metavar="F",
        help="step tolerance to run and judge at, as --specperf-step-tolerance",
    )
    c.add_argument("--json", type=Path, help="write the results to this file")
    c.add_argument("--work-dir", type=Path, help="keep baselines, logs and reports here")
    c.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted calibration in --work-dir: reuse its baseline and the "
        "repetitions that finished (same --inject/--hog options required)",
    )
    c.add_argument(
        "pytest_args",
        nargs="*",
        help=f"suite to run, after -- (default: {' '.join(DEFAULT_SUITE)})",
    )


def run(args: argparse.Namespace) -> int:
    from pytest_specperf.inject import parse_inject

    if args.repetitions < 1:
        print("error: --repetitions must be at least 1", file=sys.stderr)
        return 2
    if not 0 < args.host_stall_share < 5:
        print("error: --host-stall-share must be in (0, 5)", file=sys.stderr)
        return 2
    for f in args.inject or ():
        try:
            spec = parse_inject(f)
        except ValueError as e:
            print(f"error: --inject {f!r}: {e}", file=sys.stderr)
            return 2
        if len(spec.factors) != 1 or spec.host_stall_ms:
            print(f"error: --inject {f!r}: give one PHASE=FACTOR per --inject", file=sys.stderr)
            return 2
    from pytest_specperf.options import parse_fraction

    for flag in ("tolerance", "step_tolerance"):
        text = getattr(args, flag)
        if text is None:
            continue
        try:
            setattr(args, flag, parse_fraction(text))
        except ValueError as e:
            print(f"error: --{flag.replace('_', '-')} {text!r}: {e}", file=sys.stderr)
            return 2
    if args.resume and args.work_dir is None:
        print("error: --resume needs --work-dir (the interrupted calibration's)", file=sys.stderr)
        return 2
    if args.json is not None:
        try:  # fail now, not after hours of runs
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.touch()
        except OSError as e:
            print(f"error: --json {args.json}: {e}", file=sys.stderr)
            return 2
    cal = Calibration(args)
    summary = cal.run()
    print()
    for line in format_table(summary):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
        print(f"JSON: {args.json}")
    if not args.work_dir:
        shutil.rmtree(cal.work, ignore_errors=True)
    return 0
