"""Elementwise activations: ``y = act(x)``, ``dx = dy * act'(x)``, and that backward fused
with the gradient of the bias added before the activation, ``dbias = sum over rows of dx``.

Shapes: ``activation_fwd`` / ``activation_bwd`` take any shape, treated flat;
``activation_bwd_dbias`` takes [rows, features] and returns ``dbias`` [features].
Tiling: flat BLOCK-element chunks, one per program. The dbias variant walks slabs of rows
in [BLOCK_M, BLOCK_N] tiles (bias_grad's split) and sums the partials in a second stage.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import (
    AnyActivation,
    activation,
    chain_grad,
    kernel_act,
    reference_activation,
    reference_chain_grad,
    wide,
)
from fuseops.kernels.elementwise.bias_grad import ReduceConfig, row_split, sum_partials
from fuseops.kernels.launch import launch


@dataclass(frozen=True)
class FlatConfig:
    block: int
    num_warps: int


@functools.cache
def _configs() -> tuple[FlatConfig, ReduceConfig]:
    """Tiles of the flat kernels and of the dbias variant. Under the interpreter, small
    tiles give several programs (and the dbias second stage) on test shapes. On GPU the flat
    kernels (not timed yet) hold 16 bf16 per thread (two 16-byte loads; GELU-tanh bwd 80
    registers, ptxas sm_90). The dbias tile, 32 rows x 128 columns at 4 warps, 4 programs a
    multiprocessor, was the fastest of 192 at each of five shapes (H100, bf16 GELU-tanh,
    [1024 | 4096 | 16384, 4096], [1024, 8192], [4096, 16384]), and 1.02-1.25x an 8 x 256 tile
    in GPU time (CUDA graphs, six shapes); 69-121
    registers and no spills for every activation (``python -m benchmarks.sm90_report
    activation_dbias``)."""
    if INTERPRET:
        return FlatConfig(block=256, num_warps=1), ReduceConfig(8, 64, num_warps=1, programs_per_sm=1)
    return FlatConfig(block=4096, num_warps=8), ReduceConfig(32, 128, num_warps=4, programs_per_sm=4)


@triton.jit
def activation_fwd_kernel(x, y, numel, alpha, ACT: tl.constexpr, BLOCK: tl.constexpr):
    # int64 offsets: flat tensors may pass 2**31 elements.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    xt = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + offs, activation(xt, ACT, alpha).to(y.dtype.element_ty), mask=mask)


@triton.jit
def activation_bwd_kernel(x, dy, dx, numel, alpha, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    xt = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
    dyt = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx + offs, chain_grad(dyt, xt, ACT, alpha).to(dx.dtype.element_ty), mask=mask)


@triton.jit
def activation_bwd_dbias_kernel(
    x, dy, dx, partials, M, N, stride_partials, rows_per_program, alpha,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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
        mask = (offs_m < row_end)[:, None] & mask_n[None, :]
        offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        # [BLOCK_M, BLOCK_N]
        xt = tl.load(x + offs, mask=mask, other=0.0).to(tl.float32)
        dyt = tl.load(dy + offs, mask=mask, other=0.0).to(tl.float32)
        dxt = chain_grad(dyt, xt, ACT, alpha)
        tl.store(dx + offs, dxt.to(dx.dtype.element_ty), mask=mask)
        # Masked lanes hold dy = 0, so they add nothing.
        acc += dxt
    tl.store(partials + pid_m * stride_partials + offs_n, tl.sum(acc, 0).to(partials.dtype.element_ty), mask=mask_n)


def activation_fwd(
    x: torch.Tensor, act: AnyActivation, alpha: float = 1.0, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``y = act(x)`` in ``x``'s dtype, float32 maths.

    Args:
        x: any shape, contiguous.
        act: the function; ``alpha`` is SiLU's sigmoid slope (others ignore it).
        out: like ``x``, written and returned; else allocated.
    """
    cfg = _configs()[0]
    y = out if out is not None else torch.empty_like(x)
    numel = x.numel()
    launch(activation_fwd_kernel, (cdiv(numel, cfg.block),),
        x, y, numel, alpha, ACT=kernel_act(act), BLOCK=cfg.block, num_warps=cfg.num_warps,
    )
    return y


def activation_bwd(
    x: torch.Tensor,
    dy: torch.Tensor,
    act: AnyActivation,
    alpha: float = 1.0,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dx = dy * act'(x)`` in ``x``'s dtype, float32 maths.

    Args:
        x: the activation's input, any shape, contiguous; dy: same shape.
        out: like ``x``, written and returned; else allocated.
    """
    cfg = _configs()[0]
    dx = out if out is not None else torch.empty_like(x)
    numel = x.numel()
    launch(activation_bwd_kernel, (cdiv(numel, cfg.block),),
        x, dy, dx, numel, alpha, ACT=kernel_act(act), BLOCK=cfg.block, num_warps=cfg.num_warps,
    )
    return dx


def activation_bwd_dbias(
    x2d: torch.Tensor,
    dy2d: torch.Tensor,
    act: AnyActivation,
    alpha: float = 1.0,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx = dy * act'(x)`` and ``dbias = dx.sum(0)`` in one pass over the data.

    Args:
        x2d: [rows, features] activation input, contiguous (rows may be 0); dy2d: same shape.
        out: [rows, features] for ``dx``, written and returned; else allocated.
    Returns:
        ``(dx, dbias)``: ``dx`` like ``x2d``; ``dbias`` [features] in ``x2d``'s dtype,
        summed in float32 from the unrounded ``dx``, deterministically.
    """
    cfg = _configs()[1]
    M, N = x2d.shape
    dx = out if out is not None else torch.empty_like(x2d)
    programs, rows_per_program = row_split(M, N, x2d, cfg)
    # One slab needs no second stage: its sums go straight to the output, an [N] tensor
    # (no [1, N] stage and a view of its row: one torch op less a call).
    if programs == 1:
        stage = torch.empty(N, dtype=x2d.dtype, device=x2d.device)
    else:
        stage = torch.empty(programs, N, dtype=torch.float32, device=x2d.device)
    launch(activation_bwd_dbias_kernel, (programs, cdiv(N, cfg.block_n)),
        x2d, dy2d, dx, stage, M, N, N, rows_per_program, alpha,
        ACT=kernel_act(act), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )
    return dx, (stage if programs == 1 else sum_partials(stage, x2d.dtype))


def reference_activation_fwd(
    x: torch.Tensor, act: AnyActivation, alpha: float = 1.0, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``y = act(x)``, evaluated in float32 (formulas in ``_activations``), cast to ``x``'s
    dtype (or written into ``out``)."""
    y = reference_activation(x, act, alpha)
    return out.copy_(y) if out is not None else as_dtype(y, x.dtype)


def reference_activation_bwd(
    x: torch.Tensor,
    dy: torch.Tensor,
    act: AnyActivation,
    alpha: float = 1.0,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dx = dy * act'(x)`` in float32 (float64 for float64), cast to ``x``'s dtype (or written
    into ``out``)."""
    dx = reference_chain_grad(wide(dy), x, act, alpha)
    return out.copy_(dx) if out is not None else as_dtype(dx, x.dtype)


def reference_activation_bwd_dbias(
    x2d: torch.Tensor,
    dy2d: torch.Tensor,
    act: AnyActivation,
    alpha: float = 1.0,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx = dy * act'(x)`` and ``dbias[n] = sum_r dx[r, n]``, both from the float32
    ``dx`` (before rounding), cast to ``x2d``'s dtype; ``dx`` into ``out`` when given."""
    dx = reference_chain_grad(wide(dy2d), x2d, act, alpha)
    dbias = as_dtype(dx.sum(0), x2d.dtype)
    return (out.copy_(dx) if out is not None else as_dtype(dx, x2d.dtype)), dbias
