"""Idle GPU time inside a GPU-bound dense step (issue 20: GELU T=16384 H=4096 ran 81.4 ms a step
against 77.2 ms of kernels in call 6; torch.compile 78.3 against 76.7): one profiled step of
fuseops eager and of torch.compile, kernels in start order, the largest gaps between one
kernel's end and the next one's start with the kernels around them, and the CUDA runtime
calls that wait or allocate (synchronize, malloc, free, host alloc, memcpy) with their time.

    python benchmarks/results/session23/gaps.py [--cell gelu:16384:4096] [--top 8]
"""
import argparse
import itertools
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import sizes

WAITS = ("Synchronize", "Malloc", "Free", "HostAlloc", "Memcpy", "EventSynchronize", "StreamWait")


def profile_step(step, warmup=3):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return prof.events()


def report(name, events, top):
    kernels = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    busy = sum(e.time_range.end - e.time_range.start for e in kernels)
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    gaps = []
    for a, b in itertools.pairwise(kernels):
        gaps.append((b.time_range.start - a.time_range.end, a.name[:50], b.name[:50], a.time_range.end - kernels[0].time_range.start))
    print(f"== {name}: {len(kernels)} kernels, span {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, "
          f"idle {(span - busy) / 1e3:.2f} ms")
    for gap, a, b, at in sorted(gaps, reverse=True)[:top]:
        print(f"  gap {gap:8.1f} us at {at / 1e3:7.2f} ms  after {a}  before {b}")
    calls = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and any(w in e.name for w in WAITS):
            calls[e.name][0] += 1
            calls[e.name][1] += e.time_range.end - e.time_range.start
    for k, (n, us) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"  host {k[:60]:60s} {n:4d}x {us:9.1f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="gelu:16384:4096")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    m, ref, x = sizes.dense_cell(a.cell)
    for name, model in (("fuseops", m), ("torch.compile", torch.compile(ref)), ("torch eager", ref)):
        step = sizes.step_fn(model, (x,), list(model.parameters()))
        report(name, profile_step(step), a.top)
        print(f"  step {sizes.time_ms(step, 'cuda', 10):.2f} ms (synchronised, median of 10)")


if __name__ == "__main__":
    main()
