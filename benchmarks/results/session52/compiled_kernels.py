"""Session 52 probe (issue 20): why fuseops under torch.compile runs slower on the GPU than fuseops eager where the
GPU is the bound (session 51, H100: GELU T=1024 H=4096 6.25 against 5.42 ms a step, SwiGLU 6.26 against 5.72).
GPU time per kernel of one dense-stack step, fuseops eager beside fuseops compiled and torch.compile, after warm-up
(torch.profiler, CUDA activity only); then the kernels whose time differs most between the two fuseops variants.
Session 40's ``compiled_kernels.py`` and session 42's ``compiled_gap.py`` asked the same at T=4096 / 16384 (the
materialised ``dy``'s NTT cuBLAS kernels; session 43: kernel times move 2-16 % between rounds); this one adds
torch.compile's kernels beside them at T=1024.

    python benchmarks/results/session52/compiled_kernels.py [--cells gelu:1024:4096 ...] [--top 12]
"""
import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.sizes import dense_cell, step_fn


def kernels(step, warmup: int, steps: int) -> tuple[dict[str, float], dict[str, int]]:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / steps
            count[e.name] += 1
    return per, {k: v // steps for k, v in count.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:4096", "swiglu:1024:4096"])
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        got = {}
        for name, step in (("fuseops", step_fn(model, (x,), list(model.parameters()))),
                           ("fuseops compiled", step_fn(torch.compile(model), (x,), list(model.parameters()))),
                           ("torch.compile", step_fn(torch.compile(reference), (x,), list(reference.parameters())))):
            per, count = kernels(step, a.warmup, a.steps)
            got[name] = per, count
            print(f"\n{cell} {name}: {sum(per.values()) / 1e3:.3f} ms of kernels a step, "
                  f"{sum(count.values())} launches, {len(per)} kinds", flush=True)
            for k, us in sorted(per.items(), key=lambda kv: -kv[1])[:a.top]:
                print(f"  {us:8.1f} us x{count[k]:<3d} {k[:120]}")
        (eager, ce), (compiled, cc) = got["fuseops"], got["fuseops compiled"]
        print(f"\n{cell}: kernels differing between fuseops eager and compiled (us a step, launches)")
        diff = {k: compiled.get(k, 0.0) - eager.get(k, 0.0) for k in {*eager, *compiled}}
        for k, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:a.top]:
            print(f"  {d:+8.1f} us  eager {eager.get(k, 0.0):7.1f} x{ce.get(k, 0):<3d} compiled "
                  f"{compiled.get(k, 0.0):7.1f} x{cc.get(k, 0):<3d} {k[:100]}")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
