"""Session 31: what the GPU does in one synchronised MoE step (issue 20: the compiled composition at
T=1024 ran at 0.93-0.98x of torch.compile in call 1, its step 0.45 ms longer than the eager
composition's with a 0.6 ms longer enqueue; is the GPU's work larger, or does it wait for the host?).

Per variant, 7 single steps each under torch.profiler (CPU and CUDA), the device drained before each:
the kernels' count and summed time, the GPU's span from first to last, the time it sat idle within
the span, the host's enqueue and the delay before the first kernel; medians. Then the variant's
largest kernels by time a step.

    python benchmarks/results/session31/gpu_split.py [shape] [T] [variants...]
    python benchmarks/results/session31/gpu_split.py dense:gelu:1024:4096 [variants...]

A ``dense:act:T:H`` cell runs the dense stack (``sizes.dense_cell``): variants "eager", "compiled",
"torch", "torch.compile". Each variant's unprofiled enqueue and synchronised step print first.
"""
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks import sizes
from fuseops.ops.executor import graphed

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
if shape.startswith("dense:"):
    mine, reference, x = sizes.dense_cell(shape[len("dense:"):])
    T = x.shape[0]
    names = sys.argv[2:] or ["eager", "compiled", "torch.compile"]
    models = {"eager": mine, "compiled": torch.compile(mine), "torch": reference,
              "torch.compile": torch.compile(reference)}
    args = (x,)
else:
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    names = sys.argv[3:] or ["composition", "composition compiled", "torch.compile", "layer"]
    E, H, F, K = sizes.MOE_SHAPES[shape]
    torch.manual_seed(0)
    mine = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
    reference = sizes.TorchMoE(mine).cuda()
    models = {"composition": mine, "composition compiled": torch.compile(mine), "torch": reference,
              "torch.compile": torch.compile(reference), "layer": sizes.FuseopsExpertLayer(mine)}
    args = sizes.moe_args(T, E, H, K)


def busy_union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


for name in names:
    model = models[name]
    params = list(model.parameters())
    step = sizes.step_fn(model, args, params)
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    before = dict(graphed.counts)
    print(f"-- {name}: enqueue {sizes.enqueue_ms(step, 'cuda', 30):.3f} ms, step {sizes.time_ms(step, 'cuda', 30):.3f} ms; "
          f"graph counts over them {({k: v - before.get(k, 0) for k, v in graphed.counts.items() if v != before.get(k, 0)})}",
          flush=True)
    rows = defaultdict(list)
    per_kernel: dict[str, float] = defaultdict(float)
    for _ in range(7):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            step()
            enqueue = time.perf_counter() - start
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        events = prof.events()
        gpu = [e for e in events if e.device_type == DeviceType.CUDA]
        cpu_start = min(e.time_range.start for e in events if e.device_type == DeviceType.CPU)
        spans = [(e.time_range.start, e.time_range.end) for e in gpu]
        first, last = min(a for a, _ in spans), max(b for _, b in spans)
        busy = busy_union(spans)
        rows["kernels"].append(len(gpu))
        rows["kernel us"].append(sum(b - a for a, b in spans))
        rows["span us"].append(last - first)
        rows["idle us"].append(last - first - busy)
        rows["first kernel at us"].append(first - cpu_start)
        rows["enqueue us"].append(enqueue * 1e6)
        rows["wall us"].append(wall * 1e6)
        for e in gpu:
            per_kernel[e.name[:70]] += (e.time_range.end - e.time_range.start) / 7
    print(f"== {name} {shape} T={T} (profiled, medians of 7): "
          + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in rows.items()), flush=True)
    for kernel, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:14]:
        print(f"   {us:8.1f} us  {kernel}")
print("graph counts", graphed.counts, graphed.refusals)
