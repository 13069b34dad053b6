"""What the quantize kernels do with the values a format cannot hold (quantization/formats.py's
docstring has the rules): amaxes over finite values only, the source dtype's maximum, and the
step back of an FP8 code that would dequantize past it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET

FP32_MAX = torch.finfo(torch.float32).max
_FP32_MAX = tl.constexpr(FP32_MAX)
# The interpreter runs a reduction's combine function in Python, element by element.
_COMBINE_NAN_MAX = tl.constexpr(not INTERPRET)


@triton.jit
def finite_abs(t):
    """``|t|`` where finite, 0 at NaN and infinities: scales come from the finite values
    alone, so one non-finite element never erases the rest of its tensor or block."""
    a = tl.abs(t)
    return tl.where(a <= _FP32_MAX, a, 0.0)


@triton.jit
def non_finite(t):
    """Whether each element of ``t`` is NaN or infinite."""
    return tl.where(tl.abs(t) <= _FP32_MAX, 0, 1) != 0


@triton.jit
def any_non_finite(t, axis):
    """Whether ``t`` holds a NaN or an infinity along ``axis`` (int32 0/1)."""
    return tl.max(tl.where(tl.abs(t) <= _FP32_MAX, 0, 1), axis=axis)


@triton.jit
def dtype_max(ptr):
    """The largest finite value of ``ptr``'s element type (float16, bfloat16, else float32)."""
    m = _FP32_MAX
    if ptr.dtype.element_ty == tl.float16:
        m = 65504.0
    elif ptr.dtype.element_ty == tl.bfloat16:
        m = 3.3895313892515355e38
    return m


@triton.jit
def _maximum_with_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_with_nan(a, axis):
    """``max`` of float32 ``a`` along ``axis``, NaN where one is NaN (``tl.max`` skips NaN)."""
    if _COMBINE_NAN_MAX:
        m = tl.reduce(a, axis, _maximum_with_nan)
    else:
        # The same values from the interpreter's vectorized reductions.
        m = tl.where(tl.max(tl.where(a != a, 1, 0), axis) != 0, float("nan"), tl.max(a, axis))  # noqa: PLR0124
    return m


@triton.jit
def plain_limit(ptr, SCALING: tl.constexpr):
    """A tile of ``ptr``'s element type whose block maxima are all <= this (so none is NaN or
    inf) needs none of the rules here: its values cast to the same codes without them. For
    BLOCK and MX, below the largest power of two P <= the dtype's maximum: a value <= amax < P,
    times the block's power of two ``mult``, rounds to at most P * mult (an FP8 value, or past
    the format's maximum, where satfinite stops first), so no code passes the dtype's maximum
    (``fit_limit``). NVFP4 has no such step: any finite maximum."""
    m = _FP32_MAX
    if SCALING != 3:
        # The float32 just below P: 2**127 (float32, bfloat16) or 2**15 (float16).
        m = 1.7014117331926443e38
        if ptr.dtype.element_ty == tl.float16:
            m = 32767.998046875
    return m


@triton.jit
def fit_limit(mult, src_max, ELEM: tl.constexpr):
    """The largest E4M3 (ELEM 0) or E5M2 value ``L`` with ``L / mult <= src_max`` (``mult`` a
    power of two, ``src_max`` the source dtype's maximum): a value within half an FP8 step of
    the maximum would round up past it and dequantize to inf, so the casts clamp the finite
    ``v * mult`` to [-L, L] (``cast_fp8_within``). That is the reference's step of such a code one
    value toward zero (``reference_fit_source``): ``|v * mult| <= src_max * mult`` rounds to L or
    the next value up."""
    FMAX: tl.constexpr = 448.0 if ELEM == 0 else 57344.0
    DROP: tl.constexpr = 20 if ELEM == 0 else 21
    # At least the block's amax * mult (> FMAX / 2 unless the amax is 0 or tiny, then more),
    # a normal FP8 value: dropping the mantissa bits that FP8 lacks rounds it down to the grid.
    lim = tl.minimum(src_max * mult, FMAX)
    return ((lim.to(tl.int32, bitcast=True) >> DROP) << DROP).to(tl.float32, bitcast=True)


def reference_finite_abs(v: torch.Tensor) -> torch.Tensor:
    """``|v|`` where finite, 0 at NaN and infinities (``finite_abs``)."""
    a = v.float().abs()
    return torch.where(a <= FP32_MAX, a, 0.0)


def reference_fit_source(q: torch.Tensor, v: torch.Tensor, mult: torch.Tensor, src_max: float) -> torch.Tensor:
    """Float8 codes ``q`` of the finite ``v * mult`` stepped one code toward zero where ``q /
    mult`` would pass ``src_max`` (the kernels clamp to ``fit_limit`` instead, the same codes)."""
    bits = q.view(torch.uint8)
    over = (q.float().abs() > src_max * mult) & (v.float().abs() <= FP32_MAX)
    return torch.where(over, bits - 1, bits).view(q.dtype)
