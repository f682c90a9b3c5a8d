#!/bin/bash
# A/B A/A calibrations at 32 and 64 steps, interleaved round by round (docs/calibration.md,
# "A/B on an AMD EPYC box (Zen 4), 2026-12-06"). Run from a frozen checkout of main in its own
# venv (/work/wt-cal, /work/venv-cal); the work dirs are this folder's, resumed round by round.
set -u
mkdir -p /work/calib-raw
OUT=${OUT:-/work/main/calibration/cpu-amd-epyc-2c-ab-steps}
cd /work/wt-cal
export THP_MEM_ALLOC_ENABLE=1
for k in $(seq 1 20); do
  for steps in 32 64; do
    echo "== $(date -u +%T) round $k, $steps steps"
    /work/venv-cal/bin/specperf calibrate --ab python=/work/venv-cal/bin/python --processes 2 \
        --repetitions "$k" --history --host-stall-share 0 --inject none --resume \
        --work-dir "$OUT/steps$steps" \
        -- perf_tests -m long_context --specperf-steps="$steps",warmup=8 2>&1 | tee -a "/work/calib-raw/steps$steps.log" | grep -E "^\[|Error|error" | tail -2
  done
done
