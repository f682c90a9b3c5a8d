"""The tested side's two processes in ``ctx=32768 kv=fragmented`` (the case whose
between-process sd widened): |log ratio| of their median ``verify/rest`` and ``draft/rest``
blocks, for every A/A report of the old build's 20 rounds, this series and the same-day
control (``same-day/*.json``).

python frag_spread.py
"""

import glob
import json
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
CAL = os.path.dirname(HERE)
CASE = "kv=fragmented-ctx=32768"


def spreads(f: str) -> tuple[float, float] | None:
    with open(f) as fh:
        d = json.load(fh)
    for c in d["cases"]:
        if CASE in c["nodeid"]:
            out = []
            for form in ("verify/rest", "draft/rest"):
                a, b = (statistics.median(r["blocks"][form]) for r in c["runs"][:2])
                out.append(abs(math.log(a / b)))
            return out[0], out[1]
    return None


for label, pat in (
    ("old build (3d652e5), 20 rounds",
     os.path.join(CAL, "cpu-intel-xeon-2c-ab-thp-64", "rep*-A_A.json")),
    ("new build (41dbe26), this series", os.path.join(HERE, "rep*-A_A.json")),
    ("same-day control", os.path.join(HERE, "same-day", "*.json")),
):
    rows = [(os.path.basename(f)[:-5], spreads(f)) for f in sorted(glob.glob(pat))]
    rows = [(n, s) for n, s in rows if s is not None]
    if not rows:
        continue
    v = [s[0] for _, s in rows]
    print(f"{label}: verify/rest pair median {100 * statistics.median(v):.1f}%, "
          f"largest {100 * max(v):.1f}% ({len(v)} runs)")
    print("   " + "  ".join(f"{n} {100 * s[0]:.1f}/{100 * s[1]:.1f}" for n, s in rows))
