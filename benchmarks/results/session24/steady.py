"""Session 24: the host-bound dense cells in steady state (after 40 warm-up steps, so every program's
graph decision is made), CUDA graphs on and off and torch eager, interleaved rounds in one process;
each variant's fastest round of 20 steps."""
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed


def timed(step, n=20):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    enq = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3, enq * 1e3


torch.manual_seed(0)
for act, T, H in (("gelu", 1024, 1024), ("swiglu", 1024, 1024), ("gelu", 4096, 1024), ("swiglu", 1024, 2048)):
    m = sizes.fuseops_dense(H, act).cuda().bfloat16()
    tm = sizes.torch_dense(m).cuda().bfloat16()
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step, tstep = sizes.step_fn(m, (x,), list(m.parameters())), sizes.step_fn(tm, (x,), list(tm.parameters()))
    graphed.ENABLED = True
    for _ in range(40):
        step()
    best = {}
    warm = dict(graphed.counts)
    for _ in range(3):
        for name, on, fn in (("graphs", True, step), ("no graphs", False, step), ("torch", None, tstep)):
            if on is not None:
                graphed.ENABLED = on
            ms, enq = timed(fn)
            if name not in best or ms < best[name][0]:
                best[name] = (ms, enq)
    g, n, t = best["graphs"], best["no graphs"], best["torch"]
    print(f"{act} T={T} H={H}: graphs {g[0]:.2f} ms (enq {g[1]:.2f}), no graphs {n[0]:.2f} ({n[1]:.2f}), "
          f"torch {t[0]:.2f} ({t[1]:.2f}); x torch {t[0] / g[0]:.2f} / {t[0] / n[0]:.2f}; during the rounds "
          f"{ {k: graphed.counts[k] - warm[k] for k in warm} }")
    graphed.ENABLED = True
print(graphed.counts, graphed.refusals)
