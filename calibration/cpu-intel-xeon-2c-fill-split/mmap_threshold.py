"""Does one large freed temporary (as the gathered KV fill makes) change a fragmented
request's time in a fresh process? (The guess: it raises glibc's mmap threshold, so later
per-step gathers come from the heap instead of fresh, page-faulted mappings.)

THP_MEM_ALLOC_ENABLE=1 python mmap_threshold.py fresh|trained 32768   # one arm per process
Measured 2026-12-07 at 31e89d2 (fill of the bank's pieces), twice each, alternating:
fresh 345 ms, trained 343 ms, fresh 339 ms, trained 359 ms (median request of 6 steps).
"""

import statistics as st
import sys

import torch

from pytest_specperf.engines.reference.config import get_config
from pytest_specperf.engines.reference.engine import Engine, GenRequest

torch.set_num_threads(1)
arm, ctx = sys.argv[1], int(sys.argv[2])
eng = Engine(get_config("tiny"), device="cpu")
if arm == "trained":
    x = torch.empty(int(34e6) // 4)
    x.fill_(1.0)
    del x  # one 34 MB temporary, freed
times = []
for b in range(8):
    eng.set_kv_layout("fragmented", 1.0, b)
    req = GenRequest(rid=f"b{b}", max_new_tokens=400, context_len=ctx, ignore_eos=True, seed=b,
                     max_decode_steps=6)  # fmt: skip
    times.append(eng.generate([req])[0].e2e_latency * 1e3)
print(f"{arm:8s} ctx={ctx}: request ms median {st.median(times[1:]):.0f}")
