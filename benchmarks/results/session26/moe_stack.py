"""Session 26 (for session 27): a stack of MoE layers as a model has them (OLMoE's 16 layers, each
``x + moe(x)``, the same routing), where every layer's graphs keep a pool of their own: the synced
step and the memory, fuseops with graphs, without, and torch eager. Memory is read after
``torch.cuda.empty_cache()``: reserved memory then holds the live tensors and the graphs' private
pools (freed blocks in a pool count there: no other allocation can use them; ``memory_allocated``
misses them). Step peak: the most reserved during one step above that.

    python benchmarks/results/session26/moe_stack.py [--layers 16] [--T 1024 4096] [--shape olmoe]
"""
import argparse
import gc

import torch

from benchmarks import sizes
from benchmarks._timing import step_memory
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed

MB = 2**20


class Stack(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x, ids, weights):
        for layer in self.layers:
            x = x + layer(x, ids, weights)
        return x


def run(variant, shape, layers, T):
    E, H, F, K = sizes.MOE_SHAPES[shape]
    graphed.ENABLED = variant == "graphs"
    torch.manual_seed(0)
    mine = [sizes.FuseopsMoE(E, H, F) for _ in range(layers)]
    model = Stack([sizes.TorchMoE(m) for m in mine] if variant == "torch" else mine).cuda().bfloat16()
    x, ids, weights = sizes.moe_args(T, E, H, K)
    step = sizes.step_fn(model, (x, ids, weights), list(model.parameters()))
    for _ in range(40):
        step()
    ms = sizes.time_ms(step, "cuda", 20)
    between, peak = step_memory(step, reserved=True)
    del model, mine, x, step
    routing_graphs.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return f"{variant} {ms:.2f} ms, {between / MB:.0f} MB reserved between steps, step peak +{peak / MB:.0f} MB"


ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--T", nargs="*", type=int, default=[1024, 4096])
ap.add_argument("--shape", default="olmoe", choices=list(sizes.MOE_SHAPES))
a = ap.parse_args()
for T in a.T:
    for variant in ("graphs", "no graphs", "torch"):
        print(f"{a.shape} x{a.layers} T={T}: " + run(variant, a.shape, a.layers, T), flush=True)
graphed.ENABLED = True
print(graphed.counts, graphed.refusals)
