"""Activations (plain and gated) whose output leaves the kernel quantized for the next GEMM.

The maths of elementwise/activation.py and elementwise/gated_activation.py (same ``y``) with quantization/epilogue.py's
epilogue in place of the plain store. Plain: ``x`` [rows, F] -> ``y`` [rows, F]; gated:
``x`` [rows, 2F] -> ``y`` [rows, F] (halves or interleaved pairs, optional ``probs`` row
scale). Either returns an ``Emitted``: the row-wise copy for FP8 blockwise and MXFP8; ``y``
and per-row amaxes for FP8 current scaling and NVFP4.
Tiling: one program per [BLOCK_M, BLOCK_F] tile of ``y``; BLOCK_F holds whole quantization
blocks, so each tile quantizes its rows' blocks in registers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv
from fuseops.kernels.elementwise.activation import reference_activation_fwd
from fuseops.kernels.elementwise.activation_math import AnyActivation, activation, gated, kernel_act
from fuseops.kernels.elementwise.gated_activation import _load_pair, _pair_offsets, reference_gated_fwd
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import BLOCK_SIZE, Element, Scaling


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_f: int
    num_warps: int


@functools.cache
def _configs() -> TileConfig:
    """Output tiles before widening to a whole block. On GPU elementwise/gated_activation.py's forward
    tile (8 outputs per thread), not timed with the epilogue yet; under the interpreter
    small tiles give several programs on test shapes."""
    if INTERPRET:
        return TileConfig(block_m=16, block_f=64, num_warps=1)
    return TileConfig(block_m=8, block_f=256, num_warps=8)


@triton.jit
def activation_quantize_fwd_kernel(
    x, probs, y, data, scale, row_amax, M, F, stride_x, stride_y, stride_d, stride_s, limit, alpha,
    ACT: tl.constexpr, GATED: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_PROBS: tl.constexpr, SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr,
    STORE_Y: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):
    col0 = tl.program_id(1) * BLOCK_F
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = col0 + tl.arange(0, BLOCK_F)
    mask_m = offs_m < M
    mask = mask_m[:, None] & (offs_f < F)[None, :]
    if GATED:
        offs_a, offs_b = _pair_offsets(offs_m, offs_f, stride_x, F, INTERLEAVED)
        a, b = _load_pair(x, offs_a, offs_b, mask, INTERLEAVED)
        out = gated(a, b, ACT, CLAMPED, limit, alpha)
        if HAS_PROBS:
            out *= tl.load(probs + offs_m, mask=mask_m, other=0.0).to(tl.float32)[:, None]
    else:
        ptrs = x + offs_m[:, None].to(tl.int64) * stride_x + offs_f[None, :]
        # [BLOCK_M, BLOCK_F]
        xt = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        out = activation(xt, ACT, alpha)
    qe.store_quantized(out, offs_m, mask_m, col0, F, y, stride_y, data, stride_d, scale, stride_s, row_amax,
                       SCALING, ELEM, BLOCK, STORE_Y, BLOCK_M, BLOCK_F)


def _launch(x2d, F, act, alpha, probs, scaling, element, store_y, out, *, gated, interleaved=False,
            clamped=False, limit=0.0):
    M = x2d.shape[0]
    cfg = _configs()
    block_f = qe.tile_columns(scaling, cfg.block_f)
    if out is None:
        out = qe.allocate(M, F, x2d.dtype, x2d.device, scaling=scaling, element=element, store_y=store_y)
    launch(activation_quantize_fwd_kernel, (cdiv(M, cfg.block_m), cdiv(F, block_f)),
        x2d, probs if probs is not None else x2d, *qe.kernel_args(out, x2d.dtype, x2d.device),
        M, F, x2d.stride(0), *qe.strides(out), limit, alpha,
        ACT=kernel_act(act), GATED=gated, CLAMPED=clamped, INTERLEAVED=interleaved, HAS_PROBS=probs is not None,
        SCALING=int(scaling), ELEM=int(element), BLOCK=BLOCK_SIZE[scaling] or 1, STORE_Y=store_y,
        BLOCK_M=cfg.block_m, BLOCK_F=block_f, num_warps=cfg.num_warps,
    )
    return out


def activation_quantize_fwd(
    x2d: torch.Tensor, act: AnyActivation, alpha: float = 1.0, *, scaling: Scaling, element: Element, store_y: bool,
    out: qe.Emitted | None = None,
) -> qe.Emitted:
    """``y = act(x)``, quantized in the epilogue (see ``reference_activation_quantize_fwd``).

    Args:
        x2d: [rows, F], contiguous; rows may be 0.
        act, alpha: the function (``alpha``: SiLU's sigmoid slope).
        scaling, element: the next GEMM's input format.
        store_y: also write ``y`` [rows, F] (needed for TENSOR and NVFP4, and for a
            column-wise copy).
        out: buffers from ``quant_epilogue.allocate`` to write into, else allocated.
    """
    return _launch(x2d, x2d.shape[1], act, alpha, None, scaling, element, store_y, out, gated=False)


def gated_quantize_fwd(
    x2d: torch.Tensor,
    act: AnyActivation,
    *,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    scaling: Scaling,
    element: Element,
    store_y: bool,
    out: qe.Emitted | None = None,
) -> qe.Emitted:
    """``y = gated(a, b) [* probs[:, None]]``, quantized in the epilogue.

    Args:
        x2d: [rows, 2F], contiguous; rows may be 0.
        act, interleaved, clamped, limit, alpha, probs: as ``gated_activation.gated_fwd``.
        scaling, element, store_y, out: as ``activation_quantize_fwd``.
    """
    return _launch(x2d, x2d.shape[1] // 2, act, alpha, probs, scaling, element, store_y, out, gated=True,
                   interleaved=interleaved, clamped=clamped, limit=limit)


def reference_activation_quantize_fwd(
    x2d: torch.Tensor, act: AnyActivation, alpha: float = 1.0, *, scaling: Scaling, element: Element, store_y: bool,
    out: qe.Emitted | None = None,
) -> qe.Emitted:
    """``quant_epilogue.reference_emit(reference_activation_fwd(x2d, act, alpha))``: the
    row-wise copy of ``quantize(y)``, or its row amaxes (elementwise/activation.py has the maths)."""
    y = reference_activation_fwd(x2d, act, alpha)
    return qe.reference_emit(y, scaling=scaling, element=element, store_y=store_y, out=out)


def reference_gated_quantize_fwd(
    x2d: torch.Tensor,
    act: AnyActivation,
    *,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    scaling: Scaling,
    element: Element,
    store_y: bool,
    out: qe.Emitted | None = None,
) -> qe.Emitted:
    """``quant_epilogue.reference_emit(reference_gated_fwd(x2d, ...))`` (elementwise/gated_activation.py
    has the maths)."""
    y = reference_gated_fwd(x2d, act, interleaved=interleaved, clamped=clamped, limit=limit, alpha=alpha, probs=probs)
    return qe.reference_emit(y, scaling=scaling, element=element, store_y=store_y, out=out)
