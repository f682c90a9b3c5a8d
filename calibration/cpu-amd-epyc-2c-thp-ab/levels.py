"""The noise at each level of A/B A/A runs, per work dir: each pytest run a sitting of its
own, its tested side's server processes that sitting's runs (the nested ANOVA of
judging/levels.py, as `specperf calibrate` pools a stored calibration's levels).

    python levels.py DIR [DIR...]      # e.g. thp1 thp0 ../cpu-intel-xeon-2c-ab-thp
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from pytest_specperf.cli.calibrate_sittings import Runs, add_report_runs
from pytest_specperf.judging.levels import case_estimate, form_levels

FORMS = ("verify/rest", "step/ref")


def pct(v: float | None) -> str:
    return "     -" if v is None else f"{100 * v:5.2f}%"


def main() -> None:
    for d in map(Path, sys.argv[1:]):
        # the first A/A run of an A/B calibration (its stand-in for a baseline) is one too
        files = sorted([*d.glob("baseline.json"), *d.glob("rep*-A_A.json")])
        cases: dict[str, Runs] = {}
        step_ms: dict[str, list[float]] = {}
        unstable = 0
        for f in files:
            data = json.loads(f.read_text())
            unstable += any(c["verdict"] == "UNSTABLE" for c in data["cases"])
            for c in data["cases"]:
                name = f"{c['test']} {c['key']}"
                step_ms.setdefault(name, []).append(c["step_ms"]["median"])
                cases.setdefault(name, [])
            add_report_runs(cases, data, f.name.split("-")[0])  # each run a sitting
        print(f"{d}: {len(files)} A/A runs, {unstable} with an UNSTABLE case")
        groups = {
            "all": cases,
            "fragmented": {n: r for n, r in cases.items() if "fragmented" in n},
            "contiguous": {n: r for n, r in cases.items() if "fragmented" not in n},
        }
        for group, subset in groups.items():
            for fl in form_levels(subset, FORMS):
                b, t, s = fl.sds
                print(
                    f"  {fl.form:11s} pooled, {group:10s} ({fl.cases})  block {pct(b)} "
                    f"({fl.block_df})  process {pct(t)} ({fl.between_df})  "
                    f"run-to-run {pct(s)} ({fl.sitting_df})"
                )
        for form in FORMS:
            for name, runs in sorted(cases.items()):
                have = [(s, bl[form]) for s, bl in runs if bl.get(form)]
                est = case_estimate(have, len(have[0][1])) if len(have) >= 2 else None
                if est is None:
                    continue
                tau2 = est.between_hat2 or 0.0
                sit = est.sitting_hat2(tau2)
                short = name.split("::")[-1]
                print(
                    f"    {form:11s} {short:50s} process {pct(math.sqrt(tau2))}  "
                    f"run-to-run {pct(None if sit is None else math.sqrt(sit))}  "
                    f"step {statistics.median(step_ms[name]):6.1f} ms"
                )


if __name__ == "__main__":
    main()
