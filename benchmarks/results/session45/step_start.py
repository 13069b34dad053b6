"""Session 45 probe (issue 20, GPU-bound dense cells): how long a synchronised step leaves the GPU idle before
its first kernel, per variant (fuseops eager / compiled, torch eager / compiled), and what the host runs in that
time. ``sizes.py`` times synchronised steps, so that wait is in every step time: session 43's ``compiled_idle.py``
found 0.59-0.74 ms eager fuseops and 1.09-1.27 compiled at GELU T=16384 H=4096, but did not time torch's.

Per variant, over ``--steps`` synchronised steps a round (rounds in alternating order):
- the GPU's idle time between one step's last kernel and the next step's first (kernels a step counted from
  the profile, so the boundary is exact);
- with ``--host``, one profiled step with CPU activities for fuseops eager and torch eager: every CPU event
  from the step's start to its first kernel launch, with its offset (us).

    python benchmarks/results/session45/step_start.py --cells gelu:4096:4096 gelu:16384:2048 [--host]
"""
import argparse
import collections
import statistics

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.sizes import dense_cell, step_fn

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")


def step_gaps(step, steps: int) -> list[float]:
    """The GPU's idle us before each step's first kernel (after the previous step's last)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps + 1):
            step()
            torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    per_step = len(kernels) // (steps + 1)
    if per_step * (steps + 1) != len(kernels):
        return [float("nan")]
    gaps = []
    for i in range(1, steps + 1):
        last_end = max(e for _, e in kernels[(i - 1) * per_step:i * per_step])
        gaps.append(kernels[i * per_step][0] - last_end)
    return gaps


def host_to_first_launch(step, top: int) -> list[tuple[float, float, str]]:
    """(offset us, duration us, name) of the CPU events of one profiled synchronised step, from the step's
    start to its first kernel or graph launch."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("step_start_probe"):
            step()
        torch.cuda.synchronize()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    start = next(e.time_range.start for e in events if e.name == "step_start_probe")
    rows = []
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU or e.name == "step_start_probe":
            continue
        offset = e.time_range.start - start
        rows.append((offset, e.time_range.end - e.time_range.start, e.name))
        if any(e.name.startswith(n) for n in LAUNCHES):
            break
    return rows[:top] + ([rows[-1]] if len(rows) > top else [])


def warm_steps(cell: str, variants=("fuseops", "fuseops_compiled", "torch", "torch_compiled")) -> dict:
    """Synchronisable steps of ``cell``'s dense stack per variant (fuseops eager / compiled, the same stack from
    torch.nn eager / compiled; each its own model and input of the same seed), each warmed up 30 steps. (Calls 2,
    5 and 6 ran a form in which the variants shared one input tensor.)"""
    steps = {}
    for name in variants:
        fuse_model, torch_model, x = dense_cell(cell)
        model = fuse_model if name.startswith("fuseops") else torch_model
        run = torch.compile(model) if name.endswith("compiled") else model
        steps[name] = step_fn(run, (x,), list(model.parameters()))
    for step in steps.values():
        for _ in range(30):
            step()
    return steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:4096", "gelu:16384:2048"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--host", action="store_true")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    for cell in a.cells:
        steps = warm_steps(cell)
        gaps = collections.defaultdict(list)
        for r in range(a.rounds):
            for name in (list(steps) if r % 2 == 0 else list(reversed(steps))):
                gaps[name] += step_gaps(steps[name], a.steps)
        print(f"\n== {cell}: GPU idle before a synchronised step's first kernel, us (median, min-max of "
              f"{a.rounds * a.steps})")
        for name, g in gaps.items():
            print(f"   {name:17s} {statistics.median(g):8.1f}  ({min(g):.1f}-{max(g):.1f})")
        if a.host:
            for name in ("fuseops", "torch", "fuseops_compiled"):
                print(f"\n   {name}: CPU events from the step's start to its first launch (offset us, us, name)")
                for offset, dur, ev in host_to_first_launch(steps[name], a.top):
                    print(f"      {offset:8.1f} {dur:8.1f}  {ev[:90]}")
        del steps
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
