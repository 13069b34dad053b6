"""A Linear under a recipe given a non-finite input: the other rows are untouched (scales come
from finite values only) and the non-finite row stays non-finite, as without a recipe."""

import contextlib

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes

RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]


def _run(recipe, path, device):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(64, 32)).to(device)
    x = torch.randn(6, 64, device=device)
    # Not the row's maximum: the finite amax of the tensor is the clean run's.
    col = int(x[2].abs().argmin())
    x_inf = x.clone()
    x_inf[2, col] = float("inf")
    # On CUDA the kernels run anyway; on CPU "kernels" runs them through the interpreter.
    interpreted = path == "kernels" and device == "cpu"
    with interpreted_kernels() if interpreted else contextlib.nullcontext(), fuseops.autocast(recipe=recipe):
        y_clean = model(x).detach()
        y = model(x_inf).detach()
    clean = [0, 1, 3, 4, 5]
    assert torch.equal(y[clean], y_clean[clean])
    # The float64 oracle: every output of the inf row is non-finite.
    ref = (x_inf.double() @ model[0].weight.detach().double().T + model[0].bias.detach().double()).cpu()
    assert not torch.isfinite(ref[2]).any()
    return y


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_one_inf_row_reference_path(recipe):
    y = _run(recipe, "reference", "cpu")
    assert not torch.isfinite(y[2]).any()


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines (test_gpu_one_inf_row there)")
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_one_inf_row_interpreted_kernels_keep_the_clean_rows(recipe):
    # The interpreter's float8 -> float32 upcast decodes NaN codes as numbers (triton 3.6
    # interpreter.py _convert_float), so only the clean rows are checked here; the quantized
    # storage itself is checked bit for bit (tests/quant/test_quantize.py), the GEMM on the GPU.
    _run(recipe, "kernels", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_gpu_one_inf_row(recipe):
    y = _run(recipe, "kernels", "cuda")
    assert not torch.isfinite(y[2]).any()
