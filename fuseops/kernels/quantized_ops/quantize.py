"""The per-tensor amax, each row's amax, the tensor scales and the quantize cast (quantization/amax.py,
quantization/quantize.py) as ``fuseops::`` custom ops; each wrapper has its launcher's signature."""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.quantize import Buffers, allocate, written
from fuseops.kernels.quantized_ops._args import filled, into, kept, owned


@fuseops_op("amax(Tensor x, Tensor? offsets, int num_groups, Tensor? rows) -> Tensor")
def _amax_op(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int,
             rows: torch.Tensor | None) -> torch.Tensor:
    return launcher(Kernel.AMAX, x)(x, offsets, num_groups, rows=rows)


@torch.library.register_fake("fuseops::amax")
def _(x, offsets, num_groups, rows):
    return x.new_empty(num_groups, dtype=torch.float32)


def amax(x: torch.Tensor, offsets: torch.Tensor | None, num_groups: int, *,
         rows: torch.Tensor | None = None) -> torch.Tensor:
    """``amax.amax`` (or its reference) through ``fuseops::amax``."""
    return _amax_op(x, offsets, num_groups, rows)


@fuseops_op("row_amax(Tensor x) -> Tensor")
def _row_amax_op(x: torch.Tensor) -> torch.Tensor:
    return launcher(Kernel.ROW_AMAX, x)(x)


@torch.library.register_fake("fuseops::row_amax")
def _(x):
    return x.new_empty(x.shape[0], dtype=torch.float32)


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """``amax.row_amax`` (or its reference) through ``fuseops::row_amax``."""
    return _row_amax_op(x)


@fuseops_op("tensor_scales(Tensor amax, float qmax) -> (Tensor, Tensor)")
def _tensor_scales_op(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    return owned(launcher(Kernel.TENSOR_SCALES, amax)(amax, qmax), (amax,))


@torch.library.register_fake("fuseops::tensor_scales")
def _(amax, qmax):
    return amax.new_empty(amax.shape, dtype=torch.float32), amax.new_empty(amax.shape, dtype=torch.float32)


def tensor_scales(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``amax.tensor_scales`` (or its reference) through ``fuseops::tensor_scales``."""
    return _tensor_scales_op(amax, float(qmax))


@fuseops_op("quantize(Tensor x, Tensor? offsets, Tensor? encode, int scaling, int element, bool block_2d, "
            "bool rowwise, bool columnwise, Tensor? rows) -> (Tensor, Tensor, Tensor, Tensor)")
def _quantize_op(x: torch.Tensor, offsets: torch.Tensor | None, encode: torch.Tensor | None, scaling: int,
                 element: int, block_2d: bool, rowwise: bool, columnwise: bool,
                 rows: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    bufs = launcher(Kernel.QUANTIZE, x)(x, offsets, encode, scaling=Scaling(scaling), element=Element(element),
                                        block_2d=block_2d, rowwise=rowwise, columnwise=columnwise, rows=rows)
    return filled(bufs, x)


@torch.library.register_fake("fuseops::quantize")
def _(x, offsets, encode, scaling, element, block_2d, rowwise, columnwise, rows):
    groups = offsets.shape[0] - 1 if offsets is not None else None
    shape = tuple(x.shape) if rows is None else (x.shape[0], rows.shape[0], x.shape[2])
    bufs = allocate(shape, groups, scaling=Scaling(scaling), element=Element(element), block_2d=block_2d,
                    rowwise=rowwise, columnwise=columnwise, device=x.device)
    return filled(bufs, x)


def quantize(x: torch.Tensor, offsets: torch.Tensor | None, encode: torch.Tensor | None, *, scaling: Scaling,
             element: Element, block_2d: bool = False, rowwise: bool = True, columnwise: bool = False,
             out: Buffers | None = None, rows: torch.Tensor | None = None) -> Buffers:
    """``quantize.quantize`` (or its reference) through ``fuseops::quantize``."""
    bufs = _quantize_op(x, offsets, encode, int(scaling), int(element), block_2d, rowwise, columnwise, rows)
    return Buffers(*into(out, kept(bufs, written(scaling, block_2d, rowwise, columnwise))))
