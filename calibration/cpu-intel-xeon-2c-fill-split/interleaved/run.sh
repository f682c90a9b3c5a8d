#!/bin/bash
# interleaved: the new fill (wt-cal) and the old fill (wt-old), fragmented cases, A/B of one build, 2 processes a side
for i in 2 3 4; do
  for arm in old new; do
    if [ $arm = old ]; then export PYTHONPATH=/work/wt-old; cd /work/wt-old; else unset PYTHONPATH; cd /work/wt-cal; fi
    echo "== $(date -u +%T) $arm$i"
    THP_MEM_ALLOC_ENABLE=1 timeout 400 /work/venv-cal/bin/python -m pytest perf_tests -m long_context -k fragmented --specperf-steps=64,warmup=8 --specperf-ab python=/work/venv-cal/bin/python --specperf-processes 2 --specperf-json /work/scratch/split/$arm$i.json -p no:cacheprovider -q 2>&1 | grep -E "fragmented bs|passed|failed" | cut -c1-160
  done
done
echo "== done $(date -u +%T)"
