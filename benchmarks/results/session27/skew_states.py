"""Session 27: why the skewed MoE cell at T=1024 enqueues slower than the eager layer (call 2: Qwen3
skewed 2.37 ms, uniform 1.28; session 26 before routing graphs 1.49). Follows ``sizes.measure``'s
order on one model (the uniform cell, then the skewed one; fuseops eager and compiled interleaved)
and prints, per phase, the graph counters that moved and fuseops' median enqueue; then every
routing state and experts program with its phase.

    python benchmarks/results/session27/skew_states.py [shape] [T]
"""
import gc
import sys

import torch

from benchmarks import sizes
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
E, H, F, K = sizes.MOE_SHAPES[shape]
torch.manual_seed(0)
model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
reference = sizes.TorchMoE(model).cuda().bfloat16()
params, tparams = list(model.parameters()), list(reference.parameters())


def moved(before):
    return {k: v - before[k] for k, v in graphed.counts.items() if v != before[k]}


for skewed in (False, True):
    args = sizes.moe_args(T, E, H, K, skewed)
    variants = {"fuseops": sizes.step_fn(model, args, params),
                "compiled": sizes.step_fn(torch.compile(model), args, params),
                "torch": sizes.step_fn(reference, args, tparams)}
    label = "skewed" if skewed else "uniform"
    for name, step in variants.items():
        before = dict(graphed.counts)
        for _ in range(sizes.WARMUP_STEPS):
            step()
        torch.cuda.synchronize()
        print(f"{label} warm-up {name}: {moved(before)}", flush=True)
    for r in range(2):
        for name, step in variants.items():
            before = dict(graphed.counts)
            ms = sizes.time_ms(step, "cuda", 10)
            enq = sizes.enqueue_ms(step, "cuda", 10)
            print(f"{label} round {r} {name}: step {ms:.2f} ms, enqueue {enq:.2f} ms; {moved(before)}", flush=True)
    states = [s for kept in routing_graphs.states().values() for s in kept]
    print(f"  routing states {len(states)}: " + ", ".join(f"{k[1]}:{s.phase}/{s.captures}"
                                                          for k, kept in routing_graphs.states().items() for s in kept))
    routed = {id(s) for s in states}
    progs = [o for o in gc.get_objects() if type(o) is graphed.GraphedProgram and id(o) not in routed]
    print("  programs: " + ", ".join(f"{p.phase}/{p.captures}/copied {sorted(p.buffers)}" for p in progs))
print(graphed.counts, graphed.refusals)
