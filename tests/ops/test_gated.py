import itertools

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import ops
from tests.helpers import DTYPES, kernels_on
from tests.ops.harness import assert_torch_nn_values, check_op_against_float64, devices


def _clamped_swiglu(a, b, limit=7.0, alpha=1.702):
    a = a.clamp(max=limit)
    b = b.clamp(-limit, limit)
    return a * torch.sigmoid(alpha * a) * (b + 1)


CASES = [
    (ops.SwiGLU, {}, lambda a, b: F.silu(a) * b),
    (ops.GeGLU, {}, lambda a, b: F.gelu(a, approximate="tanh") * b),
    (ops.GeGLU, {"approximate": "none"}, lambda a, b: F.gelu(a) * b),
    (ops.ReGLU, {}, lambda a, b: torch.relu(a) * b),
    (ops.SReGLU, {}, lambda a, b: torch.relu(a).square() * b),
    (ops.ClampedSwiGLU, {}, _clamped_swiglu),
]


def _reference(fn, interleaved, scaled):
    def ref(x, params, *extras):
        a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, -1)
        y = fn(a, b)
        if scaled:
            y = y * extras[0].reshape(*y.shape[:-1], 1)
        return y

    return ref


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved, scaled", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("cls, kwargs, fn", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_gated_matches_float64(device, dtype, interleaved, scaled, cls, kwargs, fn):
    op = cls(**kwargs, interleaved=interleaved, scaled=scaled)
    x_shape = (2, 5, 2 * 9)
    # Scale up so the clamped form crosses its limits.
    extras = [torch.rand(10, dtype=dtype)] if scaled else []
    check_op_against_float64(op, _reference(fn, interleaved, scaled), x_shape, dtype, device, extras)


def test_odd_width_and_bad_probs_are_rejected():
    with pytest.raises(ValueError, match=r"even last dim"):
        fuseops.Sequential(ops.SwiGLU())(torch.randn(3, 5))
    model = fuseops.Sequential(ops.SwiGLU(scaled=True))
    with pytest.raises(ValueError, match=r"probs: expected shape \[3\], got \[4\]"):
        model(torch.randn(3, 8), torch.rand(4))
    with pytest.raises(TypeError, match=r"expected 1 extra input"):
        model(torch.randn(3, 8))


def test_clamped_swiglu_arguments():
    with pytest.raises(ValueError, match="limit"):
        ops.ClampedSwiGLU(limit=-1.0)


def _all_gated():
    for (cls, kwargs, fn), interleaved, scaled in itertools.product(CASES, [False, True], [False, True]):
        yield pytest.param(cls, kwargs, fn, interleaved, scaled,
                           id=f"{cls.__name__}{kwargs.get('approximate', '')}-i{int(interleaved)}-s{int(scaled)}")


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("cls, kwargs, fn, interleaved, scaled", list(_all_gated()))
def test_zero_rows_forward_and_backward(kernels, cls, kwargs, fn, interleaved, scaled):
    # An expert-parallel rank that receives no tokens runs its MLP on [0, 2F].
    with kernels_on(kernels) as device:
        model = fuseops.Sequential(cls(**kwargs, interleaved=interleaved, scaled=scaled)).to(device)
        x = torch.randn(0, 8, device=device, requires_grad=True)
        extras = [torch.rand(0, device=device, requires_grad=True)] if scaled else []
        y = model(x, *extras)
        y.sum().backward()
    assert y.shape == (0, 4)
    assert x.grad.shape == (0, 8)
    if scaled:
        assert extras[0].grad.shape == (0,)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("cls, kwargs, fn", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_non_finite_inputs_placed_as_torch_places_them(kernels, cls, kwargs, fn):
    x = torch.randn(4, 8)
    x[0, 1], x[1, 5], x[2, 2], x[3, 6] = float("nan"), float("nan"), float("inf"), -float("inf")
    dy = torch.randn(4, 4)
    with kernels_on(kernels) as device:
        xd = x.to(device, copy=True).requires_grad_()
        y = fuseops.Sequential(cls(**kwargs))(xd)
        y.backward(dy.to(device))
    x64 = x.double().requires_grad_()
    y64 = fn(*x64.chunk(2, -1))
    y64.backward(dy.double())
    for out, ref in ((y.detach().cpu(), y64.detach()), (xd.grad.cpu(), x64.grad)):
        assert torch.equal(out.isnan(), ref.isnan())
        assert torch.equal(out.isinf(), ref.isinf())
        ok = torch.isfinite(ref)
        torch.testing.assert_close(out[ok].double(), ref[ok], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_clamped_swiglu_rejects_non_finite_alpha(bad):
    with pytest.raises(ValueError, match=r"alpha: expected a finite float, got (nan|inf)"):
        ops.ClampedSwiGLU(alpha=bad)
    with pytest.raises(ValueError, match=r"limit: expected a positive float, got nan"):
        ops.ClampedSwiGLU(limit=float("nan"))
    with pytest.raises(TypeError, match=r"alpha: expected a finite float, got '1'"):
        ops.ClampedSwiGLU(alpha="1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls, kwargs, fn", CASES[:4], ids=lambda c: getattr(c, "__name__", None))
def test_cpu_references_are_torch_nn_bit_for_bit(dtype, cls, kwargs, fn):
    # As the activations' (tests/ops/test_activation.py): act(a) * b through torch's own
    # activation kernels, forward and backward, so torch.nn's values exactly on the CPU.
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, -3e38])
    a = torch.cat([torch.linspace(-12, 12, 2001), special])
    x = torch.cat([a, a.roll(1001)]).to(dtype)[None].requires_grad_()
    dy = torch.randn(a.shape, generator=torch.Generator().manual_seed(0)).to(dtype)[None]
    y = fuseops.Sequential(cls(**kwargs))(x)
    y.backward(dy)
    x_nn = x.detach().clone().requires_grad_()
    y_nn = fn(*x_nn.chunk(2, -1))
    y_nn.backward(dy)
    # But where torch's kernels overflow (tests/ops/test_activation.py): there float64's values.
    x64 = x.detach().double().requires_grad_()
    y64 = fn(*x64.chunk(2, -1))
    y64.backward(dy.double())
    assert_torch_nn_values(y, y_nn, y64.to(dtype))
    overflowed = assert_torch_nn_values(x.grad, x_nn.grad, x64.grad.to(dtype))
    # (torch's GELU(tanh) backward at +-3e38 in float32, every torch version; torch 2.11's GELU
    # forward too, in db = dy * gelu(a).)
    assert overflowed.any() or not (kwargs.get("approximate", "tanh") == "tanh" and cls is ops.GeGLU
                                    and dtype == torch.float32)
