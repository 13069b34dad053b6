"""Session 31: where the compiled MoE composition's host time goes (issue 20: its step at T=1024 ran
at 0.93-0.98x of torch.compile in call 1, with the GPU's work 11 % below torch.compile's and idle
~1 ms of the step waiting for the host; its enqueue 1.9 ms against the eager composition's 1.3).

Per variant (the composition eager and compiled, and torch.compile of the torch layer): enqueue and
phases, then a cProfile of 50 steps (the device drained before each) by own time and by cumulative
time. The full tables go to the log; the top rows print.

    python benchmarks/results/session31/compiled_host_split.py [shape] [T] [variants...]
"""
import sys

import torch

from benchmarks import sizes
from benchmarks._timing import profile_table, profiled, step_phases
from fuseops.ops.executor import graphed

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
names = sys.argv[3:] or ["composition", "composition compiled", "torch.compile"]
E, H, F, K = sizes.MOE_SHAPES[shape]
torch.manual_seed(0)
mine = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
reference = sizes.TorchMoE(mine).cuda()
models = {"composition": mine, "composition compiled": torch.compile(mine),
          "torch.compile": torch.compile(reference)}
args = sizes.moe_args(T, E, H, K)
for name in names:
    model = models[name]
    params = list(model.parameters())
    step = sizes.step_fn(model, args, params)
    for _ in range(60):
        step()
    torch.cuda.synchronize()
    print(f"== {name} {shape} T={T}: enqueue {sizes.enqueue_ms(step, 'cuda', 50):.3f} ms; "
          f"{step_phases(model, args, params)}", flush=True)
    prof = profiled(step, 50, torch.cuda.synchronize)
    print(profile_table(prof, "tottime", 30), flush=True)
    print(profile_table(prof, "cumulative", 45), flush=True)
print("graph counts", graphed.counts, graphed.refusals)
