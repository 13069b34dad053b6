"""The shipped activations' element functions, in the form a declared activation's kernel takes
(``ops.declare_activation``): a float32 tile ``x`` in, ``(f(x), f'(x))`` out, computing what the
two share once (one sigmoid for SiLU, one tanh for GELU(tanh)). ``activation_math.py`` calls
them by the ``Activation`` code; SiLU alone takes a second argument, its sigmoid slope.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuseops.kernels._triton import reciprocal


@triton.jit
def _sigmoid(x):
    # exp2 lowers to one ex2.approx.ftz; tl.exp and "/" to range fix-ups around MUFU ops.
    return reciprocal(1.0 + tl.exp2(x * -1.4426950408889634))


@triton.jit
def _tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1; no libdevice call, so it also runs in the interpreter.
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def identity(x):
    return x, tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def relu(x):
    # NaN stays NaN and passes the gradient, as torch.relu and its backward do
    # (threshold_backward zeroes only where x <= 0).
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL), tl.where(x <= 0.0, 0.0, 1.0)


@triton.jit
def gelu(x):
    cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    pdf = 0.3989422804014327 * tl.exp2(x * x * -0.7213475204444817)
    return x * cdf, cdf + x * pdf


@triton.jit
def gelu_tanh(x):
    x2 = x * x
    t = _tanh(0.7978845608028654 * (x + 0.044715 * x2 * x))
    # x (1 - t^2) first: 0 once t rounds to +-1 (|x| > ~10), where x^2 would overflow from
    # |x| ~ 1.8e19 and 0 * inf make a NaN of a derivative that is 1 or 0 (an inf x still
    # gives NaN, as torch's gelu_backward).
    xs = x * (1.0 - t * t)
    return 0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.3989422804014327 * (xs + 0.134145 * (xs * x) * x)


@triton.jit
def silu(x, alpha):
    """``x * sigmoid(alpha * x)``."""
    s = _sigmoid(alpha * x)
    y = x * s
    return y, s + alpha * y * (1.0 - s)


@triton.jit
def srelu(x):
    r = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)
    return r * r, 2.0 * r


@triton.jit
def sigmoid(x):
    y = _sigmoid(x)
    return y, y * (1.0 - y)
