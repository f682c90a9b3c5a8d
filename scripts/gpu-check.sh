#!/usr/bin/env bash
# gpu-check.sh: the first GPU run's measurements, within 8 minutes by construction.
#
#   bash scripts/gpu-check.sh            # run every step of the plan
#   bash scripts/gpu-check.sh --dry-run  # print the plan: steps, timeouts, node ids, outputs
#
# The steps, their timeouts (summing under 480 s), the pytest node ids and the output
# files are defined once, in scripts/gpu_check.py (PLAN); this script runs each step under
# `timeout` and keeps its stdout and stderr in $OUT/logs/<step>.log. Every step writes its
# partial results under $OUT as it goes, so a step cut short still leaves them.
#
# Needs: a CUDA GPU and a `python3` (or $PYTHON) that holds torch with CUDA, pytest and
# pyyaml (nvidia-ml-py for telemetry). The package need not be installed: the repository
# root goes on PYTHONPATH. No network.
#
# Environment: PYTHON (default python3), OUT (default ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-./gpu-check-out}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu-check: interpreter '$PY' not found; set PYTHON=/path/to/python-with-torch" >&2
  exit 2
fi
if [[ "${1:-}" == "--dry-run" ]]; then
  exec "$PY" scripts/gpu_check.py plan --out "$OUT"
elif [[ $# -gt 0 ]]; then
  echo "gpu-check: unknown argument '$1'; usage: $0 [--dry-run]" >&2
  exit 2
fi

mkdir -p "$OUT/logs"
"$PY" scripts/gpu_check.py plan --out "$OUT" | tee "$OUT/plan.txt"
mapfile -t STEPS < <("$PY" scripts/gpu_check.py plan --out "$OUT" --names)
T0=$(date +%s)
: >"$OUT/steps.txt"
for entry in "${STEPS[@]}"; do
  read -r name limit <<<"$entry"
  echo "== $name (limit ${limit} s, at $(( $(date +%s) - T0 )) s)"
  # the step gets its limit minus 3 s; `timeout -k 3` kills it within the limit
  timeout -k 3 "$(( limit - 3 ))" "$PY" scripts/gpu_check.py run "$name" --out "$OUT" \
    >"$OUT/logs/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT/logs/$name.log"
  echo "$name exit $rc after $(( $(date +%s) - T0 )) s" | tee -a "$OUT/steps.txt"
  if [[ "$name" == preflight && $rc -ne 0 ]]; then
    echo "gpu-check: preflight failed (see $OUT/logs/preflight.log); nothing else can run" >&2
    exit 2
  fi
done
echo "== done in $(( $(date +%s) - T0 )) s; results in $OUT (summary: $OUT/summary.txt)"
