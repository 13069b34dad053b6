"""Where offloading's step overhead goes: the device's kernels, its idle time and the host.

    python -m benchmarks.offload_profile [--stacks moe,mlp] [--layers 8] [--tokens 8192] [--hidden 4096]
    python -m benchmarks.offload_profile --smoke     # CPU, tiny: runs end to end

For each stack of ``benchmarks/offload.py`` and each of: no offload, the hooks alone
(budget 0: groups pass their tensors through), the record path moving next to nothing
(a budget of a tenth of a group) and ``"auto"`` (warmed up until its plan settles), one
step is profiled (torch.profiler, CUDA activity) after the timed ones, and printed:

- ``step``: the median step (CUDA events), ``host``: the host's time to queue it;
- ``busy``: the union of the compute kernels' intervals, ``idle``: the step's span less
  that (the device waiting: on the host, or on a copy), ``kernels``: their count and the
  sum of their times (kernels that run slower beside copies show here);
- ``copies``: device<->host copies, their count and time (they overlap compute).

A step slower than no offload by about its ``idle`` growth waits on the host or on copies
(host close to step: the host; else copies), by about its ``kernels`` growth runs slower
kernels or more of them.
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.offload import STACKS, measure, setup, stack_arguments, step
from fuseops.offload import mark_not_offload


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def profile_step(layers, x, budget) -> dict[str, float]:
    """One step under torch.profiler: device busy / idle time, kernels and copies (ms)."""
    name = "none" if budget == "none" else "fuseops"
    cuda = x.is_cuda
    # The device's activity only on a GPU: the host's own, traced, would slow the host.
    activities = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
    if cuda:
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        step(layers, x, name, budget)
        if cuda:
            torch.cuda.synchronize()
    kernels, copies = [], []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        span = (e.time_range.start / 1e3, e.time_range.end / 1e3)
        (copies if e.name.startswith("Memcpy") else kernels).append(span)
    if not kernels:
        return dict(span=0.0, busy=0.0, idle=0.0, kernels=0, kernel_ms=0.0, copies=0, copy_ms=0.0)
    span = max(b for _, b in kernels + copies) - min(a for a, _ in kernels + copies)
    busy = _union(kernels)
    return dict(span=span, busy=busy, idle=span - busy, kernels=len(kernels),
                kernel_ms=sum(b - a for a, b in kernels), copies=len(copies),
                copy_ms=sum(b - a for a, b in copies))


def run_stack(kind, args, device, dtype, clock) -> None:
    torch.manual_seed(0)
    layers = nn.ModuleList(STACKS[kind](args.hidden) for _ in range(args.layers)).to(device, dtype)
    x = torch.randn(1, args.tokens, args.hidden, device=device, dtype=dtype)
    mark_not_offload(x)
    everything = step(layers, x, "fuseops_all", None)
    tenth = int(0.1 * everything["bytes_offloaded"] / max(1, args.layers - 1))
    print(f"\n{kind}: {'budget':>10} {'step':>7} {'host':>7} {'span':>7} {'busy':>7} {'idle':>7} "
          f"{'kernels':>8} {'kern ms':>8} {'copies':>7} {'copy ms':>8} {'moved GB':>9}")
    for budget in ("none", 0, tenth, "auto"):
        point = measure(layers, x, clock, budget, args.steps, args.warm_up)
        prof = profile_step(layers, x, budget)
        label = {0: "0 hooks", tenth: f"{tenth / 1e6:.0f}MB"}.get(budget, str(budget))
        print(f"{'':>{len(kind) + 1}} {label:>10} {point['step_ms']:>7.2f} {point['host_ms']:>7.2f} "
              f"{prof['span']:>7.2f} {prof['busy']:>7.2f} {prof['idle']:>7.2f} {prof['kernels']:>8} "
              f"{prof['kernel_ms']:>8.2f} {prof['copies']:>7} {prof['copy_ms']:>8.2f} "
              f"{point['bytes_offloaded'] / 1e9:>9.3f}")


def main() -> None:
    args = stack_arguments(__doc__.splitlines()[0], steps=6, stacks="moe,mlp").parse_args()
    device, dtype, clock = setup(args)
    for kind in args.stacks.split(","):
        run_stack(kind, args, device, dtype, clock)


if __name__ == "__main__":
    main()
