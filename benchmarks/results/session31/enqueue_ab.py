"""Session 31: the MoE layer's host time, this tree against another (run once per tree, in
alternation, on one machine: host times differ by up to 2x between machines). Per shape at T
tokens: expert_layer and the composition, eager, and with ``compiled`` the composition under
torch.compile: enqueue ms (the device drained before each step) and synchronised step ms, the
minimum over rounds of medians.

    PYTHONPATH=<tree> python benchmarks/results/session31/enqueue_ab.py <label> [T] [compiled] [shapes...]
"""
import sys

import torch

from benchmarks import sizes

label = sys.argv[1]
T = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
compiled = len(sys.argv) > 3 and sys.argv[3] == "compiled"
shapes = sys.argv[4:] or ["qwen3", "olmoe"]
cells = []
for shape in shapes:
    E, H, F, K = sizes.MOE_SHAPES[shape]
    torch.manual_seed(0)
    mine = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
    models = {"layer": sizes.FuseopsExpertLayer(mine), "composition": mine}
    if compiled:
        models = {"composition compiled": torch.compile(mine)}
    args = sizes.moe_args(T, E, H, K)
    for name, model in models.items():
        step = sizes.step_fn(model, args, list(model.parameters()))
        for _ in range(60):
            step()
        best_enq, best_ms = float("inf"), float("inf")
        for _ in range(3):
            best_enq = min(best_enq, sizes.enqueue_ms(step, "cuda", 30))
            best_ms = min(best_ms, sizes.time_ms(step, "cuda", 30))
        cells.append(f"{shape} {name} enq {best_enq:.3f} step {best_ms:.3f}")
print(f"{label} T={T}: " + "; ".join(cells), flush=True)
