"""Per verify=1.05 run of a work dir: each case's verify change and band (t x noise) as
judged, and the run judged again at 4-7% phase tolerance (step 25%) by the rule's own
functions (judging.calibration.judge_run); read-only over the committed reports.

    /work/venv/bin/python power_look.py steps64 > power_look.txt
"""

import glob
import statistics
import sys
from pathlib import Path

from pytest_specperf.cli.calibrate import at_report_share
from pytest_specperf.judging.calibration import judge_run
from pytest_specperf.store.report import read_report

HERE = Path(__file__).parent
TOLS = (0.04, 0.045, 0.05, 0.06, 0.07)


def main(name):
    files = sorted(glob.glob(str(HERE / name / "rep*-verify_1.05.json")))
    caught = {t: 0 for t in TOLS}
    changes = []
    for f in files:
        report = read_report(Path(f))
        cases = at_report_share(report)
        parts = []
        for c in cases:
            for m in c.metrics:
                if m.metric == "verify" and m.critical is not None:
                    changes.append(m.change)
                    parts.append(f"{m.change:+.1%}/{m.critical * m.noise:.1%}")
        outs = {t: judge_run(cases, "verify", t, 0.25) for t in TOLS}
        for t, o in outs.items():
            caught[t] += o.named_right
        got = " ".join(f"{t:.1%}:{'Y' if o.named_right else '-'}" for t, o in outs.items())
        print(f"{Path(f).name[:5]}  {got}   verify change/band per case: {' '.join(parts)}")
    n = len(files)
    print(f"== {name}: {n} verify=1.05 runs; caught and named at " +
          ", ".join(f"{t:.1%} {caught[t]}/{n}" for t in TOLS))
    if changes:
        print(f"   verify change over all cases: median {statistics.median(changes):+.2%}, "
              f"range {min(changes):+.2%} to {max(changes):+.2%} (injected +5.00%)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "steps64")
