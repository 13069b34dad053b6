"""The Hopper FP8 rows' dispatch entries (``grouped_gemm_scaled``, ``grouped_gemm_scaled_wgrad``)
on the CPU, their launches caught instead of run (Gluon does not run in the interpreter; the GPU
tests beside this file run the kernels): what each hands its kernel. A weight strided along K is
read from a contiguous copy; the result is ``out`` or a fresh tensor of ``out_dtype``; a wgrad adds
into ``main_grad`` where given; a dw that cannot be stored by TMA gets a placeholder descriptor."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.hopper import blockwise, blockwise_wgrad, tensor_scaled, tensor_scaled_wgrad
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

E, M, K, N = 4, 512, 256, 384
FP8 = torch.float8_e4m3fn


def _caught(monkeypatch, module) -> list:
    launches: list = []
    monkeypatch.setattr(module, "launch", lambda kernel, grid, *args, **kwargs: launches.append((args, kwargs)))
    return launches


def _offsets() -> torch.Tensor:
    return torch.arange(0, M + 1, M // E)


def _tokens(rows: int, cols: int, scaling: Scaling) -> Operand:
    if scaling == Scaling.BLOCK:
        return Operand(torch.empty(rows, cols, dtype=FP8), torch.empty(rows, cols // 128))
    return Operand(torch.empty(rows, cols, dtype=FP8), None, torch.ones(E))


def _weight_strided_along_k(scaling: Scaling) -> Operand:
    data = torch.empty(E, K, N, dtype=FP8).transpose(1, 2)  # [E, N, K], K not the contiguous dim
    if scaling == Scaling.BLOCK:
        return Operand(data, torch.empty(E, N // 128, K // 128), rows_per_scale=128)
    return Operand(data, None, torch.ones(E))


FORWARD = {"blockwise": (blockwise, Scaling.BLOCK), "tensor_scaled": (tensor_scaled, Scaling.TENSOR)}


@pytest.mark.parametrize("given_out", [False, True], ids=["fresh", "out"])
@pytest.mark.parametrize("row", FORWARD)
def test_forward_entries(row, given_out, monkeypatch):
    module, scaling = FORWARD[row]
    launches = _caught(monkeypatch, module)
    out = torch.empty(M, N, dtype=torch.float16) if given_out else None
    y = module.grouped_gemm_scaled(_tokens(M, K, scaling), _weight_strided_along_k(scaling), _offsets(),
                                   scaling=scaling, out_dtype=torch.bfloat16, out=out)
    assert len(launches) == 1
    assert y is out if given_out else (y.shape == (M, N) and y.dtype == torch.bfloat16)
    (a_desc, b_desc, y_desc, *_), _ = launches[0]
    # The weight read from a contiguous copy as [E * N, K], the result through its own descriptor.
    assert b_desc.base.is_contiguous() and tuple(b_desc.base.shape) == (E * N, K)
    assert y_desc.base.data_ptr() == y.data_ptr()


WGRAD = {"blockwise": (blockwise_wgrad, Scaling.BLOCK), "tensor_scaled": (tensor_scaled_wgrad, Scaling.TENSOR)}


@pytest.mark.parametrize("into", ["fresh", "out", "main_grad", "strided_out"])
@pytest.mark.parametrize("row", WGRAD)
def test_wgrad_entries(row, into, monkeypatch):
    module, scaling = WGRAD[row]
    launches = _caught(monkeypatch, module)
    P = M + E * 128
    a, b = _tokens(N, P, scaling), _tokens(K, P, scaling)
    main_grad = torch.zeros(E, N, K) if into == "main_grad" else None
    out = {"out": torch.empty(E, N, K, dtype=torch.bfloat16),
           "strided_out": torch.empty(E, K, N, dtype=torch.bfloat16).transpose(1, 2)}.get(into)
    dw = module.grouped_gemm_scaled_wgrad(a, b, _offsets(), scaling=scaling, out_dtype=torch.bfloat16,
                                          main_grad=main_grad, out=out)
    assert len(launches) == 1
    args, kwargs = launches[0]
    target = main_grad if main_grad is not None else out
    if target is not None:
        assert dw is target
    else:
        assert dw.shape == (E, N, K) and dw.dtype == torch.bfloat16
    assert kwargs["ACCUMULATE"] == (into == "main_grad")
    # A dw not contiguous is stored without TMA; its descriptor is a placeholder, not over dw.
    assert kwargs["DW_TMA"] == (into != "strided_out")
    dw_desc = args[2]
    assert (dw_desc.base.data_ptr() == dw.data_ptr()) == kwargs["DW_TMA"]
