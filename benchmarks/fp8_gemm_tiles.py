"""Tile configs of the quantized grouped GEMMs at an MoE expert shape: each of the expert layer's
six GEMMs (FC1 and FC2 forward, their dgrads and wgrads) under each candidate tile, timed alone;
under FP8 current scaling also on the warp-specialized Gluon kernels (hopper/tensor_scaled*.py).

The library picks one tile per format (``gemm/dense_scaled.py``'s ``_configs``, the wgrad's in
``gemm/grouped_scaled_wgrad.py``), swept at the Mixtral shape (``benchmarks.quantize --tune``).
At Qwen3-30B-A3B the GEMMs are narrow (K = 768 for FC2's forward): this tells whether another
tile is faster there, GEMM by GEMM.

    python -m benchmarks.fp8_gemm_tiles [--shape qwen3-30b-a3b] [--recipe "fp8 current"] [--rep 100]

Each candidate's result is compared with the library tile's (the same products summed in
another order may differ in the last bits; a wrong tile differs by far more). Writes
``benchmarks/results/fp8_gemm_tiles-<gpu>-<date>.json`` (``--out``), one file for both recipes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import triton.testing
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from benchmarks import fp8_moe
from benchmarks._results import results_path
from benchmarks.moe_layer import SHAPES
from fuseops.kernels.gemm import grouped_scaled, grouped_scaled_wgrad
from fuseops.kernels.gemm.grouped import GemmConfig
from fuseops.kernels.hopper import tensor_scaled, tensor_scaled_wgrad
from fuseops.kernels.quantization.formats import Scaling
from fuseops.quant import linear_dgrad, linear_forward, linear_wgrad, quantize

# Forward / dgrad candidates (gemm/grouped_scaled.py's kernel) beside the library's tile.
FORWARD_CANDIDATES = {
    Scaling.TENSOR: [GemmConfig(128, 256, 128, 8, 8, 3), GemmConfig(128, 256, 128, 8, 8, 4),
                     GemmConfig(128, 256, 128, 8, 8, 3, flatten=False),
                     GemmConfig(128, 256, 128, 8, 8, 3, flatten=False, warp_specialize=True),
                     GemmConfig(128, 128, 128, 8, 8, 4), GemmConfig(128, 128, 128, 8, 4, 4),
                     GemmConfig(64, 256, 128, 8, 4, 4), GemmConfig(256, 128, 128, 8, 8, 3),
                     GemmConfig(128, 256, 64, 8, 8, 5), GemmConfig(128, 128, 256, 8, 8, 3)],
    Scaling.BLOCK: [GemmConfig(128, 128, 128, 8, 8, 3, flatten=False),
                    GemmConfig(128, 128, 128, 8, 8, 4, flatten=False), GemmConfig(64, 128, 128, 8, 4, 4)],
}
# The warp-specialized kernels, hopper/tensor_scaled.py (forward and dgrad, its consumers on
# alternate tiles; a consumer's whole 128x256 tile would not fit its registers) and
# tensor_scaled_wgrad.py: (name, output tile columns, stages).
GLUON_CANDIDATES = [("gluon", 128, 4), ("gluon", 128, 3)]
GLUON_WGRAD_CANDIDATES = [("gluon wgrad", 256, 3), ("gluon wgrad", 128, 5)]
WGRAD_CANDIDATES = {
    Scaling.TENSOR: [GemmConfig(128, 128, 256, 1, 8, 3), GemmConfig(128, 256, 128, 1, 8, 3),
                     GemmConfig(128, 128, 256, 1, 8, 4), GemmConfig(128, 128, 128, 1, 8, 4),
                     GemmConfig(128, 256, 128, 1, 8, 4), GemmConfig(64, 256, 128, 1, 8, 4)],
    Scaling.BLOCK: [GemmConfig(128, 128, 128, 1, 8, 4), GemmConfig(128, 128, 128, 1, 8, 3)],
}


def operands(shape: dict, recipe, device: str = "cuda") -> tuple[dict[str, Callable[[], torch.Tensor]], dict]:
    """The expert layer's six GEMMs on uniformly routed rows, each a call on quantized operands;
    and the forward / dgrad GEMMs' kernel operands ``(a, b, offsets)``."""
    E, T, H, I, K = (shape[k] for k in ("E", "T", "H", "I", "K"))
    M = T * K
    torch.manual_seed(0)
    offsets = torch.arange(E + 1, device=device, dtype=torch.int64) * (M // E)
    offsets[-1] = M
    kw = {"device": device, "dtype": torch.bfloat16}
    x, h, dy, dz = (torch.randn(M, n, **kw) for n in (H, I, H, 2 * I))
    w1 = torch.randn(E, 2 * I, H, **kw) / H ** 0.5
    w2 = torch.randn(E, H, I, **kw) / I ** 0.5
    q = {name: quantize(t, recipe, role=role, columnwise=True, offsets=offsets)
         for name, t, role in (("x", x, "input"), ("h", h, "input"), ("dy", dy, "grad"), ("dz", dz, "grad"))}
    qw1, qw2 = (quantize(w, recipe, role="weight", columnwise=True) for w in (w1, w2))
    kernel_operands = {
        "fc1 forward": (q["x"].rowwise_operand(), qw1.rowwise_operand(), offsets),
        "fc2 forward": (q["h"].rowwise_operand(), qw2.rowwise_operand(), offsets),
        "fc2 dgrad": (q["dy"].rowwise_operand(), qw2.columnwise_operand(), offsets),
        "fc1 dgrad": (q["dz"].rowwise_operand(), qw1.columnwise_operand(), offsets),
        "fc2 wgrad": (q["dy"].columnwise_operand(), q["h"].columnwise_operand(), offsets),
        "fc1 wgrad": (q["dz"].columnwise_operand(), q["x"].columnwise_operand(), offsets),
    }
    return {
        "fc1 forward": lambda: linear_forward(q["x"], qw1),
        "fc2 forward": lambda: linear_forward(q["h"], qw2),
        "fc2 dgrad": lambda: linear_dgrad(q["dy"], qw2),
        "fc1 dgrad": lambda: linear_dgrad(q["dz"], qw1),
        "fc2 wgrad": lambda: linear_wgrad(q["dy"], q["h"]),
        "fc1 wgrad": lambda: linear_wgrad(q["dz"], q["x"]),
    }, kernel_operands


def _gluon(a, b, offsets, *, block_n: int, stages: int) -> torch.Tensor:
    """The Gluon forward / dgrad kernel with an explicit tile (a weight strided along K read from
    a contiguous copy, as the library's launchers do)."""
    b = dataclasses.replace(b, data=b.data.contiguous())
    y = torch.empty(a.data.shape[0], b.data.shape[1], dtype=torch.bfloat16, device=a.data.device)
    return tensor_scaled.grouped_tensor_scaled(a, b, offsets, y, None, block_n=block_n, stages=stages)


def _gluon_wgrad(a, b, offsets, *, block_n: int, stages: int) -> torch.Tensor:
    """``tensor_scaled_wgrad.grouped_tensor_scaled_wgrad`` into a fresh bf16 dw, [128, block_n] tiles."""
    dw = torch.empty(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], dtype=torch.bfloat16,
                     device=a.data.device)
    return tensor_scaled_wgrad.grouped_tensor_scaled_wgrad(a, b, offsets, dw, False, block_k=block_n, stages=stages)


def flops(shape: dict, gemm: str) -> float:
    M, H, I = shape["T"] * shape["K"], shape["H"], shape["I"]
    return 2.0 * M * H * (2 * I if gemm.startswith("fc1") else I)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen3-30b-a3b")
    parser.add_argument("--recipe", default="fp8 current", choices=("fp8 current", "fp8 blockwise"))
    parser.add_argument("--rep", type=int, default=100, help="ms of timed repetitions per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--library-only", action="store_true",
                        help="of the Triton tiles only the library's (then the Gluon kernel's candidates)")
    parser.add_argument("--out", type=Path, help="JSON path (default results/fp8_gemm_tiles-<gpu>-<date>.json)")
    args = parser.parse_args()
    shape, recipe = SHAPES[args.shape], fp8_moe.RECIPES[args.recipe]
    scaling = recipe.format("input").scaling
    gemms, kernel_operands = operands(shape, recipe)
    library = {name: fn() for name, fn in gemms.items()}
    rows = []
    # The weight gradients first: a new kernel that hangs leaves the rest timed.
    for name, fn in sorted(gemms.items(), key=lambda item: not item[0].endswith("wgrad")):
        wgrad = name.endswith("wgrad")
        target, attr = (grouped_scaled_wgrad, "pick_wgrad_config") if wgrad else (grouped_scaled, "pick_config")
        candidates = list((WGRAD_CANDIDATES if wgrad else FORWARD_CANDIDATES)[scaling])
        if args.library_only:
            candidates = candidates[:1]
        if scaling == Scaling.TENSOR:
            candidates += GLUON_WGRAD_CANDIDATES if wgrad else GLUON_CANDIDATES
        times: dict[GemmConfig, list[float]] = {c: [] for c in candidates}
        errors: dict[GemmConfig, float] = {}
        for _ in range(args.rounds):
            for cfg in candidates:
                run = fn
                if isinstance(cfg, tuple):
                    a, b, offsets = kernel_operands[name]
                    run = functools.partial(_gluon_wgrad if wgrad else _gluon, a, b, offsets, block_n=cfg[1], stages=cfg[2])
                with mock.patch.object(target, attr, lambda *a, c=cfg, **k: c):
                    try:
                        if cfg not in errors:
                            out = run()
                            ref = library[name].float()
                            errors[cfg] = ((out.float() - ref).norm() / ref.norm()).item()
                        times[cfg].append(triton.testing.do_bench(run, warmup=25, rep=args.rep, return_mode="median"))
                    except (OutOfResources, CompilationError, RuntimeError) as e:  # a tile that fails: say so, go on
                        errors[cfg] = float("nan")
                        print(f"{name} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        for cfg, ts in times.items():
            if not ts:
                continue
            ms = min(ts)
            rows.append({"recipe": args.recipe, "gemm": name, "config": repr(cfg), "us": ms * 1e3,
                         "tflops": flops(shape, name) / ms / 1e9, "rel_diff": errors[cfg]})
            print(f"{name:12} {ms * 1e3:8.1f} us {flops(shape, name) / ms / 1e9:7.0f} TFLOP/s  rel diff "
                  f"{errors[cfg]:.1e}  {cfg}", flush=True)
    print("\nfastest per GEMM:")
    for name in gemms:
        mine = [r for r in rows if r["gemm"] == name]
        if mine:
            best, first = min(mine, key=lambda r: r["us"]), mine[0]
            print(f"  {name:12} {best['us']:8.1f} us ({first['us'] / best['us']:.3f}x the first listed)  {best['config']}")
    # One file per GPU and day: a run of the other recipe at the same shape keeps this one's rows.
    out = args.out or results_path("fp8_gemm_tiles")
    saved = json.loads(out.read_text()) if out.exists() else {}
    kept = [r for r in saved.get("rows", []) if saved.get("shape") == args.shape and r.get("recipe") != args.recipe]
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
                               "rows": kept + rows}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
