"""Session 28: call 2 timed our launchers at 1.05 ms (Qwen3) and 1.88 ms (OLMoE) of host time in a
compiled MoE step at T=1024 (seven calls each; torch.compile's whole step enqueues in 1.38-1.87 ms).
Each launcher call of one compiled step (recorded with its arguments) is repeated on its own
while the GPU sleeps, so that no launch waits: host microseconds per call in full, with our
``launch`` returning at once (the launcher's Python alone), and torch's ``empty`` + ``mm`` of the
first output's shape for scale.

    python benchmarks/results/session28/launcher_costs.py [qwen3|olmoe] [T]
"""
import functools
import statistics
import sys
import time

import torch

from benchmarks import sizes
from fuseops.kernels import dispatch
from fuseops.kernels import launch as fast_launch

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
E, H, F, K = sizes.MOE_SHAPES[shape]
torch.manual_seed(0)
model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
args = sizes.moe_args(T, E, H, K)
params = list(model.parameters())
step = sizes.step_fn(torch.compile(model), args, params)
for _ in range(30):
    step()
torch.cuda.synchronize()

calls = []
real = dispatch._callable


def recorder(kernel, backend):
    run = real(kernel, backend)

    def call(*a, **kw):
        calls.append((kernel.name, run, a, kw))
        return run(*a, **kw)
    return call


dispatch._callable = functools.cache(recorder)
dispatch._SERVING.clear()
step()
torch.cuda.synchronize()
dispatch._callable = real


def host_us(run, a, kw, n=60):
    times = []
    for _ in range(5):
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time: every launch below queues
        start = time.perf_counter()
        for _ in range(n):
            run(*a, **kw)
        times.append((time.perf_counter() - start) * 1e6 / n)
        torch.cuda.synchronize()
    return statistics.median(times)


print(f"{shape} T={T}: host us per call (median of 5 batches of 60, the GPU asleep)")
print(f"{'kernel':<28} {'full':>8} {'python':>8} {'launch':>8}")
total = [0.0, 0.0]
for name, run, a, kw in calls:
    full = host_us(run, a, kw)
    fast_launch.recording = lambda *x: None
    try:
        python = host_us(run, a, kw)
    finally:
        fast_launch.recording = None
    total[0] += full
    total[1] += python
    print(f"{name:<28} {full:8.1f} {python:8.1f} {full - python:8.1f}")
print(f"{'total':<28} {total[0]:8.1f} {total[1]:8.1f} {total[0] - total[1]:8.1f}")
x = args[0]
w = torch.randn(H, 2 * F, device="cuda", dtype=torch.bfloat16)
xs = torch.randn(T * K, H, device="cuda", dtype=torch.bfloat16)
print(f"torch.empty x2 {host_us(lambda: (torch.empty(T * K, F, device='cuda', dtype=x.dtype), torch.empty(T * K, 2 * F, device='cuda', dtype=x.dtype)), (), {}):.1f}, "
      f"torch.mm {host_us(torch.mm, (xs, w), {}):.1f}, "
      f"torch._grouped_mm-free add {host_us(torch.add, (xs, xs), {}):.1f}")

def timed(fn, spent, slot):
    """``fn``, its seconds added to ``spent[slot]``."""
    def call(*x):
        t0 = time.perf_counter()
        try:
            return fn(*x)
        finally:
            spent[slot] += time.perf_counter() - t0
    return call


# Inside our ``launch``: which path each call takes (fast / Triton's), and how much of the launch is
# the stored entry's call (the C launcher, behind the descriptor expansion where there is one).
print(f"\n{'kernel':<28} {'fast':>5} {'triton':>6} {'entry us':>9} {'C us':>7} {'entry kind'}")
for name, run, a, kw in calls:
    fast_launch.CHECK = True
    before = dict(fast_launch.counts)
    run(*a, **kw)
    fast_launch.CHECK = False
    for state in fast_launch._kernels.values():
        for entry in state.entries.values():
            if entry.call.__class__ is fast_launch.DescriptorLaunch:
                entry.call.verify = False  # _check turned it on
    paths = {k: fast_launch.counts[k] - before[k] for k in before}
    spent = {"entry": 0.0, "raw": 0.0}
    wrapped = []
    for state in fast_launch._kernels.values():
        for entry in state.entries.values():
            inner = entry.call
            wrapped.append((entry, inner))
            entry.call = timed(inner, spent, "entry")
            if inner.__class__ is fast_launch.DescriptorLaunch:
                wrapped.append((inner, inner.raw))
                inner.raw = timed(inner.raw, spent, "raw")
    n = 60
    torch.cuda._sleep(50_000_000)
    for _ in range(n):
        run(*a, **kw)
    torch.cuda.synchronize()
    for owner, original in wrapped:
        if owner.__class__ is fast_launch.DescriptorLaunch:
            owner.raw = original
        else:
            owner.call = original
    kinds = {type(e.call).__name__ for s in fast_launch._kernels.values() for e in s.entries.values()}
    print(f"{name:<28} {paths['fast']:5d} {paths['triton']:6d} {spent['entry'] * 1e6 / n:9.1f} "
          f"{spent['raw'] * 1e6 / n:7.1f}")
print("entry kinds:", kinds)
