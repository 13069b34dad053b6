"""Session 25 (for session 26): idle GPU time inside a graphed host-bound dense step (GELU T=4096 H=1024:
2.51 ms a step against 1.71 ms of our kernels, call 9): session 23's gaps.py (its ``report``) after
``--warmup`` steps (40: every program's graph decided), fuseops with its graphs against torch eager and
torch.compile, and the head start: the first kernel's start after the step's first host event.

    python benchmarks/results/session25/graph_gaps.py [--cell gelu:4096:1024] [--top 10] [--warmup 40]
"""
import argparse

import torch

from benchmarks import sizes
from benchmarks.results.session23.gaps import profile_step, report
from fuseops.ops.executor import graphed


def head_start_ms(events):
    first = {kind: min(e.time_range.start for e in events if e.device_type == kind)
             for kind in (torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA)}
    return (first[torch.autograd.DeviceType.CUDA] - first[torch.autograd.DeviceType.CPU]) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="gelu:4096:1024")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=40)
    a = ap.parse_args()
    m, ref, x = sizes.dense_cell(a.cell)
    for name, model in (("fuseops", m), ("torch.compile", torch.compile(ref)), ("torch eager", ref)):
        step = sizes.step_fn(model, (x,), list(model.parameters()))
        events = profile_step(step, a.warmup)
        report(name, events, a.top)
        print(f"  first kernel {head_start_ms(events):.3f} ms after the step's first host event")
        print(f"  step {sizes.time_ms(step, 'cuda', 10):.2f} ms (synchronised, median of 10)")
    print(graphed.counts)


if __name__ == "__main__":
    main()
