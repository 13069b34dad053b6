"""Session 24: each recorded program's graph state after warm-up (phase, pinned / copied / unsettled
slots, captures), then a cProfile of 30 steps (top by own time): the dense GELU stack, T=1024 H=1024."""
import cProfile
import gc
import pstats
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed

torch.manual_seed(0)
m = sizes.fuseops_dense(1024, "gelu").cuda().bfloat16()
x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
step = sizes.step_fn(m, (x,), list(m.parameters()))
for _ in range(40):
    step()
torch.cuda.synchronize()
for g in gc.get_objects():
    if isinstance(g, graphed.GraphedProgram):
        print(g.phase, "captures", g.captures, "pinned", [s for s, _ in g.pinned], "copied", sorted(g.buffers),
              "unsettled", sorted(g.unsettled), "results", [e[0][0] for e in g.plan])
print(graphed.counts)
t0 = time.perf_counter()
for _ in range(30):
    step()
print(f"enqueue {(time.perf_counter() - t0) / 30 * 1e3:.2f} ms a step")
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(30):
    step()
prof.disable()
torch.cuda.synchronize()
print(graphed.counts)
pstats.Stats(prof).sort_stats("tottime").print_stats(28)
