"""Quantized tensors: plain objects holding the buffers of one quantized tensor.

Not Tensor subclasses: the fuser flattens a storage into its buffers (``data_tensors()``) to
save them for backward, and rebuilds it with ``with_data_tensors(buffers)``. A storage keeps
its high-precision ``shape`` and ``dtype`` and one or both copies:

- row-wise: ``data`` with blocks along the last dim and its ``scale``;
- column-wise: ``data_t``, the quantized transpose (blocks along rows, what dgrad and wgrad
  reduce over), and ``scale_t``;
- ``tensor_scale``: float32 per-tensor dequantization scales (FP8 current scaling, NVFP4).

Layouts (E2M1 data packs two values per byte along its last dim; "nb" is blocks per row):

| kind | data / scale | data_t / scale_t | tensor_scale |
| --- | --- | --- | --- |
| ``QuantizedTensor`` [..., C] (R rows) | [..., C] / [..., nb] (128x128: [R/128, C/128]) | [C, R] / [C, nb] (128x128: [C/128, R/128]) | [1] |
| stacked (``stacked=True``) [G, N, K] | [G, N, K] / [G, N, nb] or [G, N/128, K/128] | [G, K, N] / [G, K, nb] or [G, K/128, N/128] | [G] |
| ``GroupedQuantizedTensor`` [M, C] + offsets | [M, C] / [M, nb] | [C, P] / [C, P / blk], padded grouped layout | [G] |

The padded grouped layout and the formats are in ``fuseops/kernels/quantization/formats.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.quantization.formats import reference_dequantize
from fuseops.kernels.quantization.grouped_layout import group_positions
from fuseops.kernels.quantization.operand import Operand
from fuseops.quant.recipes import QuantFormat

__all__ = ["GroupedQuantizedTensor", "QuantizedTensor"]

_BUFFERS = ("data", "scale", "data_t", "scale_t", "tensor_scale")


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantized tensor of high-precision ``shape`` and ``dtype`` (module docstring).

    ``stacked``: the leading dim indexes independent tensors (the G weights of a grouped
    linear), each with its own tensor scale, blocks and transpose.
    """

    format: QuantFormat
    shape: torch.Size
    dtype: torch.dtype
    data: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    data_t: torch.Tensor | None = None
    scale_t: torch.Tensor | None = None
    tensor_scale: torch.Tensor | None = None
    stacked: bool = False

    _buffer_names = _BUFFERS

    @property
    def device(self) -> torch.device:
        return (self.data if self.data is not None else self.data_t).device

    @property
    def has_rowwise(self) -> bool:
        return self.data is not None

    @property
    def has_columnwise(self) -> bool:
        return self.data_t is not None

    @property
    def rows_per_scale(self) -> int:
        return 128 if self.format.block_2d else 1

    def data_tensors(self) -> tuple[torch.Tensor, ...]:
        """The plain buffers held, in a fixed order (those absent are skipped)."""
        return tuple(t for t in (getattr(self, n) for n in self._buffer_names) if t is not None)

    def with_data_tensors(self, buffers: Sequence[torch.Tensor]) -> QuantizedTensor:
        """The same storage over ``buffers`` (as ``data_tensors()`` returned them, e.g. after
        saving for backward or a round trip through host memory)."""
        present = [n for n in self._buffer_names if getattr(self, n) is not None]
        if len(buffers) != len(present):
            raise ValueError(f"buffers: expected {len(present)} tensors ({', '.join(present)}), got {len(buffers)}")
        return dataclasses.replace(self, **dict(zip(present, buffers)))

    def keep(self, *, rowwise: bool, columnwise: bool) -> QuantizedTensor:
        """This storage without the copies not asked for (e.g. only the column-wise copy of
        an input saved for the weight gradient)."""
        if (rowwise and not self.has_rowwise) or (columnwise and not self.has_columnwise):
            raise ValueError(
                f"keep: asked rowwise={rowwise}, columnwise={columnwise}, but the storage holds "
                f"rowwise={self.has_rowwise}, columnwise={self.has_columnwise}"
            )
        drop = {}
        if not rowwise:
            drop.update(data=None, scale=None)
        if not columnwise:
            drop.update(data_t=None, scale_t=None)
        return dataclasses.replace(self, **drop)

    def _operand(self, data: torch.Tensor, scale: torch.Tensor | None) -> Operand:
        return Operand(data, scale, self.tensor_scale, self.rows_per_scale)

    def rowwise_operand(self) -> Operand:
        """The row-wise copy as a GEMM operand, rows [R, C] (stacked: [G, N, K])."""
        if not self.stacked:
            # Explicit row counts: a tensor of 0 columns cannot infer a -1 dim.
            rows = self.data.reshape(self.data.shape[:-1].numel(), self.data.shape[-1])
            scale = self.scale
            if scale is not None and not self.format.block_2d:
                scale = scale.reshape(scale.shape[:-1].numel(), scale.shape[-1])
            return self._operand(rows, scale)
        return self._operand(self.data, self.scale)

    def columnwise_operand(self) -> Operand:
        """The column-wise copy as a GEMM operand, rows [C, R] (stacked: [G, K, N])."""
        return self._operand(self.data_t, self.scale_t)

    def _values(self, data: torch.Tensor, scale: torch.Tensor | None, length: int) -> torch.Tensor:
        """float32 elements x block scales of rows ``data`` [..., L], cut to ``length`` columns."""
        return reference_dequantize(data, scale, self.format.scaling, self.rows_per_scale)[..., :length]

    def _tensor_scale(self, v: torch.Tensor) -> torch.Tensor:
        if self.tensor_scale is None:
            return v
        return v * (self.tensor_scale.view(-1, 1, 1) if self.stacked else self.tensor_scale)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The high-precision tensor this stands for (from the row-wise copy when held), in
        ``dtype`` (default: the tensor's own). Plain torch ops, no host sync."""
        dtype = dtype or self.dtype
        C = self.shape[-1]
        if self.has_rowwise:
            rows = self.rowwise_operand()
            v = self._values(rows.data, rows.scale, C)
        else:
            R = self.shape[-2] if self.stacked else self.shape.numel() // max(C, 1)
            v = self._values(self.data_t, self.scale_t, R).transpose(-1, -2)
        return as_dtype(self._tensor_scale(v).reshape(self.shape), dtype)


@dataclass(frozen=True, eq=False)
class GroupedQuantizedTensor(QuantizedTensor):
    """A quantized [M, C] tensor whose rows are grouped by ``offsets`` (int64 [G + 1], on the
    device); each group has its own tensor scale, and the column-wise copy uses the padded
    grouped layout (module docstring)."""

    offsets: torch.Tensor | None = None

    _buffer_names = _BUFFERS + ("offsets",)

    @property
    def num_groups(self) -> int:
        return self.offsets.shape[0] - 1

    def _row_tensor_scale(self) -> torch.Tensor:
        rows = torch.arange(self.shape[0], device=self.offsets.device)
        return self.tensor_scale[torch.searchsorted(self.offsets[1:], rows, right=True)]

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        M, C = self.shape
        if self.has_rowwise:
            v = self._values(self.data, self.scale, C)
        else:
            padded = reference_dequantize(self.data_t, self.scale_t, self.format.scaling)
            v = padded[:, group_positions(self.offsets, M)].T
        if self.tensor_scale is not None:
            v = v * self._row_tensor_scale()[:, None]
        return as_dtype(v, dtype)
