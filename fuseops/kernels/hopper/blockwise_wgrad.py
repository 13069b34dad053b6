"""The FP8 blockwise grouped weight gradient for Hopper, warp-specialized (Gluon):
grouped_gemm_scaled_wgrad under ``Scaling.BLOCK``, ``dw[g] = a[:, steps of g] @ b[:, steps of
g]^T`` over the padded grouped layout (each group's rows start on a 128 boundary), written to
``dw`` or added to it.

Built as hopper/blockwise.py's forward from hopper/pipeline.py's pieces: a TMA
producer warp fills the ring, two consumer warpgroups take the 64-row halves of each [128, 128]
tile of ``dw[g]`` and rescale each step's product by its step-major 1x128 scales on both sides.
A group's tiles are consecutive in the walk, so a wave shares its slabs in L2 (along K or N
first: gemm/wgrad_walk.py; at Mixtral's FC2 2.68 -> 2.46 ms walking along N); tiles inside
``dw[g]`` leave by an asynchronous TMA store, and with ``accumulate`` their float32 sum so far
comes in by TMA under the main loop. Measured on an H100 (benchmarks/quantize.py, E=8
T=16384 4096x14336): 923 TFLOP/s against the Triton kernel's 453.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from fuseops.kernels._triton import cdiv
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.gemm.wgrad_walk import n_fastest, wgrad_tile
from fuseops.kernels.hopper.blockwise import usable
from fuseops.kernels.hopper.pipeline import (
    BLOCK,
    CONSUMER_REGS,
    HALF,
    PRODUCER_REGS,
    descriptor,
    dummy_or,
    load_steps,
    mma_layout,
    mma_steps,
    prefetch_tile,
    ring,
    spread_layout,
    store_tile,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling, group_first_position
from fuseops.kernels.quantization.operand import Operand

# Ring stages by ``accumulate``. Writing dw: 5 (+1-14 % over 4 at the MoE shapes, H100; 225 KB
# of shared memory with a float32 dw staged for TMA). Into main_grad: 4 (192 KB with its staging).
RING_STAGES = {False: 5, True: 4}


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
              stride_dwg, stride_dwn, half_row, HAS_OUTER: gl.constexpr, ACCUMULATE: gl.constexpr,
              DW_TMA: gl.constexpr, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, N_FASTEST: gl.constexpr):
    """Rows ``half_row..+64`` of each [128, 128] tile of ``dw[g]``, summed over g's steps
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
        # Step-major scales ([steps, N] and [steps, K]): a step's are contiguous, loaded one
        # per thread.
        cols_1d = pid_k * BK + gl.arange(0, BK, layout=spread_layout(BK))
        acc, i = mma_steps(a_bufs, b_bufs, ready, empty, a_scale + step0 * stride_as + rows, mask_n,
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
def grouped_blockwise_wgrad_kernel(a_desc, b_desc, dw_desc, offsets, a_scale, b_scale, a_outer, b_outer, dw, G,
                                   N, K, stride_as, stride_bs, stride_ao, stride_bo, stride_dwg, stride_dwn,
                                   HAS_OUTER: gl.constexpr, ACCUMULATE: gl.constexpr, DW_TMA: gl.constexpr,
                                   NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, N_FASTEST: gl.constexpr,
                                   num_warps: gl.constexpr):
    """wgrad: ``a_desc`` over dy's column-wise copy [N, P] (64-row boxes), ``b_desc`` over x's
    [K, P], both in the padded grouped layout, their scales step-major ([P / 128, N] and
    [P / 128, K], rows ``stride_as`` / ``stride_bs`` apart); ``dw_desc`` over dw as [G * N, K]
    (64-row boxes) when DW_TMA."""
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
                     stride_bo, stride_dwg, stride_dwn, gl.to_tensor(0), HAS_OUTER, ACCUMULATE, DW_TMA,
                     NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_consumer, (a_desc, b_desc, dw_desc, a_bottom, b_bufs, dw_bottom, dw_bars.index(1), ready, empty,
                     offsets, a_scale, b_scale, a_outer, b_outer, dw, G, N, K, stride_as, stride_bs, stride_ao,
                     stride_bo, stride_dwg, stride_dwn, gl.to_tensor(HALF), HAS_OUTER, ACCUMULATE, DW_TMA,
                     NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                     NUM_PROGRAMS, STAGES, N_FASTEST)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def grouped_blockwise_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, dw: torch.Tensor,
                            accumulate: bool, along_n: bool | None = None) -> torch.Tensor:
    """grouped_gemm_scaled_wgrad under ``Scaling.BLOCK`` into ``dw`` [G, N, K] (added to it
    when ``accumulate``): ``a`` [N, P] and ``b`` [K, P] with 1x128 scales along P.
    ``along_n``: the walk order (tests), else wgrad_walk.n_fastest's."""
    G, N, K = dw.shape
    programs = persistent_programs(dw, G * cdiv(N, BLOCK) * cdiv(K, BLOCK))
    if along_n is None:
        along_n = n_fastest(N, K, BLOCK, BLOCK, programs)
    dw_tma = dw.is_contiguous() and tma_ok(dw)
    # Without TMA stores the descriptor is only a placeholder (over a view that always has one).
    dw_desc = descriptor(dw.view(G * N, K) if dw_tma else a.scale.new_empty(HALF, BLOCK, dtype=dw.dtype), HALF)
    # Step-major scales: a step's 128 + 128 of a tile are contiguous, not a sector each
    # (the scales are 1/32 of the operands' bytes).
    a_scale, b_scale = a.scale.t().contiguous(), b.scale.t().contiguous()
    launch(grouped_blockwise_wgrad_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data, BLOCK), dw_desc, offsets, a_scale, b_scale,
        dummy_or(a.outer, dw), dummy_or(b.outer, dw), dw, G, N, K, a_scale.stride(0), b_scale.stride(0),
        a.outer_strides()[0], b.outer_strides()[0], dw.stride(0), dw.stride(1),
        HAS_OUTER=a.outer is not None, ACCUMULATE=accumulate, DW_TMA=dw_tma, NUM_PROGRAMS=programs,
        STAGES=RING_STAGES[accumulate], N_FASTEST=along_n, num_warps=4,
    )
    return dw


def serves(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling, out_dtype: torch.dtype,
           main_grad: torch.Tensor | None = None, out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row: FP8 blockwise with TMA-ready operands and a non-empty dw."""
    G, N, K = offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0]
    return scaling == Scaling.BLOCK and bool(G and N and K) and usable(a.data, b.data)


def grouped_gemm_scaled_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                              out_dtype: torch.dtype, main_grad: torch.Tensor | None = None,
                              out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled_wgrad.py's ``grouped_gemm_scaled_wgrad`` (same arguments) on this kernel."""
    if main_grad is None and out is None:
        out = torch.empty(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], dtype=out_dtype,
                          device=a.data.device)
    return grouped_blockwise_wgrad(a, b, offsets, main_grad if main_grad is not None else out,
                                   accumulate=main_grad is not None)
