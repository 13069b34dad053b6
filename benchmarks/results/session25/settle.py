"""Session 25: how fast the graph decisions settle, with nothing toggled: a fresh dense stack per
cell, 60 training steps, the graph counts and the mean synced step time per window of 10 steps."""
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed

KEYS = ("captured", "kept", "dropped", "moved", "busy")


def windows(step, count: int, keys=KEYS) -> list[str]:
    """``count`` windows of 10 synced steps: each one's mean step and graph counts' change."""
    rows = []
    for window in range(count):
        before = dict(graphed.counts)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 10 * 1e3
        d = {k: graphed.counts.get(k, 0) - before.get(k, 0) for k in keys}
        rows.append(f"  steps {window * 10:2d}-{window * 10 + 9}: {ms:.2f} ms  {d}")
    return rows


if __name__ == "__main__":
    torch.manual_seed(0)
    for act, T, H in (("gelu", 1024, 1024), ("swiglu", 1024, 1024), ("gelu", 4096, 1024), ("swiglu", 1024, 2048)):
        m = sizes.fuseops_dense(H, act).cuda().bfloat16()
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        print(f"{act} T={T} H={H}")
        print("\n".join(windows(sizes.step_fn(m, (x,), list(m.parameters())), 6)))
    print(graphed.counts, graphed.refusals)
