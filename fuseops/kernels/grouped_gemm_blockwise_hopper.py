"""FP8 blockwise grouped GEMMs for Hopper, warp-specialized (Gluon).

The same products as grouped_gemm_scaled.py under ``Scaling.BLOCK`` (forward / dgrad over
rows grouped by device offsets, and wgrad over the padded grouped layout), built differently:
each 128-long K step's product needs its own scales, and Triton 3.6 compiles that loop so
that all warps wait for every step's wgmma and rescale in lockstep while the tensor cores
idle (.notes/quantize.md). Here a TMA producer warp fills a ring of stages and two consumer
warpgroups take the two 64-row halves of each 128x128 output tile; each waits only for its
own product, releases the stage on its own (the ``empty`` barrier counts both) and rescales
while the other's MMAs run. Measured on an H100 (benchmarks/quantize.py, E=8 T=16384
4096x14336): forward 1052 TFLOP/s against the Triton kernel's 642, wgrad 754 against 453.

Used on sm_90 when every operand can sit behind a TMA descriptor (``usable``); elsewhere,
and under the interpreter, the Triton kernels run. gemm_scaled.py's dense BLOCK GEMMs run here
as one group (``dense_blockwise``; the dense wgrad as a forward with per-row scales on both
operands). Nothing syncs with the host: tiles are counted in-kernel from the offsets, and
every partition walks them in the same order.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuseops.kernels._triton import INTERPRET
from fuseops.kernels.gemm import tma_ok
from fuseops.kernels.grouped_gemm import _swizzle, persistent_programs
from fuseops.kernels.quant_formats import group_first_position

if TYPE_CHECKING:
    from fuseops.kernels.gemm_scaled import Operand

BLOCK = 128
HALF = BLOCK // 2
STAGES = 4
# wgrad writing dw: 5 stages (+1-14 % over 4 at the MoE shapes, H100; 225 KB of shared memory
# with a float32 dw staged for TMA). Accumulating into main_grad: 4 (192 KB with its staging).
WGRAD_STAGES = {False: 5, True: 4}
GROUP_M = 8
# Registers per thread: the consumers hold a [64, 128] float32 sum and product each; the
# producer only addresses. 2 x 4 warps x 232 + 4 x 40 (the producer's warpgroup) fits 64 K.
CONSUMER_REGS, PRODUCER_REGS = gl.constexpr(232), gl.constexpr(40)


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether these operands take the warp-specialized kernels: CUDA sm_90, every tensor
    behind a TMA descriptor (last dim contiguous, 16-byte aligned rows)."""
    first = tensors[0]
    if INTERPRET or not first.is_cuda or torch.cuda.get_device_capability(first.device) != (9, 0):
        return False
    return tma_ok(*tensors)


@gluon.jit
def _tiles_of(offsets, g, tiles_n):
    return gl.cdiv((gl.load(offsets + g + 1) - gl.load(offsets + g)).to(gl.int32), 128) * tiles_n


@gluon.jit
def _total_tiles(offsets, G, tiles_n, BLOCK_G: gl.constexpr, WARPS: gl.constexpr):
    """Tiles of all groups (``WARPS``: the calling partition's)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    offs = gl.arange(0, BLOCK_G, layout=layout)
    mask = offs < G
    size = (gl.load(offsets + offs + 1, mask=mask, other=0) - gl.load(offsets + offs, mask=mask, other=0))
    return gl.sum(gl.cdiv(size.to(gl.int32), 128) * tiles_n, axis=0)


@gluon.jit
def _start_walk(offsets, tiles_n):
    """The group cursor before the first tile: group 0, its first tile, its tile count."""
    g = gl.to_tensor(0)
    return g, gl.to_tensor(0), _tiles_of(offsets, g, tiles_n)


@gluon.jit
def _seek(tile, g, g_first, g_tiles, offsets, tiles_n):
    """Move the group cursor (g, its first tile, its tile count) forward to the group holding
    ``tile``. Every partition visits tiles in increasing order, so each moves it past every
    group once."""
    while tile >= g_first + g_tiles:
        g += 1
        g_first += g_tiles
        g_tiles = _tiles_of(offsets, g, tiles_n)
    return g, g_first, g_tiles


@gluon.jit
def _grouped_tile(tile, g, g_first, g_tiles, offsets, tiles_n, GROUP_M: gl.constexpr):
    """The cursor at ``tile``, the group's first row and row count, and the tile's (pid_m,
    pid_n) inside the group (the band walk of grouped_gemm.py)."""
    g, g_first, g_tiles = _seek(tile, g, g_first, g_tiles, offsets, tiles_n)
    row0 = gl.load(offsets + g)
    size = (gl.load(offsets + g + 1) - row0).to(gl.int32)
    pid_m, pid_n = _swizzle(tile - g_first, gl.cdiv(size, 128), tiles_n, GROUP_M)
    return g, g_first, g_tiles, row0, size, pid_m, pid_n


@gluon.jit
def _load_steps(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, a_row, b_row, step0, steps, i,
                STAGES: gl.constexpr):
    """Operands of ``steps`` K steps from step ``step0``: A's rows ``a_row..+128`` as two
    halves, B's rows ``b_row..+128``. ``i`` counts the ring's uses across tiles."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    for k in range(steps):
        s = i % STAGES
        # A fresh barrier counts as completed phase 1: the first pass finds every stage free.
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        col = (step0 + k) * BK
        tma.async_copy_global_to_shared(a_desc, [a_row, col], bar, a_top.index(s))
        tma.async_copy_global_to_shared(a_desc, [a_row + HALF, col], bar, a_bottom.index(s))
        tma.async_copy_global_to_shared(b_desc, [b_row, col], bar, b_bufs.index(s))
        i += 1
    return i


@gluon.jit
def _load_scales(sa_ptrs, sa_mask, sb_ptrs, sb_mask, k, steps, sa_step, sb_step, SB_PER_COLUMN: gl.constexpr):
    """Step ``k``'s scales, ``*_step`` apart from step to step (zeros past the last step,
    which are never used)."""
    sa = gl.load(sa_ptrs + k * sa_step, mask=sa_mask & (k < steps), other=0.0)
    if SB_PER_COLUMN:
        sb = gl.load(sb_ptrs + k * sb_step, mask=sb_mask & (k < steps), other=0.0)
    else:
        sb = gl.load(sb_ptrs + k * sb_step, mask=k < steps, other=0.0)
    return sa, sb


@gluon.jit
def _mma_steps(a_bufs, b_bufs, ready, empty, sa_ptrs, sa_mask, sb_ptrs, sb_mask, sa_step, sb_step, steps, i,
               STAGES: gl.constexpr, SB_PER_COLUMN: gl.constexpr, acc_layout: gl.constexpr):
    """One consumer's sum over ``steps`` K steps: each step's product times its scales, the
    rows' ``sa_ptrs`` and the columns' ``sb_ptrs`` (one scalar when not SB_PER_COLUMN, else
    in ``_spread`` layout), advanced by ``sa_step`` / ``sb_step`` elements a step."""
    HALF: gl.constexpr = a_bufs.shape[1]
    BN: gl.constexpr = b_bufs.shape[1]
    zero = gl.zeros([HALF, BN], gl.float32, layout=acc_layout)
    acc = zero
    if SB_PER_COLUMN:
        sa_1, sb_1 = _load_scales(sa_ptrs, sa_mask, sb_ptrs, sb_mask, 0, steps, sa_step, sb_step, SB_PER_COLUMN)
        sa_2, sb_2 = _load_scales(sa_ptrs, sa_mask, sb_ptrs, sb_mask, 1, steps, sa_step, sb_step, SB_PER_COLUMN)
    for k in range(steps):
        if SB_PER_COLUMN:
            # Two steps ahead: a step's 192 scales take longer than the MMA they would wait
            # behind (H100, wgrad: +9-12 % over loading them in the step; the forward's 2 row
            # scales and one scalar gain nothing).
            sa, sb = sa_1, sb_1
            sa_1, sb_1 = sa_2, sb_2
            sa_2, sb_2 = _load_scales(sa_ptrs, sa_mask, sb_ptrs, sb_mask, k + 2, steps, sa_step, sb_step,
                                          SB_PER_COLUMN)
        else:
            # Before the wait for the operands, so their latency overlaps it.
            sa, sb = _load_scales(sa_ptrs, sa_mask, sb_ptrs, sb_mask, k, steps, sa_step, sb_step, SB_PER_COLUMN)
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        part = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                             is_async=True)
        part = warpgroup_mma_wait(0, deps=(part,))
        # Released on its own: neither consumer waits for the other, so one's rescale runs
        # under the other's MMAs.
        mbarrier.arrive(empty.index(s), count=1)
        if SB_PER_COLUMN:
            # Loaded one per thread, then spread: in the product's layout each thread holds
            # half the columns.
            sb = gl.convert_layout(sb, gl.SliceLayout(0, acc_layout))
            acc += part * sa[:, None] * sb[None, :]
        else:
            acc += part * (sa * sb)[:, None]
        i += 1
    return acc, i


@gluon.jit
def prefetch_tile(desc, coord, bar, smem):
    """Start loading an output tile's float32 sum so far into its staging, to arrive while the
    main loop runs (the previous tile's store must have left the staging first)."""
    tma.store_wait(0)
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, coord, bar, smem)


@gluon.jit
def store_tile(acc, desc, coord, smem, staged, bar, loads, ACCUMULATE: gl.constexpr, acc_layout: gl.constexpr):
    """Store ``acc`` through ``smem`` (``staged``: its view in the accumulator's shape) by TMA,
    first adding the tile ``prefetch_tile`` brought with ACCUMULATE; returns the count of
    prefetches waited for. Asynchronous: the store drains under the next tile's main loop."""
    if ACCUMULATE:
        mbarrier.wait(bar, loads & 1)
        loads += 1
        acc += staged.load(acc_layout)
    else:
        tma.store_wait(0)
    staged.store(acc.to(desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, coord, smem)
    return loads


@gluon.constexpr_function
def _spread(n):
    """[n] over one warpgroup's threads, consecutive elements per thread."""
    return gl.BlockedLayout([max(1, n // 128)], [32], [4], [0])


@gluon.constexpr_function
def _acc_layout(BN):
    """A consumer warpgroup's [64, BN] float32 wgmma result."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])


@gluon.jit
def _forward_producer(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                      NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                      BLOCK_G: gl.constexpr):
    BN: gl.constexpr = b_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    g, g_first, g_tiles = _start_walk(offsets, tiles_n)
    i = 0
    for tile in range(gl.program_id(0), _total_tiles(offsets, G, tiles_n, BLOCK_G, 1), NUM_PROGRAMS):
        g, g_first, g_tiles, row0, size, pid_m, pid_n = _grouped_tile(tile, g, g_first, g_tiles, offsets,
                                                                     tiles_n, GROUP_M)
        # A tile may overhang into the next group: those rows are never stored.
        a_row = (row0 + pid_m * 128).to(gl.int32)
        i = _load_steps(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, a_row, g * N + pid_n * BN, 0,
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
    acc_layout: gl.constexpr = _acc_layout(BN)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    g, g_first, g_tiles = _start_walk(offsets, tiles_n)
    i = 0
    for tile in range(gl.program_id(0), _total_tiles(offsets, G, tiles_n, BLOCK_G, 4), NUM_PROGRAMS):
        g, g_first, g_tiles, row0, size, pid_m, pid_n = _grouped_tile(tile, g, g_first, g_tiles, offsets,
                                                                     tiles_n, GROUP_M)
        off_m = pid_m * 128 + half_row
        offs_m = off_m + gl.arange(0, HALF, layout=row_layout)
        mask_m = offs_m < size
        rows = row0 + offs_m
        cols = pid_n * BN + gl.arange(0, BN, layout=col_layout)
        mask_n = cols < N
        if B_ROWS_PER_SCALE == 1:
            cols_1d = pid_n * BN + gl.arange(0, BN, layout=_spread(BN))
            sb_ptrs = b_scale + g * stride_bsg + cols_1d * stride_bsn
            sb_mask = cols_1d < N
        else:
            sb_ptrs = b_scale + g * stride_bsg + pid_n * stride_bsn
            sb_mask = None
        acc, i = _mma_steps(a_bufs, b_bufs, ready, empty, a_scale + rows * stride_as, mask_m, sb_ptrs, sb_mask,
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
def _wgrad_tile(tile, offsets, N, K, BN: gl.constexpr, BK: gl.constexpr):
    """Tile ``tile`` of the wgrad walk: group g (a group's tiles are consecutive, so a wave
    shares its slabs in L2), the tile's (pid_n, pid_k), and the group's first step and step
    count in the padded layout."""
    tiles_k = gl.cdiv(K, BK)
    per_group = gl.cdiv(N, BN) * tiles_k
    g = tile // per_group
    size = (gl.load(offsets + g + 1) - gl.load(offsets + g)).to(gl.int32)
    step0 = (group_first_position(offsets, g) // 128).to(gl.int32)
    return g, (tile % per_group) // tiles_k, tile % tiles_k, step0, gl.cdiv(size, 128)


@gluon.jit
def _wgrad_producer(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                    NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr):
    BN: gl.constexpr = 2 * a_desc.block_type.shape[0]
    BK: gl.constexpr = b_desc.block_type.shape[0]
    i = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, BN) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, step0, steps = _wgrad_tile(tile, offsets, N, K, BN, BK)
        i = _load_steps(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, pid_n * BN, pid_k * BK, step0,
                        steps, i, STAGES)


@gluon.jit
def _wgrad_consumer(a_desc, b_desc, dw_desc, a_bufs, b_bufs, dw_smem, dw_bar, ready, empty, offsets, a_scale,
                    b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao, stride_bo,
                    stride_dwg, stride_dwn, half_row, HAS_OUTER: gl.constexpr, ACCUMULATE: gl.constexpr,
                    DW_TMA: gl.constexpr, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr):
    """Rows ``half_row..+64`` of each [128, 128] tile of ``dw[g]``, summed over g's steps
    (and added to dw's with ACCUMULATE). With DW_TMA (dw contiguous, 16-byte rows) the tiles
    whose rows stay inside dw[g] go through ``dw_desc`` over dw as [G * N, K]: stored
    asynchronously, and with ACCUMULATE loaded under the main loop (``dw_bar``)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = 2 * HALF
    BK: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = _acc_layout(BK)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    i = 0
    loads = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, BN) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, step0, steps = _wgrad_tile(tile, offsets, N, K, BN, BK)
        row0 = pid_n * BN + half_row
        whole = row0 + HALF <= N
        if DW_TMA and ACCUMULATE and whole:
            prefetch_tile(dw_desc, [g * N + row0, pid_k * BK], dw_bar, dw_smem)
        rows = pid_n * BN + half_row + gl.arange(0, HALF, layout=row_layout)
        cols = pid_k * BK + gl.arange(0, BK, layout=col_layout)
        mask_n = rows < N
        mask_k = cols < K
        # Step-major scales ([steps, N] and [steps, K]): a step's are contiguous, loaded one
        # per thread.
        cols_1d = pid_k * BK + gl.arange(0, BK, layout=_spread(BK))
        acc, i = _mma_steps(a_bufs, b_bufs, ready, empty, a_scale + step0 * stride_as + rows, mask_n,
                            b_scale + step0 * stride_bs + cols_1d, cols_1d < K, stride_as, stride_bs, steps, i, STAGES,
                            True, acc_layout)
        if HAS_OUTER:
            acc *= gl.load(a_outer + g * stride_ao) * gl.load(b_outer + g * stride_bo)
        if DW_TMA and whole:
            loads = store_tile(acc, dw_desc, [g * N + row0, pid_k * BK], dw_smem, dw_smem, dw_bar, loads, ACCUMULATE,
                               acc_layout)
        else:
            ptrs = dw + g.to(gl.int64) * stride_dwg + rows[:, None] * stride_dwn + cols[None, :]
            mask = mask_n[:, None] & mask_k[None, :]
            if ACCUMULATE:
                acc += gl.load(ptrs, mask=mask, other=0.0)
            gl.store(ptrs, acc.to(dw.dtype.element_ty), mask=mask)
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
    a_top, a_bottom, b_bufs, y_top, y_bottom, ready, empty = _ring(a_desc, b_desc, y_desc, STAGES)
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


@gluon.jit
def grouped_blockwise_wgrad_kernel(a_desc, b_desc, dw_desc, offsets, a_scale, b_scale, a_outer, b_outer, dw, G,
                                   N, K, stride_as, stride_bs, stride_ao, stride_bo, stride_dwg, stride_dwn,
                                   HAS_OUTER: gl.constexpr, ACCUMULATE: gl.constexpr, DW_TMA: gl.constexpr,
                                   NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """wgrad: ``a_desc`` over dy's column-wise copy [N, P] (64-row boxes), ``b_desc`` over x's
    [K, P], both in the padded grouped layout, their scales step-major ([P / 128, N] and
    [P / 128, K], rows ``stride_as`` / ``stride_bs`` apart); ``dw_desc`` over dw as [G * N, K]
    (64-row boxes) when DW_TMA."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    # The staging of dw is compiled out when unused (no TMA stores).
    a_top, a_bottom, b_bufs, dw_top, dw_bottom, ready, empty = _ring(a_desc, b_desc, dw_desc, STAGES)
    dw_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(dw_bars.index(c), count=1)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_wgrad_consumer, (a_desc, b_desc, dw_desc, a_top, b_bufs, dw_top, dw_bars.index(0), ready, empty, offsets,
                           a_scale, b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao,
                           stride_bo, stride_dwg, stride_dwn, gl.to_tensor(0), HAS_OUTER, ACCUMULATE, DW_TMA,
                           NUM_PROGRAMS, STAGES)),
        (_wgrad_consumer, (a_desc, b_desc, dw_desc, a_bottom, b_bufs, dw_bottom, dw_bars.index(1), ready, empty,
                           offsets, a_scale, b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao,
                           stride_bo, stride_dwg, stride_dwn, gl.to_tensor(HALF), HAS_OUTER, ACCUMULATE, DW_TMA,
                           NUM_PROGRAMS, STAGES)),
        (_wgrad_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                           NUM_PROGRAMS, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


@gluon.jit
def _ring(a_desc, b_desc, out_desc, STAGES: gl.constexpr):
    """Shared memory of both kernels: STAGES of A (two 64-row halves) and B, one output tile
    half per consumer for its TMA stores, and the ring's barriers: ``ready`` (the producer's
    TMA landed) and ``empty`` (both consumers are done) per stage."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_top = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BK], a_desc.layout)
    a_bottom = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    out_top = gl.allocate_shared_memory(out_desc.dtype, [HALF, BN], out_desc.layout)
    out_bottom = gl.allocate_shared_memory(out_desc.dtype, [HALF, BN], out_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    return a_top, a_bottom, b_bufs, out_top, out_bottom, ready, empty


_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5, torch.bfloat16: gl.bfloat16,
              torch.float16: gl.float16, torch.float32: gl.float32}


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A descriptor with [rows, 128] boxes (128-byte swizzle for float8, as wgmma reads it)."""
    layout = gl.NVMMASharedLayout.get_default_for([rows, BLOCK], _GL_DTYPES[t.dtype])
    return TensorDescriptor.from_tensor(t, [rows, BLOCK], layout)


def _dummy_or(t: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    return t if t is not None else dummy


def grouped_blockwise(a: Operand, b: Operand, offsets: torch.Tensor, y: torch.Tensor,
                      bias: torch.Tensor | None, accumulate: bool = False) -> torch.Tensor:
    """grouped_gemm_scaled under ``Scaling.BLOCK`` into ``y`` [M, N] (added to it with
    ``accumulate``): ``a`` [M, K] with 1x128 scales, ``b`` [G, N, K] (contiguous) with
    128x128 or 1x128 scales, ``bias`` [G, N]. Callers check ``usable``."""
    M, (G, N, K) = a.data.shape[0], b.data.shape
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    programs = persistent_programs(y, (triton.cdiv(M, BLOCK) + G) * triton.cdiv(N, BLOCK))
    a_scale, b_scale = a.scale, b.scale
    if b.rows_per_scale == 1:
        # Per-column scales (the dense wgrad): step-major as in the grouped wgrad, a step's
        # contiguous (H100, 16384 rows 14336x4096: 776 -> 846 TFLOP/s). The forward and dgrad
        # keep a's row-major: each thread's row scales stay in L1 from step to step
        # (step-major a: 1016 -> 959 TFLOP/s).
        a_scale = a.scale.t().contiguous().t()
        b_scale = b.scale.transpose(1, 2).contiguous().transpose(1, 2)
    grouped_blockwise_kernel[(programs,)](
        _descriptor(a.data, HALF), _descriptor(b.data.view(G * N, K), BLOCK), _descriptor(y, HALF), offsets,
        a_scale, b_scale, _dummy_or(a.outer, y), _dummy_or(b.outer, y), _dummy_or(bias, y), y, G, N, K,
        a_scale.stride(0), b_scale.stride(0), b_scale.stride(1), a_scale.stride(1), b_scale.stride(2),
        aog, aom, bog, bon,
        bias.stride(0) if bias is not None else 0, y.stride(0),
        B_ROWS_PER_SCALE=b.rows_per_scale, HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None,
        HAS_BIAS=bias is not None, ACCUMULATE=accumulate, NUM_PROGRAMS=programs, STAGES=STAGES, GROUP_M=GROUP_M,
        BLOCK_G=max(32, triton.next_power_of_2(G)), num_warps=4,
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


def grouped_blockwise_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, dw: torch.Tensor,
                            accumulate: bool) -> torch.Tensor:
    """grouped_gemm_scaled_wgrad under ``Scaling.BLOCK`` into ``dw`` [G, N, K] (added to it
    when ``accumulate``): ``a`` [N, P] and ``b`` [K, P] with 1x128 scales along P."""
    G, N, K = dw.shape
    programs = persistent_programs(dw, G * triton.cdiv(N, BLOCK) * triton.cdiv(K, BLOCK))
    dw_tma = dw.is_contiguous() and tma_ok(dw)
    # Without TMA stores the descriptor is only a placeholder (over a view that always has one).
    dw_desc = _descriptor(dw.view(G * N, K) if dw_tma else a.scale.new_empty(HALF, BLOCK, dtype=dw.dtype), HALF)
    # Step-major scales: a step's 128 + 128 of a tile are contiguous, not a sector each
    # (the scales are 1/32 of the operands' bytes).
    a_scale, b_scale = a.scale.t().contiguous(), b.scale.t().contiguous()
    grouped_blockwise_wgrad_kernel[(programs,)](
        _descriptor(a.data, HALF), _descriptor(b.data, BLOCK), dw_desc, offsets, a_scale, b_scale,
        _dummy_or(a.outer, dw), _dummy_or(b.outer, dw), dw, G, N, K, a_scale.stride(0), b_scale.stride(0),
        a.outer_strides()[0], b.outer_strides()[0], dw.stride(0), dw.stride(1),
        HAS_OUTER=a.outer is not None, ACCUMULATE=accumulate, DW_TMA=dw_tma, NUM_PROGRAMS=programs,
        STAGES=WGRAD_STAGES[accumulate], num_warps=4,
    )
    return dw
