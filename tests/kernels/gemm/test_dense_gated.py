"""gemm_gated (Linear + bias + GLU forward) against its torch reference in float64."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm.dense_gated import gemm_gated, reference_gemm_gated
from tests.helpers import DTYPES, assert_close_rel, cuda_or_skip, poison_

# (M, K, F): one row and one output column; sizes off every tile multiple; 16-byte-aligned
# rows (TMA descriptors, also through the interpreter).
SHAPES = [(1, 8, 1), (37, 45, 35), (48, 64, 48)]


def make(m, k, f, dtype, layout, device="cpu"):
    """``a`` [M, K] and ``b`` [K, 2F]: ``weight.t()`` (K contiguous) or an N-contiguous one."""
    a = torch.randn(m, k, device=device).to(dtype)
    w_shape = (2 * f, k) if layout == "forward" else (k, 2 * f)
    w = (torch.randn(w_shape, device=device) / k**0.5).to(dtype)
    return a, w.t() if layout == "forward" else w


def check(a, b, dtype, run=None, **epi):
    """Launch ``gemm_gated`` into poisoned outputs and compare with the float64 reference."""
    run = run or interpreted_kernels
    out = poison_(torch.empty(a.shape[0], b.shape[1] // 2, dtype=dtype, device=a.device))
    with run():
        y, preact = gemm_gated(a, b, out=out, **epi)
    ref_epi = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in epi.items()}
    ref_y, ref_preact = reference_gemm_gated(a.double(), b.double(), **ref_epi)
    assert y is out
    assert_close_rel(y, ref_y, dtype, what="y")
    if epi.get("save_preact"):
        assert preact.dtype == dtype
        assert_close_rel(preact, ref_preact, dtype, what="preact")
    else:
        assert preact is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["forward", "dgrad"])
@pytest.mark.parametrize("shape", SHAPES)
def test_swiglu(shape, layout, interleaved, dtype):
    m, k, f = shape
    a, b = make(m, k, f, dtype, layout)
    bias = torch.randn(2 * f).to(dtype)
    check(a, b, dtype, bias=bias, act=Activation.SILU, interleaved=interleaved, save_preact=True)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(
    "act, clamped, alpha",
    [(Activation.SILU, True, 1.702), (Activation.GELU_TANH, False, 1.0),
     (Activation.RELU, False, 1.0), (Activation.SRELU, False, 1.0)],
)
def test_gate_functions(act, clamped, alpha, interleaved):
    a, b = make(37, 45, 35, torch.float32, "forward")
    # Scaled up so that gpt-oss's clamps at +-limit bite.
    check(a * 4, b, torch.float32, act=act, clamped=clamped, limit=1.5, alpha=alpha,
          interleaved=interleaved)


def test_empty_rows():
    a, b = make(0, 16, 24, torch.float32, "forward")
    with interpreted_kernels():
        y, preact = gemm_gated(a, b, act=Activation.SILU, save_preact=True)
    assert y.shape == (0, 24) and preact.shape == (0, 48)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["forward", "dgrad"])
@pytest.mark.parametrize("shape", [(1000, 768, 550), (1024, 768, 576), (2048, 512, 2048), (1, 64, 128)])
def test_gpu_bf16(shape, layout, interleaved):
    device = cuda_or_skip()
    dtype = torch.bfloat16
    m, k, f = shape
    a, b = make(m, k, f, dtype, layout, device)
    bias = torch.randn(2 * f, device=device).to(dtype)
    for act in (Activation.SILU, Activation.GELU_TANH):
        check(a, b, dtype, torch.no_grad, bias=bias, act=act, interleaved=interleaved,
              save_preact=True)
    check(a * 4, b, dtype, torch.no_grad, act=Activation.SILU, clamped=True, alpha=1.702,
          interleaved=interleaved)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_other_dtypes(dtype):
    device = cuda_or_skip()
    a, b = make(1000, 768, 550, dtype, "forward", device)
    check(a, b, dtype, torch.no_grad, bias=torch.randn(1100, device=device).to(dtype),
          act=Activation.SILU, save_preact=True)
