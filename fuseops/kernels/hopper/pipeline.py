"""Building blocks of the warp-specialized Gluon GEMMs for Hopper (sm_90): a TMA producer warp
fills a ring of shared-memory stages and two consumer warpgroups take the two 64-row halves of
each output tile (hopper/blockwise.py, hopper/blockwise_wgrad.py,
hopper/wgrad.py).

- The walk over the tiles of all groups, counted from the device offsets in every partition
  alike (``total_tiles``, ``start_walk``, ``grouped_tile``): no host sync.
- The ring and its barriers (``ring``): ``ready`` when the producer's TMA copies landed,
  ``empty`` when both consumers are done with a stage; the producer's steps (``load_steps``)
  and the blockwise consumer's, each step's product rescaled on its own (``mma_steps``), or
  the per-tensor wgrad's, chained into one accumulator (``chained_steps``).
- A consumer's rows of a group's output tile (``tile_span``) and their epilogue: the groups'
  scales, bias, the sum so far, a TMA store where the rows are all the group's (``store_rows``).
- An output tile's float32 prefetch and asynchronous TMA store (``prefetch_tile``,
  ``store_tile``), and the layouts and descriptors the kernels share.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
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
from fuseops.kernels.gemm.dense import fresh_tma_ok, tma_ok
from fuseops.kernels.gemm.grouped import _swizzle

BLOCK = 128
HALF = BLOCK // 2
# Registers per thread: each consumer holds its float32 sums; the producer only addresses.
# 2 x 4 warps x 232 + 4 x 40 (the producer's warpgroup) fits the 64 K of an SM.
CONSUMER_REGS, PRODUCER_REGS = gl.constexpr(232), gl.constexpr(40)
GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5, torch.bfloat16: gl.bfloat16,
             torch.float16: gl.float16, torch.float32: gl.float32}


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    # Asked on every launch by the dispatch table: torch's query builds a properties object.
    return torch.cuda.get_device_capability(device_index)


def on_sm90(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on an sm_90 GPU, where these kernels run (not under the interpreter)."""
    # get_device(), not device.index: no torch.device made per launch.
    return not INTERPRET and t.is_cuda and _capability(t.get_device()) == (9, 0)


@gluon.jit
def _tiles_of(offsets, g, tiles_n):
    return gl.cdiv((gl.load(offsets + g + 1) - gl.load(offsets + g)).to(gl.int32), 128) * tiles_n


@gluon.jit
def total_tiles(offsets, G, tiles_n, BLOCK_G: gl.constexpr, WARPS: gl.constexpr):
    """Tiles of all groups (``WARPS``: the calling partition's)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    offs = gl.arange(0, BLOCK_G, layout=layout)
    mask = offs < G
    size = (gl.load(offsets + offs + 1, mask=mask, other=0) - gl.load(offsets + offs, mask=mask, other=0))
    return gl.sum(gl.cdiv(size.to(gl.int32), 128) * tiles_n, axis=0)


@gluon.jit
def start_walk(offsets, tiles_n):
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
def grouped_tile(tile, g, g_first, g_tiles, offsets, tiles_n, GROUP_M: gl.constexpr):
    """The cursor at ``tile``, the group's first row and row count, and the tile's (pid_m,
    pid_n) inside the group (the band walk of gemm/grouped.py)."""
    g, g_first, g_tiles = _seek(tile, g, g_first, g_tiles, offsets, tiles_n)
    row0 = gl.load(offsets + g)
    size = (gl.load(offsets + g + 1) - row0).to(gl.int32)
    pid_m, pid_n = _swizzle(tile - g_first, gl.cdiv(size, 128), tiles_n, GROUP_M)
    return g, g_first, g_tiles, row0, size, pid_m, pid_n


@gluon.jit
def ring(a_desc, b_desc, out_desc, STAGES: gl.constexpr):
    """The blockwise kernels' shared memory: STAGES of A (two 64-row halves) and B, one output
    tile half per consumer for its TMA stores, and the ring's barriers: ``ready`` (the
    producer's TMA landed) and ``empty`` (both consumers are done) per stage."""
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


@gluon.jit
def load_steps(a_desc, b_desc, a_top, a_bottom, b_bufs, ready, empty, a_row, b_row, step0, steps, i,
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
def mma_steps(a_bufs, b_bufs, ready, empty, sa_ptrs, sa_mask, sb_ptrs, sb_mask, sa_step, sb_step, steps, i,
              STAGES: gl.constexpr, SB_PER_COLUMN: gl.constexpr, acc_layout: gl.constexpr):
    """One consumer's sum over ``steps`` K steps: each step's product times its scales, the
    rows' ``sa_ptrs`` and the columns' ``sb_ptrs`` (one scalar when not SB_PER_COLUMN, else
    in ``spread_layout``), advanced by ``sa_step`` / ``sb_step`` elements a step."""
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
            # behind (H100, wgrad: +9-12 % over loading them in the step). The forward's 2 row
            # scales and one scalar lose that way (Qwen3's four forward / dgrad GEMMs 3.6-5.5 %
            # slower, ``benchmarks/fp8_gemm_tiles.py``), though Nsight Compute finds 6.7 % of
            # the forward's warp samples at the FMUL waiting on them loaded in the step.
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
def chained_steps(a_bufs, b_bufs, ready, empty, steps, i, STAGES: gl.constexpr, acc_layout: gl.constexpr):
    """One consumer's sum over ``steps`` K steps into one accumulator (no per-step scales: the
    per-tensor wgrad, hopper/tensor_scaled_wgrad.py): a wgmma in flight while the next stage is
    awaited, each stage released once the MMA reading it is done."""
    HALF: gl.constexpr = a_bufs.shape[1]
    BN: gl.constexpr = b_bufs.shape[1]
    acc = gl.zeros([HALF, BN], gl.float32, layout=acc_layout)
    for k in range(steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
        # Leaves this step's MMA in flight: the previous step's is done, its stage free.
        acc = warpgroup_mma_wait(1, deps=(acc,))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > 0)
        i += 1
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=steps > 0)
    return acc, i


@gluon.jit
def tile_span(off_m, row0, size, pid_n, N, HALF: gl.constexpr, BN: gl.constexpr, acc_layout: gl.constexpr):
    """Rows ``off_m..+HALF`` of a group's tile (the group's rows start at ``row0``, ``size`` of
    them) and the tile's columns: (y's rows, their mask, the columns, their mask), in the
    accumulator's layout."""
    offs_m = off_m + gl.arange(0, HALF, layout=gl.SliceLayout(1, acc_layout))
    cols = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
    return row0 + offs_m, offs_m < size, cols, cols < N


@gluon.jit
def store_rows(acc, off_m, row0, size, rows, mask_m, cols, mask_n, g, pid_n, a_outer, b_outer, bias, y, y_desc,
               y_smem, stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_ym,
               HAS_OUTER_A: gl.constexpr, HAS_OUTER_B: gl.constexpr, GROUP_FACTORS: gl.constexpr,
               HAS_BIAS: gl.constexpr, ACCUMULATE: gl.constexpr, WAIT_STORES: gl.constexpr):
    """The epilogue of a forward / dgrad consumer's rows (``tile_span``'s): a's and b's outer
    factors (GROUP_FACTORS: one value per group each, else per row of a / of b), bias, y's sum
    so far with ACCUMULATE, then a TMA store through ``y_smem`` where every row is the group's
    (it clips the columns past N; WAIT_STORES: after the last store through it left), else
    masked stores."""
    HALF: gl.constexpr = y_smem.shape[0]
    BN: gl.constexpr = y_smem.shape[1]
    if GROUP_FACTORS:
        # Two scalars, not a value per row and per column (64 registers a thread for b's at
        # BN = 256, which with a bias spilled); applied one after the other as the Triton
        # kernel and the reference do, so the bits are theirs.
        if HAS_OUTER_A:
            acc *= gl.load(a_outer + g * stride_aog)
        if HAS_OUTER_B:
            acc *= gl.load(b_outer + g * stride_bog)
    else:
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
        if WAIT_STORES:
            tma.store_wait(0)
        y_smem.store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [(row0 + off_m).to(gl.int32), pid_n * BN], y_smem)
    else:
        gl.store(y + rows[:, None] * stride_ym + cols[None, :], out, mask=mask_m[:, None] & mask_n[None, :])


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
def spread_layout(n):
    """[n] over one warpgroup's threads, consecutive elements per thread."""
    return gl.BlockedLayout([max(1, n // 128)], [32], [4], [0])


@gluon.constexpr_function
def mma_layout(BN):
    """A consumer warpgroup's [64, BN] float32 wgmma result."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])


@functools.cache
def shared_layout(block: tuple[int, ...], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """``NVMMASharedLayout.get_default_for(block, dtype)``, made once per (block, dtype): a pure
    function of them whose result is a frozen dataclass, while each call of Triton's (a
    constexpr function) unwraps its arguments and builds the layout again (~10 us a launch
    over a launch's three descriptors)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), GL_DTYPES[dtype])


def descriptor(t: torch.Tensor, rows: int, cols: int = BLOCK) -> TensorDescriptor:
    """A descriptor with [rows, cols] boxes (for float8 operands 128 columns: the 128-byte swizzle
    wgmma reads)."""
    return TensorDescriptor.from_tensor(t, [rows, cols], shared_layout((rows, cols), t.dtype))


def grouped_operands_ready(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, shape: tuple[int, int],
                           out_dtype: torch.dtype) -> bool:
    """Whether a grouped GEMM's operands all take TMA descriptors on an sm_90 GPU as the Gluon
    launchers read them: ``a``; ``b`` [G, N, K] itself when contiguous along K, else its contiguous
    copy; ``out``, or a fresh result of ``shape`` and ``out_dtype``. Nothing is allocated to ask."""
    if not (on_sm90(a) and tma_ok(a)):
        return False
    if b.stride(2) == 1:
        b_ok = b.is_contiguous() and tma_ok(b)
    else:
        b_ok = fresh_tma_ok(tuple(b.shape), b.dtype)
    return b_ok and (tma_ok(out) if out is not None else fresh_tma_ok(shape, out_dtype))


def grouped_call(run: Callable, a, b, offsets: torch.Tensor, out_dtype: torch.dtype, bias: torch.Tensor | None,
                 out: torch.Tensor | None) -> torch.Tensor:
    """A forward / dgrad dispatch row's call of ``run(a, b, offsets, y, bias)``: ``b`` [G, N, K]
    read from a contiguous copy where it is strided along K (as the Triton launcher reads it),
    ``y`` [M, N] ``out`` or a fresh tensor of ``out_dtype``."""
    b_mem = b.data if b.data.stride(2) == 1 else b.data.contiguous()
    y = out if out is not None else torch.empty(a.data.shape[0], b.data.shape[1], dtype=out_dtype,
                                                device=a.data.device)
    return run(a, dataclasses.replace(b, data=b_mem), offsets, y, bias)


def wgrad_call(run: Callable, a, b, offsets: torch.Tensor, out_dtype: torch.dtype, main_grad: torch.Tensor | None,
               out: torch.Tensor | None) -> torch.Tensor:
    """A wgrad dispatch row's call of ``run(a, b, offsets, dw, accumulate)``: added to
    ``main_grad`` where given, else written to ``out`` or a fresh [G, N, K] of ``out_dtype``."""
    if main_grad is not None:
        return run(a, b, offsets, main_grad, True)
    if out is None:
        out = torch.empty(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], dtype=out_dtype,
                          device=a.data.device)
    return run(a, b, offsets, out, False)


def dw_descriptor(dw: torch.Tensor, cols: int) -> tuple[TensorDescriptor, bool]:
    """The wgrad kernels' ``dw_desc`` ([64, cols] boxes over dw as [G * N, K]) and whether its
    tiles go by TMA (dw contiguous with 16-byte rows); without, the descriptor is only a
    placeholder (over a small tensor that always takes one)."""
    G, N, K = dw.shape
    dw_tma = dw.is_contiguous() and tma_ok(dw)
    return descriptor(dw.view(G * N, K) if dw_tma else dw.new_empty(HALF, cols), HALF, cols), dw_tma


def dummy_or(t: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    return t if t is not None else dummy
