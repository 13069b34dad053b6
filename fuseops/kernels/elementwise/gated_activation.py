"""Gated activations ``y = gated(a, b) [* probs[:, None]]`` and their backward.

Shapes: ``x`` [rows, 2F] -> ``y`` [rows, F]. Halves: ``a = x[:, :F], b = x[:, F:]``, or
with ``interleaved`` ``a = x[:, 0::2], b = x[:, 1::2]``. ``probs`` [rows] (float32 or the
input dtype) scales each output row; backward also returns ``dprobs``.
Tiling: one program per [BLOCK_M, BLOCK_F] tile of ``y``; interleaved pairs load as one
contiguous [BLOCK_M, BLOCK_F, 2] tile and split. ``dprobs`` sums over F: each column block
writes a float32 partial per row, and bias_grad's second stage sums them (no atomics).
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
    gated,
    gated_and_grad,
    kernel_act,
    reference_gated,
    reference_gated_grad,
    wide,
)
from fuseops.kernels.elementwise.bias_grad import sum_partials
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.finite import finite_abs, reference_finite_abs


@dataclass(frozen=True)
class GatedConfig:
    block_m: int
    block_f: int
    num_warps: int


@functools.cache
def _configs() -> dict[str, GatedConfig]:
    """Output tiles, forward and backward. On GPU, not timed yet: 8 outputs per thread
    (16-byte bf16 loads), sized by ptxas register counts for sm_90 (clamped SwiGLU with
    probs: forward 36-40 registers, backward 96-127; a 16x256 backward tile takes 255).
    ``benchmarks/elementwise.py`` is the measurement to retune them with."""
    if INTERPRET:
        small = GatedConfig(block_m=8, block_f=32, num_warps=1)
        return {"fwd": small, "bwd": small}
    return {"fwd": GatedConfig(8, 256, num_warps=8), "bwd": GatedConfig(4, 256, num_warps=4)}


@triton.jit
def _pair_offsets(offs_m, offs_f, stride, F, INTERLEAVED: tl.constexpr):
    """Offsets of ``a`` and ``b`` ([BLOCK_M, BLOCK_F] each), or, interleaved, of the
    [BLOCK_M, BLOCK_F, 2] pairs."""
    rows = offs_m[:, None].to(tl.int64) * stride
    if INTERLEAVED:
        offs_a = rows[:, :, None] + (2 * offs_f)[None, :, None] + tl.arange(0, 2)[None, None, :]
        offs_b = offs_a
    else:
        offs_a = rows + offs_f[None, :]
        offs_b = offs_a + F
    return offs_a, offs_b


@triton.jit
def _load_pair(x, offs_a, offs_b, mask, INTERLEAVED: tl.constexpr):
    if INTERLEAVED:
        # [BLOCK_M, BLOCK_F, 2]
        pair = tl.load(x + offs_a, mask=mask[:, :, None], other=0.0)
        a, b = tl.split(pair)
    else:
        # [BLOCK_M, BLOCK_F]
        a = tl.load(x + offs_a, mask=mask, other=0.0)
        b = tl.load(x + offs_b, mask=mask, other=0.0)
    return a.to(tl.float32), b.to(tl.float32)


@triton.jit
def gated_fwd_kernel(
    x, probs, y, M, F, stride_x, stride_y, limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_PROBS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_m = offs_m < M
    mask = mask_m[:, None] & (offs_f < F)[None, :]
    offs_a, offs_b = _pair_offsets(offs_m, offs_f, stride_x, F, INTERLEAVED)
    a, b = _load_pair(x, offs_a, offs_b, mask, INTERLEAVED)
    out = gated(a, b, ACT, CLAMPED, limit, alpha)
    if HAS_PROBS:
        out *= tl.load(probs + offs_m, mask=mask_m, other=0.0).to(tl.float32)[:, None]
    y_ptrs = y + offs_m[:, None].to(tl.int64) * stride_y + offs_f[None, :]
    tl.store(y_ptrs, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def gated_bwd_kernel(
    x, dy, probs, dx, dprobs_partials, row_amax, M, F, stride_x, stride_dy, limit, alpha,
    ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_PROBS: tl.constexpr,
    ROW_AMAX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):
    pid_f = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_m = offs_m < M
    mask = mask_m[:, None] & (offs_f < F)[None, :]
    offs_a, offs_b = _pair_offsets(offs_m, offs_f, stride_x, F, INTERLEAVED)
    a, b = _load_pair(x, offs_a, offs_b, mask, INTERLEAVED)
    dy_ptrs = dy + offs_m[:, None].to(tl.int64) * stride_dy + offs_f[None, :]
    # [BLOCK_M, BLOCK_F]
    upstream = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
    scaled = upstream
    if HAS_PROBS:
        scaled = upstream * tl.load(probs + offs_m, mask=mask_m, other=0.0).to(tl.float32)[:, None]
    out, da, db = gated_and_grad(a, b, scaled, ACT, CLAMPED, limit, alpha)
    if HAS_PROBS:
        # Masked lanes hold dy = 0, so they add nothing to the row sums.
        partial = tl.sum(upstream * out, 1)
        tl.store(dprobs_partials + pid_f * M + offs_m, partial.to(dprobs_partials.dtype.element_ty), mask=mask_m)
    da = da.to(dx.dtype.element_ty)
    db = db.to(dx.dtype.element_ty)
    if ROW_AMAX:
        # Of dx as stored (masked lanes are 0); non-negative float32 maxima are
        # order-independent, so the atomics across column blocks are deterministic.
        amax = tl.maximum(tl.max(finite_abs(da.to(tl.float32)), 1), tl.max(finite_abs(db.to(tl.float32)), 1))
        tl.atomic_max(row_amax + offs_m, amax, mask=mask_m)
    if INTERLEAVED:
        tl.store(dx + offs_a, tl.join(da, db), mask=mask[:, :, None])
    else:
        tl.store(dx + offs_a, da, mask=mask)
        tl.store(dx + offs_b, db, mask=mask)


def gated_fwd(
    x2d: torch.Tensor,
    act: AnyActivation,
    *,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = gated(a, b) [* probs[:, None]]`` in ``x2d``'s dtype (module docstring).

    Args:
        x2d: [rows, 2F], contiguous; rows may be 0.
        act, clamped, limit, alpha: the gate (``_activations.gated``).
        interleaved: halves taken as even / odd columns instead of first / second half.
        probs: [rows] float32 or ``x2d``'s dtype, or None.
        out: [rows, F], written and returned; else allocated.
    """
    cfg = _configs()["fwd"]
    M, F = x2d.shape[0], x2d.shape[1] // 2
    y = out if out is not None else torch.empty(M, F, dtype=x2d.dtype, device=x2d.device)
    launch(gated_fwd_kernel, (cdiv(M, cfg.block_m), cdiv(F, cfg.block_f)),
        x2d, probs if probs is not None else x2d, y, M, F, x2d.stride(0), y.stride(0), limit, alpha,
        ACT=kernel_act(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_PROBS=probs is not None,
        BLOCK_M=cfg.block_m, BLOCK_F=cfg.block_f, num_warps=cfg.num_warps,
    )
    return y


def gated_bwd(
    x2d: torch.Tensor,
    dy2d: torch.Tensor,
    act: AnyActivation,
    *,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    row_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of ``gated_fwd``.

    Args:
        x2d: [rows, 2F] forward input; dy2d: [rows, F]; both contiguous.
        probs: the forward's [rows] scale, or None.
        out: [rows, 2F] for ``dx``, written and returned; else allocated.
        row_amax: float32 [rows], zeroed, or None: maxed with each row's ``max |dx|`` over its
            finite values (dx as stored), so a per-tensor quantize of ``dx`` needs no amax
            pass (``fuseops.quant.emit``).
    Returns:
        ``(dx, dprobs)``: ``dx`` like ``x2d``; ``dprobs`` [rows] in ``probs``' dtype
        (float32 sums, deterministic), or None without ``probs``.
    """
    cfg = _configs()["bwd"]
    M, F = dy2d.shape
    dx = out if out is not None else torch.empty_like(x2d)
    col_blocks = cdiv(F, cfg.block_f)
    partials = None
    if probs is not None:
        # A single column block has the whole row sum: it goes straight to the output.
        partial_dtype = probs.dtype if col_blocks == 1 else torch.float32
        partials = torch.empty(col_blocks, M, dtype=partial_dtype, device=x2d.device)
    launch(gated_bwd_kernel, (cdiv(M, cfg.block_m), col_blocks),
        x2d, dy2d, probs if probs is not None else x2d, dx, partials if partials is not None else dx,
        row_amax if row_amax is not None else dx, M, F, x2d.stride(0), dy2d.stride(0), limit, alpha,
        ACT=kernel_act(act), CLAMPED=clamped, INTERLEAVED=interleaved, HAS_PROBS=probs is not None,
        ROW_AMAX=row_amax is not None, BLOCK_M=cfg.block_m, BLOCK_F=cfg.block_f, num_warps=cfg.num_warps,
    )
    if partials is None:
        return dx, None
    return dx, (partials[0] if col_blocks == 1 else sum_partials(partials, probs.dtype))


def _halves(x2d: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if interleaved:
        return x2d[:, 0::2], x2d[:, 1::2]
    return x2d.chunk(2, dim=1)


def reference_gated_fwd(
    x2d: torch.Tensor,
    act: AnyActivation,
    *,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = act(a') * (b' + offset) * probs[:, None]`` in float32, cast to ``x2d``'s dtype.

    ``a, b`` are the halves (``x[:, :F], x[:, F:]``, or ``x[:, 0::2], x[:, 1::2]`` when
    interleaved); ``a' = min(a, limit)``, ``b' = clamp(b, -limit, limit)``, ``offset = 1``
    when clamped, else ``a' = a``, ``b' = b``, ``offset = 0``; no ``probs`` means 1.
    """
    a, b = _halves(x2d, interleaved)
    y = reference_gated(a, b, act, clamped, limit, alpha)
    if probs is not None:
        y = y * wide(probs)[:, None]
    return out.copy_(y) if out is not None else as_dtype(y, x2d.dtype)


def reference_gated_bwd(
    x2d: torch.Tensor,
    dy2d: torch.Tensor,
    act: AnyActivation,
    *,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    row_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(da, db)`` from ``_activations.gated_grad`` with upstream ``dy * probs[:, None]``
    (or ``dy``), placed back in ``x2d``'s layout; ``dprobs[r] = sum_f dy[r, f] * gated(a,
    b)[r, f]``. All in float32; ``dx`` cast to ``x2d``'s dtype (or into ``out``),
    ``dprobs`` to ``probs``' dtype, None without ``probs``; ``row_amax`` (given) maxed with
    each row's finite ``max |dx|`` of dx as returned.
    """
    a, b = _halves(x2d, interleaved)
    dy = wide(dy2d)
    dprobs = None
    if probs is not None:
        dprobs = as_dtype((dy * reference_gated(a, b, act, clamped, limit, alpha)).sum(1), probs.dtype)
        dy = dy * wide(probs)[:, None]
    da, db = reference_gated_grad(a, b, dy, act, clamped, limit, alpha)
    if interleaved:
        dx = torch.stack((da, db), dim=-1).reshape(x2d.shape)
    else:
        dx = torch.cat((da, db), dim=1)
    dx = out.copy_(dx) if out is not None else as_dtype(dx, x2d.dtype)
    if row_amax is not None and dx.numel():
        torch.maximum(row_amax, reference_finite_abs(dx).amax(1), out=row_amax)
    return dx, dprobs
