"""The quantize epilogue of producer kernels (norms, activations): their output leaves the
kernel already in the row-wise format of the next GEMM's input, instead of as a
high-precision tensor that a separate quantize pass reads again.

A producer computes a float32 tile ``v`` [ROWS, COLS] of its output ``y`` [M, C] and calls
``store_quantized``, which rounds ``v`` to ``y``'s dtype first (so the result is exactly
``quantize(y)``, quantization/formats.py) and then, by format:

- ``Scaling.BLOCK`` (1x128) and ``Scaling.MX`` (1x32): one row holds whole blocks, so the tile
  is quantized in registers (``quantize_tiles.quantize_blocks``) and ``data`` [M, C] float8 with
  ``scale`` [M, cdiv(C, blk)] are written here: the row-wise copy costs no extra pass.
- ``Scaling.TENSOR`` and ``Scaling.NVFP4``: the scale needs the whole tensor's amax, known
  only after every program ran; the tile's ``row_amax`` [M] (``max |y|`` over each row's
  finite values, float32,
  atomically maxed across column tiles) is written, and ``y`` itself, for the cast kernel
  to read after ``tensor_scales``. That saves the amax pass over ``y``, not the cast's.

``y`` is written when the caller asks (``store_y``): always for TENSOR and NVFP4, and for the
block formats only when the column-wise copy is needed (the cast kernel makes it from ``y``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import cdiv
from fuseops.kernels.quantization.finite import dtype_max, finite_abs, reference_finite_abs
from fuseops.kernels.quantization.formats import BLOCK_SIZE, STORAGE_DTYPE, Element, Scaling
from fuseops.kernels.quantization.quantize import reference_quantize
from fuseops.kernels.quantization.tiles import quantize_blocks


class Emitted(NamedTuple):
    """What a producer with a quantize epilogue writes; None where not written."""

    # [M, C] in the producer's dtype (store_y).
    y: torch.Tensor | None
    # BLOCK / MX: [M, C] float8 and [M, cdiv(C, blk)] float32 (BLOCK) or E8M0 (MX) scales.
    data: torch.Tensor | None
    scale: torch.Tensor | None
    # TENSOR / NVFP4: float32 [M], max |y| of each row.
    row_amax: torch.Tensor | None


def blocks_in_epilogue(scaling: Scaling) -> bool:
    """Whether the epilogue writes the row-wise copy itself (one row holds whole blocks)."""
    return scaling in (Scaling.BLOCK, Scaling.MX)


def tile_columns(scaling: Scaling, width: int) -> int:
    """A producer's column tile: ``width`` (a power of two), at least one whole block."""
    return max(width, BLOCK_SIZE[scaling])


def allocate(rows: int, cols: int, dtype: torch.dtype, device: torch.device, *, scaling: Scaling,
             element: Element, store_y: bool) -> Emitted:
    """Uninitialised outputs of a producer of ``y`` [rows, cols] (``row_amax`` zeroed: the
    kernel maxes into it); a launcher's ``out``."""
    y = torch.empty(rows, cols, dtype=dtype, device=device) if store_y else None
    data = scale = row_amax = None
    if blocks_in_epilogue(scaling):
        data = torch.empty(rows, cols, dtype=STORAGE_DTYPE[element], device=device)
        scale_dtype = torch.float32 if scaling == Scaling.BLOCK else torch.float8_e8m0fnu
        scale = torch.empty(rows, cdiv(cols, BLOCK_SIZE[scaling]), dtype=scale_dtype, device=device)
    else:
        row_amax = torch.zeros(rows, dtype=torch.float32, device=device)
    return Emitted(y, data, scale, row_amax)


def kernel_args(out: Emitted, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(y, data, scale, row_amax) pointers for a kernel: a 0-element tensor of ``dtype``
    stands in for an unwritten ``y`` (the epilogue reads the output dtype from it), E8M0
    scales go as their uint8 codes, and ``y`` stands in for the rest."""
    y = out.y if out.y is not None else torch.empty(0, dtype=dtype, device=device)
    data = out.data if out.data is not None else y
    scale = out.scale if out.scale is not None else y
    if scale.dtype == torch.float8_e8m0fnu:
        scale = scale.view(torch.uint8)
    return y, data, scale, out.row_amax if out.row_amax is not None else y


def strides(out: Emitted) -> tuple[int, int, int]:
    """Row strides of y, data and scale (0 for those not written)."""
    return tuple(0 if t is None else t.stride(0) for t in (out.y, out.data, out.scale))


@triton.jit
def store_quantized(v, offs_m, mask_m, col0, C, y, stride_y, data, stride_d, scale, stride_s, row_amax,
                    SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr, STORE_Y: tl.constexpr,
                    ROWS: tl.constexpr, COLS: tl.constexpr):
    """Write float32 tile ``v`` [ROWS, COLS] of ``y`` at rows ``offs_m``, columns col0.. (module
    docstring). COLS is a multiple of BLOCK for the block formats."""
    cols = col0 + tl.arange(0, COLS)
    mask = mask_m[:, None] & (cols < C)[None, :]
    rows = offs_m[:, None].to(tl.int64)
    rounded = v.to(y.dtype.element_ty)
    if STORE_Y:
        tl.store(y + rows * stride_y + cols[None, :], rounded, mask=mask)
    # Zeros outside the tensor: partial blocks are padded with zeros, as the cast kernel's.
    vf = tl.where(mask, rounded.to(tl.float32), 0.0)
    if SCALING == 1 or SCALING == 2:
        q, s = quantize_blocks(vf, 1.0, dtype_max(y), SCALING, ELEM, BLOCK, ROWS, COLS)
        tl.store(data + rows * stride_d + cols[None, :], q, mask=mask)
        offs_s = col0 // BLOCK + tl.arange(0, COLS // BLOCK)
        mask_s = mask_m[:, None] & (offs_s < tl.cdiv(C, BLOCK))[None, :]
        tl.store(scale + rows * stride_s + offs_s[None, :], s, mask=mask_s)
    else:
        # Non-negative float32 maxima are order-independent: deterministic across tiles.
        tl.atomic_max(row_amax + offs_m, tl.max(finite_abs(vf), 1), mask=mask_m)


def reference_emit(y: torch.Tensor, *, scaling: Scaling, element: Element, store_y: bool,
                   out: Emitted | None = None) -> Emitted:
    """What ``store_quantized`` writes for the whole ``y`` [M, C]: the row-wise copy of
    ``reference_quantize`` (BLOCK, MX), or ``row_amax = max |y.float()|`` per row (TENSOR,
    NVFP4); ``y`` itself when ``store_y``. Copied into ``out`` when given."""
    data = scale = row_amax = None
    if blocks_in_epilogue(scaling):
        bufs = reference_quantize(y[None], None, None, scaling=scaling, element=element, rowwise=True)
        data, scale = bufs.data[0], bufs.scale[0]
    else:
        row_amax = reference_finite_abs(y).amax(1)
    emitted = Emitted(y if store_y else None, data, scale, row_amax)
    if out is None:
        return emitted
    for buf, value in zip(out, emitted):
        if buf is not None:
            buf.copy_(value)
    return out
