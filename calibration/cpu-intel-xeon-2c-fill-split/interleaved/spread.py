"""Per fragmented case: the paired A/B log differences of step and verify (pairs A1 B1 and
B2 A2), and the two tested processes' step/ref and verify/rest spread (max/min - 1). A
process split shows as a pair far from 0 (the 64-step series' 20 A/A runs: within 8.9%).

python spread.py [GLOB]    # default: the JSON reports beside this script
"""

import glob
import json
import os
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.json")


def pct(x: float) -> str:
    return f"{100 * x:+5.1f}"


def spread(xs: list[float]) -> str:
    return f"{100 * (max(xs) / min(xs) - 1):4.1f}%"


for f in sorted(glob.glob(sys.argv[1] if len(sys.argv) > 1 else HERE)):
    with open(f) as fh:
        d = json.load(fh)
    out = []
    for c in d["cases"]:
        if "fragmented" not in c["nodeid"]:
            continue
        ctx = c["nodeid"].split("ctx=")[1].rstrip("]")
        p = c["ab"]["pairs"]
        sr = [r["values"]["step/ref"] for r in c["runs"]]
        vr = [r["values"]["verify/rest"] for r in c["runs"]]
        out.append(
            f"{ctx:>6}: pairs step {pct(p['step'][0])} {pct(p['step'][1])}%, verify "
            f"{pct(p['verify'][0])} {pct(p['verify'][1])}%; spread step/ref {spread(sr)}, "
            f"verify/rest {spread(vr)}"
        )
    print(os.path.basename(f)[:-5].ljust(10), " | ".join(out))
