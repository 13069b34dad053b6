"""Session 39 probe (issue 24): run chosen GEMMs of benchmarks.fp8_gemm_tiles' expert-layer set once each, for
Nsight Compute to read (stall reasons of the blockwise Gluon kernels against the per-tensor ones).

    ncu --clock-control none --kernel-name regex:grouped_ ... python benchmarks/results/session39/ncu_gemms.py \
        --shape qwen3-30b-a3b --recipe "fp8 blockwise" --gemms "fc1 forward" "fc1 wgrad"
"""
import argparse

import torch

from benchmarks import fp8_moe
from benchmarks.fp8_gemm_tiles import SHAPES, operands

p = argparse.ArgumentParser()
p.add_argument("--shape", default="qwen3-30b-a3b")
p.add_argument("--recipe", default="fp8 blockwise")
p.add_argument("--gemms", nargs="+", default=["fc1 forward", "fc1 wgrad"])
a = p.parse_args()
gemms, _ = operands(SHAPES[a.shape], fp8_moe.RECIPES[a.recipe])
for name in a.gemms:
    gemms[name]()
    torch.cuda.synchronize()
    print(name, "done", flush=True)
