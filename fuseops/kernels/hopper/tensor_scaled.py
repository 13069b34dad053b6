"""FP8 per-tensor grouped GEMMs for Hopper, warp-specialized (Gluon): forward and dgrad.

The same products as gemm/grouped_scaled.py under ``Scaling.TENSOR`` (rows grouped by device
offsets, one scale per group and operand, applied to the result), on hopper/blockwise.py's
pipeline: a TMA producer warp fills a ring of stages, two consumer warpgroups take the two
64-row halves of each output tile. Without block scales a consumer's K steps chain into one
accumulator, one wgmma kept in flight while the next stage's operands are awaited, and each
stage is released as soon as the MMA reading it is done. The producer runs ahead into the next
tile while the consumers finish one (the output leaves by asynchronous TMA stores).

Why: at the Qwen3-30B-A3B expert shape the Triton kernel's FP8 GEMMs ran 0.89-1.26 PFLOP/s
(H100, session 36: FC2's forward, K = 768, the slowest), and the quantized expert layer's
GEMMs are its largest share. Measured there (``benchmarks/fp8_gemm_tiles.py``): 1.06-1.09x the
Triton kernel on FC1's and FC2's forward and dgrad, the same bits. Used where
``serves_grouped_gemm_scaled`` says (sm_90, TMA-ready operands, ``Scaling.TENSOR``, a bf16 or
fp16 result); elsewhere, and under the interpreter, the Triton kernel runs.
"""

from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.hopper.blockwise import _forward_producer
from fuseops.kernels.hopper.pipeline import (
    BLOCK,
    CONSUMER_REGS,
    HALF,
    PRODUCER_REGS,
    chained_steps,
    descriptor,
    dummy_or,
    grouped_operands_ready,
    grouped_tile,
    mma_layout,
    ring,
    start_walk,
    total_tiles,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# Output tile columns and ring depth: 48 KB a stage (two 64x128 halves of A, 256x128 of B)
# and 64 KB of output staging fit 3 stages in an SM's 227 KB.
BLOCK_N = 256
STAGES = 3
GROUP_M = 8


@gluon.jit
def _consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, offsets, a_outer, b_outer, bias, y,
              G, N, K, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, half_row,
              HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr, HAS_BIAS: gl.constexpr,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, BLOCK_G: gl.constexpr):
    """Rows ``half_row..+64`` of each 128-row tile, all its columns (as hopper/blockwise.py's
    consumer, whose epilogue this is: the groups' scales, bias, a TMA store where the rows are
    all the group's)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = mma_layout(BN)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    g, g_first, g_tiles = start_walk(offsets, tiles_n)
    i = 0
    for tile in range(gl.program_id(0), total_tiles(offsets, G, tiles_n, BLOCK_G, 4), NUM_PROGRAMS):
        g, g_first, g_tiles, row0, size, pid_m, pid_n = grouped_tile(tile, g, g_first, g_tiles, offsets,
                                                                    tiles_n, GROUP_M)
        acc, i = chained_steps(a_bufs, b_bufs, ready, empty, k_tiles, i, STAGES, acc_layout)
        off_m = pid_m * 128 + half_row
        offs_m = off_m + gl.arange(0, HALF, layout=row_layout)
        mask_m = offs_m < size
        rows = row0 + offs_m
        cols = pid_n * BN + gl.arange(0, BN, layout=col_layout)
        mask_n = cols < N
        if HAS_OUTER_A:
            acc *= gl.load(a_outer + g * stride_aog + rows * stride_aom, mask=mask_m, other=0.0)[:, None]
        if HAS_OUTER_B:
            acc *= gl.load(b_outer + g * stride_bog + cols * stride_bon, mask=mask_n, other=0.0)[None, :]
        if HAS_BIAS:
            acc += gl.load(bias + g * stride_biasg + cols, mask=mask_n, other=0.0).to(gl.float32)[None, :]
        out = acc.to(y_desc.dtype)
        if off_m + HALF <= size:
            # All rows in the group: through TMA, which clips the columns past N.
            tma.store_wait(0)
            y_smem.store(out)
            fence_async_shared()
            tma.async_copy_shared_to_global(y_desc, [(row0 + off_m).to(gl.int32), pid_n * BN], y_smem)
        else:
            gl.store(y + rows[:, None] * stride_ym + cols[None, :], out, mask=mask_m[:, None] & mask_n[None, :])
    tma.store_wait(0)


@gluon.jit
def grouped_tensor_scaled_kernel(a_desc, b_desc, y_desc, offsets, a_outer, b_outer, bias, y, G, N, K,
                                 stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                                 HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr, HAS_BIAS: gl.constexpr,
                                 NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                                 BLOCK_G: gl.constexpr, num_warps: gl.constexpr):
    """``a_desc`` over a [M, K] (64-row boxes), ``b_desc`` over b as [G * N, K] (a tile past N
    reads the next group's rows: those columns are never stored), ``y_desc`` over y [M, N]
    (64-row boxes)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top, a_bottom, b_bufs, y_top, y_bottom, ready, empty = ring(a_desc, b_desc, y_desc, STAGES)
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, y_desc, a_top, b_bufs, y_top, ready, empty, offsets, a_outer, b_outer, bias, y,
                     G, N, K, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                     gl.to_tensor(0), HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (_consumer, (a_desc, b_desc, y_desc, a_bottom, b_bufs, y_bottom, ready, empty, offsets, a_outer, b_outer,
                     bias, y, G, N, K, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                     gl.to_tensor(HALF), HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, NUM_PROGRAMS, STAGES, GROUP_M,
                     BLOCK_G)),
        (_forward_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                             NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def grouped_tensor_scaled(a: Operand, b: Operand, offsets: torch.Tensor, y: torch.Tensor,
                          bias: torch.Tensor | None, *, block_n: int = BLOCK_N, stages: int = STAGES) -> torch.Tensor:
    """grouped_gemm_scaled under ``Scaling.TENSOR`` into ``y`` [M, N]: ``a`` [M, K] float8,
    ``b`` [G, N, K] (contiguous) float8, their ``outer`` the groups' scales, ``bias`` [G, N].
    Callers check ``serves_grouped_gemm_scaled``."""
    M, (G, N, K) = a.data.shape[0], b.data.shape
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    programs = persistent_programs(y, (cdiv(M, BLOCK) + G) * cdiv(N, block_n))
    launch(grouped_tensor_scaled_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data.view(G * N, K), block_n), descriptor(y, HALF, block_n),
        offsets, dummy_or(a.outer, y), dummy_or(b.outer, y), dummy_or(bias, y), y, G, N, K,
        aog, aom, bog, bon, bias.stride(0) if bias is not None else 0, y.stride(0),
        HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None, HAS_BIAS=bias is not None,
        NUM_PROGRAMS=programs, STAGES=stages, GROUP_M=GROUP_M, BLOCK_G=max(32, next_power_of_2(G)), num_warps=4,
    )
    return y


def serves_grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                               out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                               out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row for gemm/grouped_scaled.py's ``grouped_gemm_scaled`` under
    ``Scaling.TENSOR``: float8 operands, per-group (or per-tensor) scales, every operand TMA-ready
    (a weight strided along K is read from a contiguous copy, as the Triton launcher reads it)."""
    M, N = a.data.shape[0], b.data.shape[1]
    if scaling != Scaling.TENSOR or not (M and N) or a.outer_per_row or b.outer_per_row:
        return False
    if out_dtype not in (torch.bfloat16, torch.float16):
        # A float32 output's staging does not fit beside the ring: the Triton kernel writes it.
        return False
    return grouped_operands_ready(a.data, b.data, out, (M, N), out_dtype)


def grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                        out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled.py's ``grouped_gemm_scaled`` (same arguments) on this kernel."""
    b_mem = b.data if b.data.stride(2) == 1 else b.data.contiguous()
    y = out if out is not None else torch.empty(a.data.shape[0], b.data.shape[1], dtype=out_dtype,
                                                device=a.data.device)
    return grouped_tensor_scaled(a, dataclasses.replace(b, data=b_mem), offsets, y, bias)
