"""Session 45 probe (issue 20, the GPU-bound dense cells at 0.98-1.0x torch): the GPU time a step spends in each
kernel, fuseops eager against torch eager and torch.compile of the same stack, so that the cells' remaining gap
can be put on kernels (the dense dispatch's table, the backward's GEMMs and reductions), on the GPU's idle time
between a step's kernels (its largest gaps, with the kernels either side) or on the wait before the first kernel
(``step_start.py``). It is session 39's ``dense_kernels.py`` (per-kernel sums, one pass a variant) with rounds in
alternating order and the idle time between kernels, which needs each kernel's start and end, not only the sums.

    python benchmarks/results/session45/kernel_sums.py --cells gelu:4096:4096 [--steps 3]
"""
import argparse
import collections
import re

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.results.session45.step_start import warm_steps


def short(name: str) -> str:
    """A kernel's name without its template arguments and launch suffixes."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"^void ", "", name)
    return name[:60]


def gaps_within(kernels: list[tuple[float, float, str]], steps: int) -> tuple[float, list]:
    """The GPU's idle ms a step between a step's kernels (not before its first), and the largest gaps
    (us, kernel before, kernel after) over all steps."""
    per_step = len(kernels) // steps
    idle, largest = 0.0, []
    for i in range(steps):
        step = kernels[i * per_step:(i + 1) * per_step]
        end = step[0][1]
        for (s0, e0, n0), (s1, e1, n1) in zip(step, step[1:]):
            end = max(end, e0)
            if s1 > end:
                idle += s1 - end
                largest.append((s1 - end, short(n0)[:40], short(n1)[:40]))
    return idle / 1e3 / steps, sorted(largest, reverse=True)[:10]


def kernel_ms(step, steps: int) -> tuple[dict[str, float], dict[str, int], float, float, list]:
    """Per step: GPU ms by kernel name, launches by name, the summed kernel ms, the idle ms between the
    step's kernels, and the largest of those gaps."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ms: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    for start, end, name in kernels:
        ms[short(name)] += (end - start) / 1e3 / steps
        calls[short(name)] += 1
    idle, largest = gaps_within(kernels, steps)
    return ms, {k: v // steps for k, v in calls.items()}, sum(ms.values()), idle, largest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:4096"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    for cell in a.cells:
        steps = warm_steps(cell, ("fuseops", "torch", "torch_compiled"))
        totals, idles = collections.defaultdict(list), collections.defaultdict(list)
        last = {}
        for r in range(a.rounds):
            for name in (list(steps) if r % 2 == 0 else list(reversed(steps))):
                ms, calls, total, idle, largest = kernel_ms(steps[name], a.steps)
                totals[name].append(total)
                idles[name].append(idle)
                last[name] = (ms, calls, largest)
        print(f"\n== {cell}: summed kernel ms a step, each round: "
              + "; ".join(f"{n} " + " / ".join(f"{t:.2f}" for t in ts) for n, ts in totals.items()))
        print("   idle ms between a step's kernels, each round: "
              + "; ".join(f"{n} " + " / ".join(f"{t:.2f}" for t in ts) for n, ts in idles.items()))
        for name, (ms, calls, largest) in last.items():
            print(f"   {name} (last round): ms a step, launches, kernel")
            for k, v in sorted(ms.items(), key=lambda kv: -kv[1]):
                print(f"      {v:8.3f} {calls[k]:4d}  {k}")
            print(f"   {name} (last round): largest gaps between a step's kernels (us, before, after)")
            for gap, before, after in largest[:a.top]:
                print(f"      {gap:8.1f}  {before}  ->  {after}")
        del steps
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
