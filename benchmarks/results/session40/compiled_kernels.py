"""Session 40 probe (issue 20): why a compiled fuseops step is slower than an eager one even where the GPU bounds
the step (call 7: GELU H=4096 T=4096 21.21 against 20.92 ms; SwiGLU H=2048 T=1024 2.42 against 1.82). GPU time per
kernel of one dense-stack step, fuseops eager against fuseops under torch.compile (the model as benchmarks.sizes
builds and compiles it), after warm-up; then the kernels whose time differs most between the two, and the step's
wall time with the device drained (host) for each.

    python benchmarks/results/session40/compiled_kernels.py [--cells gelu:4096:4096 ...] [--top 12]
"""
import argparse
import time

import torch

from benchmarks._timing import cuda_kernel_times
from benchmarks.sizes import dense_cell, step_fn


def kernels(step, warmup: int, steps: int) -> tuple[dict[str, float], dict[str, int]]:
    for _ in range(warmup):
        step()
    return cuda_kernel_times(step, steps)


def wall(step, steps: int = 20) -> float:
    """ms a step, the device drained before each (what the host alone costs, when it bounds)."""
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:4096", "swiglu:2048:1024", "gelu:1024:4096"])
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args()
    for cell in a.cells:
        model, _, x = dense_cell(cell)
        params = list(model.parameters())
        runs = {}
        for name, step in (("eager", step_fn(model, (x,), params)), ("compiled", step_fn(torch.compile(model), (x,), params))):
            per, count = kernels(step, a.warmup, a.steps)
            runs[name] = per, count
            print(f"\n{cell} fuseops {name}: {sum(per.values()) / 1e3:.3f} ms of kernels a step, {sum(count.values())} "
                  f"launches of {len(per)} kinds; issue with the device drained {wall(step):.2f} ms", flush=True)
            for k, us in sorted(per.items(), key=lambda kv: -kv[1])[:a.top]:
                print(f"  {us:8.1f} us x{count[k]:3d}  {k[:110]}")
        (pe, ce), (pc, cc) = runs["eager"], runs["compiled"]
        print(f"\n{cell}: kernels whose time differs most (compiled - eager, us a step)")
        for k in sorted(set(pe) | set(pc), key=lambda k: -abs(pc.get(k, 0) - pe.get(k, 0)))[:a.top]:
            print(f"  {pc.get(k, 0) - pe.get(k, 0):+8.1f} us  eager {pe.get(k, 0):7.1f} x{ce.get(k, 0):3d}  compiled "
                  f"{pc.get(k, 0):7.1f} x{cc.get(k, 0):3d}  {k[:90]}")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
