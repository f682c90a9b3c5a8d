#!/bin/bash
# The same day's control: the calibrated build (3d652e5, requests end on their token
# ceiling) and the step-limited build (41dbe26), A/B of one build each, fragmented cases
# only, 64 steps, alternating old new new old old new. Compare the tested processes' verify/rest
# and step/ref spreads (../../cpu-intel-xeon-2c-fill-split/interleaved/spread.py) and the
# between-process variance the reports hold. Logs go outside the repository.
set -u
OUT=$(cd "$(dirname "$0")" && pwd)
run() {  # tag checkout venv
    cd "$2" && THP_MEM_ALLOC_ENABLE=1 "$3/bin/python" -m pytest perf_tests -m long_context \
        -k fragmented -q -p no:cacheprovider --specperf-steps=64,warmup=8 \
        --specperf-ab "python=$3/bin/python" --specperf-processes 2 \
        "--specperf-json=$OUT/$1.json" > "/work/scratch/same-day-$1.log" 2>&1
    echo "$1 rc=$? $(date -u +%H:%M:%S)"
}
date -u +%H:%M:%S
run old1 /work/wt-old /work/venv-old
run new1 /work/wt-cal /work/venv-cal
run new2 /work/wt-cal /work/venv-cal
run old2 /work/wt-old /work/venv-old
run old3 /work/wt-old /work/venv-old
run new3 /work/wt-cal /work/venv-cal
