"""16-bit grouped weight gradients for Hopper, warp-specialized (Gluon).

The product of grouped_gemm_wgrad.py, ``dw[g] = dy[rows of g]^T @ x[rows of g]`` for bf16 /
fp16 operands written to ``dw`` (not accumulated), built like grouped_gemm_blockwise_hopper.py:
a TMA producer warp fills a ring of stages, and two consumer warpgroups take the two 64-row
halves of each [128, 256] tile of ``dw[g]``. Each consumer keeps one wgmma in flight, releases
a stage as soon as its product has read it (the ``empty`` barrier counts both consumers), and
hands its finished tile to an asynchronous TMA store, so the next tile's first steps are
already in shared memory while it does. The Triton kernel's loop (one partition for loads,
MMA and epilogue) leaves the tensor cores idle across each tile's epilogue and first loads.

The reduction runs over each group's rows in 64-row steps read through ragged TMA
descriptors (grouped_gemm.py): rows past the group's end arrive as zeros, so a step that
overhangs into the next group adds nothing. Nothing syncs with the host: every partition
walks the tiles of all groups in the same order from the device offsets.

Used on sm_90 for bf16 / fp16 operands behind TMA descriptors when ``dw`` is written
(``usable``); with ``main_grad``, elsewhere, and under the interpreter the Triton kernel runs.
"""

from __future__ import annotations

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
from fuseops.kernels.grouped_gemm import RAGGED_ROWS, persistent_programs, ragged_geometry

BLOCK_N = 128  # dw rows per tile (dy's columns), as two consumer halves
HALF = BLOCK_N // 2
BLOCK_K = 256  # dw columns per tile (x's columns)
BLOCK_R = 64  # reduction rows per step
STAGES = 3  # 3 x 48 KB of operands + 2 x 32 KB of dw staging
BIG = gl.constexpr(RAGGED_ROWS)
# Registers per thread: each consumer holds a [64, 256] float32 sum (128 a thread); the
# producer only addresses. 2 x 4 warps x 232 + 4 x 40 (the producer's warpgroup) fits 64 K.
CONSUMER_REGS, PRODUCER_REGS = gl.constexpr(232), gl.constexpr(40)


def usable(dy: torch.Tensor, x: torch.Tensor, main_grad: torch.Tensor | None, out: torch.Tensor | None) -> bool:
    """Whether ``grouped_gemm_wgrad(dy, x, ...)`` takes this kernel: CUDA sm_90, bf16 / fp16
    operands behind TMA descriptors, ``dw`` written (no ``main_grad``) into a contiguous,
    16-byte-aligned tensor of their dtype."""
    if INTERPRET or main_grad is not None or not dy.is_cuda or dy.dtype not in _GL_DTYPES:
        return False
    if x.dtype != dy.dtype or torch.cuda.get_device_capability(dy.device) != (9, 0):
        return False
    if out is not None and (out.dtype != dy.dtype or not out.is_contiguous()):
        return False
    return tma_ok(dy, x, out) and dy.shape[0] < RAGGED_ROWS


@gluon.jit
def _tile(tile, offsets, N, K, BN: gl.constexpr, BK: gl.constexpr):
    """Tile ``tile`` of the walk: group g (a group's tiles are consecutive, so a wave shares
    its rows in L2), the tile's (pid_n, pid_k), the group's first row and row count."""
    tiles_k = gl.cdiv(K, BK)
    per_group = gl.cdiv(N, BN) * tiles_k
    g = tile // per_group
    row0 = gl.load(offsets + g)
    size = (gl.load(offsets + g + 1) - row0).to(gl.int32)
    return g, (tile % per_group) // tiles_k, tile % tiles_k, row0.to(gl.int32), size


@gluon.jit
def _producer(dy_desc, x_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr):
    HALF: gl.constexpr = dy_desc.block_type.shape[3]
    BR: gl.constexpr = dy_desc.block_type.shape[2]
    BK: gl.constexpr = x_desc.block_type.shape[3]
    i = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, 2 * HALF) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, row0, size = _tile(tile, offsets, N, K, 2 * HALF, BK)
        for r in range(gl.cdiv(size, BR)):
            s = i % STAGES
            # A fresh barrier counts as completed phase 1: the first pass finds every stage free.
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, 2 * dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
            # Ragged coordinates: row ``row0 + r * BR`` with zeros past ``row0 + size``.
            end = row0 + size
            row = r * BR - size + BIG
            tma.async_copy_global_to_shared(dy_desc, [BIG, end, row, pid_n * 2 * HALF], bar, a_top.index(s))
            tma.async_copy_global_to_shared(dy_desc, [BIG, end, row, pid_n * 2 * HALF + HALF], bar,
                                            a_bottom.index(s))
            tma.async_copy_global_to_shared(x_desc, [BIG, end, row, pid_k * BK], bar, b_bufs.index(s))
            i += 1


@gluon.jit
def _consumer(dy_desc, x_desc, dw_desc, a_bufs, b_bufs, dw_smem, ready, empty, offsets, dw, G, N, K,
              stride_dwg, stride_dwn, half_row, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr):
    """Rows ``half_row..+64`` (0 or 64; a runtime value, as Gluon 3.6 takes no literal
    constexpr among a partition's arguments) of each [128, 256] tile of ``dw[g]``."""
    HALF: gl.constexpr = dy_desc.block_type.shape[3]
    BR: gl.constexpr = dy_desc.block_type.shape[2]
    BK: gl.constexpr = x_desc.block_type.shape[3]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BK, 16])
    i = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, 2 * HALF) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, row0, size = _tile(tile, offsets, N, K, 2 * HALF, BK)
        steps = gl.cdiv(size, BR)
        acc = gl.zeros([HALF, BK], gl.float32, layout=acc_layout)
        for r in range(steps):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            # dy's [BR, HALF] slab read transposed: the [HALF, BR] operand of dy^T.
            a = a_bufs.index(s).reshape([BR, HALF]).permute((1, 0))
            acc = warpgroup_mma(a, b_bufs.index(s).reshape([BR, BK]), acc, is_async=True)
            # One product in flight: the previous one is done with its stage.
            acc = warpgroup_mma_wait(1, deps=(acc,))
            if r > 0:
                mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
            i += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        if steps > 0:
            mbarrier.arrive(empty.index((i - 1) % STAGES), count=1)
        off_n = pid_n * 2 * HALF + half_row
        out = acc.to(dw_desc.dtype)
        if off_n + HALF <= N:
            # Inside dw[g]: through TMA (over dw as [G * N, K], which clips the columns past K);
            # the store drains under the next tile's main loop.
            tma.store_wait(0)
            dw_smem.store(out)
            fence_async_shared()
            tma.async_copy_shared_to_global(dw_desc, [g * N + off_n, pid_k * BK], dw_smem)
        else:
            row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
            col_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
            rows = off_n + gl.arange(0, HALF, layout=row_layout)
            cols = pid_k * BK + gl.arange(0, BK, layout=col_layout)
            ptrs = dw + g.to(gl.int64) * stride_dwg + rows[:, None] * stride_dwn + cols[None, :]
            gl.store(ptrs, out, mask=(rows < N)[:, None] & (cols < K)[None, :])
    tma.store_wait(0)


@gluon.jit
def grouped_wgrad_kernel(dy_desc, x_desc, dw_desc, offsets, dw, G, N, K, stride_dwg, stride_dwn,
                         NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """``dy_desc`` / ``x_desc``: ragged descriptors over dy [M, N] ([BR, 64] boxes) and x [M, K]
    ([BR, 256] boxes); ``dw_desc`` over dw as [G * N, K] ([64, 256] boxes)."""
    HALF: gl.constexpr = dy_desc.block_type.shape[3]
    BR: gl.constexpr = dy_desc.block_type.shape[2]
    BK: gl.constexpr = x_desc.block_type.shape[3]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, 1, 1, BR, HALF], dy_desc.layout)
    a_bottom = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, 1, 1, BR, HALF], dy_desc.layout)
    b_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, 1, 1, BR, BK], x_desc.layout)
    dw_top = gl.allocate_shared_memory(dw_desc.dtype, [HALF, BK], dw_desc.layout)
    dw_bottom = gl.allocate_shared_memory(dw_desc.dtype, [HALF, BK], dw_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_consumer, (dy_desc, x_desc, dw_desc, a_top, b_bufs, dw_top, ready, empty, offsets, dw, G, N, K,
                     stride_dwg, stride_dwn, gl.to_tensor(0), NUM_PROGRAMS, STAGES)),
        (_consumer, (dy_desc, x_desc, dw_desc, a_bottom, b_bufs, dw_bottom, ready, empty, offsets, dw, G, N, K,
                     stride_dwg, stride_dwn, gl.to_tensor(HALF), NUM_PROGRAMS, STAGES)),
        (_producer, (dy_desc, x_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K, NUM_PROGRAMS,
                     STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def _ragged(t: torch.Tensor, cols: int) -> TensorDescriptor:
    """grouped_gemm.py's ragged descriptor over t's rows, with [BLOCK_R, cols] boxes."""
    layout = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_R, cols], _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, *ragged_geometry(t), [1, 1, BLOCK_R, cols], layout)


def grouped_wgrad_hopper(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """grouped_gemm_wgrad without ``main_grad``: ``dw`` [G, N, K] in dy's dtype (``out`` when
    given). Callers check ``usable``."""
    N, K, G = dy.shape[1], x.shape[1], offsets.shape[0] - 1
    dw = out if out is not None else torch.empty(G, N, K, dtype=dy.dtype, device=dy.device)
    layout = gl.NVMMASharedLayout.get_default_for([HALF, BLOCK_K], _GL_DTYPES[dw.dtype])
    dw_desc = TensorDescriptor.from_tensor(dw.view(G * N, K), [HALF, BLOCK_K], layout)
    programs = persistent_programs(dw, G * triton.cdiv(N, BLOCK_N) * triton.cdiv(K, BLOCK_K))
    grouped_wgrad_kernel[(programs,)](
        _ragged(dy, HALF), _ragged(x, BLOCK_K), dw_desc, offsets, dw, G, N, K, dw.stride(0), dw.stride(1),
        NUM_PROGRAMS=programs, STAGES=STAGES, num_warps=4,
    )
    return dw
