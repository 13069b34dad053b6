"""Session 28: call 1's profile of the FP8 current-scaling MoE layer (Qwen3, T=32768) showed a
device-to-host copy each step ("Memcpy DtoH (Device -> Pinned)") and wall 2.4 ms over its kernels'
sum (bf16: 0.9 ms). Find the synchronisation: a few warm steps under each FP8 recipe, then one under
``torch.cuda.set_sync_debug_mode("error")``; print where it raised. Graphs off (call 2: their
capture's check synchronises, once, and hid the rest). The layer as ``benchmarks.sizes`` composes it
and as ``benchmarks.moe_layer`` does (router weights as the SwiGLU's row scale).

    python benchmarks/results/session28/sync_hunt.py [T]
"""
import sys
import traceback

import torch

import fuseops
from benchmarks import moe_layer, sizes
from fuseops.ops.executor import graphed

graphed.ENABLED = False
T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
E, H, F, K = sizes.MOE_SHAPES["qwen3"]
torch.manual_seed(0)
model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
args = sizes.moe_args(T, E, H, K)
params = list(model.parameters())
case = moe_layer.make_case(E=E, T=T, H=H, I=F, K=K)
layers = {"sizes": lambda: model(*args), "moe_layer": moe_layer.composed_layer(case)}
for recipe in (fuseops.recipes.FP8CurrentScaling(), fuseops.recipes.FP8Blockwise(), None):
    for name, layer in layers.items():
        def step(recipe=recipe, layer=layer):
            for p in [*params, *case.leaves()]:
                p.grad = None
            with fuseops.autocast(recipe=recipe) if recipe is not None else torch.autocast("cuda", enabled=False):
                y = layer()
            y.float().sum().backward()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            print(f"{type(recipe).__name__} {name}: no synchronisation in a step")
        except RuntimeError:
            print(f"{type(recipe).__name__} {name}: synchronised:")
            traceback.print_exc(limit=-8)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
