"""Session 40 probe (issue 20): tiles of the elementwise kernels whose GPU configs were never timed ("not timed
yet" in their ``_configs``), as session 39 swept the norm backward (1.24-1.78x): the activation backward with
its bias gradient (``activation.activation_bwd_dbias``), the column sums (``bias_grad.bias_grad``) and the norm
forward (``norm._norm_fwd``), at the dense stack's shapes, each against the library's tile and torch's own ops
(GPU time, do_bench). Every candidate's result is compared with the library's (dx bit for bit where the
per-element maths is the same; the sums within float32 rounding: their order changes with the split).

    python benchmarks/results/session40/elementwise_sweep.py [--parts dbias colsum normfwd] [--top 6]
    python benchmarks/results/session40/elementwise_sweep.py --smoke     # CPU, interpreter: the plumbing only
"""
from __future__ import annotations

import argparse
import itertools
from unittest import mock

import torch
import triton.testing

from fuseops.kernels.elementwise import activation, bias_grad, norm
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.elementwise.bias_grad import ReduceConfig

# [rows, features] of the dense stack's activations (T x 4H for GELU) and outputs (T x H).
DBIAS_SHAPES = [(1024, 4096), (4096, 4096), (16384, 4096), (1024, 8192), (4096, 16384)]
COLSUM_SHAPES = [(1024, 1024), (1024, 2048), (4096, 1024), (16384, 1024), (16384, 4096)]
NORM_SHAPES = [(1024, 1024), (4096, 1024), (16384, 1024), (4096, 4096), (16384, 2048)]


def bench(fn, smoke: bool) -> float:
    if smoke:
        fn()
        return float("nan")
    return triton.testing.do_bench(fn, rep=30) * 1e3


def reduce_configs(smoke: bool):
    if smoke:
        return [ReduceConfig(8, 64, 1, 1)]
    out = []
    for bm, bn, warps, per_sm in itertools.product((4, 8, 16, 32), (128, 256, 512), (4, 8), (1, 2, 4, 8)):
        per_thread = bm * bn // (32 * warps)
        if 8 <= per_thread <= 64:
            out.append(ReduceConfig(bm, bn, warps, per_sm))
    return out


def report(name, lib_us, torch_us, rows, top):
    print(f"\n{name}: library {lib_us:7.1f} us, torch {torch_us:7.1f} us", flush=True)
    for us, cfg, same in sorted(rows, key=lambda r: r[0])[:top]:
        print(f"  {us:7.1f} us {lib_us / us:5.2f}x  {cfg}  {same}", flush=True)


def dbias(device, dtype, smoke, top):
    for M, N in ([(16, 96)] if smoke else DBIAS_SHAPES):
        x, dy = (torch.randn(M, N, device=device, dtype=dtype) for _ in range(2))
        act = Activation.GELU_TANH
        lib_dx, lib_db = activation.activation_bwd_dbias(x, dy, act)
        lib = bench(lambda: activation.activation_bwd_dbias(x, dy, act), smoke)
        ref = bench(lambda: torch.ops.aten.gelu_backward(dy, x, approximate="tanh").sum(0), smoke)
        flat = activation._configs()[0]
        rows = []
        for cfg in reduce_configs(smoke):
            with mock.patch.object(activation, "_configs", lambda cfg=cfg: (flat, cfg)):
                dx, db = activation.activation_bwd_dbias(x, dy, act)
                same = (torch.equal(dx, lib_dx), torch.allclose(db.float(), lib_db.float(), rtol=1e-2, atol=1e-2))
                rows.append((bench(lambda: activation.activation_bwd_dbias(x, dy, act), smoke), cfg, same))
        report(f"GELU backward + dbias [{M}, {N}]", lib, ref, rows, top)


def colsum(device, dtype, smoke, top):
    for M, N in ([(16, 96)] if smoke else COLSUM_SHAPES):
        dy = torch.randn(M, N, device=device, dtype=dtype)
        lib_db = bias_grad.bias_grad(dy)
        lib = bench(lambda: bias_grad.bias_grad(dy), smoke)
        ref = bench(lambda: dy.sum(0), smoke)
        rows = []
        for cfg in reduce_configs(smoke):
            with mock.patch.object(bias_grad, "_configs", lambda cfg=cfg: cfg):
                db = bias_grad.bias_grad(dy)
                same = torch.allclose(db.float(), lib_db.float(), rtol=1e-2, atol=1e-2)
                rows.append((bench(lambda: bias_grad.bias_grad(dy), smoke), cfg, same))
        report(f"column sums [{M}, {N}]", lib, ref, rows, top)


def normfwd(device, dtype, smoke, top):
    for M, N in ([(16, 96)] if smoke else NORM_SHAPES):
        x = torch.randn(M, N, device=device, dtype=dtype)
        w = torch.randn(N, device=device, dtype=dtype)
        lib_y = norm._norm_fwd(x, w, None, 1e-6, False, None, True)[0]
        lib = bench(lambda: norm._norm_fwd(x, w, None, 1e-6, False, None, True), smoke)
        ref = bench(lambda: torch.nn.functional.rms_norm(x, (N,), w, 1e-6), smoke)
        rows = []
        max_block_n = norm._configs()[0]
        for tile, per_sm in ([(256, 1)] if smoke else itertools.product((1024, 2048, 4096, 8192), (1, 2, 4, 8))):
            norm._launch_shape.cache_clear()
            with mock.patch.object(norm, "_configs", lambda t=tile, p=per_sm: (max_block_n, t, p)):
                y = norm._norm_fwd(x, w, None, 1e-6, False, None, True)[0]
                rows.append((bench(lambda: norm._norm_fwd(x, w, None, 1e-6, False, None, True), smoke),
                             f"tile={tile} per_sm={per_sm}", torch.equal(y, lib_y)))
        norm._launch_shape.cache_clear()
        report(f"RMSNorm forward [{M}, {N}]", lib, ref, rows, top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["dbias", "colsum", "normfwd"])
    p.add_argument("--top", type=int, default=6)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    device, dtype = ("cpu", torch.float32) if a.smoke else ("cuda", torch.bfloat16)
    torch.manual_seed(0)
    for part in a.parts:
        {"dbias": dbias, "colsum": colsum, "normfwd": normfwd}[part](device, dtype, a.smoke, a.top)


if __name__ == "__main__":
    main()
