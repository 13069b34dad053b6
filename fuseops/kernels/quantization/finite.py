"""What the quantize kernels do with the values a format cannot hold (quantization/formats.py's
docstring has the rules): amaxes over finite values only, the source dtype's maximum, and the
step back of an FP8 code that would dequantize past it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP32_MAX = torch.finfo(torch.float32).max
_FP32_MAX = tl.constexpr(FP32_MAX)


@triton.jit
def finite_abs(t):
    """``|t|`` where finite, 0 at NaN and infinities: scales come from the finite values
    alone, so one non-finite element never erases the rest of its tensor or block."""
    a = tl.abs(t)
    return tl.where(a <= _FP32_MAX, a, 0.0)


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
def fit_source(q, v, mult, src_max):
    """Float8 codes ``q`` of the finite ``v * mult`` (``mult`` a power of two) stepped one code
    toward zero where ``q / mult`` would pass ``src_max``, the source dtype's maximum: a value
    within half an FP8 step of it rounds up past it, and would dequantize to inf."""
    bits = q.to(tl.uint8, bitcast=True)
    over = (tl.abs(q.to(tl.float32)) > src_max * mult) & (tl.abs(v) <= _FP32_MAX)
    # Sign-magnitude codes: one less is the next value toward zero.
    return tl.where(over, bits - 1, bits).to(q.dtype, bitcast=True)


def reference_finite_abs(v: torch.Tensor) -> torch.Tensor:
    """``|v|`` where finite, 0 at NaN and infinities (``finite_abs``)."""
    a = v.float().abs()
    return torch.where(a <= FP32_MAX, a, 0.0)


def reference_fit_source(q: torch.Tensor, v: torch.Tensor, mult: torch.Tensor, src_max: float) -> torch.Tensor:
    """``fit_source`` in torch: codes whose value over ``mult`` passes ``src_max`` one step
    toward zero (finite ``v`` only)."""
    bits = q.view(torch.uint8)
    over = (q.float().abs() > src_max * mult) & (v.float().abs() <= FP32_MAX)
    return torch.where(over, bits - 1, bits).view(q.dtype)
