"""Session 24: where the host time of a dense step goes once its programs replay as CUDA graphs
(cProfile, 30 steps of the 4-block GELU stack, T=1024 H=1024, bf16, after warm-up)."""
import time

import torch

from benchmarks import sizes
from benchmarks._timing import profile_table, profiled
from fuseops.ops.executor import graphed

torch.manual_seed(0)
m = sizes.fuseops_dense(1024, "gelu").cuda().bfloat16()
x = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
step = sizes.step_fn(m, (x,), list(m.parameters()))
for _ in range(15):
    step()
    torch.cuda.synchronize()
print(graphed.counts, graphed.refusals)
t0 = time.perf_counter()
for _ in range(30):
    step()
print(f"enqueue {(time.perf_counter() - t0) / 30 * 1e3:.2f} ms a step")
torch.cuda.synchronize()
prof = profiled(step, 30)
torch.cuda.synchronize()
print(profile_table(prof, "tottime", 35))
print(profile_table(prof, "cumulative", 45))
