"""The FP8 per-tensor grouped weight gradient for Hopper, warp-specialized (Gluon):
grouped_gemm_scaled_wgrad under ``Scaling.TENSOR``, ``dw[g] = a[:, steps of g] @ b[:, steps of
g]^T`` over the padded grouped layout (each group's positions start on a 128 boundary), times
the group's two scales, written to ``dw`` or added to it.

hopper/blockwise_wgrad.py's kernel without block scales: the same walk (a group's tiles
consecutive, along N or K first: gemm/wgrad_walk.py), producer and epilogue (tiles inside
``dw[g]`` leave by an asynchronous TMA store, and with ``accumulate`` their float32 sum so far
comes in by TMA under the main loop); each consumer chains its steps into one accumulator
(hopper/pipeline.py's ``chained_steps``). Tiles are [128, 256] when writing dw (as the Triton
kernel's) and [128, 128] into a float32 ``main_grad`` (its staging beside the ring).

Why: the quantized expert layer's weight gradients ran at ~1.1 PFLOP/s in the Triton kernel at
the Qwen3-30B-A3B shape (H100, session 36), where the forward and dgrad GEMMs gained 6-9 % on
the same pipeline (hopper/tensor_scaled.py). Written in session 36 after its device time was
spent: not in the dispatch table until its GPU tests pass and ``benchmarks/fp8_gemm_tiles.py``
times it faster (``serves`` is the row it would take).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from fuseops.kernels._triton import cdiv
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.gemm.wgrad_walk import n_fastest
from fuseops.kernels.hopper.blockwise import usable
from fuseops.kernels.hopper.blockwise_wgrad import _producer, _tile
from fuseops.kernels.hopper.pipeline import (
    BLOCK,
    CONSUMER_REGS,
    HALF,
    PRODUCER_REGS,
    chained_steps,
    descriptor,
    dummy_or,
    mma_layout,
    prefetch_tile,
    ring,
    store_tile,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# (columns of a dw tile, ring stages) by ``accumulate``. Writing bf16 dw: 48 KB a stage and 64
# KB of staging fit 3 stages; into float32 main_grad: 32 KB a stage beside 64 KB, 4 stages.
TILES = {False: (256, 3), True: (128, 4)}


@gluon.jit
def _consumer(a_desc, b_desc, dw_desc, a_bufs, b_bufs, dw_smem, dw_bar, ready, empty, offsets, a_outer, b_outer,
              dw, G, N, K, stride_ao, stride_bo, stride_dwg, stride_dwn, half_row, HAS_OUTER: gl.constexpr,
              ACCUMULATE: gl.constexpr, DW_TMA: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
              STAGES: gl.constexpr, N_FASTEST: gl.constexpr):
    """Rows ``half_row..+64`` of each [128, BK] tile of ``dw[g]``, summed over g's steps (and
    added to dw's with ACCUMULATE), as hopper/blockwise_wgrad.py's consumer stores them."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = 2 * HALF
    BK: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = mma_layout(BK)
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    i = 0
    loads = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, BN) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, _, steps = _tile(tile, offsets, N, K, BN, BK, N_FASTEST)
        row0 = pid_n * BN + half_row
        whole = row0 + HALF <= N
        if DW_TMA and ACCUMULATE and whole:
            prefetch_tile(dw_desc, [g * N + row0, pid_k * BK], dw_bar, dw_smem)
        rows = row0 + gl.arange(0, HALF, layout=row_layout)
        cols = pid_k * BK + gl.arange(0, BK, layout=col_layout)
        acc, i = chained_steps(a_bufs, b_bufs, ready, empty, steps, i, STAGES, acc_layout)
        if HAS_OUTER:
            acc *= gl.load(a_outer + g * stride_ao) * gl.load(b_outer + g * stride_bo)
        if DW_TMA and whole:
            loads = store_tile(acc, dw_desc, [g * N + row0, pid_k * BK], dw_smem, dw_smem, dw_bar, loads, ACCUMULATE,
                               acc_layout)
        else:
            ptrs = dw + g.to(gl.int64) * stride_dwg + rows[:, None] * stride_dwn + cols[None, :]
            mask = (rows < N)[:, None] & (cols < K)[None, :]
            if ACCUMULATE:
                acc += gl.load(ptrs, mask=mask, other=0.0)
            gl.store(ptrs, acc.to(dw.dtype.element_ty), mask=mask)
    tma.store_wait(0)


@gluon.jit
def grouped_tensor_scaled_wgrad_kernel(a_desc, b_desc, dw_desc, offsets, a_outer, b_outer, dw, G, N, K, stride_ao,
                                       stride_bo, stride_dwg, stride_dwn, HAS_OUTER: gl.constexpr,
                                       ACCUMULATE: gl.constexpr, DW_TMA: gl.constexpr, NUM_PROGRAMS: gl.constexpr,
                                       STAGES: gl.constexpr, N_FASTEST: gl.constexpr, num_warps: gl.constexpr):
    """``a_desc`` over dy's column-wise copy [N, P] (64-row boxes), ``b_desc`` over x's [K, P]
    ([BK, 128] boxes), both in the padded grouped layout; ``dw_desc`` over dw as [G * N, K]
    ([64, BK] boxes) when DW_TMA."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top, a_bottom, b_bufs, dw_top, dw_bottom, ready, empty = ring(a_desc, b_desc, dw_desc, STAGES)
    dw_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(dw_bars.index(c), count=1)
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, dw_desc, a_top, b_bufs, dw_top, dw_bars.index(0), ready, empty, offsets,
                     a_outer, b_outer, dw, G, N, K, stride_ao, stride_bo, stride_dwg, stride_dwn, gl.to_tensor(0),
                     HAS_OUTER, ACCUMULATE, DW_TMA, NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_consumer, (a_desc, b_desc, dw_desc, a_bottom, b_bufs, dw_bottom, dw_bars.index(1), ready, empty, offsets,
                     a_outer, b_outer, dw, G, N, K, stride_ao, stride_bo, stride_dwg, stride_dwn,
                     gl.to_tensor(HALF), HAS_OUTER, ACCUMULATE, DW_TMA, NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
                     NUM_PROGRAMS, STAGES, N_FASTEST)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


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
    dw_tma = dw.is_contiguous() and tma_ok(dw)
    # Without TMA stores the descriptor is only a placeholder (over a view that always has one).
    target = dw.view(G * N, K) if dw_tma else dw.new_empty(HALF, block_k)
    dw_desc = descriptor(target, HALF, block_k)
    launch(grouped_tensor_scaled_wgrad_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data, block_k), dw_desc, offsets, dummy_or(a.outer, dw),
        dummy_or(b.outer, dw), dw, G, N, K, a.outer_strides()[0], b.outer_strides()[0], dw.stride(0), dw.stride(1),
        HAS_OUTER=a.outer is not None, ACCUMULATE=accumulate, DW_TMA=dw_tma, NUM_PROGRAMS=programs,
        STAGES=stages, N_FASTEST=along_n, num_warps=4,
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
    if main_grad is None and out is None:
        out = torch.empty(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], dtype=out_dtype,
                          device=a.data.device)
    return grouped_tensor_scaled_wgrad(a, b, offsets, main_grad if main_grad is not None else out,
                                       accumulate=main_grad is not None)
