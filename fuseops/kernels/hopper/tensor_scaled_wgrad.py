"""The FP8 per-tensor grouped weight gradient for Hopper, warp-specialized (Gluon):
grouped_gemm_scaled_wgrad under ``Scaling.TENSOR``, ``dw[g] = a[:, steps of g] @ b[:, steps of
g]^T`` over the padded grouped layout (each group's positions start on a 128 boundary), times
the group's two scales, written to ``dw`` or added to it.

hopper/fp8_wgrad.py's kernel without block scales: the blockwise wgrad's walk (a group's tiles
consecutive, along N or K first: gemm/wgrad_walk.py), producer and epilogue (tiles inside
``dw[g]`` leave by an asynchronous TMA store, and with ``accumulate`` their float32 sum so far
comes in by TMA under the main loop); each consumer chains its steps into one accumulator
(hopper/pipeline.py's ``chained_steps``). Tiles are [128, 256] when writing dw (as the Triton
kernel's) and [128, 128] into a float32 ``main_grad`` (its staging beside the ring).

Why: the quantized expert layer's weight gradients run at ~1.1 PFLOP/s in the Triton kernel at
the Qwen3-30B-A3B shape (H100). This one there (H200, ``benchmarks/fp8_gemm_tiles.py``): FC2's
wgrad 688 against 736 us, FC1's 1362 against 1518 us (1.07x / 1.11x), the same bits; the FP8
expert layer's micro-batch of eight 11.40 against 11.48 ms. Used where ``serves`` says;
elsewhere the Triton kernel runs.
"""

from __future__ import annotations

import torch

from fuseops.kernels._triton import cdiv
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.gemm.wgrad_walk import n_fastest
from fuseops.kernels.hopper.blockwise import usable
from fuseops.kernels.hopper.fp8_wgrad import grouped_fp8_wgrad_kernel
from fuseops.kernels.hopper.pipeline import BLOCK, HALF, descriptor, dummy_or, dw_descriptor, wgrad_call
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# (columns of a dw tile, ring stages) by ``accumulate``. Writing bf16 dw: 48 KB a stage and 64
# KB of staging fit 3 stages; into float32 main_grad: 32 KB a stage beside 64 KB, 4 stages.
TILES = {False: (256, 3), True: (128, 4)}


def grouped_tensor_scaled_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, dw: torch.Tensor, accumulate: bool,
                                *, block_k: int | None = None, stages: int | None = None,
                                along_n: bool | None = None) -> torch.Tensor:
    """grouped_gemm_scaled_wgrad under ``Scaling.TENSOR`` into ``dw`` [G, N, K] (added to it
    when ``accumulate``): ``a`` [N, P] and ``b`` [K, P] float8, their ``outer`` the groups'
    scales. ``block_k`` / ``stages`` (the benchmark's sweep) default to ``TILES``';
    ``along_n``: the walk order (tests), else wgrad_walk.n_fastest's."""
    G, N, K = dw.shape
    default_k, default_stages = TILES[accumulate]
    block_k, stages = block_k or default_k, stages or default_stages
    programs = persistent_programs(dw, G * cdiv(N, BLOCK) * cdiv(K, block_k))
    if along_n is None:
        along_n = n_fastest(N, K, BLOCK, block_k, programs)
    dw_desc, dw_tma = dw_descriptor(dw, block_k)
    # No block scales: dw stands in for them (never read), their strides 0.
    launch(grouped_fp8_wgrad_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data, block_k), dw_desc, offsets, dw, dw, dummy_or(a.outer, dw),
        dummy_or(b.outer, dw), dw, G, N, K, 0, 0, a.outer_strides()[0], b.outer_strides()[0], dw.stride(0),
        dw.stride(1), BLOCK_SCALES=False, HAS_OUTER=a.outer is not None, ACCUMULATE=accumulate, DW_TMA=dw_tma,
        NUM_PROGRAMS=programs, STAGES=stages, N_FASTEST=along_n, num_warps=4,
    )
    return dw


def serves(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling, out_dtype: torch.dtype,
           main_grad: torch.Tensor | None = None, out: torch.Tensor | None = None) -> bool:
    """A dispatch row for sm_90: FP8 per-tensor with per-group (or per-tensor) scales on both
    operands, TMA-ready operands, a non-empty dw, written in bf16 / fp16 or added to float32."""
    G, N, K = offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0]
    if scaling != Scaling.TENSOR or not (G and N and K) or a.outer_per_row or b.outer_per_row:
        return False
    if (a.outer is None) != (b.outer is None):
        return False
    if main_grad is None and out_dtype not in (torch.bfloat16, torch.float16):
        return False
    return usable(a.data, b.data)


def grouped_gemm_scaled_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                              out_dtype: torch.dtype, main_grad: torch.Tensor | None = None,
                              out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled_wgrad.py's ``grouped_gemm_scaled_wgrad`` (same arguments) on this kernel."""
    return wgrad_call(grouped_tensor_scaled_wgrad, a, b, offsets, out_dtype, main_grad, out)
