#!/bin/bash
cd /work/main
export THP_MEM_ALLOC_ENABLE=1
run() {
  local name=$1; shift
  local inject=$1; shift
  env "$@" /work/venv/bin/python -m pytest perf_tests -m long_context -q -p no:cacheprovider \
    -k "test_decode and 32768 and contiguous" --specperf-ab python=/work/venv/bin/python \
    --specperf-inject "$inject" --specperf-steps 32,warmup=8 --specperf-max-time 0 \
    --specperf-json=/work/calib-raw/leak/$name.json > /work/calib-raw/leak/$name.log 2>&1
  echo "$name done $(date +%T)"
}
for k in 3 4 5; do
  run busy$k verify=1.05
  run par$k verify=1.05 SPECPERF_EXPERIMENT_PARALLEL=1
done
