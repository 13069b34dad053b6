"""Session 39 probe (issue 20): the RMSNorm backward (elementwise/norm.py's norm_bwd_kernel, its one-block path)
under other tiles, warps and program counts than the library's ("not timed yet" in its _configs), against
torch's own (eager: autograd of F.rms_norm; compiled: torch.compile of it), GPU time by do_bench, at the dense
stack's shapes. Bitwise equality of dx with the library's is checked per config (the same sums per row; the
dweight partials differ by program count, so they are compared with a tolerance).

    python benchmarks/results/session39/norm_sweep.py [--library-only] [--layernorm]

``--layernorm``: LayerNorm with a bias instead (its mean and dbias too; session 39 swept RMSNorm only).
"""
import itertools
import sys

import torch
import triton.testing

from fuseops.kernels._triton import cdiv, next_power_of_2, num_sms
from fuseops.kernels.elementwise import norm
from fuseops.kernels.launch import launch

LAYERNORM = "--layernorm" in sys.argv
SHAPES = [(16384, 1024), (4096, 4096), (1024, 2048), (1024, 1024), (4096, 1024), (16384, 2048)]


def run(dy, x, w, mean, rstd, block_m, num_warps, per_sm):
    M, N = x.shape
    block_n = next_power_of_2(N)
    programs = max(1, min(cdiv(M, block_m), per_sm * num_sms(0)))
    dx = torch.empty_like(x)
    dw_partials = torch.empty(programs, N, dtype=torch.float32, device=x.device)
    db_partials = torch.empty_like(dw_partials) if LAYERNORM else dw_partials
    launch(norm.norm_bwd_kernel, (programs,), dy, x, w, mean, rstd, dx, dw_partials, db_partials,
           M, N, dy.stride(0), x.stride(0), dx.stride(0), programs, IS_RMS=not LAYERNORM, HAS_BIAS=LAYERNORM,
           ZERO_CENTERED=False, BLOCK_M=block_m, BLOCK_N=block_n, ONE_BLOCK=True, num_warps=num_warps,
           enable_fp_fusion=False)
    return dx, norm.sum_partials(dw_partials, w.dtype)  # (dbias: summed as dweight is, not compared)


for M, N in SHAPES:
    torch.manual_seed(0)
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(w) if LAYERNORM else None
    y, mean, rstd = norm._norm_fwd(x, w, b, 1e-6, False, None, not LAYERNORM)
    mean = mean if LAYERNORM else rstd

    def library():
        return norm._norm_bwd(dy, x, w, mean, rstd, False, LAYERNORM, not LAYERNORM)
    lib_dx, lib_dw, _ = library()
    lib = triton.testing.do_bench(library, rep=50)
    xr = x.detach().requires_grad_()
    wr = w.detach().requires_grad_()
    def torch_norm(xr, wr):
        if LAYERNORM:
            return torch.nn.functional.layer_norm(xr, (N,), wr, b, 1e-6)
        return torch.nn.functional.rms_norm(xr, (N,), wr, 1e-6)
    yt = torch_norm(xr, wr)
    eager = triton.testing.do_bench(lambda: torch.autograd.grad(yt, (xr, wr), dy, retain_graph=True), rep=50)

    def fwd_bwd(xr=xr, wr=wr):
        return torch.autograd.grad(torch_norm(xr, wr), (xr, wr), dy)
    compiled = torch.compile(fwd_bwd)
    both = triton.testing.do_bench(compiled, rep=50)
    fwd_only = triton.testing.do_bench(lambda: norm._norm_fwd(x, w, b, 1e-6, False, None, not LAYERNORM), rep=50)
    gb = 3 * M * N * 2 / 1e9
    print(f"\n[{M}, {N}] library bwd {lib * 1e3:7.1f} us ({gb / lib * 1e3:5.0f} GB/s); torch eager bwd {eager * 1e3:7.1f} us; "
          f"torch.compile fwd+bwd {both * 1e3:7.1f} us (ours fwd {fwd_only * 1e3:6.1f} + bwd {lib * 1e3:6.1f})", flush=True)
    rows = []
    if "--library-only" in sys.argv:
        continue
    for block_m, num_warps, per_sm in itertools.product((1, 2, 4, 8, 16), (4, 8, 16), (2, 4, 8)):
        if block_m * next_power_of_2(N) // (32 * num_warps) > 64 or block_m * next_power_of_2(N) < 32 * num_warps:
            continue
        try:
            dx, dw = run(dy, x, w, mean, rstd, block_m, num_warps, per_sm)
            same = torch.equal(dx, lib_dx)
            dw_ok = torch.allclose(dw.float(), lib_dw.float(), rtol=1e-2, atol=1e-2)
            ms = triton.testing.do_bench(lambda: run(dy, x, w, mean, rstd, block_m, num_warps, per_sm), rep=30)
            rows.append((ms, block_m, num_warps, per_sm, same, dw_ok))
        except Exception as e:  # a config that does not compile: say so, go on
            print(f"  block_m={block_m} warps={num_warps} per_sm={per_sm}: {type(e).__name__}", flush=True)
    for ms, block_m, num_warps, per_sm, same, dw_ok in sorted(rows)[:6]:
        print(f"  {ms * 1e3:7.1f} us {lib / ms:5.2f}x  block_m={block_m:2d} warps={num_warps:2d} per_sm={per_sm} "
              f"dx same bits {same} dw close {dw_ok}", flush=True)
