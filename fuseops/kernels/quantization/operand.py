"""``Operand``: a GEMM operand quantized along K (data, block scales, outer factors), as the
scaled GEMM kernels (gemm/dense_scaled.py, gemm/grouped_scaled*.py, hopper/blockwise*.py)
read it."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Operand:
    """A GEMM operand quantized along K.

    ``data``: [R, K] float8, or [R, ceil(K / 2)] uint8 E2M1 pairs (NVFP4); grouped kernels take
    a leading group dim for the weight. ``scale``: block scales along K: BLOCK float32
    [R / rows_per_scale, cdiv(K, 128)], MX E8M0 [R, cdiv(K, 32)], NVFP4 E4M3 [R, cdiv(K, 16)];
    None for TENSOR. ``outer``: float32 factors applied to the result: [1] per tensor, [G] per
    group, or per row ([R], grouped weight [G, R]) with ``outer_per_row``; None for none.
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None
    outer: torch.Tensor | None = None
    rows_per_scale: int = 1
    outer_per_row: bool = False

    def kernel_scale(self) -> torch.Tensor | None:
        """The block scales as the kernels read them (E8M0 as its uint8 codes)."""
        if self.scale is not None and self.scale.dtype == torch.float8_e8m0fnu:
            return self.scale.view(torch.uint8)
        return self.scale

    def outer_strides(self) -> tuple[int, int]:
        """(stride per group, stride per row) of ``outer``."""
        if self.outer is None:
            return 0, 0
        if self.outer_per_row:
            return (self.outer.stride(0), 1) if self.outer.dim() == 2 else (0, 1)
        return (1 if self.outer.numel() > 1 else 0), 0
