"""Session 25 (for session 26): idle GPU time inside a graphed host-bound dense step (GELU T=4096 H=1024:
2.51 ms a step against 1.71 ms of our kernels, call 9): session 23's gaps.py after ``--warmup`` steps
(40: every program's graph decided), fuseops with its graphs against torch eager and torch.compile; the
first kernel's start against the step's start on the host is printed too (the head start).

    python benchmarks/results/session25/graph_gaps.py [--cell gelu:4096:1024] [--top 10] [--warmup 40]
"""
import argparse
import itertools
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import sizes
from fuseops.ops.executor import graphed

WAITS = ("Synchronize", "Malloc", "Free", "HostAlloc", "Memcpy", "EventSynchronize", "StreamWait")


def profile_step(step, warmup):
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
    host_start = min(e.time_range.start for e in events if e.device_type == torch.autograd.DeviceType.CPU)
    print(f"== {name}: {len(kernels)} kernels, span {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, "
          f"idle {(span - busy) / 1e3:.2f} ms")
    print(f"  first kernel {(kernels[0].time_range.start - host_start) / 1e3:.3f} ms after the step's first host event")
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
    ap.add_argument("--cell", default="gelu:4096:1024")
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    act, T, H = a.cell.split(":")
    T, H = int(T), int(H)
    torch.manual_seed(0)
    m = sizes.fuseops_dense(H, act).to("cuda", torch.bfloat16)
    ref = sizes.torch_dense(m).to("cuda", torch.bfloat16)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for name, model in (("fuseops", m), ("torch.compile", torch.compile(ref)), ("torch eager", ref)):
        step = sizes.step_fn(model, (x,), list(model.parameters()))
        report(name, profile_step(step, a.warmup), a.top)
        print(f"  step {sizes.time_ms(step, 'cuda', 10):.2f} ms (synchronised, median of 10)")
    print(graphed.counts)


if __name__ == "__main__":
    main()
