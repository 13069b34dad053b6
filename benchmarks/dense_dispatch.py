"""Where the fused dense GEMM pays and where cuBLAS plus an elementwise kernel is faster
(issue 20's shape-aware dispatch): per shape class, one forward call of ``y = act(x @ W^T + b)``
(+ a residual) through fuseops' GEMM launcher against ``torch.addmm`` + the torch activation
(+ ``add``), bf16 on the GPU, timed two ways:

- eager: wall time per call, calls back to back (what a user's eager step pays; the host's
  cost counts where it exceeds the GPU's),
- graphed: the same call replayed from a CUDA graph (GPU time alone).

The table says which is faster per cell and by how much; the dispatch table's rows for the
dense GEMM would take their shape classes from it.

    python -m benchmarks.dense_dispatch [--out benchmarks/results/dense_dispatch.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm.dense import gemm

ROWS = (64, 256, 1024, 4096, 16384)
# (in_features K, out_features N)
WIDTHS = ((1024, 4096), (4096, 1024), (2048, 8192), (8192, 2048), (4096, 14336), (14336, 4096))
EPILOGUES = ("bias+gelu", "bias", "bias+residual")


def eager_us(fn, calls: int = 200) -> float:
    """Fastest of five batches of back-to-back calls, microseconds per call."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) * 1e6 / calls)
    return best


def graphed_us(fn, calls: int = 50) -> float:
    """GPU microseconds per call, from a CUDA graph of ``calls`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def implementations(M: int, K: int, N: int, epilogue: str) -> dict:
    kw = dict(device="cuda", dtype=torch.bfloat16)
    x, w, b = torch.randn(M, K, **kw), torch.randn(N, K, **kw) / K**0.5, torch.randn(N, **kw)
    r = torch.randn(M, N, **kw) if epilogue == "bias+residual" else None
    act = Activation.GELU_TANH if epilogue == "bias+gelu" else Activation.IDENTITY

    def fused():
        return gemm(x, w.t(), bias=b, act=act, residual=r)

    def cublas():
        y = torch.addmm(b, x, w.t())
        if epilogue == "bias+gelu":
            y = F.gelu(y, approximate="tanh")
        elif r is not None:
            y = y + r
        return y

    return {"fuseops": fused, "cublas": cublas}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dense_dispatch.json")
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    parser.add_argument("--epilogues", nargs="*", default=list(EPILOGUES), choices=EPILOGUES)
    args = parser.parse_args()
    cells = []
    print(f"{'epilogue':14s} {'M':>6s} {'K':>6s} {'N':>6s} {'eager f/c us':>16s} {'x':>6s} "
          f"{'graphed f/c us':>18s} {'x':>6s}")
    for epilogue in args.epilogues:
        for K, N in WIDTHS:
            for M in args.rows:
                impls = implementations(M, K, N, epilogue)
                cell = {"epilogue": epilogue, "M": M, "K": K, "N": N}
                for name, fn in impls.items():
                    cell[f"{name}_eager_us"] = eager_us(fn)
                    cell[f"{name}_graphed_us"] = graphed_us(fn)
                cell["eager_speedup"] = cell["cublas_eager_us"] / cell["fuseops_eager_us"]
                cell["graphed_speedup"] = cell["cublas_graphed_us"] / cell["fuseops_graphed_us"]
                cells.append(cell)
                print(f"{epilogue:14s} {M:6d} {K:6d} {N:6d} {cell['fuseops_eager_us']:7.1f}/"
                      f"{cell['cublas_eager_us']:<8.1f} {cell['eager_speedup']:5.2f}x "
                      f"{cell['fuseops_graphed_us']:8.1f}/{cell['cublas_graphed_us']:<9.1f} "
                      f"{cell['graphed_speedup']:5.2f}x", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "cells": cells}, indent=1))


if __name__ == "__main__":
    main()
