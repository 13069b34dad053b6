import pytest
import torch
import torch.nn.functional as F

from fuseops.kernels.elementwise import activation as kernels
from fuseops.kernels.elementwise.activation_math import Activation, reference_activation_grad
from tests.helpers import DTYPES, assert_close_rel, cuda_or_skip, poison_

SHAPES = [(1, 1), (3, 5), (37, 130), (0, 8)]
# SiLU is also checked with gpt-oss's sigmoid slope; the others ignore alpha.
ALPHA = {Activation.SILU: 1.702}

# The textbook definitions, differentiated by autograd in float64.
TEXTBOOK = {
    Activation.IDENTITY: lambda x, alpha: x,
    Activation.RELU: lambda x, alpha: F.relu(x),
    Activation.GELU: lambda x, alpha: F.gelu(x),
    Activation.GELU_TANH: lambda x, alpha: F.gelu(x, approximate="tanh"),
    Activation.SILU: lambda x, alpha: F.silu(x) if alpha == 1.0 else x * torch.sigmoid(alpha * x),
    Activation.SRELU: lambda x, alpha: F.relu(x).square(),
    Activation.SIGMOID: lambda x, alpha: torch.sigmoid(x),
}


def _inputs(shape, dtype, device="cpu", scale=2.0):
    x = (torch.randn(shape, device=device) * scale).to(dtype)
    return x, torch.randn(shape, device=device).to(dtype)


def _check_all(x, dy, act, alpha, dtype):
    """Every launcher against its reference, outputs poisoned first."""
    y = kernels.activation_fwd(x, act, alpha, out=poison_(torch.empty_like(x)))
    assert_close_rel(y, kernels.reference_activation_fwd(x, act, alpha), dtype, what="y")
    dx = kernels.activation_bwd(x, dy, act, alpha, out=poison_(torch.empty_like(x)))
    assert_close_rel(dx, kernels.reference_activation_bwd(x, dy, act, alpha), dtype, what="dx")
    dx, dbias = kernels.activation_bwd_dbias(x, dy, act, alpha, out=poison_(torch.empty_like(x)))
    dx_ref, dbias_ref = kernels.reference_activation_bwd_dbias(x, dy, act, alpha)
    assert_close_rel(dx, dx_ref, dtype, what="fused dx")
    assert dbias.dtype == x.dtype
    assert_close_rel(dbias, dbias_ref, dtype, what="dbias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(Activation), ids=lambda a: a.name)
def test_launchers_match_reference(act, dtype):
    for shape in SHAPES:
        _check_all(*_inputs(shape, dtype), act, ALPHA.get(act, 1.0), dtype)


@pytest.mark.parametrize("act", list(Activation), ids=lambda a: a.name)
def test_reference_is_the_textbook_function(act):
    alpha = ALPHA.get(act, 1.0)
    x64 = (torch.randn(37, 130, dtype=torch.float64) * 3).requires_grad_()
    dy64 = torch.randn(37, 130, dtype=torch.float64)
    TEXTBOOK[act](x64, alpha).backward(dy64)
    x, dy = x64.detach().float(), dy64.float()
    y64 = TEXTBOOK[act](x64.detach(), alpha)
    assert_close_rel(kernels.reference_activation_fwd(x, act, alpha), y64, torch.float32, what="y")
    assert_close_rel(kernels.reference_activation_bwd(x, dy, act, alpha), x64.grad, torch.float32, what="dx")
    dx, dbias = kernels.reference_activation_bwd_dbias(x, dy, act, alpha)
    assert_close_rel(dx, x64.grad, torch.float32, what="fused dx")
    assert_close_rel(dbias, x64.grad.sum(0), torch.float32, what="dbias")


@pytest.mark.parametrize("act", list(Activation), ids=lambda a: a.name)
def test_reference_keeps_float64(act):
    """Float64 in, float64 throughout: the references are the oracles' arithmetic (a backward
    that rounds dy to float32 is 1e-8 off torch's float64 gradient)."""
    alpha = ALPHA.get(act, 1.0)
    x64 = (torch.randn(37, 130, dtype=torch.float64) * 3).requires_grad_()
    dy64 = torch.randn(37, 130, dtype=torch.float64)
    TEXTBOOK[act](x64, alpha).backward(dy64)
    x = x64.detach()
    close = {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(kernels.reference_activation_fwd(x, act, alpha), TEXTBOOK[act](x, alpha), **close)
    torch.testing.assert_close(kernels.reference_activation_bwd(x, dy64, act, alpha), x64.grad, **close)
    dx, dbias = kernels.reference_activation_bwd_dbias(x, dy64, act, alpha)
    torch.testing.assert_close(dx, x64.grad, **close)
    torch.testing.assert_close(dbias, x64.grad.sum(0), **close)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(Activation), ids=lambda a: a.name)
def test_large_inputs_stay_finite(act, dtype):
    x = torch.tensor([[-80.0, -30.0, -10.0, 0.0, 10.0, 30.0, 80.0]], dtype=dtype)
    dy = torch.ones_like(x)
    y = kernels.activation_fwd(x, act, ALPHA.get(act, 1.0))
    dx, dbias = kernels.activation_bwd_dbias(x, dy, act, ALPHA.get(act, 1.0))
    assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dbias).all()
    _check_all(x, dy, act, ALPHA.get(act, 1.0), dtype)


def test_any_shape_is_flat():
    x, dy = _inputs((2, 3, 7, 5), torch.float32)
    y = kernels.activation_fwd(x, Activation.GELU_TANH)
    assert y.shape == x.shape
    assert_close_rel(y, kernels.reference_activation_fwd(x, Activation.GELU_TANH), torch.float32)
    dx = kernels.activation_bwd(x, dy, Activation.GELU_TANH)
    assert_close_rel(dx, kernels.reference_activation_bwd(x, dy, Activation.GELU_TANH), torch.float32)


def test_dbias_is_deterministic_and_float32_accumulated():
    # 300 rows split into several slabs, so the second stage runs.
    x, dy = _inputs((300, 9), torch.bfloat16)
    first = kernels.activation_bwd_dbias(x, dy, Activation.SILU)[1]
    assert torch.equal(first, kernels.activation_bwd_dbias(x, dy, Activation.SILU)[1])
    exact = (dy.double() * reference_activation_grad(x, Activation.SILU).double()).sum(0)
    assert_close_rel(first, exact, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [Activation.GELU_TANH, Activation.SILU, Activation.RELU], ids=lambda a: a.name)
def test_gpu_large_bf16(act):
    device = cuda_or_skip()
    x, dy = _inputs((8192, 4096), torch.bfloat16, device)
    _check_all(x, dy, act, ALPHA.get(act, 1.0), torch.bfloat16)
    dbias = kernels.activation_bwd_dbias(x, dy, act)[1]
    assert torch.equal(dbias, kernels.activation_bwd_dbias(x, dy, act)[1])
