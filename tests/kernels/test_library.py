"""The ``fuseops::`` custom ops (kernels/library.py) pass ``torch.library.opcheck``: schema, fake
implementation (shapes and dtypes) and traced dispatch agree with the real kernels."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels import library
from fuseops.kernels.gemm.grouped import group_offsets


@pytest.mark.parametrize("gathered", ["none", "x", "x and dy"], ids=["rows", "gathered-x", "gathered-x-and-dy"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_grouped_wgrad_op_in_each_output_dtype(out_dtype, gathered):
    """bf16 operands: dw in their dtype, or float32 (a float32 parameter under autocast); the
    rows as they are, or gathered through an index (the MoE layer's lean mode: x's, and dy's)."""
    offsets = group_offsets(torch.tensor([3, 0, 5]))
    dy = torch.randn(6 if gathered == "x and dy" else 8, 16, dtype=torch.bfloat16)
    x = torch.randn(8 if gathered == "none" else 5, 24, dtype=torch.bfloat16)
    x_rows = torch.tensor([4, 0, 0, 2, 1, 3, 3, 2]) if gathered != "none" else None
    dy_rows = torch.tensor([5, 1, 0, 0, 3, 2, 4, 5]) if gathered == "x and dy" else None
    torch.library.opcheck(library._wgrad_op, (dy, x, offsets, out_dtype, x_rows, dy_rows))
    dw = library._wgrad_op(dy, x, offsets, out_dtype, x_rows, dy_rows)
    assert dw.dtype == out_dtype
    rows = x[x_rows] if x_rows is not None else x
    dy = dy[dy_rows] if dy_rows is not None else dy
    want = torch.stack([dy[r].double().T @ rows[r].double() for r in (slice(0, 3), slice(3, 3), slice(3, 8))])
    torch.testing.assert_close(dw.double(), want, rtol=1e-2 if out_dtype == torch.bfloat16 else 1e-5, atol=1e-2)
