"""FP8 blockwise grouped GEMMs for Hopper, warp-specialized (Gluon): forward and dgrad.

The same products as gemm/grouped_scaled.py under ``Scaling.BLOCK`` (forward / dgrad over
rows grouped by device offsets), built differently:
each 128-long K step's product needs its own scales, and Triton 3.6 compiles that loop so
that all warps wait for every step's wgmma and rescale in lockstep while the tensor cores
idle (.notes/quantize.md). Here a TMA producer warp fills a ring of stages and two consumer
warpgroups take the two 64-row halves of each 128x128 output tile; each waits only for its
own product, releases the stage on its own (the ``empty`` barrier counts both) and rescales
while the other's MMAs run. Measured on an H100 (benchmarks/quantize.py, E=8 T=16384
4096x14336): forward 1052 TFLOP/s against the Triton kernel's 642.

Used on sm_90 when every operand can sit behind a TMA descriptor (``usable``); elsewhere,
and under the interpreter, the Triton kernels run. gemm/dense_scaled.py's dense BLOCK GEMMs run here
as one group (``dense_blockwise``; the dense wgrad as a forward with per-row scales on both
operands). The wgrad is hopper/blockwise_wgrad.py; the pipeline pieces both share
(tile walk, ring, steps) are hopper/pipeline.py. Nothing syncs with the host: tiles are counted
in-kernel from the offsets, and every partition walks them in the same order.
"""

from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.gemm.dense import fresh_tma_ok, tma_ok
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.hopper.pipeline import (
    BLOCK,
    CONSUMER_REGS,
    HALF,
    PRODUCER_REGS,
    descriptor,
    dummy_or,
    grouped_operands_ready,
    grouped_tile,
    load_steps,
    mma_layout,
    mma_steps,
    on_sm90,
    ring,
    spread_layout,
    start_walk,
    total_tiles,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

STAGES = 4
GROUP_M = 8


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether these operands take the warp-specialized kernels: CUDA sm_90, every tensor
    behind a TMA descriptor (last dim contiguous, 16-byte aligned rows)."""
    return on_sm90(tensors[0]) and tma_ok(*tensors)


@gluon.jit
def _forward_producer(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                      NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                      BLOCK_G: gl.constexpr):
    BN: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    g, g_first, g_tiles = start_walk(offsets, tiles_n)
    i = 0
    for tile in range(gl.program_id(0), total_tiles(offsets, G, tiles_n, BLOCK_G, 1), NUM_PROGRAMS):
        g, g_first, g_tiles, row0, size, pid_m, pid_n = grouped_tile(tile, g, g_first, g_tiles, offsets,
                                                                    tiles_n, GROUP_M)
        # A tile may overhang into the next group: those rows are never stored.
        a_row = (row0 + pid_m * 128).to(gl.int32)
        i = load_steps(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, a_row, g * N + pid_n * BN, 0,
                       k_tiles, i, STAGES)


@gluon.jit
def _forward_consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, offsets, a_scale,
                      b_scale, a_outer, b_outer, bias, y, G, N, K, stride_as, stride_bsg, stride_bsn, stride_as_step,
                      stride_bs_step, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, half_row,
                      B_ROWS_PER_SCALE: gl.constexpr, HAS_OUTER_A: gl.constexpr,
                      HAS_OUTER_B: gl.constexpr, HAS_BIAS: gl.constexpr, ACCUMULATE: gl.constexpr,
                      NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                      BLOCK_G: gl.constexpr):
    """Rows ``half_row..+64`` (0 or 64) of each 128-row tile, all its columns (added to y's
    with ACCUMULATE). ``half_row`` is a runtime value: Gluon 3.6 takes no literal constexpr
    among a partition's arguments."""
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
        off_m = pid_m * 128 + half_row
        offs_m = off_m + gl.arange(0, HALF, layout=row_layout)
        mask_m = offs_m < size
        rows = row0 + offs_m
        cols = pid_n * BN + gl.arange(0, BN, layout=col_layout)
        mask_n = cols < N
        if B_ROWS_PER_SCALE == 1:
            cols_1d = pid_n * BN + gl.arange(0, BN, layout=spread_layout(BN))
            sb_ptrs = b_scale + g * stride_bsg + cols_1d * stride_bsn
            sb_mask = cols_1d < N
        else:
            sb_ptrs = b_scale + g * stride_bsg + pid_n * stride_bsn
            sb_mask = None
        acc, i = mma_steps(a_bufs, b_bufs, ready, empty, a_scale + rows * stride_as, mask_m, sb_ptrs, sb_mask,
                           stride_as_step, stride_bs_step, k_tiles, i, STAGES, B_ROWS_PER_SCALE == 1, acc_layout)
        if HAS_OUTER_A:
            acc *= gl.load(a_outer + g * stride_aog + rows * stride_aom, mask=mask_m, other=0.0)[:, None]
        if HAS_OUTER_B:
            acc *= gl.load(b_outer + g * stride_bog + cols * stride_bon, mask=mask_n, other=0.0)[None, :]
        if HAS_BIAS:
            acc += gl.load(bias + g * stride_biasg + cols, mask=mask_n, other=0.0).to(gl.float32)[None, :]
        if ACCUMULATE:
            acc += gl.load(y + rows[:, None] * stride_ym + cols[None, :], mask=mask_m[:, None] & mask_n[None, :],
                           other=0.0).to(gl.float32)
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
def grouped_blockwise_kernel(a_desc, b_desc, y_desc, offsets, a_scale, b_scale, a_outer, b_outer, bias, y,
                             G, N, K, stride_as, stride_bsg, stride_bsn, stride_as_step, stride_bs_step, stride_aog,
                             stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                             B_ROWS_PER_SCALE: gl.constexpr, HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr,
                             HAS_BIAS: gl.constexpr, ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
                             STAGES: gl.constexpr, GROUP_M: gl.constexpr, BLOCK_G: gl.constexpr,
                             num_warps: gl.constexpr):
    """Forward / dgrad: ``a_desc`` over a [M, K] (64-row boxes), ``b_desc`` over b as
    [G * N, K] (a tile past N reads the next group's rows: those columns are never stored),
    ``y_desc`` over y [M, N] (64-row boxes). Scales ``*_step`` apart from K step to K step."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top, a_bottom, b_bufs, y_top, y_bottom, ready, empty = ring(a_desc, b_desc, y_desc, STAGES)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_forward_consumer, (a_desc, b_desc, y_desc, a_top, b_bufs, y_top, ready, empty, offsets, a_scale, b_scale,
                             a_outer, b_outer, bias, y, G, N, K, stride_as, stride_bsg, stride_bsn, stride_as_step,
                             stride_bs_step, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                             gl.to_tensor(0), B_ROWS_PER_SCALE, HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, ACCUMULATE,
                             NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (_forward_consumer, (a_desc, b_desc, y_desc, a_bottom, b_bufs, y_bottom, ready, empty, offsets, a_scale,
                             b_scale, a_outer, b_outer, bias, y, G, N, K, stride_as, stride_bsg, stride_bsn,
                             stride_as_step, stride_bs_step, stride_aog, stride_aom, stride_bog, stride_bon,
                             stride_biasg, stride_ym, gl.to_tensor(HALF), B_ROWS_PER_SCALE, HAS_OUTER_A, HAS_OUTER_B,
                             HAS_BIAS, ACCUMULATE, NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (_forward_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                             NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def grouped_blockwise(a: Operand, b: Operand, offsets: torch.Tensor, y: torch.Tensor,
                      bias: torch.Tensor | None, accumulate: bool = False) -> torch.Tensor:
    """grouped_gemm_scaled under ``Scaling.BLOCK`` into ``y`` [M, N] (added to it with
    ``accumulate``): ``a`` [M, K] with 1x128 scales, ``b`` [G, N, K] (contiguous) with
    128x128 or 1x128 scales, ``bias`` [G, N]. Callers check ``usable``."""
    M, (G, N, K) = a.data.shape[0], b.data.shape
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    programs = persistent_programs(y, (cdiv(M, BLOCK) + G) * cdiv(N, BLOCK))
    a_scale, b_scale = a.scale, b.scale
    if b.rows_per_scale == 1:
        # Per-column scales (the dense wgrad): step-major as in the grouped wgrad, a step's
        # contiguous (H100, 16384 rows 14336x4096: 776 -> 846 TFLOP/s). The forward and dgrad
        # keep a's row-major: each thread's row scales stay in L1 from step to step
        # (step-major a: 1016 -> 959 TFLOP/s).
        a_scale = a.scale.t().contiguous().t()
        b_scale = b.scale.transpose(1, 2).contiguous().transpose(1, 2)
    launch(grouped_blockwise_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data.view(G * N, K), BLOCK), descriptor(y, HALF), offsets,
        a_scale, b_scale, dummy_or(a.outer, y), dummy_or(b.outer, y), dummy_or(bias, y), y, G, N, K,
        a_scale.stride(0), b_scale.stride(0), b_scale.stride(1), a_scale.stride(1), b_scale.stride(2),
        aog, aom, bog, bon,
        bias.stride(0) if bias is not None else 0, y.stride(0),
        B_ROWS_PER_SCALE=b.rows_per_scale, HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None,
        HAS_BIAS=bias is not None, ACCUMULATE=accumulate, NUM_PROGRAMS=programs, STAGES=STAGES, GROUP_M=GROUP_M,
        BLOCK_G=max(32, next_power_of_2(G)), num_warps=4,
    )
    return y


def dense_blockwise(a: Operand, b: Operand, y: torch.Tensor, bias: torch.Tensor | None,
                    accumulate: bool) -> torch.Tensor:
    """gemm_scaled under ``Scaling.BLOCK`` (forward, dgrad, and wgrad from the column-wise
    copies) as one group: ``a`` [M, K] with 1x128 scales, ``b`` [N, K] (contiguous) with
    128x128 or 1x128 scales, into ``y`` [M, N] (added to it with ``accumulate``)."""
    M = a.data.shape[0]
    # [0, M] made on the device (no host copy, so it also captures in a CUDA graph).
    offsets = torch.arange(0, 2 * M, M, device=y.device)
    b = dataclasses.replace(b, data=b.data.unsqueeze(0), scale=b.scale.unsqueeze(0),
                            outer=None if b.outer is None else b.outer.view(1, -1))
    return grouped_blockwise(a, b, offsets, y, None if bias is None else bias.view(1, -1), accumulate)


def serves_gemm_scaled(a: Operand, b: Operand, *, scaling: Scaling, out_dtype: torch.dtype,
                       bias: torch.Tensor | None = None, main_grad: torch.Tensor | None = None,
                       out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row for gemm/dense_scaled.py's ``gemm_scaled``: FP8
    blockwise with 1x128 scales on ``a`` and every operand TMA-ready."""
    M, N = a.data.shape[0], b.data.shape[0]
    if scaling != Scaling.BLOCK or a.rows_per_scale != 1 or not (M and N) or not b.data.is_contiguous():
        return False
    y = main_grad if main_grad is not None else out
    return usable(a.data, b.data) and (tma_ok(y) if y is not None else fresh_tma_ok((M, N), out_dtype))


def gemm_scaled(a: Operand, b: Operand, *, scaling: Scaling, out_dtype: torch.dtype,
                bias: torch.Tensor | None = None, main_grad: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/dense_scaled.py's ``gemm_scaled`` (same arguments) on this kernel."""
    y = main_grad
    if y is None:
        y = out if out is not None else torch.empty(a.data.shape[0], b.data.shape[0], dtype=out_dtype,
                                                    device=a.data.device)
    return dense_blockwise(a, b, y, bias, accumulate=main_grad is not None)


def serves_grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                               out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                               out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row for gemm/grouped_scaled.py's ``grouped_gemm_scaled``: FP8
    blockwise with every operand TMA-ready (a weight strided along K is read from a
    contiguous copy, as the Triton launcher reads it)."""
    M, N = a.data.shape[0], b.data.shape[1]
    if scaling != Scaling.BLOCK or not (M and N):
        return False
    return grouped_operands_ready(a.data, b.data, out, (M, N), out_dtype)


def grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                        out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled.py's ``grouped_gemm_scaled`` (same arguments) on this kernel."""
    b_mem = b.data if b.data.stride(2) == 1 else b.data.contiguous()
    y = out if out is not None else torch.empty(a.data.shape[0], b.data.shape[1], dtype=out_dtype,
                                                device=a.data.device)
    return grouped_blockwise(a, dataclasses.replace(b, data=b_mem), offsets, y, bias)
