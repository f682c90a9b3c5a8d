"""The committed A/A runs of this folder judged again at the looks the current rule plans
(``significance.planned_looks``): every case here took longer a round than half of
``--specperf-max-time`` (30 s), so the extension never ran and each case is now judged at
one look, not at Pocock's level over 4. Each gate keeps its stored noise, change and
degrees of freedom; its level becomes the first Holm step of its case's share at the
planned looks and its critical value Student's t there (as ``calibration.at_run_share``
does for a tighter share). Per work dir: the runs with an UNSTABLE case and with a SLOWER
one at the shipped tolerances (7% phases, 25% step) as stored and as planned now, and the
median widest phase band both ways.

    cd calibration/cpu-amd-epyc-2c-ab-steps
    /work/venv/bin/python one_look.py steps32 steps64:0-7 procs3 > one_look.txt

(``dir:K-L``: the work dir's runs K+1 to L, as in compare.py; ``steps64:0-7``, the runs of
the frozen ``4182240``.)

Run with the package installed (the rule's own functions are used).
"""

import glob
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from pytest_specperf.cli.calibrate import judge_report
from pytest_specperf.judging.calibration import judge_run
from pytest_specperf.judging.significance import critical, planned_looks
from pytest_specperf.store.report import read_report, run_family

HERE = Path(__file__).parent
TOL_PHASE, TOL_STEP = 0.07, 0.25
PHASES = ("verify", "draft")


def widest(judged, phase=True):
    return max(
        (m.critical * m.noise for case in judged for m in case
         if (m.metric in PHASES) == phase and m.metric in (*PHASES, "step")
         and m.critical is not None and m.noise is not None),
        default=0.0,
    )  # fmt: skip


def at_plan(report):
    cases = []
    for c in report.cases:
        family = run_family(c, report.tests)
        first = c.data.get("wall_s")  # one round: the case's measured time, servers included
        looks = planned_looks(report.data.get("max_time_s") or 30.0, float(first or 0.0))
        # wall_s includes the servers' starts, which the plan excludes: every case here took
        # 16-69 s of measurement a round, so one look either way (checked below).
        plan = replace(family, looks=looks, look=1)
        level = plan.gate_alpha(len(c.metrics))
        df = [float("inf") if m.df is None else m.df for m in c.metrics]
        metrics = tuple(
            replace(m, alpha=level, critical=critical(level, d)) for m, d in zip(c.metrics, df)
        )
        cases.append((replace(c, metrics=metrics), looks))
    return cases


def main(args):
    for arg in args:
        name, _, span = arg.partition(":")  # dir:K-L: its runs K+1 to L, as compare.py
        first, _, last = span.partition("-")
        files = sorted(glob.glob(str(HERE / name / "rep*-A_A.json")))
        files = files[int(first or 0) : int(last) if last else None]
        rows = []
        for f in files:
            report = read_report(Path(f))
            stored = judge_report(report, None, (TOL_PHASE, TOL_STEP))
            planned = at_plan(report)
            now = judge_run([c for c, _ in planned], None, TOL_PHASE, TOL_STEP)
            rows.append((Path(f).name[:5], stored, now, sorted({n for _, n in planned})))
        print(f"== {arg}: {len(rows)} A/A runs (the history's stand-in not among them)")
        for rep, stored, now, looks in rows:
            print(
                f"  {rep}  looks now {looks}  widest phase band {widest(stored.judged):.2%} -> "
                f"{widest(now.judged):.2%}  step {widest(stored.judged, False):.2%} -> "
                f"{widest(now.judged, False):.2%}  UNSTABLE cases "
                f"{len(stored.unstable_cases)} -> {len(now.unstable_cases)}  SLOWER "
                f"{len(stored.slower_cases)} -> {len(now.slower_cases)}"
            )
        if rows:
            for label, i in (("as stored", 1), ("at the planned looks", 2)):
                outs = [r[i] for r in rows]
                print(
                    f"  {label:22s} runs with an UNSTABLE case "
                    f"{sum(1 for o in outs if o.unstable_cases)}/{len(outs)}, with a SLOWER "
                    f"{sum(1 for o in outs if o.slower_cases)}/{len(outs)}; median widest "
                    f"phase band {statistics.median(widest(o.judged) for o in outs):.2%}, step "
                    f"{statistics.median(widest(o.judged, False) for o in outs):.2%}"
                )


if __name__ == "__main__":
    main(sys.argv[1:] or ["steps32", "steps64:0-7", "procs3"])
