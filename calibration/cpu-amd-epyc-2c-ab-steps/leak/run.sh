#!/bin/bash
# The canary leak on the Zen 4 box (README.txt): one case, A/B against the same venv, the
# tested side injected, 32 steps; reports in /work/calib-raw/leak.
#   run.sh 1: busy1-2 (the shipped busy loop), spin1-2 (OpenMP workers kept spinning),
#             wait1-2 (verify_wait=15), 18:10-18:14 UTC
#   run.sh 2: busy3-5 and par3-5 (parallel.patch applied: a torch.mm loop), 18:14-18:18 UTC
cd /work/main || exit 1
export THP_MEM_ALLOC_ENABLE=1
run() {  # name inject [VAR=value ...]
  local name=$1 inject=$2; shift 2
  env "$@" /work/venv/bin/python -m pytest perf_tests -m long_context -q -p no:cacheprovider \
    -k "test_decode and 32768 and contiguous" --specperf-ab python=/work/venv/bin/python \
    --specperf-inject "$inject" --specperf-steps 32,warmup=8 --specperf-max-time 0 \
    --specperf-json=/work/calib-raw/leak/$name.json > /work/calib-raw/leak/$name.log 2>&1
  echo "$name done $(date +%T)"
}
if [ "${1:-1}" = 1 ]; then
  for k in 1 2; do
    run busy$k verify=1.05
    run spin$k verify=1.05 GOMP_SPINCOUNT=INFINITE
    run wait$k verify_wait=15
  done
else
  for k in 3 4 5; do
    run busy$k verify=1.05
    run par$k verify=1.05 SPECPERF_EXPERIMENT_PARALLEL=1
  done
fi
