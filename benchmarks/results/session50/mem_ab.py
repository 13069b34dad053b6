"""Session 50 A/B toward FUSEOPS_CUDA_GRAPHS=all as the default: ``shared_pool.py``'s drained issue time, step and
peak memory, one variant and one cell a fresh process, today's rule (``today``) against every program graphed
(``all_shared``). Cells as ``shared_pool.py``'s, plus ``moec:SHAPE:T[:s]``: the MoE composition of
``benchmarks.sizes``' ``fuseops`` column (permute, the experts Sequential, unpermute; ``:s`` skewed routing).

    python benchmarks/results/session50/mem_ab.py today|all_shared CELL
"""
import sys

import torch

from benchmarks.results.session46 import shared_pool
from benchmarks.sizes import MOE_SHAPES, FuseopsMoE, moe_args, step_fn

build = shared_pool.build


def build_composition(cell: str, torch_model: bool):
    if not cell.startswith("moec:"):
        return build(cell, torch_model)
    _, shape, T, *skew = cell.split(":")
    E, H, I, K = MOE_SHAPES[shape]
    torch.manual_seed(0)
    model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
    args = moe_args(int(T), E, H, K, bool(skew), "cuda", torch.bfloat16)
    return step_fn(model, args, list(model.parameters()))


if __name__ == "__main__":
    shared_pool.build = build_composition
    sys.argv = [sys.argv[0], "--cells", sys.argv[2], "--variants", sys.argv[1], "--steps", "30"]
    shared_pool.main()
    # Why programs were not graphed (``graphed.refusals``; one variant and cell a process).
    from fuseops.ops.executor import graphed
    print(f"{sys.argv[2]} not graphed: {graphed.refusals}")
