"""Session 24: each recorded program's graph state after warm-up (phase, pinned / copied / unsettled
slots, captures), then a cProfile of 30 steps (top by own time): the dense GELU stack, T=1024 H=1024
(or ``act T H`` from the command line, without the profile)."""
import cProfile
import gc
import pstats
import sys
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed

torch.manual_seed(0)
act, T, H = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 1 else ("gelu", 1024, 1024)
m = sizes.fuseops_dense(H, act).cuda().bfloat16()
x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
step = sizes.step_fn(m, (x,), list(m.parameters()))
for _ in range(40):
    step()
torch.cuda.synchronize()
for g in gc.get_objects():
    if isinstance(g, graphed.GraphedProgram):
        samples = [(round(h * 1e6), round(s * 1e6)) for h, s in g.eager_samples]
        print(g.phase, "eager (host us, GPU us)", samples, "captures", g.captures, "pinned", [s for s, _ in g.pinned], "copied", sorted(g.buffers),
              "unsettled", sorted(g.unsettled), "results", [e[0][0] for e in g.plan])
print(graphed.counts)
if len(sys.argv) > 1:
    sys.exit()
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
