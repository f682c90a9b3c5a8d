"""A calibration spread over sittings, resumable from what a repository can hold.

``specperf calibrate --work-dir calibration/<slug> --sitting K`` is sitting ``K`` of one
calibration: its baseline is sitting ``K-1``'s baseline file with this sitting's runs
added (``--specperf-update-baselines``, every run kept), so sitting ``K`` judges its
repetitions against a baseline of ``K`` sittings, and the last sitting's file holds them
all. The layout, every file small enough to commit::

    calibration/<slug>/
      sitting-1/baselines/<slug>.yaml    the baseline as sitting 1 left it
      sitting-1/baseline.json            the recording run's report, compacted
      sitting-1/conditions.json          the sitting's conditions
      sitting-1/rep00-A_A.json, .rc      each finished repetition: compacted report, exit
      sitting-1/raw/                     full reports and logs (.gitignore'd)
      sitting-2/...

A compacted report is the run's report without its per-step samples, diagnostics and
summaries' block centers (``DROPPED_CASE_KEYS``, ``SUMMARY_KEYS``): what judging (the
metric verdicts), the levels (each process's judged forms' blocks, ``runs``) and the
summary read; about 2-3 KB per case, which git stores zlib-compressed. The summary over
every sitting (``summarize_sittings``) is recomputed from those files alone
(``specperf calibrate --work-dir calibration/<slug> --summarize``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specperf.judging.calibration import Condition
from pytest_specperf.judging.levels import (
    DEFAULT_GATE_ALPHA,
    Costs,
    case_estimate,
    form_levels,
    plan,
)
from pytest_specperf.judging.metrics import STEP, STEP_PER_REF, rest_form, spec
from pytest_specperf.judging.noise import (
    PRIOR_KINDS,
    PROVISIONAL_PRIOR,
    DevicePrior,
    LevelEstimate,
    level_spread_df,
    measured_prior,
    pooled_df,
)
from pytest_specperf.probe.phases import DRAFT, VERIFY
from pytest_specperf.reporting.table import render_table

if TYPE_CHECKING:
    from pytest_specperf.store.report import Report

#: Judged forms whose levels the calibration measures (those a case has).
LEVEL_FORMS = ("verify/rest", "draft/rest", "step/ref")
#: Per prior kind, the forms that measure it, first found per case (``verify/rest`` and
#: ``draft/rest`` mirror each other on the reference engine: one of them per case).
PRIOR_FORMS = {"phase": ("verify/rest", "draft/rest"), "step": ("step/ref",)}
#: Per-case parts of a report a calibration does not read back (per-step samples and
#: diagnostics; ``siblings``: the other server processes' steps; ``records``: the probe's
#: step records, 60 KB a case): dropped from the committed copy.
DROPPED_CASE_KEYS = (
    "samples", "activity", "kernels", "telemetry", "cross_check", "graphs", "bottleneck",
    "siblings", "records",
)  # fmt: skip
#: Summaries whose block centers are dropped too (the stored ``runs`` keep the judged
#: forms' blocks, and the metric verdicts keep what judging reads).
SUMMARY_KEYS = ("step_ms", "accept_len", "tokens_per_s", "device_step_ms")
SUMMARY_GROUPS = ("phases", "device_phases")
SITTING_DIR = re.compile(r"sitting-(\d+)")
REP_FILE = re.compile(r"rep(\d+)-(.+)\.json")
RAW = "raw"
AA = "A/A"
#: The judged metrics whose sitting offsets the summary checks, and the form each judges.
OFFSET_FORMS = {VERIFY: rest_form(VERIFY), DRAFT: rest_form(DRAFT), STEP: STEP_PER_REF}
#: An offsets ratio above this says the sitting term understates the machine: about the
#: 95th percentile of ``sqrt(chi2_k / k)`` for the 6-7 cases of the default suite (1.45 at
#: k = 6, 1.41 at 7), were the cases' offsets independent draws of the term.
OFFSET_RATIO_LIMIT = 1.5


def sitting_dir(root: Path, k: int) -> Path:
    return root / f"sitting-{k}"


def sitting_dirs(root: Path) -> list[tuple[int, Path]]:
    """The sittings under ``root``, in order."""
    out = []
    for p in root.iterdir() if root.is_dir() else ():
        m = SITTING_DIR.fullmatch(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def prepare_sitting(root: Path, k: int, baselines: Path) -> None:
    """Before recording sitting ``k``: ``baselines`` becomes sitting ``k-1``'s baseline
    (empty for the first), so the recording adds this sitting's runs to it.
    ``SystemExit`` when sitting ``k-1`` was never recorded."""
    if baselines.exists():
        shutil.rmtree(baselines)
    if k == 1:
        return
    prev = sitting_dir(root, k - 1) / "baselines"
    if not (sitting_dir(root, k - 1) / "baseline.json").is_file() or not prev.is_dir():
        raise SystemExit(
            f"--sitting {k}: sitting {k - 1} has no recorded baseline in {prev.parent}; "
            f"run --sitting {k - 1} first (sittings add to each other's baseline in order)"
        )
    shutil.copytree(prev, baselines, ignore=shutil.ignore_patterns("*.lock", "*.prior.yaml"))


def compact_report(raw: Path, out: Path) -> int:
    """Write ``raw``'s report to ``out`` without ``DROPPED_CASE_KEYS`` (compact JSON);
    its size in bytes."""
    data = json.loads(raw.read_text(encoding="utf-8"))
    for case in data.get("cases") or ():
        if isinstance(case, dict):
            for key in DROPPED_CASE_KEYS:
                case.pop(key, None)
            summaries = [case.get(k) for k in SUMMARY_KEYS]
            for group in SUMMARY_GROUPS:
                g = case.get(group)
                summaries += list(g.values()) if isinstance(g, dict) else []
            for summary in summaries:
                if isinstance(summary, dict):
                    summary.pop("blocks", None)
    text = json.dumps(data, separators=(",", ":"), allow_nan=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return len(text.encode())


def ignore_raw(work: Path) -> None:
    """A ``.gitignore`` that keeps the full reports and logs out of a commit."""
    gi = work / ".gitignore"
    if not gi.exists():
        gi.write_text(f"{RAW}/\n*.lock\n*.tmp\n")


def merge_conditions(per_sitting: Sequence[Sequence[Condition]]) -> list[Condition]:
    """Each condition's runs over every sitting, in the first sitting's order (a host
    stall of another size in another sitting, its own baseline's share, counts as one)."""
    merged: dict[str, Condition] = {}
    for conds in per_sitting:
        for c in conds:
            name = "host_stall" if c.inject and c.inject.startswith("host_stall") else c.name
            m = merged.setdefault(name, Condition(c.name, c.inject, c.hog, c.expect))
            m.runs.extend(c.runs)
    return list(merged.values())


def sitting_rows(
    per_sitting: Sequence[tuple[int, Sequence[Condition], int]],
) -> list[dict[str, Any]]:
    """Per sitting: the baseline's sittings, and per condition runs, failed and UNSTABLE."""
    rows = []
    for k, conds, base_sittings in per_sitting:
        rows.append({
            "sitting": k,
            "baseline_sittings": base_sittings,
            "conditions": {c.name: {"runs": len(c.runs), "failed": c.slower_runs,
                                    "detected": c.detected, "unstable": c.unstable_runs,
                                    "aa": c.expect is None}
                           for c in conds},
        })  # fmt: skip
    return rows


Runs = list[tuple[str, Mapping[str, Sequence[float]]]]


def baseline_runs(baselines: Path) -> dict[str, Runs]:
    """Per case (``test key``), its stored runs as ``(sitting, {form: block centers})``."""
    from pytest_specperf.store.baselines import load_baselines
    from pytest_specperf.store.prior import baseline_files

    out: dict[str, Runs] = {}
    for path in baseline_files(baselines):
        bf = load_baselines(path)
        for case in bf.all_cases() if bf else ():
            runs = out.setdefault(f"{case.test} {case.key}", [])
            runs.extend((r.sitting_label, dict(r.blocks)) for r in case.runs)
    return out


def baseline_sittings(baselines: Path) -> int:
    """The most sittings a case of the baseline files in ``baselines`` holds."""
    from pytest_specperf.store.baselines import load_baselines
    from pytest_specperf.store.prior import baseline_files

    most = 0
    for path in baseline_files(baselines):
        bf = load_baselines(path)
        most = max([most, *(c.sittings for c in (bf.all_cases() if bf else ()))])
    return most


def add_report_runs(cases: dict[str, Runs], report_data: Mapping[str, Any], sitting: str) -> None:
    """A quiet A/A run's processes (its report's ``runs``), as one sitting of its own."""
    for c in report_data.get("cases") or ():
        if not isinstance(c, Mapping) or c.get("recorded"):
            continue
        name = f"{c.get('test')} {c.get('key')}"
        if name not in cases:  # a case without a baseline: no level to add to
            continue
        for r in c.get("runs") or ():
            blocks = r.get("blocks") if isinstance(r, Mapping) else None
            if isinstance(blocks, Mapping):
                cases[name].append((sitting, {m: tuple(b) for m, b in blocks.items()}))


def kind_estimates(cases: Mapping[str, Runs]) -> dict[str, list[LevelEstimate]]:
    """Per prior kind, each case's level estimate of the first of ``PRIOR_FORMS`` it has."""
    out: dict[str, list[LevelEstimate]] = {kind: [] for kind in PRIOR_KINDS}
    for runs in cases.values():
        for kind, forms in PRIOR_FORMS.items():
            for form in forms:
                have = [(s, b[form]) for s, b in runs if b.get(form)]
                if len(have) < 2:
                    continue
                est = case_estimate(have, len(have[0][1]))
                if est is not None:
                    assert spec(form).tolerance == kind
                    out[kind].append(est)
                    break
    return out


def prior_spread(
    cases: Mapping[str, Runs], prior: DevicePrior
) -> dict[str, dict[str, float | None]]:
    """Per prior kind, what the measured ``prior``'s between-process and sitting variances
    are worth as predictors of one case (``noise.level_spread_df`` over the cases' level
    estimates, given the prior's process variance), beside the degrees of freedom their
    device-wide means pool (``between_pooled``, ``sitting_pooled``): the prior carries the
    lesser (``noise.measured_prior``)."""
    out: dict[str, dict[str, float | None]] = {}
    for kind, ests in kind_estimates(cases).items():
        between, sitting = level_spread_df(ests, prior.of(kind).between ** 2)
        tau_df, sit_df = pooled_df(ests)
        out[kind] = {"between": between, "sitting": sitting,
                     "between_pooled": float(tau_df), "sitting_pooled": float(sit_df)}  # fmt: skip
    return out


def device_prior(cases: Mapping[str, Runs], source: str) -> DevicePrior:
    """The device prior the levels measure (``noise.measured_prior``; what they cannot
    measure keeps the provisional value and the prior says provisional)."""
    return measured_prior(kind_estimates(cases), source, fallback=PROVISIONAL_PRIOR)


def levels_json(cases: Mapping[str, Runs], costs: Costs, target: float) -> list[dict[str, Any]]:
    """Per form: its levels (standard deviations and degrees of freedom) and the plan."""
    rows = []
    for lv in form_levels(cases, LEVEL_FORMS):
        block, between, sitting = lv.sds
        p = plan(lv, costs, target)
        rows.append({
            "form": lv.form, "cases": lv.cases, "blocks": lv.blocks,
            "block_sd": block, "block_df": lv.block_df,
            "between_sd": between, "between_df": lv.between_df,
            "sitting_sd": sitting, "sitting_df": lv.sitting_df,
            "blocks_per_process": p.blocks_per_process,
            "processes_per_sitting": p.processes_per_sitting,
            "floor": p.floor, "baseline_sittings_for_target": p.sittings,
            "target": target, "run_cost_s": p.run_cost_s,
        })  # fmt: skip
    return rows


def pct(x: float | None) -> str:
    """A fraction as a percentage with 2 decimals; ``-`` for None."""
    return "-" if x is None else f"{x * 100:.2f}%"


def levels_table(rows: Sequence[Mapping[str, Any]], costs: Costs | None = None) -> list[str]:
    if not rows:
        return []
    cells = [
        [r["form"], str(r["cases"]),
         f"{pct(r['block_sd'])} ({r['block_df']})",
         f"{pct(r['between_sd'])} ({r['between_df']})",
         f"{pct(r['sitting_sd'])} ({r['sitting_df']})",
         str(r["blocks_per_process"]), str(r["processes_per_sitting"]),
         pct(r["floor"]),
         "unreachable" if r["baseline_sittings_for_target"] is None
         else str(r["baseline_sittings_for_target"])]
        for r in rows
    ]  # fmt: skip
    cost = (
        f" (costs: block {costs.block:g} s, process {costs.process:g} s, sitting "
        f"{costs.sitting:g} s)"
        if costs
        else ""
    )
    return [
        "",
        "variance at each level, pooled over the cases (standard deviation of one block, "
        "one process's center, one sitting's offset; degrees of freedom in brackets), and "
        f"Kalibera & Jones's cost-optimal counts{cost}",
        *render_table(
            [
                "form",
                "cases",
                "blocks",
                "processes",
                "sittings",
                "blocks/process",
                "processes/sitting",
                "floor (1 sitting)",
                f"baseline sittings for {rows[0]['target']:.0%}",
            ],
            cells,
        ),
        "floor: (z_alpha + z_95%) x the noise of one new sitting against a baseline of "
        f"infinitely many (gate level {DEFAULT_GATE_ALPHA:.2e}): a stored baseline cannot catch "
        "a change below it",
    ]


def sittings_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    names = list(rows[0]["conditions"])
    cells = []
    for r in rows:
        line = [str(r["sitting"]), str(r["baseline_sittings"])]
        for n in names:
            v = r["conditions"].get(n)
            if v is None:
                line.append("-")
            elif v["aa"]:
                line.append(f"{v['failed']}/{v['runs']} fail, {v['unstable']} U")
            else:
                line.append(f"{v['detected']}/{v['runs']}")
        cells.append(line)
    return [
        "",
        "per sitting (A/A: runs that failed, runs with an UNSTABLE case; injected: runs "
        "that detected it)",
        *render_table(["sitting", "baseline sittings", *names], cells),
    ]


def sitting_offsets(k: int, reports: Sequence[Report]) -> list[dict[str, Any]]:
    """What sitting ``k``'s quiet A/A runs say of the sitting term they were judged with:
    a held-out check of a device prior.

    Per judged form (``OFFSET_FORMS``): each case's offset, the median over the runs of
    its judged log change (the runs' process and block noise average out, the sitting's
    offset from the baseline's sittings does not), against the standard deviation the runs
    were judged to have, ``sqrt(c_s) x sigma_s`` (the metric's ``sitting`` after the prior,
    and its ``sitting_coef``); the root mean squares over the cases, their ratio and the
    case farthest out in those units. One-sided: over ``OFFSET_RATIO_LIMIT`` the term
    understates the machine's offset from one sitting to the next; each run being a
    sitting of its own, the median averages away the part of the offset each run draws, so
    a ratio under 1 does not say the term is too wide."""
    per: dict[tuple[str, str], tuple[list[float], list[float], set[bool]]] = {}
    for report in reports:
        for c in report.cases:
            if c.data.get("recorded"):
                continue
            prior = c.data.get("prior")
            provisional = not isinstance(prior, Mapping) or bool(prior.get("provisional"))
            for m in c.metrics:
                form = OFFSET_FORMS.get(m.metric)
                sd, coef = m.sitting, m.sitting_coef
                if form is None or sd is None or coef is None or coef <= 0:
                    continue
                if not math.isfinite(m.change) or m.change <= -1 or not math.isfinite(sd):
                    continue
                logs, sds, priors = per.setdefault((form, f"{c.test} {c.key}"), ([], [], set()))
                logs.append(math.log1p(m.change))
                sds.append(sd * math.sqrt(coef))
                priors.add(provisional)
    rows = []
    for form in OFFSET_FORMS.values():
        cases = [
            (name.rsplit("::", 1)[-1], statistics.median(logs), statistics.median(sds), pr)
            for (f, name), (logs, sds, pr) in sorted(per.items())
            if f == form
        ]
        if not cases:
            continue
        offset = math.sqrt(statistics.fmean(o * o for _, o, _, _ in cases))
        predicted = math.sqrt(statistics.fmean(p * p for _, _, p, _ in cases))
        name, far, sd, _ = max(cases, key=lambda c: abs(c[1]) / c[2] if c[2] > 0 else 0.0)
        priors = {p for *_, pr in cases for p in pr}
        rows.append({
            "sitting": k, "form": form, "cases": len(cases), "runs": len(reports),
            "prior": "provisional" if True in priors else "measured",
            "offset_rms": offset, "predicted_rms": predicted,
            "ratio": offset / predicted if predicted > 0 else None,
            "farthest": name, "farthest_offset": far,
            "farthest_z": far / sd if sd > 0 else None,
        })  # fmt: skip
    return rows


def offsets_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    cells = [
        [str(r["sitting"]), r["prior"], r["form"], f"{r['cases']} x {r['runs']}",
         pct(r["offset_rms"]), pct(r["predicted_rms"]), num(r["ratio"], ".2f"),
         f"{r['farthest']} {math.expm1(r['farthest_offset']) * 100:+.2f}% "
         f"({num(r['farthest_z'], '+.1f')} sd)"]
        for r in rows
    ]  # fmt: skip
    return [
        "",
        "each sitting's offset against the sitting term its runs were judged with (per case "
        "the median log change of its quiet A/A runs; root mean squares over the cases; a "
        f"ratio over {OFFSET_RATIO_LIMIT:g} says the term understates this machine)",
        *render_table(
            ["sitting", "prior", "form", "cases x runs", "offset", "sqrt(c_s) x sitting",
             "ratio", "farthest case (its change, in sd)"],
            cells,
        ),
    ]  # fmt: skip
