"""The fragmented cases' spread between server processes with and without huge pages, from
this folder's A/B A/A reports, or another look's folder given as the argument (thp1:
THP_MEM_ALLOC_ENABLE=1, thp0: unset to 0; 2 processes a side, so each run's ``between_hat2``
rests on 2 degrees of freedom; pooled by their mean).

    python calibration/cpu-intel-xeon-2c-thp-look/spread.py
    python calibration/cpu-intel-xeon-2c-thp-look/spread.py calibration/cpu-amd-epyc-2c-thp-look
"""

import glob
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent

for v in ("1", "0"):
    per: dict[tuple[str, str], list[tuple[float, float, float, str]]] = {}
    files = sorted(glob.glob(str(HERE / f"thp{v}" / "*.json")))
    for f in files:
        for c in json.loads(Path(f).read_text())["cases"]:
            for m in c["metrics"]:
                if m["metric"] in ("verify", "step") and m.get("between_hat2") is not None:
                    per.setdefault((c["key"], m["metric"]), []).append(
                        (m["between_hat2"], m["within"], m["change"], m["verdict"])
                    )
    print(f"THP_MEM_ALLOC_ENABLE={v}: {len(files)} A/A runs")
    for (key, metric), xs in sorted(per.items()):
        tau = math.sqrt(max(statistics.fmean(x[0] for x in xs), 0.0))
        w = statistics.median(x[1] for x in xs)
        changes = " ".join(f"{x[2]:+.1%}" for x in xs)
        unstable = sum(x[3] == "UNSTABLE" for x in xs)
        print(
            f"  {key:30} {metric:6} between {tau:6.2%} ({2 * len(xs)} df)  within {w:.2%}  "
            f"UNSTABLE {unstable}/{len(xs)}  changes {changes}"
        )
