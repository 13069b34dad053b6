"""amax (per tensor, per stacked tensor, per row group) against its torch reference."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.quantization.amax import (
    amax,
    reference_amax,
    reference_row_amax,
    reference_tensor_scales,
    row_amax,
    tensor_scales,
)
from fuseops.kernels.quantization.formats import FP32_MAX
from tests.helpers import DTYPES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPLITS = [0, 5, 0, 150, 1, 0]


def make(layout: str, dtype: torch.dtype):
    """(x [B, R, C], offsets or None, number of tensors): rows and columns off every tile."""
    if layout == "dense":
        return torch.randn(1, 75, 1161, device=DEVICE).to(dtype), None, 1
    if layout == "stacked":
        return torch.randn(3, 33, 70, device=DEVICE).to(dtype), None, 3
    offsets = torch.tensor([0] + torch.tensor(SPLITS).cumsum(0).tolist(), device=DEVICE)
    return torch.randn(1, sum(SPLITS), 97, device=DEVICE).to(dtype), offsets, len(SPLITS)


@pytest.mark.parametrize("layout", ["dense", "stacked", "grouped"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax(layout, dtype):
    x, offsets, n = make(layout, dtype)
    x[0, 2, 3] = float("inf") if dtype != torch.float16 else 60000.0
    x[-1, -1, -1] = -70000.0 if dtype != torch.float16 else -65000.0
    got = amax(x, offsets, n)
    assert got.dtype == torch.float32 and got.shape == (n,)
    assert torch.equal(got, reference_amax(x, offsets, n))
    if offsets is not None:
        assert got[[0, 2, 5]].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("layout", ["dense", "grouped"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_of_picked_rows(layout, dtype):
    """``rows``: the amaxes of ``x[:, rows]``, each row read where it lies (fewer picks than rows,
    repeats, a row with an inf)."""
    x, offsets, n = make(layout, dtype)
    x[0, 2, 3] = float("inf")
    picked = torch.randint(0, x.shape[1], (x.shape[1] if offsets is not None else 40,), device=DEVICE)
    picked[0] = 2
    got = amax(x, offsets, n, rows=picked)
    assert torch.equal(got, reference_amax(x[:, picked], offsets, n))
    assert torch.equal(got, reference_amax(x, offsets, n, rows=picked))


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_amax(dtype):
    """Each row's finite amax: a NaN, an inf and a row of only non-finite values count as 0;
    a strided (non-contiguous rows) input; no rows; no columns."""
    x = torch.randn(37, 1300, device=DEVICE).to(dtype)
    x[3, 5], x[4, 7] = float("nan"), -float("inf")
    x[6] = float("inf")
    got = row_amax(x)
    assert got.dtype == torch.float32 and torch.equal(got, reference_row_amax(x))
    assert got[6] == 0 and got[3] == x[3].float().nan_to_num(0).abs().max()
    wide = torch.randn(20, 300, device=DEVICE).to(dtype)[:, 50:250]
    assert torch.equal(row_amax(wide), reference_row_amax(wide))
    assert row_amax(x[:0]).shape == (0,)
    assert torch.equal(row_amax(x[:, :0]), torch.zeros(37, device=DEVICE))


def test_empty():
    x = torch.randn(1, 0, 40, device=DEVICE)
    assert torch.equal(amax(x, torch.zeros(4, dtype=torch.int64, device=DEVICE), 3), torch.zeros(3, device=DEVICE))


# The interpreter's numpy warns on the overflowing division that the clamp then bounds.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("qmax", [448.0, 57344.0, 2688.0])
def test_tensor_scales(qmax):
    a = torch.tensor([0.0, 1.0, 3.0, 1e-42, FP32_MAX, float("inf"), 448.0, 7e-3] * 3, device=DEVICE)
    encode, decode = tensor_scales(a, qmax)
    ref_encode, ref_decode = reference_tensor_scales(a, qmax)
    assert torch.equal(encode, ref_encode) and torch.equal(decode, ref_decode)
    assert torch.isfinite(encode).all() and encode[0].item() == 1.0
