"""A run's wall time against the machine's speed at the time: each run's suite time
divided by the sum of its 7 cases' median step times (ms), so that the two builds can be
compared on a shared box whose speed drifts (the steps of the same build ran 31-45 ms at
32768 contiguous over the two series). Old build: the 64-step series' 40 runs (``3d652e5``);
new: this series' runs (``41dbe26``), and the one run of ``final/aa1``.

python time_per_step.py
"""

import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
CAL = os.path.dirname(HERE)


def runs(pattern: str) -> list[tuple[str, float, float]]:
    out = []
    for f in sorted(glob.glob(pattern)):
        rc = f[:-5] + ".rc"
        with open(f) as fh:
            d = json.load(fh)
        if os.path.exists(rc):
            with open(rc) as fh:
                wall = float(fh.read().split()[1])
        else:
            wall = sum(c["wall_s"] for c in d["cases"])  # cases only: no server start
        steps = sum(c["step_ms"]["median"] for c in d["cases"])
        out.append((os.path.basename(f)[:-5], wall, steps))
    return out


def show(name: str, rs: list[tuple[str, float, float]]) -> None:
    if not rs:
        return
    ratio = [w / s for _, w, s in rs]
    walls = [w for _, w, _ in rs]
    steps = [s for _, _, s in rs]
    print(
        f"{name:<34} runs {len(rs):>2}  wall {statistics.median(walls):5.0f} s "
        f"({min(walls):.0f}-{max(walls):.0f})  sum of step medians "
        f"{statistics.median(steps):5.0f} ms ({min(steps):.0f}-{max(steps):.0f})  "
        f"s per ms {statistics.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f})"
    )


old = os.path.join(CAL, "cpu-intel-xeon-2c-ab-thp-64")
show("old build, A/A", runs(os.path.join(old, "rep*-A_A.json")))
show("old build, verify=1.05", runs(os.path.join(old, "rep*-verify_1.05.json")))
show("new build, A/A (this series)", runs(os.path.join(HERE, "rep*-A_A.json")))
show("new build, all=1.10 (this series)", runs(os.path.join(HERE, "rep*-all_1.10.json")))
show("new build, first run (baseline)", runs(os.path.join(HERE, "baseline.json")))
fs = os.path.join(CAL, "cpu-intel-xeon-2c-fill-split", "final", "aa1.json")
show("new build, final/aa1 (cases only)", runs(fs))
