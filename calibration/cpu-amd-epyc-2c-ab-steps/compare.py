"""Per A/A run of the two A/B calibrations in this folder (32 and 64 steps): the widest band
(critical x noise, log) of its phase gates (verify/rest, draft/rest) and of its step gates,
its UNSTABLE and SLOWER gates; per case the median block noise w, the pooled spread between
processes and the median band; and the ratio of the two calibrations' median widest phase
bands.

    cd calibration/cpu-amd-epyc-2c-ab-steps && python compare.py > compare.txt
"""

import glob
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
PHASES = ("verify", "draft")


def main() -> None:
    widest: dict[int, list[float]] = {}
    for steps in (32, 64):
        files = sorted(glob.glob(str(HERE / f"steps{steps}" / "rep*-A_A.json")))
        rows = []
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
                    if m["metric"] in ("verify", "step"):
                        hat2 = m.get("between_hat2") or 0.0
                        per.setdefault((name, m["metric"]), []).append((m["within"], hat2, band))
            rows.append((Path(f).name[:5], phase, step, unstable, slower))
        print(f"== {steps} steps: {len(rows)} A/A runs")
        for rep, phase, step, unstable, slower in rows:
            print(
                f"  {rep}  widest phase {phase:.2%}  step {step:.2%}  "
                f"UNSTABLE {len(unstable)} {' '.join(unstable)}  SLOWER {slower or '-'}"
            )
        if rows:
            widest[steps] = [r[1] for r in rows]
            print(
                f"  median widest phase {statistics.median(r[1] for r in rows):.2%}, step "
                f"{statistics.median(r[2] for r in rows):.2%}; runs with an UNSTABLE case "
                f"{sum(1 for r in rows if r[3])}/{len(rows)}"
            )
        for (name, metric), xs in sorted(per.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            between = math.sqrt(max(statistics.fmean(x[1] for x in xs), 0.0))
            print(
                f"  {name:52s} {metric:6s} w {statistics.median(x[0] for x in xs):.2%}  "
                f"between {between:.2%}  band {statistics.median(x[2] for x in xs):.2%}"
            )
    if widest.get(32) and widest.get(64):
        ratio = statistics.median(widest[64]) / statistics.median(widest[32])
        print(f"median widest phase band, 64 over 32 steps: {ratio:.2f}")


if __name__ == "__main__":
    main()
