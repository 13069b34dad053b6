"""Session 40 probe (issue 20): the row reductions before and after call 2's changes, GPU time in CUDA graphs
(``do_bench_cudagraph``; call 1's ``do_bench`` times of the small shapes were host time).

- the second stage (``bias_grad.sum_partials``): the 128-column tile used before against ``_second_stage``, at the
  swept shapes and at the tall ones of the gated backward's dprobs (few partial rows, one column a routed row);
- the norm backward (RMSNorm, LayerNorm with bias) with each;
- the activation backward + dbias: its first-stage tile before (8 x 256) and now (32 x 128), each with each
  second stage; the bias gradient (column sums) with each second stage.

    python benchmarks/results/session40/reductions_ab.py [--smoke]
"""
import itertools
import sys
from unittest import mock

import torch
import triton.testing

from fuseops.kernels.elementwise import activation, bias_grad, norm
from fuseops.kernels.elementwise.activation import Activation
from fuseops.kernels.elementwise.bias_grad import ReduceConfig

SMOKE = "--smoke" in sys.argv
DEVICE = "cpu" if SMOKE else "cuda"
BEFORE = ReduceConfig(block_m=32, block_n=128, num_warps=4, programs_per_sm=1)
PARTIALS = [(4, 64)] if SMOKE else [(p, n) for p in (17, 66, 264, 528) for n in (1024, 2048, 4096, 8192, 16384)] + [
    (2, 262144), (8, 262144), (16, 65536), (6, 131072), (17, 32768)]
NORMS = [(16, 64)] if SMOKE else [(16384, 1024), (4096, 4096), (1024, 2048), (1024, 1024), (4096, 1024), (16384, 2048)]
DBIAS = [(16, 96)] if SMOKE else [(1024, 4096), (4096, 4096), (16384, 4096), (1024, 8192), (4096, 8192), (4096, 16384)]
COLSUM = [(16, 96)] if SMOKE else [(1024, 1024), (1024, 2048), (4096, 1024), (4096, 2048), (16384, 1024), (16384, 4096)]


def bench(fn) -> float:
    """Microseconds of GPU time a call."""
    if SMOKE:
        fn()
        return 1.0
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def both(fn):
    """``fn``'s time with the second stage before and now, and whether their results agree to a bf16 ulp."""
    with mock.patch.object(bias_grad, "_second_stage", lambda cols: BEFORE):
        old_out, old = fn(), bench(fn)
    new_out, new = fn(), bench(fn)
    outs = [(a, b) for a, b in zip(old_out, new_out) if a is not None] if isinstance(old_out, tuple) else [(old_out, new_out)]
    close = all(torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2) for a, b in outs)
    return old, new, close


def main():
    print("second stage [P, N]: before (32 x 128, 4 warps) / now (_second_stage) us", flush=True)
    for P, N in PARTIALS:
        partials = torch.randn(P, N, device=DEVICE, dtype=torch.float32)
        old, new, close = both(lambda: bias_grad.sum_partials(partials, torch.bfloat16))
        print(f"  [{P:3d}, {N:6d}]  {old:6.2f} / {new:6.2f}  {old / new:4.2f}x  close {close}", flush=True)
    print("\nnorm backward: before / now us (GPU time)", flush=True)
    for (M, N), layer in itertools.product(NORMS, (False, True)):
        x = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        w = torch.randn(N, device=DEVICE, dtype=torch.bfloat16)
        b = torch.randn_like(w) if layer else None
        _, mean, rstd = norm._norm_fwd(x, w, b, 1e-6, False, None, not layer)
        old, new, close = both(lambda: norm._norm_bwd(dy, x, w, mean if layer else None, rstd, False, layer, not layer))
        print(f"  {'LayerNorm' if layer else 'RMSNorm':9s} [{M:5d}, {N:5d}]  {old:6.1f} / {new:6.1f}  {old / new:4.2f}x"
              f"  close {close}", flush=True)
    print("\nGELU-tanh backward + dbias: first stage 8 x 256 / 32 x 128, second stage before / now, us", flush=True)
    flat, now = activation._configs()
    for M, N in DBIAS:
        x, dy = (torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
        cells = []
        for first in (ReduceConfig(8, 256, num_warps=4, programs_per_sm=4), now):
            with mock.patch.object(activation, "_configs", lambda first=first: (flat, first)):
                cells.append(both(lambda: activation.activation_bwd_dbias(x, dy, Activation.GELU_TANH)))
        (a, b, c1), (c, d, c2) = cells
        print(f"  [{M:5d}, {N:5d}]  8x256: {a:6.1f} / {b:6.1f}   32x128: {c:6.1f} / {d:6.1f}   "
              f"before->now {a / d:4.2f}x  close {c1 and c2}", flush=True)
    print("\nbias gradient (column sums): second stage before / now, us", flush=True)
    for M, N in COLSUM:
        dy = torch.randn(M, N, device=DEVICE, dtype=torch.bfloat16)
        old, new, close = both(lambda: bias_grad.bias_grad(dy))
        print(f"  [{M:5d}, {N:5d}]  {old:6.1f} / {new:6.1f}  {old / new:4.2f}x  close {close}", flush=True)


if __name__ == "__main__":
    main()
