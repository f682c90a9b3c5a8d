"""The stored sitting at 64 steps against its prediction (docs/calibration.md, "Stored mode
on the Zen 4 box at 64 steps"): per case the phase gate's paired block noise `w` (predicted
0.61-1.02%), the baseline's process estimate, the band, and the verdicts of the A/A and the
verify +10% runs, from the committed reports alone.

    python look.py sitting-1 > look.txt
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1])
    rows: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    runs: dict[str, list[tuple[str, int, list[str], list[str]]]] = defaultdict(list)
    for f in sorted(root.glob("rep*-*.json")):
        cond = f.stem.split("-", 1)[1]
        data = json.loads(f.read_text())
        unstable, failed = [], []
        for c in data["cases"]:
            for m in c.get("metrics", []):
                key = (cond, c["key"])
                if m["metric"] == "verify":  # the mirrored phase gate (draft mirrors it)
                    rows[key]["w"].append(100 * (m.get("within") or math.nan))
                    rows[key]["tau_hat"].append(100 * math.sqrt(m.get("between_hat2") or 0.0))
                    rows[key]["band"].append(100 * m["noise"] * m["critical"])
                    rows[key]["change"].append(100 * m["change"])
                if m["verdict"] == "UNSTABLE":
                    unstable.append(f"{c['key'].split(' bs')[0]} {m['metric']}")
                if m["verdict"] == "SLOWER":
                    failed.append(f"{c['key'].split(' bs')[0]} {m['metric']}")
        rc_file = f.with_suffix(".rc")
        rc = int(rc_file.read_text().split()[0]) if rc_file.exists() else -1
        runs[cond].append((f.stem.split("-")[0], rc, failed, unstable))
    for cond, rs in sorted(runs.items()):
        print(f"== {cond}: {len(rs)} runs")
        for rep, rc, failed, unstable in rs:
            slower, undecided = ", ".join(failed) or "-", ", ".join(unstable) or "-"
            print(f"  {rep} exit {rc}  SLOWER: {slower}  UNSTABLE: {undecided}")
    print("\n== verify/rest gate per case (median over the runs of each condition)")
    head = ("condition", "case", "w %", "tau_hat %", "band %", "change %")
    print(f"{head[0]:12s} {head[1]:28s} {head[2]:>6s} {head[3]:>9s} {head[4]:>7s} "
          f"{head[5]:>9s}  changes")
    for (cond, case), v in sorted(rows.items()):
        med = {k: statistics.median(x) for k, x in v.items()}
        changes = " ".join(f"{x:+.1f}" for x in v["change"])
        print(f"{cond:12s} {case:28s} {med['w']:6.2f} {med['tau_hat']:9.2f} {med['band']:7.2f} "
              f"{med['change']:+9.2f}  {changes}")


if __name__ == "__main__":
    main()
