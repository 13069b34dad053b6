import itertools

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import ops
from tests.helpers import DTYPES
from tests.ops.harness import check_op_against_float64, devices


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
