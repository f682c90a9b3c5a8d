"""Per run, per fragmented case: the between-process sd of ``verify/rest`` and
``draft/rest`` that the run measured from its own 2 + 2 processes (``between_hat2``, no
history), and pooled over each build's runs (the mean of the variances; 2 df a run).

python tau.py
"""

import glob
import json
import math
import os
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
pooled: dict[tuple[str, str, str], list[float]] = defaultdict(list)
for f in sorted(glob.glob(os.path.join(HERE, "*.json"))):
    tag = os.path.basename(f)[:-5]
    with open(f) as fh:
        d = json.load(fh)
    cells = []
    for c in d["cases"]:
        ctx = c["nodeid"].split("ctx=")[1].rstrip("]")
        for m in c["metrics"]:
            if m["metric"] in ("verify", "draft") and m.get("between_hat2") is not None:
                pooled[(tag[:3], ctx, m["metric"])].append(m["between_hat2"])
                cells.append(f"{ctx} {m['metric']} {100 * math.sqrt(m['between_hat2']):.2f}%")
    print(tag.ljust(5), "  ".join(cells))
print("pooled (sd from the mean variance):")
for (build, ctx, metric), v in sorted(pooled.items()):
    print(f"  {build} {ctx:>6} {metric:<6} {100 * math.sqrt(sum(v) / len(v)):.2f}% ({len(v)} runs)")
