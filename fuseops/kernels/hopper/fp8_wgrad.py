"""The warp-specialized FP8 grouped weight gradient for Hopper (Gluon): the kernel that
hopper/blockwise_wgrad.py launches under ``Scaling.BLOCK`` and hopper/tensor_scaled_wgrad.py
under ``Scaling.TENSOR``. ``dw[g] = a[:, steps of g] @ b[:, steps of g]^T`` over the padded
grouped layout (each group's positions start on a 128 boundary), times the group's factors,
written to ``dw`` or added to it.

Built as hopper/fp8_forward.py's kernel from hopper/pipeline.py's pieces: a TMA producer warp
fills the ring, two consumer warpgroups take the 64-row halves of each [128, BK] tile of
``dw[g]``. With ``BLOCK_SCALES`` each step's product is rescaled by its step-major 1x128 scales
on both sides (``mma_steps``); without, the steps chain into one accumulator (``chained_steps``).
A group's tiles are consecutive in the walk, so a wave shares its slabs in L2 (along K or N
first: gemm/wgrad_walk.py; at Mixtral's FC2 2.68 -> 2.46 ms walking along N); tiles inside
``dw[g]`` leave by an asynchronous TMA store, and with ``ACCUMULATE`` their float32 sum so far
comes in by TMA under the main loop.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from fuseops.kernels.gemm.wgrad_walk import wgrad_tile
from fuseops.kernels.hopper.pipeline import (
    CONSUMER_REGS,
    PRODUCER_REGS,
    chained_steps,
    load_steps,
    mma_layout,
    mma_steps,
    prefetch_tile,
    ring,
    spread_layout,
    store_tile,
)
from fuseops.kernels.quantization.grouped_layout import group_first_position


@gluon.jit
def _tile(tile, offsets, N, K, BN: gl.constexpr, BK: gl.constexpr, N_FASTEST: gl.constexpr):
    """Tile ``tile`` of the wgrad walk (gemm/wgrad_walk.py): group g (a group's tiles are
    consecutive, so a wave shares its slabs in L2), the tile's (pid_n, pid_k), and the group's
    first step and step count in the padded layout."""
    g, pid_n, pid_k = wgrad_tile(tile, gl.cdiv(N, BN), gl.cdiv(K, BK), N_FASTEST)
    size = (gl.load(offsets + g + 1) - gl.load(offsets + g)).to(gl.int32)
    step0 = (group_first_position(offsets, g) // 128).to(gl.int32)
    return g, pid_n, pid_k, step0, gl.cdiv(size, 128)


@gluon.jit
def _producer(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, N_FASTEST: gl.constexpr):
    BN: gl.constexpr = 2 * a_desc.block_type.shape[0]
    BK: gl.constexpr = b_desc.block_type.shape[0]
    i = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, BN) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, step0, steps = _tile(tile, offsets, N, K, BN, BK, N_FASTEST)
        i = load_steps(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, pid_n * BN, pid_k * BK, step0,
                       steps, i, STAGES)


@gluon.jit
def _consumer(a_desc, b_desc, dw_desc, a_bufs, b_bufs, dw_smem, dw_bar, ready, empty, offsets, a_scale,
              b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao, stride_bo,
              stride_dwg, stride_dwn, half_row, BLOCK_SCALES: gl.constexpr, HAS_OUTER: gl.constexpr,
              ACCUMULATE: gl.constexpr, DW_TMA: gl.constexpr, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr,
              N_FASTEST: gl.constexpr):
    """Rows ``half_row..+64`` of each [128, BK] tile of ``dw[g]``, summed over g's steps
    (and added to dw's with ACCUMULATE). With DW_TMA (dw contiguous, 16-byte rows) the tiles
    whose rows stay inside dw[g] go through ``dw_desc`` over dw as [G * N, K]: stored
    asynchronously, and with ACCUMULATE loaded under the main loop (``dw_bar``)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = 2 * HALF
    BK: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = mma_layout(BK)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    i = 0
    loads = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, BN) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, step0, steps = _tile(tile, offsets, N, K, BN, BK, N_FASTEST)
        row0 = pid_n * BN + half_row
        whole = row0 + HALF <= N
        if DW_TMA and ACCUMULATE and whole:
            prefetch_tile(dw_desc, [g * N + row0, pid_k * BK], dw_bar, dw_smem)
        rows = pid_n * BN + half_row + gl.arange(0, HALF, layout=row_layout)
        cols = pid_k * BK + gl.arange(0, BK, layout=col_layout)
        mask_n = rows < N
        mask_k = cols < K
        if BLOCK_SCALES:
            # Step-major scales ([steps, N] and [steps, K]): a step's are contiguous, loaded one
            # per thread.
            cols_1d = pid_k * BK + gl.arange(0, BK, layout=spread_layout(BK))
            acc, i = mma_steps(a_bufs, b_bufs, ready, empty, a_scale + step0 * stride_as + rows, mask_n,
                               b_scale + step0 * stride_bs + cols_1d, cols_1d < K, stride_as, stride_bs, steps, i,
                               STAGES, True, acc_layout)
        else:
            acc, i = chained_steps(a_bufs, b_bufs, ready, empty, steps, i, STAGES, acc_layout)
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
def grouped_fp8_wgrad_kernel(a_desc, b_desc, dw_desc, offsets, a_scale, b_scale, a_outer, b_outer, dw, G, N, K,
                             stride_as, stride_bs, stride_ao, stride_bo, stride_dwg, stride_dwn,
                             BLOCK_SCALES: gl.constexpr, HAS_OUTER: gl.constexpr, ACCUMULATE: gl.constexpr,
                             DW_TMA: gl.constexpr, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr,
                             N_FASTEST: gl.constexpr, num_warps: gl.constexpr):
    """``a_desc`` over dy's column-wise copy [N, P] (64-row boxes), ``b_desc`` over x's [K, P]
    ([BK, 128] boxes), both in the padded grouped layout; with BLOCK_SCALES their scales
    step-major ([P / 128, N] and [P / 128, K], rows ``stride_as`` / ``stride_bs`` apart), else
    not read; ``dw_desc`` over dw as [G * N, K] ([64, BK] boxes) when DW_TMA."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    # The staging of dw is compiled out when unused (no TMA stores).
    a_top, a_bottom, b_bufs, dw_top, dw_bottom, ready, empty = ring(a_desc, b_desc, dw_desc, STAGES)
    dw_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(dw_bars.index(c), count=1)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, dw_desc, a_top, b_bufs, dw_top, dw_bars.index(0), ready, empty, offsets,
                     a_scale, b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao,
                     stride_bo, stride_dwg, stride_dwn, gl.to_tensor(0), BLOCK_SCALES, HAS_OUTER, ACCUMULATE,
                     DW_TMA, NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_consumer, (a_desc, b_desc, dw_desc, a_bottom, b_bufs, dw_bottom, dw_bars.index(1), ready, empty,
                     offsets, a_scale, b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao,
                     stride_bo, stride_dwg, stride_dwn, gl.to_tensor(HALF), BLOCK_SCALES, HAS_OUTER, ACCUMULATE,
                     DW_TMA, NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                     NUM_PROGRAMS, STAGES, N_FASTEST)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
