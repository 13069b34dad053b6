"""Session 25 (for session 26): what the CUDA graphs of recorded programs cost in memory. Each graph keeps a
private pool (its intermediates and results) between steps, where eager programs hand theirs back to the
allocator. Per cell, a fresh model in turn: fuseops with graphs, fuseops without, torch eager; after 40
warm-up steps, the memory allocated between steps (parameters, gradients, graph pools) and the peak of one
step above the memory before it. Run alone: each variant's tensors are freed before the next starts.

    python benchmarks/results/session25/graph_memory.py [act:T:H ...]
"""
import gc
import sys

import torch

from benchmarks import sizes
from benchmarks._timing import step_memory
from fuseops.ops.executor import graphed

MB = 2**20


def measure(act, T, H, torch_model):
    torch.manual_seed(0)
    model = sizes.fuseops_dense(H, act)
    model = (sizes.torch_dense(model) if torch_model else model).cuda().bfloat16()
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step = sizes.step_fn(model, (x,), list(model.parameters()))
    for _ in range(40):
        step()
    between, peak = step_memory(step)
    del model, x, step
    gc.collect()
    torch.cuda.empty_cache()
    return between / MB, peak / MB


cells = sys.argv[1:] or ["gelu:1024:1024", "gelu:4096:1024", "gelu:1024:4096", "swiglu:1024:2048"]
for cell in cells:
    act, T, H = cell.split(":")
    T, H = int(T), int(H)
    rows = []
    for name, on in (("graphs", True), ("no graphs", False), ("torch", None)):
        graphed.ENABLED = bool(on)
        between, peak = measure(act, T, H, torch_model=on is None)
        rows.append(f"{name} {between:.0f} MB between steps, step peak +{peak:.0f} MB")
    print(f"{cell}: " + "; ".join(rows))
graphed.ENABLED = True
print(graphed.counts)
