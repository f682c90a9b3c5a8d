#!/usr/bin/env bash
# gpu-check-sglang.sh: the sglang backend end to end on a machine with a GPU and SGLang.
#
# STATUS: THIS SCRIPT HAS NOT RUN ANYWHERE YET. It was written on a machine without a GPU
# (and without SGLang's GPU dependencies), against the SGLang 0.5.23 source. Expect to fix
# details on its first run, and please record the output in the project notes.
#
# What it does:
#   1. writes a tiny Llama target and draft model (config.json only) and serves them with
#      random weights: --load-format dummy --speculative-draft-load-format dummy
#      --skip-tokenizer-init, STANDALONE speculative decoding (SGLang's EAGLE V2 worker);
#      SGLANG_SIMULATE_ACC_LEN pins the acceptance length so step times are comparable;
#   2. runs the long_context suite at two context lengths (32768 and 46000) with
#      --specperf-backend sglang, baselines in a temporary directory (NO_BASELINE: pass);
#   3. prints the phase table (host and device medians per phase) from the JSON report, the
#      hook report of the schedulers, and the graph counters;
#   4. runs tests/test_sglang_gpu.py (one request, fragmentation and metrics cross-check).
#
# Needs: a CUDA GPU, `pip install -e ".[dev,sglang]"` (SGLang with its dependencies), run
# from the repository root. No internet needed (no checkpoint, no tokenizer).
#
# Environment overrides:
#   PYTHON                    interpreter (default: python)
#   SPECPERF_MODEL / SPECPERF_DRAFT_MODEL   use real model paths instead of the tiny ones
#   SPECPERF_SGLANG_ARGS      extra server args, space separated
#   SGLANG_SIMULATE_ACC_LEN   default 3
#   KEEP=1                    keep the work directory
set -euo pipefail

PY=${PYTHON:-python}
cd "$(dirname "$0")/.."
WORK=$(mktemp -d "${TMPDIR:-/tmp}/specperf-sglang-check.XXXXXX")
cleanup() { if [[ "${KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; else echo "kept $WORK"; fi; }
trap cleanup EXIT

"$PY" - <<'EOF'
import importlib.util, sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu-check-sglang: no CUDA device visible to torch")
for mod in ("sglang", "sgl_kernel"):
    if importlib.util.find_spec(mod) is None:
        sys.exit(f'gpu-check-sglang: {mod} is not installed: pip install -e ".[dev,sglang]"')
print("GPU:", torch.cuda.get_device_name(0))
EOF

if [[ -n "${SPECPERF_MODEL:-}" ]]; then
    TARGET=$SPECPERF_MODEL
    DRAFT=${SPECPERF_DRAFT_MODEL:-}
    LOAD_ARGS=()
else
    mapfile -t MODELS < <("$PY" -m pytest_specperf.engines.sglang.tiny_model "$WORK/models")
    TARGET=${MODELS[0]}
    DRAFT=${MODELS[1]}
    LOAD_ARGS=(--load-format=dummy --speculative-draft-load-format=dummy --skip-tokenizer-init)
fi
export SGLANG_SIMULATE_ACC_LEN=${SGLANG_SIMULATE_ACC_LEN:-3}

SERVER_ARGS=(
    --speculative-algorithm=STANDALONE --speculative-num-steps=3
    --speculative-eagle-topk=1 --speculative-num-draft-tokens=4
    --disable-radix-cache --cuda-graph-max-bs-decode=4 --mem-fraction-static=0.6
    "${LOAD_ARGS[@]}"
)
# shellcheck disable=SC2206
SERVER_ARGS+=(${SPECPERF_SGLANG_ARGS:-})
PYTEST_ARGS=(--specperf-backend sglang --specperf-model "$TARGET")
[[ -n "$DRAFT" ]] && PYTEST_ARGS+=(--specperf-draft-model "$DRAFT")
for a in "${SERVER_ARGS[@]}"; do PYTEST_ARGS+=("--specperf-server-arg=$a"); done

echo "== long_context suite, two context lengths, SGLang backend"
status=0
"$PY" -m pytest perf_tests -m long_context -k "32768 or 46000" "${PYTEST_ARGS[@]}" \
    --specperf-baselines "$WORK/baselines" --specperf-json "$WORK/report.json" \
    --basetemp "$WORK/basetemp" -p no:cacheprovider -rA -v || status=$?

echo "== phase table"
"$PY" - "$WORK/report.json" "$WORK" <<'EOF' || status=$?
import json, sys
from pathlib import Path
from pytest_specperf.probe.phases import ALL_PHASES, PHASES
path = Path(sys.argv[1])
if not path.exists():
    sys.exit(f"no JSON report at {path}: the suite did not get far enough")
data = json.loads(path.read_text())
cases = data.get("cases", data if isinstance(data, list) else [])
if not cases:
    sys.exit("the JSON report has no measured cases")
for c in cases:
    print(f"\n{c['nodeid']}  context={c['context_len']}  kv={c['kv_layout']}"
          f" (fragmentation {c.get('kv_fragmentation')})  steps={c['steps']}"
          f"  accept_len={c['accept_len'].get('median')}  verdict={c['verdict']}")
    dev = c.get("device_phases") or {}
    step = c["step_ms"]["median"] or 1.0
    print(f"  {'phase':<20}{'host ms':>10}{'device ms':>11}{'share':>8}")
    for p in ALL_PHASES:
        h = c["phases"][p]["median"]
        d = dev.get(p, {}).get("median") if p in PHASES else None
        print(f"  {p:<20}{h:>10.3f}{(f'{d:.3f}' if d is not None else '-'):>11}"
              f"{100 * h / step:>7.1f}%")
    dstep = (c.get("device_step_ms") or {}).get("median")
    print(f"  {'step':<20}{step:>10.3f}{(f'{dstep:.3f}' if dstep is not None else '-'):>11}")
    print("  graphs:", json.dumps(c.get("graphs")))
EOF

echo "== hook reports of the schedulers (server run directory under $WORK/basetemp)"
find "$WORK/basetemp" -name 'hooks-*.json' -print -exec "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
print("  installed:", len(r["installed"]), " missing:",
      [m["target"] for m in r["missing"] if not m["optional"]],
      " signature changed:", [c["target"] for c in r["signature_changed"]])
' {} \; 2>/dev/null || true

echo "== tests/test_sglang_gpu.py"
"$PY" -m pytest tests/test_sglang_gpu.py -m gpu -rA -v -s -p no:cacheprovider || status=$?
exit "$status"
