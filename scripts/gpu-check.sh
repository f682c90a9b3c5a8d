#!/usr/bin/env bash
# gpu-check.sh: the first GPU run's measurements, within 8 minutes by construction.
#
#   bash scripts/gpu-check.sh             # run every step of the plan (needs a CUDA GPU)
#   bash scripts/gpu-check.sh --dry-run   # print the plan: steps, timeouts, node ids, outputs
#   bash scripts/gpu-check.sh --rehearse  # every step on the CPU (a repeated arm once): tiny
#                                         # engine, the CUDA-only calls replaced by named
#                                         # stand-ins; each step's time against its limit
#                                         # (docs/gpu-check.md)
#
# The steps, their timeouts (summing under 480 s), the pytest node ids and the output
# files are defined once, in scripts/gpu_check.py (PLAN); this script runs each step under
# `timeout` and keeps its stdout and stderr in $OUT/logs/<step>.log. Every step writes its
# partial results under $OUT as it goes, so a step cut short still leaves them. At its
# limit less its grace (8 s for pytest steps, 3 s for in-process ones) a step is
# interrupted (SIGINT to its process group: pytest writes its --specperf-json report and
# stops its server) and it is killed at its limit.
# $OUT/steps.tsv says how each step ended; the summary and $OUT/margins.txt say which
# finished and each step's time against its limit.
#
# Needs: a CUDA GPU (not for --rehearse) and a `python3` (or $PYTHON) that holds torch,
# pytest, pytest-benchmark, PyYAML, filelock and nvidia-ml-py (preflight checks each). The
# package need not be installed: the repository root goes on PYTHONPATH. No network.
#
# Environment: PYTHON (default python3), OUT (default ./gpu-check-out),
# SPECPERF_KERNEL_EVERY=0 (the fallback when the profiler hangs: no kernel sampling in the
# servers, and the profile step skips its profiler parts).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-./gpu-check-out}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu-check: interpreter '$PY' not found; set PYTHON=/path/to/python-with-torch" >&2
  exit 2
fi
MODE=()
case "${1:-}" in
  --dry-run) exec "$PY" scripts/gpu_check.py plan --out "$OUT" ;;
  --rehearse)
    MODE=(--rehearse)
    # one CPU thread per process: on a shared machine torch's spinning OpenMP workers made
    # a tiny decode step ~30x slower (8 steps at 4k: 3-5 s of CPU instead of 0.17 s)
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ;;
  "") ;;
  *) echo "gpu-check: unknown argument '$1'; usage: $0 [--dry-run | --rehearse]" >&2
     exit 2 ;;
esac
if [[ $# -gt 1 ]]; then
  echo "gpu-check: one argument at most; usage: $0 [--dry-run | --rehearse]" >&2
  exit 2
fi

mkdir -p "$OUT/logs"
"$PY" scripts/gpu_check.py plan --out "$OUT" | tee "$OUT/plan.txt"
# name, enforced limit, grace, real limit (--rehearse: each limit enforced x
# REHEARSAL_LIMIT_FACTOR, so that every part runs to its end on a slow CPU, and each repeated
# step once: aa2/aa3/v105b/v105c are aa1's and v105a's nodes and arguments again; the margins
# at the end are taken against the real limits, a repeat's from its first)
mapfile -t STEPS < <("$PY" scripts/gpu_check.py plan --out "$OUT" --names "${MODE[@]}")
if [[ ${#MODE[@]} -gt 0 ]]; then
  echo "== REHEARSAL on the CPU: every step, the CUDA-only calls replaced by named stand-ins;"
  echo "   its figures are CPU figures, not GPU results"
fi
# CPU seconds (user + system) of every child this shell has waited for, the step's server
# included (`times` in this shell, not in a $(...) subshell, which has its own): a figure
# a shared machine's load does not inflate the way it inflates wall time
children_cpu() {
  "$PY" -c 'import re, sys; print(sum(int(m) * 60 + float(s) for m, s in
    re.findall(r"(\d+)m([\d.]+)s", open(sys.argv[1]).read().splitlines()[-1])))' "$OUT/.times"
}
T0=$(date +%s)
: >"$OUT/steps.tsv"
for i in "${!STEPS[@]}"; do
  read -r name limit grace real <<<"${STEPS[$i]}"
  [[ $limit -ne $real ]] && enforced=" (rehearsal: enforced at $limit s)" || enforced=""
  echo "== $name (limit $real s$enforced, at $(( $(date +%s) - T0 )) s)"
  t=$(date +%s.%N)
  times >"$OUT/.times"
  c=$(children_cpu)
  # SIGINT to the step's process group at its limit less its grace, SIGKILL at the limit
  timeout -s INT -k "$grace" "$(( limit - grace ))" \
    "$PY" scripts/gpu_check.py run "$name" --out "$OUT" "${MODE[@]}" \
    >"$OUT/logs/$name.log" 2>&1
  rc=$?
  took=$("$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
    "$t" "$(date +%s.%N)")
  times >"$OUT/.times"
  cpu=$("$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
    "$c" "$(children_cpu)")
  echo "$name $rc $took $cpu" >>"$OUT/steps.tsv"
  tail -n 25 "$OUT/logs/$name.log"
  echo "$name exit $rc after $took s, $cpu s of CPU (at $(( $(date +%s) - T0 )) s)"
  if [[ "$name" == preflight && $rc -ne 0 ]]; then
    echo "gpu-check: preflight failed (see $OUT/logs/preflight.log); nothing else can run" >&2
    exit 2
  fi
done
echo "== done in $(( $(date +%s) - T0 )) s; results in $OUT (summary: $OUT/summary.txt)"
"$PY" scripts/gpu_check.py margins --out "$OUT" "${MODE[@]}"
