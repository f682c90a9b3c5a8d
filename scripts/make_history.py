#!/usr/bin/env python
"""Write a synthetic history of nightly runs, as the plugin and pytest-benchmark save them.

    python scripts/make_history.py OUT [--runs 365] [--cases 10] [--format benchmark|report]

Every case goes through the plugin's own code: synthetic step records (per-phase times
shaped like the reference engine's, with step-to-step jitter and night-to-night drift) ->
``judging.samples.build_run`` -> ``judging.judge.judge_case`` against the baseline of the
time -> the bridge's pure half (``reporting.benchmark``) -> pytest-benchmark's own
``Metadata``, ``pytest_benchmark_generate_json`` and ``FileStorage.save`` (``--format
benchmark``, the default: OUT is a pytest-benchmark storage, ``OUT/<machine>/NNNN_*.json``),
or ``store.report.write_report`` (``--format report``: one ``--specperf-json`` report
per night). What happens over the nights (as fractions of --runs, so that a short history
has the same story):

- at 1/3: the accept length of the cases of 32k tokens and more drops (2.8 instead of 3.1);
- at 0.55: ``verify`` gets 10% slower in every case (the verdicts turn SLOWER);
- at 0.63: the baselines are re-recorded (a baseline update);
- at 0.82: a 3 ms host stall per step appears in the fragmented cases (``unaccounted``).

``specperf history OUT`` should name these four as change points.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_benchmark.logger import Logger
from pytest_benchmark.plugin import (
    pytest_benchmark_generate_json,
    pytest_benchmark_generate_machine_info,
)
from pytest_benchmark.stats import Metadata
from pytest_benchmark.storage.file import FileStorage
from pytest_benchmark.utils import get_machine_id

from pytest_specperf.judging.baselines import CaseBaseline
from pytest_specperf.judging.judge import Case, CaseOutcome, as_baseline, judge_case
from pytest_specperf.judging.samples import DecodeRun, KVLayout, Window, build_run
from pytest_specperf.judging.verdict import DEFAULT_STEP_TOLERANCE, DEFAULT_TOLERANCE, Tolerances
from pytest_specperf.probe.record import StepRecord
from pytest_specperf.reporting.benchmark import benchmark_entry, machine_entries, run_header
from pytest_specperf.store.baselines import utc_now
from pytest_specperf.store.report import SPECPERF_KEY, report_payload, write_report

CONTEXTS = (1024, 8192, 32768, 46000, 131072)
LAYOUTS = ("contiguous", "fragmented")
#: Share of the step per phase (the reference engine's, roughly), and the step's ms per
#: thousand tokens of context plus a fixed part.
SHARES = {"schedule": 0.0005, "draft": 0.22, "build_verify_input": 0.001,
          "prepare_for_verify": 0.001, "verify": 0.75, "accept": 0.001, "kv_commit": 0.006}
STEPS, BLOCK = 32, 4
TEST = "perf_tests/test_decode.py::test_decode"
FINGERPRINT = {"backend": "reference", "engine": "specperf-reference", "config": "tiny",
               "speculative_algorithm": "DFLASH", "num_draft_tokens": 8, "device_type": "cpu"}
DEVICE = {"kind": "cpu", "name": "synthetic history", "slug": "synthetic-history",
          "cpu_model": "synthetic", "cpu_cores": 2}


def _step_ms(ctx: int, layout: str) -> float:
    return (2.6 + 0.88 * ctx / 1000) * (1.2 if layout == "fragmented" else 1.0)


def _records(ctx: int, layout: str, night: int, runs: int, rng: random.Random) -> list[StepRecord]:
    drift = rng.gauss(1.0, 0.015)
    accept_mean = 2.8 if ctx >= 32768 and night >= runs // 3 else 3.1
    slow_verify = 1.10 if night >= int(runs * 0.55) else 1.0
    stall_ms = 3.0 if layout == "fragmented" and night >= int(runs * 0.82) else 0.0
    out = []
    for i in range(STEPS):
        base = _step_ms(ctx, layout) * drift * rng.gauss(1.0, 0.03)
        host = {p: int(base * share * 1e6) for p, share in SHARES.items()}
        host["verify"] = int(host["verify"] * slow_verify)
        unaccounted = int((0.02 + stall_ms) * 1e6)
        accepted = max(1, round(rng.gauss(accept_mean, 0.8)))
        out.append(StepRecord(step=i, wall_ns=i, mode="decode", rids=[f"b{i // BLOCK}"],
                              context_len=ctx, batch_size=1, accepted_tokens=accepted,
                              step_ns=sum(host.values()) + unaccounted, host_ns=host,
                              unaccounted_ns=unaccounted))
    return out


def _case(ctx: int, layout: str, night: int, runs: int, rng: random.Random) -> Case:
    records = _records(ctx, layout, night, runs, rng)
    blocks = [i // BLOCK for i in range(STEPS)]
    level = 1.0 if layout == "fragmented" else 0.0
    run: DecodeRun = build_run(records, blocks, context_len=ctx, batch_size=1,
                               layout=KVLayout(layout, level),
                               window=Window(fragmentation=level, wall_s=1.0, warmup_steps=8))
    return Case(nodeid=f"{TEST}[kv={layout}-ctx={ctx}]", test=TEST,
                key=f"ctx={ctx} kv={layout} bs=1", run=run, fingerprint=FINGERPRINT,
                tolerances=Tolerances(DEFAULT_TOLERANCE, DEFAULT_STEP_TOLERANCE))


def _night(night: int, runs: int, cases: Sequence[tuple[int, str]], rng: random.Random,
           baselines: dict[str, CaseBaseline]) -> list[CaseOutcome]:
    record = night in (0, int(runs * 0.63))
    outcomes = []
    for ctx, layout in cases:
        case = _case(ctx, layout, night, runs, rng)
        outcomes.append(judge_case(case, baselines.get(case.key), Path("baselines/synthetic.yaml"),
                                   record=record))
        if record:
            baselines[case.key] = as_baseline(case, at=utc_now())
    return outcomes


def _stamp(night: int) -> tuple[str, dict[str, Any]]:
    when = datetime.datetime(2025, 6, 1, 2, 0, tzinfo=datetime.timezone.utc)
    when += datetime.timedelta(days=night)
    sha = hashlib.sha1(f"commit {night}".encode()).hexdigest()
    commit = {"id": sha, "time": when.isoformat(), "author_time": when.isoformat(),
              "dirty": False, "project": "pytest-specperf", "branch": "main"}
    return when.isoformat(), commit


HEADER = {"device": DEVICE, "backend": "reference", "baselines": "baselines/synthetic.yaml",
          "tolerance": DEFAULT_TOLERANCE, "step_tolerance": DEFAULT_STEP_TOLERANCE}


def _save_benchmark(storage: FileStorage, machine: dict[str, Any], night: int,
                    outcomes: Sequence[CaseOutcome]) -> None:
    stats = []
    for o in outcomes:
        entry = benchmark_entry(o)
        meta = Metadata(entry, iterations=1, options=dict(entry.options))
        for seconds in entry.step_seconds:
            meta.update(seconds)
        stats.append(meta)
    when, commit = _stamp(night)
    data = pytest_benchmark_generate_json(config=None, benchmarks=stats, include_data=False,
                                          machine_info=machine, commit_info=commit)
    data["datetime"] = when
    data[SPECPERF_KEY] = run_header(HEADER)
    storage.save(data, f"nightly_{when[:10]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=365)
    ap.add_argument("--cases", type=int, default=10)
    ap.add_argument("--format", choices=("benchmark", "report"), default="benchmark")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = [(c, k) for c in CONTEXTS for k in LAYOUTS][: args.cases]
    machine = {**pytest_benchmark_generate_machine_info(), **machine_entries(DEVICE)}
    storage = FileStorage(args.out, logger=Logger(Logger.QUIET),
                          default_machine_id=get_machine_id())
    baselines: dict[str, CaseBaseline] = {}
    for night in range(args.runs):
        outcomes = _night(night, args.runs, cases, rng, baselines)
        if args.format == "benchmark":
            _save_benchmark(storage, machine, night, outcomes)
        else:
            when, commit = _stamp(night)
            header = {**HEADER, "datetime": when, "commit_info": commit}
            write_report(args.out / f"report-{night:04d}.json", report_payload(header, outcomes))
    print(f"{args.runs} runs x {len(cases)} cases written to {args.out} ({args.format})")


if __name__ == "__main__":
    main()
