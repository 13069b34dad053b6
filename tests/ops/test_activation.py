import pytest
import torch
import torch.nn.functional as F

from fuseops import ops
from tests.helpers import DTYPES, kernels_on
from tests.ops.harness import assert_torch_nn_values, check_op_against_float64, devices

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
    # But where torch's kernels overflow (the next test): there float64's values.
    x64 = x.detach().double().requires_grad_()
    y64 = fn(x64)
    y64.backward(dy.double())
    assert_torch_nn_values(y, y_nn, y64.to(dtype))
    overflowed = assert_torch_nn_values(x.grad, x_nn.grad, x64.grad.to(dtype))
    # (torch's GELU(tanh) backward at +-3e38 in float32, every torch version; others vary by version.)
    assert overflowed.any() or not (kwargs.get("approximate") == "tanh" and dtype == torch.float32)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("gated", [False, True], ids=["GELU", "GeGLU"])
def test_gelu_is_right_where_torchs_kernels_overflow(kernels, dtype, approximate, gated):
    # torch's GELU(tanh) backward squares x, past the float32 maximum from |x| ~ 1.8e19: there its
    # derivative came out NaN (0 * inf) where it is 1 or 0, and so did the kernels' (same formula)
    # and the references (torch's kernel). torch 2.11's CPU GELU forward gave inf at 3e38 and NaN
    # at +inf (the test above). NaN and inf from finite inputs: compared with float64 here.
    import fuseops

    big = [1e19, 2e19, 1e30, 3e38, -2e19, -1e30, -3e38, 7.0, -7.0, 0.5, 12.0, 30.0, 1e6, 1e12, -30.0]
    with kernels_on(kernels) as device:
        a = torch.tensor([big], dtype=dtype, device=device)
        x = (torch.cat([a, torch.ones_like(a)], -1) if gated else a).requires_grad_()
        op = ops.GeGLU(approximate) if gated else ops.GELU(approximate=approximate)
        y = fuseops.Sequential(op)(x)
        y.backward(torch.ones_like(y))
    x64 = x.detach().cpu().double().requires_grad_()
    a64, b64 = x64.chunk(2, -1) if gated else (x64, 1.0)
    y64 = F.gelu(a64, approximate=approximate) * b64
    y64.backward(torch.ones_like(y64))
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all(), (y, x.grad)
    torch.testing.assert_close(y.cpu().double(), y64.to(dtype).double())
    torch.testing.assert_close(x.grad.cpu().double(), x64.grad.to(dtype).double())
