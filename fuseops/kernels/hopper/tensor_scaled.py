"""FP8 per-tensor grouped GEMMs for Hopper, warp-specialized (Gluon): forward and dgrad.

The same products as gemm/grouped_scaled.py under ``Scaling.TENSOR`` (rows grouped by device
offsets, one scale per group and operand, applied to the result). A TMA producer warp fills a
ring of stages in the tile walk's order; the two consumer warpgroups take alternate whole
[128, 128] tiles ("ping-pong"), each chaining its K steps into two accumulators (the tile's
64-row halves). Their main loops take turns (a pair of barriers), so one consumer's epilogue
(the groups' factors, bias, the TMA stores) runs while the other's MMAs do.

Why: at the Qwen3-30B-A3B expert shape the Triton kernel's FP8 GEMMs run at 0.89-1.26 PFLOP/s
(H100), and the quantized expert layer's GEMMs are its largest share. A cooperative kernel
(both consumers on the halves of one 128x256 tile) gains 6-9 % there, but leaves the tensor
cores idle in each epilogue where a tile has few K steps (FC2's forward: K = 768, 6 steps of
128). This one, against it (H200, ``benchmarks/fp8_gemm_tiles.py``): FC1's and
FC2's forward 1.02x / 1.01x, FC2's dgrad 1.04x, FC1's dgrad 1.00x, the same bits; the expert
layer's FP8 micro-batch of eight 11.16 against 11.40 ms (``benchmarks/fp8_moe.py``). Used where
``serves_grouped_gemm_scaled`` says (sm_90, TMA-ready operands, a bf16 or fp16 result);
elsewhere, and under the interpreter, the Triton kernel runs.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.hopper.fp8_forward import forward_producer
from fuseops.kernels.hopper.pipeline import (
    BLOCK,
    CONSUMER_REGS,
    HALF,
    PRODUCER_REGS,
    descriptor,
    dummy_or,
    grouped_call,
    grouped_operands_ready,
    grouped_tile,
    mma_layout,
    start_walk,
    store_rows,
    tile_span,
    total_tiles,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# A consumer's two [64, 128] float32 accumulators are 128 registers a thread; a stage is 32 KB
# (A's two halves, 128 rows of B), each consumer stages a whole bf16 output tile (32 KB).
BLOCK_N = 128
STAGES = 4
GROUP_M = 8


@gluon.jit
def _whole_tile_steps(a_top, a_bottom, b_bufs, ready, empty, steps, i, STAGES: gl.constexpr,
                      acc_layout: gl.constexpr):
    """Both halves of one tile over ``steps`` K steps, each into its accumulator: the step's two
    wgmmas in flight while the next stage is awaited; a stage released (one consumer reads it)
    once both MMAs reading it are done."""
    HALF: gl.constexpr = a_top.shape[1]
    BN: gl.constexpr = b_bufs.shape[1]
    top = gl.zeros([HALF, BN], gl.float32, layout=acc_layout)
    bottom = gl.zeros([HALF, BN], gl.float32, layout=acc_layout)
    for k in range(steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        b = b_bufs.index(s).permute((1, 0))
        top = warpgroup_mma(a_top.index(s), b, top, is_async=True)
        bottom = warpgroup_mma(a_bottom.index(s), b, bottom, is_async=True)
        top, bottom = warpgroup_mma_wait(2, deps=(top, bottom))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > 0)
        i += 1
    top, bottom = warpgroup_mma_wait(0, deps=(top, bottom))
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=steps > 0)
    return top, bottom, i


@gluon.jit
def _store_half(acc, off_m, row0, size, g, pid_n, a_outer, b_outer, bias, y, y_desc, y_smem, N, stride_aog,
                stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, HAS_OUTER_A: gl.constexpr,
                HAS_OUTER_B: gl.constexpr, HAS_BIAS: gl.constexpr, acc_layout: gl.constexpr):
    """Rows ``off_m..+64`` of the group's tile: ``pipeline.store_rows``' epilogue, the outer
    factors one per group (the caller waits for the staging's last stores once for both halves)."""
    HALF: gl.constexpr = y_smem.shape[0]
    BN: gl.constexpr = y_smem.shape[1]
    rows, mask_m, cols, mask_n = tile_span(off_m, row0, size, pid_n, N, HALF, BN, acc_layout)
    store_rows(acc, off_m, row0, size, rows, mask_m, cols, mask_n, g, pid_n, a_outer, b_outer, bias, y, y_desc, y_smem,
               stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, HAS_OUTER_A, HAS_OUTER_B,
               True, HAS_BIAS, False, False)


@gluon.jit
def _consumer(a_desc, b_desc, y_desc, a_top, a_bottom, b_bufs, y_smem, ready, empty, my_turn, next_turn, offsets,
              a_outer, b_outer, bias, y, G, N, K, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg,
              stride_ym, parity, HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr, HAS_BIAS: gl.constexpr,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, BLOCK_G: gl.constexpr):
    """Every other tile of the program's walk (those whose turn has ``parity``), whole. Every
    tile moves the group cursor and, for the other consumer's, the ring count past its steps.

    The main loops take turns (``my_turn``, ``next_turn``: one arrival each when the other
    consumer's loop is done). So one consumer's epilogue runs under the other's MMAs, and a
    consumer waits on a stage's ``ready`` only once every earlier load into that stage has landed:
    its wait by parity cannot pass on a phase the other consumer's steps left complete (its count
    jumps past the other's tile, more steps than the ring holds)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = mma_layout(BN)
    tiles_n = gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    g, g_first, g_tiles = start_walk(offsets, tiles_n)
    i = 0
    turns = 0
    for tile in range(gl.program_id(0), total_tiles(offsets, G, tiles_n, BLOCK_G, 4), NUM_PROGRAMS):
        g, g_first, g_tiles, row0, size, pid_m, pid_n = grouped_tile(tile, g, g_first, g_tiles, offsets,
                                                                    tiles_n, GROUP_M)
        # The program's tiles taken in turn: this one's turn is its count in the walk.
        if ((tile - gl.program_id(0)) // NUM_PROGRAMS) % 2 == parity:
            # Consumer 0's first wait passes on the fresh barrier (a fresh one counts as phase 1 done).
            mbarrier.wait(my_turn, (turns & 1) ^ (1 - parity))
            top, bottom, i = _whole_tile_steps(a_top, a_bottom, b_bufs, ready, empty, k_tiles, i, STAGES,
                                               acc_layout)
            mbarrier.arrive(next_turn, count=1)
            turns += 1
            # The previous tile's stores have left the staging by now, or are waited for here.
            tma.store_wait(0)
            _store_half(top, pid_m * 128, row0, size, g, pid_n, a_outer, b_outer, bias, y, y_desc, y_smem.index(0),
                        N, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym, HAS_OUTER_A,
                        HAS_OUTER_B, HAS_BIAS, acc_layout)
            _store_half(bottom, pid_m * 128 + HALF, row0, size, g, pid_n, a_outer, b_outer, bias, y, y_desc,
                        y_smem.index(1), N, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                        HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, acc_layout)
        else:
            i += k_tiles
    tma.store_wait(0)


@gluon.jit
def grouped_tensor_scaled_kernel(a_desc, b_desc, y_desc, offsets, a_outer, b_outer, bias, y, G, N, K, stride_aog,
                                 stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
                                 HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr, HAS_BIAS: gl.constexpr,
                                 NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                                 BLOCK_G: gl.constexpr, num_warps: gl.constexpr):
    """``a_desc`` over a [M, K] (64-row boxes), ``b_desc`` over b as [G * N, K] (BN-row boxes: a
    tile past N reads the next group's rows, whose columns are never stored), ``y_desc`` over y
    [M, N] ([64, BN] boxes); the ring's stages are each read by one consumer (``empty`` counts
    one arrival)."""
    HALF: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BK], a_desc.layout)
    a_bottom = gl.allocate_shared_memory(a_desc.dtype, [STAGES, HALF, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    y_first = gl.allocate_shared_memory(y_desc.dtype, [2, HALF, BN], y_desc.layout)
    y_second = gl.allocate_shared_memory(y_desc.dtype, [2, HALF, BN], y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    for c in gl.static_range(2):
        mbarrier.init(turns.index(c), count=1)
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, y_desc, a_top, a_bottom, b_bufs, y_first, ready, empty, turns.index(0),
                     turns.index(1), offsets, a_outer, b_outer, bias, y, G, N, K, stride_aog, stride_aom, stride_bog,
                     stride_bon, stride_biasg, stride_ym, gl.to_tensor(0), HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS,
                     NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (_consumer, (a_desc, b_desc, y_desc, a_top, a_bottom, b_bufs, y_second, ready, empty, turns.index(1),
                     turns.index(0), offsets, a_outer, b_outer, bias, y, G, N, K, stride_aog, stride_aom, stride_bog,
                     stride_bon, stride_biasg, stride_ym, gl.to_tensor(1), HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS,
                     NUM_PROGRAMS, STAGES, GROUP_M, BLOCK_G)),
        (forward_producer, (a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
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
        descriptor(a.data, HALF), descriptor(b.data.view(G * N, K), block_n), descriptor(y, HALF, block_n), offsets,
        dummy_or(a.outer, y), dummy_or(b.outer, y), dummy_or(bias, y), y, G, N, K,
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
    return grouped_call(grouped_tensor_scaled, a, b, offsets, out_dtype, bias, out)
