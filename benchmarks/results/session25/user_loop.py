"""Session 25 (for session 26): the graphs in a user's training loop rather than the benchmark's step.
A user keeps the step's output and loss bound until the next iteration reassigns them, and steps an
optimizer: the last block's output, held during the next forward, sends that block's forward the eager
way every step (``busy``), and its backward's saved inputs then leave graph memory. Per cell, 60 steps
of each loop on a fresh stack: the graph counts and the mean synced step per window of 10.

    python benchmarks/results/session25/user_loop.py
"""
import time

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed


def run(act, T, H, hold):
    torch.manual_seed(0)
    model = sizes.fuseops_dense(H, act).cuda().bfloat16()
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    rows = []
    out = loss = None
    for window in range(6):
        before = dict(graphed.counts)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            if hold:
                out = model(x)
                loss = out.float().square().mean()
            else:
                loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if not hold:
                del loss
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / 10 * 1e3
        d = {k: graphed.counts[k] - before[k] for k in ("captured", "recaptured", "kept", "dropped", "moved", "busy")}
        rows.append(f"  steps {window * 10:2d}-{window * 10 + 9}: {ms:.2f} ms  {d}")
    out = loss = None
    return rows


for act, T, H in (("gelu", 1024, 1024), ("swiglu", 1024, 2048)):
    for hold in (False, True):
        print(f"{act} T={T} H={H}, output {'held' if hold else 'let go'} between steps")
        print("\n".join(run(act, T, H, hold)))
print(graphed.counts, graphed.refusals)
