"""Session 39 probe (issue 20): GPU time per kernel of one dense-stack step (benchmarks.sizes' cells), fuseops
eager beside torch eager and torch.compile of the same model, after warm-up; torch.profiler, CUDA activity only.

    python benchmarks/results/session39/dense_kernels.py [--cells gelu:1024:2048 ...] [--top 14]
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.sizes import dense_cell, step_fn


def kernels(step, warmup: int, steps: int) -> dict[str, float]:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / steps
    return per


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:2048"])
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=14)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        for name, step in (("fuseops", step_fn(model, (x,), list(model.parameters()))),
                           ("torch", step_fn(reference, (x,), list(reference.parameters()))),
                           ("torch.compile", step_fn(torch.compile(reference), (x,), list(reference.parameters())))):
            per = kernels(step, a.warmup, a.steps)
            print(f"\n{cell} {name}: {sum(per.values()) / 1e3:.3f} ms of kernels a step, {len(per)} kinds")
            for k, us in sorted(per.items(), key=lambda kv: -kv[1])[:a.top]:
                print(f"  {us:8.1f} us  {k[:110]}")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
