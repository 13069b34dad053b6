"""Session 29: the 4-block dense stack (GELU, H=1024, T=1024, bf16) eager and compiled (its
Sequentials as two custom operators each, fuseops/compiled_sequential.py): synced step time,
enqueue time, and what the CUDA-graph states did in each phase (captures, replays, moves)."""
import sys
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed, replay

act, T, H = (sys.argv[1:4] if len(sys.argv) > 3 else ("gelu", 1024, 1024))
model, _, x = sizes.dense_cell(f"{act}:{T}:{H}")
params = list(model.parameters())
compiled = torch.compile(model)


def step(m):
    for p in params:
        p.grad = None
    m(x).sum().backward()


for name, m in (("eager", model), ("compiled", compiled), ("eager", model), ("compiled", compiled)):
    for _ in range(30):
        step(m)
    torch.cuda.synchronize()
    before, replays = dict(graphed.counts), replay.counts["replayed"]
    times, enqueue = [], []
    for _ in range(20):
        t0 = time.perf_counter()
        step(m)
        enqueue.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    changed = {k: v - before[k] for k, v in graphed.counts.items() if v != before[k]}
    print(f"{name:9s} step {sorted(times)[10] * 1e3:.2f} ms, enqueue {sorted(enqueue)[10] * 1e3:.2f} ms, "
          f"program replays {replay.counts['replayed'] - replays}, graph states {changed}")
print("refusals", graphed.refusals)
