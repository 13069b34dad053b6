"""Where the fused dense GEMM pays and where cuBLAS plus an elementwise kernel is faster (the data
behind the dispatch table's shape-aware rows): per shape class, one forward call of ``y = act(x @ W^T + b)``
(+ a residual) through the fused kernel (``dense.gemm``) against the dispatch table's other
branch, ``dense_cublas.gemm`` (``torch.addmm``, then fuseops' activation kernel or an in-place
``add``), and of ``y = silu(z_a) * z_b`` with ``z = x @ W^T + b`` through ``dense_gated.gemm_gated``
against ``dense_cublas.gemm_gated`` (``torch.addmm``, then fuseops' gated activation kernel), with
``z`` saved (a training forward, "+saved") or not, and of the dgrad epilogues ``dz = (dy @ W) * gelu'(z)``
and ``dx = dy @ W + r`` (``dense.gemm`` with ``act_grad_input`` or ``residual`` and ``W`` as it is,
against ``torch.mm`` then fuseops' activation backward kernel or an in-place ``add``); bf16
(``--dtype`` float16 or float32) on the GPU, the two branches in two interleaved rounds, the
faster of each, timed two ways:

- eager: wall time per call, calls back to back (what a user's eager step pays; the host's
  cost counts where it exceeds the GPU's),
- graphed: the same call replayed from a CUDA graph (GPU time alone).

Each cell also shows the branch the dispatch table picks for it (``kernels/dense_dispatch.py``,
whose rules were fitted to this script's results on an H100:
``results/dense_dispatch-h100-2026-11-27.json``) and the time of that branch, from the two timed
above (nothing more is timed); the summary counts the cells where the table picked the slower
branch. Run with ``FUSEOPS_DENSE_DISPATCH`` unset.

    python -m benchmarks.dense_dispatch [--table forward] [--epilogues ...] [--rows ...] [--dtype ...]

Each run adds its cells as one table (``--table``, by default the epilogues' names) to
``benchmarks/results/dense_dispatch-<gpu>-<date>.json`` (``--out``), keeping that file's other
tables: the H100 file holds ``forward``, ``gated``, ``dgrad``, ``float16`` and ``float32``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks._results import results_path
from fuseops.kernels.dense_dispatch import prefers_cublas, prefers_cublas_gated
from fuseops.kernels.dispatch import Backend, backend_of
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense, dense_cublas, dense_gated

ROWS = (64, 256, 1024, 4096, 16384)
# (in_features K, out_features N)
WIDTHS = ((1024, 4096), (4096, 1024), (2048, 8192), (8192, 2048), (4096, 14336), (14336, 4096))
# (in_features K, 2F): the gated GEMM's widths. sizes.py's SwiGLU stacks (F = 8H/3 rounded down to 64:
# H = 1024, 2048, 4096), Llama-3-8B / Mistral-7B (4096, 2 x 14336), Qwen2.5-0.5B (896, 2 x 4864) and a
# narrow, deep one (8192, 2 x 3584).
GATED_WIDTHS = ((896, 9728), (1024, 5376), (2048, 10880), (4096, 21760), (4096, 28672), (8192, 7168))
GATED = ("bias+swiglu+saved", "bias+swiglu")
ROUNDS = 2
# The dgrad epilogues (``dz = (dy @ W) * gelu'(z)``, BackwardActivationLinear; ``dx = dy @ W + dbranch``,
# BackwardExtraOutputLinear): ``W`` [K, N] row-major, the forward's weight as it is, over WIDTHS' (K, N).
DGRAD = ("dgrad+gelu", "dgrad+residual")
EPILOGUES = ("bias+gelu", "bias", "bias+residual", *GATED, *DGRAD)


def _calls(fn, most: int, budget_us: float) -> int:
    """How many calls of ``fn`` fit ``budget_us`` (at least 3, at most ``most``): the large cells
    (16384 rows, 4096 x 28672) take milliseconds a call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return max(3, min(most, int(budget_us / ((time.perf_counter() - start) * 1e6))))


def eager_us(fn, calls: int = 200) -> float:
    """Fastest of five batches of back-to-back calls, microseconds per call."""
    calls = _calls(fn, calls, 50_000)
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
    calls = _calls(fn, calls, 20_000)
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


def implementations(M: int, K: int, N: int, epilogue: str, dtype: torch.dtype = torch.bfloat16) -> tuple[dict, str]:
    """The two branches of one cell, and the one the dispatch table picks for it."""
    kw = dict(device="cuda", dtype=dtype)
    x, w, b = torch.randn(M, K, **kw), torch.randn(N, K, **kw) / K**0.5, torch.randn(N, **kw)
    if epilogue in DGRAD:
        w, z = torch.randn(K, N, **kw) / K**0.5, torch.randn(M, N, **kw)
        epi = dict(act=Activation.GELU_TANH, act_grad_input=z) if epilogue == "dgrad+gelu" else dict(residual=z)
        picks_cublas = backend_of(x) is Backend.SM90 and prefers_cublas(x, w, **epi)
        impls = {"fuseops": lambda: dense.gemm(x, w, **epi), "cublas": lambda: dense_cublas.gemm(x, w, **epi)}
        return impls, "cublas" if picks_cublas else "fuseops"
    if epilogue in GATED:
        epi = dict(bias=b, act=Activation.SILU, save_preact=epilogue.endswith("+saved"))
        picks_cublas = backend_of(x) is Backend.SM90 and prefers_cublas_gated(x, w.t(), **epi)
        impls = {"fuseops": lambda: dense_gated.gemm_gated(x, w.t(), **epi),
                 "cublas": lambda: dense_cublas.gemm_gated(x, w.t(), **epi)}
        return impls, "cublas" if picks_cublas else "fuseops"
    r = torch.randn(M, N, **kw) if epilogue == "bias+residual" else None
    epi = dict(bias=b, act=Activation.GELU_TANH if epilogue == "bias+gelu" else Activation.IDENTITY, residual=r)
    # The table's row serves sm_90 only; elsewhere every call is fused.
    picks_cublas = backend_of(x) is Backend.SM90 and prefers_cublas(x, w.t(), **epi)
    impls = {"fuseops": lambda: dense.gemm(x, w.t(), **epi), "cublas": lambda: dense_cublas.gemm(x, w.t(), **epi)}
    return impls, "cublas" if picks_cublas else "fuseops"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="JSON file (default results/dense_dispatch-<gpu>-<date>.json)")
    parser.add_argument("--table", help="name of this run's table in the file (default: the epilogues, the dtype)")
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="the operands' dtype (the rules were fitted on bfloat16)")
    parser.add_argument("--epilogues", nargs="*", default=list(EPILOGUES), choices=EPILOGUES)
    args = parser.parse_args()
    out = args.out or results_path("dense_dispatch")
    table = args.table or "+".join(args.epilogues) + ("" if args.dtype == "bfloat16" else f" {args.dtype}")
    saved = json.loads(out.read_text()) if out.exists() else {}
    tables = saved.get("tables", {})
    cells = []
    print(f"{'epilogue':14s} {'M':>6s} {'K':>6s} {'N':>6s} {'eager f/c us':>16s} {'x':>6s} "
          f"{'graphed f/c us':>18s} {'x':>6s}  table {'us':>8s}")
    for epilogue in args.epilogues:
        for K, N in (GATED_WIDTHS if epilogue in GATED else WIDTHS):
            for M in args.rows:
                impls, picked = implementations(M, K, N, epilogue, getattr(torch, args.dtype))
                cell = {"epilogue": epilogue, "M": M, "K": K, "N": N, "dtype": args.dtype}
                # Two interleaved rounds, the faster of each: a large cell's GEMMs heat the GPU, so the
                # branch timed second runs slower (on an H100, cuBLAS 323 against 262 us timed alone).
                for _ in range(ROUNDS):
                    for name, fn in impls.items():
                        for col, timer in (("eager", eager_us), ("graphed", graphed_us)):
                            key = f"{name}_{col}_us"
                            cell[key] = min(cell.get(key, float("inf")), timer(fn))
                cell["eager_speedup"] = cell["cublas_eager_us"] / cell["fuseops_eager_us"]
                cell["graphed_speedup"] = cell["cublas_graphed_us"] / cell["fuseops_graphed_us"]
                cell["table_branch"] = picked
                cell["table_eager_us"] = cell[f"{picked}_eager_us"]
                cell["table_graphed_us"] = cell[f"{picked}_graphed_us"]
                cells.append(cell)
                print(f"{epilogue:14s} {M:6d} {K:6d} {N:6d} {cell['fuseops_eager_us']:7.1f}/"
                      f"{cell['cublas_eager_us']:<8.1f} {cell['eager_speedup']:5.2f}x "
                      f"{cell['fuseops_graphed_us']:8.1f}/{cell['cublas_graphed_us']:<9.1f} "
                      f"{cell['graphed_speedup']:5.2f}x  {picked:6s} {cell['table_graphed_us']:8.1f}"
                      f"{'  (slower)' if _slower(cell, 'graphed') else ''}", flush=True)
                summary = {col: _summary(cells, col) for col in ("graphed", "eager")}
                # After every cell, so that a run stopped by a time limit keeps what it measured.
                tables[table] = {"command": "python -m benchmarks.dense_dispatch " + " ".join(sys.argv[1:]),
                                 "summary": summary, "cells": cells}
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "tables": tables}, indent=1))
    for col, s in summary.items():
        print(f"{col}: table {s['table_us']:.1f} us, always fused {s['fuseops_us']:.1f}, always cuBLAS "
              f"{s['cublas_us']:.1f}, the faster per cell {s['best_us']:.1f}; the table picked the slower "
              f"branch in {s['table_wrong']} of {len(cells)} cells, worst by {s['table_worst']:.2f}x")


def _slower(cell: dict, col: str) -> bool:
    return cell[f"table_{col}_us"] > min(cell[f"fuseops_{col}_us"], cell[f"cublas_{col}_us"])


def _summary(cells: list[dict], col: str) -> dict:
    """Sums over the cells of each branch's time, the table's and the faster one's; the table's errors."""
    best = [min(c[f"fuseops_{col}_us"], c[f"cublas_{col}_us"]) for c in cells]
    return {
        **{f"{name}_us": sum(c[f"{name}_{col}_us"] for c in cells) for name in ("fuseops", "cublas", "table")},
        "best_us": sum(best),
        "table_wrong": sum(_slower(c, col) for c in cells),
        "table_worst": max(c[f"table_{col}_us"] / b for c, b in zip(cells, best)),
    }


if __name__ == "__main__":
    main()
