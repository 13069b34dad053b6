"""LayerNorm and RMSNorm forward whose output leaves the kernel quantized for the next GEMM.

The maths of elementwise/norm.py (same statistics, same ``y``) with quantization/epilogue.py's epilogue in place
of the plain store: ``x`` [rows, N] -> ``Emitted`` (the row-wise copy for FP8 blockwise and
MXFP8; ``y`` and per-row amaxes for FP8 current scaling and NVFP4) plus the float32 [rows]
statistics the norm's backward reads. The column-wise copy and the per-tensor formats' cast
are the cast kernel's (quantization/quantize.py), from ``y``.
Tiling: elementwise/norm.py's persistent grid over blocks of BLOCK_M rows; BLOCK_N is at least one
quantization block, so every output chunk holds whole blocks of its rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, device_sms, next_power_of_2
from fuseops.kernels.elementwise.norm import (
    _load,
    _scale,
    _shift,
    centered_one_block,
    forward_maxnreg,
    reference_layernorm_fwd,
    reference_rmsnorm_fwd,
    row_stats,
    scaled_one_block,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import BLOCK_SIZE, Element, Scaling


@dataclass(frozen=True)
class NormQuantizeConfig:
    block_m: int
    block_n: int
    num_warps: int
    # The whole row fits one BLOCK_N block (held in registers, read once).
    one_block: bool
    # A register cap for ptxas (0: its own choice): norm.py's ``forward_maxnreg``.
    maxnreg: int = 0


@functools.cache
def _configs() -> tuple[int, int, int]:
    """``(max_block_n, tile_elements, programs_per_sm)``: on GPU elementwise/norm.py's tiles (not timed
    with the epilogue yet), so that rows in registers stay in registers. Under the interpreter
    short blocks exercise the chunked path on test shapes, and tiles of several rows keep
    the number of interpreted steps down."""
    if INTERPRET:
        return 64, 1024, 1
    return 8192, 2048, 4


def _pick(rows: int, n: int, scaling: Scaling, rms: bool = False) -> NormQuantizeConfig:
    max_block_n, tile, _ = _configs()
    block_n = qe.tile_columns(scaling, min(next_power_of_2(n), max_block_n))
    block_m = max(1, min(tile // block_n, next_power_of_2(max(rows, 1))))
    num_warps = 1 if INTERPRET else min(32, max(4, block_m * block_n // 256))
    one_block = n <= block_n
    return NormQuantizeConfig(block_m, block_n, num_warps, one_block, forward_maxnreg(num_warps, one_block, rms))


@triton.jit
def norm_quantize_fwd_kernel(
    x, w, b, mean_ptr, rstd_ptr, y, data, scale, row_amax,
    M, N, stride_x, stride_y, stride_d, stride_s, eps, num_programs,
    IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr,
    SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr, STORE_Y: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    if ONE_BLOCK:
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
        shift = _shift(b, offs_n, mask_n, HAS_BIAS)
    for rb in range(tl.program_id(0), tl.cdiv(M, BLOCK_M), num_programs):
        offs_m = rb * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        if ONE_BLOCK:
            xc, mean, rstd, overflowed = centered_one_block(x, offs_m, offs_n, mask_m, mask_n, N, stride_x, eps,
                                                            IS_RMS, BLOCK_M)
            r = rstd
            # Before the store: a quantized block's scale and amax are written once.
            if tl.max(overflowed.to(tl.int32), 0) > 0:
                xc, mean, rstd, r = scaled_one_block(x, offs_m, offs_n, mask_m, mask_n, N, stride_x, eps, overflowed,
                                                     IS_RMS, BLOCK_M)
            qe.store_quantized(xc * r[:, None] * g[None, :] + shift[None, :], offs_m, mask_m, 0, N,
                               y, stride_y, data, stride_d, scale, stride_s, row_amax,
                               SCALING, ELEM, BLOCK, STORE_Y, BLOCK_M, BLOCK_N)
        else:
            mean, rstd = row_stats(x, offs_m, mask_m, N, stride_x, eps, IS_RMS, BLOCK_M, BLOCK_N)
            for n0 in range(0, N, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                mask_n = offs_n < N
                xc = _load(x, offs_m, offs_n, mask_m, mask_n, stride_x) - mean[:, None]
                g = _scale(w, offs_n, mask_n, ZERO_CENTERED)
                shift = _shift(b, offs_n, mask_n, HAS_BIAS)
                qe.store_quantized(xc * rstd[:, None] * g[None, :] + shift[None, :], offs_m, mask_m, n0, N,
                                   y, stride_y, data, stride_d, scale, stride_s, row_amax,
                                   SCALING, ELEM, BLOCK, STORE_Y, BLOCK_M, BLOCK_N)
        if not IS_RMS:
            tl.store(mean_ptr + offs_m, mean, mask=mask_m)
        tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


def _norm_quantize_fwd(x2d, weight, bias, eps, zero_centered_gamma, scaling, element, store_y, out, is_rms):
    M, N = x2d.shape
    cfg = _pick(M, N, scaling, is_rms)
    if out is None:
        out = qe.allocate(M, N, x2d.dtype, x2d.device, scaling=scaling, element=element, store_y=store_y)
    rstd = torch.empty(M, dtype=torch.float32, device=x2d.device)
    # RMSNorm stores no mean: rstd stands in for the unused pointer.
    mean = rstd if is_rms else torch.empty_like(rstd)
    programs = max(1, min(cdiv(M, cfg.block_m), _configs()[2] * device_sms(x2d)))
    launch(norm_quantize_fwd_kernel, (programs,),
        x2d, weight, bias if bias is not None else weight, mean, rstd,
        *qe.kernel_args(out, x2d.dtype, x2d.device),
        M, N, x2d.stride(0), *qe.strides(out), eps, programs,
        IS_RMS=is_rms, HAS_BIAS=bias is not None, ZERO_CENTERED=zero_centered_gamma,
        SCALING=int(scaling), ELEM=int(element), BLOCK=BLOCK_SIZE[scaling] or 1, STORE_Y=store_y,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ONE_BLOCK=cfg.one_block, num_warps=cfg.num_warps,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
    )
    return out, mean, rstd


def layernorm_quantize_fwd(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    zero_centered_gamma: bool = False,
    *,
    scaling: Scaling,
    element: Element,
    store_y: bool,
    out: qe.Emitted | None = None,
) -> tuple[qe.Emitted, torch.Tensor, torch.Tensor]:
    """LayerNorm of each row, quantized in the epilogue (see ``reference_layernorm_quantize_fwd``).

    Args:
        x2d: [rows, N], contiguous; rows may be 0. weight, bias: [N] (bias may be None).
        scaling, element: the next GEMM's input format.
        store_y: also write ``y`` [rows, N] (needed for TENSOR and NVFP4, and for a
            column-wise copy).
        out: buffers from ``quant_epilogue.allocate`` to write into, else allocated.
    Returns:
        ``(emitted, mean, rstd)``: quant_epilogue.Emitted; float32 [rows] statistics.
    """
    return _norm_quantize_fwd(x2d, weight, bias, eps, zero_centered_gamma, scaling, element, store_y, out, False)


def rmsnorm_quantize_fwd(
    x2d: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    zero_centered_gamma: bool = False,
    *,
    scaling: Scaling,
    element: Element,
    store_y: bool,
    out: qe.Emitted | None = None,
) -> tuple[qe.Emitted, torch.Tensor]:
    """RMSNorm of each row, quantized in the epilogue: ``(emitted, rstd)``; arguments as
    ``layernorm_quantize_fwd``."""
    out, _, rstd = _norm_quantize_fwd(x2d, weight, None, eps, zero_centered_gamma, scaling, element, store_y, out, True)
    return out, rstd


def reference_layernorm_quantize_fwd(
    x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
    zero_centered_gamma: bool = False, *, scaling: Scaling, element: Element, store_y: bool,
    out: qe.Emitted | None = None,
) -> tuple[qe.Emitted, torch.Tensor, torch.Tensor]:
    """``y, mean, rstd = reference_layernorm_fwd(...)`` (elementwise/norm.py has the maths), then
    ``quant_epilogue.reference_emit(y)``: the row-wise copy of ``quantize(y)`` or its row amaxes."""
    y, mean, rstd = reference_layernorm_fwd(x2d, weight, bias, eps, zero_centered_gamma)
    return qe.reference_emit(y, scaling=scaling, element=element, store_y=store_y, out=out), mean, rstd


def reference_rmsnorm_quantize_fwd(
    x2d: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False,
    *, scaling: Scaling, element: Element, store_y: bool, out: qe.Emitted | None = None,
) -> tuple[qe.Emitted, torch.Tensor]:
    """``y, rstd = reference_rmsnorm_fwd(...)``, then ``quant_epilogue.reference_emit(y)``."""
    y, rstd = reference_rmsnorm_fwd(x2d, weight, eps, zero_centered_gamma)
    return qe.reference_emit(y, scaling=scaling, element=element, store_y=store_y, out=out), rstd
