"""Where the GPU time of a GPU-bound dense cell goes (issue 20: cells at 0.96-0.98x the faster
torch in session 23's sizes table): the CUDA kernels of fuseops eager and of torch.compile of
the same torch model, per fwd+bwd step, summed by kernel name, from ``torch.profiler``.

    python benchmarks/results/session23/kernel_profile.py [--cells gelu:16384:4096 ...] [--steps 5]
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import sizes


def kernel_us(step, steps):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_name = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += e.device_time / steps
            by_name[e.name][1] += 1
    return by_name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="*", default=["gelu:16384:4096", "swiglu:16384:4096", "gelu:4096:4096"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=14)
    a = ap.parse_args()
    for cell in a.cells:
        m, ref, x = sizes.dense_cell(cell)
        for name, model in (("fuseops", m), ("torch.compile", torch.compile(ref))):
            step = sizes.step_fn(model, (x,), list(model.parameters()))
            table = kernel_us(step, a.steps)
            total = sum(v[0] for v in table.values())
            print(f"== {cell} {name}: {total / 1e3:.2f} ms of kernels a step ({sum(v[1] for v in table.values()) // a.steps} launches)")
            for k, (us, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:a.top]:
                print(f"  {us:9.1f} us {n // a.steps:3d}x  {k[:110]}")


if __name__ == "__main__":
    main()
