"""What fuseops' backwards return under ``create_graph=True``: gradients behind a node that
raises if a second backward reaches it (README: double backward raises). The ops' backwards run
kernels and references without recording a graph, so a gradient made under ``create_graph=True``
is a constant to autograd; returned as it is, a second backward through it (a gradient penalty,
a Hessian-vector product) would take its derivatives as zero and say nothing.

torch's ``once_differentiable`` wraps the gradients only where an incoming cotangent requires
grad. A gradient that depends on the forward's tensors through what the backward saved (the
routing weights' ``<dy, expert output>``, every weight gradient) then came back a constant
(session 61: ``expert_layer``'s gradients and ``unpermute``'s weights gradient under a plain
cotangent). ``once_differentiable`` here wraps whenever the backward runs with grad mode on.

With batched cotangents (``is_grads_batched=True``, ``jacobian(vectorize=True)``) the raising
node cannot be attached (torch's older vmap drops the gradients' autograd history; its
``DelayedError`` on a batched tensor crashed the process): ``create_graph=True`` then raises at
once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from fuseops.kernels.autodiff_state import batched_cotangents

MESSAGE = ("fuseops: double backward (create_graph=True, then a backward through these gradients) is not "
           "supported; the ops' backward is not differentiable")


def no_second_backward(grads: tuple) -> tuple:
    """``grads``, each tensor behind one node that raises ``MESSAGE`` if differentiated."""
    present = [g for g in grads if isinstance(g, torch.Tensor)]
    if not present:
        return grads
    if batched_cotangents(*present):
        refuse_batched_create_graph()
    err = torch._C._functions.DelayedError(MESSAGE, len(present))
    wrapped = err(*[g.detach().requires_grad_() for g in present])
    # One input, one Tensor back (not a tuple): iterated, it gave its rows (session 58: a
    # create_graph=True backward with one gradient, torch.func.vjp of a parameterless op).
    wrapped = iter((wrapped,) if isinstance(wrapped, torch.Tensor) else wrapped)
    return tuple(next(wrapped) if isinstance(g, torch.Tensor) else g for g in grads)


def refuse_batched_create_graph() -> None:
    raise RuntimeError(
        "fuseops: create_graph=True with batched cotangents (torch.autograd.grad(..., is_grads_batched=True), "
        "torch.autograd.functional.jacobian / hessian(..., vectorize=True)) is not supported: the ops' backward "
        "is not differentiable; pass create_graph=False, or differentiate twice with torch.func (jacrev, hessian)")


def once_differentiable(backward: Callable) -> Callable:
    """An autograd Function's ``backward`` run without grad; under ``create_graph=True`` its
    gradients behind the raising node (``no_second_backward``), whatever the cotangents."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        create_graph = torch.is_grad_enabled()
        if create_graph and batched_cotangents(*grads):
            refuse_batched_create_graph()
        with torch.no_grad():
            out = backward(ctx, *grads)
        if not create_graph:
            return out
        return no_second_backward(out) if isinstance(out, tuple) else no_second_backward((out,))[0]

    return wrapper
