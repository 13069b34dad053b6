"""Session 27: where the MoE layer's host time goes outside its graphs (call 5: Qwen3 T=1024 enqueue
1.40 ms a step, of which the six graphed calls' own enqueue ~0.23 ms). cProfile over steps of the
layer in steady state (the device drained after each step, as ``sizes.enqueue_ms`` times it):
functions by own time and by cumulative time, and the step's enqueue without the profiler.

    python benchmarks/results/session27/host_cprofile.py [shape] [T] [steps] [composition|layer|compiled]

``layer``: the layer as ``fuseops.moe.expert_layer`` (``sizes.FuseopsExpertLayer``); ``compiled``: the
composition under ``torch.compile`` (for session 28: compiled fuseops at 0.71-0.83x of torch.compile
at T=1024, its enqueue ~3 ms). The phases of a step (grads to None, forward, sum, backward) are timed
on their own first.
"""
import sys

import torch

from benchmarks import sizes
from benchmarks._timing import profile_table, profiled, step_phases
from fuseops.ops.executor import graphed

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 50
E, H, F, K = sizes.MOE_SHAPES[shape]
torch.manual_seed(0)
model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
variant = sys.argv[4] if len(sys.argv) > 4 else "composition"
if variant == "layer":
    model = sizes.FuseopsExpertLayer(model)
params = list(model.parameters())
if variant == "compiled":
    model = torch.compile(model)
args = sizes.moe_args(T, E, H, K)
step = sizes.step_fn(model, args, params)
for _ in range(60):
    step()
torch.cuda.synchronize()
print(f"{shape} T={T}: enqueue {sizes.enqueue_ms(step, 'cuda', 20):.3f} ms, counts {graphed.counts}")
print(step_phases(model, args, params))
profiler = profiled(step, steps, between=torch.cuda.synchronize)
torch.cuda.synchronize()
print("Ordered by: internal time\n" + profile_table(profiler, "tottime", 45))
print("Ordered by: cumulative time\n" + profile_table(profiler, "cumulative", 60))
