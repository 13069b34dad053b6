"""gemm (dense GEMM with fused epilogues) against its torch reference in float64."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm.dense import gemm, reference_gemm
from tests.helpers import DTYPES, assert_close_rel, cuda_or_skip, poison_

# (M, K, N): one row / column; sizes off every tile multiple (pointer loads and stores);
# 16-byte-aligned rows (TMA descriptors, also through the interpreter); aligned operands
# with an unaligned output.
SHAPES = [(1, 8, 1), (37, 45, 70), (48, 64, 96), (40, 64, 70)]
ACTS = list(Activation)


def weight_operand(w: torch.Tensor, layout: str) -> torch.Tensor:
    """``b`` [K, N] as the Linear passes it: ``weight.t()`` forward, ``weight`` in dgrad."""
    return w.t() if layout == "forward" else w


def make(m, k, n, dtype, layout, device="cpu"):
    a = torch.randn(m, k, device=device).to(dtype)
    w_shape = (n, k) if layout == "forward" else (k, n)
    w = (torch.randn(w_shape, device=device) / k**0.5).to(dtype)
    return a, weight_operand(w, layout)


def check(a, b, dtype, run=None, factor=1.0, **epi):
    """Launch ``gemm`` into poisoned outputs and compare with the float64 reference."""
    run = run or interpreted_kernels
    out = poison_(torch.empty(a.shape[0], b.shape[1], dtype=dtype, device=a.device))
    with run():
        y, preact = gemm(a, b, out=out, **epi)
    ref_epi = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in epi.items()}
    ref_y, ref_preact = reference_gemm(a.double(), b.double(), **ref_epi)
    assert y is out
    assert_close_rel(y, ref_y, dtype, factor, what="y")
    if epi.get("save_preact"):
        assert preact.dtype == dtype
        assert_close_rel(preact, ref_preact, dtype, factor, what="preact")
    else:
        assert preact is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["forward", "dgrad"])
@pytest.mark.parametrize("shape", SHAPES)
def test_plain_and_bias_act(shape, layout, dtype):
    m, k, n = shape
    a, b = make(m, k, n, dtype, layout)
    check(a, b, dtype)
    bias = torch.randn(n).to(dtype)
    check(a, b, dtype, bias=bias, act=Activation.GELU_TANH, save_preact=True)


@pytest.mark.parametrize("layout", ["forward", "dgrad"])
@pytest.mark.parametrize("shape", [(37, 45, 70), (48, 64, 96)])
def test_act_grad_and_residual(shape, layout):
    dtype = torch.bfloat16
    m, k, n = shape
    a, b = make(m, k, n, dtype, layout)
    z = torch.randn(m, n).to(dtype)
    r = torch.randn(m, n).to(dtype)
    check(a, b, dtype, act=Activation.SILU, alpha=1.702, act_grad_input=z)
    check(a, b, dtype, residual=r)
    check(a, b, dtype, bias=torch.randn(n).to(dtype), act=Activation.RELU, residual=r, save_preact=True)


@pytest.mark.parametrize("act", ACTS)
def test_every_activation(act):
    dtype = torch.float32
    a, b = make(33, 40, 50, dtype, "forward")
    bias = torch.randn(50)
    check(a, b, dtype, bias=bias, act=act, save_preact=True)
    check(a, b, dtype, act=act, act_grad_input=torch.randn(33, 50))


def test_empty_rows_and_zero_k():
    a, b = make(0, 16, 24, torch.float32, "forward")
    with interpreted_kernels():
        y, preact = gemm(a, b, save_preact=True)
    assert y.shape == (0, 24) and preact.shape == (0, 24)
    a, b = make(5, 0, 24, torch.float32, "forward")
    check(a, b, torch.float32, bias=torch.randn(24), act=Activation.SIGMOID)


def test_strided_a_and_b():
    """Neither stride of ``b`` is 1, and ``a`` is a column slice: both are made contiguous."""
    a = torch.randn(20, 60)[:, :30]
    b = torch.randn(30, 2, 40)[:, 0, :]
    check(a, b[:, ::2], torch.float32)
    check(a, b, torch.float32, bias=torch.randn(40), act=Activation.GELU)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["forward", "dgrad"])
@pytest.mark.parametrize("shape", [(1000, 768, 1100), (1024, 768, 1152), (1, 64, 256)])
def test_gpu_bf16_epilogues(shape, layout):
    device = cuda_or_skip()
    dtype = torch.bfloat16
    m, k, n = shape
    a, b = make(m, k, n, dtype, layout, device)
    bias = torch.randn(n, device=device).to(dtype)
    z = torch.randn(m, n, device=device).to(dtype)
    r = torch.randn(m, n, device=device).to(dtype)
    run = torch.no_grad
    check(a, b, dtype, run)
    # Every activation at the mid shape; the others cover the TMA and small-M paths.
    for act in ACTS if m == 1000 else (Activation.GELU_TANH,):
        check(a, b, dtype, run, bias=bias, act=act, save_preact=True)
        check(a, b, dtype, run, act=act, act_grad_input=z)
    check(a, b, dtype, run, bias=bias, residual=r)
    check(a, b, dtype, run, act=Activation.GELU_TANH, act_grad_input=z, residual=r)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_large_tiles(dtype):
    """Enough tiles for the ``large`` config, every dtype, both layouts."""
    device = cuda_or_skip()
    for layout in ("forward", "dgrad"):
        a, b = make(2048, 512, 4096, dtype, layout, device)
        bias = torch.randn(4096, device=device).to(dtype)
        check(a, b, dtype, torch.no_grad, bias=bias, act=Activation.GELU_TANH, save_preact=True)
