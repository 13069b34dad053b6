"""Session 30: where one MoE step's host time goes (issue 20's target: an MoE layer's fwd+bwd
enqueue <= 0.5 ms), for ``fuseops.moe.expert_layer`` in steady state against torch eager.

Per variant: the step's enqueue (the device drained first, as ``sizes.enqueue_ms``), its phases
(grads to None, forward, ``.sum()``, backward), and torch.profiler's CPU-side table of one
profiled stretch (CUDA runtime calls: graph launches, kernel launches, allocations), by self CPU time.

    python benchmarks/results/session30/host_breakdown.py [shape] [T] [variants...]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import sizes
from benchmarks._timing import step_phases
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
    print(f"== {name} {shape} T={T}: enqueue {enqueue:.3f} ms; {step_phases(model, args, params)}", flush=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            torch.cuda.synchronize()
            step()
    torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=28, max_name_column_width=60))
print("graph counts", graphed.counts, graphed.refusals)
