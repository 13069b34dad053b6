"""16-bit grouped weight gradients for Hopper, warp-specialized (Gluon).

The product of gemm/grouped_wgrad.py, ``dw[g] = dy[rows of g]^T @ x[rows of g]`` for bf16 /
fp16 operands, written to ``dw`` (in the operands' dtype, or float32: a float32 parameter's
gradient under ``torch.autocast``, the float32 sums stored as they are) or added to a float32
``main_grad``, built like hopper/blockwise.py: a TMA producer warp fills a ring of stages, and
two consumer warpgroups take the two 64-row halves of each [128, 256] tile of ``dw[g]``
([128, 128] when the target is float32, written or accumulated: its staging tile needs the
shared memory). Each consumer keeps one wgmma in flight, releases a stage as soon as its
product has read it (the ``empty`` barrier counts both consumers), and hands its finished
tile to an asynchronous TMA store, so the next tile's first steps are already in shared
memory while it does. Into ``main_grad``, the tile's float32 sum
so far comes in by TMA while the main loop runs. The Triton kernel's loop (one partition for
loads, MMA and epilogue) leaves the tensor cores idle across each tile's epilogue and first
loads, and reads ``main_grad`` before its main loop can start. Measured on an H100
(benchmarks/grouped_gemm.py, the four MoE shapes x two routings, same run): written, 1.02-1.31x
the Triton kernel (Mixtral's E=8: 675 against 659 TFLOP/s; E=32-128: 1.14-1.31x); into
``main_grad``, 1.10-1.33x (485 against 436 at E=8, ~270 against ~208 at E=32-128).

The tiles of a group are walked along K or N first, whichever makes a wave read fewer
columns of dy and x (gemm/wgrad_walk.py). At Mixtral's FC2 (dw2 [8, 4096, 14336] from 2048 rows
per expert) walking along N took the kernel from 3.38 to 2.78 ms, 569 to 693 TFLOP/s
(torch._grouped_mm 690; benchmarks/wgrad_walk.py).

The reduction runs over each group's rows in 64-row steps read through ragged TMA
descriptors (gemm/grouped.py): rows past the group's end arrive as zeros, so a step that
overhangs into the next group adds nothing. Nothing syncs with the host: every partition
walks the tiles of all groups in the same order from the device offsets.

Used on sm_90 for bf16 / fp16 operands, with ``dw`` / ``main_grad`` too behind TMA descriptors
(``usable``); elsewhere, and under the interpreter, the Triton kernel runs.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuseops.kernels._triton import cdiv
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.grouped import RAGGED_ROWS, checked_block, persistent_programs, ragged_geometry
from fuseops.kernels.gemm.wgrad_walk import n_fastest, wgrad_tile
from fuseops.kernels.hopper.pipeline import (
    CONSUMER_REGS,
    PRODUCER_REGS,
    on_sm90,
    prefetch_tile,
    shared_layout,
    store_tile,
)
from fuseops.kernels.launch import launch

BLOCK_N = 128  # dw rows per tile (dy's columns), as two consumer halves
HALF = BLOCK_N // 2
BLOCK_R = 64  # reduction rows per step
# By whether the target (dw, or main_grad) is float32: dw columns per tile (x's columns) and
# stages; shared memory 3 x 48 KB of operands + 2 x 32 KB of 16-bit dw staging, or 4 x 32 KB +
# 2 x 32 KB of float32 staging (the geometry of the accumulation into main_grad, which writes a
# float32 dw as well, with its prefetch and add left out).
BLOCK_K = {False: 256, True: 128}
STAGES = {False: 3, True: 4}
BIG = gl.constexpr(RAGGED_ROWS)


def usable(dy: torch.Tensor, x: torch.Tensor, main_grad: torch.Tensor | None, out: torch.Tensor | None,
           out_dtype: torch.dtype | None = None) -> bool:
    """Whether ``grouped_gemm_wgrad(dy, x, ...)`` takes this kernel: CUDA sm_90, bf16 / fp16
    operands behind TMA descriptors, and the target (``main_grad``: float32; ``out``, or the dw
    allocated in ``out_dtype``: the operands' dtype or float32) behind a TMA descriptor too."""
    if not on_sm90(dy) or dy.dtype not in (torch.bfloat16, torch.float16) or x.dtype != dy.dtype:
        return False
    if main_grad is not None:
        target, dtypes = main_grad, (torch.float32,)
    else:
        target, dtypes = out, (dy.dtype, torch.float32)
    dtype = target.dtype if target is not None else out_dtype or dy.dtype
    if dtype not in dtypes:
        return False
    return tma_ok(dy, x, target) and dy.shape[0] < RAGGED_ROWS


@gluon.jit
def _tile(tile, offsets, N, K, BN: gl.constexpr, BK: gl.constexpr, N_FASTEST: gl.constexpr):
    """Tile ``tile`` of the walk (gemm/wgrad_walk.py): group g (a group's tiles are consecutive, so
    a wave shares its rows in L2), the tile's (pid_n, pid_k), the group's first row and row
    count."""
    g, pid_n, pid_k = wgrad_tile(tile, gl.cdiv(N, BN), gl.cdiv(K, BK), N_FASTEST)
    row0 = gl.load(offsets + g)
    size = (gl.load(offsets + g + 1) - row0).to(gl.int32)
    return g, pid_n, pid_k, row0.to(gl.int32), size


@gluon.jit
def _producer(dy_desc, x_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K,
              NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, N_FASTEST: gl.constexpr):
    HALF: gl.constexpr = dy_desc.block_type.shape[3]
    BR: gl.constexpr = dy_desc.block_type.shape[2]
    BK: gl.constexpr = x_desc.block_type.shape[3]
    i = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, 2 * HALF) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, row0, size = _tile(tile, offsets, N, K, 2 * HALF, BK, N_FASTEST)
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
def _consumer(dy_desc, x_desc, dw_desc, a_bufs, b_bufs, dw_smem, dw_bar, ready, empty, offsets, G, N, K,
              half_row, ACCUMULATE: gl.constexpr, NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr,
              N_FASTEST: gl.constexpr):
    """Rows ``half_row..+64`` (0 or 64; a runtime value, as Gluon 3.6 takes no literal
    constexpr among a partition's arguments) of each [128, BK] tile of ``dw[g]``, added to
    dw's with ACCUMULATE."""
    HALF: gl.constexpr = dy_desc.block_type.shape[3]
    BR: gl.constexpr = dy_desc.block_type.shape[2]
    BK: gl.constexpr = x_desc.block_type.shape[3]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BK, 16])
    i = 0
    loads = 0
    for tile in range(gl.program_id(0), G * gl.cdiv(N, 2 * HALF) * gl.cdiv(K, BK), NUM_PROGRAMS):
        g, pid_n, pid_k, row0, size = _tile(tile, offsets, N, K, 2 * HALF, BK, N_FASTEST)
        steps = gl.cdiv(size, BR)
        off_n = pid_n * 2 * HALF + half_row
        if ACCUMULATE:
            prefetch_tile(dw_desc, [g, off_n, pid_k * BK], dw_bar, dw_smem)
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
        # TMA drops the rows past N and the columns past K.
        loads = store_tile(acc, dw_desc, [g, off_n, pid_k * BK], dw_smem, dw_smem.reshape([HALF, BK]), dw_bar,
                           loads, ACCUMULATE, acc_layout)
    tma.store_wait(0)


@gluon.jit
def grouped_wgrad_kernel(dy_desc, x_desc, dw_desc, offsets, G, N, K, ACCUMULATE: gl.constexpr,
                         NUM_PROGRAMS: gl.constexpr, STAGES: gl.constexpr, N_FASTEST: gl.constexpr,
                         num_warps: gl.constexpr):
    """``dy_desc`` / ``x_desc``: ragged descriptors over dy [M, N] ([BR, 64] boxes) and x [M, K]
    ([BR, BK] boxes); ``dw_desc`` over dw [G, N, K] (or main_grad, with ACCUMULATE; [1, 64, BK]
    boxes)."""
    HALF: gl.constexpr = dy_desc.block_type.shape[3]
    BR: gl.constexpr = dy_desc.block_type.shape[2]
    BK: gl.constexpr = x_desc.block_type.shape[3]
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    a_top = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, 1, 1, BR, HALF], dy_desc.layout)
    a_bottom = gl.allocate_shared_memory(dy_desc.dtype, [STAGES, 1, 1, BR, HALF], dy_desc.layout)
    b_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, 1, 1, BR, BK], x_desc.layout)
    dw_top = gl.allocate_shared_memory(dw_desc.dtype, [1, HALF, BK], dw_desc.layout)
    dw_bottom = gl.allocate_shared_memory(dw_desc.dtype, [1, HALF, BK], dw_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    dw_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(2):
        mbarrier.init(dw_bars.index(c), count=1)
    # Every argument tuple spelled out: a tuple built in steps turns constexprs into values.
    gl.warp_specialize([
        (_consumer, (dy_desc, x_desc, dw_desc, a_top, b_bufs, dw_top, dw_bars.index(0), ready, empty, offsets,
                     G, N, K, gl.to_tensor(0), ACCUMULATE, NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_consumer, (dy_desc, x_desc, dw_desc, a_bottom, b_bufs, dw_bottom, dw_bars.index(1), ready, empty,
                     offsets, G, N, K, gl.to_tensor(HALF), ACCUMULATE, NUM_PROGRAMS, STAGES, N_FASTEST)),
        (_producer, (dy_desc, x_desc, a_top, a_bottom, b_bufs, ready, empty, offsets, G, N, K, NUM_PROGRAMS,
                     STAGES, N_FASTEST)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def _descriptor(t: torch.Tensor, shape, strides, block: list[int]) -> TensorDescriptor:
    """Gluon's ``TensorDescriptor(t, shape, strides, block, layout)`` without its per-call checks
    (~40 % of this launcher's host time): ``usable`` checked ``t`` (``dense.tma_ok``: what those
    checks read of it), the layout is the shared one for the block, the block is checked once."""
    checked_block(tuple(block))
    desc = _new(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape = t, shape, strides, block
    desc.layout, desc.padding = shared_layout(tuple(block), t.dtype), "zero"
    return desc


_new = object.__new__


def _ragged(t: torch.Tensor, cols: int) -> TensorDescriptor:
    """gemm/grouped.py's ragged descriptor over t's rows, with [BLOCK_R, cols] boxes."""
    return _descriptor(t, *ragged_geometry(t), [1, 1, BLOCK_R, cols])


def grouped_wgrad_hopper(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor,
                         main_grad: torch.Tensor | None = None, out: torch.Tensor | None = None,
                         along_n: bool | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """grouped_gemm_wgrad: ``dw`` [G, N, K] (``out`` when given, else allocated in
    ``out_dtype``, default dy's), or ``main_grad`` after adding to it. Callers check
    ``usable``. ``along_n``: the walk order (tests), else wgrad_walk.n_fastest's."""
    N, K, G = dy.shape[1], x.shape[1], offsets.shape[0] - 1
    accumulate = main_grad is not None
    if accumulate:
        dw = main_grad
    else:
        dw = out if out is not None else torch.empty(G, N, K, dtype=out_dtype or dy.dtype, device=dy.device)
    # A float32 target takes the narrower tile: its staging is twice a 16-bit one's.
    float32_dw = dw.dtype == torch.float32
    bk = BLOCK_K[float32_dw]
    dw_desc = _descriptor(dw, dw.shape, dw.stride(), [1, HALF, bk])
    programs = persistent_programs(dw, G * cdiv(N, BLOCK_N) * cdiv(K, bk))
    if along_n is None:
        along_n = n_fastest(N, K, BLOCK_N, bk, programs)
    launch(grouped_wgrad_kernel, (programs,),
        _ragged(dy, HALF), _ragged(x, bk), dw_desc, offsets, G, N, K,
        ACCUMULATE=accumulate, NUM_PROGRAMS=programs, STAGES=STAGES[float32_dw], N_FASTEST=along_n, num_warps=4,
    )
    return dw


def serves(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, *,
           main_grad: torch.Tensor | None = None, out: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, x_rows: torch.Tensor | None = None,
           dy_rows: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row: whether this kernel takes the call (``usable``; rows
    gathered by ``x_rows`` or ``dy_rows`` go to the Triton kernel: TMA on sm_90 loads boxes,
    not rows)."""
    return x_rows is None and dy_rows is None and usable(dy, x, main_grad, out, out_dtype)


def grouped_gemm_wgrad(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, *,
                       main_grad: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       out_dtype: torch.dtype | None = None, x_rows: torch.Tensor | None = None,
                       dy_rows: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_wgrad.py's ``grouped_gemm_wgrad`` (same arguments) on this kernel, for the
    calls ``serves`` accepts (``x_rows`` and ``dy_rows`` None)."""
    if x_rows is not None or dy_rows is not None:
        raise ValueError("x_rows, dy_rows: the Gluon wgrad loads by TMA and cannot gather rows; the "
                         "dispatch table sends gathered calls to gemm/grouped_wgrad.py")
    return grouped_wgrad_hopper(dy, x, offsets, main_grad, out, out_dtype=out_dtype)
