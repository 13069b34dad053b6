"""Norm kernels' time, this tree's against another (FUSEOPS_ROOT first on sys.path), alternated in
one process would mix two modules of one name, so each tree runs in its own process:

    FUSEOPS_ROOT=build/norm_base python benchmarks/results/session22/norm_ab.py   # one line per case
Medians of triton.testing.do_bench (bf16, CUDA), 3 repeats each, printed as us.
"""
import os
import sys

sys.path.insert(0, os.environ.get("FUSEOPS_ROOT", "."))

import torch
import triton.testing

from fuseops.kernels.elementwise import norm

EPS = 1e-5
for rows, n in [(16384, 4096), (16384, 1024), (4096, 1024), (16384, 14336), (65536, 128)]:
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(rows, n, device=dev, dtype=dt)
    dy = torch.randn(rows, n, device=dev, dtype=dt)
    w = torch.randn(n, device=dev, dtype=dt)
    b = torch.randn(n, device=dev, dtype=dt)
    _, rstd = norm.rmsnorm_fwd(x, w, EPS)
    _, mean, lrstd = norm.layernorm_fwd(x, w, b, EPS)
    cases = {
        "rms fwd": lambda x=x, w=w: norm.rmsnorm_fwd(x, w, EPS),
        "rms bwd": lambda dy=dy, x=x, w=w, rstd=rstd: norm.rmsnorm_bwd(dy, x, w, rstd),
        "ln fwd": lambda x=x, w=w, b=b: norm.layernorm_fwd(x, w, b, EPS),
        "ln bwd": lambda dy=dy, x=x, w=w, mean=mean, lrstd=lrstd: norm.layernorm_bwd(dy, x, w, mean, lrstd),
    }
    for name, fn in cases.items():
        t = [triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3 for _ in range(3)]
        print(f"{os.environ.get('FUSEOPS_ROOT', '.'):18s} {rows}x{n:<6d} {name:8s} " + " ".join(f"{v:8.1f}" for v in t))
