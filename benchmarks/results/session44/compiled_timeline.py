"""Session 44 probe (issue 20: fuseops under torch.compile >= torch.compile): where a compiled fuseops step loses
to the eager one at a cell whose programs all replay as CUDA graphs in both (call 2: GELU T=4096 H=1024, a step
2.72 ms compiled against 1.78 eager; drained issue time 2.05 against 1.10 ms, busy 1.90 / 1.35). Per variant,
one profiled synchronised step (CPU and CUDA activities, after 30 warm-up steps and alternating order): the host
calls that launch or copy (kernel launches only where over 50 us), each kernel's GPU start and end, and the GPU's
idle gaps, all from the start of the step's first kernel (the latest "step" mark is the profiler's GPU-side one:
host calls before the first kernel are left out); the Chrome traces go to $OUT for a closer look.

    python benchmarks/results/session44/compiled_timeline.py [--cells gelu:4096:1024] [--steps 2]
"""
import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.results.session42.compiled_gap import warm_eager_and_compiled

KERNEL_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")
LAUNCHES = (*KERNEL_LAUNCHES, "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize",
            "cudaDeviceSynchronize", "cudaEventSynchronize")


def timeline(step, name: str, cell: str, steps: int) -> None:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with torch.profiler.record_function("step"):
                step()
            torch.cuda.synchronize()
    out = os.environ.get("OUT")
    if out:
        prof.export_chrome_trace(f"{out}/{name}_{cell.replace(':', '_')}.json")
    events = prof.events()
    marks = sorted(e.time_range.start for e in events if e.name == "step")
    start = marks[-1]  # the last step
    host = sorted((e.time_range.start - start, e.time_range.end - e.time_range.start, e.name) for e in events
                  if e.device_type == torch.autograd.DeviceType.CPU and e.name in LAUNCHES and e.time_range.start >= start)
    gpu = sorted((e.time_range.start - start, e.time_range.end - start, e.name) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.start >= start)
    print(f"\n== {cell} {name}: last step, us from its start")
    counts = {}
    for t, d, n in host:
        counts[n] = counts.get(n, 0) + 1
    print("   host calls:", counts)
    for t, d, n in host:
        if n not in KERNEL_LAUNCHES or d > 50:
            print(f"   host {t:8.1f} +{d:7.1f}  {n}")
    print(f"   GPU first kernel at {gpu[0][0]:.1f}, last ends {max(e for _, e, _ in gpu):.1f}; {len(gpu)} kernels")
    end = gpu[0][1]
    for s, e, n in gpu[1:]:
        if s - end > 20:
            print(f"   GPU idle {end:8.1f} .. {s:8.1f} ({s - end:6.1f}) before {n[:70]}")
        end = max(end, e)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:1024"])
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    for cell in a.cells:
        steps, (model, compiled_model, x) = warm_eager_and_compiled(cell)
        for r, name in enumerate(["eager", "compiled", "compiled", "eager"]):
            timeline(steps[name], f"{name}{r}", cell, a.steps)
        del model, compiled_model, x, steps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
