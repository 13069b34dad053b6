"""The MoE layer's two grouped weight gradients, walked along K first and along N first
(fuseops/kernels/gemm/wgrad_walk.py): the bf16 and FP8 blockwise Gluon kernels against
``torch._grouped_mm``, at the expert shapes of benchmarks/moe_layer.py, same run, interleaved
rounds (median). ``fc1``: dw1 [E, 2I, H] = dz^T x; ``fc2``: dw2 [E, H, I] = dy^T h.

    python -m benchmarks.wgrad_walk [--rounds 3] [--rep 40]   # table; wgrad_walk-<gpu>-<date>.json and .png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks._results import RESULTS, results_path
from benchmarks._timing import interleaved_medians
from benchmarks.plot import plot_file
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_wgrad import reference_grouped_gemm_wgrad
from fuseops.kernels.gemm.wgrad_walk import n_fastest
from fuseops.kernels.hopper.blockwise_wgrad import grouped_blockwise_wgrad
from fuseops.kernels.hopper.wgrad import BLOCK_K, BLOCK_N, grouped_wgrad_hopper
from fuseops.kernels.quantization.operand import Operand

# name: (E, rows routed, H, I)
SHAPES = {"mixtral-8x7b": (8, 8192 * 2, 4096, 14336), "qwen3-30b-a3b": (128, 32768 * 8, 2048, 768)}


def cases(H: int, I: int) -> dict[str, tuple[int, int]]:
    """(N, K) of dw per layer."""
    return {"fc1": (2 * I, H), "fc2": (H, I)}


def fp8_columns(rows: int, M: int, E: int) -> Operand:
    """A column-wise FP8 copy [rows, P] in the padded grouped layout, 1x128 scales."""
    P = M + E * 128
    data = torch.randn(rows, P, device="cuda").clamp(-4, 4).to(torch.float8_e4m3fn)
    return Operand(data, torch.rand(rows, P // 128, device="cuda") + 0.5)


def time_layer(shape: str, layer: str, E: int, M: int, N: int, K: int, args) -> list[dict]:
    offsets = group_offsets(torch.full((E,), M // E, device="cuda"))
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    dw = torch.empty(E, N, K, device="cuda", dtype=torch.bfloat16)
    offs32 = offsets[1:].to(torch.int32)
    a8, b8 = fp8_columns(N, M, E), fp8_columns(K, M, E)
    dw8 = torch.empty(E, N, K, device="cuda", dtype=torch.bfloat16)
    # The bf16 kernel against float64 on the first expert, each order, before timing.
    ref = reference_grouped_gemm_wgrad(dy[: M // E].double(), x[: M // E].double(), offsets[:2])[0]
    for along_n in (False, True):
        grouped_wgrad_hopper(dy, x, offsets, out=dw, along_n=along_n)
        err = ((dw[0].double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (shape, layer, along_n, err)
    fns = {"torch._grouped_mm": lambda: torch._grouped_mm(dy.t(), x, offs=offs32)}
    for along_n in (False, True):
        walk = "N first" if along_n else "K first"
        fns[f"bf16 {walk}"] = lambda a=along_n: grouped_wgrad_hopper(dy, x, offsets, out=dw, along_n=a)
        fns[f"fp8 blk {walk}"] = lambda a=along_n: grouped_blockwise_wgrad(a8, b8, offsets, dw8, False, a)
    ms = interleaved_medians(fns, args.rounds, rep=args.rep)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    picked = {f"bf16 {'N first' if n_fastest(N, K, BLOCK_N, BLOCK_K[False], sms) else 'K first'}",
              f"fp8 blk {'N first' if n_fastest(N, K, 128, 128, sms) else 'K first'}"}
    return [dict(shape=shape, layer=layer, N=N, K=K, impl=name, ms=t, tflops=2.0 * M * N * K / t / 1e9,
                 picked=name in picked) for name, t in ms.items()]


def run(args) -> list[dict]:
    rows = []
    for shape, (E, M, H, I) in SHAPES.items():
        for layer, (N, K) in cases(H, I).items():
            rows += time_layer(shape, layer, E, M, N, K, args)
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep", type=int, default=40)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, timing="interleaved do_bench medians")
    path = results_path("wgrad_walk", directory=args.out_dir)
    path.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    plot_file(path)
    print(f"\n{'shape':<15}{'layer':<6}{'impl':<20}{'ms':>8}{'TFLOP/s':>9}  picked")
    for r in rows:
        print(f"{r['shape']:<15}{r['layer']:<6}{r['impl']:<20}{r['ms']:>8.3f}{r['tflops']:>9.0f}  {'*' if r['picked'] else ''}")


if __name__ == "__main__":
    main()
