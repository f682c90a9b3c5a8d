#!/usr/bin/env python
"""Figures of the reference engine on this machine (README, "Measured").

    python scripts/measure_engine.py [--threads 1] [--reps 7] [--json out.json]

1. step time by phase at 1k, 8k, 32k and 46k tokens of context (tiny config, contiguous
   KV), median of the measured steps, and mean accepted tokens per step;
2. fragmented / contiguous step-time ratio at 46k, interleaved repetitions;
3. probe overhead: median decode time per step with the probe on (StepProbe writing to a
   run directory, as in the server) vs off (NullProbe), interleaved repetitions, timed
   from outside the engine; plus the probe's own cost per step from a microbenchmark.
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import tempfile
import time

import torch
from probe_micro import empty_steps_us

from pytest_specperf.engines.reference.config import get_config
from pytest_specperf.engines.reference.engine import Engine, GenRequest
from pytest_specperf.probe import PHASES, NullProbe, RunDirSink, StepProbe


def spread(xs: list[float]) -> str:
    return f"median {st.median(xs):.4f}, min {min(xs):.4f}, max {max(xs):.4f}, n {len(xs)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out: dict = {"threads": args.threads, "torch": torch.__version__}
    cfg = get_config("tiny")
    run_dir = tempfile.mkdtemp(prefix="specperf-measure-")
    probe = StepProbe(RunDirSink(run_dir))
    eng = Engine(cfg, probe=probe)

    def steps_of(ctx: int, layout: str, n_new: int, seed: int = 1):
        eng.set_kv_layout(layout, 1.0, 0)
        t = time.perf_counter()
        r = eng.generate([GenRequest("m", n_new, context_len=ctx, ignore_eos=True, seed=seed)])[0]
        return r, time.perf_counter() - t

    # 1. phase table per context
    recs_probe = StepProbe(None)
    eng.probe = recs_probe
    table = {}
    print(f"1. step time by phase (tiny config, contiguous KV, {args.threads} thread(s))")
    hdr = f"{'context':>8} {'step ms':>8} " + " ".join(f"{p[:10]:>10}" for p in PHASES) + \
        f" {'unacc':>7} {'acc/step':>8}"
    print(hdr)
    for ctx in (1024, 8192, 32768, 46000):
        recs, acc_tok, acc_steps = [], 0, 0
        for seed in range(3):
            r, _ = steps_of(ctx, "contiguous", 48, seed)
            recs += recs_probe.take_completed()[1:]
            acc_tok += r.completion_tokens - 1
            acc_steps += r.spec_verify_ct
        row = {p: st.median(x.host_ns[p] for x in recs) / 1e6 for p in PHASES}
        row["unaccounted"] = st.median(x.unaccounted_ns for x in recs) / 1e6
        row["step"] = st.median(x.step_ns for x in recs) / 1e6
        row["accept_len"] = acc_tok / acc_steps
        table[ctx] = row
        print(f"{ctx:>8} {row['step']:8.2f} " + " ".join(f"{row[p]:10.3f}" for p in PHASES)
              + f" {row['unaccounted']:7.3f} {row['accept_len']:7.2f}")
    out["phases"] = table
    acc = [table[c]["accept_len"] for c in table]
    print("mean accepted tokens per step (real acceptance, 3 prompts x 48 tokens each): "
          + ", ".join(f"{c}: {a:.2f}" for c, a in zip(table, acc)))

    # 2. fragmented / contiguous at 46k, interleaved
    ratios = []
    for rep in range(args.reps):
        med = {}
        for layout in ("contiguous", "fragmented"):
            steps_of(46000, layout, 40, seed=rep)
            recs = recs_probe.take_completed()[1:]
            med[layout] = st.median(x.step_ns for x in recs)
        ratios.append(med["fragmented"] / med["contiguous"])
    out["fragmented_over_contiguous_46k"] = ratios
    print(f"2. fragmented/contiguous step time at 46k: {spread(ratios)}")

    # 3. probe overhead, interleaved on/off, timed from outside
    on_probe = StepProbe(RunDirSink(run_dir))
    off_probe = NullProbe()
    per_step = {"on": [], "off": []}
    for rep in range(args.reps):
        for arm, p in (("on", on_probe), ("off", off_probe)) if rep % 2 == 0 else \
                (("off", off_probe), ("on", on_probe)):
            eng.probe = p
            r, dt = steps_of(8192, "contiguous", 129, seed=3)
            per_step[arm].append(dt / r.spec_verify_ct * 1e3)
    rel = [a / b for a, b in zip(per_step["on"], per_step["off"])]
    out["probe_on_off"] = {"on_ms": per_step["on"], "off_ms": per_step["off"], "ratio": rel}
    print(f"3. probe on/off, generate time per step at 8k (ms): on {spread(per_step['on'])}; "
          f"off {spread(per_step['off'])}; paired ratio {spread(rel)}")
    # microbenchmark: the probe's own cost per step (7 phases, record, buffered sink)
    n = 20000
    cost_us = empty_steps_us(StepProbe(RunDirSink(tempfile.mkdtemp())), n)
    step8k = table[8192]["step"]
    out["probe_cost_us_per_step"] = cost_us
    print(f"   probe cost per step (microbenchmark, {n} steps): {cost_us:.1f} us = "
          f"{cost_us / 1e3 / step8k:.3%} of an 8k step ({step8k:.2f} ms), "
          f"{cost_us / 1e3 / table[1024]['step']:.3%} of a 1k step")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
