"""Session 19 (issue 24: Mixtral FP8 blockwise at 1.15x, target 1.2x; its forward + dgrad
Gluon GEMMs run at ~947 TFLOP/s): the warp-specialized blockwise forward/dgrad kernel's ring
depth (STAGES, 4 in the library) and tile-walk grouping (GROUP_M, 8) swept at the Mixtral
expert shapes (E=8, 16384 routed rows, H=4096, I=14336: FC1 forward, FC2 forward, FC1 dgrad).
    python benchmarks/results/session19/blockwise_sweep.py
"""
import math
import sys

import torch
import triton

sys.path.insert(0, ".")
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.hopper import blockwise
from fuseops.quant import linear_dgrad, linear_forward, quantize, recipes

E, T, H, I = 8, 16384, 4096, 14336
dev, bf16 = "cuda", torch.bfloat16
recipe = recipes.FP8Blockwise()
offsets = group_offsets(torch.tensor([T // E] * E, device=dev))
cases = {}
for name, (K, N) in {"fc1": (H, 2 * I), "fc2": (I, H)}.items():
    x = torch.randn(T, K, device=dev, dtype=bf16)
    w = (torch.randn(E, N, K, device=dev) / math.sqrt(K)).to(bf16)
    xq = quantize(x, recipe, offsets=offsets)
    wq = quantize(w, recipe, role="weight", columnwise=True)
    cases[f"{name} fwd"] = (lambda xq=xq, wq=wq: linear_forward(xq, wq), 2.0 * T * K * N)
    if True:
        dy = torch.randn(T, N, device=dev, dtype=bf16)
        dyq = quantize(dy, recipe, role="grad", offsets=offsets)
        cases[f"{name} dgrad"] = (lambda dyq=dyq, wq=wq: linear_dgrad(dyq, wq), 2.0 * T * K * N)
base = {}
CONFIGS = [(4, 8), (5, 8), (3, 8), (4, 16), (5, 16), (4, 4)]
if len(sys.argv) > 1:  # e.g. "4,8 3,8 4,8 3,8": repeats to tell a change from noise
    CONFIGS = [tuple(int(v) for v in c.split(",")) for c in sys.argv[1:]]
for stages, group_m in CONFIGS:
    blockwise.STAGES, blockwise.GROUP_M = stages, group_m
    row = []
    for case, (fn, flops) in cases.items():
        try:
            out = fn()
            if case not in base:
                base[case] = out
            else:
                assert torch.equal(out, base[case]), f"{case}: differs from STAGES=4 GROUP_M=8"
            ms = triton.testing.do_bench(fn, rep=400)
            row.append(f"{case} {ms:.3f} ms {flops / ms / 1e9:.0f} TF/s")
        except (AssertionError, RuntimeError) as exc:
            row.append(f"{case} error {repr(exc)[:120]}")
    print(f"STAGES={stages} GROUP_M={group_m}: " + "; ".join(row), flush=True)
