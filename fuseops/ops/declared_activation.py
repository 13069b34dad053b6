"""A user's activation as an op: ``declare_activation`` builds its class from the declaration.

The class is a plain ``ActivationOp`` (or ``GatedActivation``) whose ``act`` is the declaration,
and overrides nothing: the fusions that take the shipped activations (the dense and grouped
GEMM epilogues, forward and dgrad) take it as they are, since every kernel calls the declared
element function where it computes a shipped one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fuseops.kernels.elementwise.declared_activation import declare, is_element_function
from fuseops.ops.activation import ActivationOp
from fuseops.ops.gated import GatedActivation


def declare_activation(
    name: str,
    *,
    kernel: object,
    reference: Callable[[torch.Tensor], torch.Tensor],
    reference_grad: Callable[[torch.Tensor], torch.Tensor] | None = None,
    gated: bool = False,
    limit: float | None = None,
) -> type[ActivationOp] | type[GatedActivation]:
    """Declare an elementwise activation ``f`` once; get the op class that runs it, fused or not.

    Plain (``gated=False``): ``y = f(x)``. Gated: ``a, b = x.chunk(2, -1)`` (or interleaved, the
    op's ``interleaved=True``), ``y = f(a) * b``; with ``limit``, gpt-oss's clamps:
    ``y = f(min(a, limit)) * (clamp(b, -limit, limit) + 1)``. The gated class takes the shipped
    gated ops' ``interleaved`` and ``scaled`` (per-row probabilities) arguments.

    Args:
        name: the class's name, a Python identifier (``"ReLU2"``).
        kernel: a ``@triton.jit`` function ``(x) -> (f(x), f'(x))`` of a float32 tile of any
            shape; every kernel that applies the activation calls it.
        reference: ``f`` in torch, for a tensor of any float dtype: the unfused path on the
            CPU and for float64, and the oracle the kernel is tested against.
        reference_grad: ``f'`` in torch; None takes ``reference``'s forward-mode derivative
            (``torch.func.jvp`` along ones).
        gated: the gated form.
        limit: the gated form's clamp (a positive float); None for no clamp.

    Returns:
        A new op class; its instances go in ``fuseops.Sequential`` and ``moe.expert_layer``.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: expected a Python identifier for the op class, got {name!r}")
    if not is_element_function(kernel):
        raise TypeError(f"kernel: expected a @triton.jit function (x) -> (f(x), f'(x)), got {kernel!r}")
    if not callable(reference):
        raise TypeError(f"reference: expected a callable torch function of one tensor, got {reference!r}")
    if reference_grad is not None and not callable(reference_grad):
        raise TypeError(
            f"reference_grad: expected None or a callable torch function of one tensor, got {reference_grad!r}")
    if not isinstance(gated, bool):
        raise TypeError(f"gated: expected a bool, got {gated!r}")
    if limit is not None:
        if not gated:
            raise ValueError(f"limit: clamps only the gated form (gated=True); got limit={limit!r} with gated=False")
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            raise TypeError(f"limit: expected None or a positive float, got {limit!r}")
        if not (math.isfinite(limit) and limit > 0):
            raise ValueError(f"limit: expected None or a positive finite float, got {limit!r}")
    decl = declare(name, kernel, reference, reference_grad)
    doc = f"``{name}``, declared by ``declare_activation`` ({'gated' if gated else 'elementwise'})."
    if gated:
        attrs = {"act": decl, "clamped": limit is not None, "limit": float(limit) if limit is not None else 7.0}
        return type(name, (GatedActivation,), {**attrs, "__doc__": doc, "__module__": __name__})
    return type(name, (ActivationOp,), {"act": decl, "__doc__": doc, "__module__": __name__})
