"""The grouped GEMMs' torch references against a float64 loop over groups written here.

The references take their per-group products from ``torch._grouped_mm`` for float32 CPU
tensors where torch has it, else from a loop of ``torch.mm``: both must give every group's
product, zero for empty groups (wgrad) and rows past the last group (per-group products),
and ``reference_grouped_gemm`` must leave rows of ``out`` past the last group as they were.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import grouped
from fuseops.kernels.gemm.grouped import per_group_matmul, reference_grouped_gemm
from fuseops.kernels.gemm.grouped_wgrad import reference_grouped_gemm_wgrad
from tests.helpers import assert_close_rel

SPLITS = {"mixed": [5, 0, 40, 1, 33, 0], "single": [45], "short": [3, 0, 4]}
M = 79  # more rows than the "single" and "short" splits cover


def _offsets(split: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(split).cumsum(0).tolist()])


def _loop_products(a: torch.Tensor, b: torch.Tensor, offsets: list[int]) -> torch.Tensor:
    y = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64)
    for g in range(len(offsets) - 1):
        y[offsets[g]:offsets[g + 1]] = a[offsets[g]:offsets[g + 1]].double() @ b[g].double()
    return y


@pytest.fixture(params=[True, False], ids=["torch_grouped_mm", "mm_loop"])
def path(request, monkeypatch):
    if not request.param:
        monkeypatch.setattr(grouped, "_cpu_grouped_mm_works", lambda: False)
    elif not grouped._cpu_grouped_mm_works():
        pytest.skip("this torch has no CPU float32 torch._grouped_mm")
    return request.param


@pytest.mark.parametrize("split", SPLITS)
def test_per_group_products(split, path):
    torch.manual_seed(0)
    offsets = _offsets(SPLITS[split])
    a, b = torch.randn(M, 24), torch.randn(len(SPLITS[split]), 32, 24).transpose(1, 2)
    y = per_group_matmul(a, b, offsets)
    assert y.dtype == torch.float32
    assert_close_rel(y, _loop_products(a, b, offsets.tolist()), torch.float32)
    assert (y[int(offsets[-1]):] == 0).all()


@pytest.mark.parametrize("strides", [(1, 0), (0, 1), (1, 4), (4, 1)])
def test_per_group_products_of_no_rows_whatever_their_strides(strides, path):
    """An empty operand may carry any strides, a zero one too (a zero-row gradient [0, 1] came
    with strides (1, 0): "contiguous", as every empty tensor is); ``torch._grouped_mm`` refuses
    a zero stride, so such operands take the loop (else the unfused GroupedMLP's backward
    raises "Invalid strides/sizes" at zero rows)."""
    a = torch.empty_strided((0, 4), strides)
    b = torch.randn(2, 4, 8)
    y = per_group_matmul(a, b, torch.tensor([0, 0, 0]))
    assert y.shape == (0, 8) and y.dtype == torch.float32


@pytest.mark.parametrize("split", SPLITS)
def test_reference_grouped_gemm_leaves_rows_past_the_groups(split, path):
    torch.manual_seed(0)
    offsets = _offsets(SPLITS[split])
    G, end = len(SPLITS[split]), int(offsets[-1])
    a, b, bias = torch.randn(M, 24), torch.randn(G, 24, 16), torch.randn(G, 16)
    out = torch.full((M, 16), 7.0)
    y, _ = reference_grouped_gemm(a, b, offsets, bias=bias, act=Activation.GELU, out=out)
    z = _loop_products(a, b, offsets.tolist())[:end] + bias.double().repeat_interleave(torch.tensor(SPLITS[split]), 0)
    expected = 0.5 * z * (1.0 + torch.erf(z / 2**0.5))
    assert y is out
    assert_close_rel(y[:end], expected, torch.float32)
    assert (y[end:] == 7.0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split", SPLITS)
def test_reference_wgrad(split, dtype, path):
    torch.manual_seed(0)
    offsets = _offsets(SPLITS[split])
    dy, x = torch.randn(M, 16, dtype=dtype), torch.randn(M, 24, dtype=dtype)
    dw = reference_grouped_gemm_wgrad(dy, x, offsets)
    bounds = offsets.tolist()
    expected = torch.stack([dy[lo:hi].double().T @ x[lo:hi].double() for lo, hi in itertools.pairwise(bounds)])
    assert dw.dtype == dtype
    assert_close_rel(dw, expected, dtype)
    for g, size in enumerate(SPLITS[split]):
        if size == 0:
            assert (dw[g] == 0).all()
