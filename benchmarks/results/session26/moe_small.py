"""Session 26: where the MoE layer at T=1024 stands (issue 20's 1.2x target there: 0.94-1.12x in
session 25). Per shape, uniform routing: the synced step of fuseops eager (after 40 warm-up steps,
its programs graphed or not as graphed.py decided), fuseops under make_graphed_callables (the
host taken away: the kernels' floor), torch eager and torch under make_graphed_callables; then each
recorded program's phase and its measured (enqueue, GPU span) medians.

    GPU_BOUND=8 python benchmarks/results/session26/moe_small.py [T]   # graphed.GPU_BOUND for this run
"""
import gc
import os
import statistics
import sys

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
graphed.GPU_BOUND = float(os.environ.get("GPU_BOUND", graphed.GPU_BOUND))
print(f"GPU_BOUND {graphed.GPU_BOUND}")
for name, (E, H, F, K) in sizes.MOE_SHAPES.items():
    torch.manual_seed(0)
    known = {id(o) for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram)}
    model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
    reference = sizes.TorchMoE(model).cuda().bfloat16()
    args = sizes.moe_args(T, E, H, K)
    fuse_step = sizes.step_fn(model, args, list(model.parameters()))
    torch_step = sizes.step_fn(reference, args, list(reference.parameters()))
    for _ in range(40):
        fuse_step()
        torch_step()
    row = {
        "fuseops": sizes.time_ms(fuse_step, "cuda", 20),
        "fuseops enqueue": sizes.enqueue_ms(fuse_step, "cuda", 20),
        "fuseops graphed": sizes.graphed_ms(model, args, "cuda", 20),
        "torch": sizes.time_ms(torch_step, "cuda", 20),
        "torch enqueue": sizes.enqueue_ms(torch_step, "cuda", 20),
        "torch graphed": sizes.graphed_ms(reference, args, "cuda", 20),
    }
    print(f"{name} T={T}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()) + " ms")
    for p in (o for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram) and id(o) not in known):
        s = p.eager_samples
        med = (f"enqueue {statistics.median(h for h, _ in s) * 1e3:.3f} ms, GPU {min(g for _, g in s) * 1e3:.3f} ms"
               if s else "no samples")
        print(f"  program: {p.phase}, captures {p.captures}, {med}")
print(graphed.counts, graphed.refusals)
