"""Session 26 (for session 27): why routing graph states were dropped (call 9's moe_small: some
"eager, captures 1-2" with GPU spans of 20-150 us). Per MoE shape at T tokens (uniform routing),
40 training steps of the layer, then every graph state of the routing calls and of the experts'
programs: phase, captures, copied input slots, and the eager and graph samples (median enqueue,
shortest GPU span) the keep / drop verdict compared (``graphed.decision``: keep when the graph's
enqueue is under KEEP of the eager one and its GPU span under GPU_SLACK of the eager one).

    python benchmarks/results/session26/routing_states.py [T]
"""
import gc
import statistics
import sys

import torch

from benchmarks import sizes
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed


def summary(samples):
    if not samples:
        return "-"
    return (f"enqueue {statistics.median(h for h, _ in samples) * 1e6:.0f} us, "
            f"GPU {min(g for _, g in samples) * 1e6:.0f} us")


T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
for name, (E, H, F, K) in sizes.MOE_SHAPES.items():
    routing_graphs.clear()
    known = {id(o) for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram)}
    torch.manual_seed(0)
    model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
    x, ids, weights = sizes.moe_args(T, E, H, K)
    step = sizes.step_fn(model, (x, ids, weights), list(model.parameters()))
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    print(f"{name} T={T}: step {sizes.time_ms(step, 'cuda', 20):.2f} ms")
    routed = {id(s) for kept in routing_graphs.states().values() for s in kept}
    for key, kept in routing_graphs.states().items():
        for s in kept:
            print(f"  {key[1]:<19} {s.phase:<9} captures {s.captures} copied {sorted(s.buffers)}  "
                  f"eager {summary(s.eager_samples)}; graph {summary(s.graph_samples)}")
    for p in (o for o in gc.get_objects() if isinstance(o, graphed.GraphedProgram)
              and id(o) not in known and id(o) not in routed):
        print(f"  {'experts program':<19} {p.phase:<9} captures {p.captures} copied {sorted(p.buffers)}  "
              f"eager {summary(p.eager_samples)}; graph {summary(p.graph_samples)}")
    del model, x, step
print(graphed.counts, graphed.refusals)
