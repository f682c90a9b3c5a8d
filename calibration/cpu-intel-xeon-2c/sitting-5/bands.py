"""Per case, the median band (critical x noise, log units) of verify and step over a
sitting's A/A reports, the runs UNSTABLE per gate, and the verify+10% detections."""
import glob
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

d = sys.argv[1]
bands = defaultdict(list)
unstable = defaultdict(int)
verdicts = defaultdict(lambda: defaultdict(int))
runs = 0
for f in sorted(glob.glob(f"{d}/rep*-A_A.json")):
    runs += 1
    for c in json.loads(Path(f).read_text())["cases"]:
        key = c["test"].split("::")[-1] + " " + c["key"].replace(" bs=1", "")
        for m in c["metrics"]:
            if m["metric"] not in ("verify", "step", "draft"):
                continue
            g = (key, m["metric"])
            if m.get("noise") and m.get("critical"):
                bands[g].append(m["critical"] * m["noise"])
            verdicts[g][m["verdict"]] += 1
print(f"{runs} A/A runs")
print(f"{'case':52s} {'gate':7s} {'band med':>8s} {'min':>6s} {'max':>6s}  verdicts")
for g in sorted(bands):
    b = bands[g]
    print(f"{g[0]:52s} {g[1]:7s} {statistics.median(b):8.1%} {min(b):6.1%} {max(b):6.1%}  "
          + ", ".join(f"{k} {v}" for k, v in sorted(verdicts[g].items())))
det: defaultdict[int, int] = defaultdict(int)
vr = 0
for f in sorted(glob.glob(f"{d}/rep*-verify_1.10.json")):
    vr += 1
    n = 0
    for c in json.loads(Path(f).read_text())["cases"]:
        for m in c["metrics"]:
            if m["metric"] == "verify" and m["verdict"] == "SLOWER":
                n += 1
    det[n] += 1
print(f"verify+10% runs {vr}: cases caught per run {dict(sorted(det.items()))}")
