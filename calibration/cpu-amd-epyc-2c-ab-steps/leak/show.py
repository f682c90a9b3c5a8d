"""Per report in /work/calib-raw/leak: the phases' centers B against A, and verify/rest as
judged. `python show.py | sort > leak.txt`."""

import glob
import json
from pathlib import Path

PARTS = ("verify", "draft", "accept", "kv_commit", "unaccounted", "schedule", "step")

for f in sorted(glob.glob("/work/calib-raw/leak/*.json")):
    d = json.loads(Path(f).read_text())
    for c in d["cases"]:
        b, n = c["centers"]["base"], c["centers"]["now"]
        verify = {m["metric"]: m for m in c["metrics"]}.get("verify", {})
        moved = " ".join(f"{p[:6]} {100 * (n[p] / b[p] - 1):+.1f}%" for p in PARTS if b.get(p))
        print(Path(f).name[:6], moved, f"| verify/rest {100 * (verify.get('change') or 0):+.2f}%")
