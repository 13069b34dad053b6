"""Session 30: where one MoE step's host time goes (issue 20's target: an MoE layer's fwd+bwd
enqueue <= 0.5 ms), for ``fuseops.moe.expert_layer`` in steady state against torch eager.

Per variant: the step's enqueue (the device drained first, as ``sizes.enqueue_ms``), its phases
(grads to None, forward, ``.sum()``, backward), and torch.profiler's CPU-side table of one
profiled stretch (CUDA runtime calls: graph launches, kernel launches, allocations), by self CPU time.

    python benchmarks/results/session30/host_breakdown.py [shape] [T] [variants...]
"""
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import sizes
from fuseops.ops.executor import graphed

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
names = sys.argv[3:] or ["layer", "torch"]
E, H, F, K = sizes.MOE_SHAPES[shape]
torch.manual_seed(0)
mine = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
models = {"layer": sizes.FuseopsExpertLayer(mine), "composition": mine, "torch": sizes.TorchMoE(mine).cuda()}
args = sizes.moe_args(T, E, H, K)
for name in names:
    model = models[name]
    params = list(model.parameters())
    step = sizes.step_fn(model, args, params)
    for _ in range(60):
        step()
    torch.cuda.synchronize()
    enqueue = sizes.enqueue_ms(step, "cuda", 30)
    phases = {"grads": [], "forward": [], "sum": [], "backward": []}
    for _ in range(30):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        t1 = time.perf_counter()
        y = model(*args)
        t2 = time.perf_counter()
        loss = y.sum()
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        for key, (a, b) in zip(phases, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
            phases[key].append((b - a) * 1e6)
        del y, loss
    print(f"== {name} {shape} T={T}: enqueue {enqueue:.3f} ms; phases (median us): "
          + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in phases.items()), flush=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            torch.cuda.synchronize()
            step()
    torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=28, max_name_column_width=60))
print("graph counts", graphed.counts, graphed.refusals)
