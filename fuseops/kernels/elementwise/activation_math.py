"""Activation maths shared by every kernel that applies one (elementwise kernels and GEMM
epilogues), with the torch reference of each function beside it.

Plain: ``y = act(x)``. Gated: ``y = act(a') * (b' + offset)`` where, for the clamped
form (gpt-oss), ``a' = min(a, limit)``, ``b' = clamp(b, -limit, limit)`` and
``offset = 1``; otherwise ``a' = a``, ``b' = b``, ``offset = 0``. ``alpha`` is SiLU's
sigmoid slope, ``x * sigmoid(alpha * x)`` (1 for SiLU, 1.702 for gpt-oss); other
activations ignore it. Kernels compute in float32; the references in float32, or float64 for float64 inputs.

``act`` is a shipped ``Activation`` (its element function: element_functions.py) or a
``DeclaredActivation`` (a user's element function and torch reference: declared_activation.py);
kernels take either as their ``ACT`` constexpr, through ``kernel_act``.
"""

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

from fuseops.kernels.elementwise.declared_activation import DeclaredActivation, declared
from fuseops.kernels.elementwise.element_functions import gelu, gelu_tanh, identity, relu, sigmoid, silu, srelu


class Activation(enum.IntEnum):
    """The pointwise function; its value is the kernels' ``ACT`` constexpr."""

    IDENTITY = 0
    RELU = 1
    GELU = 2
    GELU_TANH = 3
    SILU = 4
    SRELU = 5
    SIGMOID = 6


# What the kernels' and references' ``act`` argument takes: a shipped function or a declared one.
AnyActivation = Activation | DeclaredActivation


def kernel_act(act: AnyActivation) -> int | object:
    """The ``ACT`` constexpr a kernel takes: a shipped activation's code, or a declared one's
    element function (``activation_and_grad`` calls it)."""
    return act.kernel if isinstance(act, DeclaredActivation) else int(act)


def activation_code(act: AnyActivation) -> int:
    """``act``'s int (custom ops carry activations as ints); not ``int(act)``, which torch 2.11's
    dynamo cannot trace for a declared activation."""
    return act.code if isinstance(act, DeclaredActivation) else int(act)


def activation_from_code(code: int) -> AnyActivation:
    """The activation whose ``int()`` is ``code`` (custom ops carry activations as ints)."""
    return Activation(code) if code < len(Activation) else declared(code)


def wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or as it is when wider (float64: the references' oracles compute in it)."""
    # No call when t is wide already: a no-op ``to`` costs about a microsecond.
    return t if t.dtype == torch.float32 or t.dtype == torch.float64 else t.to(torch.promote_types(t.dtype, torch.float32))


@triton.jit
def activation(x, ACT: tl.constexpr, alpha):
    """``act(x)`` for a float32 tile (the derivative's share is dead code, dropped)."""
    return activation_and_grad(x, ACT, alpha)[0]


@triton.jit
def activation_grad(x, ACT: tl.constexpr, alpha):
    """``d act(x) / dx`` for a float32 tile."""
    return activation_and_grad(x, ACT, alpha)[1]


@triton.jit
def chain_grad(up, x, ACT: tl.constexpr, alpha):
    """``up * d act(x) / dx`` as torch's autograd places non-finite values: ReLU and SReLU
    zero the gradient where ``x <= 0`` (threshold_backward), whatever ``up`` holds, so an
    infinite ``up`` there gives 0, not ``inf * 0``."""
    d = up * activation_grad(x, ACT, alpha)
    if ACT == 1 or ACT == 5:
        d = tl.where(x <= 0.0, 0.0, d)
    return d


@triton.jit
def activation_and_grad(x, ACT: tl.constexpr, alpha):
    """``(act(x), d act(x) / dx)`` for a float32 tile: the shipped activation's element
    function (element_functions.py), or a declared one's."""
    if ACT == 0:
        y, g = identity(x)
    elif ACT == 1:
        y, g = relu(x)
    elif ACT == 2:
        y, g = gelu(x)
    elif ACT == 3:
        y, g = gelu_tanh(x)
    elif ACT == 4:
        y, g = silu(x, alpha)
    elif ACT == 5:
        y, g = srelu(x)
    elif ACT == 6:
        y, g = sigmoid(x)
    else:
        # A declared activation: ACT is its element function (declared_activation.py).
        y, g = ACT(x)
    return y, g


@triton.jit
def gated(a, b, ACT: tl.constexpr, CLAMPED: tl.constexpr, limit, alpha):
    """``act(a') * (b' + offset)`` for float32 tiles (see the module docstring)."""
    if CLAMPED:
        # torch's clamp keeps NaN.
        a = tl.minimum(a, limit, propagate_nan=tl.PropagateNan.ALL)
        b = tl.minimum(tl.maximum(b, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                       propagate_nan=tl.PropagateNan.ALL) + 1.0
    return activation(a, ACT, alpha) * b


@triton.jit
def gated_and_grad(a, b, dy, ACT: tl.constexpr, CLAMPED: tl.constexpr, limit, alpha):
    """``(gated(a, b), da, db)`` for float32 tiles and an upstream float32 ``dy``: the output
    and its gradients from one evaluation of the activation and its derivative."""
    if CLAMPED:
        a_pass = a <= limit
        b_pass = (b >= -limit) & (b <= limit)
        # torch's clamp keeps NaN.
        a = tl.minimum(a, limit, propagate_nan=tl.PropagateNan.ALL)
        b = tl.minimum(tl.maximum(b, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                       propagate_nan=tl.PropagateNan.ALL) + 1.0
    act, act_grad = activation_and_grad(a, ACT, alpha)
    da = dy * b * act_grad
    if ACT == 1 or ACT == 5:
        # As chain_grad: torch's threshold_backward zeroes where a <= 0 whatever dy * b is.
        da = tl.where(a <= 0.0, 0.0, da)
    db = dy * act
    if CLAMPED:
        da = tl.where(a_pass, da, 0.0)
        db = tl.where(b_pass, db, 0.0)
    return act * b, da, db


def _scaled(alpha: float, x: torch.Tensor) -> torch.Tensor:
    """``alpha * x``; x itself for alpha 1 (the same values, one elementwise pass fewer)."""
    return x if alpha == 1.0 else alpha * x


def reference_activation(x: torch.Tensor, act: AnyActivation, alpha: float = 1.0) -> torch.Tensor:
    """``act(x)``."""
    x = wide(x)
    if isinstance(act, DeclaredActivation):
        return act.reference(x)
    if act == Activation.IDENTITY:
        return x
    if act == Activation.RELU:
        return torch.relu(x)
    # GELU, GELU(tanh), SiLU with alpha 1: torch's kernels of the same formulas (their values at
    # +-inf and NaN too): on the CPU, where the references are what runs, and for an unfused
    # activation on the GPU, one pass where the formula spelled out took two (SiLU) to ten.
    if act == Activation.GELU:
        y = torch.nn.functional.gelu(x)
        # Where the exact GELU saturates it is x (torch 2.11's CPU kernel: NaN at +inf, inf at 3e38).
        return y if x.device.type == "cpu" and not _CPU_GELU_OVERFLOWS else torch.where(x > _GELU_SATURATED, x, y)
    if act == Activation.GELU_TANH:
        return torch.nn.functional.gelu(x, approximate="tanh")
    if act == Activation.SILU:
        return torch.nn.functional.silu(x) if alpha == 1.0 else x * torch.sigmoid(_scaled(alpha, x))
    if act == Activation.SRELU:
        return torch.relu(x).square()
    return torch.sigmoid(x)


def _torch_chain_grad(up: torch.Tensor, x: torch.Tensor, act: AnyActivation, alpha: float) -> torch.Tensor | None:
    """``up * d act(x) / dx`` from torch's backward kernel where torch has the function, else None.

    As reference_activation: one pass (two for the sigmoid) where the formulas took four (ReLU,
    sigmoid) to fifteen (GELU(tanh)). The same values but the sign of some zeros (SiLU's at
    x = -3e38 is -0 here, +0 spelled out) and GELU's underflow (its gradient at x = -10 is 0 here,
    -7.7e-22 spelled out)."""
    if isinstance(act, DeclaredActivation) or act not in (
            Activation.GELU, Activation.GELU_TANH, Activation.RELU, Activation.SIGMOID) and not (
            act == Activation.SILU and alpha == 1.0):
        return None
    dtype = torch.promote_types(torch.promote_types(up.dtype, x.dtype), torch.float32)  # as wide(x) * up
    up, x = up.to(dtype), x.to(dtype)
    if act == Activation.SILU:
        return torch.ops.aten.silu_backward(up, x)
    if act == Activation.RELU:
        # Zero where x <= 0 only: a NaN input passes the gradient, as torch.relu's backward.
        return torch.ops.aten.threshold_backward(up, x, 0)
    if act == Activation.SIGMOID:
        return torch.ops.aten.sigmoid_backward(up, torch.sigmoid(x))
    if act == Activation.GELU:
        return torch.ops.aten.gelu_backward(up, x)
    # torch's kernel squares x, past the float32 maximum from |x| ~ 1.8e19, and 0 * inf made a NaN
    # of a derivative that is 1 or 0 there: it reads x clamped where the derivative saturates, and
    # up + x * 0 keeps its NaN at an inf x. One pass: addcmul by a 0-dim zero, made per call (a
    # global tensor is refused by fake tensors); Inductor 2.13 turns ``add(mm, x, alpha=0)`` into
    # an addmm that drops the alpha. No host read. CPU
    # [256, 1024] float32, one thread: 1.25 ms against 1.06.
    up = torch.addcmul(up, x, x.new_zeros(()))
    return torch.ops.aten.gelu_backward(up, x.clamp(-_GELU_SATURATED, _GELU_SATURATED), approximate="tanh")


# From this bound on, in every float dtype, erf and tanh round to +-1: GELU is x (x > 0) or 0,
# and GELU(tanh)'s derivative 1 or 0.
_GELU_SATURATED = 2.0**40


def _cpu_gelu_overflows() -> bool:
    """Whether torch's CPU GELU (exact) is wrong where it saturates: torch 2.11's gives NaN at
    +inf and inf at 3e38 (``x (1 + erf)`` overflows before the halving),
    in its vector body and tail alike; torch 2.13's gives x."""
    x = torch.tensor([float("inf"), 3e38] * 33, dtype=torch.float32, device="cpu")  # whatever the defaults
    return not (torch.equal(torch.nn.functional.gelu(x), x) and torch.equal(torch.nn.functional.gelu(x[:3]), x[:3]))


_CPU_GELU_OVERFLOWS = _cpu_gelu_overflows()


def reference_activation_grad(
    x: torch.Tensor, act: AnyActivation, alpha: float = 1.0
) -> torch.Tensor:
    """``d act(x) / dx``."""
    x = wide(x)
    if isinstance(act, DeclaredActivation):
        return act.grad(x)
    d = _torch_chain_grad(torch.ones_like(x), x, act, alpha)
    if d is not None:
        return d
    if act == Activation.IDENTITY:
        return torch.ones_like(x)
    if act == Activation.SILU:
        s = torch.sigmoid(_scaled(alpha, x))
        # x * s first, as the kernel: alpha * x overflows at the dtype's max where x * s is 0.
        return s + _scaled(alpha, x * s) * (1.0 - s)
    return 2.0 * torch.relu(x)  # SReLU


def reference_chain_grad(up: torch.Tensor, x: torch.Tensor, act: AnyActivation, alpha: float = 1.0) -> torch.Tensor:
    """``up * d act(x) / dx``, zero where ``x <= 0`` for ReLU and SReLU whatever ``up`` holds
    (torch's threshold_backward: an infinite ``up`` there gives 0, not NaN)."""
    d = _torch_chain_grad(up, x, act, alpha)
    if d is not None:
        return d
    d = up * reference_activation_grad(x, act, alpha)
    if act == Activation.SRELU:
        d = torch.where(x <= 0, 0.0, d)
    return d


def reference_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    act: AnyActivation,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
) -> torch.Tensor:
    """``act(a') * (b' + offset)``."""
    a, b = wide(a), wide(b)
    if clamped:
        a = a.clamp(max=limit)
        b = b.clamp(-limit, limit) + 1.0
    return reference_activation(a, act, alpha) * b


def reference_gated_grad(
    a: torch.Tensor,
    b: torch.Tensor,
    dy: torch.Tensor,
    act: AnyActivation,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(da, db)`` of ``reference_gated`` for an upstream ``dy``."""
    a, b, dy = wide(a), wide(b), wide(dy)
    if not clamped:
        da = reference_chain_grad(dy * b, a, act, alpha)
        return da, dy * reference_activation(a, act, alpha)
    a_pass, b_pass = a <= limit, (b >= -limit) & (b <= limit)
    a, b = a.clamp(max=limit), b.clamp(-limit, limit) + 1.0
    da = torch.where(a_pass, reference_chain_grad(dy * b, a, act, alpha), 0.0)
    db = torch.where(b_pass, dy * reference_activation(a, act, alpha), 0.0)
    return da, db
