#!/bin/bash
# A/B A/A calibrations of the quiet runs, interleaved round by round (docs/calibration.md,
# "A/B on an AMD EPYC box (Zen 4), 2026-12-06"). Run from a frozen checkout of main in its own
# venv (/work/wt-cal, /work/venv-cal); the work dirs are this folder's, each resumed one run
# further a round. CONFIGS: "processes:steps:work dir" ..., ROUNDS: how many rounds.
#   2026-12-06 08:38: CONFIGS="2:32:steps32 2:64:steps64" ROUNDS=7 (the default)
#   2026-12-06 12:0x: CONFIGS="2:32:steps32 3:32:procs3" ROUNDS=5
#   2026-12-06 18:0x: CONFIGS="2:64:steps64" INJECT=verify=1.05 ROUNDS=12 (the power run:
#   each round adds one run of the injected condition; the 20 A/A runs are resumed)
set -u
mkdir -p /work/calib-raw
OUT=${OUT:-/work/main/calibration/cpu-amd-epyc-2c-ab-steps}
CONFIGS=${CONFIGS:-"2:32:steps32 2:64:steps64"}
ROUNDS=${ROUNDS:-7}
INJECT=${INJECT:-none}
# the condition whose runs a round adds: its reports are rep*-<tag>.json
TAG=$([ "$INJECT" = none ] && echo A_A || echo "$INJECT" | tr -c "[:alnum:].\n-" _)
cd /work/wt-cal
export THP_MEM_ALLOC_ENABLE=1
for k in $(seq 1 "$ROUNDS"); do
  for cfg in $CONFIGS; do
    IFS=: read -r procs steps dir <<< "$cfg"
    done_runs=$(find "$OUT/$dir" -maxdepth 1 -name "rep*-$TAG.json" 2>/dev/null | wc -l)
    echo "== $(date -u +%T) round $k, $procs processes a side, $steps steps: run $((done_runs + 1))"
    /work/venv-cal/bin/specperf calibrate --ab python=/work/venv-cal/bin/python \
        --processes "$procs" --repetitions $((done_runs + 1)) --history --host-stall-share 0 \
        --inject "$INJECT" --resume --work-dir "$OUT/$dir" \
        -- perf_tests -m long_context --specperf-steps="$steps",warmup=8 2>&1 |
        tee -a "/work/calib-raw/$dir.log" | grep -E "^\[|Error|error" | tail -2
  done
done
