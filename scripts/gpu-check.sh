#!/usr/bin/env bash
# gpu-check.sh: the reference engine on a CUDA GPU with telemetry, phase table, busy share,
# KV-read bandwidth and the bottleneck verdict. Budget: under 8 minutes on one GPU.
#
# Needs: a CUDA GPU, torch with CUDA, pytest and pyyaml (nvidia-ml-py for telemetry; without
# it the report says "telemetry unavailable: ..."). No internet, no install needed: it runs
# from the repository root with the package on PYTHONPATH if it is not installed.
#
# Steps (each with a timeout):
#   1. device identity (NVML matched to the CUDA order), peak bandwidth;
#   2. long-context decode at 32768 and 46000 tokens, contiguous and fragmented KV, plus
#      the CUDA-graph replay test, medium config (about 1B parameters), recording
#      baselines into a temporary directory;
#   3. the same cases again against those baselines with a canary host stall, which must
#      fail naming `unaccounted` and show the host-bound verdict;
#   4. a table per case from the JSON report: host/device ms per phase, busy share,
#      bandwidth, graph replays, bottleneck.
# Environment: PYTHON (default python), CONFIG (default medium), OUT (where to keep reports).
#
# STATUS: written on a machine without a GPU; it has not run on a GPU yet (the session that
# wrote it was not lent one). Its CPU-testable parts (plugin, telemetry-absent path,
# host-stall canary, reports) are covered by tests/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
CONFIG=${CONFIG:-medium}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
T0=$(date +%s)

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing to check"
  exit 2
fi
PLUGIN=()
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.name == 'specperf' for e in m.entry_points(group='pytest11')) else 1)"; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  PLUGIN=(-p pytest_specperf.plugin)   # not installed: load the plugin from the checkout
fi

echo "== 1. device"
timeout 60 "$PY" - <<'PY'
from pytest_specperf.telemetry import detect_device, peak_bandwidth
d = detect_device()
print(f"device: {d.name} (slug {d.slug}), {d.count} x, memory {d.memory_bytes}, driver {d.driver}, "
      f"cc {d.compute_capability}, nvml index {d.nvml_index}, uuid {d.uuid}")
pb = peak_bandwidth(d.name, d.nvml_index)
print("peak bandwidth:", pb.describe() if pb else "unknown")
for n in d.notes:
    print("note:", n)
PY

COMMON=(perf_tests "${PLUGIN[@]}" -p no:cacheprovider -k "(test_decode and (32768 or 46000)) or test_cuda_graph_replay"
        --specperf-baselines "$OUT/baselines" --specperf-model "$CONFIG" --specperf-steps 32)
echo "== 2. record baselines ($CONFIG config)"
timeout 240 "$PY" -m pytest "${COMMON[@]}" --specperf-update-baselines --specperf-json "$OUT/record.json" -rs
echo "exit: $?"
echo "== 3. canary host stall against those baselines (must FAIL naming unaccounted)"
timeout 150 "$PY" -m pytest "${COMMON[@]}" -k "test_decode and 46000" --specperf-inject host_stall=2 \
  --specperf-json "$OUT/stall.json" 2>&1 | grep -E "unaccounted|where the time went|bottleneck:|passed|failed" | head -20
echo "== 4. per-case figures"
timeout 60 "$PY" - "$OUT/record.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("device:", r["device"]["name"], "| server:", r["server"]["fingerprint"].get("config"),
      "| cuda graphs:", r["server"]["fingerprint"].get("cuda_graphs"))
for c in r["cases"]:
    print(f"\n{c['test'].rsplit('::', 1)[-1]} {c['key']}: step {c['step_ms']['median']:.3f} ms, "
          f"accept {c['accept_len']['mean']:.2f}, kv fragmentation {c['kv_fragmentation']}")
    dev = c.get("device_phases") or {}
    print(f"  {'phase':20s} {'host ms':>9s} {'device ms':>10s}")
    for p, s in c["phases"].items():
        d = dev.get(p, {}).get("median_ms")
        print(f"  {p:20s} {s['median_ms']:9.3f} {d if d is None else format(d, '10.3f')}")
    b = c.get("bottleneck") or {}
    print("  bottleneck:", b.get("describe"))
    f = b.get("figures", {})
    if "device_busy_share" in f:
        print(f"  device busy share {f['device_busy_share']:.1%}")
    if "kv_read_bytes_per_s" in f:
        print(f"  KV-read bandwidth {f['kv_read_bytes_per_s'] / 1e9:.1f} GB/s"
              + (f" ({f['bandwidth_share']:.0%} of peak)" if "bandwidth_share" in f else ""))
    print("  graphs:", c["graphs"])
    t = c.get("telemetry")
    if t:
        print("  telemetry:", "available" if t.get("available") else t.get("reason"))
PY
echo "== done in $(( $(date +%s) - T0 )) s; reports in $OUT"
