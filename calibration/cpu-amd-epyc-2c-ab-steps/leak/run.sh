#!/bin/bash
# canary leak on Zen 4: A/B on one case, the tested side injected; phases' paired centers
cd /work/main
export THP_MEM_ALLOC_ENABLE=1
run() {  # name, env..., inject
  local name=$1; shift
  local inject=$1; shift
  env "$@" /work/venv/bin/python -m pytest perf_tests -m long_context -q -p no:cacheprovider \
    -k "test_decode and 32768 and contiguous" --specperf-ab python=/work/venv/bin/python \
    --specperf-inject "$inject" --specperf-steps 32,warmup=8 --specperf-max-time 0 \
    --specperf-json=/work/calib-raw/leak/$name.json > /work/calib-raw/leak/$name.log 2>&1
  echo "$name done $(date +%T)"
}
for k in 1 2; do
  run busy$k verify=1.05
  run spin$k verify=1.05 GOMP_SPINCOUNT=INFINITE
  run wait$k verify_wait=15
done
