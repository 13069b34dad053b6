"""Session 24: which programs of the dense stack a CUDA graph replays, and why not (graphed.refusals),
with the step's enqueue and GPU time, graphs on and off in one process."""
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed

torch.manual_seed(0)
for act, T, H in (("gelu", 1024, 1024), ("swiglu", 4096, 1024)):
    m = sizes.fuseops_dense(H, act).cuda().bfloat16()
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step = sizes.step_fn(m, (x,), list(m.parameters()))
    for on in (True, False, True):
        graphed.ENABLED = on
        for _ in range(12):
            step()
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        enq = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / 20
        print(f"{act} T={T} H={H} graphs={on}: enqueue {enq * 1e3:.2f} ms, step {total * 1e3:.2f} ms")
    print(graphed.counts, graphed.refusals)
