import pytest
import torch
import torch.nn.functional as F

from fuseops import ops
from tests.helpers import DTYPES, kernels_on
from tests.ops.harness import check_op_against_float64, devices

CASES = [
    (ops.ReLU, {}, torch.relu),
    (ops.GELU, {}, F.gelu),
    (ops.GELU, {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    (ops.SiLU, {}, F.silu),
    (ops.SReLU, {}, lambda x: torch.relu(x).square()),
    (ops.Sigmoid, {}, torch.sigmoid),
]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls, kwargs, fn", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_activation_matches_float64(device, dtype, cls, kwargs, fn):
    check_op_against_float64(cls(**kwargs), lambda x, p: fn(x), (3, 5, 17), dtype, device)


def test_unknown_approximate_is_rejected():
    with pytest.raises(ValueError, match="approximate: expected one of 'none', 'tanh', got 'fast'"):
        ops.GELU(approximate="fast")


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("cls, kwargs, fn", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_non_finite_inputs_placed_as_torch_places_them(kernels, cls, kwargs, fn):
    # torch.relu passes the gradient at a NaN input (threshold_backward zeroes x <= 0 only).
    import fuseops

    with kernels_on(kernels) as device:
        x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 0.0, 1.5, -2.0]], device=device,
                         requires_grad=True)
        dy = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], device=device)
        y = fuseops.Sequential(cls(**kwargs))(x)
        y.backward(dy)
    x64 = x.detach().cpu().double().requires_grad_()
    fn(x64).backward(dy.cpu().double())
    y64 = fn(x64.detach())
    for out, ref in ((y.detach().cpu(), y64), (x.grad.cpu(), x64.grad)):
        assert torch.equal(out.isnan(), ref.isnan()), (out, ref)
        assert torch.equal(out.isinf(), ref.isinf()), (out, ref)
        ok = torch.isfinite(ref)
        torch.testing.assert_close(out[ok].double(), ref[ok], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, kwargs, fn", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_zero_rows(cls, kwargs, fn):
    import fuseops

    x = torch.randn(0, 5, requires_grad=True)
    y = fuseops.Sequential(cls(**kwargs))(x)
    y.sum().backward()
    assert y.shape == (0, 5) and x.grad.shape == (0, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls, kwargs, fn", [c for c in CASES if c[0] is not ops.SReLU],
                         ids=lambda c: getattr(c, "__name__", None))
def test_cpu_references_are_torch_nn_bit_for_bit(dtype, cls, kwargs, fn):
    # On the CPU the references are what runs: they call torch's own kernels where torch has the
    # function (activation_math.py), so a user's model gives torch.nn's values exactly, its tails
    # and non-finite inputs too, in one pass each way where the formulas spelled out took up to fifteen.
    import fuseops

    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38])
    x = torch.cat([torch.linspace(-12, 12, 2001), special]).to(dtype)[None].requires_grad_()
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    y = fuseops.Sequential(cls(**kwargs))(x)
    y.backward(dy)
    x_nn = x.detach().clone().requires_grad_()
    y_nn = fn(x_nn)
    y_nn.backward(dy)
    torch.testing.assert_close(y, y_nn, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x.grad, x_nn.grad, rtol=0, atol=0, equal_nan=True)
