"""A device prior measured from A/B runs: the quiet A/A runs of an A/B calibration, each run
a sitting of its own and its tested side's server processes that sitting's runs, pooled as
`specperf calibrate --write-prior` pools a stored calibration's (calibrate_sittings.device_prior).

    python ab_prior.py AB_WORK_DIR OUT_DIR     # writes OUT_DIR/<slug>.prior.yaml
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_specperf.cli.calibrate_sittings import (
    Runs,
    add_report_runs,
    device_prior,
    prior_spread,
)
from pytest_specperf.store.prior import write_prior


def ab_cases(work_dir: Path) -> tuple[dict[str, Runs], str, int]:
    """Each quiet A/A run's processes as a sitting of its own (``add_report_runs``)."""
    cases: dict[str, Runs] = {}
    files = sorted(work_dir.glob("rep*-A_A.json"))
    slug = ""
    for f in files:
        data = json.loads(f.read_text())
        slug = data["device"]["slug"]
        for c in data["cases"]:
            cases.setdefault(f"{c['test']} {c['key']}", [])
        add_report_runs(cases, data, f.name.split("-")[0])
    return cases, slug, len(files)


def main() -> None:
    work_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    cases, slug, n = ab_cases(work_dir)
    source = f"A/B A/A runs, {work_dir.name}: {n} runs x 2 tested processes, {len(cases)} cases"
    prior = device_prior(cases, source)
    out.mkdir(parents=True, exist_ok=True)
    path = write_prior(out / f"{slug}.yaml", prior)
    print(f"{path}: {source}")
    for kind in ("phase", "step"):
        lv = prior.of(kind)
        print(
            f"  {kind}: between {100 * lv.between:.2f}% ({lv.between_df:g} df), "
            f"sitting {100 * lv.sitting:.2f}% ({lv.sitting_df:g} df)"
        )
    print("  worth for one case:", json.dumps(prior_spread(cases, prior)))


if __name__ == "__main__":
    main()
