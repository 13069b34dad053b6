import pytest
import torch
import torch.nn.functional as F

from fuseops.kernels.elementwise import gated_activation as kernels
from fuseops.kernels.elementwise.activation_math import Activation
from tests.helpers import DTYPES, assert_close_rel, cuda_or_skip, poison_

# (rows, 2F)
SHAPES = [(1, 2), (3, 10), (37, 130), (0, 8)]

# (act, clamped, alpha, probs kind): the API's gates (SwiGLU, GeGLU, ReGLU, SReGLU,
# ClampedSwiGLU), each with one of the probs variants.
GATES = [
    (Activation.SILU, False, 1.0, None),
    (Activation.SILU, True, 1.702, "float32"),
    (Activation.GELU_TANH, False, 1.0, "input"),
    (Activation.GELU, False, 1.0, None),
    (Activation.RELU, False, 1.0, "float32"),
    (Activation.SRELU, False, 1.0, "input"),
]
GATE_IDS = [f"{a.name}{'-clamped' if c else ''}-{p}" for a, c, _, p in GATES]

TEXTBOOK = {
    Activation.SILU: lambda a, alpha: a * torch.sigmoid(alpha * a),
    Activation.GELU_TANH: lambda a, alpha: F.gelu(a, approximate="tanh"),
    Activation.GELU: lambda a, alpha: F.gelu(a),
    Activation.RELU: lambda a, alpha: F.relu(a),
    Activation.SRELU: lambda a, alpha: F.relu(a).square(),
}


def _textbook(x, act, clamped, limit, alpha, interleaved, probs):
    """API.md's definition, for autograd in float64."""
    a, b = (x[:, 0::2], x[:, 1::2]) if interleaved else x.chunk(2, -1)
    if clamped:
        a, b = a.clamp(max=limit), b.clamp(-limit, limit) + 1
    y = TEXTBOOK[act](a, alpha) * b
    return y * probs[:, None] if probs is not None else y


def _probs(kind, rows, dtype, device="cpu"):
    if kind is None:
        return None
    return torch.rand(rows, device=device).to(torch.float32 if kind == "float32" else dtype)


def _check(x, dy, probs, act, kw, dtype):
    """Both launchers against their references, outputs poisoned first."""
    rows, features = x.shape
    y = kernels.gated_fwd(x, act, probs=probs, out=poison_(x.new_empty(rows, features // 2)), **kw)
    assert_close_rel(y, kernels.reference_gated_fwd(x, act, probs=probs, **kw), dtype, what="y")
    dx, dprobs = kernels.gated_bwd(x, dy, act, probs=probs, out=poison_(torch.empty_like(x)), **kw)
    dx_ref, dprobs_ref = kernels.reference_gated_bwd(x, dy, act, probs=probs, **kw)
    assert_close_rel(dx, dx_ref, dtype, what="dx")
    if probs is None:
        assert dprobs is None
    else:
        assert dprobs.dtype == probs.dtype
        assert_close_rel(dprobs, dprobs_ref, dtype, what="dprobs")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("act, clamped, alpha, probs_kind", GATES, ids=GATE_IDS)
def test_launchers_match_reference(act, clamped, alpha, probs_kind, interleaved, dtype):
    kw = dict(interleaved=interleaved, clamped=clamped, limit=7.0, alpha=alpha)
    for rows, features in SHAPES:
        # Scale 4 puts some values past the clamp limit.
        x = (torch.randn(rows, features) * 4).to(dtype)
        dy = torch.randn(rows, features // 2).to(dtype)
        _check(x, dy, _probs(probs_kind, rows, dtype), act, kw, dtype)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("act, clamped, alpha, probs_kind", GATES, ids=GATE_IDS)
def test_reference_is_the_textbook_function(act, clamped, alpha, probs_kind, interleaved):
    x64 = (torch.randn(37, 130, dtype=torch.float64) * 4).requires_grad_()
    dy64 = torch.randn(37, 65, dtype=torch.float64)
    p64 = torch.rand(37, dtype=torch.float64).requires_grad_() if probs_kind else None
    _textbook(x64, act, clamped, 7.0, alpha, interleaved, p64).backward(dy64)
    x, dy = x64.detach().float(), dy64.float()
    probs = p64.detach().float() if p64 is not None else None
    kw = dict(interleaved=interleaved, clamped=clamped, limit=7.0, alpha=alpha, probs=probs)
    y64 = _textbook(x64.detach(), act, clamped, 7.0, alpha, interleaved, None if p64 is None else p64.detach())
    assert_close_rel(kernels.reference_gated_fwd(x, act, **kw), y64, torch.float32, what="y")
    dx, dprobs = kernels.reference_gated_bwd(x, dy, act, **kw)
    assert_close_rel(dx, x64.grad, torch.float32, what="dx")
    if p64 is not None:
        assert_close_rel(dprobs, p64.grad, torch.float32, what="dprobs")


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("act, clamped, alpha, probs_kind", GATES, ids=GATE_IDS)
def test_reference_keeps_float64(act, clamped, alpha, probs_kind, interleaved):
    """Float64 in, float64 throughout (the backward must not round dy, or the probs, to
    float32); float32 probs stay float32 and their gradient too."""
    x64 = (torch.randn(37, 130, dtype=torch.float64) * 4).requires_grad_()
    dy64 = torch.randn(37, 65, dtype=torch.float64)
    probs = _probs(probs_kind, 37, torch.float64)
    p = probs.detach().requires_grad_() if probs is not None else None
    y64 = _textbook(x64, act, clamped, 7.0, alpha, interleaved, p)
    y64.backward(dy64)
    kw = {"interleaved": interleaved, "clamped": clamped, "limit": 7.0, "alpha": alpha, "probs": probs}
    close = {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(kernels.reference_gated_fwd(x64.detach(), act, **kw), y64.detach(), **close)
    dx, dprobs = kernels.reference_gated_bwd(x64.detach(), dy64, act, **kw)
    torch.testing.assert_close(dx, x64.grad, **close)
    if p is not None:
        torch.testing.assert_close(dprobs, p.grad, **close)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_clamp_boundaries(interleaved, dtype):
    # Every pairing of a and b around +-limit, including exactly +-limit (where, as in
    # torch.clamp, the gradient passes).
    limit, alpha = 7.0, 1.702
    values = torch.tensor([-8.0, -7.0, -6.5, 0.0, 6.5, 7.0, 8.0], dtype=torch.float64)
    a, b = values[:, None].expand(7, 7), values[None, :].expand(7, 7)
    x64 = torch.stack((a, b), -1).reshape(7, 14) if interleaved else torch.cat((a, b), 1)
    x64.requires_grad_()
    dy64 = torch.randn(7, 7, dtype=torch.float64)
    _textbook(x64, Activation.SILU, True, limit, alpha, interleaved, None).backward(dy64)
    x, dy = x64.detach().to(dtype), dy64.to(dtype)
    kw = dict(interleaved=interleaved, clamped=True, limit=limit, alpha=alpha)
    y = kernels.gated_fwd(x, Activation.SILU, **kw)
    assert_close_rel(y, _textbook(x64.detach(), Activation.SILU, True, limit, alpha, interleaved, None), dtype)
    dx, _ = kernels.gated_bwd(x, dy, Activation.SILU, **kw)
    assert_close_rel(dx, x64.grad, dtype, what="dx")
    # Clamped lanes get exactly zero gradient.
    da, db = (dx[:, 0::2], dx[:, 1::2]) if interleaved else dx.chunk(2, 1)
    assert (da[a > limit] == 0).all() and (db[b.abs() > limit] == 0).all()
    _check(x, dy, None, Activation.SILU, kw, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [Activation.SILU, Activation.GELU, Activation.GELU_TANH], ids=lambda a: a.name)
def test_large_inputs_stay_finite(act, dtype):
    values = torch.tensor([-80.0, -30.0, 0.0, 30.0, 80.0])
    x = torch.cartesian_prod(values, values).to(dtype)
    dy = torch.ones(x.shape[0], 1, dtype=dtype)
    probs = torch.rand(x.shape[0])
    y = kernels.gated_fwd(x, act, probs=probs)
    dx, dprobs = kernels.gated_bwd(x, dy, act, probs=probs)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all() and torch.isfinite(dprobs).all()
    _check(x, dy, probs, act, dict(interleaved=False, clamped=False, limit=7.0, alpha=1.0), dtype)


def test_dprobs_is_deterministic():
    x = torch.randn(9, 300).to(torch.bfloat16)
    dy = torch.randn(9, 150).to(torch.bfloat16)
    probs = torch.rand(9)
    first = kernels.gated_bwd(x, dy, Activation.SILU, probs=probs)[1]
    assert torch.equal(first, kernels.gated_bwd(x, dy, Activation.SILU, probs=probs)[1])


def _same_bits(a, b):
    """Equal bit for bit, NaN included."""
    ints = {2: torch.int16, 4: torch.int32}
    return a.dtype == b.dtype and torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))


def assert_same_row_sums(got, want, what=""):
    """``dprobs`` of two compiled kernel variants: the same non-finite pattern, finite values
    within float32 rounding. On the H100 the row-amax variant's float32 row sums differ from
    the plain kernel's in their last bits; dx and the amaxes stay bitwise."""
    assert (got is None) == (want is None), what
    if got is not None:
        scale = want.float().abs().nan_to_num(0.0, 0.0, 0.0).amax().item() if want.numel() else 0.0
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale, equal_nan=True, msg=what)


def _check_row_amax(x, dy, probs, kw):
    """The row amaxes each launcher emits are ``max |dx|`` over the finite values of its own
    dx (bitwise: a per-tensor quantize of dx then needs no amax pass), and the call's other
    outputs are those of the call without them."""
    for bwd in (kernels.gated_bwd, kernels.reference_gated_bwd):
        row_amax = torch.zeros(x.shape[0], device=x.device)
        dx, dprobs = bwd(x, dy, Activation.SILU, probs=probs, row_amax=row_amax, **kw)
        want = dx.float().abs().nan_to_num(0.0, 0.0, 0.0).amax(1) if dx.numel() else torch.zeros_like(row_amax)
        assert torch.equal(row_amax, want), bwd.__name__
        plain_dx, plain_dprobs = bwd(x, dy, Activation.SILU, probs=probs, **kw)
        assert _same_bits(dx, plain_dx), bwd.__name__
        if x.device.type == "cpu":
            assert (dprobs is None and plain_dprobs is None) or _same_bits(dprobs, plain_dprobs), bwd.__name__
        else:
            assert_same_row_sums(dprobs, plain_dprobs, bwd.__name__)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_row_amax_is_the_max_of_dx(interleaved, dtype):
    kw = dict(interleaved=interleaved, clamped=False, limit=7.0, alpha=1.0)
    for rows, features in SHAPES + [(9, 600)]:
        x = (torch.randn(rows, features) * 4).to(dtype)
        dy = torch.randn(rows, features // 2).to(dtype)
        if rows > 2:
            # A non-finite gradient is left out of its row's amax, not spread into it.
            dy[1, 0] = float("inf")
            dy[2, -1] = float("nan")
        _check_row_amax(x, dy, _probs("float32", rows, dtype), kw)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_gpu_row_amax_is_the_max_of_dx(interleaved):
    device = cuda_or_skip()
    x = (torch.randn(4099, 1536, device=device) * 4).to(torch.bfloat16)
    dy = torch.randn(4099, 768, device=device).to(torch.bfloat16)
    dy[1, 0] = float("inf")
    _check_row_amax(x, dy, _probs("float32", 4099, torch.bfloat16, device),
                    dict(interleaved=interleaved, clamped=False, limit=7.0, alpha=1.0))


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("act, clamped, alpha, probs_kind", GATES[:3], ids=GATE_IDS[:3])
def test_gpu_large_bf16(act, clamped, alpha, probs_kind, interleaved):
    device = cuda_or_skip()
    x = (torch.randn(8192, 8192, device=device) * 4).to(torch.bfloat16)
    dy = torch.randn(8192, 4096, device=device).to(torch.bfloat16)
    probs = _probs(probs_kind, 8192, torch.bfloat16, device)
    _check(x, dy, probs, act, dict(interleaved=interleaved, clamped=clamped, limit=7.0, alpha=alpha), torch.bfloat16)
