"""Session 50 probe: why the MoE composition (permute, the experts Sequential, unpermute; ``benchmarks.sizes``'
``fuseops`` column) captures again and drops graphs under FUSEOPS_CUDA_GRAPHS=all (run 4: 218 captures, 65 drops,
151 moves, 41 clobbers over eight cells, against 125 / 43 / 50 / 3 under the default rule). Session 49's churn
probe with the model swapped for ``FuseopsMoE``.

    python benchmarks/results/session50/churn_moe.py moe:qwen3:1024[:s] [steps]
"""
import sys

import torch

from benchmarks.results.session46 import shared_pool
from benchmarks.results.session49 import churn_probe
from benchmarks.sizes import MOE_SHAPES, FuseopsMoE, moe_args, step_fn


def build(cell: str, torch_model: bool):
    _, shape, T, *skew = cell.split(":")
    E, H, I, K = MOE_SHAPES[shape]
    torch.manual_seed(0)
    model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
    args = moe_args(int(T), E, H, K, bool(skew), "cuda", torch.bfloat16)
    return step_fn(model, args, list(model.parameters()))


if __name__ == "__main__":
    shared_pool.build = build
    churn_probe.main()
