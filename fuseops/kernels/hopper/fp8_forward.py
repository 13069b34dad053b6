"""The warp-specialized FP8 blockwise grouped GEMM for Hopper (Gluon), forward and dgrad: the
kernel that hopper/blockwise.py launches under ``Scaling.BLOCK`` (rows grouped by device offsets,
the groups' factors and bias applied to the result, as gemm/grouped_scaled.py computes them), and
the producer that hopper/tensor_scaled.py's per-tensor kernel shares.

A TMA producer warp fills a ring of stages; two consumer warpgroups take the two 64-row halves
of each output tile, and release a stage on their own (the ``empty`` barrier counts both). Each
128-long K step's product needs its own scales. Triton 3.6 compiles that loop so that all warps
wait for every step's wgmma and rescale in lockstep while the tensor cores idle; here each
consumer waits only for its own product and rescales while the other's MMAs run
(``pipeline.mma_steps``). 128x128 tiles: the product and the sum are two accumulators.

Then the consumer's epilogue (``pipeline.store_rows``): the groups' factors, bias, the sum so far
with ``ACCUMULATE``, and an asynchronous TMA store where every row is the group's, while the
producer runs ahead into the next tile. Nothing syncs with the host: tiles are counted in-kernel
from the offsets, and every partition walks them in the same order.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

from fuseops.kernels.hopper.pipeline import (
    CONSUMER_REGS,
    PRODUCER_REGS,
    grouped_tile,
    load_steps,
    mma_layout,
    mma_steps,
    ring,
    spread_layout,
    start_walk,
    store_rows,
    tile_span,
    total_tiles,
)


@gluon.jit
def forward_producer(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                     NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                     BLOCK_G: gl.constexpr):
    """Each tile's K steps into the ring, in the walk's order: A's 128 rows as two halves, B's
    BN rows of the tile's group."""
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
def _consumer(a_desc, b_desc, y_desc, a_bufs, b_bufs, y_smem, ready, empty, offsets, a_scale, b_scale, a_outer,
              b_outer, bias, y, G, N, K, stride_as, stride_bsg, stride_bsn, stride_as_step, stride_bs_step,
              stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, half_row,
              B_ROWS_PER_SCALE: gl.constexpr, HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr,
              HAS_BIAS: gl.constexpr, ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr,
              GROUP_M: gl.constexpr, BLOCK_G: gl.constexpr):
    """Rows ``half_row..+64`` (0 or 64) of each 128-row tile, all its columns (added to y's
    with ACCUMULATE). ``half_row`` is a runtime value: Gluon 3.6 takes no literal constexpr
    among a partition's arguments."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = mma_layout(BN)
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    g, g_first, g_tiles = start_walk(offsets, tiles_n)
    i = 0
    for tile in range(gl.program_id(0), total_tiles(offsets, G, tiles_n, BLOCK_G, 4), NUM_PROGRAMS):
        g, g_first, g_tiles, row0, size, pid_m, pid_n = grouped_tile(tile, g, g_first, g_tiles, offsets,
                                                                    tiles_n, GROUP_M)
        off_m = pid_m * 128 + half_row
        rows, mask_m, cols, mask_n = tile_span(off_m, row0, size, pid_n, N, HALF, BN, acc_layout)
        if B_ROWS_PER_SCALE == 1:
            cols_1d = pid_n * BN + gl.arange(0, BN, layout=spread_layout(BN))
            sb_ptrs = b_scale + g * stride_bsg + cols_1d * stride_bsn
            sb_mask = cols_1d < N
        else:
            sb_ptrs = b_scale + g * stride_bsg + pid_n * stride_bsn
            sb_mask = None
        acc, i = mma_steps(a_bufs, b_bufs, ready, empty, a_scale + rows * stride_as, mask_m, sb_ptrs, sb_mask,
                           stride_as_step, stride_bs_step, k_tiles, i, STAGES, B_ROWS_PER_SCALE == 1, acc_layout)
        store_rows(acc, off_m, row0, size, rows, mask_m, cols, mask_n, g, pid_n, a_outer, b_outer, bias, y, y_desc,
                   y_smem, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, HAS_OUTER_A,
                   HAS_OUTER_B, False, HAS_BIAS, ACCUMULATE, True)
    tma.store_wait(0)


@gluon.jit
def grouped_fp8_kernel(a_desc, b_desc, y_desc, offsets, a_scale, b_scale, a_outer, b_outer, bias, y,
                       G, N, K, stride_as, stride_bsg, stride_bsn, stride_as_step, stride_bs_step, stride_aog,
                       stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                       B_ROWS_PER_SCALE: gl.constexpr, HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr,
                       HAS_BIAS: gl.constexpr, ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
                       STAGES: gl.constexpr, GROUP_M: gl.constexpr, BLOCK_G: gl.constexpr,
                       num_warps: gl.constexpr):
    """Forward / dgrad: ``a_desc`` over a [M, K] (64-row boxes), ``b_desc`` over b as
    [G * N, K] (BN-row boxes: a tile past N reads the next group's rows, whose columns are never
    stored), ``y_desc`` over y [M, N] ([64, BN] boxes). The scales are ``*_step`` apart from K
    step to K step; the outer factors are a value per row of a / of b."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top, a_bottom, b_bufs, y_top, y_bottom, ready, empty = ring(a_desc, b_desc, y_desc, STAGES)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, y_desc, a_top, b_bufs, y_top, ready, empty, offsets, a_scale, b_scale,
                     a_outer, b_outer, bias, y, G, N, K, stride_as, stride_bsg, stride_bsn, stride_as_step,
                     stride_bs_step, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                     gl.to_tensor(0), B_ROWS_PER_SCALE, HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, ACCUMULATE,
                     NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (_consumer, (a_desc, b_desc, y_desc, a_bottom, b_bufs, y_bottom, ready, empty, offsets, a_scale,
                     b_scale, a_outer, b_outer, bias, y, G, N, K, stride_as, stride_bsg, stride_bsn,
                     stride_as_step, stride_bs_step, stride_aog, stride_aom, stride_bog, stride_bon,
                     stride_biasg, stride_ym, gl.to_tensor(HALF), B_ROWS_PER_SCALE, HAS_OUTER_A,
                     HAS_OUTER_B, HAS_BIAS, ACCUMULATE, NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (forward_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                            NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
