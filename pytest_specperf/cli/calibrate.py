"""``specperf calibrate``: how often does the gate cry wolf, and what does it catch?

On the current machine and backend it records a baseline, then runs the suite again and
again, each time in a fresh pytest process (fresh server): ``K`` A/A repetitions (nothing
changed: every SLOWER is a false alarm), ``K`` repetitions per injected slowdown (every
run that does not fail naming the injected phase is a miss), optionally ``K`` A/A
repetitions with a CPU hog on one core (UNSTABLE is the right answer there; SLOWER is
not). Conditions are interleaved round-robin, so that slow drift of the machine hits
every condition alike. It prints a table and writes JSON.

``--inject all=1.10`` slows every phase alike: the canary of the step gate (detected when
a case fails on its step or tokens/s, and no phase is blamed). ``--processes N`` records
the baseline in N server processes (the verdicts then estimate the noise between
processes from it); ``--max-time S`` is every run's ``--specperf-max-time``.
With ``--attach URL`` every run attaches to that one running server instead (a big
model is loaded once): the baseline is recorded against it, and each repetition's pytest
process switches the server's injection through the control file in its run directory
(``--specperf-inject`` in attach mode), removing it again when it ends.
With ``--ab SIDE`` every run is an A/B run (``--specperf-ab SIDE``): no baseline is
recorded (the first run, an A/A one, stands in for it), each repetition measures both
sides alternating, and the injection slows the tested side only: the table is then the
false-alarm rate and the power of A/B mode (``--processes``: per side, every run).
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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_specperf import plain_text
from pytest_specperf.cli.calibrate_sittings import (
    AA,
    OFFSET_FORMS,
    RAW,
    REP_FILE,
    add_report_runs,
    baseline_runs,
    baseline_sittings,
    compact_report,
    device_prior,
    ignore_raw,
    levels_json,
    levels_table,
    merge_conditions,
    offsets_table,
    pct,
    prepare_sitting,
    prior_spread,
    sitting_dir,
    sitting_dirs,
    sitting_offsets,
    sitting_rows,
    sittings_table,
)
from pytest_specperf.cli.options import (
    add_attach_option,
    add_max_time_option,
    add_processes_option,
    add_replaced_options,
    add_tolerance_option,
    arg_type,
)
from pytest_specperf.judging.calibration import (
    AB_PROCESSES,
    FIT_RANGE,
    Condition,
    RunOutcome,
    ab_deciding_tolerances,
    ab_levels,
    at_run_share,
    detects,
    judge_run,
    noise_fit,
    pair_sweep,
    recommend,
    smallest_detected,
    sweep,
    unstable_parts,
)
from pytest_specperf.judging.levels import DEFAULT_COSTS, Costs, parse_costs
from pytest_specperf.judging.metrics import STEP, MetricKind, spec
from pytest_specperf.judging.noise import PRIOR_KINDS, case_spread_df
from pytest_specperf.judging.significance import LONE
from pytest_specperf.judging.verdict import (
    DEFAULT_STEP_TOLERANCE,
    DEFAULT_TOLERANCE,
    Verdict,
    Z,
    band_limit,
    parse_fraction,
)
from pytest_specperf.probe.phases import UNACCOUNTED
from pytest_specperf.reporting.table import render_table
from pytest_specperf.settings import (
    DEFAULT_TOLERANCES,
    TOLERANCE_FORM,
    ABSpec,
    Attach,
    ToleranceSpec,
    parse_ab,
    tolerance_text,
)
from pytest_specperf.store.baseline_schema import MAX_RUNS
from pytest_specperf.store.prior import baseline_files, write_prior
from pytest_specperf.store.report import (
    CaseRecord,
    Report,
    ReportError,
    comparison_json,
    read_report,
    run_family,
    saved_family,
    strict,
)

DEFAULT_SUITE = ("perf_tests", "-m", "long_context")
DEFAULT_FACTORS = ("verify=1.05", "verify=1.10", "all=1.10")
#: ``--inject none``: no injected condition (the quiet runs' false alarms and levels only).
NO_INJECT = "none"
#: Attempts at recording a quiet baseline before calibrating against a noisy one
#: (``--record-attempts``).
RECORD_ATTEMPTS = 3


def judge_report(
    report: Report, expect: str | None, tolerances: tuple[float, float] | None = None
) -> RunOutcome:
    """One run, judged by the verdict rule from its stored metrics at ``tolerances``
    (phases, step; default: those the run used), so that a resumed calibration judges
    older runs by the current rule. For a fresh run this is the run's own verdicts."""
    tol_phase, tol_step = tolerances or (
        report.tolerance or DEFAULT_TOLERANCE,
        report.step_tolerance or DEFAULT_STEP_TOLERANCE,
    )
    return judge_run(at_report_share(report), expect, tol_phase, tol_step)


def at_report_share(report: Report) -> list[CaseRecord]:
    """The report's cases, each gate at no looser a level than the share of its report's
    tests (``Report.tests``, a lower bound of its run's: a test that skipped itself left no
    case) gives it (``judging.calibration.at_run_share``): a report written before
    2026-12-05 saved one test's share for every case of a run of many; one older still
    saved none (a lone comparison's, ``LONE``)."""
    out = []
    for c in report.cases:
        family = run_family(c, report.tests)
        if family == (saved_family(c) or LONE):  # judged at that share already
            out.append(c)
        else:
            out.append(replace(c, metrics=at_run_share(c.metrics, family)))
    return out


@dataclass(frozen=True)
class CalibrateOptions:
    """The command line of ``specperf calibrate``, read once and validated."""

    repetitions: int
    injects: tuple[str, ...]
    host_stall_share: float
    hog: bool
    tolerances: tuple[float, float] | None
    json_path: Path | None
    work_dir: Path | None
    resume: bool
    suite: tuple[str, ...]
    #: server processes the baseline is recorded in (``--specperf-processes``)
    processes: int = 1
    #: every run's ``--specperf-max-time`` (None: the suite's)
    max_time: float | None = None
    attach: Attach | None = None
    #: this run is sitting K of a calibration in ``work_dir`` (``cli.calibrate_sittings``)
    sitting: int | None = None
    #: no runs: the summary of what ``work_dir`` holds
    summarize: bool = False
    #: write the measured device prior beside this directory's baseline file
    write_prior: Path | None = None
    #: a device prior file the repetitions are judged under (copied beside the baseline)
    prior: Path | None = None
    costs: Costs = DEFAULT_COSTS
    #: the effect the levels table sizes a stored baseline for (a fraction)
    target: float = 0.05
    #: ``--ab SIDE``: every run is A/B against this reference side (no baseline recorded)
    ab: ABSpec | None = None
    #: every repetition reads the earlier ones' reports as ``--specperf-history``
    history: bool = False
    #: recordings of the baseline while it comes out noisy (the last one is kept)
    record_attempts: int = RECORD_ATTEMPTS

    def run_args(self) -> list[str]:
        """pytest options every run of the calibration gets: the tolerances asked for, the
        extension's budget, the server to attach to (``--option=VALUE``: see ``_pytest``)."""
        out = []
        if self.tolerances is not None:
            out.append(f"--specperf-tolerance={ToleranceSpec(*self.tolerances)}")
        if self.max_time is not None:
            out.append(f"--specperf-max-time={self.max_time:g}")
        if self.attach is not None:
            out.append(f"--specperf-attach={self.attach}")
        if self.ab is not None:  # one argv word: args= may hold spaces
            out.append(f"--specperf-ab={self.ab}")
            if self.attach is None:
                out.append(f"--specperf-processes={self.processes}")
        return out

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CalibrateOptions:
        """Validate ``args``; ``ValueError`` with the message for the user."""
        if getattr(args, "misplaced_k", None) is not None:
            raise ValueError(
                f"-k {args.misplaced_k!r}: specperf calibrate has no -k; repetitions are "
                "--repetitions N, and pytest's -k selects tests after --, e.g. specperf "
                f"calibrate --repetitions 5 -- perf_tests -k {args.misplaced_k!r}"
            )
        if args.repetitions < 1:
            raise ValueError("--repetitions must be at least 1")
        attempts = getattr(args, "record_attempts", RECORD_ATTEMPTS)
        if attempts < 1:
            raise ValueError(
                f"--record-attempts {attempts}: must be at least 1 (1 keeps the first "
                "recording, noisy or not)"
            )
        if not 0 <= args.host_stall_share < 5:
            raise ValueError(
                f"--host-stall-share {args.host_stall_share:g}: must be in [0, 5) "
                "(0 leaves the host-stall condition out)"
            )
        injects = _injects(args)
        if args.resume and args.work_dir is None:
            raise ValueError("--resume needs --work-dir (the interrupted calibration's)")
        processes = getattr(args, "processes", 1)  # --processes, --max-time, --attach and
        max_time = getattr(args, "max_time", None)  # --tolerance: parsed by their type=
        sitting, summarize, costs, target_f = _sitting_options(args)
        if args.attach is not None and processes > 1:
            raise ValueError(
                f"--processes {processes} needs servers the plugin launches; with --attach "
                "there is one server: drop one of the two"
            )
        ab = getattr(args, "ab", None)
        if ab is not None:
            _check_ab(ab, args, sitting, summarize)
        return cls(
            processes=processes,
            max_time=max_time,
            repetitions=args.repetitions,
            injects=injects,
            host_stall_share=args.host_stall_share,
            hog=bool(args.hog),
            tolerances=_tolerances(args.tolerance),
            json_path=args.json, work_dir=args.work_dir,
            resume=bool(args.resume),
            suite=tuple(args.pytest_args or DEFAULT_SUITE),
            sitting=sitting,
            summarize=summarize,
            write_prior=getattr(args, "write_prior", None),
            prior=getattr(args, "prior", None),
            costs=costs,
            target=target_f,
            attach=args.attach,
            ab=ab,
            history=bool(getattr(args, "history", False)),
            record_attempts=attempts,
        )


def _check_ab(ab: ABSpec, args: argparse.Namespace, sitting: int | None,
              summarize: bool) -> None:  # fmt: skip
    """``--ab`` with options of the stored-baseline calibration: ``ValueError`` naming both."""
    for flag, given in (
        ("--sitting", sitting is not None),
        ("--summarize", summarize),
        ("--write-prior", getattr(args, "write_prior", None) is not None),
    ):
        if given:
            raise ValueError(
                f"--ab {ab} calibrates A/B mode, which records no baseline; {flag} belongs "
                "to the stored-baseline calibration: run the two separately"
            )
    if args.attach is not None and ab.launched:
        raise ValueError(
            f"--ab {ab} launches the reference side with the tested side's launch settings, "
            "which --attach does not know: attach to both sides (--ab url=URL) or drop --attach"
        )


def _sitting_options(args: argparse.Namespace) -> tuple[int | None, bool, Costs, float]:
    """Validate the calibration-over-sittings options: ``(sitting, summarize, costs,
    target)``; ``ValueError`` with the message for the user."""
    sitting = getattr(args, "sitting", None)
    summarize = bool(getattr(args, "summarize", False))
    if (sitting is not None or summarize) and args.work_dir is None:
        raise ValueError(
            "--sitting and --summarize need --work-dir (the calibration's directory, "
            "e.g. calibration/<slug>)"
        )
    if getattr(args, "write_prior", None) is not None and sitting is None and not summarize:
        raise ValueError(
            "--write-prior needs --sitting or --summarize (a calibration over sittings "
            "measures the prior)"
        )
    prior = getattr(args, "prior", None)
    if prior is not None and not Path(prior).is_file():
        raise ValueError(f"--prior {prior}: no such file (a <slug>.prior.yaml)")
    if sitting is not None and not 1 <= sitting <= 64:
        raise ValueError(f"--sitting {sitting}: must be from 1 to 64")
    try:
        costs = parse_costs(getattr(args, "costs", None) or "block=2")
    except ValueError as e:
        raise ValueError(f"--costs {e}") from None
    target = getattr(args, "target", None) or "5%"
    try:
        target_f = parse_fraction(target)
    except ValueError:
        raise ValueError(f"--target {target!r}: expected a fraction like 0.05 or 5%") from None
    if not 0 < target_f < 1:
        raise ValueError(f"--target {target!r}: must be between 0 and 100%")
    return sitting, summarize, costs, target_f


def _injects(args: argparse.Namespace) -> tuple[str, ...]:
    """``--inject``, checked: one slowdown each; none given, the plan of the work dir being
    resumed or the default factors; ``none`` alone, no injected condition."""
    from pytest_specperf.probe.inject import parse_inject

    injects = tuple(args.inject or ()) or _planned_injects(args) or DEFAULT_FACTORS
    if NO_INJECT in injects:
        others = [f for f in injects if f != NO_INJECT]
        if others:
            raise ValueError(
                f"--inject {NO_INJECT} leaves every injection out, but "
                f"{', '.join(repr(f) for f in others)} was given too: drop one or the other"
            )
        return ()
    for f in injects:
        try:
            inj = parse_inject(f)
        except ValueError as e:
            raise ValueError(f"--inject {f!r}: {e}") from None
        if (len(inj.factors) != 1 and inj.uniform is None) or inj.host_stall_ms or inj.waits_ms:
            raise ValueError(f"--inject {f!r}: give one PHASE=FACTOR (or all=FACTOR) per --inject")
    return injects


def _planned_injects(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--resume`` with no ``--inject``: the injections the work dir was calibrated with
    (its ``conditions.json``; ``(NO_INJECT,)`` if none), so a resumed calibration keeps
    its plan instead of adding the default factors. None: nothing to resume."""
    plan = Path(args.work_dir) / "conditions.json" if args.resume and args.work_dir else None
    if plan is None or not plan.is_file():
        return None
    try:
        names = json.loads(plan.read_text())
    except (OSError, ValueError):
        return None  # the plan check reports an unreadable plan
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    # the hog injects nothing; the host stall is its own option (--host-stall-share)
    conds = conditions_from_names(names)
    injects = tuple(c.inject for c in conds if c.inject and c.expect != UNACCOUNTED)
    return injects or (NO_INJECT,)


def _tolerances(given: ToleranceSpec | None) -> tuple[float, float] | None:
    """The tolerances every run gets: the parts given, the others the defaults."""
    if given is None:
        return None
    tol = given.over(DEFAULT_TOLERANCES)
    return tol.phase, tol.step


class Calibration:
    def __init__(self, opts: CalibrateOptions) -> None:
        self.opts = opts
        self.root = Path(opts.work_dir or tempfile.mkdtemp(prefix="specperf-calibrate-"))
        self.work = self.root if opts.sitting is None else sitting_dir(self.root, opts.sitting)
        if not opts.summarize:
            self.work.mkdir(parents=True, exist_ok=True)
            ignore_raw(self.work)
        self.baselines = self.work / "baselines"
        self.t0 = time.monotonic()
        #: options every run gets (``CalibrateOptions.run_args``)
        self.common_args = opts.run_args()

    def _pytest(self, tag: str, extra: list[str]) -> tuple[int, Report | None, float]:
        # The full report and the log go to raw/ (not committed); the compacted report
        # beside it is what the calibration reads back and a repository keeps.
        raw = self.work / RAW
        raw.mkdir(exist_ok=True)
        raw_report, report_path = raw / f"{tag}.json", self.work / f"{tag}.json"
        raw_report.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "pytest", *self.opts.suite, "-q", "-p", "no:cacheprovider",
            f"--specperf-baselines={self.baselines}", f"--specperf-json={raw_report}",
            *self.common_args, *extra,
        ]  # fmt: skip
        from pytest_specperf.server.supervisor import set_pdeathsig

        t = time.monotonic()
        with open(raw / f"{tag}.log", "wb") as log:
            # Ctrl-C reaches the run too (same process group); a calibrate killed or
            # terminated takes it down (SIGTERM), and the run's servers go with it.
            rc = subprocess.call(
                cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig
            )
        dt = time.monotonic() - t
        if raw_report.exists():
            try:
                compact_report(raw_report, report_path)
            except (OSError, ValueError) as e:
                print(f"skipping {raw_report}: {e}", file=sys.stderr)
        (self.work / f"{tag}.rc").write_text(f"{rc} {dt:.1f}\n")
        return rc, _read(report_path), dt

    def _resumed(self, tag: str) -> tuple[int, Report, float | None] | None:
        """A repetition finished by an earlier, interrupted calibration in this work dir.

        The report is written when its pytest session ends, so its presence means the run
        completed; its exit status and wall time come from the ``.rc`` file beside it
        (missing for runs of older versions: the status is then read off the verdicts)."""
        if not (self.opts.resume or self.opts.summarize):
            return None
        report = _read(self.work / f"{tag}.json")
        if report is None:
            return None
        try:
            rc_text, wall_text = (self.work / f"{tag}.rc").read_text().split()
            return int(rc_text), report, float(wall_text)
        except (OSError, ValueError):
            failed = any(c.verdict is Verdict.SLOWER for c in report.cases)
            return int(failed), report, None

    def record(self) -> Report:
        """Record the baseline; re-record (up to ``--record-attempts``) while it is noisy,
        since a baseline taken on a disturbed machine makes every comparison UNSTABLE."""
        saved = _read(self.work / "baseline.json")
        if self.opts.summarize:
            if saved is None:
                raise SystemExit(f"{self.work}: no baseline.json, nothing to summarize")
            return saved
        if self.opts.resume and saved is not None and (self.baselines.exists() or self.opts.ab):
            print(f"resuming: baseline from {saved.path}", flush=True)
            return saved
        if self.opts.ab is not None:
            return self._ab_first()
        report: Report | None = None
        for attempt in range(1, self.opts.record_attempts + 1):
            print(
                f"recording the baseline (attempt {attempt}): pytest {' '.join(self.opts.suite)} "
                "--specperf-update-baselines",
                flush=True,
            )
            extra = ["--specperf-update-baselines", f"--specperf-processes={self.opts.processes}"]
            if self.opts.sitting is None:
                if self.baselines.exists():
                    shutil.rmtree(self.baselines)
            else:  # this sitting's runs added to the previous sitting's, all kept
                prepare_sitting(self.root, self.opts.sitting, self.baselines)
                keep = min(MAX_RUNS, self.opts.sitting * self.opts.processes)
                extra += ["-o", f"specperf_keep_runs={keep}"]  # an ini option
            rc, report, dt = self._pytest("baseline", extra)
            if rc != 0 or report is None:
                raise SystemExit(
                    f"baseline run failed (exit {rc}); log: {self.work / RAW / 'baseline.log'}"
                )
            noisy = self._noisy_cases()
            print(
                f"  baseline recorded in {dt:.0f} s ({len(report.cases)} cases)"
                + (f"; noisy: {', '.join(noisy)}" if noisy else "; quiet"),
                flush=True,
            )
            if not noisy:
                break
        assert report is not None
        return report

    def _ab_first(self) -> Report:
        """A/B mode: no baseline to record; a first A/A run names the cases and the median
        step the host-stall condition is sized by (it is not one of the repetitions)."""
        print(f"A/B mode against {self.opts.ab}: a first A/A run (no baseline is recorded): "
              f"pytest {' '.join(self.opts.suite)}", flush=True)  # fmt: skip
        rc, report, dt = self._pytest("baseline", [])
        if report is None:
            raise SystemExit(
                f"the first A/B run wrote no report (exit {rc}); log: "
                f"{self.work / RAW / 'baseline.log'}"
            )
        print(f"  first A/B run in {dt:.0f} s ({len(report.cases)} cases, exit {rc})", flush=True)
        return report

    def _noisy_cases(self) -> list[str]:
        from pytest_specperf.judging.verdict import QUIET_SCATTER, noisiest_phase
        from pytest_specperf.store.baselines import load_baselines

        out = []
        for path in baseline_files(self.baselines):
            bf = load_baselines(path)
            for case in bf.all_cases() if bf else ():
                # a sitting's file holds the earlier sittings' runs too: this one's are last
                first = 0 if self.opts.sitting is None else len(case.runs) - self.opts.processes
                for i in range(max(first, 0), len(case.runs)):
                    worst = noisiest_phase(case.run_metrics(i))
                    if worst is not None and worst[1] > QUIET_SCATTER:
                        out.append(f"{case.key} run {i + 1} ({worst[0]} {worst[1]:.0%})")
        return out

    def conditions(self, stall_ms: float) -> list[Condition]:
        """A/A, each injected factor, the host stall (unless its share is 0), and A/A
        with a hog if asked."""
        conds = [Condition("A/A")]
        for f in self.opts.injects:
            conds.append(Condition(f, inject=f, expect=expected_metric(f)))
        if self.opts.host_stall_share > 0:
            conds.append(
                Condition(
                    f"host_stall={stall_ms:g}ms",
                    inject=f"host_stall={stall_ms:g}",
                    expect=UNACCOUNTED,
                )
            )
        if self.opts.hog:
            conds.append(Condition("A/A + CPU hog", hog=True))
        return conds

    def _check_plan(self, conds: list[Condition]) -> None:
        """A resumed calibration keeps every condition it had; it may add conditions
        (``--hog``, another ``--inject``), whose repetitions then start from the first."""
        names = [c.name for c in conds]
        plan = self.work / "conditions.json"
        if self.opts.resume and plan.exists():
            before = json.loads(plan.read_text())
            dropped = [b for b in before if b not in names]
            if dropped:
                raise SystemExit(
                    f"--resume: this work dir was calibrated with conditions {before}, now "
                    f"{names} (without {dropped}); give the same --inject/--hog/"
                    "--host-stall-share (conditions can be added, not dropped), or a new "
                    "--work-dir"
                )
            added = [n for n in names if n not in before]
            if added:
                print(
                    f"resuming with added condition(s) {added}: their repetitions start "
                    "from the first, interleaved with the others' remaining ones",
                    flush=True,
                )
        plan.write_text(json.dumps(names))

    def repetition(self, cond: Condition, rep: int) -> tuple[RunOutcome | None, int, float | None]:
        """Run (or resume) one repetition of ``cond``; its outcome, exit code, wall time."""
        tag = f"rep{rep:02d}-{_slug(cond.name)}"
        done = self._resumed(tag)
        if done is not None:
            rc, report, dt = done
        elif self.opts.summarize:  # never run here: only what the directory holds
            return None, -1, None
        else:
            extra = [f"--specperf-inject={cond.inject}"] if cond.inject else []
            if self.opts.history:  # the earlier repetitions' compacted reports
                extra.append(f"--specperf-history={self.work}")
            hog = _start_hog() if cond.hog else None
            try:
                rc, maybe, dt = self._pytest(tag, extra)
            finally:
                if hog is not None:
                    _stop_hog(hog)
            if maybe is None:
                return None, rc, dt
            report = maybe
        out = judge_report(report, cond.expect, self.opts.tolerances)
        out = replace(out, rep=rep, exit=rc, resumed=done is not None,
                      wall_s=None if dt is None else round(dt, 1))  # fmt: skip
        return out, rc, dt

    def use_prior(self, first: Report) -> None:
        """``--prior FILE``: the repetitions are judged under it (a held-out sitting after
        a calibration wrote the device's prior): copied beside every baseline file, or in
        A/B mode (no baseline file) beside the one the runs would read, named by the device
        of the ``first`` run (the baseline's, or A/B's first A/A run). A prior named for
        another device (``<slug>.prior.yaml``) is refused."""
        from pytest_specperf.store.baselines import BaselineError
        from pytest_specperf.store.prior import load_prior, prior_path

        if self.opts.prior is None or self.opts.summarize:
            return
        paths = baseline_files(self.baselines)
        if not paths:  # A/B: the runs read the prior beside the file they would have used
            slug = (first.data.get("device") or {}).get("slug")
            if not isinstance(slug, str) or not slug or "/" in slug:
                raise SystemExit(
                    f"--prior {self.opts.prior}: the first run's report "
                    f"({first.path}) names no device, so no run would read the prior"
                )
            paths = [self.baselines / f"{slug}.yaml"]
        name = self.opts.prior.name
        for path in paths:
            if name.endswith(".prior.yaml") and name != prior_path(path).name:
                raise SystemExit(
                    f"--prior {self.opts.prior}: measured for another device than this "
                    f"one ({path.stem}); give {prior_path(path).name}, this device's prior"
                )
        self.baselines.mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copyfile(self.opts.prior, prior_path(path))
            try:
                print(load_prior(path).describe(), flush=True)
            except BaselineError as e:
                prior_path(path).unlink()
                raise SystemExit(f"--prior {self.opts.prior}: {e}") from None

    def run(self) -> dict[str, Any]:
        self.conds: list[Condition] = []
        base = self.record()
        self.use_prior(base)
        steps = sorted(c.step_median_ms for c in base.cases)
        ref_step = steps[len(steps) // 2]
        stall_ms = round(self.opts.host_stall_share * ref_step, 1)
        conds = self.conditions(stall_ms)
        if not self.opts.summarize:
            self._check_plan(conds)
        elif (self.work / "conditions.json").exists():  # the sitting's own conditions
            conds = conditions_from_names(json.loads((self.work / "conditions.json").read_text()))
        k = self.opts.repetitions
        if self.opts.summarize:  # every repetition the directory holds
            reps = [REP_FILE.fullmatch(p.name) for p in self.work.glob("rep*.json")]
            k = max((int(m.group(1)) + 1 for m in reps if m), default=0)
        total, n = len(conds) * k, 0
        walls: list[float] = []
        for rep in range(k):
            for cond in conds:
                n += 1
                out, rc, dt = self.repetition(cond, rep)
                if dt is not None:
                    walls.append(dt)
                left = _eta(walls, total - n)
                if out is None and self.opts.summarize:
                    continue
                if out is None:
                    print(f"[{n:3d}/{total}] {cond.name:22s} rep {rep + 1}: no report "
                          f"(exit {rc}); see {self.work}{left}", flush=True)  # fmt: skip
                    continue
                cond.runs.append(out)
                if self.opts.summarize:
                    continue
                print(f"[{n:3d}/{total}] {cond.name:22s} rep {rep + 1:2d}/{k}  {_line(out)}"
                      f"{left}", flush=True)  # fmt: skip
        self.conds = conds
        return self.summarize(conds, base, stall_ms, ref_step)

    def summarize(
        self, conds: list[Condition], base: Report, stall_ms: float, ref_step: float
    ) -> dict[str, Any]:
        # Wall time of the whole calibration: this process, plus the runs it resumed.
        wall = time.monotonic() - self.t0
        wall += sum(r.wall_s or 0.0 for c in conds for r in c.runs if r.resumed)
        grids = {
            "phase": [round(0.01 * t, 2) for t in range(2, 16)],
            "step": [round(0.05 * t, 2) for t in range(1, 9)],
        }
        swept = {kind: sweep(conds, grid, kind) for kind, grid in grids.items()}
        return {
            "suite": list(self.opts.suite),
            "repetitions": self.opts.repetitions,
            "sweep": swept,
            "pairs": pair_sweep(conds),
            "recommended_tolerance": {kind: recommend(rows, conds) for kind, rows in swept.items()},
            "judged_at": list(self.opts.tolerances) if self.opts.tolerances else None,
            "host_stall_ms": stall_ms,
            "reference_step_ms": ref_step,
            "smallest_detected_95": smallest_detected(conds),
            "wall_s": round(wall, 1),
            "run_wall_s": _run_walls(conds),
            "baseline_processes": self.opts.processes,
            "resumed_runs": sum(1 for c in conds for r in c.runs if r.resumed),
            "conditions": [_condition_row(c) for c in conds],
            "baseline_cases": [c.key for c in base.cases],
            "baseline_noise": baseline_noise(self.baselines),
            "unstable_parts": unstable_parts(conds[0]),  # the quiet A/A runs
            **_noise_checks(conds),
            "work_dir": str(self.work),
            # A/B mode: every run measured the reference side too (``--ab``)
            "comparison": comparison_json(str(self.opts.ab) if self.opts.ab else None),
        }


def _noise_checks(conds: Sequence[Condition]) -> dict[str, Any]:
    """What the quiet A/A runs say of the noise they were judged with: the fit over all of
    them, and in A/B mode the levels per case and what one device value is worth."""
    levels = ab_levels(_quiet_runs(conds))  # A/B mode's A/A runs only
    return {
        "noise_fit": noise_fit(_quiet_runs(conds), "all"),
        "ab_levels": levels,
        "ab_case_spread_df": _case_spread(levels),
        "ab_deciding_tolerances": ab_deciding_tolerances(_quiet_runs(conds)),
    }


def _case_spread(levels: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Per metric of ``ab_levels``' rows, ``case_spread_df`` over its cases."""
    return {
        metric: case_spread_df(
            [(r["between_hat"] ** 2, r["between_df"]) for r in levels if r["metric"] == metric]
        )
        for metric in sorted({r["metric"] for r in levels})
    }


def _quiet_runs(conds: Sequence[Condition]) -> list[RunOutcome]:
    """The quiet A/A runs (not the hog's) of ``conds``."""
    return [r for c in conds if c.name == AA and not c.hog for r in c.runs]


def conditions_from_names(names: Sequence[str]) -> list[Condition]:
    """The conditions a work dir's ``conditions.json`` names (``Calibration.conditions``
    makes them from the options; this reads them back without the options)."""
    out = []
    for name in names:
        if name == "A/A":
            out.append(Condition(name))
        elif name == "A/A + CPU hog":
            out.append(Condition(name, hog=True))
        elif name.startswith("host_stall="):
            out.append(Condition(name, inject=name.removesuffix("ms"), expect=UNACCOUNTED))
        else:
            out.append(Condition(name, inject=name, expect=expected_metric(name)))
    return out


def summarize_sittings(opts: CalibrateOptions) -> dict[str, Any]:
    """The summary of every sitting under ``opts.work_dir``, from its files alone: the
    conditions' runs merged over the sittings, a row per sitting, the variance at each
    level (the last sitting's baseline, which holds every sitting's runs, and every quiet
    A/A run as a sitting of its own) with the Kalibera & Jones table, and the device prior
    they measure (written with ``--write-prior DIR``)."""
    root = Path(opts.work_dir or ".")
    per: list[tuple[int, Sequence[Condition], int]] = []
    last: Calibration | None = None
    for k, d in sitting_dirs(root):
        if not (d / "baseline.json").is_file():
            print(f"{d}: no baseline recorded, left out", file=sys.stderr)
            continue
        cal = Calibration(replace(opts, sitting=k, summarize=True, resume=True))
        cal.run()
        per.append((k, cal.conds, baseline_sittings(cal.baselines)))
        last = cal
    if last is None:
        raise SystemExit(f"{root}: no sitting-K directory with a recorded baseline")
    base = _read(last.work / "baseline.json")
    assert base is not None
    steps = sorted(c.step_median_ms for c in base.cases)
    ref_step = steps[len(steps) // 2]
    merged = merge_conditions([c for _, c, _ in per])
    stalls = [c.inject for c in merged if c.inject and c.inject.startswith("host_stall=")]
    stall_ms = float(stalls[0].split("=")[1]) if stalls else 0.0  # the first sitting's
    summary = last.summarize(merged, base, stall_ms, ref_step)
    summary["repetitions"] = max((len(c.runs) for c in merged), default=0)
    summary["work_dir"] = str(root)
    summary["sittings"] = sitting_rows(per)
    cases = baseline_runs(last.baselines)
    aa_runs = _per_sitting_checks(root, per, cases, summary)
    summary["levels"] = levels_json(cases, opts.costs, opts.target)
    summary["costs"] = vars(opts.costs)
    prior = device_prior(
        cases,
        f"specperf calibrate, {root.name}: {len(per)} sittings, {aa_runs} A/A runs, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}",
    )
    summary["prior"] = {"source": prior.source, "provisional": prior.provisional,
                        **{kind: vars(prior.of(kind)) for kind in PRIOR_KINDS},
                        "case_spread_df": prior_spread(cases, prior)}  # fmt: skip
    if opts.write_prior is not None:
        written = [
            str(write_prior(opts.write_prior / path.name, prior))
            for path in baseline_files(last.baselines)
        ]
        summary["prior"]["written"] = written
    return summary


def _per_sitting_checks(
    root: Path,
    per: Sequence[tuple[int, Sequence[Condition], int]],
    cases: dict[str, Any],
    summary: dict[str, Any],
) -> int:
    """Each sitting's quiet A/A runs: their processes added to ``cases`` (the levels),
    their offsets and their noise fit into ``summary`` (the fit over all after them); the
    number of those runs."""
    aa_runs = 0
    offsets: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    for k, conds, _ in per:
        fits.extend(noise_fit(_quiet_runs(conds), f"sitting {k}"))
        d = sitting_dir(root, k)
        quiet = []
        for path in sorted(d.glob(f"rep*-{_slug(AA)}.json")):
            report = _read(path)
            if report is not None:
                add_report_runs(cases, report.data, f"{d.name}/{path.stem}")
                quiet.append(report)
        aa_runs += len(quiet)
        offsets.extend(sitting_offsets(k, quiet))
    summary["offsets"] = offsets
    summary["noise_fit"] = [*fits, *summary["noise_fit"]]  # each sitting's, then all
    return aa_runs


#: Judged forms whose between-process noise the calibration shows (those that exist).
NOISE_FORMS = ("step/ref", "verify/rest", "draft/rest")


def baseline_noise(directory: Path) -> list[dict[str, Any]]:
    """Per baseline case with several runs: for each form of ``NOISE_FORMS``, the raw
    between-process standard deviation ``tau_hat`` (no prior) and the block-to-block one,
    from its runs (``judging.noise``): why a tolerance can or cannot be met here."""
    from pytest_specperf.judging.noise import anova_between, log_rows
    from pytest_specperf.store.baselines import load_baselines

    rows = []
    for path in baseline_files(directory):
        bf = load_baselines(path)
        for case in bf.all_cases() if bf else ():
            row: dict[str, Any] = {"case": f"{case.test.rsplit('::', 1)[-1]} {case.key}",
                                   "runs": len(case.runs)}  # fmt: skip
            for form in NOISE_FORMS:
                blocks = [r.blocks.get(form, ()) for r in case.runs]
                logs = [x for x in (log_rows(b, len(blocks[-1])) for b in blocks) if x]
                tau2 = anova_between(logs) if len(logs) >= 2 else None
                row[form] = None if tau2 is None else math.sqrt(tau2)
            rows.append(row)
    return rows


def _unstable_table(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("unstable_parts") or ()
    if not rows:
        return []

    def band(r: dict[str, Any]) -> str:  # a disturbed case is UNSTABLE whatever its band
        if r["noise"] is None:
            return "-"
        wide = (r.get("critical") or Z) * r["noise"]
        # the band is of a log change: against the tolerance on that scale (ln 1.07 = 6.77%)
        ms = spec(r["metric"])
        relative = ms.kind not in (MetricKind.SHARE, MetricKind.UTILIZATION)
        limit = band_limit(r["tolerance"], higher_is_better=ms.higher_is_better, relative=relative)
        return (
            f"{wide * 100:.1f}% {'>' if wide > limit else '<='} {limit * 100:.2f}% "
            f"(tol {tolerance_text(r['tolerance'])})"
        )

    cells = [
        [r["case"], r["metric"], f"{r['unstable']}/{r['runs']}", pct(r["noise"]),
         pct(r["within"]), pct(r["between"]), band(r)]
        for r in rows
    ]  # fmt: skip
    return [
        "",
        "why quiet A/A runs were UNSTABLE (medians over the runs where the metric was): "
        "noise = this run's blocks (within: more steps shrink it) and between processes",
        *render_table(
            ["case", "metric", "UNSTABLE", "noise", "within", "between", "t x noise vs tol"],
            cells,
        ),
    ]


def _noise_table(summary: dict[str, Any]) -> list[str]:
    rows = [r for r in summary.get("baseline_noise") or () if r["runs"] >= 2]
    if not rows:
        return []
    cells = [
        [r["case"], str(r["runs"]),
         *("-" if r.get(f) is None else f"{r[f] * 100:.2f}%" for f in NOISE_FORMS)]
        for r in rows
    ]  # fmt: skip
    return [
        "",
        "noise between server processes in the baseline (tau_hat, standard deviation of one "
        "run's center, no prior)",
        *render_table(["case", "runs", *NOISE_FORMS], cells),
    ]


def expected_metric(inject: str) -> str:
    """The metric a detection of ``inject`` must name: its phase, or the step for
    ``all=`` (every phase alike: no phase stands out, the step grows)."""
    from pytest_specperf.probe.inject import parse_inject

    spec_ = parse_inject(inject)
    return STEP if spec_.uniform is not None else next(iter(spec_.factors))


def _read(path: Path) -> Report | None:
    """A repetition's report, or None when it is missing or unusable (said on stderr)."""
    if not path.exists():
        return None
    try:
        return read_report(path)
    except ReportError as e:
        print(f"skipping {e}", file=sys.stderr)
        return None


def _line(out: RunOutcome) -> str:
    what = ", ".join(f"{c.head}@{c.key}" for c in out.slower_cases)
    text = f"FAIL {what}" if out.slower_cases else "pass"
    text += f", {len(out.unstable_cases)} UNSTABLE" if out.unstable_cases else ""
    text += f"  {out.wall_s:.0f} s" if out.wall_s is not None else "  -"
    return text + ("  (resumed)" if out.resumed else "")


def _eta(walls: Sequence[float], runs_left: int) -> str:
    """``  (about 1h 5m left)``: the runs left at the median wall time of those run."""
    if not walls or runs_left <= 0:
        return ""
    left = sorted(walls)[len(walls) // 2] * runs_left
    hours, minutes = int(left // 3600), int(left % 3600 // 60)
    return f"  (about {f'{hours}h ' if hours else ''}{max(minutes, 1)}m left)"


def _run_walls(conds: list[Condition]) -> dict[str, float] | None:
    """Median, least and most wall time of one run of the suite (server start included)."""
    walls = sorted(r.wall_s for c in conds for r in c.runs if r.wall_s is not None)
    if not walls:
        return None
    return {"median": walls[len(walls) // 2], "min": walls[0], "max": walls[-1]}


def _condition_row(c: Condition) -> dict[str, Any]:
    k = len(c.runs)
    return {
        "condition": c.name,
        "inject": c.inject,
        "hog": c.hog,
        "expect": c.expect,
        "runs": k,
        "slower_runs": c.slower_runs,
        "detected": c.detected,
        "named_right": c.named_right,
        "unstable_runs": c.unstable_runs,
        "moved": c.moved(),
        "rate": c.slower_runs / k if k else math.nan,
        "details": [r.to_json() for r in c.runs],
    }


def _verdict_table(summary: dict[str, Any]) -> list[str]:
    at = summary.get("judged_at")
    head = "verdicts at " + (
        f"tolerance {tolerance_text(at[0])} (phases), {tolerance_text(at[1])} (step)"
        if at
        else "the tolerances the runs used (the suite's defaults)"
    )
    rows = []
    for r in summary["conditions"]:
        named = "-" if not r["expect"] else f"{r['named_right']}/{r['runs']} ({r['expect']})"
        failed = f"{r['slower_runs']}/{r['runs']}" + (
            " false alarms" if r["expect"] is None else ""
        )
        moved = r.get("moved")
        rows.append([r["condition"], str(r["runs"]), failed, named,
                     f"{r['unstable_runs']}/{r['runs']}",
                     "-" if moved is None else f"{moved:+.1%}"])  # fmt: skip
    headers = ["condition", "runs", "failed (SLOWER)", "named right phase", "any UNSTABLE",
               "judged change"]  # fmt: skip
    lines = [head, *render_table(headers, rows)]
    if any(r.get("moved") is not None for r in summary["conditions"]):
        lines.append(
            "judged change: the median change of the named metric's gate over every case of "
            "every run; a factor F aims at F - 1 (verify=1.05: +5.0%), and a smaller change "
            "means the rest of the step slowed with the phase: the detections are of that"
        )
    return lines


_SWEEP_TITLES = {
    "phase": "phases, accept length, unaccounted share: --specperf-tolerance",
    "step": "step time and tokens/s: --specperf-tolerance step=",
}


def _sweep_table(summary: dict[str, Any], kind: str) -> list[str]:
    rows = summary.get("sweep", {}).get(kind)
    if not rows:
        return []
    conds = summary["conditions"]
    cells = []
    for row in rows:
        line = [f"{row['tolerance']:.0%}"]
        for r in conds:
            v = row[r["condition"]]
            key = "detected" if detects(r["expect"], kind) else "failed"
            line.append(f"{v[key]}/{v['runs']}")
        cells.append(line)
    rec = summary["recommended_tolerance"].get(kind)
    return [
        "",
        f"the same runs judged at other tolerances for {_SWEEP_TITLES[kind]}",
        "(runs that would fail)"
        if kind == "step"
        else "(A/A and all= columns: runs that would fail; "
        "phase columns: runs that would detect the injected phase)",
        *render_table(["tolerance", *(r["condition"] for r in conds)], cells),
        "smallest tolerance with at most 1 false alarm per 20 A/A runs: "
        + (f"{rec:.0%}" if rec is not None else f"none up to {rows[-1]['tolerance']:.0%}"),
    ]


def _pair_table(summary: dict[str, Any]) -> list[str]:
    """Each pair of tolerances: A/A columns 'failed runs, runs with an UNSTABLE case',
    injected columns 'runs that detected it (failed naming its metric)'."""
    rows = summary.get("pairs")
    if not rows:
        return []
    conds = summary["conditions"]
    cells = []
    for row in rows:
        line = [tolerance_text(row["tolerance"]), tolerance_text(row["step_tolerance"])]
        for r in conds:
            v = row[r["condition"]]
            n = v["runs"]
            if r["expect"] is None:
                line.append(f"{v['failed']}/{n} fail, {v['unstable']}/{n} U")
            else:
                line.append(f"{v['detected']}/{n}")
        cells.append(line)
    return [
        "",
        "the same runs judged at pairs of tolerances (A/A: runs that would fail, runs with "
        "an UNSTABLE case; injected: runs that would fail naming the injected metric)",
        *render_table(["phases", "step", *(r["condition"] for r in conds)], cells),
    ]


def _footer(summary: dict[str, Any]) -> list[str]:
    wall = summary["wall_s"]
    resumed = summary.get("resumed_runs")
    runs = summary.get("run_wall_s")
    per_run = (
        [f"one run of the suite: {runs['median']:.0f} s (median; {runs['min']:.0f}-"
         f"{runs['max']:.0f} s), server start included"]
        if runs else []
    )  # fmt: skip
    return [
        "",
        *per_run,
        *(["smallest injected factor detected in >= 95% of runs: "
           f"{summary['smallest_detected_95'] or 'none of those tried'}"]
          if _slowed(summary) else []),
        f"host stall: {summary['host_stall_ms']} ms per step (about "
        f"{summary['host_stall_ms'] / summary['reference_step_ms']:.0%} of the median "
        f"case's {summary['reference_step_ms']:.1f} ms step)",
        f"wall time: {int(wall // 3600)}h {int(wall % 3600 // 60)}m {int(wall % 60)}s "
        f"({summary['repetitions']} repetitions per condition"
        + (f"; {resumed} runs resumed from an interrupted calibration" if resumed else "")
        + ")",
    ]


def _fit_table(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("noise_fit") or ()
    if not rows:
        return []

    cells = [
        [r["runs"], OFFSET_FORMS.get(r["metric"], r["metric"]),
         f"{r['gates']} ({r['independent']})",
         f"{r['rms_z']:.2f}", f"{r['expected']:.2f}", f"{r['ratio']:.2f}",
         f"{r['low']:.2f}-{r['high']:.2f}", r["fit"],
         f"{r['worst_case'].rsplit('::', 1)[-1]} {r['worst_rms_z']:.2f}",
         f"{pct(r['worst_between_hat'])} / {pct(r['worst_between'])}"]
        for r in rows
    ]  # fmt: skip
    return [
        "",
        "does the stated noise fit the quiet A/A runs? (per gate z = ln(1 + change) / noise; "
        "its RMS against the model's, sqrt(mean df/(df-2)); the range: sqrt(chi2_n/n) at "
        f"{FIT_RANGE:.0%}, n the fewer of runs and cases)",
        *render_table(
            ["A/A runs", "form", "gates (n)", "RMS z", "model", "ratio", "range", "noise",
             "farthest case (RMS z)", "its tau: runs' own / judged"],
            cells,
        ),
    ]  # fmt: skip


def _ab_levels_table(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("ab_levels") or ()
    if not rows:
        return []
    runs = summary.get("run_wall_s") or {}
    per_run = runs.get("median")

    def at(r: dict[str, Any], p: int) -> str:
        a = r["processes"][str(p)]
        return f"{a['band']:.1%}{'' if a['decided'] else ' U'}, {a['smallest_caught']:+.1%}"

    def own(r: dict[str, Any]) -> str:
        b = r.get("run_band")  # absent from summaries written before it was kept
        return f"{b['median']:.1%}, {b['widest']:.1%}" if b else "-"

    cells = [
        [r["case"].rsplit("::", 1)[-1], OFFSET_FORMS.get(r["metric"], r["metric"]),
         str(r["runs"]), f"{r['within']:.2%}",
         f"{r['between_hat']:.2%} ({r['between_df']})", f"{r['between_judged']:.2%}",
         own(r), *(at(r, p) for p in AB_PROCESSES)]
        for r in rows
    ]  # fmt: skip
    cost = (
        f"; a run took {per_run:.0f} s at the calibration's processes a side, and grows "
        "about in proportion to them"
        if per_run
        else ""
    )
    return [
        "",
        "A/B's levels per case, from the quiet A/A runs: paired block noise w, the "
        "between-process sd the runs measured within each side (df) and the one judged "
        "with; the bands (t x noise, log) the runs judged it with, median and widest; at P "
        "processes a side, were the measured one right: the typical band (the least "
        "tolerance that decides the case in a typical run; U: over the runs' tolerance) and "
        f"the smallest change caught 19 times in 20 at the runs' tolerance{cost}",
        *render_table(
            ["case", "form", "A/A runs", "w", "tau measured (df)", "tau judged",
             "runs' bands", *(f"{p} a side: band, caught" for p in AB_PROCESSES)],
            cells,
        ),
        *_spread_lines(summary.get("ab_case_spread_df") or {}),
        *_deciding_lines(summary.get("ab_deciding_tolerances") or {}),
    ]  # fmt: skip


#: How ``_deciding_lines`` names each tolerance kind's gates.
DECIDING_LABELS = {"phase": "phase gates", "step": "step gates"}


def _percent_up(x: float) -> str:
    """A tolerance, rounded up to a tenth of a percent (rounded down, it would not decide)."""
    return f"{math.ceil(round(x * 1000, 6)) / 10:.1f}%"


def _deciding_lines(need: dict[str, dict[str, Any]]) -> list[str]:
    """Why a case's typical band does not choose a tolerance: each run's least deciding one."""
    def of(n: dict[str, Any]) -> str:
        rank = math.ceil(n["share"] * n["runs"])
        share = f"{rank} of {n['runs']} runs from {_percent_up(n['within_share'])}, "
        return f"median {_percent_up(n['median'])}, {share if rank < n['runs'] else ''}" + (
            f"all {n['runs']} from {_percent_up(n['widest'])}"
        )

    said = [f"{DECIDING_LABELS.get(kind, kind)}: {of(n)}" for kind, n in need.items()]
    if not said:
        return []
    return [
        "a run has an UNSTABLE case when any one of its gates' bands passes the tolerance, "
        "and which gate is widest changes from run to run, so read a tolerance from each A/A "
        "run's least tolerance that decides all its gates of a kind (disturbed cases aside), "
        f"not from a case's typical band above: {'; '.join(said)} (the pairs table below "
        "counts the UNSTABLE runs at each tolerance)"
    ]


def _spread_lines(spread: dict[str, float | None]) -> list[str]:
    """What the cases' spread says of one device-wide between-process value."""
    said = [
        f"{OFFSET_FORMS.get(metric, metric)} about {df:.1f} df"
        for metric, df in spread.items()
        if df is not None
    ]
    if not said:
        return []
    return [
        "the cases' process spreads differ beyond their sampling: one device-wide value "
        f"predicts a case's as well as {', '.join(said)} would (case_spread_df)"
    ]


def _prior_lines(summary: dict[str, Any]) -> list[str]:
    prior = summary.get("prior")
    if not prior:
        return []
    p, s = (prior[level] for level in ("phase", "step"))  # the prior's two levels
    state = "PROVISIONAL (a level without data keeps the provisional value)" if prior[
        "provisional"] else "measured"  # fmt: skip
    lines = [
        "",
        f"device prior {state}: between processes {p['between']:.2%} ({p['between_df']:g} df, "
        f"phases), {s['between']:.2%} ({s['between_df']:g} df, step); between sittings "
        f"{p['sitting']:.2%} ({p['sitting_df']:g} df), {s['sitting']:.2%} ({s['sitting_df']:g} df)",
    ]
    spread = prior.get("case_spread_df") or {}
    said = [
        f"{level} {spread[kind][level]:.1f} df of {spread[kind].get(level + '_pooled', 0):g} "
        f"({kind})"
        for kind in PRIOR_KINDS
        for level in ("between", "sitting")
        if spread.get(kind, {}).get(level) is not None
    ]
    if said:
        lines.append(
            "as a predictor of one case (the cases' spread, case_spread_df), the pooled "
            f"values are worth: {', '.join(said)}; the prior carries the lesser (at least 1)"
        )
    for path in prior.get("written") or ():
        lines.append(f"written: {path}")
    return lines


def _slowed(summary: dict[str, Any]) -> bool:
    """Whether the calibration injected any slowdown (not ``--inject none`` alone)."""
    return any(c.get("inject") for c in summary.get("conditions") or ())


def format_table(summary: dict[str, Any]) -> list[str]:
    """The calibration's tables: verdicts per condition, the two tolerance sweeps."""
    costs = summary.get("costs")
    comparison = summary.get("comparison") or {}
    mode = (
        [f"A/B mode: every run against the reference side {comparison.get('reference')}"
         + (" (the injections slowed the tested side only)" if _slowed(summary) else ""), ""]
        if comparison.get("mode") == "ab" else []
    )  # fmt: skip
    return [
        *mode,
        *_verdict_table(summary),
        *sittings_table(summary.get("sittings") or ()),
        *levels_table(summary.get("levels") or (), Costs(**costs) if costs else None),
        *offsets_table(summary.get("offsets") or ()),
        *_fit_table(summary),
        *_ab_levels_table(summary),
        *_prior_lines(summary),
        *_sweep_table(summary, "phase"),
        *_sweep_table(summary, "step"),
        *_pair_table(summary),
        *_noise_table(summary),
        *_unstable_table(summary),
        *_footer(summary),
    ]


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
        description=plain_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "--repetitions", type=int, default=20, help="repetitions per condition (default 20)"
    )
    # -k is pytest's test selection, which belongs after --: caught here to say so
    c.add_argument("-k", dest="misplaced_k", metavar="EXPR", help=argparse.SUPPRESS)
    c.add_argument(
        "--inject",
        action="append",
        metavar="PHASE=FACTOR",
        help="slowdown to test: PHASE=FACTOR, or all=FACTOR for every phase alike "
        f"(repeatable; default: {', '.join(DEFAULT_FACTORS)}; {NO_INJECT}: the quiet A/A "
        "runs only, for false alarms and the noise's levels)",
    )
    c.add_argument(
        "--host-stall-share",
        type=float,
        default=0.20,
        help="host stall per step, as a share of the median case's step (default 0.2; "
        "0 leaves the host-stall condition out)",
    )
    c.add_argument(
        "--hog", action="store_true", help="add A/A repetitions with a busy process on one core"
    )
    c.add_argument(
        "--record-attempts",
        type=int,
        default=RECORD_ATTEMPTS,
        metavar="N",
        help="record the baseline again while it comes out noisy (a phase's blocks "
        f"scattering), at most N times in all, keeping the last (default {RECORD_ATTEMPTS}; "
        "1: the first, as it comes, on a box that is always this noisy)",
    )
    add_tolerance_option(
        c.add_argument,
        "",
        "tolerances to run and judge at, as --specperf-tolerance (default: the suite's; a "
        "part not given: the default); the sweep tables show every other",
    )
    _add_run_options(c)
    _add_sitting_options(c)
    c.add_argument("--json", type=Path, help="write the results to this file")
    c.add_argument("--work-dir", type=Path, help="keep baselines, logs and reports here")
    c.add_argument(
        "--resume",
        action="store_true",
        help="continue the calibration in --work-dir: its baseline and finished runs are "
        "reused; conditions may be added, not dropped; a larger --repetitions extends it",
    )
    c.add_argument(
        "pytest_args",
        nargs="*",
        help=f"suite to run, after -- (default: {' '.join(DEFAULT_SUITE)})",
    )


def _add_sitting_options(c: Any) -> None:
    c.add_argument(
        "--sitting",
        type=int,
        metavar="K",
        help="sitting K of a calibration in --work-dir: records this sitting's baseline "
        "runs on top of sitting K-1's (in --work-dir/sitting-K), runs the repetitions "
        "against it, then prints the summary over every sitting so far",
    )
    c.add_argument(
        "--summarize",
        action="store_true",
        help="run nothing: the summary of every sitting in --work-dir, from its files",
    )
    c.add_argument(
        "--write-prior",
        type=Path,
        metavar="DIR",
        help="with --sitting or --summarize: write the measured device prior to "
        "DIR/<slug>.prior.yaml (DIR: the baselines directory the suite uses)",
    )
    c.add_argument(
        "--prior",
        type=Path,
        metavar="FILE",
        help="judge the repetitions under this device prior file (a measured "
        "<slug>.prior.yaml: the held-out sitting after a calibration; with --ab, A/B "
        "runs under it: its between-process level)",
    )
    c.add_argument(
        "--costs",
        metavar="block=S,process=S,sitting=S",
        help="seconds per block, server process and sitting for the Kalibera & Jones "
        "table (default block=2,process=15,sitting=72)",
    )
    c.add_argument(
        "--target",
        metavar="F",
        help="the change the levels table sizes a stored baseline for (default 5%%)",
    )


def _add_run_options(c: Any) -> None:
    add_processes_option(
        c.add_argument,
        "",
        "record the baseline in N server processes (--specperf-processes; default 1)",
        default=1,
    )
    add_max_time_option(
        c.add_argument,
        "",
        "every run's --specperf-max-time (the automatic extension's budget per case)",
    )
    add_attach_option(
        c.add_argument,
        "",
        "calibrate against this running server (as --specperf-attach): baseline and every "
        "repetition on it, injections switched through its run directory's control file",
    )
    c.add_argument(
        "--ab",
        type=arg_type(parse_ab),
        metavar="SIDE",
        help="A/B mode: every run as --specperf-ab SIDE (python=PATH, args=ARGS or "
        "url=URL); no baseline recorded; the injections slow the tested side only; "
        "--processes is then per side",
    )
    c.add_argument(
        "--history",
        action="store_true",
        help="every repetition reads the earlier repetitions' reports in --work-dir as "
        "--specperf-history (the newest 14), as a nightly job that keeps its reports does: "
        "with --ab, each case's between-process noise is then learnt run after run",
    )
    add_replaced_options(
        c.add_argument,
        {
            "--step-tolerance": (f"was replaced by --tolerance {TOLERANCE_FORM}", True),
            "--server-url": ("was replaced by --attach URL", True),
        },
    )


def run(args: argparse.Namespace) -> int:
    try:
        opts = CalibrateOptions.from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.json_path is not None:
        try:  # fail now, not after hours of runs
            opts.json_path.parent.mkdir(parents=True, exist_ok=True)
            opts.json_path.touch()
        except OSError as e:
            print(f"error: --json {opts.json_path}: {e}", file=sys.stderr)
            return 2
    cal = None if opts.summarize else Calibration(opts)
    summary = summarize_sittings(opts) if cal is None else cal.run()
    if cal is not None and opts.sitting is not None:
        summary = summarize_sittings(opts)
    print()
    for line in format_table(summary):
        print(line)
    if opts.json_path:
        opts.json_path.write_text(json.dumps(strict(summary), indent=1, allow_nan=False))
        print(f"JSON: {opts.json_path}")
    if not opts.work_dir and cal is not None:
        shutil.rmtree(cal.work, ignore_errors=True)
    return 0
