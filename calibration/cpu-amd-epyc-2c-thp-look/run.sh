#!/bin/bash
set -u
cd /work/wt-cal  # a frozen checkout at 8b97abf
n=0
for v in 1 0 1 0 1 0; do  # stopped after run 4 for time
  n=$((n+1)); mkdir -p /work/thp/thp$v
  out=/work/thp/thp$v/aa$n.json
  echo "== $(date -u +%T) THP_MEM_ALLOC_ENABLE=$v run $n"
  THP_MEM_ALLOC_ENABLE=$v timeout 600 /work/venv-cal/bin/python -m pytest perf_tests/test_decode.py -m long_context -k fragmented \
     -q -p no:cacheprovider --specperf-baselines=/work/thp/bl --specperf-json=$out \
     --specperf-ab=python=/work/venv-cal/bin/python --specperf-processes=2 2>&1 | tail -2
done
echo "== $(date -u +%T) done"
