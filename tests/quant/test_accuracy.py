"""Accuracy floors of one Linear's three GEMMs on Gaussian data, signal-to-quantization noise
against float64 (DESIGN.md): FP8 current scaling and blockwise >= 27 / 23 / 21 dB (output,
input grad, weight grad), MXFP8 >= 26.5 / 23 / 21, NVFP4 >= 14 / 12 / 12. Everything runs
through the quantize and scaled-GEMM kernels (the interpreter on CPU)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.quant import linear_dgrad, linear_forward, linear_wgrad, quantize, recipes
from tests.helpers import SQNR_FLOORS_DB, sqnr_db

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOORS = {
    name: (recipe, SQNR_FLOORS_DB[type(recipe).__name__])
    for name, recipe in (("fp8_current", recipes.FP8CurrentScaling()), ("fp8_blockwise", recipes.FP8Blockwise()),
                         ("mxfp8", recipes.MXFP8()), ("nvfp4", recipes.NVFP4()))
}


def kernels():
    return contextlib.nullcontext() if DEVICE == "cuda" else interpreted_kernels()


def sqnrs(recipe, x, w, dy, offsets=None):
    """(out, dgrad, wgrad) SQNR in dB of the quantized Linear against float64."""
    with kernels():
        xq = quantize(x, recipe, columnwise=True, offsets=offsets)
        wq = quantize(w, recipe, role="weight", columnwise=True)
        dyq = quantize(dy, recipe, role="grad", columnwise=True, offsets=offsets)
        y, dx, dw = linear_forward(xq, wq), linear_dgrad(dyq, wq), linear_wgrad(dyq, xq)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    if offsets is None:
        return sqnr_db(y, x64 @ w64.T), sqnr_db(dx, dy64 @ w64), sqnr_db(dw, dy64.T @ x64)
    b = offsets.tolist()
    spans = [slice(b[g], b[g + 1]) for g in range(len(b) - 1)]
    y64 = torch.cat([x64[r] @ w64[g].T for g, r in enumerate(spans)])
    dx64 = torch.cat([dy64[r] @ w64[g] for g, r in enumerate(spans)])
    dw64 = torch.stack([dy64[r].T @ x64[r] for r in spans])
    return sqnr_db(y, y64), sqnr_db(dx, dx64), sqnr_db(dw, dw64)


def check(name, got):
    floors = FLOORS[name][1]
    assert all(g >= f for g, f in zip(got, floors)), f"{name}: SQNR {[round(g, 1) for g in got]} dB, floors {floors}"


@pytest.mark.parametrize("name", FLOORS)
def test_dense_linear(name):
    T, K, N = 128, 256, 128
    x, w, dy = (torch.randn(*s, device=DEVICE) for s in ((T, K), (N, K), (T, N)))
    check(name, sqnrs(FLOORS[name][0], x, w, dy))


@pytest.mark.parametrize("name", FLOORS)
def test_grouped_linear(name):
    sizes = [40, 0, 90, 30]
    offsets = group_offsets(torch.tensor(sizes, device=DEVICE))
    x, dy = torch.randn(160, 128, device=DEVICE, dtype=torch.bfloat16), torch.randn(160, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(4, 64, 128, device=DEVICE, dtype=torch.bfloat16)
    check(name, sqnrs(FLOORS[name][0], x, w, dy, offsets))


@pytest.mark.gpu
@pytest.mark.parametrize("name", FLOORS)
def test_gpu_large_linear(name):
    T, K, N = 4096, 4096, 2048
    x, w, dy = (torch.randn(*s, device=DEVICE, dtype=torch.bfloat16) for s in ((T, K), (N, K), (T, N)))
    check(name, sqnrs(FLOORS[name][0], x, w, dy))
