"""The linear GEMMs on storages (fuseops.quant.gemm): shapes, grouped dispatch, errors, and
the kernel path against the reference path."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.quant import linear_dgrad, linear_forward, linear_wgrad, quantize, recipes
from tests.helpers import rel_err, sqnr_db

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]


def linear(recipe, x, w, dy, offsets=None, main_grad=None):
    xq = quantize(x, recipe, columnwise=True, offsets=offsets)
    wq = quantize(w, recipe, role="weight", columnwise=True)
    dyq = quantize(dy, recipe, role="grad", columnwise=True, offsets=offsets)
    return linear_forward(xq, wq), linear_dgrad(dyq, wq), linear_wgrad(dyq, xq, main_grad=main_grad)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.kind.value)
def test_dense_shapes_and_dtypes(recipe):
    x = torch.randn(2, 9, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(48, 64, device=DEVICE, dtype=torch.bfloat16)
    dy = torch.randn(2, 9, 48, device=DEVICE, dtype=torch.bfloat16)
    y, dx, dw = linear(recipe, x, w, dy)
    assert (y.shape, dx.shape, dw.shape) == ((2, 9, 48), (2, 9, 64), (48, 64))
    assert y.dtype == dx.dtype == dw.dtype == torch.bfloat16
    bias = torch.randn(48, device=DEVICE)
    yb = linear_forward(quantize(x, recipe), quantize(w, recipe, role="weight"), bias=bias, out_dtype=torch.float32)
    assert yb.dtype == torch.float32 and rel_err(yb - bias, y) < 1e-2


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.kind.value)
def test_kernel_path_matches_reference_path(recipe):
    if DEVICE == "cuda":
        pytest.skip("the reference path is the CPU path")
    sizes = [7, 0, 60, 1]
    offsets = group_offsets(torch.tensor(sizes))
    x, dy = torch.randn(68, 64), torch.randn(68, 32)
    w = torch.randn(4, 32, 64)
    reference = linear(recipe, x, w, dy, offsets)
    with interpreted_kernels():
        kernel = linear(recipe, x, w, dy, offsets)
    for name, k, r in zip(("y", "dx", "dw"), kernel, reference):
        assert rel_err(k, r) < 1e-5, name


def test_grouped_matches_per_group_dense():
    recipe = recipes.FP8CurrentScaling()
    sizes = [20, 0, 45]
    offsets = group_offsets(torch.tensor(sizes, device=DEVICE))
    x, dy = torch.randn(65, 64, device=DEVICE), torch.randn(65, 32, device=DEVICE)
    w = torch.randn(3, 32, 64, device=DEVICE)
    main_grad = torch.zeros(3, 32, 64, device=DEVICE)
    y, dx, dw = linear(recipe, x, w, dy, offsets, main_grad=main_grad)
    assert dw is main_grad and (dw[1] == 0).all()
    for g, (s, t) in enumerate([(0, 20), (65, 65), (20, 65)]):
        if s == t:
            continue
        yg, dxg, dwg = linear(recipe, x[s:t], w[g], dy[s:t])
        # Same quantized values; only the accumulation order (and on Hopper the FP8 tensor
        # cores' ~14-bit accumulation) differs.
        assert rel_err(y[s:t], yg) < 1e-3 and rel_err(dx[s:t], dxg) < 1e-3 and rel_err(dw[g], dwg) < 1e-3
    assert sqnr_db(y, torch.cat([x[:20] @ w[0].T, x[20:] @ w[2].T])) > 27


def test_errors():
    recipe = recipes.MXFP8()
    x, w = torch.randn(8, 64, device=DEVICE), torch.randn(16, 64, device=DEVICE)
    xq, wq = quantize(x, recipe), quantize(w, recipe, role="weight")
    with pytest.raises(ValueError, match="weight: the input-gradient GEMM needs the column-wise copy"):
        linear_dgrad(quantize(torch.randn(8, 16, device=DEVICE), recipe, role="grad"), wq)
    with pytest.raises(ValueError, match="x: the weight-gradient GEMM needs the column-wise copy"):
        linear_wgrad(quantize(torch.randn(8, 16, device=DEVICE), recipe, role="grad", columnwise=True), xq)
    with pytest.raises(ValueError, match="x, weight: expected one recipe's formats, got MX and NVFP4"):
        linear_forward(xq, quantize(w, recipes.NVFP4(), role="weight"))
    offsets = group_offsets(torch.tensor([8], device=DEVICE))
    with pytest.raises(ValueError, match="a grouped input goes with stacked weights"):
        linear_forward(quantize(x, recipe, offsets=offsets), wq)
