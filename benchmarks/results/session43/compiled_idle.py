"""Session 43 probe (issue 20: fuseops under torch.compile >= torch.compile): where a compiled fuseops dense step
spends the GPU time its kernels do not. Calls 4 and 8 (``sizes.py``, rounds in alternating order in call 8) had the
compiled step 2.6-2.9 % slower than the eager one at GELU / SwiGLU T=16384 H=4096, while session 43's call 1
(``session42/compiled_gap.py``) summed the same kernel time a step for both (79.63 against 79.84 ms): so the GPU
idles, between kernels or before the first. Per variant, over profiled steps (alternating order): the kernels'
GPU time a step, the GPU's idle time between consecutive kernels within a step, the span from the first kernel's
start to the last one's end (a synchronised step's time less the span is the wait for its first kernel and after
its last), and the largest gaps with the kernels on either side.

    python benchmarks/results/session43/compiled_idle.py [--cells gelu:16384:4096 swiglu:4096:4096] [--rounds 2]
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.results.session42.compiled_gap import warm_eager_and_compiled


def idle(step, steps: int, top: int) -> tuple[float, float, float, list]:
    """Per step: GPU ms of kernels, idle ms between kernels, and the span; the largest gaps (us, before, after)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
            torch.cuda.synchronize()
    kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    # Steps are separated by a synchronisation: a gap over 2 ms between kernels is taken as the boundary.
    busy = gaps = span = 0.0
    largest = []
    start = kernels[0][0]
    end = kernels[0][1]
    for (s0, e0, n0), (s1, e1, n1) in zip(kernels, kernels[1:]):
        gap = s1 - max(e0, end)
        end = max(end, e0)
        if gap > 2000:
            span += end - start
            start = s1
            continue
        if gap > 0:
            gaps += gap
            largest.append((gap, n0[:60], n1[:60]))
    span += max(end, kernels[-1][1]) - start
    busy = sum(e - s for s, e, _ in kernels)
    largest.sort(reverse=True)
    return busy / steps / 1e3, gaps / steps / 1e3, span / steps / 1e3, largest[:top]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "swiglu:4096:4096"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=6)
    a = p.parse_args()
    for cell in a.cells:
        steps, (model, compiled_model, x) = warm_eager_and_compiled(cell)
        rows = collections.defaultdict(list)
        for r in range(a.rounds):
            for name in (list(steps) if r % 2 == 0 else list(reversed(steps))):
                rows[name].append(idle(steps[name], a.steps, a.top))
        print(f"\n== {cell}: per step, each round: kernels ms / idle between kernels ms / span ms")
        for name, runs in rows.items():
            print(f"   {name:9s} " + "; ".join(f"{b:.2f} / {g:.2f} / {s:.2f}" for b, g, s, _ in runs))
            for gap, before, after in runs[-1][3]:
                print(f"      gap {gap:8.1f} us  after {before}  before {after}")
        del model, compiled_model, x, steps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
