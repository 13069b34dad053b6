"""A plan run that torch differentiates itself: forward-mode and higher-order derivatives.

The ops' spelled-out backward is reverse-mode and once-differentiable: it gives vector-Jacobian
products, which is what training, ``torch.func.grad``, ``vjp`` and ``jacrev`` ask for. It
cannot give a Jacobian-vector product (``torch.func.jvp``, ``jacfwd``, ``hessian``,
``torch.autograd.forward_ad``) nor differentiate a gradient again (``grad`` of ``grad``). For
those the call runs no autograd Function: each basic op's forward runs, in op order (unfused:
the basic ops are the specification), on the kernels' torch references (``launcher`` serves
them under torch.func, and here under ``forward_ad`` too), which are plain torch ops that
torch's own forward- and reverse-mode rules differentiate to any order; a parameter's
autocast copy is made on every call, differentiably, not taken from the weight cache.

The same run serves a call through parametrized parameters (``torch.nn.utils.parametrize``,
``parametrized``): the op reads a tensor computed from the parametrization's own parameters,
which only torch can differentiate (``execute`` and ``Sequential.forward`` send such a call here
when it needs a backward).

What it cannot do raises rather than return a wrong derivative: quantized recipes (their
rounding has no derivative; the ops' backward defines a straight-through one, which forward
mode has no way to apply) and ops that communicate (torch differentiates no
``torch.distributed`` collective). Slower than the Function path (the torch references), as torch.func's other transforms already are here. ``main_grad`` is not written on
this path: a backward through it leaves gradients where torch's autograd puts them (``.grad``
or the transform's outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils import parametrize

from fuseops.kernels.autodiff_state import dual_level_active
from fuseops.kernels.dispatch import references_forced
from fuseops.ops.executor.function import autocast_off, differentiating_levels
from fuseops.quant import weight_cache


def needed() -> bool:
    """Whether this call must run as plain torch: inside a ``forward_ad.dual_level`` or a
    torch.func forward-mode transform, or under two differentiating transforms. Cheap where
    neither torch.func nor forward AD is active (the caller checks those first)."""
    if dual_level_active():
        return True
    stack = torch._C._functorch.get_interpreter_stack() or ()
    return any(str(level.key()) == "TransformType.Jvp" for level in stack) or differentiating_levels(stack) > 1


def _differentiable_copy(param: torch.Tensor, kind: Any, build: Any, enabled: bool) -> Any:
    """``weight_cache.derived`` on this path: ``build(param)`` with autograd recording it."""
    return build(param)


# What a plain run is for, as its errors name it.
FORWARD_MODE = ("forward-mode and higher-order derivatives (torch.func.jvp, jacfwd, hessian, grad of grad, "
                "torch.autograd.forward_ad)")
PARAMETRIZED = "gradients through parametrized parameters (torch.nn.utils.parametrize)"


def parametrized(ops: Sequence[torch.nn.Module]) -> list[str]:
    """``"i (Op).name"`` of every parametrized parameter of ``ops`` (``torch.nn.utils.parametrize``:
    the op reads a tensor computed from the parametrization's own parameters, which torch, not
    the op's backward, differentiates)."""
    return [f"{i} ({type(op).__name__}).{name}" for i, op in enumerate(ops)
            if op._modules and parametrize.is_parametrized(op) for name in op.parametrizations]


def run(prep: Any, ops: Sequence[torch.nn.Module], x: torch.Tensor, extra_inputs: Sequence[Any],
        what: str = FORWARD_MODE) -> Any:
    """``y`` or ``(y, *extra outputs)`` of ``prep``'s call, as plain differentiable torch ops;
    ``what`` asks for it (``FORWARD_MODE``, ``PARAMETRIZED``), as the errors say."""
    recipe = next((ctx.recipe for ctx in prep.ctxs if ctx.recipe is not None), None)
    if recipe is not None:
        raise RuntimeError(
            f"fuseops: {what} are not defined under a quantized recipe ({type(recipe).__name__}): they run the "
            "ops as plain torch, and quantization rounds: only the ops' own backward gives it a (straight-through) "
            "derivative")
    talking = [f"{i} ({type(op).__name__})" for i, op in enumerate(ops) if op.communicates]
    if talking:
        raise RuntimeError(
            f"fuseops: {what} run the ops as plain torch, and op "
            f"{', '.join(talking)} communicates: torch does not differentiate torch.distributed collectives")
    per_op = [tuple(extra_inputs[a:b]) for a, b in prep.extra_spans]
    ctxs = [ctx.with_saved(None) for ctx in prep.ctxs]
    extra_outputs: list[torch.Tensor] = []
    previous = weight_cache.override
    weight_cache.override = _differentiable_copy
    try:
        with autocast_off(prep.device_type), references_forced():
            for op, ctx, extras in zip(ops, ctxs, per_op):
                x, outs = op.op_forward(ctx, x, extras)
                extra_outputs += outs
    finally:
        weight_cache.override = previous
    return (x, *extra_outputs) if prep.num_extra_outputs else x

