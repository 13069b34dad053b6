"""Producers that emit quantized output: a norm or activation whose kernel ends in the quantize
epilogue (``fuseops/kernels/quantization/epilogue.py``) hands the next GEMM a storage equal, buffer
for buffer, to ``quantize(y, recipe, role=INPUT, ...)`` of its high-precision output ``y``.

What the producer pass writes, by the recipe's input format:

| recipe | producer pass | then |
| --- | --- | --- |
| ``FP8Blockwise`` (1x128), ``MXFP8`` (1x32) | row-wise data and scales: single pass | nothing |
| ``FP8CurrentScaling``, ``NVFP4`` | ``y`` and per-row amaxes | ``tensor_scales``, then the cast of ``y`` |

The per-tensor scale needs the whole tensor's amax before any element is cast, so those two
formats keep the cast kernel's pass over ``y``; only the amax pass is saved. When the weight
gradient needs the column-wise (transposed) copy, the producer also writes ``y`` and the cast
kernel makes that copy from it: one more write and read of ``y`` in the block formats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.quantization.epilogue import Emitted, blocks_in_epilogue
from fuseops.kernels.quantization.formats import tensor_qmax
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.quant.recipes import QuantFormat, Recipe, TensorRole
from fuseops.quant.storage import GroupedQuantizedTensor, QuantizedTensor

__all__ = ["EmitPlan", "emitted_storage"]


@dataclass(frozen=True)
class EmitPlan:
    """How a producer writes its output for a GEMM input under ``recipe``; ``columnwise``:
    whether the GEMM's weight gradient needs the column-wise copy too; ``role``: the GEMM
    input it is (``GRAD`` for an output gradient that a gated dgrad emits)."""

    recipe: Recipe
    columnwise: bool
    role: TensorRole = TensorRole.INPUT

    @property
    def format(self) -> QuantFormat:
        return self.recipe.format(self.role)

    @property
    def single_pass(self) -> bool:
        """The producer pass writes the whole storage (block formats, no column-wise copy)."""
        return blocks_in_epilogue(self.format.scaling) and not self.columnwise

    @property
    def kernel_args(self) -> dict[str, object]:
        """Keyword arguments of every producer launcher with the quantize epilogue."""
        return {"scaling": self.format.scaling, "element": self.format.element, "store_y": not self.single_pass}


def _tensor_amax(row_amax: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """float32 [G] (or [1]) amax per tensor from per-row amaxes, on device without a sync.

    The amax kernel over ``row_amax`` as a one-column tensor: the maximum of the non-negative
    row maxima of each group (0 for an empty one), which is the group's amax. Its atomics are
    one per program, where ``scatter_reduce_`` took one per row, all on G addresses (262144
    rows onto 128 at the Qwen3-30B-A3B shape).
    """
    tensors = 1 if offsets is None else offsets.shape[0] - 1
    rows = row_amax.reshape(1, -1, 1)
    return quantized_launcher(Kernel.AMAX, rows)(rows, offsets, tensors)


def emitted_storage(plan: EmitPlan, emitted: Emitted, *, dtype: torch.dtype,
                    offsets: torch.Tensor | None = None) -> QuantizedTensor:
    """The storage of ``y`` [M, C] from what its producer emitted under ``plan``.

    Args:
        plan: the format and copies.
        emitted: the producer launcher's output, launched with ``plan.kernel_args``.
        dtype: ``y``'s dtype (the storage's high-precision dtype).
        offsets: int [G + 1] row-group offsets on the device (grouped GEMM input), or None.
    Returns:
        What ``quantize(y, plan.recipe, role=plan.role, rowwise=True, columnwise=plan.columnwise,
        offsets=offsets)`` returns, bit for bit.
    """
    fmt = plan.format
    # y is written for every format but the single-pass ones, whose data has y's shape.
    shape = (emitted.y if emitted.y is not None else emitted.data).shape
    data, scale, data_t, scale_t, tensor_scale = emitted.data, emitted.scale, None, None, None
    if offsets is not None:
        offsets = offsets.to(torch.int64)
    if not plan.single_pass:
        y3 = emitted.y[None]
        encode = None
        if emitted.row_amax is not None:
            scales = quantized_launcher(Kernel.TENSOR_SCALES, y3)
            encode, tensor_scale = scales(_tensor_amax(emitted.row_amax, offsets), tensor_qmax(fmt.scaling, fmt.element))
        # The block formats' row-wise copy is already written; the cast adds what is missing.
        rowwise = emitted.data is None
        bufs = quantized_launcher(Kernel.QUANTIZE, y3)(
            y3, offsets, encode, scaling=fmt.scaling, element=fmt.element, block_2d=False,
            rowwise=rowwise, columnwise=plan.columnwise)
        if rowwise:
            data, scale = bufs.data[0], None if bufs.scale is None else bufs.scale[0]
        if plan.columnwise:
            data_t, scale_t = bufs.data_t[0], None if bufs.scale_t is None else bufs.scale_t[0]
    common = {"format": fmt, "shape": shape, "dtype": dtype, "tensor_scale": tensor_scale,
              "data": data, "scale": scale, "data_t": data_t, "scale_t": scale_t}
    if offsets is not None:
        return GroupedQuantizedTensor(**common, offsets=offsets)
    return QuantizedTensor(**common)
