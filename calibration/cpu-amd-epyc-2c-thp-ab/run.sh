#!/bin/bash
# Huge pages or not, interleaved (docs/calibration.md, "Huge pages on the Zen 4 box, every
# case, interleaved"): A/B A/A runs of the long_context suite at 32 steps, 2 processes a
# side, with history, alternating THP_MEM_ALLOC_ENABLE=1 and 0 in the order 1 0 0 1 (a
# linear drift hits both alike), each setting its own work dir (thp1, thp0), each resumed one
# run further a turn. Run from a frozen checkout of main in its own venv (/work/wt-cal at
# 7c14b91, /work/venv-cal: the checkout of steps32). ROUNDS: rounds of 4 runs.
set -u
mkdir -p /work/calib-raw
OUT=${OUT:-/work/main/calibration/cpu-amd-epyc-2c-thp-ab}
ROUNDS=${ROUNDS:-4}
cd /work/wt-cal
for k in $(seq 1 "$ROUNDS"); do
  for v in 1 0 0 1; do
    dir=thp$v
    done_runs=$(find "$OUT/$dir" -maxdepth 1 -name "rep*-A_A.json" 2>/dev/null | wc -l)
    echo "== $(date -u +%T) round $k, THP_MEM_ALLOC_ENABLE=$v: run $((done_runs + 1))"
    THP_MEM_ALLOC_ENABLE=$v /work/venv-cal/bin/specperf calibrate \
        --ab python=/work/venv-cal/bin/python --processes 2 \
        --repetitions $((done_runs + 1)) --history --host-stall-share 0 --inject none \
        --resume --work-dir "$OUT/$dir" \
        -- perf_tests -m long_context --specperf-steps=32,warmup=8 2>&1 |
        tee -a "/work/calib-raw/thp-ab-$dir.log" | grep -E "^\[|Error|error" | tail -2
  done
done
