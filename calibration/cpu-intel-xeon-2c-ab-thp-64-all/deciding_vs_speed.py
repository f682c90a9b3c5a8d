"""Each A/A run's least deciding phase tolerance (largest |log change| + t x noise over its
verify and draft gates, the gate named) beside the machine's speed in that run (the sum of
the 7 cases' median step times), for the old build's 20 rounds and this series: is a wider
band a slower box, or the build?

python deciding_vs_speed.py
"""

import glob
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CAL = os.path.dirname(HERE)


def run(f: str) -> tuple[float, float, str]:
    with open(f) as fh:
        d = json.load(fh)
    worst, name = 0.0, ""
    for c in d["cases"]:
        for m in c["metrics"]:
            if m["metric"] in ("verify", "draft") and m.get("noise") and m.get("critical"):
                v = abs(math.log1p(m["change"])) + m["critical"] * m["noise"]
                if v > worst:
                    worst, name = v, f"{m['metric']} {c['nodeid'].split('[')[1].rstrip(']')}"
    steps = sum(c["step_ms"]["median"] for c in d["cases"])
    return math.expm1(worst), steps, name


for label, pat in (
    ("old build (3d652e5), 20 rounds",
     os.path.join(CAL, "cpu-intel-xeon-2c-ab-thp-64", "rep*-A_A.json")),
    ("new build (41dbe26), this series", os.path.join(HERE, "rep*-A_A.json")),
):
    print(label)
    rows = sorted((*run(f), os.path.basename(f)[:5]) for f in glob.glob(pat))
    for tol, steps, name, rep in sorted(rows, key=lambda r: r[1]):
        print(f"  {rep}  step medians {steps:5.0f} ms  "
              f"least deciding phase tolerance {100 * tol:4.1f}%  ({name})")
