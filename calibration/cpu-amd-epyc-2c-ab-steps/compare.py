"""Per A/A run of A/B calibrations in this folder: the widest band (critical x noise, log) of
its phase gates (verify/rest, draft/rest) and of its step gates, its UNSTABLE and SLOWER
gates; per case the median block noise w, the pooled spread between processes and the median
band; the median critical value of the verify/rest gates; and the ratio of the second
calibration's median widest phase band to the first's.

    cd calibration/cpu-amd-epyc-2c-ab-steps
    python compare.py steps32:0-7 steps64 > compare.txt     # the first 7 runs of each
    python compare.py steps32:7 procs3 > compare-procs3.txt  # runs 8 on, beside procs3's

An argument is a work dir, with ``:K-L`` for its runs K+1 to L (``:K``: from K+1 on).
"""

import glob
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
PHASES = ("verify", "draft")


def main(args: list[str]) -> None:
    widest: list[list[float]] = []
    for arg in args or ["steps32", "steps64"]:
        name_, _, span = arg.partition(":")
        first, _, last = span.partition("-")
        files = sorted(glob.glob(str(HERE / name_ / "rep*-A_A.json")))
        files = files[int(first or 0):int(last) if last else None]
        rows = []
        crit: list[float] = []
        per: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for f in files:
            data = json.loads(Path(f).read_text())
            phase = step = 0.0
            unstable, slower = [], []
            for c in data["cases"]:
                name = f"{c['test'].split('::')[-1]} {c['key']}"
                for m in c["metrics"]:
                    if not m.get("ab_sides") or m.get("critical") is None or m.get("noise") is None:
                        continue
                    band = m["critical"] * m["noise"]
                    if m["metric"] in PHASES:
                        phase = max(phase, band)
                    elif m["metric"] == "step":
                        step = max(step, band)
                    short = f"{c['key'].split(' bs')[0]}:{m['metric']}"
                    if m["verdict"] == "UNSTABLE":
                        unstable.append(short)
                    elif m["verdict"] == "SLOWER":
                        slower.append(short)
                    if m["metric"] == "verify":
                        crit.append(m["critical"])
                    if m["metric"] in ("verify", "step"):
                        hat2 = m.get("between_hat2") or 0.0
                        per.setdefault((name, m["metric"]), []).append((m["within"], hat2, band))
            rows.append((Path(f).name[:5], phase, step, unstable, slower))
        print(f"== {arg}: {len(rows)} A/A runs")
        for rep, phase, step, unstable, slower in rows:
            print(
                f"  {rep}  widest phase {phase:.2%}  step {step:.2%}  "
                f"UNSTABLE {len(unstable)} {' '.join(unstable)}  SLOWER {slower or '-'}"
            )
        if rows:
            widest.append([r[1] for r in rows])
            print(
                f"  median widest phase {statistics.median(r[1] for r in rows):.2%}, step "
                f"{statistics.median(r[2] for r in rows):.2%}; runs with an UNSTABLE case "
                f"{sum(1 for r in rows if r[3])}/{len(rows)}; verify/rest critical value "
                f"median {statistics.median(crit):.2f}"
            )
        for (name, metric), xs in sorted(per.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            between = math.sqrt(max(statistics.fmean(x[1] for x in xs), 0.0))
            print(
                f"  {name:52s} {metric:6s} w {statistics.median(x[0] for x in xs):.2%}  "
                f"between {between:.2%}  band {statistics.median(x[2] for x in xs):.2%}"
            )
    if len(widest) == 2 and all(widest):
        ratio = statistics.median(widest[1]) / statistics.median(widest[0])
        print(f"median widest phase band, the second over the first: {ratio:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
