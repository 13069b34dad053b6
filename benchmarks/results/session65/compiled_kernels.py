"""Session 65 probe (issue 20, compiled >= torch.compile): where a compiled fuseops step spends GPU time that the
eager step does not. At GPU-bound cells compiled fuseops ran 1-12 % slower than eager fuseops (run 4: swiglu
H=1024 T=16384 7.32 against 6.50 ms, gelu 6.42 against 6.11), so the compiled graph launches work that eager does
not, or slower. Here both steps run under torch.profiler, after warm-up, and their device kernels are summed by name
per step; the table lists every name whose per-step time or count differs, then the totals.

    python benchmarks/results/session65/compiled_kernels.py --cells swiglu:16384:1024 gelu:16384:1024
    python benchmarks/results/session65/compiled_kernels.py --device cpu --cells swiglu:64:32   # the script itself
"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

import fuseops.compiled_sequential
from benchmarks.sizes import dense_cell, step_fn


def kernels_per_step(step, steps: int, device: str) -> dict[str, tuple[float, float]]:
    """{kernel name: (us a step, launches a step)} of ``steps`` profiled steps."""
    for _ in range(5):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    total = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if device == "cuda" and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if device == "cpu" and not event.name.startswith("aten::"):
            continue
        time_us = event.device_time if device == "cuda" else event.self_cpu_time_total
        total[event.name][0] += time_us / steps
        total[event.name][1] += 1 / steps
    return {name: (t, n) for name, (t, n) in total.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["swiglu:16384:1024", "gelu:16384:1024"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    fuseops.compiled_sequential.OPERATORS_ON_CPU = True  # the GPU's path, the two operators, on the CPU too
    for cell in a.cells:
        model, _, x = dense_cell(cell, a.device, dtype)
        params = list(model.parameters())
        eager = kernels_per_step(step_fn(model, (x,), params), a.steps, a.device)
        compiled = kernels_per_step(step_fn(torch.compile(model), (x,), params), a.steps, a.device)
        print(f"\n{cell}: us a step (launches a step), eager against compiled; names whose time moved > 2 % or count")
        for name in sorted(set(eager) | set(compiled), key=lambda n: -max(eager.get(n, (0, 0))[0],
                                                                          compiled.get(n, (0, 0))[0])):
            (te, ne), (tc, nc) = eager.get(name, (0.0, 0)), compiled.get(name, (0.0, 0))
            if abs(ne - nc) > 1e-6 or abs(te - tc) > 0.02 * max(te, tc):
                print(f"  {te:9.1f} ({ne:4.1f})  {tc:9.1f} ({nc:4.1f})  {name[:110]}")
        print(f"  total {sum(t for t, _ in eager.values()):9.1f} ({sum(n for _, n in eager.values()):5.1f})  "
              f"{sum(t for t, _ in compiled.values()):9.1f} ({sum(n for _, n in compiled.values()):5.1f})")


if __name__ == "__main__":
    main()
