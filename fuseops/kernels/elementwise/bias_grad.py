"""Bias gradient ``db[n] = sum over rows of dy[:, n]``, and the deterministic reduction over
rows that every other row reduction shares (dbias in the activation backward, dweight and
dbias of the norms, dprobs of the gated activations).

Shapes: ``dy`` [rows, features] -> ``db`` [features]; sums in float32.
Tiling: two stages and no atomics. A grid of (row slabs, BLOCK_N column blocks) programs
each sums its slab in [BLOCK_M, BLOCK_N] tiles into one float32 partial row; a second
launch of the same kernel sums the partials. The split depends only on the shape and the
device, so the result is bitwise repeatable.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2, num_sms
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.launch import launch


@dataclass(frozen=True)
class ReduceConfig:
    block_m: int
    block_n: int
    num_warps: int
    # Row slabs are sized so that about this many programs run per SM.
    programs_per_sm: int


@functools.cache
def _configs() -> ReduceConfig:
    """Tile of the column sums' first stage (and, under the interpreter, of the second, where
    small tiles keep several programs busy on test shapes). On GPU: 32 values per thread in
    flight at 88 registers (ptxas, sm_90); within 6 % of the best of 192 tiles at [1024 | 4096
    | 16384, 1024], [1024, 2048], [16384, 4096] (H100, do_bench, so host time at the small
    shapes). The second stage's GPU tile is ``_second_stage``'s."""
    if INTERPRET:
        return ReduceConfig(block_m=8, block_n=64, num_warps=1, programs_per_sm=1)
    return ReduceConfig(block_m=32, block_n=128, num_warps=4, programs_per_sm=4)


def row_split(rows: int, cols: int, t: torch.Tensor, cfg: ReduceConfig) -> tuple[int, int]:
    """``(programs, rows_per_program)``: slabs of whole ``block_m`` tiles, enough slabs
    that (slabs x column blocks) fills the device; at least one slab, even for 0 rows."""
    return _row_split(rows, cols, t.get_device(), cfg.block_m, cfg.block_n, cfg.programs_per_sm)


@functools.lru_cache(maxsize=1024)
def _row_split(rows: int, cols: int, device_index: int, block_m: int, block_n: int,
               programs_per_sm: int) -> tuple[int, int]:
    """``row_split`` once per shape and device (-1: CPU), keyed by ints (a frozen
    dataclass hashes through Python code)."""
    col_blocks = cdiv(cols, block_n)
    wanted = max(1, cdiv(programs_per_sm * num_sms(device_index), col_blocks))
    programs = max(1, min(wanted, cdiv(rows, block_m)))
    rows_per_program = max(1, cdiv(cdiv(rows, programs), block_m)) * block_m
    return max(1, cdiv(rows, rows_per_program)), rows_per_program


@triton.jit
def column_sum_kernel(
    src, dst, M, N, stride_src, stride_dst, rows_per_program,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    row0 = pid_m * rows_per_program
    row_end = tl.minimum(row0 + rows_per_program, M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r in range(row0, row_end, BLOCK_M):
        offs_m = r + tl.arange(0, BLOCK_M)
        ptrs = src + offs_m[:, None].to(tl.int64) * stride_src + offs_n[None, :]
        # [BLOCK_M, BLOCK_N]
        acc += tl.load(ptrs, mask=(offs_m < row_end)[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
    out = tl.sum(acc, 0)
    tl.store(dst + pid_m * stride_dst + offs_n, out.to(dst.dtype.element_ty), mask=mask_n)


@functools.lru_cache(maxsize=256)
def _second_stage(cols: int) -> ReduceConfig:
    """The second stage's tile on GPU: 1024 elements of 16 columns (64 rows, 4 warps) while
    that leaves at most 1024 programs, then wider and shorter. One program walks all P
    partial rows of its columns, so the first stage's 128-column tile left N / 128 programs
    (8 at N=1024), each waiting on P / 32 dependent loads: 6.7 us for the norm backward's
    264 x 1024 partials, 2.3 us in this tile. Measured on an H100 (GPU time in CUDA graphs)
    against the 128-column tile: 0.99-3.55x at P = 17-528, N = 1024-16384 (within
    12 % of the best of 8-512 rows x 8-256 columns x 1-8 warps at 17 of those 20 shapes, the
    sweep on another H100); at 2-17 rows of 32768-262144 columns (the gated backward's dprobs)
    1.02-2.47x, where a fixed 16 columns gives 0.60-0.76x. The norm backward gains 1.06-2.00x."""
    block_n = max(16, next_power_of_2(cdiv(cols, 1024)))
    # (programs_per_sm is the first stage's: one row of column blocks here.)
    return ReduceConfig(block_m=max(4, 1024 // block_n), block_n=block_n, num_warps=4, programs_per_sm=1)


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Second stage: ``partials`` [P, N] float32 summed over P, returned as [N] in ``dtype``."""
    P, N = partials.shape
    cfg = _configs() if INTERPRET else _second_stage(N)
    out = torch.empty(N, dtype=dtype, device=partials.device)
    launch(column_sum_kernel, (1, cdiv(N, cfg.block_n)),
        partials, out, P, N, partials.stride(0), 0, P,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )
    return out


def bias_grad(dy2d: torch.Tensor) -> torch.Tensor:
    """``db = dy2d.sum(0)`` with float32 sums, in ``dy2d``'s dtype (module docstring).

    Args:
        dy2d: [rows, features], contiguous; rows may be 0.
    Returns:
        ``db`` [features].
    """
    cfg = _configs()
    M, N = dy2d.shape
    programs, rows_per_program = row_split(M, N, dy2d, cfg)
    # One slab needs no second stage: its sums go straight to the output, an [N] tensor
    # (no [1, N] stage and a view of its row: one torch op less a call).
    if programs == 1:
        stage = torch.empty(N, dtype=dy2d.dtype, device=dy2d.device)
    else:
        stage = torch.empty(programs, N, dtype=torch.float32, device=dy2d.device)
    launch(column_sum_kernel, (programs, cdiv(N, cfg.block_n)),
        dy2d, stage, M, N, dy2d.stride(0), N, rows_per_program,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )
    return stage if programs == 1 else sum_partials(stage, dy2d.dtype)


def reference_bias_grad(dy2d: torch.Tensor) -> torch.Tensor:
    """``db[n] = sum_r dy2d[r, n]``, summed in float32 (float64 for float64), cast to
    ``dy2d``'s dtype; zeros when there are no rows."""
    compute = torch.promote_types(dy2d.dtype, torch.float32)
    return as_dtype(dy2d.to(compute).sum(0), dy2d.dtype)
