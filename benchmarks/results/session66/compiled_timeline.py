"""Session 66 probe for session 67 (issue 20, compiled >= torch.compile): where a compiled fuseops step loses the
time that its GPU kernels do not (call 2: eager and compiled launch the same work within 2 % at the cells where
compiled ran 5-12 % behind). Each variant (fuseops eager, fuseops compiled, torch eager, torch.compile) runs until
its graph states settle, then ``--steps`` steps under torch.profiler (CPU and CUDA); per step it prints the wall
span (first kernel start to last kernel end), the GPU busy time (the union of kernel and copy intervals), the idle
time between them and the longest idle gaps, with the host op running at each gap's start.

    python benchmarks/results/session66/compiled_timeline.py --cells swiglu:16384:1024
    python benchmarks/results/session66/compiled_timeline.py --device cpu --cells swiglu:64:32   # the script itself
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._timing import graph_settle_steps
from benchmarks.sizes import dense_cell, step_fn


def intervals(prof, device: str) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of the device's work (the CPU's aten ops on a CPU run), sorted."""
    out = []
    for e in prof.events():
        on_device = e.device_type == torch.autograd.DeviceType.CUDA
        if (device == "cuda") != on_device or (device == "cpu" and not e.name.startswith("aten::")):
            continue
        start = e.time_range.start
        out.append((start, start + (e.device_time if on_device else e.cpu_time_total), e.name))
    return sorted(out)


def host_op_at(prof, t: float) -> str:
    """The innermost aten op (or Python-visible record) the host was in at time ``t``."""
    around = [e for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.CPU and e.time_range.start <= t <= e.time_range.end]
    return max(around, key=lambda e: e.time_range.start).name if around else "-"


def report(name: str, step, steps: int, device: str) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    settled = graph_settle_steps(step, sync, 100)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])) as prof:
        for _ in range(steps):
            step()
        sync()
    spans = intervals(prof, device)
    if not spans:
        print(f"{name}: no device work recorded")
        return
    busy, gaps, end = 0.0, [], spans[0][0]
    for start, stop, _ in spans:
        if start > end:
            gaps.append((start - end, end))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - spans[0][0]
    print(f"{name:18s} settled after {settled} steps; per step: span {span / steps / 1e3:7.3f} ms, busy "
          f"{busy / steps / 1e3:7.3f} ms, idle {(span - busy) / steps / 1e3:7.3f} ms in {len(gaps) / steps:.0f} gaps")
    for length, at in sorted(gaps, reverse=True)[:5]:
        print(f"    gap {length:8.1f} us, the host in {host_op_at(prof, at)[:90]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["swiglu:16384:1024"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    for cell in a.cells:
        model, reference, x = dense_cell(cell, a.device, dtype)
        print(f"== {cell}")
        for name, module in (("fuseops", model), ("fuseops compiled", torch.compile(model)),
                             ("torch", reference), ("torch.compile", torch.compile(reference))):
            params = list(module.parameters())
            report(name, step_fn(module, (x,), params), a.steps, a.device)


if __name__ == "__main__":
    main()
