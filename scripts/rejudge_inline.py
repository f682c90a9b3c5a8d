#!/usr/bin/env python
"""Re-judge a finished calibration against baselines made of its own quiet A/A runs.

    python scripts/rejudge_inline.py WORK_DIR [--k 3 5 8]

``specperf calibrate`` judges every run against the baseline it recorded first (in
``--processes`` server processes, before the repetitions). This script asks what the
same runs would give against a baseline recorded *inline*: the first K quiet A/A runs of
the calibration (one server process each, interleaved with the other conditions), judged
by the plugin's own rule (``judging.verdict.judge_runs``, every gate the run was judged
on, each at its share of the run's false-alarm budget; Holm's later steps are not
applied, so it can only count fewer SLOWER than the plugin). Every condition's
repetitions K and later are judged, so all columns cover the same rounds. The
disturbance check (run-queue share) is not applied here, so a run with the CPU hog
can only count more false alarms than the plugin would raise.

It prints first how far the recorded baseline sits from the quiet A/A runs (the offset
a judged run inherits whatever its own noise), then the counts per K and tolerance pair.

    python scripts/rejudge_inline.py SITTING_DIR --recorded [--prior-dir DIR]

judges every repetition against the sitting's recorded baseline instead (every stored run,
with its sitting), under the device prior beside the baseline file in DIR (a
``specperf calibrate --write-prior DIR``; default: the provisional prior): what a prior
measured from these very runs would have given (in-sample: a held-out sitting is the test
of it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_specperf.cli.calibrate import expected_metric
from pytest_specperf.judging.baselines import BaselineFile, make_run
from pytest_specperf.judging.noise import PROVISIONAL_PRIOR, DevicePrior
from pytest_specperf.judging.significance import MAX_LOOKS, Family
from pytest_specperf.judging.stats import Summary
from pytest_specperf.judging.verdict import Runs, Tolerances, Verdict, judge_runs
from pytest_specperf.store.baselines import load_baselines
from pytest_specperf.store.prior import load_prior

Run = Mapping[str, Summary]
#: condition -> repetition -> test and case key -> (its run's summaries, the gates it was
#: judged on, the look it was judged at)
Table = dict[str, dict[int, dict[str, tuple[Run, list[str], int]]]]
PAIRS = ((0.03, 0.10), (0.04, 0.10), (0.05, 0.15), (0.07, 0.25))
FORMS = ("verify/rest", "draft/rest", "step/ref")
Values = dict[str, dict[int, Mapping[str, float]]]


def look_of(case: Mapping[str, object]) -> int:
    """The look a reported case was judged at: its first run's rounds (the automatic
    extension's counter), clamped to ``MAX_LOOKS``; 1 when the report lacks them."""
    runs = case.get("runs")
    first = runs[0] if isinstance(runs, list) and runs else None
    r = first.get("rounds") if isinstance(first, Mapping) else None
    rounds = r if isinstance(r, int) and not isinstance(r, bool) else 1
    return min(max(1, rounds), MAX_LOOKS)


def read_runs(work_dir: Path) -> tuple[Table, Values, dict[str, str]]:
    """Every repetition's runs, the quiet A/A runs' values, and per injected condition
    the gate it must fail on to count as caught (``calibrate.expected_metric``)."""
    runs: Table = defaultdict(dict)
    values: Values = defaultdict(dict)
    expect: dict[str, str] = {}
    for f in sorted(work_dir.glob("rep*-*.json")):
        rep_tag, cond = f.stem.split("-", 1)
        rep = int(rep_tag[3:])
        for c in json.loads(f.read_text())["cases"]:
            r = c["runs"][0]
            name = f"{c['test'].rsplit('::', 1)[-1]} {c['key']}"
            summaries = make_run("", None, r["values"], r["blocks"]).summaries(r["steps"])
            gates = [m["metric"] for m in c["metrics"]]
            runs[cond].setdefault(rep, {})[name] = (summaries, gates, look_of(c))
            if cond == "A_A":
                values[name][rep] = r["values"]
            inject = (c.get("labels") or {}).get("inject")
            if inject:
                expect[cond] = expected_metric(inject)
    return runs, values, expect


def offsets(work_dir: Path, aa: Values) -> None:
    (path,) = (work_dir / "baselines").glob("*.yaml")
    bf = load_baselines(path)
    assert bf is not None
    print("recorded baseline against the quiet A/A runs (one process each)")
    print(
        f"{'case':51} {'form':12} {'baseline runs':26} {'A/A median':>10} {'A/A sd':>7} "
        f"{'offset':>7}"
    )
    for cb in sorted(bf.all_cases(), key=lambda c: (c.test, c.key)):
        name = f"{cb.test.rsplit('::', 1)[-1]} {cb.key}"
        if name not in aa:
            continue
        for form in FORMS:
            base = [r.values[form] for r in cb.runs if form in r.values]
            now = [v[form] for v in aa[name].values() if form in v]
            if not base or len(now) < 2:
                continue
            mid = statistics.median(now)
            print(
                f"{name:51} {form:12} {' '.join(f'{x:.4f}' for x in base):26} "
                f"{mid:10.4f} {statistics.stdev(now) / mid:7.2%} "
                f"{statistics.mean(base) / mid - 1:+7.2%}"
            )


#: how a repetition's case is judged: (rep, case name, its run, its gates, its level) ->
#: its gates' verdicts
CaseJudge = Callable[[int, str, Run, list[str], float], list[tuple[str, Verdict]]]


def _count(
    runs: Table, cond: str, expect: str | None, first_rep: int, judge_case: CaseJudge
) -> tuple[int, int, int, int]:
    """Runs judged (repetitions ``first_rep`` and later), runs with a SLOWER gate, runs
    failing on the expected gate, runs with an UNSTABLE gate. Each case at the plugin's
    budget: the run's cases as its tests, the extension's looks (each case at the look its
    rounds reached), each case's gates."""
    n = slower = caught = unstable = 0
    for rep, cases in sorted(runs[cond].items()):
        if rep < first_rep:
            continue
        verdicts: list[tuple[str, Verdict]] = []
        family = Family(tests=max(1, len(cases)), looks=MAX_LOOKS)
        for key, (now, gates, look) in cases.items():
            alpha = dataclasses.replace(family, look=look).gate_alpha(len(gates))
            verdicts += judge_case(rep, key, now, gates, alpha)
        n += 1
        slower += any(v is Verdict.SLOWER for _, v in verdicts)
        caught += any(v is Verdict.SLOWER and m == expect for m, v in verdicts)
        unstable += any(v is Verdict.UNSTABLE for _, v in verdicts)
    return n, slower, caught, unstable


def _verdicts(
    gates: list[str], judged: Runs, tol: Tolerances, alpha: float, prior: DevicePrior
) -> list[tuple[str, Verdict]]:
    out = []
    for m in gates:
        mv = judge_runs(m, judged, tol, prior=prior, alpha=alpha)
        if mv is not None:
            out.append((m, mv.verdict))
    return out


def judge(
    runs: Table, cond: str, expect: str | None, k: int, tol: Tolerances
) -> tuple[int, int, int, int]:
    """``_count`` against the first ``k`` quiet A/A runs, each a sitting of its own."""
    aa = runs["A_A"]
    first = sorted(aa)[:k]
    sittings = tuple(f"A/A rep {i}" for i in first)

    def judge_case(rep: int, key: str, now: Run, gates: list[str], alpha: float
                   ) -> list[tuple[str, Verdict]]:  # fmt: skip
        base = tuple(aa[i][key][0] for i in first)
        return _verdicts(gates, Runs(base, (now,), base_sittings=sittings), tol, alpha,
                         PROVISIONAL_PRIOR)  # fmt: skip

    return _count(runs, cond, expect, k, judge_case)


def judge_recorded(
    runs: Table, cond: str, expect: str | None, bf: BaselineFile, prior: DevicePrior,
    tol: Tolerances,
) -> tuple[int, int, int, int]:  # fmt: skip
    """``_count`` against the recorded baseline's runs (their sittings kept; each
    repetition a sitting of its own) under ``prior``."""
    base = {f"{c.test.rsplit('::', 1)[-1]} {c.key}": c for c in bf.all_cases()}

    def judge_case(rep: int, key: str, now: Run, gates: list[str], alpha: float
                   ) -> list[tuple[str, Verdict]]:  # fmt: skip
        cb = base.get(key)
        if cb is None:
            return []
        stored = tuple(cb.run_metrics(i) for i in range(len(cb.runs)))
        judged = Runs(stored, (now,), base_sittings=tuple(r.sitting_label for r in cb.runs),
                      now_sittings=(f"rep {rep}",))  # fmt: skip
        return _verdicts(gates, judged, tol, alpha, prior)

    return _count(runs, cond, expect, 0, judge_case)


def recorded(work_dir: Path, runs: Table, expect: dict[str, str], prior_dir: Path | None) -> None:
    (path,) = (work_dir / "baselines").glob("*.yaml")
    bf = load_baselines(path)
    assert bf is not None
    prior = load_prior(prior_dir / path.name) if prior_dir is not None else PROVISIONAL_PRIOR
    print(f"\nevery repetition against the recorded baseline ({path.name}), under "
          f"{prior.describe()}")  # fmt: skip
    conds = sorted(runs, key=lambda c: (c in expect, c))
    print("phases  step  " + "  ".join(f"{c:>14}" for c in conds))
    for phase, step in PAIRS:
        tol, cells = Tolerances(phase, step), []
        for c in conds:
            n, slower, caught, unstable = judge_recorded(runs, c, expect.get(c), bf, prior, tol)
            cell = f"{caught}/{n}" if c in expect else f"{slower}/{n} F {unstable}/{n} U"
            cells.append(f"{cell:>14}")
        print(f"{phase:>6.0%} {step:>5.0%}  " + "  ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5, 8])
    ap.add_argument("--recorded", action="store_true",
                    help="judge against the recorded baseline instead of inline ones")  # fmt: skip
    ap.add_argument("--prior-dir", type=Path, default=None,
                    help="with --recorded: the prior beside the baseline in DIR")  # fmt: skip
    args = ap.parse_args()
    runs, aa_values, expect = read_runs(args.work_dir)
    if args.recorded:
        recorded(args.work_dir, runs, expect, args.prior_dir)
        return
    offsets(args.work_dir, aa_values)
    print("\nthe later repetitions judged against the first K quiet A/A runs (A/A and hog:")
    print("runs that fail, F, and with an UNSTABLE gate, U; injected: runs caught on their gate)")
    conds = sorted(runs, key=lambda c: (c in expect, c))
    print("K   phases  step  " + "  ".join(f"{c:>14}" for c in conds))
    for k in args.k:
        for phase, step in PAIRS:
            tol, cells = Tolerances(phase, step), []
            for c in conds:
                n, slower, caught, unstable = judge(runs, c, expect.get(c), k, tol)
                cell = f"{caught}/{n}" if c in expect else f"{slower}/{n} F {unstable}/{n} U"
                cells.append(f"{cell:>14}")
            print(f"{k:<3} {phase:>6.0%} {step:>5.0%}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
