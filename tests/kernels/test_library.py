"""The ``fuseops::`` custom ops (kernels/library.py) pass ``torch.library.opcheck``: schema, fake
implementation (shapes and dtypes) and traced dispatch agree with the real kernels."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels import library
from fuseops.kernels.gemm.grouped import group_offsets


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_grouped_wgrad_op_in_each_output_dtype(out_dtype):
    """bf16 operands: dw in their dtype, or float32 (a float32 parameter under autocast)."""
    offsets = group_offsets(torch.tensor([3, 0, 5]))
    dy = torch.randn(8, 16, dtype=torch.bfloat16)
    x = torch.randn(8, 24, dtype=torch.bfloat16)
    torch.library.opcheck(library._wgrad_op, (dy, x, offsets, out_dtype))
    assert library._wgrad_op(dy, x, offsets, out_dtype).dtype == out_dtype
