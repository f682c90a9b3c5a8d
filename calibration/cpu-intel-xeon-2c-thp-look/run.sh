#!/bin/bash
# Interleaved A/B A/A runs (no injection) of the three fragmented cases, with and without
# huge pages for the servers' large allocations (THP_MEM_ALLOC_ENABLE).
set -u
cd /work/wt-cal
n=0
for v in 0 1 0 1 0 0; do
  n=$((n+1)); mkdir -p /work/thp/thp$v
  out=/work/thp/thp$v/aa$n.json
  echo "== $(date -u +%T) THP_MEM_ALLOC_ENABLE=$v run $n"
  THP_MEM_ALLOC_ENABLE=$v timeout 600 /work/venv-cal/bin/python -m pytest perf_tests/test_decode.py -m long_context -k fragmented \
     -q -p no:cacheprovider --specperf-baselines=/work/thp/bl --specperf-json=$out \
     --specperf-ab=python=/work/venv-cal/bin/python --specperf-processes=2 2>&1 | tail -2
done
echo "== $(date -u +%T) done"
