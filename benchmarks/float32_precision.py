"""Float32 grouped GEMMs (MoE experts in a float32 model) under torch's two float32 matmul
precisions: fuseops' Triton kernels (``F32_DOT`` "ieee" / "tf32", read from
``torch.backends.cuda.matmul.fp32_precision`` at each call) against what a user writes in plain
torch, a per-expert ``torch.mm`` loop (cuBLAS, which follows the same setting), and against
bf16's fuseops kernel as the ceiling. Forward, dgrad and wgrad at two MoE shapes (those of
``benchmarks.grouped_gemm``), uniform routing; milliseconds from interleaved rounds (``_timing.interleaved_medians``), and
each output's relative error against float64.

    python -m benchmarks.float32_precision        # GPU: a table; results/float32_precision-<gpu>-<date>.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks._results import results_path
from benchmarks._timing import interleaved_medians
from benchmarks.grouped_gemm import split_sizes
from fuseops.kernels.gemm.grouped import group_offsets, grouped_gemm
from fuseops.kernels.gemm.grouped_wgrad import grouped_gemm_wgrad

SHAPES = [(32, 16384, 4096, 2048), (64, 32768, 2048, 1408)]  # E, rows, H, F


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """Torch's CUDA float32 matmul precision set to ``precision`` ("tf32" or "ieee") inside the
    block (what ``torch.set_float32_matmul_precision("high" / "highest")`` sets), restored after
    (the tests use it too: ``tests/helpers.py``)."""
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = precision
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved


def under(precision: str, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    def run():
        with float32_matmul_precision(precision):
            return fn()
    return run


def calls(E: int, T: int, H: int, F: int, dtype: torch.dtype, op: str) -> tuple[Callable, Callable]:
    """(fuseops, per-expert torch loop) of ``op`` on seeded tensors of ``dtype``."""
    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = split_sizes(E, T, "uniform")
    offsets = group_offsets(torch.tensor(sizes, device="cuda"))
    spans = [(sum(sizes[:e]), sum(sizes[:e + 1])) for e in range(E)]
    x = torch.randn(T, H, device="cuda", generator=g).to(dtype)
    w = (torch.randn(E, F, H, device="cuda", generator=g) / math.sqrt(H)).to(dtype)
    dy = torch.randn(T, F, device="cuda", generator=g).to(dtype)
    if op == "forward":
        return (lambda: grouped_gemm(x, w.transpose(1, 2), offsets)[0],
                lambda: torch.cat([x[s:t] @ w[e].T for e, (s, t) in enumerate(spans)]))
    if op == "dgrad":
        return (lambda: grouped_gemm(dy, w, offsets)[0],
                lambda: torch.cat([dy[s:t] @ w[e] for e, (s, t) in enumerate(spans)]))
    return (lambda: grouped_gemm_wgrad(dy, x, offsets),
            lambda: torch.stack([dy[s:t].T @ x[s:t] for s, t in spans]))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="JSON path (default results/float32_precision-<gpu>-<date>.json)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for E, T, H, F in SHAPES:
        for op in ("forward", "dgrad", "wgrad"):
            fused32, loop32 = calls(E, T, H, F, torch.float32, op)
            fused16, _ = calls(E, T, H, F, torch.bfloat16, op)
            _, ref = calls(E, T, H, F, torch.float64, op)
            ref_out = ref()
            fns = {"fuseops ieee": under("ieee", fused32), "fuseops tf32": under("tf32", fused32),
                   "torch loop ieee": under("ieee", loop32), "torch loop tf32": under("tf32", loop32),
                   "fuseops bf16": fused16}
            errors = {name: rel_err(fn(), ref_out) for name, fn in fns.items()}
            ms = interleaved_medians(fns, rounds=args.rounds, warmup=10, rep=40)
            rows.append({"E": E, "T": T, "H": H, "F": F, "op": op, "ms": ms, "rel_err": errors})
            print(rows[-1], flush=True)
            del ref_out
            torch.cuda.empty_cache()
    out = args.out or results_path("float32_precision")
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1))
    names = list(rows[0]["ms"])
    print(f"{'cell':<30}" + "".join(f"{n:>17}" for n in names) + "   tf32 vs ieee   fuseops tf32 vs loop tf32")
    for r in rows:
        ms = r["ms"]
        print(f"{r['op']:<8} E={r['E']} T={r['T']} H={r['H']} F={r['F']}"[:30].ljust(30)
              + "".join(f"{ms[n]:>17.3f}" for n in names)
              + f"   {ms['fuseops ieee'] / ms['fuseops tf32']:>10.2f}x   {ms['torch loop tf32'] / ms['fuseops tf32']:>10.2f}x")
    print("relative errors against float64:")
    for r in rows:
        print(f"  {r['op']:<8} E={r['E']}: " + ", ".join(f"{n} {e:.1e}" for n, e in r["rel_err"].items()))


if __name__ == "__main__":
    main()
